"""
Daemons (``@kopf.daemon``) in whole operators against the emulator: spawning, stopping, errors, restarts.
"""
import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]  # the conftest's factory of running operators (async context managers)
Eventually = Callable[..., Any]
Messages = Callable[[], list[str]]

FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'

# A loop's sleep measured by time.monotonic() may end this much early: uvloop's timers count milliseconds.
LOOP_CLOCK_SLACK = 0.001

pytestmark = pytest.mark.usefixtures('background_settings')



async def test_async_daemon_gets_its_kwargs_and_holds_the_deletion_until_it_exits(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, messages: Messages) -> None:
    seen: dict[str, Any] = {}
    exiting = asyncio.Event()  # the daemon is told to stop
    release = asyncio.Event()  # the test lets it exit

    @kopf.daemon('kopfexamples', registry=registry, param='p')
    async def monitor(stopped: kopf.DaemonStopped, **kwargs: Any) -> None:
        seen.update(kwargs, stopped=stopped, loop=asyncio.get_running_loop())
        while not stopped:
            await stopped.wait(10)
        seen['reason'] = stopped.reason
        exiting.set()
        await release.wait()

    async with operator(registry, settings):
        created = await cluster.create('kex1', labels={'app': 'x'})
        await eventually(lambda: 'stopped' in seen)
        await eventually(lambda: cluster.finalizers() == [FINALIZER])

        assert isinstance(seen['stopped'], kopf.AsyncDaemonStopperChecker)
        assert seen['loop'] is asyncio.get_running_loop()
        assert seen['name'] == 'kex1' and seen['namespace'] == 'default'
        assert seen['uid'] == created.body['metadata']['uid']
        assert seen['labels'] == {'app': 'x'} and dict(seen['annotations']) == {}
        assert seen['spec'] == {'field': 'value'} and seen['body']['kind'] == 'KopfExample'
        assert seen['meta']['name'] == 'kex1' and dict(seen['status']) == {}
        assert seen['resource'].plural == 'kopfexamples'
        assert seen['param'] == 'p' and seen['retry'] == 0
        assert seen['started'] is not None and seen['runtime'] is not None
        assert isinstance(seen['patch'], kopf.Patch) and isinstance(seen['memo'], kopf.Memo)
        assert isinstance(seen['logger'], kopf.ObjectLogger)

        # The body is live: the daemon sees the new state without being restarted.
        await cluster.patch('kex1', {'spec': {'field': 'changed'}})
        await eventually(lambda: seen['spec'].get('field') == 'changed')

        # The deletion waits for the daemon to exit, then the finalizer is released.
        await cluster.delete('kex1')
        await asyncio.wait_for(exiting.wait(), timeout=5)
        assert seen['reason'] == kopf.DaemonStoppingReason.RESOURCE_DELETED
        await asyncio.sleep(0.3)  # nothing can happen while the daemon runs; give it a chance to (wrongly)
        assert cluster.get() is not None
        assert cluster.finalizers() == [FINALIZER]
        release.set()
        await eventually(lambda: cluster.get() is None)

    assert "Daemon 'monitor' has exited on request and will not be retried or restarted." in messages()


async def test_sync_daemon_runs_in_a_thread_and_stops_on_deletion(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    seen: dict[str, Any] = {}

    @kopf.daemon('kopfexamples', registry=registry)
    def monitor(stopped: kopf.DaemonStopped, spec: kopf.Spec, **_: Any) -> None:
        seen.update(stopped=stopped, thread=threading.current_thread())
        while not stopped:
            seen['field'] = spec.get('field')
            stopped.wait(0.05)
        seen['reason'] = stopped.reason

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: seen.get('field') == 'value')
        assert isinstance(seen['stopped'], kopf.SyncDaemonStopperChecker)
        assert seen['thread'] is not threading.main_thread()

        await cluster.patch('kex1', {'spec': {'field': 'changed'}})
        await eventually(lambda: seen.get('field') == 'changed')

        await cluster.delete('kex1')
        await eventually(lambda: cluster.get() is None)
        assert seen['reason'] == kopf.DaemonStoppingReason.RESOURCE_DELETED


async def test_async_daemon_ignoring_the_flag_is_cancelled_after_the_cancellation_timeout(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, messages: Messages) -> None:
    events: list[str] = []

    @kopf.daemon('kopfexamples', registry=registry, cancellation_backoff=0.2, cancellation_timeout=2)
    async def stubborn(**_: Any) -> None:
        events.append('started')
        try:
            while True:  # noqa: ASYNC110  (busy, and never looks at the stop-flag)
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            events.append('cancelled')
            raise

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: events == ['started'])
        started = time.monotonic()
        await cluster.delete('kex1')
        await eventually(lambda: cluster.get() is None)
        assert time.monotonic() - started >= 0.2 - LOOP_CLOCK_SLACK  # the cancellation backoff
        assert events == ['started', 'cancelled']
    assert "Daemon 'stubborn' is cancelled and will not be retried or restarted." in messages()


async def test_cancellation_interrupts_only_the_function_and_its_patch_is_still_applied(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, messages: Messages) -> None:
    events: list[str] = []

    @kopf.daemon('kopfexamples', registry=registry, cancellation_timeout=2)
    async def stubborn(patch: kopf.Patch, **_: Any) -> None:
        patch.status['progress'] = 'half-way'
        events.append('started')
        try:
            await asyncio.Event().wait()  # never looks at the stop-flag
        except asyncio.CancelledError:
            events.append('cancelled')
            raise

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: events == ['started'])
    # The operator's exit stops the daemon: the object stays, with the patch of the cancelled function.
    assert events == ['started', 'cancelled']
    assert cluster.get()['status'].get('progress') == 'half-way'
    assert "Daemon 'stubborn' is cancelled and will not be retried or restarted." in messages()


async def test_sync_daemon_ignoring_the_flag_is_abandoned_after_the_cancellation_timeout(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, messages: Messages,
        gates: list[threading.Event]) -> None:
    gate = threading.Event()
    gates.append(gate)
    events: list[str] = []

    @kopf.daemon('kopfexamples', registry=registry, cancellation_timeout=0.3)
    def stubborn(**_: Any) -> None:
        events.append('started')
        gate.wait()
        events.append('exited')

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: events == ['started'])
        with pytest.warns(ResourceWarning, match=r"Daemon 'stubborn' did not exit in time"):
            await cluster.delete('kex1')
            await eventually(lambda: cluster.get() is None)
        assert events == ['started']  # still running in its thread, but the object is released
        assert "Daemon 'stubborn' did not exit in time. Leaving it orphaned." in messages()
        gate.set()
        await eventually(lambda: events == ['started', 'exited'])


async def test_daemon_that_fails_is_restarted_after_the_backoff(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, messages: Messages) -> None:
    calls: list[tuple[int, float]] = []

    @kopf.daemon('kopfexamples', registry=registry, backoff=0.2)
    async def flaky(retry: int, stopped: kopf.DaemonStopped, **_: Any) -> None:
        calls.append((retry, time.monotonic()))
        if retry == 0:
            raise ValueError('boom')
        if retry == 1:
            raise kopf.TemporaryError('not yet', delay=0.3)
        await stopped.wait()

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: len(calls) == 3)
        assert [retry for retry, _ in calls] == [0, 1, 2]
        assert calls[1][1] - calls[0][1] >= 0.2 - LOOP_CLOCK_SLACK  # the backoff
        assert calls[2][1] - calls[1][1] >= 0.3 - LOOP_CLOCK_SLACK  # the temporary error's delay
        await cluster.delete('kex1')
        await eventually(lambda: cluster.get() is None)
    assert "Daemon 'flaky' failed with an exception and will try again in 0.2 seconds: boom" in messages()
    assert "Daemon 'flaky' failed temporarily: not yet" in messages()
    assert len(calls) == 3


@pytest.mark.parametrize('outcome', ['return', 'permanent', 'ignored'])
async def test_daemon_that_exits_or_fails_for_good_is_not_restarted(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, messages: Messages, outcome: str) -> None:
    calls: list[int] = []

    @kopf.daemon('kopfexamples', registry=registry, backoff=0.01, errors=kopf.ErrorsMode.IGNORED,
                 id='once')
    async def once(retry: int, patch: kopf.Patch, **_: Any) -> str:
        calls.append(retry)
        patch.status['touched'] = 'yes'
        if outcome == 'permanent':
            raise kopf.PermanentError('never again')
        if outcome == 'ignored':
            raise ValueError('ignored')
        return 'done'

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: cluster.status().get('touched') == 'yes')
        # More events of the object: the daemon is not spawned again.
        await cluster.patch('kex1', {'spec': {'field': 'changed'}})
        await cluster.patch('kex1', {'metadata': {'labels': {'more': 'events'}}})
        await asyncio.sleep(0.3)  # a chance for the wrong restarts (if any) to happen
        assert calls == [0]
        if outcome == 'return':
            assert cluster.status().get('once') == 'done'  # the result is delivered
            assert "Daemon 'once' succeeded." in messages()
        if outcome == 'permanent':
            assert ("Daemon 'once' has exited after a permanent failure "
                    "and will not be retried or restarted.") in messages()
        else:
            assert "Daemon 'once' has exited on its own and will not be retried or restarted." in messages()
        await cluster.delete('kex1')
        await eventually(lambda: cluster.get() is None)


async def test_daemon_initial_delay(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    started: list[float] = []

    @kopf.daemon('kopfexamples', registry=registry, initial_delay=0.5)
    async def delayed(stopped: kopf.DaemonStopped, **_: Any) -> None:
        started.append(time.monotonic())
        await stopped.wait()

    async with operator(registry, settings):
        created = time.monotonic()
        await cluster.create('kex1')
        await eventually(lambda: bool(started))
        assert started[0] - created >= 0.5


async def test_daemons_stop_when_the_filters_mismatch_and_restart_when_they_match(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    events: list[Any] = []

    @kopf.daemon('kopfexamples', registry=registry, labels={'run': 'yes'},
                 when=lambda spec, **_: spec.get('enabled', True))
    async def filtered(stopped: kopf.DaemonStopped, **_: Any) -> None:
        events.append('started')
        await stopped.wait()
        events.append(stopped.reason)

    async with operator(registry, settings):
        await cluster.create('kex1', labels={'run': 'yes'})
        await eventually(lambda: events == ['started'])
        await eventually(lambda: cluster.finalizers() == [FINALIZER])

        await cluster.patch('kex1', {'metadata': {'labels': {'run': 'no'}}})
        await eventually(lambda: len(events) == 2)
        assert events[1] == kopf.DaemonStoppingReason.FILTERS_MISMATCH
        await eventually(lambda: cluster.finalizers() == [])  # no daemons: no finalizer needed

        await cluster.patch('kex1', {'metadata': {'labels': {'run': 'yes'}}})
        await eventually(lambda: len(events) == 3)
        assert events[2] == 'started'

        # The `when=` callbacks are evaluated on every event too.
        await cluster.patch('kex1', {'spec': {'enabled': False}})
        await eventually(lambda: len(events) == 4)
        assert events[3] == kopf.DaemonStoppingReason.FILTERS_MISMATCH
        await cluster.patch('kex1', {'spec': {'enabled': True}})
        await eventually(lambda: len(events) == 5)


async def test_operator_restart_keeps_exactly_one_daemon_per_object(
        make_registry: Callable[[], kopf.OperatorRegistry], settings: kopf.OperatorSettings,
        cluster: Cluster, operator: Operator, eventually: Eventually) -> None:
    running: dict[str, int] = {}
    peaks: dict[str, int] = {}
    starts: list[tuple[int, str]] = []
    reasons: list[Any] = []

    def make(generation: int) -> kopf.OperatorRegistry:
        registry = make_registry()

        @kopf.daemon('kopfexamples', registry=registry)
        async def monitor(name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
            starts.append((generation, name))
            running[name] = running.get(name, 0) + 1
            peaks[name] = max(peaks.get(name, 0), running[name])
            try:
                await stopped.wait()
                reasons.append(stopped.reason)
            finally:
                running[name] -= 1

        return registry

    await cluster.create('kex1')
    await cluster.create('kex2')
    async with operator(make(1), settings) as first:
        await eventually(lambda: sorted(starts) == [(1, 'kex1'), (1, 'kex2')])
        await first.stop()
    assert running == {'kex1': 0, 'kex2': 0}
    assert reasons == [kopf.DaemonStoppingReason.OPERATOR_EXITING] * 2

    async with operator(make(2), settings):
        await eventually(lambda: len(starts) == 4)
        await cluster.patch('kex1', {'spec': {'field': 'changed'}})
        await asyncio.sleep(0.3)
        assert sorted(starts[2:]) == [(2, 'kex1'), (2, 'kex2')]
        assert running == {'kex1': 1, 'kex2': 1}
    assert peaks == {'kex1': 1, 'kex2': 1}
    assert running == {'kex1': 0, 'kex2': 0}


async def test_operator_exit_stops_all_daemons_and_timers_and_leaves_no_tasks(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, gates: list[threading.Event]) -> None:
    reasons: list[Any] = []
    ticks: list[float] = []
    gate = threading.Event()
    gates.append(gate)

    @kopf.daemon('kopfexamples', registry=registry)
    async def async_daemon(stopped: kopf.DaemonStopped, **_: Any) -> None:
        await stopped.wait()
        reasons.append(('async', stopped.reason))

    @kopf.daemon('kopfexamples', registry=registry)
    def sync_daemon(stopped: kopf.DaemonStopped, **_: Any) -> None:
        stopped.wait()
        reasons.append(('sync', stopped.reason))

    @kopf.daemon('kopfexamples', registry=registry, cancellation_timeout=0.2)
    async def stubborn_daemon(**_: Any) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            reasons.append(('stubborn', 'cancelled'))
            raise

    @kopf.timer('kopfexamples', registry=registry, interval=0.05)
    def timer(**_: Any) -> None:
        ticks.append(time.monotonic())

    before = asyncio.all_tasks()
    async with operator(registry, settings) as running:
        await cluster.create('kex1')
        await eventually(lambda: len(ticks) >= 3)
        await running.stop()
        stopped_at = time.monotonic()

    assert sorted(reasons, key=str) == sorted([
        ('async', kopf.DaemonStoppingReason.OPERATOR_EXITING),
        ('sync', kopf.DaemonStoppingReason.OPERATOR_EXITING),
        ('stubborn', 'cancelled'),
    ], key=str)
    assert not [tick for tick in ticks if tick > stopped_at]
    assert asyncio.all_tasks() - before == {asyncio.current_task()} - before
    count = len(ticks)
    await asyncio.sleep(0.2)
    assert len(ticks) == count  # no more ticks after the exit


async def test_sync_daemon_ignoring_the_flag_holds_the_object_while_polled(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, messages: Messages,
        gates: list[threading.Event]) -> None:
    gate = threading.Event()
    gates.append(gate)
    events: list[str] = []
    settings.background.cancellation_polling = 0.2  # also how often the deletion is re-checked

    @kopf.daemon('kopfexamples', registry=registry, cancellation_polling=0.1)
    def stubborn(**_: Any) -> None:
        events.append('started')
        gate.wait()
        events.append('exited')

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: events == ['started'])
        await cluster.delete('kex1')
        polled = "Daemon 'stubborn' has not exited yet after being stopped; checking again in 0.1 seconds."
        await eventually(lambda: messages().count(polled) >= 3)
        assert cluster.finalizers() == [FINALIZER]  # no cancellation timeout: the object is held
        gate.set()
        await eventually(lambda: cluster.get() is None)
        assert events == ['started', 'exited']


async def test_objects_gone_without_our_finalizer_stop_their_daemons(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    reasons: list[Any] = []

    @kopf.daemon('kopfexamples', registry=registry)
    async def monitor(stopped: kopf.DaemonStopped, **_: Any) -> None:
        await stopped.wait()
        reasons.append(stopped.reason)

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: cluster.finalizers() == [FINALIZER])
        await cluster.patch('kex1', {'metadata': {'finalizers': None}})  # e.g. removed by force
        await cluster.delete('kex1')
        await eventually(lambda: reasons == [kopf.DaemonStoppingReason.RESOURCE_DELETED])


def test_public_names_of_the_stop_flags() -> None:
    assert [reason.name for reason in kopf.DaemonStoppingReason] == [
        'DONE', 'FILTERS_MISMATCH', 'RESOURCE_DELETED', 'OPERATOR_PAUSING', 'OPERATOR_EXITING',
        'DAEMON_SIGNALLED', 'DAEMON_CANCELLED', 'DAEMON_ABANDONED',
    ]
    assert issubclass(kopf.SyncDaemonStopperChecker, kopf.DaemonStopped)
    assert issubclass(kopf.AsyncDaemonStopperChecker, kopf.DaemonStopped)


async def test_operator_exit_cancels_the_daemons_that_would_be_polled_forever(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, messages: Messages) -> None:
    events: list[str] = []
    settings.background.cancellation_polling = 0.2

    @kopf.daemon('kopfexamples', registry=registry, cancellation_polling=0.1)
    async def stubborn(**_: Any) -> None:
        events.append('started')
        try:
            await asyncio.Event().wait()  # ignores the stop-flag; no cancellation timeout
        except asyncio.CancelledError:
            events.append('cancelled')
            raise

    async with operator(registry, settings) as running:
        await cluster.create('kex1')
        await eventually(lambda: events == ['started'])
        await cluster.delete('kex1')  # its stopping sequence would poll the daemon forever
        polled = "Daemon 'stubborn' has not exited yet after being stopped; checking again in 0.1 seconds."
        await eventually(lambda: polled in messages())
        started = time.monotonic()
        await running.stop()
        duration = time.monotonic() - started
    assert events == ['started', 'cancelled']
    assert 4.5 <= duration < 9  # the exit grace of the daemons (5 s as documented), and a bit more


async def test_daemon_stops_being_restarted_once_out_of_retries(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, messages: Messages) -> None:
    calls: list[int] = []

    @kopf.daemon('kopfexamples', registry=registry, retries=3, backoff=0.01)
    async def hopeless(retry: int, **_: Any) -> None:
        calls.append(retry)
        raise ValueError('boom')

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: "Daemon 'hopeless' has exited after a permanent failure "
                                 "and will not be retried or restarted." in messages())
        await cluster.patch('kex1', {'spec': {'field': 'changed'}})
        await asyncio.sleep(0.2)  # a chance for the wrong restarts (if any) to happen
    assert calls == [0, 1, 2]
    assert any('exceed 3 retries' in message for message in messages())


async def test_daemons_and_timers_get_the_operator_indices(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    seen: dict[str, Any] = {}

    @kopf.index('kopfexamples', registry=registry)
    def fields(name: str, spec: kopf.Spec, **_: Any) -> Any:
        return {name: spec.get('field')}

    @kopf.daemon('kopfexamples', registry=registry)
    async def monitor(fields: kopf.Index[str, Any], stopped: kopf.DaemonStopped, **_: Any) -> None:
        while not stopped:
            seen['daemon'] = dict(fields)
            await stopped.wait(0.05)

    @kopf.timer('kopfexamples', registry=registry, interval=0.05)
    async def ticker(fields: kopf.Index[str, Any], **_: Any) -> None:
        seen['timer'] = dict(fields)

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: {'daemon', 'timer'} <= set(seen))
        await eventually(lambda: {key: list(values) for key, values in seen['daemon'].items()}
                         == {'kex1': ['value']})
        await eventually(lambda: {key: list(values) for key, values in seen['timer'].items()}
                         == {'kex1': ['value']})


async def test_daemon_sees_its_own_writes_during_a_watch_outage(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        emulator: Any, operator: Operator, eventually: Eventually) -> None:
    # Issue #40: a daemon re-called after its patch (here: by its own retries) sees that patch in its
    # live body even while the watch-stream is down (no echoes come), not the object as it was before.
    outage = asyncio.Event()
    seen: list[int] = []

    @kopf.daemon('kopfexamples', registry=registry, backoff=0.05)
    async def counter(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        if outage.is_set():
            value = body.get('status', {}).get('counter', 0)
            seen.append(value)
            patch.status['counter'] = value + 1
        raise kopf.TemporaryError('again', delay=0.05)

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: cluster.finalizers() == [FINALIZER])
        emulator.fail_requests(None, status=503, verb='watch', path='kopfexamples')
        emulator.fail_requests(None, status=503, verb='list', path='kopfexamples')
        assert emulator.drop_watches(path='kopfexamples') == 1
        outage.set()
        await eventually(lambda: len(seen) >= 4)
        assert cluster.status().get('counter', 0) >= 3
        emulator.clear_faults()

    assert seen[:4] == [0, 1, 2, 3]  # before: [0, 1, 1, 1] (the state before its own last patch)
