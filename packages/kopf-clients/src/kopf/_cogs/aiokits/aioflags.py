"""
The flags to stop an operator from outside or to know when it is ready: any of several types.

The callers of :func:`kopf.run`, :func:`kopf.operator` and :func:`kopf.spawn_tasks` choose what suits
their code: asyncio futures and events (in the operator's loop or another one), concurrent futures,
threading events. These adapters wait for any of them and raise any of them.
"""
import asyncio
import concurrent.futures
import threading
from typing import Any

__all__ = ['Flag', 'raise_flag', 'wait_flag']

Flag = asyncio.Future[Any] | asyncio.Event | concurrent.futures.Future[Any] | threading.Event

# How often a threading.Event stop-flag is checked: it has no way to notify the event loop.
THREADING_FLAG_POLLING = 0.1


async def wait_flag(flag: Flag) -> Any:
    """Wait until the flag is raised; return its value (True for events, the result for futures)."""
    if isinstance(flag, asyncio.Future):
        await asyncio.wait([flag])  # unlike awaiting it directly, this never cancels the flag itself.
        return _get_future_value(flag)
    elif isinstance(flag, asyncio.Event):
        await flag.wait()
        return True
    elif isinstance(flag, concurrent.futures.Future):
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def wake_up(_: concurrent.futures.Future[Any]) -> None:
            try:
                loop.call_soon_threadsafe(_resolve, waiter)
            except RuntimeError:
                pass  # the loop is closed: nobody waits anymore.

        flag.add_done_callback(wake_up)
        await waiter
        return _get_future_value(flag)
    elif isinstance(flag, threading.Event):
        # A threading.Event cannot notify the loop; waiting for it in a thread would hold the thread forever.
        while not flag.is_set():  # noqa: ASYNC110
            await asyncio.sleep(THREADING_FLAG_POLLING)
        return True
    else:
        raise TypeError(f'Unsupported type of a flag: {flag!r}')


def raise_flag(flag: Flag | None) -> None:
    """Raise the flag of any supported type (nothing happens if it is raised already or absent)."""
    if flag is None:
        return
    elif isinstance(flag, asyncio.Future):
        flag_loop = flag.get_loop()
        if flag_loop is asyncio.get_running_loop():
            if not flag.done():
                flag.set_result(None)
        else:
            flag_loop.call_soon_threadsafe(_resolve, flag)
    elif isinstance(flag, asyncio.Event):
        flag.set()
    elif isinstance(flag, concurrent.futures.Future):
        try:
            flag.set_result(None)
        except concurrent.futures.InvalidStateError:
            pass  # already done: by us or by someone else, it does not matter.
    elif isinstance(flag, threading.Event):
        flag.set()
    else:
        raise TypeError(f'Unsupported type of a flag: {flag!r}')


def _resolve(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)


def _get_future_value(future: asyncio.Future[Any] | concurrent.futures.Future[Any]) -> Any:
    if future.cancelled() or future.exception() is not None:
        return None
    return future.result()
