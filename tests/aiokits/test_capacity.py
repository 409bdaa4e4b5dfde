"""
The bounded capacity: units taken, handed over in order, lent to others after a delay, taken back.

The time is the loop's fake time (looptime), so the lending delays are seen exactly as configured.
"""
import asyncio

import pytest

from kopf._cogs.aiokits.capacity import OWN_LENDING_DELAY, Capacity, Hold

pytestmark = pytest.mark.looptime


def scheduled_timers() -> int:
    loop = asyncio.get_running_loop()
    return sum(1 for handle in loop._scheduled if not handle.cancelled())  # type: ignore[attr-defined]


@pytest.mark.parametrize('limit', [0, -1])
async def test_no_units_is_an_error(limit: int) -> None:
    with pytest.raises(ValueError, match=r'at least one unit, got -?\d'):
        Capacity(limit)


@pytest.mark.parametrize('delay', [-0.1, float('nan')])
async def test_a_negative_lending_delay_is_an_error(delay: float) -> None:
    with pytest.raises(ValueError, match=r'lending delay must be 0 seconds or more'):
        Capacity(1, lending_delay=delay)


async def test_units_are_limited_in_time_and_handed_over_in_order(looptime: float) -> None:
    capacity = Capacity(2)
    started: list[tuple[float, str]] = []

    async def occupy(name: str) -> None:
        async with capacity.hold():
            started.append((asyncio.get_running_loop().time(), name))
            await asyncio.sleep(1)

    await asyncio.gather(*(occupy(name) for name in 'abcde'))
    assert started == [(0, 'a'), (0, 'b'), (1, 'c'), (1, 'd'), (2, 'e')]
    assert capacity.free == 2
    assert capacity.waiting == 0


async def test_urgent_acquirers_go_before_the_others() -> None:
    capacity = Capacity(1)
    await capacity.acquire()
    order: list[str] = []

    async def acquire(name: str, urgent: bool) -> None:
        await capacity.acquire(urgent=urgent)
        order.append(name)
        capacity.release()

    tasks = [asyncio.create_task(acquire('normal', False)), asyncio.create_task(acquire('urgent', True))]
    await asyncio.sleep(0)
    assert capacity.waiting == 2
    capacity.release()
    await asyncio.gather(*tasks)
    assert order == ['urgent', 'normal']
    assert capacity.free == 1


async def test_trying_takes_only_a_free_unit_that_nobody_waits_for() -> None:
    capacity = Capacity(1)
    assert capacity.try_acquire()
    assert not capacity.try_acquire()  # none free
    waiter = asyncio.create_task(capacity.acquire())
    await asyncio.sleep(0)
    capacity.release()  # handed over to the waiter directly, not freed
    assert not capacity.try_acquire()
    await waiter
    capacity.release()
    assert capacity.try_acquire()


async def test_queued_items_get_the_released_units_in_a_batch_at_the_next_turn() -> None:
    granted: list[str] = []

    def grant(name: str) -> bool:
        granted.append(name)
        return name != 'stale'  # e.g. not needed anymore: the unit goes on

    capacity: Capacity[str] = Capacity(2, on_granted=grant)
    assert capacity.take_or_queue('first') and capacity.take_or_queue('second')  # taken at once
    for name in ['a', 'stale', 'b', 'c']:
        assert not capacity.take_or_queue(name)
    assert capacity.waiting == 4
    assert not capacity.try_acquire()  # the queued ones go first

    capacity.release()
    capacity.release()
    assert granted == []  # not at once
    await asyncio.sleep(0)
    assert granted == ['a', 'stale', 'b']
    assert capacity.free == 0
    assert capacity.waiting == 1


async def test_queueing_needs_a_callback_for_the_granted_items() -> None:
    capacity: Capacity[str] = Capacity(1)
    assert capacity.take_or_queue('first')  # taken at once: no callback needed
    with pytest.raises(TypeError, match=r'cannot queue: it was made with no on_granted callback'):
        capacity.take_or_queue('second')


async def test_units_taken_back_at_once_go_before_the_queued_items() -> None:
    granted: list[str] = []
    capacity: Capacity[str] = Capacity(1, lending_delay=0,
                                       on_granted=lambda item: granted.append(item) is None)
    assert capacity.try_acquire()
    hold = Hold(capacity, taken=True)  # with the unit acquired
    assert not capacity.take_or_queue('queued')
    hold.lend_later()  # lent out at once (no delay): the unit is released...
    assert not hold.taken
    hold.take_back()  # ...and taken back in the same turn of the loop, before the grant's turn
    assert hold.taken
    await asyncio.sleep(0)
    assert granted == []
    hold.leave()
    await asyncio.sleep(0)
    assert granted == ['queued']


async def test_lending_at_once_lets_the_others_in_and_the_returning_ones_go_first(looptime: float) -> None:
    capacity = Capacity(1)
    events: list[tuple[float, str]] = []

    async def slow() -> None:
        async with capacity.hold() as hold:
            events.append((asyncio.get_running_loop().time(), 'slow-in'))
            async with hold.lending():
                await asyncio.sleep(1)
            events.append((asyncio.get_running_loop().time(), 'slow-back'))
            await asyncio.sleep(1)

    async def fast(name: str) -> None:
        await asyncio.sleep(0.1)
        async with capacity.hold():
            events.append((asyncio.get_running_loop().time(), name))
            await asyncio.sleep(0.5)

    await asyncio.gather(slow(), fast('fast1'), fast('fast2'), fast('fast3'))
    assert [(round(time, 2), name) for time, name in events] == [
        (0, 'slow-in'), (0.1, 'fast1'), (0.6, 'fast2'), (1.1, 'slow-back'), (2.1, 'fast3'),
    ]


@pytest.mark.parametrize('configured, delay, lent_at', [
    (0.05, 0.5, 0.5),  # an explicit delay: as given
    (0.05, OWN_LENDING_DELAY, 0.05),  # the capacity's own delay
    (0.3, OWN_LENDING_DELAY, 0.3),  # the capacity's own delay, not the constant's value
    (0, OWN_LENDING_DELAY, 0.0),  # lent at once
])
async def test_lending_after_a_delay_keeps_the_unit_for_the_quick_ones(
        looptime: float, configured: float, delay: float, lent_at: float) -> None:
    capacity = Capacity(1, lending_delay=configured)
    events: list[tuple[float, str]] = []

    async def holder(duration: float) -> None:
        async with capacity.hold() as hold:
            async with hold.lending(delay):
                await asyncio.sleep(duration)
            events.append((round(asyncio.get_running_loop().time() - start, 2), 'held'))

    async def other() -> None:
        async with capacity.hold():
            events.append((round(asyncio.get_running_loop().time() - start, 2), 'other'))

    start = asyncio.get_running_loop().time()
    await asyncio.gather(holder(2), other())  # slow: the unit is lent after the delay
    assert events == [(lent_at, 'other'), (2.0, 'held')]

    if lent_at > 0:
        events.clear()
        start = asyncio.get_running_loop().time()
        await asyncio.gather(holder(lent_at * 0.8), other())  # quick: not lent, the other one waits
        assert [name for _, name in events] == ['held', 'other']
        assert [time for time, _ in events] == [pytest.approx(lent_at * 0.8, abs=0.01)] * 2
    assert capacity.free == 1


async def test_delayed_lendings_of_many_holders_share_one_timer_of_the_loop(looptime: float) -> None:
    capacity = Capacity(1000, lending_delay=0.5)
    holds = [capacity.hold() for _ in range(1000)]
    timers_before = scheduled_timers()
    for index, hold in enumerate(holds):
        await hold.__aenter__()
        hold.lend_later()
        if index % 100 == 99:
            await asyncio.sleep(0.01)  # each is lent at its own time, 0.5 s after its start
    assert scheduled_timers() == timers_before + 1
    assert capacity.free == 0
    await asyncio.sleep(0.45)
    assert 0 < capacity.free < 1000  # the earliest ones are lent out, the latest ones not yet
    await asyncio.sleep(0.1)
    assert capacity.free == 1000
    assert not any(hold.taken for hold in holds)  # all lent out
    for hold in holds:
        hold.take_back()
    assert capacity.free == 0


async def test_lendings_with_different_delays_are_each_in_time(looptime: float) -> None:
    loop = asyncio.get_running_loop()
    capacity = Capacity(2)
    events: list[tuple[float, str]] = []

    async def holder(delay: float) -> None:
        async with capacity.hold() as hold, hold.lending(delay):
            await asyncio.sleep(3)

    async def other(name: str) -> None:
        await asyncio.sleep(0.01)
        async with capacity.hold():
            events.append((round(loop.time(), 2), name))
            await asyncio.sleep(10)

    await asyncio.gather(holder(2), holder(0.5), other('first'), other('second'))
    assert events == [(0.5, 'first'), (2.0, 'second')]


async def test_taking_back_at_once_goes_beyond_the_limit_and_never_waits(looptime: float) -> None:
    capacity = Capacity(1, lending_delay=1)
    assert capacity.try_acquire()
    hold = Hold(capacity, taken=True)
    hold.lend_later()
    await asyncio.sleep(0.9)
    assert hold.taken  # not yet
    await asyncio.sleep(0.1)
    assert not hold.taken  # lent out after the capacity's delay
    other = capacity.hold()
    await other.__aenter__()  # the lent unit is taken by another holder
    hold.take_back()
    assert hold.taken
    assert capacity.free == -1  # one beyond the limit, until it is left
    hold.leave()
    other.leave()
    assert capacity.free == 1


async def test_a_quick_holder_takes_nothing_back(looptime: float) -> None:
    capacity = Capacity(1, lending_delay=1)
    hold = capacity.hold()
    await hold.__aenter__()
    hold.lend_later()
    await asyncio.sleep(0.5)
    hold.take_back()  # not lent out yet: nothing to take back
    await asyncio.sleep(1)
    assert hold.taken  # the lending is cancelled
    assert capacity.free == 0
    hold.leave()
    assert capacity.free == 1


async def test_a_lending_of_a_unit_not_taken_does_nothing(looptime: float) -> None:
    capacity = Capacity(1)
    hold = capacity.hold()  # not taken
    async with hold.lending(0.5):
        await asyncio.sleep(1)
    hold.lend_later()
    await asyncio.sleep(1)
    assert capacity.free == 1


async def test_closing_forgets_the_queued_items_and_the_lendings(looptime: float) -> None:
    granted: list[str] = []
    capacity: Capacity[str] = Capacity(1, lending_delay=0.5,
                                       on_granted=lambda item: granted.append(item) is None)
    assert capacity.try_acquire()
    hold = Hold(capacity, taken=True)
    hold.lend_later()
    assert not capacity.take_or_queue('queued')
    capacity.close()
    await asyncio.sleep(1)
    assert hold.taken  # not lent out
    assert capacity.waiting == 0
    hold.leave()
    await asyncio.sleep(0)
    assert granted == []
    assert capacity.free == 1


async def test_cancelled_waiters_leave_the_queue_and_pass_the_unit_on() -> None:
    capacity = Capacity(1)
    await capacity.acquire()
    first = asyncio.create_task(capacity.acquire())
    second = asyncio.create_task(capacity.acquire())
    await asyncio.sleep(0)
    assert capacity.waiting == 2
    capacity.release()  # handed over to the first one...
    first.cancel()  # ...which leaves before taking it
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, timeout=1)  # the second one gets it instead
    capacity.release()
    assert capacity.free == 1
    assert capacity.waiting == 0


async def test_newcomers_wait_for_room_until_half_of_the_backlog_is_served() -> None:
    capacity = Capacity(1)
    await capacity.acquire()
    waiters = [asyncio.create_task(capacity.acquire()) for _ in range(4)]
    await asyncio.sleep(0)
    await asyncio.wait_for(capacity.wait_for_room(5), timeout=1)  # 4 < 5: at once
    room = asyncio.create_task(capacity.wait_for_room(4))  # 4 >= 4: until only 2 wait
    await asyncio.sleep(0)
    capacity.release()
    await asyncio.sleep(0)
    assert not room.done()  # 3 wait
    capacity.release()
    await asyncio.sleep(0)
    assert room.done()  # 2 wait
    for _ in range(3):
        capacity.release()
    await asyncio.gather(*waiters)


async def test_ceding_hands_the_unit_to_a_returning_holder_never_to_a_newcomer(looptime: float) -> None:
    capacity = Capacity(1)
    events: list[tuple[float, str]] = []
    waiting = asyncio.Event()  # e.g. a request slot, which the ceding holder waits for

    async def returning() -> None:  # lent its unit (e.g. to its handler), is back before the ceding one waits
        async with capacity.hold() as hold:
            async with hold.lending():
                await asyncio.sleep(1)
            events.append((asyncio.get_running_loop().time(), 'returned'))
            await asyncio.sleep(1)

    async def ceding() -> None:
        await asyncio.sleep(0.5)
        async with capacity.hold() as hold:  # the unit lent by the returning holder
            events.append((asyncio.get_running_loop().time(), 'ceding-in'))
            await asyncio.sleep(1)  # the returning holder is back at 1 s and waits for the unit
            async with hold.ceding():
                assert not hold.taken
                await waiting.wait()
            assert hold.taken
            events.append((asyncio.get_running_loop().time(), 'ceding-back'))

    async def newcomer() -> None:
        await asyncio.sleep(0.7)
        async with capacity.hold():
            events.append((asyncio.get_running_loop().time(), 'newcomer'))
            await asyncio.sleep(1)

    async def wake() -> None:
        await asyncio.sleep(5)
        waiting.set()

    await asyncio.gather(returning(), ceding(), newcomer(), wake())
    # The ceded unit goes to the returning one at 1.5 s (not when the ceding one's wait is over at 5 s), not
    # to the newcomer waiting since 0.7 s: the newcomer gets it only when the returning one leaves it.
    assert [(round(time, 2), name) for time, name in events] == [
        (0.5, 'ceding-in'), (1.5, 'returned'), (2.5, 'newcomer'), (5, 'ceding-back'),
    ]


async def test_ceding_with_nobody_returning_keeps_the_unit(looptime: float) -> None:
    capacity = Capacity(1)
    async with capacity.hold() as hold:
        newcomer = asyncio.create_task(capacity.acquire())
        await asyncio.sleep(0)
        async with hold.ceding():
            assert hold.taken  # the newcomer waits: it does not get a ceded unit
            await asyncio.sleep(1)
        assert hold.taken
        assert not newcomer.done()
    await newcomer
    assert looptime == pytest.approx(1)


async def test_ceding_of_a_unit_not_taken_does_nothing(looptime: float) -> None:
    capacity = Capacity(1)
    hold = capacity.hold()
    async with hold.ceding():
        assert not hold.taken
    assert not hold.taken
    assert capacity.free == 1



async def test_ceding_lends_to_newcomers_within_the_reserve_after_the_lending_delay(looptime: float) -> None:
    capacity = Capacity(2, reserve=1)
    entered: list[tuple[float, str]] = []
    waiting = asyncio.Event()  # e.g. a request slot, which the ceding holders wait for

    async def ceding(name: str) -> None:
        async with capacity.hold() as hold:
            async with hold.ceding():
                entered.append((asyncio.get_running_loop().time(), name))
                await waiting.wait()
            assert hold.taken

    async def newcomer(name: str) -> None:
        async with capacity.hold():
            entered.append((asyncio.get_running_loop().time(), name))
            await asyncio.sleep(1)

    async def wake() -> None:
        await asyncio.sleep(5)
        waiting.set()

    tasks = [asyncio.create_task(ceding('ceding1')), asyncio.create_task(ceding('ceding2'))]
    await asyncio.sleep(0.1)
    await asyncio.gather(*tasks, newcomer('newcomer1'), newcomer('newcomer2'), wake())
    # The first one's unit is lent out (the reserve is 1), the second one keeps its own: the newcomers get in
    # one at a time, on the lent unit; the ceding one takes it back when its own wait is over.
    assert [(round(time, 2), name) for time, name in entered] == [
        (0, 'ceding1'), (0, 'ceding2'), (0.1, 'newcomer1'), (1.1, 'newcomer2'),
    ]
    assert looptime == pytest.approx(5.1)  # the wait was over at 5.1 s
    assert capacity.free == 2


async def test_ceding_to_a_returning_holder_takes_nothing_from_the_reserve(looptime: float) -> None:
    capacity = Capacity(1, reserve=1)

    async def returning() -> None:
        async with capacity.hold() as hold:
            async with hold.lending():
                await asyncio.sleep(1)
            await asyncio.sleep(1)

    lender = asyncio.create_task(returning())
    await asyncio.sleep(0)
    async with capacity.hold() as hold:
        await asyncio.sleep(1.5)  # the returning one waits since 1 s
        async with hold.ceding():
            assert not hold.taken
            await asyncio.sleep(1)
        assert hold.taken
    await lender
    assert looptime == pytest.approx(2.5)  # the returning one left at 2.5 s: taken back then


@pytest.mark.parametrize('reserve', [-1])
async def test_a_negative_reserve_is_an_error(reserve: int) -> None:
    with pytest.raises(ValueError, match=r'A reserve must be 0 units or more, got -1\.'):
        Capacity(1, reserve=reserve)


async def test_a_ceding_cancelled_while_lent_gives_the_reserve_back_and_takes_the_unit_back(
        looptime: float) -> None:
    capacity = Capacity(1, reserve=1, lending_delay=0.05)
    hold = capacity.hold()
    await hold.__aenter__()

    async def ceding() -> None:
        async with hold.ceding():
            await asyncio.sleep(10)  # e.g. waiting for a request slot, then cancelled (the operator exits)

    async def newcomer() -> None:
        async with capacity.hold():
            await asyncio.sleep(1)

    task = asyncio.create_task(ceding())
    other = asyncio.create_task(newcomer())
    await asyncio.sleep(0.5)
    assert capacity.reserved == 1 and not hold.taken  # lent to the newcomer at 0.05 s
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert capacity.reserved == 0
    assert hold.taken  # taken back when the newcomer left, before the cancellation went further
    assert looptime == pytest.approx(1.05)
    await other
    hold.leave()
    assert capacity.free == 1
