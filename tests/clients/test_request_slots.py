"""The per-credential slots of the regular requests: no waiting while free; first come, first served."""
import asyncio

import pytest

from kopf._clients.auth import RequestSlots


async def test_free_slots_are_taken_without_waiting() -> None:
    slots = RequestSlots(2)
    assert slots.take_nowait()
    assert slots.take_nowait()
    assert not slots.take_nowait()
    assert (slots.free, slots.taken, slots.waiting) == (0, 2, 0)
    slots.give()
    assert (slots.free, slots.taken) == (1, 1)


async def test_waiters_get_the_released_slots_in_their_order() -> None:
    slots = RequestSlots(1)
    await slots.take()
    order: list[str] = []

    async def waiter(name: str) -> None:
        await slots.take()
        order.append(name)

    tasks = [asyncio.create_task(waiter(name)) for name in ['first', 'second']]
    await asyncio.sleep(0)  # both are in line now
    assert (slots.taken, slots.waiting) == (1, 2)
    assert not slots.take_nowait()  # a newcomer does not jump the line, even if a slot is freed meanwhile

    slots.give()
    await asyncio.wait_for(tasks[0], timeout=1)
    assert order == ['first'] and not tasks[1].done()
    slots.give()
    await asyncio.wait_for(tasks[1], timeout=1)
    assert order == ['first', 'second']
    assert (slots.free, slots.taken, slots.waiting) == (0, 1, 0)


async def test_a_cancelled_waiter_leaves_the_line() -> None:
    slots = RequestSlots(1)
    await slots.take()
    task = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    slots.give()
    assert slots.free == 1  # not given to the gone waiter


async def test_a_slot_handed_to_a_cancelled_waiter_goes_to_the_next_one() -> None:
    slots = RequestSlots(1)
    await slots.take()
    leaving = asyncio.create_task(slots.take())
    staying = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    slots.give()  # handed to the first waiter ...
    leaving.cancel()  # ... which is cancelled before it wakes up
    with pytest.raises(asyncio.CancelledError):
        await leaving
    await asyncio.wait_for(staying, timeout=1)
    assert slots.free == 0


async def test_a_waiter_cancelled_right_before_a_release_is_skipped_by_it() -> None:
    # The release finds the cancelled waiter first and drops it; its task then wakes up and leaves.
    slots = RequestSlots(1)
    await slots.take()
    leaving = asyncio.create_task(slots.take())
    staying = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    leaving.cancel()
    slots.give()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    await asyncio.wait_for(staying, timeout=1)
    assert slots.free == 0
    slots.give()
    assert slots.free == 1
