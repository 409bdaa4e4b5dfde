import asyncio
import concurrent.futures
import contextvars
import functools
import gc
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, cast

import pytest

from kopf._core.actions import invocation
from kopf._core.actions.invocation import BATCHING_SPACING, LINGERING, invoke, is_async_fn

some_var: contextvars.ContextVar[list[str]] = contextvars.ContextVar('some_var')


@pytest.fixture
def executor() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix='test-handlers')
    yield executor
    executor.shutdown(wait=True)


async def async_fn(x: int, **_: Any) -> int:
    return x * 2


def sync_fn(x: int, **_: Any) -> int:
    return x * 3


class AsyncCallable:
    async def __call__(self, x: int, **_: Any) -> int:
        return x * 5


class SyncCallable:
    def __call__(self, x: int, **_: Any) -> int:
        return x * 7


def test_async_detection() -> None:
    assert is_async_fn(async_fn)
    assert is_async_fn(functools.partial(async_fn, x=1))
    assert is_async_fn(functools.partial(functools.partial(async_fn), x=1))
    assert is_async_fn(AsyncCallable())
    assert not is_async_fn(sync_fn)
    assert not is_async_fn(functools.partial(sync_fn, x=1))
    assert not is_async_fn(SyncCallable())
    assert not is_async_fn(lambda **_: None)


def test_async_detection_is_remembered_without_keeping_the_functions_alive() -> None:
    class Payload:  # what a sub-handler made in a call can hold, e.g. a whole object
        pass

    class Unreferenceable:
        __slots__ = ()

        async def __call__(self, **_: Any) -> None:
            pass

    def make_closure() -> Any:
        payload = Payload()

        async def closure(**_: Any) -> Payload:
            return payload
        return closure, weakref.ref(payload)

    closure, payload_ref = make_closure()
    assert is_async_fn(closure)
    assert weakref.ref(closure) in invocation._async_fns  # remembered
    assert is_async_fn(closure)  # the same answer
    del closure
    gc.collect()
    assert payload_ref() is None
    assert all(ref() is not None for ref in list(invocation._async_fns))  # the dead ones are forgotten
    assert is_async_fn(Unreferenceable())  # no weak references: not remembered, but still right


async def test_async_function_is_awaited_in_the_loop() -> None:
    thread_ids: list[int] = []

    async def fn(**_: Any) -> str:
        thread_ids.append(threading.get_ident())
        return 'done'

    result = await invoke(fn, kwargs={'a': 1})
    assert result == 'done'
    assert thread_ids == [threading.get_ident()]


@pytest.mark.parametrize('fn, expected', [
    (async_fn, 20),
    (sync_fn, 30),
    (functools.partial(async_fn), 20),
    (functools.partial(sync_fn), 30),
    (AsyncCallable(), 50),
    (SyncCallable(), 70),
])
async def test_results_of_all_kinds_of_callables(fn: Any, expected: int) -> None:
    assert await invoke(fn, kwargs={'x': 10}) == expected


async def test_sync_function_runs_in_the_executor(executor: concurrent.futures.Executor) -> None:
    thread_names: list[str] = []

    def fn(**_: Any) -> None:
        thread_names.append(threading.current_thread().name)

    await invoke(fn, kwargs={}, executor=executor)
    assert len(thread_names) == 1
    assert thread_names[0].startswith('test-handlers')


async def test_sync_function_sees_the_context_variables(executor: concurrent.futures.Executor) -> None:
    shared: list[str] = []
    token = some_var.set(shared)
    try:
        def fn(**_: Any) -> None:
            some_var.get().append('from-thread')  # a mutable value is shared with the caller
            some_var.set(['replaced'])  # but setting it does not leak back

        await invoke(fn, kwargs={}, executor=executor)
        assert shared == ['from-thread']
        assert some_var.get() is shared
    finally:
        some_var.reset(token)


async def test_sync_function_returning_an_awaitable_is_awaited() -> None:
    result = await invoke(lambda **kwargs: async_fn(**kwargs), kwargs={'x': 4})
    assert result == 8


async def test_all_kwargs_are_passed_so_fns_without_kwargs_fail() -> None:
    def strict(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="unexpected keyword argument 'y'"):
        await invoke(strict, kwargs={'x': 1, 'y': 2})


async def test_errors_propagate_from_sync_and_async_functions() -> None:
    async def async_failing(**_: Any) -> None:
        raise ValueError('async boom')

    def sync_failing(**_: Any) -> None:
        raise ValueError('sync boom')

    with pytest.raises(ValueError, match='async boom'):
        await invoke(async_failing, kwargs={})
    with pytest.raises(ValueError, match='sync boom'):
        await invoke(sync_failing, kwargs={})


async def test_cancellation_of_an_async_function_propagates_into_it() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def fn(**_: Any) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.create_task(invoke(fn, kwargs={}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()


async def test_cancellation_while_a_sync_function_runs(executor: concurrent.futures.Executor) -> None:
    entered = threading.Event()
    release = threading.Event()
    finished = threading.Event()

    def fn(**_: Any) -> None:
        entered.set()
        release.wait(timeout=10)
        finished.set()

    task = asyncio.create_task(invoke(fn, kwargs={}, executor=executor))
    await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not finished.is_set()  # the waiting is cancelled at once, the thread is not interrupted
    release.set()
    await asyncio.get_running_loop().run_in_executor(None, finished.wait, 10)
    assert finished.is_set()


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """A custom executor, as operators can set in ``settings.execution.executor``: counts the jobs."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix='test-counting')
        self.jobs = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        self.jobs += 1
        return super().submit(fn, *args, **kwargs)


@pytest.fixture
def counting_executor() -> Iterator[CountingExecutor]:
    executor = CountingExecutor(max_workers=4)
    yield executor
    executor.shutdown(wait=True)


async def test_sync_functions_run_concurrently_up_to_the_executors_limit(
        counting_executor: CountingExecutor) -> None:
    # All four must be inside at once to pass the barrier: one after another, they would all time out.
    barrier = threading.Barrier(4, timeout=10)

    def fn(x: int, **_: Any) -> str:
        barrier.wait()
        return threading.current_thread().name

    names = await asyncio.gather(*(invoke(fn, kwargs={'x': i}, executor=counting_executor) for i in range(4)))
    assert len(set(names)) == 4
    assert not barrier.broken


async def test_a_burst_of_quick_sync_functions_takes_fewer_jobs_than_calls(
        counting_executor: CountingExecutor) -> None:
    results = await asyncio.gather(*(invoke(sync_fn, kwargs={'x': i}, executor=counting_executor)
                                     for i in range(200)))
    assert results == [i * 3 for i in range(200)]
    assert 1 <= counting_executor.jobs < 200


async def test_a_trickle_of_sync_calls_is_run_by_one_lingering_runner(
        counting_executor: CountingExecutor) -> None:
    # Each call is made after the previous one is over (the runner is out of calls every time): without the
    # lingering, every call would be a new job, i.e. a wake-up of the executor's idle threads one by one.
    calls = 20
    results = [await invoke(sync_fn, kwargs={'x': i}, executor=counting_executor) for i in range(calls)]
    assert results == [i * 3 for i in range(calls)]
    assert counting_executor.jobs < calls // 2  # 1, unless the machine stalls for LINGERING between calls


async def test_a_lingering_runner_runs_the_calls_in_the_context_of_each(
        counting_executor: CountingExecutor) -> None:
    def fn(**_: Any) -> list[str]:
        return some_var.get()

    results = []
    for i in range(3):
        some_var.set([f'call{i}'])
        results.append(await invoke(fn, kwargs={}, executor=counting_executor))
    assert results == [['call0'], ['call1'], ['call2']]


async def test_a_lingering_runner_takes_a_burst_and_more_runners_join_it(
        counting_executor: CountingExecutor) -> None:
    await invoke(sync_fn, kwargs={'x': 0}, executor=counting_executor)  # a runner lingers now
    barrier = threading.Barrier(4, timeout=10)  # all four at once: the lingering runner alone would time out

    def fn(x: int, **_: Any) -> int:
        barrier.wait()
        return x

    calls = (invoke(fn, kwargs={'x': i}, executor=counting_executor) for i in range(4))
    assert await asyncio.gather(*calls) == [0, 1, 2, 3]
    assert not barrier.broken


class SubmittersExecutor(concurrent.futures.ThreadPoolExecutor):
    """Remembers which threads have submitted the jobs."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix='test-submitters')
        self.submitters: list[str] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        self.submitters.append(threading.current_thread().name)
        return super().submit(fn, *args, **kwargs)


async def test_more_runners_are_added_by_the_loop_for_the_waiting_calls_not_by_the_runners() -> None:
    # A runner that takes a call while others wait does not submit another one: the calls are usually quick,
    # and it runs them sooner than another thread would wake up. The loop adds one if they still wait.
    executor = SubmittersExecutor(max_workers=4)
    release = threading.Event()

    def blocker(**_: Any) -> str:
        release.wait(timeout=10)
        return threading.current_thread().name

    def quick(**_: Any) -> str:
        return threading.current_thread().name

    try:
        blocked = asyncio.create_task(invoke(blocker, kwargs={}, executor=executor))
        quick_names = await asyncio.gather(*(invoke(quick, kwargs={}, executor=executor) for _ in range(5)))
        release.set()
        blocker_name = await blocked
    finally:
        executor.shutdown(wait=True)
    assert blocker_name not in quick_names  # the quick calls are not held back by the blocked runner
    assert len(executor.submitters) >= 2
    assert set(executor.submitters) == {threading.current_thread().name}


@pytest.mark.looptime
async def test_a_runner_that_cannot_be_added_leaves_the_waiting_calls_to_the_busy_runner(
        caplog: pytest.LogCaptureFixture) -> None:
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix='test-shutdown')
    started = threading.Event()
    release = threading.Event()

    def blocker(**_: Any) -> str:
        started.set()
        release.wait(timeout=10)
        return 'blocker'

    try:
        blocked = asyncio.create_task(invoke(blocker, kwargs={}, executor=executor))
        assert await asyncio.to_thread(started.wait, 10)
        waiting = asyncio.create_task(invoke(sync_fn, kwargs={'x': 1}, executor=executor))
        await asyncio.sleep(0)  # the call is made
        await asyncio.sleep(0)  # the call is handed over: it waits, the only runner is busy
        executor.shutdown(wait=False)  # no more runners from now on
        await asyncio.sleep(invocation.GROWING_DELAY * 3)  # the loop has tried to add one
        assert not waiting.done()
        release.set()
        assert await blocked == 'blocker'
        assert await waiting == 3  # run by the runner of the blocker
    finally:
        release.set()
        executor.shutdown(wait=True)
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


@pytest.mark.looptime
async def test_the_checks_for_more_runners_back_off_while_none_can_be_added(looptime: float) -> None:
    # All the executor's threads taken, a runner queued in it: checking every GROWING_DELAY would wake the
    # loop up thousands of times per second for nothing. The loop's scheduling of the checks is watched here.
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix='test-backoff')
    release = threading.Event()
    loop = asyncio.get_running_loop()
    original_call_later = loop.call_later
    delays: list[float] = []

    def watching_call_later(delay: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        if getattr(callback, '__name__', None) == '_grow':
            delays.append(delay)
        return original_call_later(delay, callback, *args, **kwargs)

    loop.call_later = watching_call_later  # type: ignore[method-assign]
    try:
        calls = [asyncio.create_task(invoke(lambda **_: release.wait(10), kwargs={}, executor=executor))
                 for _ in range(3)]
        await asyncio.sleep(10)  # in the loop's time: the checks go on while the calls wait
        assert not any(call.done() for call in calls)
    finally:
        release.set()
        del loop.call_later  # type: ignore[method-assign]
        executor.shutdown(wait=True)
    await asyncio.gather(*calls)
    assert 10 < len(delays) < 100  # 10,000 with no back-off
    assert delays[:2] == [invocation.GROWING_DELAY, invocation.GROWING_DELAY]  # the second one adds a runner
    assert delays[-1] == invocation.GROWING_BACKOFF


class InlineExecutor(concurrent.futures.Executor):
    """Runs every job at once, in the caller's thread: as a free thread would, quicker than the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.outer_jobs = 0  # submitted by the loop itself, not by the jobs (i.e. by the runners)

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        self.outer_jobs += self.depth == 0
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.depth += 1
        try:
            future.set_result(fn(*args, **kwargs))
        finally:
            self.depth -= 1
        return future


async def test_the_loop_wakes_one_runner_for_all_the_calls_of_its_iteration() -> None:
    # Otherwise, each call would find the runner of the previous one finished (it is quicker than the loop).
    executor = InlineExecutor()
    results = await asyncio.gather(*(invoke(sync_fn, kwargs={'x': i}, executor=executor) for i in range(10)))
    assert results == [i * 3 for i in range(10)]
    assert executor.outer_jobs == 1


async def test_the_loop_wakes_a_runner_for_each_iteration_with_calls() -> None:
    executor = InlineExecutor()
    results = [await invoke(sync_fn, kwargs={'x': i}, executor=executor) for i in range(3)]
    assert results == [0, 3, 6]
    assert executor.outer_jobs == 3


async def test_a_runner_in_the_loops_thread_never_lingers() -> None:
    # A lingering runner there would block the loop itself: for LINGERING seconds after every call.
    assert LINGERING > 0  # otherwise, nothing lingers anyway
    executor = InlineExecutor()
    for i in range(3):
        started = time.monotonic()
        assert await invoke(sync_fn, kwargs={'x': i}, executor=executor) == i * 3
        assert time.monotonic() - started < LINGERING
    assert executor.outer_jobs == 3


class TimedInlineExecutor(InlineExecutor):
    """Remembers when (in the loop's time) the loop has handed the calls over to the runners."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.handed_over_at: list[float] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        if self.depth == 0:
            self.handed_over_at.append(self.loop.time())
        return super().submit(fn, *args, **kwargs)


@pytest.mark.looptime
async def test_the_calls_soon_after_a_hand_over_wait_for_the_spacing(looptime: float) -> None:
    executor = TimedInlineExecutor(asyncio.get_running_loop())
    first = await invoke(sync_fn, kwargs={'x': 1}, executor=executor)
    second = await invoke(sync_fn, kwargs={'x': 2}, executor=executor)
    assert (first, second) == (3, 6)
    assert executor.handed_over_at == [0, BATCHING_SPACING]
    assert looptime == BATCHING_SPACING


@pytest.mark.looptime
async def test_the_calls_after_a_quiet_while_are_handed_over_at_once(looptime: float) -> None:
    executor = TimedInlineExecutor(asyncio.get_running_loop())
    await invoke(sync_fn, kwargs={'x': 1}, executor=executor)
    await asyncio.sleep(1)
    await invoke(sync_fn, kwargs={'x': 2}, executor=executor)
    assert executor.handed_over_at == [0, 1]
    assert looptime == 1


@pytest.mark.looptime
async def test_the_calls_of_several_iterations_within_the_spacing_take_one_runner(looptime: float) -> None:
    executor = TimedInlineExecutor(asyncio.get_running_loop())

    async def call_later(iterations: int, x: int) -> int:
        for _ in range(iterations):
            await asyncio.sleep(0)
        return cast(int, await invoke(sync_fn, kwargs={'x': x}, executor=executor))

    await invoke(sync_fn, kwargs={'x': 0}, executor=executor)
    results = await asyncio.gather(*(call_later(i, i) for i in range(1, 6)))
    assert results == [3, 6, 9, 12, 15]
    assert executor.handed_over_at == [0, BATCHING_SPACING]
    assert executor.outer_jobs == 2


async def test_a_slow_sync_function_does_not_hold_back_the_next_ones(
        counting_executor: CountingExecutor) -> None:
    release = threading.Event()

    def slow(**_: Any) -> str:
        release.wait(timeout=10)
        return 'slow'

    slow_task = asyncio.create_task(invoke(slow, kwargs={}, executor=counting_executor))
    quick = await asyncio.gather(*(invoke(sync_fn, kwargs={'x': i}, executor=counting_executor)
                                   for i in range(10)))
    assert quick == [i * 3 for i in range(10)]
    assert not slow_task.done()
    release.set()
    assert await slow_task == 'slow'


async def test_a_sync_function_cancelled_before_it_starts_is_never_called(
        executor: concurrent.futures.Executor) -> None:
    release = threading.Event()
    called: list[int] = []

    def blocker(**_: Any) -> None:
        release.wait(timeout=10)

    def fn(x: int, **_: Any) -> None:
        called.append(x)

    blockers = [asyncio.create_task(invoke(blocker, kwargs={}, executor=executor)) for _ in range(2)]
    queued = asyncio.create_task(invoke(fn, kwargs={'x': 1}, executor=executor))
    await asyncio.sleep(0)  # let the tasks queue their calls: both threads are busy with the blockers
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    release.set()
    await asyncio.gather(*blockers)
    assert await invoke(fn, kwargs={'x': 2}, executor=executor) is None
    assert called == [2]


async def test_a_shut_down_executor_fails_the_call(executor: concurrent.futures.Executor) -> None:
    executor.shutdown(wait=True)
    with pytest.raises(RuntimeError, match='shutdown'):
        await invoke(sync_fn, kwargs={'x': 1}, executor=executor)


def test_finished_loops_and_executors_are_not_kept_alive() -> None:
    # The lanes & inboxes are remembered per executor & per loop: they must not keep them in memory.
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(invoke(sync_fn, kwargs={'x': 2}, executor=executor)) == 6
    finally:
        loop.close()
        executor.shutdown(wait=True)
    loop_ref, executor_ref = weakref.ref(loop), weakref.ref(executor)
    del loop, executor
    gc.collect()
    assert loop_ref() is None
    assert executor_ref() is None


async def test_stop_iteration_of_sync_functions_fails_only_their_own_calls(
        executor: concurrent.futures.Executor) -> None:
    def stopping(**_: Any) -> None:
        raise StopIteration('oops')

    # The lost outcomes would hang the calls forever: the timeout only turns that into a failure.
    results = await asyncio.wait_for(asyncio.gather(
        *(invoke(stopping if i % 2 else sync_fn, kwargs={'x': i}, executor=executor) for i in range(10)),
        return_exceptions=True,
    ), timeout=10)
    assert results[0::2] == [i * 3 for i in range(0, 10, 2)]
    assert all(isinstance(e, RuntimeError) and 'StopIteration' in str(e) for e in results[1::2])
