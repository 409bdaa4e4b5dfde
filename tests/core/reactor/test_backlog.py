"""The back-pressure and the deferral of one watch-stream's objects, alone (see ``reactor/backlog.py``)."""
import asyncio
from collections.abc import Hashable

import pytest

from kopf._core.reactor import pacing
from kopf._core.reactor.backlog import Backlog

pytestmark = pytest.mark.looptime


class Seated:
    """Objects that take the pacer's seats and hold them until told to leave."""

    def __init__(self, pacer: pacing.Pacer) -> None:
        self.pacer = pacer
        self.leave = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def add(self, count: int) -> None:
        for _ in range(count):
            self.tasks.append(asyncio.create_task(self._sit()))

    async def _sit(self) -> None:
        async with self.pacer.seat():
            await self.leave.wait()

    async def close(self) -> None:
        self.leave.set()
        await asyncio.gather(*self.tasks)


async def test_without_a_pacer_nothing_is_deferred_or_held_back() -> None:
    backlog = Backlog(pacer=None, start=lambda key: True)
    assert not backlog.crowded
    assert not backlog.backlogged
    assert backlog.backlog == 0
    await asyncio.wait_for(backlog.wait_for_room(), timeout=0.001)
    assert not backlog.was_held_back_since(asyncio.get_running_loop().time())


async def test_crowded_when_as_many_wait_for_seats_as_the_limit() -> None:
    pacer = pacing.Pacer(seats=2)
    seated = Seated(pacer)
    backlog = Backlog(pacer=pacer, start=lambda key: True)
    seated.add(3)
    await asyncio.sleep(0)
    assert pacer.waiting == 1 and not backlog.crowded
    backlog.worker_created()  # a worker that will wait for a seat counts before it runs
    assert backlog.crowded
    backlog.worker_running()
    assert not backlog.crowded
    await seated.close()


async def test_deferred_workers_start_in_their_order_as_seats_free_up() -> None:
    pacer = pacing.Pacer(seats=1)
    seated = Seated(pacer)
    started: list[Hashable] = []
    backlog = Backlog(pacer=pacer, start=lambda key: started.append(key) or True)
    seated.add(2)  # one seated, one waiting: as many as the limit
    await asyncio.sleep(0)
    assert backlog.crowded
    for key in ['a', 'b', 'c']:
        backlog.defer(key)
    assert backlog.crowded  # while any are deferred, the new ones are deferred too: the order is kept
    assert backlog.backlog == 1 + 3
    await asyncio.sleep(1)
    assert started == []  # no room yet
    await seated.close()
    await asyncio.sleep(0.1)
    assert started == ['a', 'b', 'c']
    assert not backlog.crowded


async def test_objects_that_need_no_worker_anymore_do_not_take_the_room() -> None:
    started: list[Hashable] = []
    backlog = Backlog(pacer=pacing.Pacer(seats=2),
                      start=lambda key: key != 'gone' and not started.append(key))
    backlog.defer('gone')
    backlog.defer('x')
    await asyncio.sleep(0.1)
    assert started == ['x']


async def test_held_back_while_backlogged_and_remembered_since() -> None:
    pacer = pacing.Pacer(seats=1)
    seated = Seated(pacer)
    backlog = Backlog(pacer=pacer, start=lambda key: True)
    seated.add(3)  # one seated, two waiting: twice the limit
    await asyncio.sleep(0)
    assert backlog.backlogged
    loop = asyncio.get_running_loop()
    before = loop.time()
    reader = asyncio.create_task(backlog.wait_for_room())
    await asyncio.sleep(5)
    assert not reader.done()
    assert backlog.was_held_back_since(loop.time())  # now
    await seated.close()
    await reader
    assert loop.time() - before == pytest.approx(5, abs=0.01)
    assert backlog.was_held_back_since(before)
    await asyncio.sleep(1)
    assert not backlog.was_held_back_since(loop.time())


async def test_closing_releases_the_reader_and_starts_all_the_deferred() -> None:
    pacer = pacing.Pacer(seats=1)
    seated = Seated(pacer)
    started: list[Hashable] = []
    backlog = Backlog(pacer=pacer, start=lambda key: not started.append(key))
    seated.add(2)
    await asyncio.sleep(0)
    backlog.defer('a')
    backlog.defer('b')
    assert backlog.backlogged
    reader = asyncio.create_task(backlog.wait_for_room())
    await asyncio.sleep(1)
    backlog.close()
    await asyncio.wait_for(reader, timeout=0.001)
    assert started == ['a', 'b']
    await asyncio.wait_for(backlog.wait_for_room(), timeout=0.001)  # closed: never held back again
    await seated.close()
