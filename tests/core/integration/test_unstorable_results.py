"""
The handlers' results that cannot be stored in the status as JSON: the handler fails permanently, loudly.

Kopf 1.45.2 (run as a black box against the emulator) logs such a handler as succeeded, then fails
the object's status patch with a ``TypeError`` traceback ("Throttling for 1 seconds due to an
unexpected error"), and counts the handler as succeeded in the end: the result is lost, the object's
other handlers are delayed. Here, the handler is failed permanently with a message that names it
and the reason, and the rest of the object's handling goes on as usual.
"""
import datetime
import json
from collections.abc import Callable
from typing import Any

import pytest

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]
Eventually = Callable[..., Any]
Quiet = Callable[..., Any]

HINT = 'Return only dicts, lists, strings, numbers, booleans, or None.'


class Thing:
    pass


def circular() -> Any:
    value: dict[str, Any] = {}
    value['self'] = value
    return value


def nan_reason() -> str:
    # Python's own wording, which differs between its versions.
    try:
        json.dumps(float('nan'), allow_nan=False)
    except ValueError as e:
        return str(e)
    raise AssertionError('NaN is serialised')


UNSTORABLE = [
    pytest.param(lambda: datetime.datetime(2020, 1, 2), 'Object of type datetime is not JSON serializable',
                 id='datetime'),
    pytest.param(lambda: {'ids': {1, 2}}, 'Object of type set is not JSON serializable', id='set'),
    pytest.param(Thing, 'Object of type Thing is not JSON serializable', id='object'),
    pytest.param(lambda: {(1, 2): 'x'}, 'keys must be str, int, float, bool or None, not tuple', id='key'),
    pytest.param(circular, 'Circular reference detected', id='circular'),
    pytest.param(lambda: [float('nan')], nan_reason(), id='nan'),
]


def posting_all(settings: kopf.OperatorSettings) -> kopf.OperatorSettings:
    settings.posting.loggers = True
    settings.posting.level = 20  # logging.INFO
    return settings


@pytest.mark.parametrize('make_result, reason', UNSTORABLE)
async def test_changing_handler_fails_permanently_and_the_others_go_on(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
        make_result: Callable[[], Any], reason: str,
) -> None:
    calls: list[str] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def bad_fn(**_: Any) -> Any:
        calls.append('bad_fn')
        return make_result()

    @kopf.on.create('kopfexamples', registry=registry)
    def good_fn(**_: Any) -> Any:
        calls.append('good_fn')
        return {'fine': True}

    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1')
        await eventually(lambda: cluster.diffbase() is not None)
        await quiet()

    message = f'The result cannot be stored in the status as JSON: {reason}. {HINT}'
    assert calls == ['bad_fn', 'good_fn']  # not retried: it would repeat its side effects
    assert cluster.status() == {'good_fn': {'fine': True}}
    assert cluster.progress_annotations() == {}  # the handling is over, as for any permanent failure
    assert cluster.events() == [
        ('Error', 'Logging', f"Handler 'bad_fn' failed permanently: {message}"),
        ('Normal', 'Logging', "Handler 'good_fn' succeeded."),
        ('Normal', 'Logging', 'Creation is processed: 1 succeeded; 1 failed.'),
    ]


async def test_the_failure_is_recorded_while_the_other_handlers_retry(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:

    @kopf.on.create('kopfexamples', registry=registry)
    def bad_fn(**_: Any) -> Any:
        return {1, 2}

    @kopf.on.create('kopfexamples', registry=registry)
    def slow_fn(retry: int, **_: Any) -> Any:
        raise kopf.TemporaryError('not yet', delay=60)

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: 'kopf.zalando.org/slow_fn' in cluster.annotations())
        await quiet()
        record = json.loads(cluster.annotations()['kopf.zalando.org/bad_fn'])

    assert record['failure'] is True and record['success'] is False
    assert record['message'] == ('The result cannot be stored in the status as JSON: '
                                 f'Object of type set is not JSON serializable. {HINT}')


async def test_timer_stops_for_the_object_after_an_unstorable_result(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    calls: list[int] = []

    @kopf.timer('kopfexamples', registry=registry, interval=0.05)
    def tick(**_: Any) -> Any:
        calls.append(1)
        return datetime.date(2020, 1, 2)

    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1')
        await eventually(lambda: bool(cluster.events()))
        await quiet(0.3)

    assert len(calls) == 1
    assert cluster.status() == {}
    assert cluster.events() == [
        ('Error', 'Logging', "Timer 'tick' failed permanently: The result cannot be stored in the status "
                             f"as JSON: Object of type date is not JSON serializable. {HINT}"),
    ]


@pytest.mark.parametrize('result', [
    pytest.param({'when': '2020-01-02', 'n': [1, 2.5, None, True], 'nested': {'k': 'v'}}, id='dict'),
    pytest.param(('a', 1), id='tuple'),  # stored as a JSON array, as the docs' "JSON-serializable" means
    pytest.param({1: 'one'}, id='int-key'),  # stored with a string key, as json.dumps does
    pytest.param(1.5, id='float'),
])
async def test_storable_results_are_stored(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet, result: Any,
) -> None:

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(**_: Any) -> Any:
        return result

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: cluster.diffbase() is not None)
        await quiet()

    assert cluster.status() == {'create_fn': json.loads(json.dumps(result))}
