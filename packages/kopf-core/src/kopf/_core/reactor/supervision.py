"""
Supervising the operator's tasks: the stop requests (flags, signals), the ultimate exit.

The signals are handled only when the operator runs in the main thread. The first signal
starts a graceful exit (and says which sync handlers it waits for: their threads cannot be
interrupted). The next signal while the operator is still exiting makes it exit at once: what can
be cancelled is cancelled (including the cleanup), the sync handlers' threads are abandoned
(see :func:`forced_exit_requested`, which the ``kopf run`` command then honours). After the operator
is over (or its loop has stopped, for ``kopf run``), the signals get Python's default reactions again;
a signal that comes after the loop has removed its handlers but while the loop still runs (asyncio
would drop it silently, uvloop would lose the ``KeyboardInterrupt``) is noted at its arrival:
:func:`signal_after_operator`.
If a graceful exit takes longer than ``settings.process.ultimate_exiting_timeout``, the operator's remaining
activities are cancelled.
"""
import asyncio
import contextvars
import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Iterable
from typing import Any

from kopf._cogs.aiokits import aioflags
from kopf._core.actions import invocation
from kopf._core.intents.configuration import OperatorSettings

__all__ = [
    'FORCED_EXIT_CODE',
    'announce_sync_calls',
    'defaults_restored_by_loop_owner',
    'describe_sync_calls',
    'forced_exit_requested',
    'install_signal_handlers',
    'operator_is_over',
    'reset_exit_requests',
    'restore_default_signal_handlers',
    'signal_after_operator',
    'stop_flag_checker',
]

# The exit code of a forced exit by a repeated signal: 128 + SIGINT, as shells report interrupted commands.
FORCED_EXIT_CODE = 130

# Set by a repeated signal: the process should exit without waiting for the sync handlers' threads.
_forced_exit = threading.Event()

# The signals noted at their arrival (in the main thread, at once) and those taken by the loop (in its next
# iteration): asyncio drops the signals whose handlers are removed in between (e.g. at the operator's end).
_arrived_signals = 0
_taken_signals = 0


# Set by the owner of the operator's loop (the ``kopf run`` command), which restores Python's default
# reactions to the signals itself at its own end, and till then polls signal_after_operator(); else, the
# defaults are restored at the operator's end.
defaults_restored_by_loop_owner: contextvars.ContextVar[bool] = contextvars.ContextVar(
    'defaults_restored_by_loop_owner', default=False)


def reset_exit_requests() -> None:
    """Forget the forced exit & the announcements of the previous operators (e.g. of the same process)."""
    global _arrived_signals, _taken_signals
    _forced_exit.clear()
    _announced.clear()
    _arrived_signals = _taken_signals = 0


def forced_exit_requested() -> bool:
    """Whether a repeated signal has asked the operator(s) of this process to exit at once."""
    return _forced_exit.is_set()


def signal_after_operator() -> bool:
    """
    Whether a signal has arrived that the operator's loop has not taken (e.g. after the loop's end).

    For the owner of the loop (see :data:`defaults_restored_by_loop_owner`), which polls it till its own end:
    such a signal would have raised ``KeyboardInterrupt`` with Python's default handler, at a random place
    of the exit where it can be lost (a finalizer, a loop's callback in C); the owner acts on it instead.
    """
    return _taken_signals < _arrived_signals


def describe_sync_calls(calls: Iterable[invocation.RunningCall]) -> str:
    """The sync calls in threads, in words: "Handler 'fn' of ns/name (running for 2 s)", by commas."""
    now = time.monotonic()
    return ', '.join(f'{call.description} (running for {now - call.started:.0f} s)' for call in calls)


_announced = threading.Event()


def announce_sync_calls(calls: list[invocation.RunningCall], *, once: bool = False,
                        signum: signal.Signals | None = None) -> None:
    """
    Say what the exit waits for (and for how long): the sync handlers, which cannot be interrupted.

    With ``once``, nothing is said if it was said already (e.g. when the first signal has arrived).
    ``signum`` is the signal that has asked for the exit, if any: the advice names the way to repeat it.
    """
    if once and _announced.is_set():
        return
    _announced.set()
    noun = 'sync handler' if len(calls) == 1 else 'sync handlers'
    # SIGTERM usually comes from a process manager (e.g. Kubernetes stopping a pod), not from a keyboard.
    again = ('Send SIGTERM again (or press Ctrl+C)' if signum == signal.SIGTERM else 'Press Ctrl+C again')
    logger.warning(f'Waiting for {len(calls)} {noun} to return: {describe_sync_calls(calls)}. '
                   f'Threads cannot be interrupted: the exit waits for them with no time limit. '
                   f'{again} to exit now without waiting.')

logger = logging.getLogger('kopf._core.reactor.running')  # as before the split (and as Kopf names it)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def stop_flag_checker(
        *,
        stop_flag: aioflags.Flag | None,
        signal_flag: asyncio.Event,
        runner: asyncio.Task[None],
        settings: OperatorSettings,
        loop: asyncio.AbstractEventLoop | None,
) -> None:
    """Exit when a stop is requested (and so make :func:`run_tasks` stop the operator)."""
    if loop is not None:
        # Now that the runner is known, the signals after the first one can hurry it up.
        _install(loop, _on_signal, _Signalling(flag=signal_flag, runner=runner))
    waiters = [asyncio.create_task(signal_flag.wait(), name='signal waiter')]
    if stop_flag is not None:
        waiters.append(asyncio.create_task(aioflags.wait_flag(stop_flag), name='stop-flag waiter'))
    stopping = False
    try:
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if waiters[0] not in done:
            value = waiters[-1].result()
            logger.info(f'Stop-flag is set to {value!r}. Operator is stopping.')
        schedule_ultimate_exit(runner, settings.process.ultimate_exiting_timeout)
        stopping = True
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.wait(waiters)
        if loop is not None:
            if stopping and not runner.done():
                # The exit is graceful and can take long: the next signal can hurry it up till the end.
                runner.add_done_callback(lambda _: remove_signal_handlers(loop))
            else:
                remove_signal_handlers(loop)


def schedule_ultimate_exit(runner: asyncio.Task[None], timeout: float | None) -> None:
    """Cancel the operator's activities (e.g. the cleanup) if the graceful exit takes too long."""
    if timeout is None or runner.done():
        return

    async def guard() -> None:
        await asyncio.sleep(timeout)
        logger.error(f'The operator has not exited in {timeout} seconds; cancelling it forcefully.')
        runner.cancel()

    guard_task = asyncio.create_task(guard(), name='ultimate exiting guard')
    runner.add_done_callback(lambda _: guard_task.cancel())


def install_signal_handlers(loop: asyncio.AbstractEventLoop, flag: asyncio.Event) -> bool:
    """Handle the termination signals by raising the flag; only possible in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    return _install(loop, _on_signal, _Signalling(flag=flag, runner=None))


@dataclasses.dataclass(frozen=True)
class _Signalling:
    flag: asyncio.Event  # raised by the first signal
    runner: asyncio.Task[None] | None  # cancelled by the next signals, once it is known


def _install(loop: asyncio.AbstractEventLoop, callback: Any, arg: Any) -> bool:
    try:
        for signum in SIGNALS:
            loop.add_signal_handler(signum, callback, arg, signum)
            # asyncio's own Python-level handler does nothing (the loop is woken up by the signal's byte in
            # its wake-up fd, which works with any Python-level handler): this one notes the arrival at once.
            signal.signal(signum, _note_arrival)
    except (NotImplementedError, RuntimeError, ValueError):  # e.g. non-Unix loops, or foreign loops.
        remove_signal_handlers(loop)
        for signum in SIGNALS:  # not even noted: the operator cannot act on them at all
            _restore_default(signum)
        return False
    return True


def _note_arrival(signum: int, frame: object) -> None:
    global _arrived_signals
    _arrived_signals += 1
    # Left installed when no loop runs anymore (e.g. a loop stopped by its owner before the operator's end):
    # then Python's default reaction, as if ours were never there; unless the owner checks the signals itself.
    if asyncio._get_running_loop() is None and not defaults_restored_by_loop_owner.get():
        _restore_default(signum)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)


def operator_is_over() -> None:
    """The operator's end: Python's default reactions to the signals unless its loop's owner does it."""
    if not defaults_restored_by_loop_owner.get():
        restore_default_signal_handlers()


def restore_default_signal_handlers() -> None:
    """Python's default reactions to the signals, where ours are still installed."""
    for signum in SIGNALS:
        _restore_default(signum)


def _restore_default(signum: int) -> None:
    if signal.getsignal(signum) is _note_arrival:
        try:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
        except ValueError:  # not in the main thread: ours was never installed by this thread anyway
            pass


def remove_signal_handlers(loop: asyncio.AbstractEventLoop) -> None:
    """
    The loop stops acting on the signals; Python's default reactions come back once the loop has stopped.

    While the loop still runs (the operator's last steps, the closing of its async generators), a signal
    must not raise ``KeyboardInterrupt`` into the loop's machinery: uvloop loses it there, and the process
    then waits for the sync handlers' threads although asked twice to exit. So the signals are only noted
    at their arrival (see :func:`signal_after_operator`): till the operator's end if it is embedded into
    a loop that runs on; till the loop's stop if the ``kopf run`` command owns the loop (it restores them).
    """
    running = loop.is_running()
    for signum in SIGNALS:
        try:
            loop.remove_signal_handler(signum)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
        # The standard loop restores the default handler itself; others (e.g. uvloop) leave ours.
        default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        current = signal.getsignal(signum)
        if (running or defaults_restored_by_loop_owner.get()) and current in (_note_arrival, default):
            try:
                signal.signal(signum, _note_arrival)
            except ValueError:  # not in the main thread: ours was never installed by this thread anyway
                pass
        elif not running:
            _restore_default(signum)
    # Restored at the operator's end (operator_is_over), or by the ``kopf run`` command after its loop's stop.


def _on_signal(signalling: _Signalling, signum: signal.Signals) -> None:
    global _taken_signals
    _taken_signals += 1
    if not signalling.flag.is_set():
        logger.info(f'Signal {signum.name} is received. Operator is stopping.')
        signalling.flag.set()
        calls = invocation.running_sync_calls()
        if calls:
            announce_sync_calls(calls, signum=signum)
    elif signalling.runner is not None:
        _on_repeated_signal(signalling.runner, signum)


def _on_repeated_signal(runner: asyncio.Task[None], signum: signal.Signals) -> None:
    calls = invocation.running_sync_calls()
    abandoned = f'; abandoning the sync handlers: {describe_sync_calls(calls)}' if calls else ''
    logger.warning(f'Signal {signum.name} is received again. Operator is exiting now: '
                   f'cancelling what is running{abandoned}.')
    _forced_exit.set()
    task = asyncio.create_task(_cancel_until_done(runner), name='forced exit')
    _forcing.add(task)
    task.add_done_callback(_forcing.discard)


_forcing: set[asyncio.Task[None]] = set()  # the tasks are referenced only weakly by the loop


async def _cancel_until_done(runner: asyncio.Task[None]) -> None:
    """
    Cancel the runner again and again until it is done, whatever it is doing in its exiting sequence.

    A cancellation requested while an earlier one is not delivered yet (e.g. of the graceful exit
    that has just begun) merges with it; the exiting sequence itself waits for the workers, the cleanup.
    """
    while not runner.done():
        runner.cancel()
        await asyncio.wait([runner], timeout=0.1)
