"""
The multiplexing of a watch-stream into per-object workers: serialisation, batching, idling, throttling.

The events are fed directly into the multiplexer (as the watcher does it with the API's stream),
and the time is the loop's fake time (looptime), so the delays are seen exactly as configured.
"""
import asyncio
import collections
import logging
from typing import Any

import pytest

from kopf._clients.connections import CannotConnect, Disconnected
from kopf._clients.watching import Bookmark
from kopf._cogs.structs.bodies import RawEvent
from kopf._cogs.structs.references import Resource
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.reactor.contexts import Delivery
from kopf._core.reactor.queueing import ObjectStreams

pytestmark = pytest.mark.looptime

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', namespaced=True)


def event(name: str, value: Any = None, *, type: str | None = 'MODIFIED', uid: str | None = None) -> RawEvent:
    body = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
            'metadata': {'name': name, 'namespace': 'ns1', 'uid': uid or f'uid-{name}'},
            'spec': {'value': value}}
    return {'type': type, 'object': body}  # type: ignore[typeddict-item]


class Recorder:
    """A processor that takes some time, remembers what it got, and checks the concurrency."""

    def __init__(self, *, duration: float = 0, failures: int = 0, finished: bool | None = None,
                 error: Exception | None = None) -> None:
        self.duration = duration
        self.failures = failures
        self.error = error if error is not None else RuntimeError('boom')  # raised for the failures
        self.finished = finished  # what the processing returns: whether the object is finished with
        self.calls: list[tuple[float, str, str | None, Any]] = []
        self.pressures: list[bool] = []
        self.active: collections.Counter[str] = collections.Counter()
        self.max_per_object = 0
        self.max_total = 0

    async def __call__(self, delivery: Delivery) -> bool | None:
        raw_event = delivery.raw_event
        stream_pressure = delivery.pressure
        resource = delivery.resource
        namespace = delivery.namespace
        assert resource == KEX
        assert namespace == 'ns1'
        name = raw_event['object']['metadata']['name']
        self.calls.append((asyncio.get_running_loop().time(), name, raw_event['type'],
                           raw_event['object'].get('spec', {}).get('value')))
        self.active[name] += 1
        self.max_per_object = max(self.max_per_object, self.active[name])
        self.max_total = max(self.max_total, sum(self.active.values()))
        try:
            await asyncio.sleep(self.duration)
            self.pressures.append(stream_pressure.is_set())
            if self.failures > 0:
                self.failures -= 1
                raise self.error
            return self.finished
        finally:
            self.active[name] -= 1

    def values(self, name: str) -> list[Any]:
        return [value for _, obj, _, value in self.calls if obj == name]


@pytest.fixture
def settings() -> OperatorSettings:
    settings = OperatorSettings()
    settings.queueing.batch_window = 0.1
    settings.queueing.idle_timeout = 5
    settings.queueing.exit_timeout = 2
    settings.queueing.error_delays = [1, 2, 5]
    return settings


class Forgetter:
    """
    A finisher of the events of the objects with no workers: remembers whom it got, answers as told.

    The deleted & listed objects are answered by ``forgets`` (and remembered in ``names``); the other events
    (e.g. the timers' echoes) by ``settles`` (and remembered in ``changes``).
    """

    def __init__(self, *, forgets: bool = True, fails: bool = False, settles: bool = False) -> None:
        self.forgets = forgets
        self.fails = fails
        self.settles = settles
        self.names: list[str] = []
        self.changes: list[str] = []

    def __call__(self, *, raw_event: RawEvent, resource: Resource) -> bool:
        assert resource == KEX
        if raw_event['type'] not in ('DELETED', None):
            self.changes.append(raw_event['object']['metadata']['name'])
            if self.fails:
                raise RuntimeError('boom')
            return self.settles
        self.names.append(raw_event['object']['metadata']['name'])
        if self.fails:
            raise RuntimeError('boom')
        return self.forgets


def make_streams(processor: Recorder, settings: OperatorSettings, limit: int | None = None,
                 forgetter: Forgetter | None = None) -> ObjectStreams:
    limiter = asyncio.Semaphore(limit) if limit is not None else None
    return ObjectStreams(processor=processor, resource=KEX, namespace='ns1',
                         settings=settings, limiter=limiter, forgetter=forgetter)


async def test_a_burst_of_events_is_batched_and_the_latest_one_wins(
        settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder()
    streams = make_streams(recorder, settings)
    for value in range(10):
        streams.feed(event('kex1', value))
    await asyncio.sleep(1)
    assert recorder.values('kex1') == [9]
    assert recorder.calls[0][0] == pytest.approx(0.0)  # the 1st event after a quiet period goes at once
    await streams.close()


async def test_an_isolated_event_goes_at_once_but_the_events_right_after_a_processing_are_batched(
        settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder(duration=0.5)
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 'first'))
    await asyncio.sleep(0.55)  # processed at 0.0-0.5, the events come right after it (e.g. its own echoes)
    streams.feed(event('kex1', 'echo1'))
    await asyncio.sleep(0.05)
    streams.feed(event('kex1', 'echo2'))
    await asyncio.sleep(3)  # batched: processed once at 0.7, then quiet for long
    streams.feed(event('kex1', 'later'))
    await asyncio.sleep(1)
    assert [(round(time, 2), value) for time, _, _, value in recorder.calls] == [
        (0.0, 'first'), (0.7, 'echo2'), (3.6, 'later'),
    ]
    await streams.close()


async def test_events_arriving_while_busy_are_batched_and_press_the_processor(
        settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder(duration=5)
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 'first'))
    await asyncio.sleep(1)
    for value in ['second', 'third', 'fourth']:
        streams.feed(event('kex1', value))
        await asyncio.sleep(1)
    await asyncio.sleep(10)
    assert recorder.values('kex1') == ['first', 'fourth']
    assert recorder.pressures == [True, False]
    assert recorder.max_per_object == 1
    assert recorder.calls[1][0] == pytest.approx(5.1)  # the 1st one ends at 5.0, then the batching window
    await streams.close()


async def test_objects_are_processed_in_parallel_but_each_one_serially(
        settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder(duration=1)
    streams = make_streams(recorder, settings)
    for round in range(3):
        for name in ['kex1', 'kex2', 'kex3']:
            streams.feed(event(name, round))
        await asyncio.sleep(0.5)
    await asyncio.sleep(5)
    assert recorder.max_total == 3
    assert recorder.max_per_object == 1
    for name in ['kex1', 'kex2', 'kex3']:
        assert recorder.values(name) == [0, 2]  # the 1st one processed, then only the latest one
    await streams.close()


async def test_worker_limit_caps_the_parallel_processing(settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder(duration=1)
    streams = make_streams(recorder, settings, limit=2)
    for index in range(5):
        streams.feed(event(f'kex{index}', index))
    await asyncio.sleep(10)
    assert len(recorder.calls) == 5
    assert recorder.max_total == 2
    assert sorted(round(time, 1) for time, *_ in recorder.calls) == [0.0, 0.0, 1.0, 1.0, 2.0]
    await streams.close()


async def test_idle_workers_exit_once_the_batching_window_is_over_and_leave_no_tasks(
        settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder()
    streams = make_streams(recorder, settings)
    tasks_before = asyncio.all_tasks()
    for index in range(1000):
        streams.feed(event(f'kex{index}', index))
    await asyncio.sleep(0.09)  # processed at 0.0, idle since then: their echoes would still be batched
    assert len(recorder.calls) == 1000
    assert streams.active_count == 1000
    await asyncio.sleep(0.02)  # the batching window is over at 0.1, long before the idle timeout (5 s)
    assert streams.active_count == 0
    assert streams.known_count == 1000
    assert asyncio.all_tasks() == tasks_before

    # A new event of an idle object starts a new worker, and goes at once, as after any quiet period.
    streams.feed(event('kex7', 'again'))
    await asyncio.sleep(1)
    assert recorder.values('kex7') == [7, 'again']
    assert recorder.calls[-1][0] == pytest.approx(0.11)
    await streams.close()


async def test_objects_returning_within_the_idle_timeout_keep_their_workers_for_it(
        settings: OperatorSettings, looptime: float) -> None:
    # E.g. the echoes of the timers' patches every second: a new worker for every one would cost more.
    recorder = Recorder()
    streams = make_streams(recorder, settings)
    tasks_before = asyncio.all_tasks()
    streams.feed(event('kex1', 1))  # processed at 0.0, its worker leaves at 0.1
    streams.feed(event('kex2', 1))  # processed at 0.0, its worker leaves at 0.1, it never comes back
    await asyncio.sleep(1)
    assert streams.active_count == 0
    streams.feed(event('kex1', 2))  # back within the idle timeout (5 s) since its worker left: at 1.0
    await asyncio.sleep(4.9)
    assert streams.active_count == 1  # idle since 1.0, for the idle timeout
    streams.feed(event('kex1', 3))  # the same worker, idle since 5.9 now
    await asyncio.sleep(4.9)
    assert streams.active_count == 1
    await asyncio.sleep(0.2)
    assert streams.active_count == 0  # left at 10.9
    assert recorder.values('kex1') == [1, 2, 3]
    assert [round(time, 2) for time, name, *_ in recorder.calls if name == 'kex1'] == [0.0, 1.0, 5.9]

    # Not returning anymore: a worker of its own after the idle timeout is a brief one again.
    await asyncio.sleep(6)
    streams.feed(event('kex1', 4))
    await asyncio.sleep(0.2)
    assert streams.active_count == 0
    assert asyncio.all_tasks() == tasks_before
    await streams.close()


async def test_idle_workers_exit_after_the_idle_timeout_if_it_is_shorter(
        settings: OperatorSettings, looptime: float) -> None:
    settings.queueing.idle_timeout = 0.05
    recorder = Recorder()
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 1))
    await asyncio.sleep(0.04)
    assert streams.active_count == 1
    await asyncio.sleep(0.02)
    assert streams.active_count == 0
    await streams.close()


async def test_idle_workers_expire_each_at_its_own_time(settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder()
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 1))  # processed at 0.00, idle till 0.10
    await asyncio.sleep(0.02)
    streams.feed(event('kex2', 2))  # processed at 0.02, idle till 0.12
    await asyncio.sleep(0.02)
    streams.feed(event('kex3', 3))  # processed at 0.04, idle till 0.14
    await asyncio.sleep(0.01)
    streams.feed(event('kex3', 'again'))  # batched till 0.15, processed then, idle till 0.25 (not 0.14)
    active: list[tuple[float, int]] = []
    for moment in [0.09, 0.11, 0.13, 0.24, 0.26]:
        await asyncio.sleep(moment - asyncio.get_running_loop().time())
        active.append((moment, streams.active_count))
    assert active == [(0.09, 3), (0.11, 2), (0.13, 1), (0.24, 1), (0.26, 0)]
    assert recorder.values('kex3') == [3, 'again']
    await streams.close()


async def test_idle_workers_share_one_timer_of_the_loop(settings: OperatorSettings, looptime: float) -> None:
    loop = asyncio.get_running_loop()
    timers_before = len(loop._scheduled)  # type: ignore[attr-defined]  # asyncio's own heap of timers
    recorder = Recorder()
    streams = make_streams(recorder, settings)
    for index in range(1000):
        streams.feed(event(f'kex{index}', index))
        await asyncio.sleep(0.00001)  # each goes idle at its own time
    assert streams.active_count == 1000
    assert len(loop._scheduled) <= timers_before + 2  # type: ignore[attr-defined]
    await asyncio.sleep(1)
    assert streams.active_count == 0
    await streams.close()


async def test_batching_windows_of_many_objects_share_one_timer_of_the_loop(
        settings: OperatorSettings, looptime: float) -> None:
    loop = asyncio.get_running_loop()
    recorder = Recorder(duration=1)
    streams = make_streams(recorder, settings)
    for index in range(1000):
        streams.feed(event(f'kex{index}', 'first'))
    await asyncio.sleep(1.01)  # all processed at 0.0-1.0; now, the "echoes" of all of them
    timers_before = len(loop._scheduled)  # type: ignore[attr-defined]  # asyncio's own heap of timers
    for index in range(1000):
        streams.feed(event(f'kex{index}', 'echo'))
        await asyncio.sleep(0.00001)  # each window starts at its own time
    # A timer per window would be 1000 timers; the recorder's sleeps are not there yet: all are batching.
    assert len(loop._scheduled) <= timers_before + 2  # type: ignore[attr-defined]
    await asyncio.sleep(0.2)
    assert all(recorder.values(f'kex{index}') == ['first', 'echo'] for index in range(1000))
    await streams.close()


async def two_processed_at_once(settings: OperatorSettings) -> tuple[Recorder, ObjectStreams]:
    """Two objects processed at 0.0-1.0; the time is 1.01 now: right after their processing."""
    recorder = Recorder(duration=1)
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 'first'))
    streams.feed(event('kex2', 'first'))
    await asyncio.sleep(1.01)
    return recorder, streams


async def test_batching_windows_end_each_at_its_own_time_and_restart_with_new_events(
        settings: OperatorSettings, looptime: float) -> None:
    recorder, streams = await two_processed_at_once(settings)
    streams.feed(event('kex1', 'echo'))  # its window: 1.01-1.11
    await asyncio.sleep(0.05)
    streams.feed(event('kex2', 'echo'))  # its window: 1.06-1.16, restarted at 1.11 by the next event
    await asyncio.sleep(0.05)
    streams.feed(event('kex2', 'echo2'))  # its window: 1.11-1.21
    await asyncio.sleep(2)
    times = {(name, value): round(time, 2) for time, name, _, value in recorder.calls}
    assert times == {('kex1', 'first'): 0.0, ('kex2', 'first'): 0.0,
                     ('kex1', 'echo'): 1.11, ('kex2', 'echo2'): 1.21}
    await streams.close()


async def test_a_batching_window_shortened_meanwhile_ends_in_time(
        settings: OperatorSettings, looptime: float) -> None:
    settings.queueing.batch_window = 1.0
    recorder = Recorder(duration=1)
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 'first'))  # processed at 0.0-1.0
    await asyncio.sleep(0.1)
    streams.feed(event('kex2', 'first'))  # processed at 0.1-1.1
    await asyncio.sleep(0.91)
    streams.feed(event('kex1', 'echo'))  # its window: 1.01-2.01
    await asyncio.sleep(0.1)
    settings.queueing.batch_window = 0.1
    streams.feed(event('kex2', 'echo'))  # its window: 1.11-1.21, earlier than the one before it
    await asyncio.sleep(2)
    times = {(name, value): round(time, 2) for time, name, _, value in recorder.calls}
    assert times == {('kex1', 'first'): 0.0, ('kex2', 'first'): 0.1,
                     ('kex1', 'echo'): 2.01, ('kex2', 'echo'): 1.21}
    await streams.close()


async def test_closing_interrupts_the_batching_windows(settings: OperatorSettings, looptime: float) -> None:
    settings.queueing.batch_window = 100
    recorder = Recorder(duration=1)
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 'first'))
    await asyncio.sleep(1.01)
    streams.feed(event('kex1', 'echo'))  # batched until 101.01 unless interrupted
    await asyncio.sleep(1)
    await streams.close()
    assert recorder.values('kex1') == ['first', 'echo']
    assert asyncio.get_running_loop().time() == pytest.approx(3.01, abs=0.01)  # the echo took 1 s: 2.01-3.01
    assert streams.active_count == 0


async def test_idle_workers_wait_forever_without_the_idle_timeout(
        settings: OperatorSettings, looptime: float) -> None:
    settings.queueing.idle_timeout = None  # type: ignore[assignment]
    recorder = Recorder()
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 1))
    await asyncio.sleep(1000)
    assert streams.active_count == 1
    streams.feed(event('kex1', 2))
    await asyncio.sleep(1)
    assert recorder.values('kex1') == [1, 2]
    await streams.close()
    assert streams.active_count == 0


async def test_deleted_objects_release_their_workers_at_once(
        settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder()
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 'x'))
    await asyncio.sleep(1)
    streams.feed(event('kex1', 'x', type='DELETED'))
    await asyncio.sleep(1)
    assert [type for _, _, type, _ in recorder.calls] == ['MODIFIED', 'DELETED']
    assert streams.active_count == 0
    assert streams.known_count == 0
    await streams.close()


async def test_deletions_are_not_batched_right_after_a_processing(
        settings: OperatorSettings, looptime: float) -> None:
    recorder, streams = await two_processed_at_once(settings)
    streams.feed(event('kex1', 'gone', type='DELETED'))  # nothing comes after it: processed at once
    streams.feed(event('kex2', 'echo'))  # batched till 1.11 unless anything else comes
    await asyncio.sleep(0.05)
    streams.feed(event('kex2', 'gone', type='DELETED'))  # ends the batching at once, at 1.06
    await asyncio.sleep(2)
    times = {(name, type): round(time, 2) for time, name, type, _ in recorder.calls}
    assert times == {('kex1', 'MODIFIED'): 0.0, ('kex2', 'MODIFIED'): 0.0,
                     ('kex1', 'DELETED'): 1.01, ('kex2', 'DELETED'): 1.06}
    assert streams.active_count == 0
    await streams.close()


async def test_deleted_objects_without_workers_are_forgotten_without_workers(
        settings: OperatorSettings, looptime: float) -> None:
    # E.g. the final events of a mass deletion: they come after the workers have left (the watch-stream
    # was held back meanwhile), and a worker for each would only forget the object.
    recorder = Recorder()
    forgetter = Forgetter()
    streams = make_streams(recorder, settings, forgetter=forgetter)
    streams.feed(event('kex1', 'x'))
    await asyncio.sleep(1)
    assert streams.active_count == 0
    tasks_before = asyncio.all_tasks()
    streams.feed(event('kex1', 'x', type='DELETED'))
    assert forgetter.names == ['kex1']  # at once, not by a worker
    assert streams.active_count == 0
    assert asyncio.all_tasks() == tasks_before
    await asyncio.sleep(1)
    assert [type for _, _, type, _ in recorder.calls] == ['MODIFIED']
    assert streams.known_count == 0
    await streams.close()


@pytest.mark.parametrize('forgetter', [
    # E.g. the event handlers or the daemons of the resource must see the deletion.
    pytest.param(Forgetter(forgets=False), id='more-than-forgetting'),
    pytest.param(Forgetter(fails=True), id='failed-forgetting'),
])
async def test_deleted_objects_not_forgotten_without_workers_go_to_the_workers(
        settings: OperatorSettings, looptime: float, forgetter: Forgetter) -> None:
    recorder = Recorder()
    streams = make_streams(recorder, settings, forgetter=forgetter)
    streams.feed(event('kex1', 'x', type='DELETED'))
    await asyncio.sleep(1)
    assert forgetter.names == ['kex1']
    assert [type for _, _, type, _ in recorder.calls] == ['DELETED']
    assert streams.active_count == 0
    await streams.close()


async def test_listed_objects_that_need_nothing_get_no_workers(
        settings: OperatorSettings, looptime: float) -> None:
    # E.g. the objects handled before the operator's restart, unchanged since then: most of them at the start.
    recorder = Recorder()
    forgetter = Forgetter()
    streams = make_streams(recorder, settings, forgetter=forgetter)
    tasks_before = asyncio.all_tasks()
    streams.feed(event('kex1', 'x', type=None))
    streams.feed(event('kex2', 'x', type=None))
    streams.feed(Bookmark.LISTED)
    assert forgetter.names == ['kex1', 'kex2']  # at once, not by a worker
    assert asyncio.all_tasks() == tasks_before
    assert streams.active_count == 0
    assert streams.known_count == 2  # known all the same: not "vanished" at the next listing's end
    await asyncio.sleep(1)
    assert recorder.calls == []

    # Their next events go to the workers as usual.
    streams.feed(event('kex1', 'y'))
    await asyncio.sleep(1)
    assert [(name, value, type) for _, name, type, value in recorder.calls] == [('kex1', 'y', 'MODIFIED')]
    await streams.close()


@pytest.mark.parametrize('forgetter', [
    pytest.param(Forgetter(forgets=False), id='more-than-nothing'),
    pytest.param(Forgetter(fails=True), id='failed-dismissal'),
])
async def test_listed_objects_that_need_something_go_to_the_workers(
        settings: OperatorSettings, looptime: float, forgetter: Forgetter) -> None:
    recorder = Recorder()
    streams = make_streams(recorder, settings, forgetter=forgetter)
    streams.feed(event('kex1', 'x', type=None))
    await asyncio.sleep(1)
    assert forgetter.names == ['kex1']
    assert [type for _, _, type, _ in recorder.calls] == [None]
    await streams.close()


async def test_changes_that_need_only_to_be_noticed_get_no_workers(
        settings: OperatorSettings, looptime: float) -> None:
    # E.g. the echoes of the timers' own patches (every tick): shown to the timers, with no worker.
    recorder = Recorder()
    forgetter = Forgetter(settles=True)
    streams = make_streams(recorder, settings, forgetter=forgetter)
    tasks_before = asyncio.all_tasks()
    streams.feed(event('kex1', 'x'))
    streams.feed(event('kex1', 'y'))
    assert forgetter.changes == ['kex1', 'kex1']  # at once, not by a worker
    assert asyncio.all_tasks() == tasks_before
    assert streams.active_count == 0
    assert streams.known_count == 1
    await asyncio.sleep(1)
    assert recorder.calls == []
    await streams.close()


@pytest.mark.parametrize('forgetter', [
    pytest.param(Forgetter(settles=False), id='more-than-noticing'),
    pytest.param(Forgetter(fails=True, settles=True), id='failed-noticing'),
])
async def test_changes_that_need_more_go_to_the_workers_and_to_them_only(
        settings: OperatorSettings, looptime: float, forgetter: Forgetter) -> None:
    recorder = Recorder(duration=1)
    streams = make_streams(recorder, settings, forgetter=forgetter)
    streams.feed(event('kex1', 'x'))
    await asyncio.sleep(0.5)  # busy with it till 1.0: the next change goes to the worker, not asked about
    streams.feed(event('kex1', 'y'))
    await asyncio.sleep(2)
    assert forgetter.changes == ['kex1']
    assert recorder.values('kex1') == ['x', 'y']
    await streams.close()


async def test_deleted_objects_with_workers_are_processed_by_them_not_forgotten(
        settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder(duration=1)
    forgetter = Forgetter()
    streams = make_streams(recorder, settings, forgetter=forgetter)
    streams.feed(event('kex1', 'x'))
    await asyncio.sleep(0.5)  # busy with it till 1.0
    streams.feed(event('kex1', 'x', type='DELETED'))
    await asyncio.sleep(2)
    assert forgetter.names == []
    assert [(round(time, 2), type) for time, _, type, _ in recorder.calls] == [(0, 'MODIFIED'),
                                                                                (1, 'DELETED')]
    assert streams.active_count == 0
    await streams.close()


async def test_finished_objects_release_their_workers_at_once(
        settings: OperatorSettings, looptime: float) -> None:
    # E.g. our finalizer is released from a deleted object: only its deletion can come, and it is forgotten.
    recorder = Recorder(finished=True)
    streams = make_streams(recorder, settings)
    tasks_before = asyncio.all_tasks()
    streams.feed(event('kex1', 'x'))
    await asyncio.sleep(0.01)  # not for the batching window (0.1)
    assert streams.active_count == 0
    assert asyncio.all_tasks() == tasks_before
    await streams.close()


async def test_finished_objects_process_what_came_meanwhile_before_leaving(
        settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder(duration=1, finished=True)
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 'first'))
    await asyncio.sleep(0.5)
    streams.feed(event('kex1', 'second'))  # e.g. someone else's change during the processing
    await asyncio.sleep(3)
    assert [(round(time, 2), value) for time, _, _, value in recorder.calls] == [(0, 'first'),
                                                                                  (1.1, 'second')]
    assert streams.active_count == 0
    await streams.close()


async def test_objects_vanished_between_listings_are_deleted(
        settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder()
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 1, type=None))
    streams.feed(event('kex2', 2, type=None))
    streams.feed(Bookmark.LISTED)
    await asyncio.sleep(10)
    assert streams.known_count == 2

    # A relisting (e.g. after 410 Gone): kex2 was deleted while the stream was not watching.
    streams.feed(event('kex1', 1, type=None))
    streams.feed(Bookmark.LISTED)
    await asyncio.sleep(1)
    assert recorder.calls[-1][1:3] == ('kex2', 'DELETED')
    assert streams.known_count == 1

    # An empty listing means that everything is gone.
    streams.feed(Bookmark.LISTED)
    await asyncio.sleep(1)
    assert recorder.calls[-1][1:3] == ('kex1', 'DELETED')
    assert streams.known_count == 0
    await streams.close()


async def test_a_partial_listing_is_void_after_an_interruption(
        settings: OperatorSettings, looptime: float) -> None:
    # The pages of a listing are handed over as they come: if it restarts midway, what its first pages have
    # named proves nothing: kex2 (only in the void pages) must be told as vanished at the new listing's end.
    recorder = Recorder()
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 1, type=None))
    streams.feed(event('kex2', 2, type=None))
    streams.feed(Bookmark.LISTED)
    await asyncio.sleep(10)
    streams.feed(event('kex1', 1, type=None))
    streams.feed(event('kex2', 2, type=None))  # the first page of a relisting, then it expires
    streams.interrupted()
    streams.feed(event('kex1', 1, type=None))  # the restarted relisting: kex2 is gone meanwhile
    streams.feed(Bookmark.LISTED)
    await asyncio.sleep(1)
    assert recorder.calls[-1][1:3] == ('kex2', 'DELETED')
    assert streams.known_count == 1
    await streams.close()


async def test_synthetic_deletion_has_the_identity_of_the_object(settings: OperatorSettings) -> None:
    received: list[RawEvent] = []

    async def processor(delivery: Delivery) -> None:
        received.append(delivery.raw_event)

    streams = ObjectStreams(processor=processor, resource=KEX, namespace='ns1', settings=settings)
    streams.feed(event('kex1', 1, type=None))
    streams.feed(Bookmark.LISTED)
    streams.feed(Bookmark.LISTED)
    await asyncio.sleep(1)
    assert received[-1] == {'type': 'DELETED', 'object': {
        'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
        'metadata': {'name': 'kex1', 'namespace': 'ns1', 'uid': 'uid-kex1'},
    }}
    await streams.close()


async def test_objects_without_uids_are_keyed_by_names(settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder(duration=1)
    streams = make_streams(recorder, settings)
    for value in range(3):
        body: Any = {'metadata': {'name': 'kex1', 'namespace': 'ns1'}, 'spec': {'value': value}}
        streams.feed({'type': 'MODIFIED', 'object': body})
    await asyncio.sleep(3)
    assert recorder.values('kex1') == [2]
    await streams.close()


async def test_unexpected_errors_are_throttled(
        settings: OperatorSettings, looptime: float, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, 'kopf.objects')
    recorder = Recorder(failures=3)
    streams = make_streams(recorder, settings)

    streams.feed(event('kex1', 'a'))  # processed at 0.0 and fails: throttled till 1.0
    await asyncio.sleep(0.5)
    streams.feed(event('kex1', 'b'))  # processed at 1.1 (after the window) and fails: throttled till 3.1
    streams.feed(event('kex1', 'c'))
    await asyncio.sleep(1.0)
    streams.feed(event('kex1', 'd'))  # processed at 3.2 and fails: throttled till 8.2
    await asyncio.sleep(2.0)
    streams.feed(event('kex1', 'e'))  # processed at 8.3 and succeeds
    await asyncio.sleep(10)

    assert [(round(time, 1), value) for time, _, _, value in recorder.calls] == [
        (0.0, 'a'), (1.1, 'c'), (3.2, 'd'), (8.3, 'e'),
    ]
    messages = [record.getMessage() for record in caplog.records if record.name == 'kopf.objects']
    assert messages == [
        "Throttling for 1 seconds due to an unexpected error: RuntimeError('boom')",
        'Throttling is over. Switching back to normal operations.',
        "Throttling for 2 seconds due to an unexpected error: RuntimeError('boom')",
        'Throttling is over. Switching back to normal operations.',
        "Throttling for 5 seconds due to an unexpected error: RuntimeError('boom')",
        'Throttling is over. Switching back to normal operations.',
    ]
    assert all(record.exc_info for record in caplog.records if 'Throttling for' in record.getMessage())

    # A success has reset the delays: the next error starts from the 1st delay again.
    recorder.failures = 1
    streams.feed(event('kex1', 'f'))
    await asyncio.sleep(10)
    assert "Throttling for 1 seconds due to an unexpected error: RuntimeError('boom')" in caplog.messages[-2]
    await streams.close()


@pytest.mark.parametrize('error', [
    CannotConnect('https://127.0.0.1:6443', ConnectionRefusedError(111, 'Connect call failed')),
    Disconnected(),
], ids=['cannot-connect', 'disconnected'])
async def test_an_unreachable_api_is_throttled_with_one_line(
        error: Exception, settings: OperatorSettings, looptime: float,
        caplog: pytest.LogCaptureFixture) -> None:
    # E.g. kube-apiserver restarting for longer than the request's retries: the client's warnings have
    # named the request & the failure of each attempt; the last failure needs no traceback of its insides.
    caplog.set_level(logging.DEBUG, 'kopf.objects')
    recorder = Recorder(failures=1, error=error)
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 'a'))  # processed at 0.0 and fails: throttled till 1.0
    await asyncio.sleep(0.5)
    streams.feed(event('kex1', 'b'))  # processed at 1.1 and succeeds
    await asyncio.sleep(5)

    assert [(round(time, 1), value) for time, _, _, value in recorder.calls] == [(0.0, 'a'), (1.1, 'b')]
    [throttled] = [record for record in caplog.records if 'Throttling for' in record.getMessage()]
    assert throttled.getMessage() == f'Throttling for 1 seconds due to an unexpected error: {error!r}'
    assert throttled.levelno == logging.ERROR
    assert not throttled.exc_info  # no traceback
    await streams.close()


async def test_an_interrupted_stream_holds_back_the_events_since_then_and_until_something_comes(
        settings: OperatorSettings, looptime: float) -> None:
    # E.g. the API server restarting: the echoes of the patches made meanwhile come with the new stream.
    deliveries: list[Delivery] = []

    async def processor(delivery: Delivery) -> None:
        deliveries.append(delivery)

    streams = ObjectStreams(processor=processor, resource=KEX, namespace='ns1', settings=settings)
    streams.feed(event('kex1', 1))
    await asyncio.sleep(1)
    assert not streams.held_back_since(0)

    streams.interrupted()  # at 1.0
    await asyncio.sleep(1)
    assert streams.held_back_since(0.5)  # interrupted since then
    assert streams.held_back_since(1.5)  # interrupted before, and nothing has come since then

    streams.feed(event('kex1', 2))  # at 2.0: the stream is re-established
    await asyncio.sleep(1)
    assert streams.held_back_since(0.5)
    assert not streams.held_back_since(1.5)
    assert [delivery.held_back_since for delivery in deliveries] == [streams.held_back_since] * 2
    await streams.close()


async def test_the_last_error_delay_repeats(settings: OperatorSettings, looptime: float) -> None:
    settings.queueing.error_delays = [1]
    recorder = Recorder(failures=100)
    streams = make_streams(recorder, settings)
    for value in range(4):
        streams.feed(event('kex1', value))
        await asyncio.sleep(0.5)
    await asyncio.sleep(10)
    assert [round(time, 1) for time, *_ in recorder.calls] == [0.0, 1.1, 2.2]
    await streams.close()


async def test_no_error_delays_means_no_throttling(settings: OperatorSettings, looptime: float) -> None:
    settings.queueing.error_delays = []
    recorder = Recorder(failures=100)
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 1))
    await asyncio.sleep(0.5)
    streams.feed(event('kex1', 2))
    await asyncio.sleep(0.5)
    assert [round(time, 1) for time, *_ in recorder.calls] == [0.0, 0.5]
    await streams.close()


async def test_closing_lets_the_busy_workers_finish_within_the_exit_timeout(
        settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder(duration=1.5)
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 1))
    streams.feed(event('kex2', 2))
    await asyncio.sleep(0.5)
    streams.feed(event('kex2', 3))  # pending: still processed while closing, with no batching window
    await streams.close(exit_timeout=5)
    assert looptime == pytest.approx(3.0)  # 1.5 (the 1st processing of kex2) + 1.5 (the 2nd one)
    assert recorder.values('kex1') == [1]
    assert recorder.values('kex2') == [2, 3]
    assert streams.active_count == 0


async def test_closing_cancels_the_workers_after_the_exit_timeout(
        settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder(duration=100)
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 1))
    await asyncio.sleep(1)
    await streams.close(exit_timeout=settings.queueing.exit_timeout)
    assert looptime == 3
    assert streams.active_count == 0
    assert recorder.active['kex1'] == 0  # its processing is cancelled, not abandoned


async def test_closing_interrupts_the_idle_workers_and_the_throttling(
        settings: OperatorSettings, looptime: float) -> None:
    recorder = Recorder(failures=1)
    streams = make_streams(recorder, settings)
    streams.feed(event('kex1', 1))  # fails and throttles for 1s
    streams.feed(event('kex2', 2))  # succeeds and idles for the batching window (0.1 s)
    await asyncio.sleep(0.05)
    await streams.close(exit_timeout=settings.queueing.exit_timeout)
    assert looptime == 0.05
    assert streams.active_count == 0


async def test_pending_events_processed_at_closing_see_the_pressure(
        settings: OperatorSettings, looptime: float) -> None:
    # On closing, the watch-stream is gone: whatever the processing waits for (e.g. the echo of its own
    # patch) will not come. The event still pending then is processed in a hurry, as the busy ones are.
    waited: list[tuple[Any, float, bool]] = []

    async def processor(delivery: Delivery) -> None:
        raw_event = delivery.raw_event
        stream_pressure = delivery.pressure
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(10):
                await stream_pressure.wait()
        except TimeoutError:
            pass
        waited.append((raw_event['object']['spec']['value'], loop.time() - started, stream_pressure.is_set()))

    streams = ObjectStreams(processor=processor, resource=KEX, namespace='ns1', settings=settings)
    streams.feed(event('kex1', 'first'))
    await asyncio.sleep(1)
    streams.feed(event('kex1', 'pending'))  # presses the first one: it ends, the pending one goes next
    await asyncio.sleep(0)
    await streams.close(exit_timeout=30)
    assert [(value, round(duration, 1), pressed) for value, duration, pressed in waited] == [
        ('first', 1.0, True), ('pending', 0.0, True),
    ]
