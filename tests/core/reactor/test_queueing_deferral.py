"""
The deferral of new workers while many objects wait for the pacer's seats (e.g. a big initial listing),
and the back-pressure on the watch-stream when even the deferred ones are too many.

Without the deferral, every listed object gets a worker at once, suspended deep in the processing until
a seat is free; with it, the objects beyond the backlog have only their streams until there is room.
Without the back-pressure, every event of a burst is parsed and kept in memory until its turn.
"""
import asyncio
from typing import Any

import pytest

from kopf._cogs.structs.bodies import RawEvent
from kopf._cogs.structs.references import Resource
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.reactor import pacing
from kopf._core.reactor.contexts import Delivery
from kopf._core.reactor.queueing import ObjectStreams

pytestmark = pytest.mark.looptime

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', namespaced=True)
BACKLOG = pacing.DEFAULT_SEATS


def listed(name: str) -> RawEvent:
    body = {'metadata': {'name': name, 'namespace': 'ns1', 'uid': f'uid-{name}'}, 'spec': {}}
    return {'type': None, 'object': body}  # type: ignore[typeddict-item]


def workers() -> int:
    return sum(1 for task in asyncio.all_tasks() if task.get_name().startswith('worker for'))


class SeatedProcessor:
    """A processor that takes a seat of the pacer for some time, as the real processing does."""

    def __init__(self, pacer: pacing.Pacer, duration: float = 0.1) -> None:
        self.pacer = pacer
        self.duration = duration
        self.order: list[str] = []
        self.max_workers = 0
        self.processed = asyncio.Event()
        self.expected = 0

    async def __call__(self, delivery: Delivery) -> None:
        raw_event = delivery.raw_event
        self.max_workers = max(self.max_workers, workers())
        async with self.pacer.seat():
            self.order.append(raw_event['object']['metadata']['name'])
            await asyncio.sleep(self.duration)
        if len(self.order) >= self.expected:
            self.processed.set()


def make_streams(processor: Any, settings: OperatorSettings, pacer: pacing.Pacer) -> ObjectStreams:
    return ObjectStreams(processor=processor, resource=KEX, namespace='ns1', settings=settings, pacer=pacer)


@pytest.fixture
def settings() -> OperatorSettings:
    settings = OperatorSettings()
    settings.queueing.idle_timeout = 0.5
    settings.queueing.exit_timeout = 100
    return settings


async def test_big_listing_gets_workers_by_the_backlog_not_all_at_once(settings: OperatorSettings) -> None:
    pacer = pacing.Pacer(seats=10)
    processor = SeatedProcessor(pacer)
    streams = make_streams(processor, settings, pacer)
    names = [f'obj-{i:05d}' for i in range(BACKLOG * 5)]
    for name in names:
        streams.feed(listed(name))
    assert workers() <= BACKLOG + 1
    processor.expected = len(names)
    await processor.processed.wait()
    assert processor.order == names  # every object once, in the listing's order
    assert processor.max_workers <= 2 * BACKLOG  # the seated, the waiting, and the idle ones; not 2000
    await streams.close(exit_timeout=1)


async def test_without_pacer_every_object_gets_a_worker_at_once(settings: OperatorSettings) -> None:
    pacer = pacing.Pacer(seats=10)
    processor = SeatedProcessor(pacer)
    streams = ObjectStreams(processor=processor, resource=KEX, namespace='ns1', settings=settings)
    for i in range(BACKLOG * 2):
        streams.feed(listed(f'obj-{i:05d}'))
    assert workers() == BACKLOG * 2  # the old way, kept when no pacer is known (e.g. in custom set-ups)
    await streams.close(exit_timeout=100)
    assert len(processor.order) == BACKLOG * 2


async def test_deferred_objects_get_their_latest_events(settings: OperatorSettings) -> None:
    pacer = pacing.Pacer(seats=1)
    seen: dict[str, list[object]] = {}
    last = f'obj-{BACKLOG + 49:05d}'  # surely deferred
    last_seen = asyncio.Event()

    async def processor(delivery: Delivery) -> None:
        raw_event = delivery.raw_event
        async with pacer.seat():
            name = raw_event['object']['metadata']['name']
            seen.setdefault(name, []).append(raw_event['object']['spec'].get('v'))
            await asyncio.sleep(0.01)
        if name == last:
            last_seen.set()

    streams = make_streams(processor, settings, pacer)
    for i in range(BACKLOG + 50):
        streams.feed(listed(f'obj-{i:05d}'))
    for value in [1, 2, 3]:
        event = listed(last)
        event['object']['spec']['v'] = value
        event['type'] = 'MODIFIED'  # type: ignore[typeddict-item]
        streams.feed(event)
    await last_seen.wait()
    assert seen[last] == [3]  # batched while deferred: only the latest one
    await streams.close(exit_timeout=100)


async def test_closing_starts_the_deferred_ones_to_finish_them(settings: OperatorSettings) -> None:
    pacer = pacing.Pacer(seats=100)
    processor = SeatedProcessor(pacer, duration=0)
    streams = make_streams(processor, settings, pacer)
    for i in range(BACKLOG * 3):
        streams.feed(listed(f'obj-{i:05d}'))
    await streams.close(exit_timeout=100)
    assert len(processor.order) == BACKLOG * 3
    assert workers() == 0


async def test_backlog_is_reported_until_it_is_down_by_half(settings: OperatorSettings) -> None:
    pacer = pacing.Pacer(seats=2)
    processor = SeatedProcessor(pacer, duration=1)
    processor.expected = 10
    streams = make_streams(processor, settings, pacer)
    for i in range(10):
        streams.feed(listed(f'obj-{i:05d}'))
    await asyncio.sleep(0)
    assert streams.backlog == 6  # 2 are seated, 2 are starting, 6 wait for their workers' start
    assert streams.backlogged  # at twice as many as the seats
    await streams.wait_for_room()
    assert asyncio.get_running_loop().time() == pytest.approx(3.0)  # 6 done, 2 seated, 2 waiting, 0 deferred
    assert streams.backlog < 4
    assert not streams.backlogged
    await processor.processed.wait()
    assert processor.order == [f'obj-{i:05d}' for i in range(10)]
    await streams.close(exit_timeout=1)


async def test_objects_are_not_returning_after_the_stream_was_held_back(settings: OperatorSettings) -> None:
    # Their events are late by our own doing then (e.g. the echoes of their patches), not by their nature.
    settings.queueing.idle_timeout = 100
    pacer = pacing.Pacer(seats=1)
    processor = SeatedProcessor(pacer, duration=1)
    streams = make_streams(processor, settings, pacer)
    streams.feed(listed('obj-a'))  # processed at 0-1, its worker leaves at 1.1: it can return till 101.1
    await asyncio.sleep(2)
    assert streams.active_count == 0
    for i in range(4):
        streams.feed(listed(f'obj-{i:05d}'))
    assert streams.backlogged
    await streams.wait_for_room()  # as the watcher does: held back until 4.0
    streams.feed(listed('obj-a'))  # back, but late by our own doing: processed at 6-7, leaves at 7.1
    await asyncio.sleep(8 - asyncio.get_running_loop().time())
    assert streams.active_count == 0  # a worker of its own for 100 s otherwise
    assert processor.order == ['obj-a', 'obj-00000', 'obj-00001', 'obj-00002', 'obj-00003', 'obj-a']
    await streams.close(exit_timeout=1)


async def test_no_backlog_without_the_pacer(settings: OperatorSettings) -> None:
    pacer = pacing.Pacer(seats=1)
    processor = SeatedProcessor(pacer, duration=1)
    streams = ObjectStreams(processor=processor, resource=KEX, namespace='ns1', settings=settings)
    for i in range(10):
        streams.feed(listed(f'obj-{i:05d}'))
    await asyncio.sleep(0)
    assert not streams.backlogged
    await asyncio.wait_for(streams.wait_for_room(), timeout=0.001)
    await streams.close(exit_timeout=100)


async def test_closing_ends_the_waiting_for_room(settings: OperatorSettings) -> None:
    pacer = pacing.Pacer(seats=1)
    processor = SeatedProcessor(pacer, duration=1)
    streams = make_streams(processor, settings, pacer)
    for i in range(10):
        streams.feed(listed(f'obj-{i:05d}'))
    room = asyncio.create_task(streams.wait_for_room())
    await asyncio.sleep(0.5)
    assert not room.done()
    await streams.close(exit_timeout=0.1)
    assert room.done()
    await room  # no error: the reader goes on, and sees the closing


async def test_room_is_reported_when_half_of_the_backlog_is_seated() -> None:
    pacer = pacing.Pacer(seats=1)
    await pacer.acquire()
    waiters = [asyncio.create_task(pacer.acquire()) for _ in range(10)]
    await asyncio.sleep(0)
    assert pacer.waiting == 10
    room = asyncio.create_task(pacer.wait_for_room(10))
    await asyncio.sleep(0)
    released = 0
    while not room.done():
        pacer.release()
        released += 1
        await asyncio.sleep(0)
    assert released == 5  # 10 waited; room when only 5 wait
    assert pacer.waiting == 5
    for task in waiters:
        task.cancel()
    await asyncio.wait(waiters)


async def test_room_at_once_when_below_the_backlog() -> None:
    pacer = pacing.Pacer(seats=1)
    await asyncio.wait_for(pacer.wait_for_room(1), timeout=0.001)


async def test_pressure_flag_behaves_as_an_asyncio_event() -> None:
    from kopf._core.reactor.queueing import _Pressure
    pressure = _Pressure()
    assert isinstance(pressure, asyncio.Event)
    assert not pressure.is_set()
    waiters = [asyncio.create_task(pressure.wait()) for _ in range(3)]
    cancelled = asyncio.create_task(pressure.wait())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    assert not any(waiter.done() for waiter in waiters)
    pressure.set()
    assert await asyncio.gather(*waiters) == [True, True, True]
    assert await pressure.wait() is True  # at once while set
    pressure.clear()
    assert not pressure.is_set()
    waiter = asyncio.create_task(pressure.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    pressure.set()
    assert await waiter is True
    assert 'set' in repr(pressure)
