"""
Garbage in Kopf's own annotations on an object (the handlers' progress, the diff-base).

Kopf 1.45.2 (run as a black box against the emulator) fails such an object in every handling cycle
with a bare ``JSONDecodeError``/``AttributeError`` traceback ("Throttling for 1 seconds due to an
unexpected error"), so the object is never handled. Here, one warning names the annotation, what it
must hold, and what it holds; the record is ignored, and the handling goes on from a clean state
(the handler starts anew; the object without a usable diff-base is handled as a new one).
"""
from collections.abc import Callable
from typing import Any

import pytest

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]
Eventually = Callable[..., Any]
Quiet = Callable[..., Any]

PROGRESS = 'kopf.zalando.org/create_fn'
DIFFBASE = 'kopf.zalando.org/last-handled-configuration'
HANDLER_ANEW = 'It is ignored: the handler starts anew.'
OBJECT_ANEW = 'It is ignored: the object is handled as a new one (by the creation handlers).'


def posting_all(settings: kopf.OperatorSettings) -> kopf.OperatorSettings:
    settings.posting.loggers = True
    settings.posting.level = 20  # logging.INFO
    return settings


def register(registry: kopf.OperatorRegistry, calls: list[str]) -> None:

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(**_: Any) -> Any:
        calls.append('create_fn')
        return 'created'

    @kopf.on.update('kopfexamples', registry=registry)
    def update_fn(**_: Any) -> Any:
        calls.append('update_fn')
        return 'updated'


@pytest.mark.parametrize('stored, problem', [
    pytest.param('garbage{', "it is not JSON (Expecting value: line 1 column 1 (char 0)): 'garbage{'",
                 id='not-json'),
    pytest.param('[1,2]', "it holds a JSON array: '[1,2]'", id='array'),
    pytest.param('"done"', """it holds a JSON string: '"done"'""", id='string'),
    # Read as is, these would make the handler "succeeded" (never called) or fail the object's every cycle.
    pytest.param('{"success":"yes"}', """its field 'success' is "yes" instead of true or false""",
                 id='success-string'),
    pytest.param('{"retries":"x"}', """its field 'retries' is "x" instead of an integer""", id='retries'),
    pytest.param('{"started":"yesterday"}',
                 """its field 'started' is "yesterday" instead of a timestamp in the ISO 8601 format""",
                 id='started'),
    pytest.param('{"subrefs":"a/b"}', """its field 'subrefs' is "a/b" instead of a list of strings""",
                 id='subrefs'),
])
async def test_unreadable_progress_is_reported_and_the_handler_starts_anew(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet, stored: str, problem: str,
) -> None:
    calls: list[str] = []
    register(registry, calls)

    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1', metadata={'annotations': {PROGRESS: stored}})
        await eventually(lambda: cluster.status().get('create_fn') == 'created')
        await quiet()

    assert calls == ['create_fn']
    assert cluster.progress_annotations() == {}  # overwritten, then purged at the end of the handling
    assert cluster.diffbase() == {'spec': {'field': 'value'}}
    assert cluster.events() == [
        ('Warning', 'Logging', f"The annotation '{PROGRESS}' must hold the progress of the handler "
                               f"'create_fn' as a JSON object, but {problem}. {HANDLER_ANEW}"),
        ('Normal', 'Logging', "Handler 'create_fn' succeeded."),
        ('Normal', 'Logging', 'Creation is processed: 1 succeeded; 0 failed.'),
    ]


@pytest.mark.parametrize('stored, problem', [
    pytest.param('garbage{', "it is not JSON (Expecting value: line 1 column 1 (char 0)): 'garbage{'",
                 id='not-json'),
    pytest.param('', "it is not JSON (Expecting value: line 1 column 1 (char 0)): ''", id='empty'),
    pytest.param('[1,2]\n', "it holds a JSON array: '[1,2]\\n'", id='array'),
    pytest.param('{"spec":' + '1' * 100 + ']',
                 "it is not JSON (Expecting ',' delimiter: line 1 column 109 (char 108)): "
                 "'{\"spec\":" + '1' * 52 + "...'", id='long'),
])
async def test_unreadable_diffbase_is_reported_and_the_object_is_handled_as_new(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet, stored: str, problem: str,
) -> None:
    calls: list[str] = []
    register(registry, calls)

    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1', metadata={'annotations': {DIFFBASE: stored}})
        await eventually(lambda: cluster.status().get('create_fn') == 'created')
        await quiet()

    assert calls == ['create_fn']
    assert cluster.diffbase() == {'spec': {'field': 'value'}}  # overwritten with a usable one
    assert cluster.progress_annotations() == {}
    assert cluster.events() == [
        ('Warning', 'Logging', f"The annotation '{DIFFBASE}' must hold the object's essence as last handled "
                               f"(the diff-base) as a JSON object, but {problem}. {OBJECT_ANEW}"),
        ('Normal', 'Logging', "Handler 'create_fn' succeeded."),
        ('Normal', 'Logging', 'Creation is processed: 1 succeeded; 0 failed.'),
    ]


async def test_usable_records_are_honoured_as_before(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    calls: list[str] = []
    register(registry, calls)

    # Handled once (the diff-base matches), with an unfinished update whose handler has succeeded already.
    annotations = {
        DIFFBASE: '{"spec":{"field":"old"}}\n',
        'kopf.zalando.org/update_fn': '{"started":"2020-01-01T00:00:00","purpose":"update","retries":1,'
                                      '"success":true,"failure":false,"unknown-field":{"x":1}}',
    }
    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1', metadata={'annotations': annotations})
        await eventually(lambda: cluster.diffbase() == {'spec': {'field': 'value'}})
        await quiet()

    assert calls == []  # the update handler has succeeded already: not called again
    assert cluster.progress_annotations() == {}
    assert [event for event in cluster.events() if event[0] == 'Warning'] == []
