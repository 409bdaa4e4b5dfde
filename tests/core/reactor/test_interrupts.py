"""
Repeated signals in-process: the first one starts a graceful exit, the next one hurries it up.

The operator runs in the test's event loop in the main thread (where the signals are handled).
The subprocess tests of ``kopf run`` (tests/cli/test_interrupts.py) cover the sync handlers' threads.
"""
import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import Activity, ActivityHandler, HandlerId
from kopf._core.intents.registries import OperatorRegistry
from kopf._core.reactor import supervision
from kopf._core.reactor.running import operator


class MessageWatcher(logging.Handler):
    """Sets the event when the message is logged (in the loop's thread: the signals are handled there)."""

    def __init__(self, message: str, event: asyncio.Event) -> None:
        super().__init__()
        self.message = message
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == self.message:
            self.event.set()


def add_activity(registry: OperatorRegistry, activity: Activity, fn: Callable[..., Any]) -> None:
    registry.activities.append(ActivityHandler(fn=fn, id=HandlerId(fn.__name__), activity=activity))


# Only SIGTERM: asyncio restores SIGINT to Python's default, not to the test runner's handler.
# SIGINT is the same code path; the subprocess tests of `kopf run` send SIGINT.
async def test_second_signal_cancels_a_long_cleanup(
        registry: OperatorRegistry, settings: OperatorSettings, caplog: pytest.LogCaptureFixture,
) -> None:
    signum = signal.SIGTERM
    caplog.set_level(logging.INFO)
    assert threading.current_thread() is threading.main_thread()
    handler_before = signal.getsignal(signum)
    cleanup_started = asyncio.Event()

    async def long_cleanup(**_: Any) -> None:
        cleanup_started.set()
        await asyncio.sleep(60)

    add_activity(registry, Activity.CLEANUP, long_cleanup)
    supervision.reset_exit_requests()
    ready = asyncio.Event()
    task = asyncio.create_task(operator(registry=registry, settings=settings, clusterwide=True,
                                        ready_flag=ready))
    try:
        await asyncio.wait_for(ready.wait(), timeout=5)
        os.kill(os.getpid(), signum)
        await asyncio.wait_for(cleanup_started.wait(), timeout=5)
        sent = time.monotonic()
        os.kill(os.getpid(), signum)
        await asyncio.wait_for(task, timeout=5)
    finally:
        task.cancel()
    assert time.monotonic() - sent < 2  # not the cleanup's minute, not even the hung tasks' grace
    assert supervision.forced_exit_requested()
    assert not supervision.signal_after_operator()  # both taken by the loop in time
    supervision.reset_exit_requests()
    assert [message for message in caplog.messages if 'Signal' in message or 'Cleanup' in message] == [
        f'Signal {signum.name} is received. Operator is stopping.',
        f'Signal {signum.name} is received again. Operator is exiting now: cancelling what is running.',
        'Cleanup activity is only partially executed due to cancellation.',
    ]
    assert signal.getsignal(signum) == handler_before  # Python's defaults after the operator


async def test_signal_after_a_stop_flag_is_a_first_one(
        registry: OperatorRegistry, settings: OperatorSettings, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    cleanup_started = asyncio.Event()
    release = asyncio.Event()

    async def slowish_cleanup(**_: Any) -> None:
        cleanup_started.set()
        await release.wait()

    add_activity(registry, Activity.CLEANUP, slowish_cleanup)
    supervision.reset_exit_requests()
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(operator(registry=registry, settings=settings, clusterwide=True,
                                        ready_flag=ready, stop_flag=stop))
    try:
        await asyncio.wait_for(ready.wait(), timeout=5)
        stop.set()
        await asyncio.wait_for(cleanup_started.wait(), timeout=5)
        signalled = asyncio.Event()
        watcher = MessageWatcher('Signal SIGTERM is received. Operator is stopping.', signalled)
        logging.getLogger('kopf').addHandler(watcher)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(signalled.wait(), timeout=5)  # it comes via the loop's wake-up fd
        finally:
            logging.getLogger('kopf').removeHandler(watcher)
        release.set()
        await asyncio.wait_for(task, timeout=5)
    finally:
        task.cancel()
    assert not supervision.forced_exit_requested()
    assert [message for message in caplog.messages if 'Signal' in message or 'Stop-flag' in message] == [
        'Stop-flag is set to True. Operator is stopping.',
        'Signal SIGTERM is received. Operator is stopping.',
    ]


async def test_signals_too_late_for_the_loop_are_known_as_after_the_operator() -> None:
    # E.g. a second Ctrl+C right when the operator's loop removes its handlers at the very end:
    # asyncio drops the signals whose handlers are gone when it reads their wake-ups (in its next iteration).
    signum = signal.SIGTERM
    handler_before = signal.getsignal(signum)
    loop = asyncio.get_running_loop()
    flag = asyncio.Event()
    supervision.reset_exit_requests()
    assert supervision.install_signal_handlers(loop, flag)
    try:
        os.kill(os.getpid(), signum)
        os.kill(os.getpid(), signum)
    finally:
        supervision.remove_signal_handlers(loop)  # no awaiting since the signals: the loop has not taken them
    for _ in range(5):  # the loop's next iterations read the signals' wake-ups: no handlers, they are dropped
        await asyncio.sleep(0)
    assert not flag.is_set()
    assert supervision.signal_after_operator()
    supervision.reset_exit_requests()
    assert not supervision.signal_after_operator()
    assert signal.getsignal(signum) is supervision._note_arrival  # noted only, while the loop runs
    supervision.operator_is_over()
    assert signal.getsignal(signum) == handler_before


# A repeated SIGINT after the operator has removed its loop's handlers, while its loop still runs (its last
# steps, the closing of its async generators): Python's default handler would raise KeyboardInterrupt into the
# loop, where uvloop loses it (the process then waited for the sync handlers' threads, asked twice to exit).
# In a subprocess: the KeyboardInterrupt must not hit the test runner itself.
SIGNAL_AFTER_REMOVAL = '''
import asyncio, os, signal, sys
from kopf._core.reactor import supervision

async def main():
    loop = asyncio.get_running_loop()
    flag = asyncio.Event()
    assert supervision.install_signal_handlers(loop, flag)
    os.kill(os.getpid(), signal.SIGINT)
    await flag.wait()  # the first one, taken by the loop
    supervision.remove_signal_handlers(loop)
    os.kill(os.getpid(), signal.SIGINT)  # the second one: too late for the operator, but the loop still runs
    for _ in range(5):
        await asyncio.sleep(0.01)
    print('lost' if supervision.signal_after_operator() else 'not lost')
    supervision.operator_is_over()
    print('default' if signal.getsignal(signal.SIGINT) is signal.default_int_handler else 'not default')

if sys.argv[1] == 'uvloop':
    import uvloop
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
asyncio.run(main())
'''


@pytest.mark.parametrize('loop', ['asyncio', 'uvloop'])
def test_a_repeated_signal_while_the_loop_runs_on_is_noted_not_raised_into_it(loop: str) -> None:
    if loop == 'uvloop':
        pytest.importorskip('uvloop')
    result = subprocess.run([sys.executable, '-c', SIGNAL_AFTER_REMOVAL, loop],
                            capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout.split(), result.stderr) == (0, ['lost', 'default'], '')



class _LoopLeavingSignalHandlers(asyncio.SelectorEventLoop):
    """A loop that forgets its signal handlers but leaves the Python-level ones (as uvloop does)."""

    def remove_signal_handler(self, sig: int) -> bool:
        handler = signal.getsignal(sig)
        removed = super().remove_signal_handler(sig)
        signal.signal(sig, handler)
        return removed


def test_the_default_handlers_are_restored_whatever_the_loop_leaves() -> None:
    # Otherwise, a repeated Ctrl+C after the operator's exit would only be counted, not interrupting anything.
    loop = _LoopLeavingSignalHandlers()
    try:
        assert supervision.install_signal_handlers(loop, asyncio.Event())
        assert signal.getsignal(signal.SIGINT) is supervision._note_arrival
        supervision.remove_signal_handlers(loop)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        loop.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
