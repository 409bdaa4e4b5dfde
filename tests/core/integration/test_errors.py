"""
Every kind of handler errors at the operator level: the retries, the outcomes, the object, the k8s-events.

The expected k8s-events are those that Kopf 1.45.2 posts in the same setups (run as a black box against
the emulator): with ``settings.posting.loggers = True``, the per-object messages of INFO and above are
posted as events of reason "Logging"; with the default settings, no events are posted at all.
"""
import asyncio
import time
from collections.abc import Callable
from typing import Any

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]  # the conftest's factory of running operators (async context managers)
Eventually = Callable[..., Any]
Quiet = Callable[..., Any]


def posting_all(settings: kopf.OperatorSettings) -> kopf.OperatorSettings:
    settings.posting.loggers = True
    settings.posting.level = 20  # logging.INFO, the default
    return settings


async def test_temporary_errors_are_retried_after_their_delay_until_success(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    attempts: list[tuple[int, float]] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(retry: int, **_: Any) -> Any:
        attempts.append((retry, time.monotonic()))
        if retry < 2:
            raise kopf.TemporaryError('not yet', delay=0.3)
        return 'done'

    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1')
        await eventually(lambda: bool((cluster.get() or {}).get('status')))
        await quiet()

    assert [retry for retry, _ in attempts] == [0, 1, 2]
    assert attempts[1][1] - attempts[0][1] >= 0.25  # the delay is honoured (minus the timestamp rounding)
    assert attempts[2][1] - attempts[1][1] >= 0.25
    assert cluster.get()['status'] == {'create_fn': 'done'}
    assert cluster.diffbase() == {'spec': {'field': 'value'}}
    assert cluster.progress_annotations() == {}
    assert sorted(cluster.events()) == sorted([
        ('Error', 'Logging', "Handler 'create_fn' failed temporarily: not yet"),
        ('Error', 'Logging', "Handler 'create_fn' failed temporarily: not yet"),
        ('Normal', 'Logging', "Handler 'create_fn' succeeded."),
        ('Normal', 'Logging', 'Creation is processed: 1 succeeded; 0 failed.'),
    ])


async def test_temporary_errors_keep_the_progress_on_the_object_meanwhile(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    release = asyncio.Event()

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(retry: int, **_: Any) -> Any:
        if not release.is_set():
            raise kopf.TemporaryError('not yet', delay=0.1)
        return 'done'

    def retried_twice() -> bool:
        record = cluster.annotations().get('kopf.zalando.org/create_fn')
        return record is not None and '"retries":2' in record

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(retried_twice)
        record = cluster.annotations()['kopf.zalando.org/create_fn']
        assert '"success":false' in record and '"failure":false' in record
        assert '"message":"not yet"' in record and '"delayed":' in record
        assert cluster.diffbase() is None  # not finished yet
        release.set()
        await eventually(lambda: bool((cluster.get() or {}).get('status')))
        await quiet()

    assert cluster.progress_annotations() == {}
    assert cluster.diffbase() == {'spec': {'field': 'value'}}


async def test_permanent_errors_fail_the_handler_at_once_and_the_others_continue(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    calls: list[str] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fails(**_: Any) -> Any:
        calls.append('create_fails')
        raise kopf.PermanentError('boom')

    @kopf.on.create('kopfexamples', registry=registry)
    def create_ok(**_: Any) -> Any:
        calls.append('create_ok')
        return 1

    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1')
        await eventually(lambda: cluster.diffbase() is not None)
        await quiet()

    assert calls == ['create_fails', 'create_ok']
    assert cluster.get()['status'] == {'create_ok': 1}
    assert cluster.progress_annotations() == {}
    assert sorted(cluster.events()) == sorted([
        ('Error', 'Logging', "Handler 'create_fails' failed permanently: boom"),
        ('Normal', 'Logging', "Handler 'create_ok' succeeded."),
        ('Normal', 'Logging', 'Creation is processed: 1 succeeded; 1 failed.'),
    ])


async def test_arbitrary_errors_are_retried_until_the_retries_limit(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    retries: list[int] = []

    @kopf.on.create('kopfexamples', registry=registry, retries=2, backoff=0.1)
    def create_fn(retry: int, **_: Any) -> Any:
        retries.append(retry)
        raise ValueError('oops')

    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1')
        await eventually(lambda: cluster.diffbase() is not None)
        await quiet()

    assert retries == [0, 1]
    assert 'status' not in cluster.get()
    assert cluster.progress_annotations() == {}
    assert sorted(cluster.events()) == sorted([
        ('Error', 'Logging',
         "Handler 'create_fn' failed with an exception and will try again in 0.1 seconds: oops"),
        ('Error', 'Logging', "Handler 'create_fn' failed with an exception and will stop now "
                             "(it would exceed 2 retries on the next attempt): oops"),
        ('Normal', 'Logging', 'Creation is processed: 0 succeeded; 1 failed.'),
    ])


async def test_temporary_errors_are_limited_by_the_retries_too(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    retries: list[int] = []

    @kopf.on.create('kopfexamples', registry=registry, retries=2)
    def create_fn(retry: int, **_: Any) -> Any:
        retries.append(retry)
        raise kopf.TemporaryError('later', delay=0.1)

    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1')
        await eventually(lambda: cluster.diffbase() is not None)
        await quiet()

    assert retries == [0, 1]
    assert cluster.progress_annotations() == {}
    assert sorted(cluster.events()) == sorted([
        ('Error', 'Logging', "Handler 'create_fn' failed temporarily: later"),
        ('Error', 'Logging', "Handler 'create_fn' failed temporarily but will exceed 2 retries: later"),
        ('Normal', 'Logging', 'Creation is processed: 0 succeeded; 1 failed.'),
    ])


async def test_arbitrary_errors_in_the_permanent_mode_are_not_retried(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    retries: list[int] = []

    @kopf.on.create('kopfexamples', registry=registry, errors=kopf.ErrorsMode.PERMANENT, backoff=0.1)
    def create_fn(retry: int, **_: Any) -> Any:
        retries.append(retry)
        raise ValueError('nope')

    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1')
        await eventually(lambda: cluster.diffbase() is not None)
        await quiet()

    assert retries == [0]
    assert cluster.progress_annotations() == {}
    assert sorted(cluster.events()) == sorted([
        ('Error', 'Logging', "Handler 'create_fn' failed with an exception and will stop now: nope"),
        ('Normal', 'Logging', 'Creation is processed: 0 succeeded; 1 failed.'),
    ])


async def test_timeout_stops_the_retries_of_a_sync_handler(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    attempts: list[float] = []

    @kopf.on.create('kopfexamples', registry=registry, timeout=0.5)
    def create_fn(retry: int, **_: Any) -> Any:
        attempts.append(time.monotonic())
        raise kopf.TemporaryError('later', delay=0.1)

    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1')
        await eventually(lambda: cluster.diffbase() is not None)
        await quiet()

    # Kopf 1.45.2 makes 5 attempts here (0.0s..0.44s) and gives up when the next one would be too late.
    assert 3 <= len(attempts) <= 6
    assert attempts[-1] - attempts[0] <= 0.6
    assert cluster.progress_annotations() == {}
    assert 'status' not in cluster.get()
    events = cluster.events()
    assert ('Normal', 'Logging', 'Creation is processed: 0 succeeded; 1 failed.') in events
    assert ('Error', 'Logging', "Handler 'create_fn' failed temporarily: later") in events
    assert ('Normal', 'Logging', "Handler 'create_fn' succeeded.") not in events
    final_errors = [message for type_, _, message in events
                    if type_ == 'Error' and message != "Handler 'create_fn' failed temporarily: later"]
    assert len(final_errors) == 1 and final_errors[0].startswith("Handler 'create_fn' ")
    # Kopf 1.45.2: "Handler 'create_fn' failed temporarily but will time out after 0.5 seconds: later".
    assert 'time' in final_errors[0]


async def test_timeout_interrupts_a_running_async_handler(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    # As documented: "If the handler is an async coroutine and it is still running at the moment,
    # an asyncio.TimeoutError is raised". (Kopf 1.45.2 itself leaves such a handler hanging.)
    interrupted: list[BaseException] = []
    calls: list[int] = []

    @kopf.on.create('kopfexamples', registry=registry, timeout=0.3)
    async def create_fn(retry: int, **_: Any) -> Any:
        calls.append(retry)
        try:
            await asyncio.Event().wait()
        except BaseException as e:
            interrupted.append(e)
            raise

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: cluster.diffbase() is not None)
        await quiet()

    assert calls == [0]
    assert len(interrupted) == 1 and isinstance(interrupted[0], (asyncio.CancelledError, TimeoutError))
    assert cluster.progress_annotations() == {}
    assert 'status' not in cluster.get()


async def test_ignored_errors_count_as_success_and_are_not_retried(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    retries: list[int] = []

    @kopf.on.create('kopfexamples', registry=registry, errors=kopf.ErrorsMode.IGNORED, backoff=0.1)
    def create_fn(retry: int, **_: Any) -> Any:
        retries.append(retry)
        raise ValueError('ignored')

    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1')
        await eventually(lambda: cluster.diffbase() is not None)
        await quiet()

    assert retries == [0]
    assert 'status' not in cluster.get()
    assert cluster.progress_annotations() == {}
    assert sorted(cluster.events()) == sorted([
        ('Error', 'Logging', "Handler 'create_fn' failed with an exception and will ignore it: ignored"),
        ('Normal', 'Logging', 'Creation is processed: 1 succeeded; 0 failed.'),
    ])


async def test_no_events_are_posted_for_the_failures_by_default(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    # As Kopf 1.45.2 does: settings.posting.loggers is False by default.
    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(retry: int, **_: Any) -> Any:
        if retry < 1:
            raise kopf.TemporaryError('not yet', delay=0.1)
        raise kopf.PermanentError('boom')

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: cluster.diffbase() is not None)
        await quiet()

    assert cluster.events() == []
    assert cluster.emulator.requests.count('create', 'events') == 0


async def test_deletion_handlers_are_retried_and_then_release_the_object_even_if_failed(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    # As Kopf 1.45.2 does: a permanently failed deletion handler does not block the deletion forever.
    calls: list[tuple[str, int]] = []

    @kopf.on.delete('kopfexamples', registry=registry)
    def delete_retried(retry: int, **_: Any) -> None:
        calls.append(('delete_retried', retry))
        if retry < 1:
            raise kopf.TemporaryError('later', delay=0.2)

    @kopf.on.delete('kopfexamples', registry=registry)
    def delete_failing(retry: int, **_: Any) -> None:
        calls.append(('delete_failing', retry))
        raise kopf.PermanentError('boom')

    async with operator(registry, posting_all(settings)):
        await cluster.create('kex1')
        await eventually(lambda: cluster.diffbase() is not None)
        await cluster.delete('kex1')
        await eventually(lambda: cluster.get() is None)
        await quiet()

    assert calls == [('delete_retried', 0), ('delete_failing', 0), ('delete_retried', 1)]  # as in Kopf
    assert sorted(cluster.events()) == sorted([
        ('Error', 'Logging', "Handler 'delete_retried' failed temporarily: later"),
        ('Normal', 'Logging', "Handler 'delete_retried' succeeded."),
        ('Error', 'Logging', "Handler 'delete_failing' failed permanently: boom"),
        ('Normal', 'Logging', 'Deletion is processed: 1 succeeded; 1 failed.'),
    ])
