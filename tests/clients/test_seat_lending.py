"""
The caller's seat (a unit of its capacity, e.g. the processing's seat of an object) is lent to others while
its request waits for the server: after the capacity's lending delay while in flight, at once in the retries'
backoffs; never while the request waits for a slot; and it is taken back before the call returns.
"""
import asyncio
from typing import Any

import kmock
import pytest

from kopf._clients import api, auth
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


async def test_seat_is_not_lent_while_the_request_waits_for_a_slot(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, 'MAX_CONCURRENT_REQUESTS', 1)
    kmock['get /slow'] << (lambda: asyncio.sleep(1)) << {'slow': True}
    kmock['get /api'] << {'ok': True}
    busy = asyncio.create_task(api.request('GET', '/slow', settings=settings, vault=vault))  # takes the slot
    await asyncio.sleep(0)
    capacity, seat = await _taken_seat(lending_delay=0)
    other, times = _newcomer(capacity, looptime, keep=0.5)
    result = await api.request('GET', '/api', settings=settings, vault=vault, seat=seat)
    assert result == {'ok': True}
    assert await busy == {'slow': True}
    # Lent only once the slot was free (at 1 s), then taken back when the newcomer left (at 1.5 s).
    assert times == [pytest.approx(1)]
    assert looptime == pytest.approx(1.5)
    assert seat.taken
    await other


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
