"""
Calling the operator developers' functions: handlers, filters, lifecycles --- sync or async alike.

Async functions (coroutine functions, incl. partials of them and objects with an async ``__call__``)
are awaited in the operator's event loop. Sync functions are called in a thread pool
(``settings.execution.executor``) so that they do not block the event loop; they run in a copy
of the caller's context, so that the context variables set around a handler (the current object
for ``kopf.adopt()``, the current handler for ``kopf.subhandler()``, the events' poster for
``kopf.info()``, etc.) are visible in the threads too. The mutable objects in those variables
(e.g. the sub-handlers' registry) are shared, so what a sync handler registers there is seen by the framework.

All the kwargs are passed to the functions as they are, never filtered by the functions' signatures:
the functions must accept ``**kwargs`` (e.g. ``**_``) for forward compatibility, as documented,
so that new kwargs of the framework never break the existing operators. A function without it
fails with a ``TypeError`` on an unexpected kwarg, which is then treated like any other error of it.

Cancellation propagates: an awaited coroutine is cancelled; for a sync function, the waiting is
cancelled immediately, but the thread cannot be interrupted and runs to its end in the background
(its result is then discarded).
"""
import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ['invoke', 'is_async_fn']


def is_async_fn(fn: Callable[..., Any]) -> bool:
    """Whether calling the function returns an awaitable to be awaited (rather than a ready result)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    # Callable objects: their async-ness is defined by their __call__ method (not for plain functions).
    if not inspect.isroutine(fn) and not inspect.isclass(fn):
        return inspect.iscoroutinefunction(type(fn).__call__)
    return False


async def invoke(
        fn: Callable[..., Any],
        *,
        kwargs: Mapping[str, Any],
        executor: concurrent.futures.Executor | None = None,
) -> Any:
    """
    Call a function with the kwargs: await it if async, or run it in the executor if sync.

    ``executor`` is usually ``settings.execution.executor``; None means the loop's default executor.
    If a sync function returns an awaitable (e.g. a lambda around an async call), it is awaited too.
    """
    if is_async_fn(fn):
        return await fn(**kwargs)

    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    if executor is None:
        call = functools.partial(context.run, functools.partial(fn, **kwargs))
        result = await loop.run_in_executor(executor, call)
    else:
        result = await _run_in_thread(loop, executor, context, fn, kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


async def _run_in_thread(
        loop: asyncio.AbstractEventLoop,
        executor: concurrent.futures.Executor,
        context: contextvars.Context,
        fn: Callable[..., Any],
        kwargs: Mapping[str, Any],
) -> Any:
    """
    The same as ``loop.run_in_executor()``, but lighter: the outcome comes to the loop directly.

    There is no chaining of the executor's future to an asyncio future and back; the thread puts
    the result (or the error) into the awaited future with one thread-safe callback.
    """
    waiter: asyncio.Future[Any] = loop.create_future()

    def call() -> None:
        try:
            result = context.run(fn, **kwargs)
        except BaseException as e:
            _deliver(loop, waiter, None, e)
        else:
            _deliver(loop, waiter, result, None)

    job = executor.submit(call)
    try:
        return await waiter
    except asyncio.CancelledError:
        job.cancel()  # if not started yet; a running thread cannot be interrupted (see the module)
        raise


def _deliver(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[Any],
             result: Any, exc: BaseException | None) -> None:
    # From the thread. If the loop is closed (the operator has exited), nobody waits for the result.
    if not loop.is_closed():
        try:
            loop.call_soon_threadsafe(_resolve, waiter, result, exc)
        except RuntimeError:  # closed in the meantime
            pass


def _resolve(waiter: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if not waiter.done():  # e.g. cancelled while the thread was running
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(result)
