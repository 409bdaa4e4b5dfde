"""
The caller's seat (a unit of its capacity, e.g. the processing's seat of an object) is lent to others while
its request waits for the server: after the capacity's lending delay while in flight, at once in the retries'
backoffs; while the request waits for a slot, to a returning holder that waits for a seat, or to a newcomer
only within the capacity's reserve (ceded: see the capacity); and it is taken back before the call returns.
"""
import asyncio
from typing import Any

import kmock
import pytest

from kopf._clients import api
from kopf._clients.vault import Vault
from kopf._cogs.aiokits.capacity import Capacity, Hold
from kopf._cogs.configs.networking import StandaloneClientSettings

pytestmark = pytest.mark.looptime


async def _taken_seat(lending_delay: float, *, in_flight: bool = True) -> tuple[Capacity[object], Hold]:
    """The only seat of a capacity, taken (as the processing of an object takes its seat)."""
    capacity: Capacity[object] = Capacity(1, lending_delay=lending_delay, lending_in_flight=in_flight)
    seat = Hold(capacity)
    await seat.__aenter__()
    return capacity, seat


def _newcomer(capacity: Capacity[object], looptime: float, *,
              keep: float) -> tuple[asyncio.Task[None], list[float]]:
    """A newcomer waiting for a seat: notes when it gets one (the time since the start), keeps it a while."""
    times: list[float] = []

    async def hold() -> None:
        async with Hold(capacity):
            times.append(float(looptime))
            await asyncio.sleep(keep)

    return asyncio.create_task(hold()), times


async def test_seat_is_lent_while_a_slow_request_is_in_flight_and_taken_back_after_it(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float) -> None:
    kmock['get /api'] << (lambda: asyncio.sleep(1)) << {'ok': True}
    capacity, seat = await _taken_seat(lending_delay=0.05)
    other, times = _newcomer(capacity, looptime, keep=2)
    result = await api.request('GET', '/api', settings=settings, vault=vault, seat=seat)
    assert result == {'ok': True}
    assert times == [pytest.approx(0.05)]  # lent once in flight for the lending delay
    assert looptime == pytest.approx(2.05)  # the response came at 1 s, but the seat was back only at 2.05 s
    assert seat.taken
    assert other.done()


async def test_seat_is_kept_during_a_quick_request(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float) -> None:
    kmock['get /api'] << (lambda: asyncio.sleep(0.04)) << {'ok': True}
    capacity, seat = await _taken_seat(lending_delay=0.05)
    other, times = _newcomer(capacity, looptime, keep=1)
    await api.request('GET', '/api', settings=settings, vault=vault, seat=seat)
    assert looptime == pytest.approx(0.04)
    assert seat.taken
    assert not times  # the newcomer still waits: the seat was never lent
    seat.leave()
    await other
    assert times == [pytest.approx(0.04)]


@pytest.mark.parametrize('reserve, lending_delay, lent_at, back_at', [
    (0, 0, 1, 1.5),  # lent only once the slot was free (at 1 s, in flight), taken back when the newcomer left
    (1, 0, 0, 1),  # lent at once to a newcomer (from the capacity's reserve), free again when the slot is
    (1, 0.05, 0.05, 1),  # lent after the lending delay to a newcomer (from the reserve), as in flight
])
async def test_seat_is_lent_to_newcomers_while_the_request_waits_for_a_slot_only_from_the_reserve(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
        reserve: int, lending_delay: float, lent_at: float,
        back_at: float) -> None:
    settings.networking.max_concurrent_requests = 1
    kmock['get /slow'] << (lambda: asyncio.sleep(1)) << {'slow': True}
    kmock['get /api'] << {'ok': True}
    busy = asyncio.create_task(api.request('GET', '/slow', settings=settings, vault=vault))  # takes the slot
    await asyncio.sleep(0)
    capacity: Capacity[object] = Capacity(1, lending_delay=lending_delay, reserve=reserve)
    seat = Hold(capacity)
    await seat.__aenter__()
    other, times = _newcomer(capacity, looptime, keep=0.5)
    result = await api.request('GET', '/api', settings=settings, vault=vault, seat=seat)
    assert result == {'ok': True}
    assert await busy == {'slow': True}
    assert times == [pytest.approx(lent_at)]
    assert looptime == pytest.approx(back_at)
    assert seat.taken
    await other


@pytest.mark.parametrize('request_at, ceded_at', [
    (0.7, 0.7),  # the returning one waits for a seat already when the request starts waiting for its slot
    (0.3, None),  # the returning one comes while the request waits for its slot: not ceded to (it is late)
])
async def test_seat_is_ceded_to_a_returning_holder_while_the_request_waits_for_a_slot(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
        request_at: float, ceded_at: float | None) -> None:
    settings.networking.max_concurrent_requests = 1
    kmock['get /slow'] << (lambda: asyncio.sleep(1)) << {'slow': True}
    kmock['get /api'] << {'ok': True}
    busy = asyncio.create_task(api.request('GET', '/slow', settings=settings, vault=vault))  # takes the slot
    capacity: Capacity[object] = Capacity(1, lending_delay=0)
    times: list[float] = []

    async def returning() -> None:  # e.g. an object whose handler runs: its seat lent, back at 0.6 s
        async with Hold(capacity) as hold:
            async with hold.lending():
                await asyncio.sleep(0.6)
            times.append(float(looptime))
            await asyncio.sleep(0.2)

    other = asyncio.create_task(returning())
    await asyncio.sleep(0)
    seat = Hold(capacity)
    await seat.__aenter__()  # the seat lent by the returning one
    newcomer, newcomer_times = _newcomer(capacity, looptime, keep=0)
    await asyncio.sleep(request_at)
    result = await api.request('GET', '/api', settings=settings, vault=vault, seat=seat)
    assert result == {'ok': True}
    assert await busy == {'slow': True}
    if ceded_at is not None:
        assert times == [pytest.approx(ceded_at)]  # not at 1 s, when the slot was free and the request went
        assert newcomer_times == [pytest.approx(ceded_at + 0.2)]  # when the returning one left: not at once
        assert looptime == pytest.approx(1)  # then the seat was free to take back
    else:
        assert times == [pytest.approx(1)]  # lent in flight only (at once: the lending delay is 0)
        assert looptime == pytest.approx(1.2)  # taken back when the returning one left, before the newcomer
        assert not newcomer_times
    assert seat.taken
    await other
    seat.leave()
    await newcomer


async def test_seat_is_lent_at_once_during_the_retries_backoffs(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float) -> None:
    kmock['get /api'][:1] << 503
    kmock['get /api'][1:] << {'ok': True}
    capacity, seat = await _taken_seat(lending_delay=10)  # too long for the requests: only the backoff
    other, times = _newcomer(capacity, looptime, keep=1.5)
    result = await api.request('GET', '/api', settings=settings, vault=vault, seat=seat)
    assert result == {'ok': True}
    assert times == [pytest.approx(0)]  # lent at the failure, for the backoff of 1 s
    assert looptime == pytest.approx(1.5)  # the retry waited for the seat, taken back when the newcomer left
    assert seat.taken
    await other


async def test_seat_of_a_capacity_not_lending_in_flight_is_kept_in_flight_but_lent_in_backoffs(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float) -> None:
    # E.g. the timers' hands: they bound the calls waiting for the API, so a request in flight keeps its own.
    kmock['get /api'][:1] << (lambda: asyncio.sleep(1)) << 503
    kmock['get /api'][1:] << (lambda: asyncio.sleep(1)) << {'ok': True}
    capacity, seat = await _taken_seat(lending_delay=0.05, in_flight=False)
    other, times = _newcomer(capacity, looptime, keep=0.5)
    result = await api.request('GET', '/api', settings=settings, vault=vault, seat=seat)
    assert result == {'ok': True}
    assert times == [pytest.approx(1)]  # not in the 1st request's flight: at its failure, for the backoff
    assert looptime == pytest.approx(3)  # 1 s in flight, 1 s of backoff, 1 s in flight again
    assert seat.taken
    await other


async def test_a_lent_out_seat_is_not_taken_back_by_a_request(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float) -> None:
    # E.g. a request from inside a handler's call, whose seat is lent out already: nothing to lend, nothing
    # to take back (the handler's own lending takes it back when the handler is over).
    kmock['get /api'] << (lambda: asyncio.sleep(1)) << {'ok': True}
    capacity, seat = await _taken_seat(lending_delay=0)
    holder = Hold(capacity)
    async with seat.lending():
        await holder.__aenter__()  # the lent seat is taken by another holder
        result: Any = await api.request('GET', '/api', settings=settings, vault=vault, seat=seat)
        assert result == {'ok': True}
        assert not seat.taken and holder.taken
        assert looptime == pytest.approx(1)
        holder.leave()
    assert seat.taken


async def test_seat_of_a_capacity_not_lending_in_flight_is_kept_while_the_request_waits_for_a_slot(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float) -> None:
    # E.g. the timers' hands: they bound the calls waiting for the API, so they are kept for the slot too.
    settings.networking.max_concurrent_requests = 1
    kmock['get /slow'] << (lambda: asyncio.sleep(1)) << {'slow': True}
    kmock['get /api'] << {'ok': True}
    busy = asyncio.create_task(api.request('GET', '/slow', settings=settings, vault=vault))  # takes the slot
    await asyncio.sleep(0)
    capacity: Capacity[object] = Capacity(1, lending_delay=0, lending_in_flight=False, reserve=1)
    seat = Hold(capacity)
    await seat.__aenter__()
    other, times = _newcomer(capacity, looptime, keep=0.5)
    await api.request('GET', '/api', settings=settings, vault=vault, seat=seat)
    await busy
    assert not times
    assert looptime == pytest.approx(1)
    assert seat.taken and capacity.reserved == 0
    seat.leave()
    await other


async def test_seat_lent_from_the_reserve_is_taken_back_when_the_request_is_cancelled_in_the_slot_wait(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float) -> None:
    settings.networking.max_concurrent_requests = 1
    kmock['get /slow'] << (lambda: asyncio.sleep(10)) << {'slow': True}
    busy = asyncio.create_task(api.request('GET', '/slow', settings=settings, vault=vault))  # takes the slot
    await asyncio.sleep(0)
    capacity: Capacity[object] = Capacity(1, lending_delay=0.05, reserve=1)
    seat = Hold(capacity)
    await seat.__aenter__()
    other, times = _newcomer(capacity, looptime, keep=0.5)
    waiting = asyncio.create_task(api.request('GET', '/api', settings=settings, vault=vault, seat=seat))
    await asyncio.sleep(0.2)
    assert times == [pytest.approx(0.05)]  # lent from the reserve while waiting for the slot
    assert capacity.reserved == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert looptime == pytest.approx(0.55)  # the seat was taken back when the newcomer left it
    assert seat.taken and capacity.reserved == 0
    busy.cancel()
    await asyncio.gather(busy, other, return_exceptions=True)
