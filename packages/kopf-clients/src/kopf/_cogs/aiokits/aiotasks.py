"""
Async primitives for the tasks' ends: stopping tasks, and what must be finished even when the exit is forced.
"""
import asyncio
import logging
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

__all__ = ['describe_task', 'finish_uninterrupted', 'stop_tasks']

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


async def stop_tasks(
        tasks: Iterable[asyncio.Task[Any]],
        *,
        title: str | None,
        logger: logging.Logger,
        grace: float | None = None,
) -> None:
    """Cancel the tasks (after a grace period, if given) and wait until they are done; log it all."""
    pending = [task for task in tasks if not task.done()]
    if not pending:
        if title is not None:
            logger.debug(f'{title} stopping is skipped: no tasks given.')
        return
    if grace:
        _, still_pending = await asyncio.wait(pending, timeout=grace)
    else:
        still_pending = set(pending)
    for task in still_pending:
        task.cancel()
    # The cancelled tasks can take long to exit (e.g. the cleanup); only the hung ones are not waited long.
    _, unstoppable = await asyncio.wait(pending, timeout=grace if grace else None)
    for task in pending:
        if task.cancelled():
            logger.debug(f'{describe_task(task)} is cancelled.')
    for task in unstoppable:
        logger.warning(f'{describe_task(task)} has not exited after the cancellation; leaving it as is.')
    if title is not None:
        logger.debug(f'{title} are stopped.')


def describe_task(task: asyncio.Task[Any]) -> str:
    """The task's name for the logs, capitalised: "Daemon 'x' of ns/name"."""
    name = task.get_name()
    return name[:1].upper() + name[1:]
