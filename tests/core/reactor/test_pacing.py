"""
The pacing of the framework's own steps: a limited number of seats, the returning holders go first.

The time is the loop's fake time (looptime), so the lending delays are seen exactly as configured.
"""
import asyncio

import pytest

from kopf._core.intents.configuration import OperatorSettings
from kopf._core.reactor.pacing import Pacer
from kopf._core.reactor.running import make_pacer

pytestmark = pytest.mark.looptime


async def test_no_seats_is_an_error() -> None:
    with pytest.raises(ValueError):
        Pacer(0)


async def test_seats_are_limited_and_handed_over_in_order() -> None:
    pacer = Pacer(2)
    order: list[str] = []

    async def occupy(name: str) -> None:
        async with pacer.seat():
            order.append(name)
            await asyncio.sleep(1)

    await asyncio.gather(*(occupy(name) for name in 'abcde'))
    assert order == list('abcde')
    assert pacer.free == 2
    assert pacer.waiting == 0


async def test_seats_are_limited_in_time(looptime: float) -> None:
    pacer = Pacer(2)
    started: list[float] = []

    async def occupy() -> None:
        async with pacer.seat():
            started.append(asyncio.get_running_loop().time())
            await asyncio.sleep(1)

    await asyncio.gather(*(occupy() for _ in range(5)))
    assert started == [0, 0, 1, 1, 2]


async def test_lending_at_once_lets_the_others_in_and_the_returning_ones_go_first(looptime: float) -> None:
    pacer = Pacer(1)
    events: list[tuple[float, str]] = []

    async def slow() -> None:
        async with pacer.seat() as seat:
            events.append((asyncio.get_running_loop().time(), 'slow-in'))
            async with seat.lending():
                await asyncio.sleep(1)  # e.g. a sleep: the seat is lent at once
            events.append((asyncio.get_running_loop().time(), 'slow-back'))
            await asyncio.sleep(1)

    async def fast(name: str) -> None:
        await asyncio.sleep(0.1)
        async with pacer.seat():
            events.append((asyncio.get_running_loop().time(), name))
            await asyncio.sleep(0.5)

    await asyncio.gather(slow(), fast('fast1'), fast('fast2'), fast('fast3'))
    # fast1 takes the lent seat at 0.1, fast2 follows it at 0.6; slow returns at 1.0 and waits for fast2
    # (till 1.1), but then goes before fast3, which has been waiting since 0.1 (the returning ones go first).
    assert [(round(time, 2), name) for time, name in events] == [
        (0, 'slow-in'), (0.1, 'fast1'), (0.6, 'fast2'), (1.1, 'slow-back'), (2.1, 'fast3'),
    ]


async def test_lending_after_a_delay_keeps_the_seat_for_the_quick_ones(looptime: float) -> None:
    pacer = Pacer(1)
    events: list[tuple[float, str]] = []

    async def holder(duration: float) -> None:
        async with pacer.seat() as seat:
            async with seat.lending(0.5):
                await asyncio.sleep(duration)
            events.append((asyncio.get_running_loop().time(), f'held-{duration}'))

    async def other() -> None:
        await asyncio.sleep(0.01)
        async with pacer.seat():
            events.append((asyncio.get_running_loop().time(), 'other'))

    await asyncio.gather(holder(0.2), other())  # quick: the seat is not lent, the other one waits
    assert events == [(0.2, 'held-0.2'), (0.2, 'other')]

    events.clear()
    start = asyncio.get_running_loop().time()
    await asyncio.gather(holder(2), other())  # slow: the seat is lent after 0.5s
    assert [(round(time - start, 2), name) for time, name in events] == [(0.5, 'other'), (2.0, 'held-2')]
    assert pacer.free == 1


async def test_delayed_lendings_of_many_seats_share_one_timer_of_the_loop(looptime: float) -> None:
    loop = asyncio.get_running_loop()
    pacer = Pacer(1000)
    lent_at: list[float] = []
    all_inside = asyncio.Event()
    inside = 0

    async def holder(index: int) -> None:
        nonlocal inside
        await asyncio.sleep(index / 1000)  # each lends its seat at its own time: 0.5 s after it is inside
        async with pacer.seat() as seat, seat.lending(0.5):
            inside += 1
            if inside == 1000:
                all_inside.set()
            await asyncio.sleep(2)
            lent_at.append(loop.time())

    timers_before = len(loop._scheduled)  # type: ignore[attr-defined]  # asyncio's own heap of timers
    tasks = [asyncio.create_task(holder(index)) for index in range(1000)]
    await all_inside.wait()
    # The holders' own sleeps are 1000 timers; the lendings' would be 1000 more, but take only one.
    assert len(loop._scheduled) <= timers_before + 1000 + 1  # type: ignore[attr-defined]
    await asyncio.sleep(0.6)
    assert pacer.free == 1000  # all lent by now, each after its 0.5 s
    await asyncio.gather(*tasks)
    assert pacer.free == 1000


async def test_lendings_with_different_delays_are_each_in_time(looptime: float) -> None:
    loop = asyncio.get_running_loop()
    pacer = Pacer(2)
    events: list[tuple[float, str]] = []

    async def holder(delay: float) -> None:
        async with pacer.seat() as seat, seat.lending(delay):
            await asyncio.sleep(3)

    async def other(name: str) -> None:
        await asyncio.sleep(0.01)
        async with pacer.seat():
            events.append((round(loop.time(), 2), name))
            await asyncio.sleep(10)

    # The second delay is shorter than the first one: its seat is lent first nevertheless.
    await asyncio.gather(holder(2), holder(0.5), other('first'), other('second'))
    assert events == [(0.5, 'first'), (2.0, 'second')]


async def test_cancelled_waiters_leave_the_queue_and_pass_the_seat_on() -> None:
    pacer = Pacer(1)
    await pacer.acquire()
    waiter = asyncio.create_task(pacer.acquire())
    await asyncio.sleep(0)
    assert pacer.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert pacer.waiting == 0
    pacer.release()
    assert pacer.free == 1

    # A seat handed over to a waiter that is cancelled right then goes further, not lost.
    await pacer.acquire()
    first = asyncio.create_task(pacer.acquire())
    second = asyncio.create_task(pacer.acquire())
    await asyncio.sleep(0)
    pacer.release()  # handed over to the first one...
    first.cancel()  # ...which leaves before taking it
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, timeout=1)  # the second one gets it instead
    pacer.release()
    assert pacer.free == 1
    assert pacer.waiting == 0


@pytest.mark.parametrize('reserve, expected', [(None, 18), (0, 0), (3, 3)])
async def test_the_reserve_lets_in_nine_objects_per_seat_or_as_set_while_the_seated_ones_wait_for_the_api(
        looptime: float, reserve: int | None, expected: int) -> None:
    pacer = Pacer(2, reserve=reserve)
    assert pacer.reserve == expected
    waiting = asyncio.Event()  # e.g. the API client's request slots, all taken
    seated = 0

    async def object_processing() -> None:
        nonlocal seated
        async with pacer.seat() as seat:
            seated += 1
            async with seat.ceding():
                await waiting.wait()

    tasks = [asyncio.create_task(object_processing()) for _ in range(30)]
    await asyncio.sleep(0.049)
    assert seated == 2  # the seats are lent only after the lending delay, as in flight
    await asyncio.sleep(1)
    gauges = {(name, tuple(labels.items())): value for name, labels, value in pacer.gauges()}
    assert seated == 2 + expected  # by default, 2 seats + 18 from the reserve, not all 30
    assert gauges[('kopf_processing_reserve_used', ())] == expected
    assert gauges[('kopf_processing_seats', (('state', 'taken'),))] == 2
    waiting.set()
    await asyncio.gather(*tasks)
    assert seated == 30
    assert pacer.reserved == 0
    assert pacer.free == 2


async def test_the_operators_pacer_takes_its_seats_and_reserve_from_the_settings() -> None:
    settings = OperatorSettings()
    pacer = make_pacer(settings)
    assert (pacer.seats, pacer.reserve) == (100, 900)  # 9 per seat by default
    settings.queueing.processing_seats = 10
    settings.queueing.processing_reserve = 0
    pacer = make_pacer(settings)
    assert (pacer.seats, pacer.reserve) == (10, 0)
    settings.queueing.processing_reserve = 25
    assert make_pacer(settings).reserve == 25
