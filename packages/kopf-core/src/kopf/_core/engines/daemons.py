"""
Daemons: a long-running function per object and handler (``@kopf.daemon``), and the stop-flag they get.

A daemon is an asyncio task for as long as its object exists and matches the handler's filters
(see :mod:`.spawning` for when the daemons are spawned and stopped). Inside the task, the function
is called; if it fails, it is called again per the usual error handling (``errors=``, ``retries=``,
``timeout=``, ``backoff=``, :class:`kopf.TemporaryError` delays), with ``retry``, ``started``,
``runtime`` kwargs. If it returns (or fails for good, or its errors are ignored), it is not called
again for that object in this operator process. After every call, its ``patch`` and its result
(into the status, under the handler's id) are applied to the object.

Stopping a daemon is a sequence, not a single action:

1. the ``stopped`` kwarg is set; the daemon gets ``cancellation_backoff`` seconds to exit by itself;
2. if ``cancellation_timeout`` is set, an async daemon is cancelled (a sync one cannot be) and gets
   that many seconds more to exit; if it still runs, it is abandoned: a ``ResourceWarning`` is issued,
   and the object is no longer held for it (e.g. its finalizer is released);
3. without ``cancellation_timeout``, the daemon is waited for as long as it takes, with a log message
   every ``cancellation_polling`` seconds (``settings.background.cancellation_polling`` by default).

When the operator exits, the daemons that are not stopped gracefully within :data:`EXIT_GRACE`
(those with no cancellation timeout) are cancelled or abandoned too, so that nothing is left behind.

The records (in :mod:`.spawns`, below the daemons and the timers) are small slotted objects: a daemon
costs its task, its stop-flag, and little else.
"""
import asyncio
import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

from kopf._clients.vault import Vault
from kopf._cogs.structs.patches import Patch
from kopf._core.actions import invocation, loggers
from kopf._core.actions.progression import HandlerState, Outcome, handler_kwargs
from kopf._core.engines.spawns import (
    Daemon,
    DaemonStopper,
    DaemonStoppingReason,
    ObjectSpawns,
    execute_and_apply,
    initial_delay_of,
)
from kopf._core.intents.causes import ResourceSpawningCause
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import DaemonHandler

__all__ = [
    'EXIT_GRACE',
    'AsyncDaemonStopperChecker',
    'Daemon',  # the records are in .spawns (below the daemons and timers), these names are kept here too
    'DaemonStopped',
    'DaemonStopper',
    'DaemonStoppingReason',
    'Daemons',
    'SyncDaemonStopperChecker',
]

# How long a daemon with no cancellation timeout gets to exit by itself when the operator exits;
# after that, it is cancelled (async) or abandoned (sync), as if its cancellation timeout were over.
EXIT_GRACE = 5.0

# How long an async daemon gets to finish after its cancellation on the operator's exit (see above).
EXIT_CANCELLATION_GRACE = 1.0


class DaemonStopped:
    """
    The ``stopped`` kwarg of the daemons: whether the daemon must exit, and why.

    It is true when the daemon must exit (``while not stopped: ...``). The sync daemons get
    :class:`SyncDaemonStopperChecker` (``stopped.wait(10)`` instead of ``time.sleep(10)``),
    the async ones get :class:`AsyncDaemonStopperChecker` (``await stopped.wait(10)``).
    """

    __slots__ = ('_stopper',)

    def __init__(self, stopper: DaemonStopper) -> None:
        super().__init__()
        self._stopper = stopper

    def __repr__(self) -> str:
        state = f'stopped: {self.reason!r}' if self.is_set() else 'not stopped'
        return f'<{type(self).__name__}: {state}>'

    def __bool__(self) -> bool:
        return self._stopper.is_set()

    def is_set(self) -> bool:
        return self._stopper.is_set()

    @property
    def reason(self) -> DaemonStoppingReason | None:
        """Why the daemon is stopped (None while it is not)."""
        return self._stopper.reason

    def wait(self, timeout: float | None = None) -> Any:
        """Sleep until stopped or the timeout is over: a bool (sync daemons), an awaitable (async ones)."""
        raise NotImplementedError


class SyncDaemonStopperChecker(DaemonStopped):
    """The ``stopped`` kwarg of the sync daemons (running in threads)."""

    __slots__ = ()

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until the daemon is stopped or the timeout is over; return whether it is stopped."""
        return self._stopper._sync_event.wait(timeout)


class AsyncDaemonStopperChecker(DaemonStopped):
    """The ``stopped`` kwarg of the async daemons (running in the event loop)."""

    __slots__ = ()

    async def wait(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109  (as threading.Event)
        """Sleep until the daemon is stopped or the timeout is over; return whether it is stopped."""
        return await self._stopper.wait(timeout)


@dataclasses.dataclass(kw_only=True)
class DaemonCause(ResourceSpawningCause):
    """The daemons' kwargs: those of any object's handler, plus ``stopped``."""

    stopped: DaemonStopped

    def _own_kwargs(self) -> dict[str, Any]:
        kwargs = super()._own_kwargs()
        kwargs['stopped'] = self.stopped
        return kwargs


class Daemons:
    """
    All the daemons of one operator: spawning, the guarded runs, the stopping sequences.

    Which daemons to spawn or stop for which objects is decided by the caller (see :mod:`.spawning`).
    """

    def __init__(self, *, settings: OperatorSettings, vault: Vault, indices: Mapping[str, Any]) -> None:
        super().__init__()
        self.settings = settings
        self.vault = vault
        self.indices = indices
        self._daemons: set[Daemon] = set()  # those that run, incl. the stopping & abandoned ones

    def __len__(self) -> int:
        return len(self._daemons)

    def spawn(self, spawns: ObjectSpawns, handler: DaemonHandler) -> Daemon:
        """Start a daemon for the object (the caller ensures there is none of this handler already)."""
        daemon = Daemon(handler=handler, spawns=spawns)
        meta = spawns.body.metadata
        name = f'daemon {handler.id!r} of {meta.namespace + "/" if meta.namespace else ""}{meta.name}'
        daemon.task = asyncio.create_task(self._run(daemon), name=name)
        # Normally, the daemon cleans up after itself; but a task cancelled before it starts runs no code.
        daemon.task.add_done_callback(lambda _: self._daemons.discard(daemon))
        spawns.daemons[handler.id] = daemon
        self._daemons.add(daemon)
        return daemon

    def stop(self, daemon: Daemon, reason: DaemonStoppingReason, *, exiting: bool = False) -> None:
        """
        Signal the daemon to stop and start its stopping sequence (once; the reasons accumulate).

        On the operator's exit, a sequence started before (e.g. when the object was deleted) is restarted
        in the exiting mode, so that it ends in a bounded time even if it would poll the daemon forever.
        """
        daemon.stopper.set(reason)
        task, terminator = daemon.task, daemon.terminator
        if task is None or task.done() or daemon.abandoned:
            return
        if terminator is not None and not (exiting and not daemon.exiting and not terminator.done()):
            return
        if terminator is not None:
            terminator.cancel()
        daemon.exiting = exiting
        daemon.terminator = asyncio.create_task(self._terminate(daemon, exiting=exiting),
                                                name=f'stopper of {task.get_name()}')

    async def stop_all(self, reason: DaemonStoppingReason, *, exiting: bool = False) -> None:
        """Stop all the daemons and wait until they exit (or are abandoned)."""
        daemons = list(self._daemons)
        for daemon in daemons:
            daemon.stopper.set(reason)

        # The daemons that react to the flag instantly need no stopping sequences (a faster exit).
        if exiting:
            for _ in range(self.settings.background.instant_exit_zero_time_cycles):
                if not any(daemon.running for daemon in daemons):
                    break
                await asyncio.sleep(0)
            timeout = self.settings.background.instant_exit_timeout
            tasks = [daemon.task for daemon in daemons if daemon.running and daemon.task is not None]
            if timeout is not None and tasks:
                await asyncio.wait(tasks, timeout=timeout)

        for daemon in daemons:
            self.stop(daemon, reason, exiting=exiting)
        terminators = [daemon.terminator for daemon in daemons if daemon.terminator is not None]
        if terminators:
            await asyncio.wait(terminators)

    async def _run(self, daemon: Daemon) -> None:
        """The daemon's whole life: the initial delay, the calls with retries, the exit."""
        handler, spawns, stopper = daemon.handler, daemon.spawns, daemon.stopper
        title = f'Daemon {handler.id!r}'
        logger = loggers.ObjectLogger(body=spawns.body, settings=self.settings)
        is_async = invocation.is_async_fn(handler.fn)
        checker = AsyncDaemonStopperChecker(stopper) if is_async else SyncDaemonStopperChecker(stopper)
        state = HandlerState.from_scratch()
        outcome: Outcome | None = None
        try:
            delay = initial_delay_of(handler, lambda: {**handler_kwargs(state),
                                                       **self._make_cause(daemon, checker, logger)
                                                       .kwargs_for(handler)}, logger)
            if delay > 0:
                logger.debug(f'{title} is postponed by its initial delay of {delay} seconds.')
                await stopper.wait(delay)

            while not stopper.is_set():
                cause = self._make_cause(daemon, checker, logger)
                try:
                    outcome = await execute_and_apply(settings=self.settings, vault=self.vault,
                                                      handler=handler, cause=cause, state=state,
                                                      logger=logger, daemon=daemon, spawns=spawns)
                except Exception as e:  # not the function's failures (they are outcomes), but the framework's
                    logger.exception(f'{title} has failed unexpectedly: {e}')
                    backoff = handler.backoff
                    delay = backoff if backoff is not None else self.settings.execution.default_backoff
                    outcome = Outcome(final=False, delay=delay, exception=e)
                state = state.with_outcome(outcome)
                if outcome.final or stopper.is_set():
                    break
                delay = outcome.delay or 0
                if delay > 0:
                    logger.debug(f'{title} will be restarted in {delay} seconds.')
                await stopper.wait(delay)

            if daemon.cancelled:
                logger.warning(f'{title} is cancelled and will not be retried or restarted.')
            elif stopper.is_set():
                logger.debug(f'{title} has exited on request and will not be retried or restarted.')
            elif outcome is not None and outcome.exception is not None:
                logger.debug(f'{title} has exited after a permanent failure '
                            f'and will not be retried or restarted.')
            else:
                logger.debug(f'{title} has exited on its own and will not be retried or restarted.')

        except asyncio.CancelledError:
            if not stopper.is_set():
                raise  # not our own cancellation: e.g. of the hung tasks by the operator.
            logger.warning(f'{title} is cancelled and will not be retried or restarted.')

        finally:
            self._daemons.discard(daemon)
            if not stopper.is_set():
                stopper.set(DaemonStoppingReason.DONE)
                # An exited daemon stays in the object's records: it is not spawned again for the object.
            elif spawns.daemons.get(handler.id) is daemon:
                # A stopped daemon is forgotten: it can be spawned again (e.g. when the filters match again).
                del spawns.daemons[handler.id]
            spawns.notify()

    def _make_cause(self, daemon: Daemon, checker: DaemonStopped,
                    logger: loggers.ObjectLogger) -> DaemonCause:
        spawns = daemon.spawns
        return DaemonCause(resource=spawns.resource, body=spawns.body, patch=Patch(body=spawns.body),
                           logger=logger, memo=spawns.memo, indices=self.indices, stopped=checker)

    async def _terminate(self, daemon: Daemon, *, exiting: bool) -> None:
        """The stopping sequence of a daemon that has been signalled (see the module's description)."""
        task = daemon.task
        if task is None:
            return
        handler = daemon.handler
        title = f'Daemon {handler.id!r}'
        logger = loggers.LocalObjectLogger(body=daemon.spawns.body, settings=self.settings)
        is_async = invocation.is_async_fn(handler.fn)
        backoff = handler.cancellation_backoff
        timeout = handler.cancellation_timeout
        polling = handler.cancellation_polling or self.settings.background.cancellation_polling

        if backoff:
            await asyncio.wait([task], timeout=backoff)
            if task.done():
                return
            daemon.stopper.set(DaemonStoppingReason.DAEMON_SIGNALLED)  # and it has not reacted in time

        # On the operator's exit, nothing must be left running: the forced stopping is for all daemons.
        if timeout is None and exiting:
            await asyncio.wait([task], timeout=EXIT_GRACE)
            if task.done():
                return
            timeout = EXIT_CANCELLATION_GRACE

        if timeout is not None:
            # Only the function itself is cancelled; the framework's own steps (e.g. the patch) finish.
            if is_async and daemon.calling:
                logger.debug(f'{title} has not exited in time; cancelling it.')
                daemon.stopper.set(DaemonStoppingReason.DAEMON_CANCELLED)
                daemon.cancelled = True
                task.cancel()
            await asyncio.wait([task], timeout=timeout)
            if task.done():
                return
            daemon.stopper.set(DaemonStoppingReason.DAEMON_ABANDONED)
            daemon.abandoned = True
            logger.warning(f'{title} did not exit in time. Leaving it orphaned.')
            warnings.warn(f'{title} did not exit in time and is left running (orphaned).',
                          ResourceWarning, stacklevel=1)
            daemon.spawns.notify()
            return

        while not task.done():
            await asyncio.wait([task], timeout=polling)
            if not task.done():
                logger.warning(f'{title} has not exited yet after being stopped; '
                               f'checking again in {polling} seconds.')

