"""
Timers (``@kopf.timer``) in whole operators against the emulator: schedules, results, patches, errors.
"""
import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

import kopf
from kopf._core.engines.timers import MAX_CALLS_IN_HANDS

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]  # the conftest's factory of running operators (async context managers)
Eventually = Callable[..., Any]
Messages = Callable[[], list[str]]

FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'

pytestmark = pytest.mark.usefixtures('background_settings')



async def test_timer_ticks_at_the_interval_with_results_and_patches(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, messages: Messages) -> None:
    calls: list[tuple[float, float]] = []  # (start, end)
    seen: dict[str, Any] = {}

    @kopf.timer('kopfexamples', registry=registry, interval=0.2, param='p')
    async def ticker(patch: kopf.Patch, **kwargs: Any) -> int:
        start = time.monotonic()
        seen.update(kwargs)
        patch.status['ticks'] = len(calls) + 1
        patch.metadata.setdefault('labels', {})['ticked'] = 'yes'
        calls.append((start, time.monotonic()))
        return len(calls)

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: len(calls) >= 4)
        await eventually(lambda: cluster.status().get('ticker', 0) >= 3)
        await eventually(lambda: cluster.status().get('ticks', 0) >= 3)
        assert cluster.get()['metadata']['labels'] == {'ticked': 'yes'}
        assert cluster.finalizers() == [FINALIZER]
        gaps = [start - end for (_, end), (start, _) in itertools.pairwise(calls)]
        assert all(gap >= 0.19 for gap in gaps), gaps

        assert seen['name'] == 'kex1' and seen['param'] == 'p' and seen['retry'] == 0
        assert seen['spec'] == {'field': 'value'} and seen['resource'].plural == 'kopfexamples'
        assert 'stopped' not in seen

        await cluster.delete('kex1')
        await eventually(lambda: cluster.get() is None)
        count = len(calls)
        await asyncio.sleep(0.3)
        assert len(calls) == count  # no ticks for the deleted object
    assert "Timer 'ticker' succeeded." in messages()


async def test_timer_sees_its_own_patches_and_stops_when_they_make_it_mismatch(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    # The next call sees the state made by the previous one; the filters are re-evaluated with it,
    # and the finalizer goes away once nothing matches the object anymore.
    seen: list[int] = []

    @kopf.timer('kopfexamples', registry=registry, interval=0.05,
                when=lambda status, **_: status.get('count', 0) < 3)
    async def counter(status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
        seen.append(status.get('count', 0))
        patch.status['count'] = status.get('count', 0) + 1

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: cluster.status().get('count') == 3)
        await eventually(lambda: cluster.finalizers() == [])  # nothing matches the object anymore
        await asyncio.sleep(0.2)  # a few intervals: no more calls
        assert seen == [0, 1, 2]
        assert cluster.status().get('count') == 3


async def test_timer_filters_get_the_objects_logger_on_every_event(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, caplog: pytest.LogCaptureFixture) -> None:
    # The filters are evaluated on every event of the object (e.g. the echoes of the timer's own patches);
    # the logger is made for them only then (not for the unfiltered handlers): still the object's.
    def logged(logger: kopf.Logger, status: kopf.Status, **_: Any) -> bool:
        logger.info(f'Filtered at {status.get("count", 0)}.')
        return True

    @kopf.timer('kopfexamples', registry=registry, interval=0.05, when=logged)
    async def counter(status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
        patch.status['count'] = status.get('count', 0) + 1

    def filtered() -> list[logging.LogRecord]:
        return [record for record in caplog.records if record.getMessage().startswith('Filtered at ')]

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: {'Filtered at 0.', 'Filtered at 1.', 'Filtered at 2.'} <=
                                 {record.getMessage() for record in filtered()})
    records = filtered()
    assert {record.kopf_object_ref['name'] for record in records} == {'kex1'}  # type: ignore[attr-defined]
    assert {record.kopf_object_prefix for record in records} == {'[default/kex1]'}  # type: ignore[attr-defined]


async def test_timer_body_is_live_during_a_call_and_fresh_in_every_call(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    # Every call gets its own view of the object's live body (its nested views are not kept with
    # the idle object between the calls), but the view still follows the object's changes.
    changed = asyncio.Event()
    seen: list[tuple[str, str, str]] = []  # (spec at the start, spec after the change, meta's label)
    bodies: list[kopf.Body] = []

    @kopf.timer('kopfexamples', registry=registry, interval=0.05)
    async def watcher(body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta, **_: Any) -> None:
        bodies.append(body)
        at_start = spec.get('field')
        if len(seen) == 0:
            await changed.wait()  # the object is changed while this first call runs
            await eventually(lambda: spec.get('field') == 'changed')
        seen.append((at_start, spec.get('field'), meta.labels.get('app')))

    async with operator(registry, settings):
        await cluster.create('kex1', labels={'app': 'x'})
        await eventually(lambda: len(bodies) == 1)
        await cluster.patch('kex1', {'spec': {'field': 'changed'}, 'metadata': {'labels': {'app': 'y'}}})
        changed.set()
        await eventually(lambda: len(seen) >= 2)

    assert seen[0] == ('value', 'changed', 'y')  # the live body during the call
    assert seen[1] == ('changed', 'changed', 'y')  # the next call starts with the latest state
    assert bodies[0] is not bodies[1]


@pytest.mark.parametrize('sharp', [True, False])
async def test_sharp_timers_count_the_interval_from_the_start_of_the_call(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, sharp: bool) -> None:
    starts: list[float] = []

    @kopf.timer('kopfexamples', registry=registry, interval=0.3, sharp=sharp)
    async def slow(**_: Any) -> None:
        starts.append(time.monotonic())
        await asyncio.sleep(0.25)

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: len(starts) >= 4)
    periods = [later - earlier for earlier, later in itertools.pairwise(starts)]
    if sharp:
        assert all(0.29 <= period < 0.5 for period in periods), periods  # ~0.3 s
    else:
        assert all(period >= 0.54 for period in periods), periods  # 0.25 s + 0.3 s


async def test_idle_timers_wait_until_the_object_stays_unchanged(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    calls: list[float] = []

    @kopf.timer('kopfexamples', registry=registry, idle=0.5, interval=0.1)
    async def quiet(**_: Any) -> None:
        calls.append(time.monotonic())

    async with operator(registry, settings):
        await cluster.create('kex1')
        changed = time.monotonic()
        for i in range(8):  # keep changing the object more often than the idle time
            await asyncio.sleep(0.1)
            await cluster.patch('kex1', {'spec': {'field': i}})
            changed = time.monotonic()
        assert calls == []
        await eventually(lambda: len(calls) >= 3)
        assert calls[0] - changed >= 0.45  # since the last change (as noticed by the operator)

        # A change pauses the ticks for the idle time again.
        await cluster.patch('kex1', {'spec': {'field': 'again'}})
        changed = time.monotonic()
        count = len(calls)
        await eventually(lambda: len(calls) > count + 1)
        assert [call for call in calls[count + 1:] if call - changed < 0.45] == []


async def test_idle_only_timer_is_called_once_per_quiet_period(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    calls: list[float] = []

    @kopf.timer('kopfexamples', registry=registry, idle=0.2)
    async def quiet(**_: Any) -> None:
        calls.append(time.monotonic())

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: len(calls) == 1)
        await asyncio.sleep(0.5)
        assert len(calls) == 1
        await cluster.patch('kex1', {'spec': {'field': 'changed'}})
        await eventually(lambda: len(calls) == 2)


async def test_initial_delay_postpones_the_first_call(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    calls: list[float] = []

    def delay_of(spec: kopf.Spec, **_: Any) -> float:
        return float(spec['delay'])

    @kopf.timer('kopfexamples', registry=registry, interval=0.1, initial_delay=0.5)
    async def fixed(**_: Any) -> None:
        calls.append(time.monotonic())

    @kopf.timer('kopfexamples', registry=registry, interval=0.1, initial_delay=delay_of)
    async def computed(**_: Any) -> None:
        calls.append(-time.monotonic())

    async with operator(registry, settings):
        created = time.monotonic()
        await cluster.create('kex1', spec={'delay': 0.7})
        await eventually(lambda: any(call > 0 for call in calls) and any(call < 0 for call in calls))
    assert min(call for call in calls if call > 0) - created >= 0.5
    assert min(-call for call in calls if call < 0) - created >= 0.7


async def test_initial_delay_counts_from_when_the_object_was_seen_not_processed(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    # One object at a time: the second one's processing (where its timer starts) waits for the first
    # one's slow handler; its timer must count its initial delay from the listing, as the first one's.
    settings.queueing.worker_limit = 1
    handled: list[tuple[str, float]] = []
    ticks: dict[str, float] = {}

    @kopf.on.resume('kopfexamples', registry=registry)
    @kopf.on.create('kopfexamples', registry=registry)
    async def slow_first(name: str, **_: Any) -> None:
        handled.append((name, time.monotonic()))
        if len(handled) == 1:
            await asyncio.sleep(2.0)

    @kopf.timer('kopfexamples', registry=registry, interval=10, initial_delay=1.0)
    async def ticker(name: str, **_: Any) -> None:
        ticks.setdefault(name, time.monotonic())

    await cluster.create('kex1')
    await cluster.create('kex2')
    started = time.monotonic()
    async with operator(registry, settings):
        await eventually(lambda: len(ticks) == 2 and len(handled) == 2, within=10)
    first, second = handled[0][0], handled[1][0]
    assert handled[1][1] - started >= 2.0  # the second object's processing has waited indeed
    assert 1.0 <= ticks[first] - started < 2.0
    # At once when its processing starts (its delay is over by then), not 1 s later than that.
    assert 2.0 <= ticks[second] - started < 2.7


async def test_timers_due_at_once_are_started_by_the_limit_of_calls_in_hands(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    count = MAX_CALLS_IN_HANDS + 300
    calls: set[str] = set()
    max_calls = [0]

    @kopf.timer('kopfexamples', registry=registry, interval=60, initial_delay=0.5)
    async def ticker(name: str, **_: Any) -> str:
        calls.add(name)
        running = sum(1 for task in asyncio.all_tasks() if task.get_coro().__qualname__ == 'Timers._run')
        max_calls[0] = max(max_calls[0], running)
        return 'ticked'  # a result: every call patches the object's status (slowly, see below)

    await asyncio.gather(*(cluster.create(f'kex{i}') for i in range(count)))
    cluster.emulator.add_latency(0.2, verb='patch', path='/status')
    async with operator(registry, settings):
        await eventually(lambda: len(calls) == count, within=30)
    # All due at once; without the limit, all the calls would be waiting for the API at once.
    assert max_calls[0] <= MAX_CALLS_IN_HANDS + 1


async def test_slow_timer_functions_are_not_limited_by_the_calls_in_hands(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    count = MAX_CALLS_IN_HANDS + 50
    running: set[str] = set()
    max_running = [0]

    release = asyncio.Event()

    @kopf.timer('kopfexamples', registry=registry, interval=60)
    async def slow(name: str, **_: Any) -> None:
        running.add(name)
        max_running[0] = max(max_running[0], len(running))
        await release.wait()  # until all have started: they leave the framework's hands for others meanwhile
        running.discard(name)

    await asyncio.gather(*(cluster.create(f'kex{i}') for i in range(count)))
    async with operator(registry, settings):
        try:
            await eventually(lambda: max_running[0] == count, within=10)
        finally:
            release.set()


async def test_calls_of_one_timer_never_overlap(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    active: list[int] = [0]
    peak: list[int] = [0]
    calls: list[float] = []

    @kopf.timer('kopfexamples', registry=registry, interval=0.01, sharp=True)
    async def slow(**_: Any) -> None:
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        calls.append(time.monotonic())
        await asyncio.sleep(0.1)
        active[0] -= 1

    async with operator(registry, settings):
        await cluster.create('kex1')
        await cluster.patch('kex1', {'spec': {'field': 'more events'}})
        await eventually(lambda: len(calls) >= 5)
    assert peak == [1]


async def test_timer_errors_are_retried_per_backoff_and_stop_on_permanent_errors(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, messages: Messages) -> None:
    flaky_calls: list[tuple[int, float]] = []
    permanent_calls: list[int] = []

    @kopf.timer('kopfexamples', registry=registry, interval=0.4, backoff=0.1)
    async def flaky(retry: int, **_: Any) -> None:
        flaky_calls.append((retry, time.monotonic()))
        if retry < 2:
            raise ValueError('boom')

    @kopf.timer('kopfexamples', registry=registry, interval=0.05)
    async def doomed(retry: int, **_: Any) -> None:
        permanent_calls.append(retry)
        raise kopf.PermanentError('never again')

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: len(flaky_calls) >= 5)
        await asyncio.sleep(0.2)

    # A cycle: 2 failures with the backoff, a success, the interval; then a new cycle from retry 0.
    assert [retry for retry, _ in flaky_calls[:5]] == [0, 1, 2, 0, 1]
    times = [moment for _, moment in flaky_calls]
    assert 0.09 <= times[1] - times[0] < 0.39  # the backoff, not the interval
    assert 0.09 <= times[2] - times[1] < 0.39
    assert times[3] - times[2] >= 0.39
    assert permanent_calls == [0]
    assert "Timer 'flaky' failed with an exception and will try again in 0.1 seconds: boom" in messages()
    assert "Timer 'doomed' failed permanently: never again" in messages()


async def test_timers_stop_when_the_filters_mismatch_and_restart_when_they_match(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    calls: list[str] = []

    @kopf.timer('kopfexamples', registry=registry, interval=0.05, field='spec.enabled', value=True)
    async def filtered(**_: Any) -> None:
        calls.append('tick')

    async with operator(registry, settings):
        await cluster.create('kex1', spec={'enabled': True})
        await eventually(lambda: len(calls) >= 2)
        await cluster.patch('kex1', {'spec': {'enabled': False}})
        await eventually(lambda: cluster.finalizers() == [])
        await asyncio.sleep(0.1)  # the call in progress, if any, finishes
        count = len(calls)
        await asyncio.sleep(0.3)
        assert len(calls) == count
        await cluster.patch('kex1', {'spec': {'enabled': True}})
        await eventually(lambda: len(calls) >= count + 2)


async def test_deletion_waits_for_the_timer_call_in_progress(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()
    events: list[str] = []

    @kopf.timer('kopfexamples', registry=registry, interval=10)
    async def long_call(**_: Any) -> None:
        events.append('entered')
        entered.set()
        await release.wait()
        events.append('exited')

    async with operator(registry, settings):
        await cluster.create('kex1')
        await asyncio.wait_for(entered.wait(), timeout=5)
        await cluster.delete('kex1')
        await asyncio.sleep(0.3)
        assert cluster.get() is not None
        release.set()
        await eventually(lambda: cluster.get() is None)
    assert events == ['entered', 'exited']


async def test_timer_without_interval_or_idle_warns_at_load_and_runs_once_per_object(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually) -> None:
    # As in Kopf: such a timer loads (with a warning saying how to repeat it) and runs once per object.
    calls: list[str] = []
    changes: list[Any] = []

    with pytest.warns(UserWarning, match=r'@kopf.timer\(\) has neither interval= nor idle=: it will be '
                                         r'called once per object\. Add interval= .* or idle= .*'):
        @kopf.timer('kopfexamples', registry=registry)
        async def once(name: str, **_: Any) -> None:
            calls.append(name)

    @kopf.on.update('kopfexamples', registry=registry, field='spec.field')
    async def changed(new: Any, **_: Any) -> None:
        changes.append(new)

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: calls == ['kex1'])
        await cluster.patch('kex1', {'spec': {'field': 'changed'}})
        await eventually(lambda: changes == ['changed'])
        await cluster.create('kex2')  # a later object gets its own single call, after kex1's change
        await eventually(lambda: sorted(calls) == ['kex1', 'kex2'])
        await cluster.patch('kex2', {'spec': {'field': 'changed'}})
        await eventually(lambda: changes == ['changed', 'changed'])
    assert sorted(calls) == ['kex1', 'kex2']


@pytest.mark.parametrize('kwargs, error, message', [
    ({'sharp': True}, TypeError, r'needs interval='),
    ({'sharp': True, 'idle': 1}, TypeError, r'sharp=True needs interval='),
    ({'interval': 0}, ValueError, r'interval= must be positive'),
    ({'interval': -1}, ValueError, r'interval= must be positive'),
    ({'interval': 1, 'idle': -1}, ValueError, r'idle= must be non-negative'),
    ({'interval': 1, 'initial_delay': -1}, ValueError, r'initial_delay= must be non-negative'),
    ({'interval': 1, 'backoff': -1}, ValueError, r'backoff= must be non-negative'),
    ({'interval': 1, 'timeout': -1}, ValueError, r'timeout= must be non-negative'),
])
def test_bad_timer_options_fail_at_decoration_time(
        registry: kopf.OperatorRegistry, kwargs: dict[str, Any], error: type[Exception], message: str,
) -> None:
    with pytest.raises(error, match=message):
        kopf.timer('kopfexamples', registry=registry, **kwargs)
    assert not registry.spawning


@pytest.mark.parametrize('kwargs, error, message', [
    ({'initial_delay': -1}, ValueError, r'initial_delay= must be non-negative'),
    ({'backoff': -1}, ValueError, r'backoff= must be non-negative'),
    ({'cancellation_backoff': -1}, ValueError, r'cancellation_backoff= must be non-negative'),
    ({'cancellation_timeout': -1}, ValueError, r'cancellation_timeout= must be non-negative'),
    ({'cancellation_polling': 0}, ValueError, r'cancellation_polling= must be positive'),
    ({'cancellation_polling': 'x'}, TypeError, r'cancellation_polling= must be a number'),
])
def test_bad_daemon_options_fail_at_decoration_time(
        registry: kopf.OperatorRegistry, kwargs: dict[str, Any], error: type[Exception], message: str,
) -> None:
    with pytest.raises(error, match=message):
        kopf.daemon('kopfexamples', registry=registry, **kwargs)
    assert not registry.spawning


# With the debug logs, the patches' responses are decoded in full (for the inconsistencies' check); without
# them, only the versions are read from the responses' texts (all that the own writes need).
LOG_LEVELS = pytest.mark.parametrize('log_level', [
    pytest.param(logging.DEBUG, id='debug-logs'),
    pytest.param(logging.INFO, id='info-logs'),
])


@LOG_LEVELS
async def test_timer_sees_its_own_writes_during_a_watch_outage(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        emulator: Any, operator: Operator, eventually: Eventually, caplog: pytest.LogCaptureFixture,
        log_level: int) -> None:
    # Issue #40: while the watch-stream is down (no echoes of the patches come), every call still sees
    # the object as the previous call's patch has made it (as the API has answered), not as it was before.
    caplog.set_level(log_level, logger='kopf')
    outage = asyncio.Event()
    seen: list[int] = []

    @kopf.timer('kopfexamples', registry=registry, interval=0.05)
    async def counter(status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
        if outage.is_set():
            seen.append(status.get('counter', 0))
            patch.status['counter'] = status.get('counter', 0) + 1

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


@LOG_LEVELS
async def test_timer_sees_its_own_writes_when_their_echoes_come_before_the_responses(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        emulator: Any, operator: Operator, eventually: Eventually, caplog: pytest.LogCaptureFixture,
        log_level: int) -> None:
    # A loaded API server: each patch is applied and its echo arrives long before its response. Every call
    # sees the object as the previous call's patch has made it: no increment is lost or repeated.
    caplog.set_level(log_level, logger='kopf')
    seen: list[int] = []

    @kopf.timer('kopfexamples', registry=registry, interval=0.05)
    async def counter(status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
        seen.append(status.get('counter', 0))
        patch.status['counter'] = status.get('counter', 0) + 1

    emulator.add_latency(0.3, verb='patch', path='/status', after_applying=True)
    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: len(seen) >= 5)

    assert seen[:5] == [0, 1, 2, 3, 4]
