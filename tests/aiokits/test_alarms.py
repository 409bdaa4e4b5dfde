"""
The alarms: many keys due at their deadlines by one timer of the loop (the loop's fake time: looptime).
"""
import asyncio
import tracemalloc

import pytest

from kopf._cogs.aiokits.alarms import Alarms

pytestmark = pytest.mark.looptime


def scheduled_timers() -> int:
    loop = asyncio.get_running_loop()
    return sum(1 for handle in loop._scheduled if not handle.cancelled())  # type: ignore[attr-defined]


async def test_each_callback_is_called_once_at_its_own_deadline(looptime: float) -> None:
    loop = asyncio.get_running_loop()
    calls: list[tuple[str, float]] = []
    alarms: Alarms[str] = Alarms(lambda key: calls.append((key, loop.time())))
    for key, deadline in [('a', 1.0), ('b', 1.5), ('c', 1.5), ('d', 3.0)]:
        assert alarms.add(key, deadline)
    await asyncio.sleep(10)
    assert calls == [('a', 1.0), ('b', 1.5), ('c', 1.5), ('d', 3.0)]
    assert len(alarms) == 0
    assert scheduled_timers() == 0


async def test_many_deadlines_take_one_timer_of_the_loop(looptime: float) -> None:
    calls: list[int] = []
    alarms: Alarms[int] = Alarms(calls.append)
    timers_before = scheduled_timers()
    for index in range(1000):
        assert alarms.add(index, 1.0 + index / 1000)
    assert scheduled_timers() == timers_before + 1
    await asyncio.sleep(1.25)
    assert calls == list(range(len(calls)))  # in the order of the deadlines
    assert 250 <= len(calls) <= 252  # those due by 1.25 (with the slack of the loop's clock)
    assert scheduled_timers() == timers_before + 1
    await asyncio.sleep(10)
    assert calls == list(range(1000))


async def test_discarded_ones_are_not_called_and_the_next_ones_are_in_time(looptime: float) -> None:
    loop = asyncio.get_running_loop()
    calls: list[tuple[str, float]] = []
    alarms: Alarms[str] = Alarms(lambda key: calls.append((key, loop.time())))
    alarms.add('a', 1.0)
    alarms.add('b', 2.0)
    alarms.add('c', 3.0)
    alarms.discard('a')
    alarms.discard('c')
    alarms.discard('z')  # unknown: nothing happens
    await asyncio.sleep(10)
    assert calls == [('b', 2.0)]


async def test_an_earlier_deadline_is_refused_while_later_ones_are_due(looptime: float) -> None:
    loop = asyncio.get_running_loop()
    calls: list[tuple[str, float]] = []
    alarms: Alarms[str] = Alarms(lambda key: calls.append((key, loop.time())))
    assert alarms.add('late', 5.0)
    assert not alarms.add('early', 1.0)
    assert alarms.add('same', 5.0)
    await asyncio.sleep(10)
    assert calls == [('late', 5.0), ('same', 5.0)]


async def test_an_earlier_deadline_is_accepted_when_the_later_ones_are_gone(looptime: float) -> None:
    # The timer is still armed for the discarded one at 5.0; the new one at 1.0 must not wait for it.
    loop = asyncio.get_running_loop()
    calls: list[tuple[str, float]] = []
    alarms: Alarms[str] = Alarms(lambda key: calls.append((key, loop.time())))
    alarms.add('late', 5.0)
    alarms.discard('late')
    assert alarms.add('early', 1.0)
    await asyncio.sleep(10)
    assert calls == [('early', 1.0)]
    assert scheduled_timers() == 0


async def test_cancelling_forgets_all_and_stops_the_timer(looptime: float) -> None:
    calls: list[str] = []
    alarms: Alarms[str] = Alarms(calls.append)
    timers_before = scheduled_timers()
    alarms.add('a', 1.0)
    alarms.add('b', 2.0)
    alarms.cancel()
    assert len(alarms) == 0
    assert scheduled_timers() == timers_before
    await asyncio.sleep(10)
    assert calls == []
    assert alarms.add('c', 11.0)  # usable again, with any deadline
    await asyncio.sleep(10)
    assert calls == ['c']


async def test_a_failing_callback_does_not_stop_the_others(looptime: float) -> None:
    loop = asyncio.get_running_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _, context: reported.append(context['exception']))
    calls: list[str] = []

    def on_due(key: str) -> None:
        if key == 'a':
            raise ValueError('boom')
        calls.append(key)

    alarms: Alarms[str] = Alarms(on_due)
    alarms.add('a', 1.0)
    alarms.add('b', 1.0)
    alarms.add('c', 2.0)
    try:
        await asyncio.sleep(10)
    finally:
        loop.set_exception_handler(None)
    assert calls == ['b', 'c']
    assert [str(exc) for exc in reported] == ['boom']


async def test_the_memory_of_a_burst_is_released_once_all_are_due(looptime: float) -> None:
    # E.g. the idle workers of 10,000 objects after a burst: a dict keeps its size after its entries are
    # deleted: tens of bytes per entry of the largest burst seen, for the operator's lifetime.
    tracemalloc.start()
    try:
        alarms: Alarms[int] = Alarms(lambda key: None)
        before, _ = tracemalloc.get_traced_memory()
        for index in range(10_000):
            alarms.add(index, 1.0)
        during, _ = tracemalloc.get_traced_memory()
        await asyncio.sleep(2)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(alarms) == 0
    assert during - before > 500_000  # the burst's memory is seen at all
    assert after - before < 10_000
