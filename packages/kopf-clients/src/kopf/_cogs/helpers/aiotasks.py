"""
Async primitives for the exits: what must be finished even when the exit is forced.
"""
import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ['finish_uninterrupted']

_T = TypeVar('_T')


async def finish_uninterrupted(awaitable: Awaitable[_T]) -> _T:
    """
    Await a (bounded) awaitable to its end, even if cancelled meanwhile; then re-raise the cancellation.

    For the farewells of an exit (e.g. releasing a lease, closing the sessions): a forced exit cancels
    the operator again and again, and the event loop is closed once the operator returns, so the work
    left running in the background (e.g. behind ``asyncio.shield()``) would be destroyed half-done.
    The awaitable must be bounded in time by itself (e.g. ``asyncio.wait_for()``): this call waits for it.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # cancelled from elsewhere: nothing to wait for anymore
                raise
            cancelled = True
    result = task.result()
    if cancelled:
        raise asyncio.CancelledError
    return result
