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
(its result is then discarded). The calls running in the threads are known by their descriptions
(:func:`running_sync_calls`), so that the operator's exit can say what it is waiting for.
"""
import asyncio
import collections
import concurrent.futures
import contextvars
import functools
import inspect
import math
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ['RunningCall', 'invoke', 'is_async_fn', 'running_sync_calls']


def is_async_fn(fn: Callable[..., Any]) -> bool:
    """Whether calling the function returns an awaitable to be awaited (rather than a ready result)."""
    # Asked on every call of every handler, e.g. of a timer every second for each of thousands of objects:
    # the introspection is remembered while the function lives (weakly: the sub-handlers made in every
    # call are closures that can hold whole objects, which must not be kept alive by this memory).
    try:
        return _async_fns[weakref.ref(fn)]  # equal to the stored one while the function lives
    except KeyError:
        result = _async_fns[weakref.ref(fn, _forget_async_fn)] = _is_async_fn(fn)
        return result
    except TypeError:  # unhashable or not weakly referenceable callables: no caching, rare
        return _is_async_fn(fn)


def _is_async_fn(fn: Callable[..., Any]) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    # Callable objects: their async-ness is defined by their __call__ method (not for plain functions).
    if not inspect.isroutine(fn) and not inspect.isclass(fn):
        return inspect.iscoroutinefunction(type(fn).__call__)
    return False


# As a weakref.WeakKeyDictionary keeps them, but read with no Python-level call (one per handler call).
_async_fns: 'dict[weakref.ref[Callable[..., Any]], bool]' = {}


def _forget_async_fn(ref: 'weakref.ref[Callable[..., Any]]') -> None:
    _async_fns.pop(ref, None)


async def invoke(
        fn: Callable[..., Any],
        *,
        kwargs: Mapping[str, Any],
        executor: concurrent.futures.Executor | None = None,
        description: Callable[[], str] | None = None,
        sync: bool | None = None,
) -> Any:
    """
    Call a function with the kwargs: await it if async, or run it in the executor if sync.

    ``executor`` is usually ``settings.execution.executor``; None means the loop's default executor.
    ``description`` names the call among :func:`running_sync_calls` while it runs in a thread
    (e.g. "Handler 'fn' of ns/name"); by default, the function's name. It is a callable,
    called only if the description is needed (e.g. at the exit), not for every call.
    If a sync function returns an awaitable (e.g. a lambda around an async call), it is awaited too.
    ``sync`` is whether the function is known to be sync (as :func:`is_async_fn` tells); None: find out.
    """
    if not sync and (sync is not None or is_async_fn(fn)):
        return await fn(**kwargs)

    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    if executor is None:
        call = functools.partial(context.run, functools.partial(fn, **kwargs))
        result = await loop.run_in_executor(executor, call)
    else:
        # The same as ``loop.run_in_executor()``, but much lighter for the bursts of calls (see _Lane):
        # the call goes to the executor at the end of the loop's current iteration, with the others
        # made in it (see _Outbox). Inline, not a coroutine of its own: this is done for every sync call.
        outbox = _Outbox.of(loop)
        sync_call = _Call(waiter=loop.create_future(), inbox=outbox.inbox, context=context, fn=fn,
                          kwargs=kwargs, description=description)
        outbox.put(executor, sync_call)
        try:
            result = await sync_call.waiter
        except asyncio.CancelledError:
            sync_call.cancelled = True  # if not started yet; a running thread cannot be interrupted
            raise
    # The usual results (None, dicts) go without the ABC's check, which is a Python-level call.
    if result is not None and type(result) is not dict and inspect.isawaitable(result):
        result = await result
    return result


_K = TypeVar('_K')
_V = TypeVar('_V')


def _one_per(key: _K, known: 'weakref.WeakKeyDictionary[_K, _V]', lock: threading.Lock,
             make: Callable[[_K], _V]) -> _V:
    """The one object per key (an executor, a loop), made at the first need: a lock-free lookup after that."""
    try:
        return known[key]
    except KeyError:
        with lock:
            return known.setdefault(key, make(key))


class RunningCall:
    """A sync call that runs in a thread now: what it is, and since when (in ``time.monotonic()``)."""

    __slots__ = ('_describe', '_fn', 'started')

    def __init__(self, describe: Callable[[], str] | None, fn: Callable[..., Any], started: float) -> None:
        super().__init__()
        self._describe = describe
        self._fn = fn
        self.started = started

    @property
    def description(self) -> str:
        return self._describe() if self._describe is not None else _name_of(self._fn)

    def __repr__(self) -> str:
        return f'<{type(self).__name__} {self.description!r}>'


# The sync calls being run by the threads now (of all lanes and executors), by the threads' identities: for
# the operator's exit. Each thread sets and removes only its own entry, one call at a time: a dict's item
# assignment and removal are atomic, so no lock for every call; a copy of the dict is atomic too.
_running: dict[int, tuple['_Call', float]] = {}


def running_sync_calls() -> list[RunningCall]:
    """The sync calls that run in the threads now (and cannot be interrupted), the longest-running first."""
    calls = [RunningCall(call.description, call.fn, started) for call, started in dict(_running).values()]
    return sorted(calls, key=lambda call: call.started)


class _Call:
    __slots__ = ('cancelled', 'context', 'description', 'fn', 'inbox', 'kwargs', 'waiter')

    def __init__(self, *, waiter: asyncio.Future[Any], inbox: '_Inbox', context: contextvars.Context,
                 fn: Callable[..., Any], kwargs: Mapping[str, Any],
                 description: Callable[[], str] | None = None) -> None:
        super().__init__()
        self.description = description
        self.waiter = waiter
        self.inbox = inbox
        self.context = context
        self.fn = fn
        self.kwargs = kwargs
        self.cancelled = False  # set by the loop, read by the threads: a hint, the waiter decides


class _Lane:
    """
    The sync calls to one executor: queued here, and run by "runners" --- jobs of the executor.

    A job per call (``executor.submit()`` and a future per call, then a future of the loop chained to it)
    costs more than most handlers themselves. Instead, a runner job runs the queued calls one by one
    until none are left. A new runner is submitted at once only when the lane has none. While calls wait
    and all the runners are busy, one more runner is submitted every :data:`GROWING_DELAY` seconds (the loop
    that has put the calls checks it; less often while none can be added), up to the executor's limit of
    threads: the slow (blocking) calls get their threads within milliseconds, as with a job per call, while
    a burst of quick calls is run by one runner, one call after another --- sooner than another thread would
    wake up, and with no switches of the GIL between the runners for every call (``benchmarks/README.md``).
    Any executor works this way, including the custom ones of ``settings.execution.executor``.

    The last runner to run out of calls (no other one busy) waits for new ones for :data:`LINGERING` seconds
    before it leaves its thread to the executor (none in a thread with a running event loop, e.g. of an
    executor that runs the jobs in the caller's thread: it would block the loop). In a trickle of calls (e.g.
    the events of objects that come one by one), the next call then wakes that very thread up, with nothing to
    queue in the executor: a new job would wake one of its idle threads, and every idle thread of a
    ``ThreadPoolExecutor`` wakes the next one up in turn, each taking the GIL for a while, for every job.
    (Not the first runner to run out while others are busy: in bursts, that one costs more switches of the
    threads than it saves; see ``benchmarks/README.md``.)
    """

    _lanes: 'weakref.WeakKeyDictionary[concurrent.futures.Executor, _Lane]' = weakref.WeakKeyDictionary()
    _lanes_lock = threading.Lock()

    def __init__(self, executor: concurrent.futures.Executor) -> None:
        super().__init__()
        self._executor_ref = weakref.ref(executor)  # a strong one would keep the lanes' key alive
        self._lock = threading.Lock()
        self._calls: collections.deque[_Call] = collections.deque()
        self._runners = 0  # submitted and not exited yet (incl. those still queued in the executor)
        self._busy = 0  # running a call now
        self._lingering = False  # a runner waits for new calls (one of the runners, not busy), not woken yet
        self._wakeup = threading.Lock()  # released to wake the lingering runner up; otherwise held
        self._wakeup.acquire()
        self._checker: weakref.ref[asyncio.AbstractEventLoop] | None = None  # the loop checking the growth

    @classmethod
    def of(cls, executor: concurrent.futures.Executor) -> '_Lane':
        return _one_per(executor, cls._lanes, cls._lanes_lock, cls)

    def put(self, executor: concurrent.futures.Executor, calls: list[_Call], loop: asyncio.AbstractEventLoop,
            ) -> None:
        """
        Queue the calls for the runners (in the loop's thread: the calls' waiters are the loop's futures).

        If no runner can be started (e.g. the executor is shut down), the calls fail with that error,
        as with ``submit()``; except those that a runner still running meanwhile has taken.
        """
        with self._lock:
            self._calls.extend(calls)
            wakes, self._lingering = self._lingering, False  # woken once
            needs_runner = not self._runners
            if needs_runner:
                self._runners += 1
            # More calls than the free runners can take: the loop checks soon if they still wait.
            checks = len(self._calls) > self._runners - self._busy and not self._is_checked()
            if checks:
                self._checker = weakref.ref(loop)
        if wakes:
            self._wakeup.release()
        if needs_runner:
            try:
                executor.submit(self._run)
            except BaseException as e:
                with self._lock:
                    self._runners -= 1
                    failed = [call for call in calls if call in self._calls]
                    for call in failed:
                        self._calls.remove(call)
                for call in failed:
                    if not call.waiter.done():
                        call.waiter.set_exception(e)
                if not isinstance(e, Exception):
                    raise
        if checks:
            loop.call_later(GROWING_DELAY, self._grow, loop, GROWING_DELAY)

    def _is_checked(self) -> bool:
        """Whether a loop checks the growth already (under the lock): not if it is gone or closed since."""
        loop = self._checker() if self._checker is not None else None
        return loop is not None and not loop.is_closed()

    def _grow(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        """
        One more runner if the calls still wait while all the runners are busy (in the checking loop).

        Checked again while any calls wait: after :data:`GROWING_DELAY` if a runner is added, otherwise after
        twice the last delay, up to :data:`GROWING_BACKOFF` (at once if the delay was 0; e.g. while all the
        executor's threads are taken and a runner waits in its queue, the checks would wake the loop up for
        nothing); not after a failed submission (e.g. the executor is shut down): the busy runners take the
        waiting calls later.
        """
        executor = self._executor_ref()
        with self._lock:
            waiting = bool(self._calls) and executor is not None
            spawns = waiting and self._runners == self._busy
            if spawns:
                self._runners += 1
            if not waiting:
                self._checker = None
        if spawns and executor is not None:
            try:
                executor.submit(self._run)
            except Exception:  # e.g. shut down meanwhile: the busy runners take the calls later
                with self._lock:
                    self._runners -= 1
                    self._checker = None
                return
        if waiting:
            delay = GROWING_DELAY if spawns else min(delay * 2 or GROWING_BACKOFF, GROWING_BACKOFF)
            loop.call_later(delay, self._grow, loop, delay)

    def _run(self) -> None:
        thread = threading.get_ident()
        call = self._take(finished=False)
        while call is not None:
            if not call.cancelled:
                _running[thread] = (call, time.monotonic())
                try:
                    result = call.context.run(call.fn, **call.kwargs)
                except BaseException as e:
                    call.inbox.put(call.waiter, None, e)
                else:
                    call.inbox.put(call.waiter, result, None)
                finally:
                    del _running[thread]
            call = None  # do not keep the call's objects while waiting for the next one
            call = self._take(finished=True)

    def _take(self, *, finished: bool) -> _Call | None:
        """
        The next call for this runner (after the finished one, if any); None if the runner must exit.

        With no calls after a finished one, the runner lingers (see the class): it waits for new ones once.
        """
        with self._lock:
            if finished:
                self._busy -= 1
            if self._calls:
                self._busy += 1
                return self._calls.popleft()
            lingers = (finished and not self._busy and not self._lingering and LINGERING > 0
                       and asyncio._get_running_loop() is None)
            if not lingers:
                self._runners -= 1
                return None
            self._lingering = True
        self._linger()
        with self._lock:
            if not self._calls:  # none came, or another runner has taken them
                self._runners -= 1
                return None
            self._busy += 1
            return self._calls.popleft()

    def _linger(self) -> None:
        """Wait for a wake-up by :meth:`put` or for :data:`LINGERING` seconds, whichever comes first."""
        if self._wakeup.acquire(timeout=LINGERING):
            return
        with self._lock:
            late, self._lingering = not self._lingering, False  # no wake-ups from now on
        if late:  # put() has decided to wake this runner up after the timeout: its release is on the way,
            self._wakeup.acquire()  # ... and the lock must be held again for the next lingering


def _name_of(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return repr(getattr(fn, '__qualname__', None) or type(fn).__qualname__)


# The least time between two hand-overs of one loop's sync calls to the runners, in seconds (see _Outbox).
# Read at every hand-over, so it can be tuned at any time (0: a hand-over per iteration of the loop).
BATCHING_SPACING = 0.002

# How long a lane's runner that has run out of calls waits for new ones in its thread, in seconds (see _Lane).
# Read at every wait, so it can be tuned at any time (0: the runners leave at once).
LINGERING = 0.05

# How long the sync calls wait while all the runners of their lane are busy before one more runner is added,
# in seconds (see _Lane). Read at every check, so it can be tuned at any time (0: the loop's next iteration).
GROWING_DELAY = 0.001
# The longest delay between two such checks while no runner can be added (see _Lane._grow), in seconds.
GROWING_BACKOFF = 0.25


class _Outbox:
    """
    The sync calls made by one event loop, handed to their lanes together: in batches, not one by one.

    Otherwise, a call made while the runners are done with the previous ones wakes one up (a job of
    the executor: a system call, then a switch of the GIL between the threads), and the loop's next
    system call in the same iteration (e.g. a request's sending) lets that runner run the call and leave,
    so the next call of the same iteration needs a new runner again. So one runner takes all of them.

    The first call after a quiet while is handed over at the end of the loop's current iteration.
    The next ones wait until :data:`BATCHING_SPACING` has passed since that hand-over: in a steady flow
    of calls (e.g. a burst of events with sync handlers), the runners are woken up once per few
    milliseconds with all the calls made meanwhile, not once per iteration of a busy loop with a few
    calls each. Every session of a runner costs several switches of the GIL between the loop's thread
    and the runner's, each a system call or a wait of up to ``sys.getswitchinterval()``, whatever
    the number of calls it takes. This costs a sync call at most those milliseconds of latency.
    """

    _outboxes: 'weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Outbox]' = weakref.WeakKeyDictionary()
    _outboxes_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop_ref = weakref.ref(loop)  # a strong one would keep the outboxes' key (the loop) alive
        self.inbox = _Inbox.of(loop)  # for the outcomes of the calls: looked up once here, not per call
        self._pending: list[tuple[concurrent.futures.Executor, _Call]] = []
        self._handed_over_at = -math.inf  # in the loop's time

    # The outbox of the latest loop asked for: usually the only one, asked for every sync call.
    _latest: 'tuple[weakref.ref[asyncio.AbstractEventLoop], _Outbox] | None' = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> '_Outbox':
        latest = cls._latest  # read once: other threads' loops can replace it meanwhile
        if latest is not None and latest[0]() is loop:
            return latest[1]
        outbox = _one_per(loop, cls._outboxes, cls._outboxes_lock, cls)
        cls._latest = (weakref.ref(loop), outbox)
        return outbox

    def put(self, executor: concurrent.futures.Executor, call: _Call) -> None:
        # In the loop's thread only: no locks.
        if not self._pending:
            loop = self._loop_ref()
            assert loop is not None  # the call is being made in it
            due = self._handed_over_at + BATCHING_SPACING
            if loop.time() < due:
                loop.call_at(due, self._flush)
            else:
                loop.call_soon(self._flush)
        self._pending.append((executor, call))

    def _flush(self) -> None:
        loop = self._loop_ref()
        assert loop is not None  # it runs this very callback
        self._handed_over_at = loop.time()
        pending, self._pending = self._pending, []
        if len(pending) == 1:  # the usual case: no grouping
            executor, call = pending[0]
            _Lane.of(executor).put(executor, [call], loop)
            return
        batches: dict[concurrent.futures.Executor, list[_Call]] = {}
        for executor, call in pending:
            batches.setdefault(executor, []).append(call)
        for executor, calls in batches.items():
            _Lane.of(executor).put(executor, calls, loop)


class _Inbox:
    """
    The outcomes of the sync calls for one event loop, resolved there in batches.

    Waking the loop up from a thread (``call_soon_threadsafe``) costs a system call both for
    the thread and for the loop. When many calls end at once, one wake-up resolves all of them.
    """

    _inboxes: 'weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Inbox]' = weakref.WeakKeyDictionary()
    _inboxes_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop_ref = weakref.ref(loop)  # a strong one would keep the inboxes' key (the loop) alive
        self._lock = threading.Lock()
        self._outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._scheduled = False

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> '_Inbox':
        return _one_per(loop, cls._inboxes, cls._inboxes_lock, cls)

    def put(self, waiter: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
        # From the threads.
        with self._lock:
            self._outcomes.append((waiter, result, exc))
            if self._scheduled:
                return  # the loop is woken up already and will take this one too
            self._scheduled = True
        loop = self._loop_ref()
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._resolve_all)
                return
            except RuntimeError:  # closed in the meantime
                pass
        # The loop is closed or gone: the operator has exited, nobody waits for the results.
        with self._lock:
            self._outcomes.clear()
            self._scheduled = False

    def _resolve_all(self) -> None:
        # In the loop.
        with self._lock:
            outcomes, self._outcomes = self._outcomes, []
            self._scheduled = False
        for waiter, result, exc in outcomes:
            if not waiter.done():  # e.g. cancelled while the thread was running
                if isinstance(exc, StopIteration):  # futures refuse it: it would break the generators
                    exc = RuntimeError(f'The function has raised StopIteration: {exc!r}')
                if exc is not None:
                    waiter.set_exception(exc)
                else:
                    waiter.set_result(result)
