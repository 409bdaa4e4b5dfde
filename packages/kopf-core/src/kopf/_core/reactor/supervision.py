"""
Supervising the operator's tasks: the stop requests (flags, signals), the ultimate exit, stopping tasks.

The signals are handled only when the operator runs in the main thread. The first signal
starts a graceful exit; the next one is handled by Python's defaults (e.g. ``KeyboardInterrupt``),
which ends the operator the hard way. If a graceful exit takes longer than
``settings.process.ultimate_exiting_timeout``, the operator's remaining activities are cancelled.
"""
import asyncio
import logging
import signal
import threading
from collections.abc import Iterable
from typing import Any

from kopf._core.intents.configuration import OperatorSettings
from kopf._core.reactor import flags

__all__ = [
    'describe_task',
    'install_signal_handlers',
    'stop_flag_checker',
    'stop_tasks',
]

logger = logging.getLogger('kopf._core.reactor.running')  # as before the split (and as Kopf names it)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def stop_flag_checker(
        *,
        stop_flag: flags.Flag | None,
        signal_flag: asyncio.Event,
        runner: asyncio.Task[None],
        settings: OperatorSettings,
        loop: asyncio.AbstractEventLoop | None,
) -> None:
    """Exit when a stop is requested (and so make :func:`run_tasks` stop the operator)."""
    waiters = [asyncio.create_task(signal_flag.wait(), name='signal waiter')]
    if stop_flag is not None:
        waiters.append(asyncio.create_task(flags.wait_flag(stop_flag), name='stop-flag waiter'))
    try:
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if waiters[0] not in done:
            value = waiters[-1].result()
            logger.info(f'Stop-flag is set to {value!r}. Operator is stopping.')
        schedule_ultimate_exit(runner, settings.process.ultimate_exiting_timeout)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.wait(waiters)
        if loop is not None:
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
    try:
        for signum in SIGNALS:
            loop.add_signal_handler(signum, _on_signal, loop, flag, signum)
    except (NotImplementedError, RuntimeError, ValueError):  # e.g. non-Unix loops, or foreign loops.
        remove_signal_handlers(loop)
        return False
    return True


def remove_signal_handlers(loop: asyncio.AbstractEventLoop) -> None:
    for signum in SIGNALS:
        try:
            loop.remove_signal_handler(signum)
        except (NotImplementedError, RuntimeError, ValueError):
            pass


def _on_signal(loop: asyncio.AbstractEventLoop, flag: asyncio.Event, signum: signal.Signals) -> None:
    logger.info(f'Signal {signum.name} is received. Operator is stopping.')
    flag.set()
    # The next signal gets Python's default reaction (e.g. KeyboardInterrupt): the hard way out.
    remove_signal_handlers(loop)


async def stop_tasks(
        tasks: Iterable[asyncio.Task[Any]],
        *,
        title: str | None,
        grace: float | None = None,
) -> None:
    """Cancel the tasks (after a grace period, if given) and wait until they are done."""
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
    name = task.get_name()
    return name[:1].upper() + name[1:]
