"""
What runs for one object (its daemons and timers: the per-object records), and the steps they share.

Below both engines: the daemons (:mod:`.daemons`) and the timers (:mod:`.timers`) import this module,
never each other. The spawning engine (:mod:`.spawning`) keeps one :class:`ObjectSpawns` per object
in the reactor's memory of the object (``memory.spawns``), and both engines keep their records there:

* :class:`Daemon`: a daemon's task, its stop-flag (:class:`DaemonStopper`), its stopping sequence's state;
* :class:`Timer`: a timer's schedule and retrying state (no task while it waits).

The shared steps: a handler's initial delay (:func:`initial_delay_of`), and one call of a daemon's
or timer's function with its patch and result applied to the object (:func:`execute_and_apply`).
The records are small slotted objects: there can be many thousands of idle objects.
"""
import asyncio
import enum
import threading
from collections.abc import Callable, Mapping
from typing import Any, cast

from kopf._clients.errors import APIConflictError, APIError, APIUnprocessableEntityError
from kopf._clients.vault import Vault
from kopf._cogs.aiokits.capacity import Hold
from kopf._cogs.helpers.typedefs import Logger
from kopf._cogs.structs import dicts
from kopf._cogs.structs.bodies import Body, RawBody, is_newer_version, version_of
from kopf._cogs.structs.patches import Patch, PatchFn
from kopf._cogs.structs.references import Resource
from kopf._core.actions import application, execution, loggers
from kopf._core.actions.progression import HandlerState, Outcome
from kopf._core.intents.causes import ResourceSpawningCause
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import DaemonHandler, HandlerId, SpawningHandler, TimerHandler

__all__ = [
    'Daemon',
    'DaemonStopper',
    'DaemonStoppingReason',
    'ObjectSpawns',
    'Timer',
    'execute_and_apply',
    'initial_delay_of',
]


class DaemonStoppingReason(enum.Flag):
    """
    Why a daemon is being stopped (several reasons can be combined).

    The first five are the reasons to stop; the ``DAEMON_*`` ones are added as the stopping goes on:
    when the daemon is signalled, cancelled, abandoned.
    """

    DONE = enum.auto()  # the daemon has exited by itself
    FILTERS_MISMATCH = enum.auto()  # the object does not match the handler's filters anymore
    RESOURCE_DELETED = enum.auto()  # the object is being deleted (or is gone)
    OPERATOR_PAUSING = enum.auto()  # the operator stops serving the objects for a while (e.g. peering)
    OPERATOR_EXITING = enum.auto()  # the operator exits
    DAEMON_SIGNALLED = enum.auto()  # the daemon has been signalled, but not exited within its backoff
    DAEMON_CANCELLED = enum.auto()  # the daemon's task has been cancelled
    DAEMON_ABANDONED = enum.auto()  # the daemon has not exited in time and is left running


class DaemonStopper:
    """
    The stop-flag of one daemon: set once by the framework (the reasons accumulate), never cleared.

    It is seen both by the sync daemons in their threads and by the async ones in the event loop.
    The framework sets it in the event loop only.
    """

    __slots__ = ('_async_event', '_reason', '_sync_event')

    def __init__(self) -> None:
        super().__init__()
        self._reason: DaemonStoppingReason | None = None
        self._sync_event = threading.Event()
        self._async_event = asyncio.Event()

    def __repr__(self) -> str:
        return f'<{type(self).__name__}: {self._reason!r}>'

    @property
    def reason(self) -> DaemonStoppingReason | None:
        return self._reason

    def is_set(self) -> bool:
        return self._sync_event.is_set()

    def set(self, reason: DaemonStoppingReason) -> None:
        self._reason = reason if self._reason is None else self._reason | reason
        self._sync_event.set()
        self._async_event.set()

    async def wait(self, delay: float | None = None) -> bool:
        """Wait (in the event loop) until the flag is set or the delay is over; whether it is set."""
        if not self._async_event.is_set():
            try:
                async with asyncio.timeout(delay):
                    await self._async_event.wait()
            except TimeoutError:
                pass
        return self.is_set()


class ObjectSpawns:
    """
    What runs for one object: its daemons and timers, and the object's latest state for their kwargs.

    ``body`` is the live view given to the daemons & timers: it is replaced in place with every new
    state of the object, so that they always see the latest one (no copies are made).
    ``changed_at`` is when the object has changed last time (the loop's time): for the timers' idling.
    ``own_write`` is the latest patch of its daemons & timers whose echo has not come yet: its version (as the
    API has answered) and its fields, to be seen by their next call even if the echo is late (issue #40).
    ``owner`` is the engine that keeps the record (only compared: the records of other engines are not used,
    e.g. in the memories shared with a previous operator). The finished daemons & timers stay in the records
    (so that they are not started again) until the object stops matching their filters.
    """

    __slots__ = ('body', 'changed_at', 'daemons', 'memo', 'own_write', 'owner', 'resource', 'timers',
                 'waiters')

    def __init__(self, *, owner: object, body: Body, resource: Resource, memo: Any,
                 changed_at: float) -> None:
        super().__init__()
        self.owner = owner
        self.body = body
        self.resource = resource
        self.memo = memo
        self.changed_at = changed_at
        self.daemons: dict[HandlerId, Daemon] = {}
        self.timers: dict[HandlerId, Timer] = {}
        self.waiters: list[asyncio.Future[None]] | None = None
        self.own_write: tuple[str, Mapping[str, Any], bool] | None = None  # version, fields, whole?

    def __repr__(self) -> str:
        return f'<{type(self).__name__} daemons={list(self.daemons)} timers={list(self.timers)}>'

    @property
    def busy(self) -> bool:
        """Whether anything still runs for the object: the daemons (unless abandoned), the timers' calls."""
        return (any(daemon.running for daemon in self.daemons.values()) or
                any(timer.task is not None for timer in self.timers.values()))

    def transient_body(self) -> Body:
        """
        A view of the same live body for one call (e.g. of a timer), with its own nested views.

        The nested views (``spec``, ``meta``, ``status``, ...) are made on first use and kept
        with their body: for ``body`` itself, with the object for as long as it is watched, ~0.6 KB
        for every idle object with a timer. A transient body's views go away with the call.
        """
        return Body(self.body)

    def remember_own_write(self, patch: Patch, latest: RawBody) -> None:
        """
        Remember the patch of a daemon or timer as the API has answered it, until its echo comes (issue #40).

        Only its version and fields are kept (the patch's own dicts), not the response: until the echo, which
        usually comes within milliseconds, and then nothing has to be done at all. With transformation
        functions in the patch (their fields are unknown in advance), the response is kept instead.
        """
        version = version_of(latest)  # if the echo has come already, the next call finds it not newer
        if version is not None:
            self.own_write = (version, latest, True) if patch.fns else (version, dict(patch), False)

    def notice_state(self, raw_body: Mapping[str, Any]) -> None:
        """A new state of the object has arrived (an event): the own write is in it unless it is older."""
        self.body._replace_with(raw_body)
        if self.own_write is not None and not is_newer_version(self.own_write[0], version_of(raw_body)):
            self.own_write = None

    def see_own_write(self) -> None:
        """
        Before a call: if the echo of the latest own patch has not come (e.g. the watch-stream is down or
        lags), the live body gets the patched fields (and the version) the patch has made (issue #40).

        Only the dicts on the patched fields' paths are new (e.g. the top level, ``metadata``, ``status``):
        the rest is shared with the state of the latest event.
        """
        if self.own_write is None:
            return
        version, fields, whole = self.own_write  # kept until the echo: a late older event may come first
        raw = dicts.raw_mapping(self.body)
        if not is_newer_version(version, version_of(raw)):
            return
        if whole:  # the response as it is (the transformation functions' fields are unknown)
            self.body._replace_with(cast(RawBody, fields))
            return
        metadata = fields.get('metadata')
        merged = {**fields, 'metadata': {**(metadata if isinstance(metadata, Mapping) else {}),
                                         'resourceVersion': version}}
        self.body._replace_with(cast(RawBody, _merged(raw, merged)))

    def notify(self) -> None:
        """Wake up those waiting for the object's daemons & timers to exit (they check again)."""
        waiters, self.waiters = self.waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    async def wait_until_idle(self, *, within: float | None, wakeup: asyncio.Event | None) -> bool:
        """Wait until nothing runs for the object; False if the time is over or woken up earlier."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within if within is not None else None
        while self.busy:
            if wakeup is not None and wakeup.is_set():
                return False
            remaining = deadline - loop.time() if deadline is not None else None
            if remaining is not None and remaining <= 0:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            if self.waiters is None:
                self.waiters = []
            self.waiters.append(waiter)
            waiting: set[asyncio.Future[Any]] = {waiter}
            woken = asyncio.ensure_future(wakeup.wait()) if wakeup is not None else None
            if woken is not None:
                waiting.add(woken)
            try:
                await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                if woken is not None:
                    woken.cancel()
        return True


class Daemon:
    """One daemon of one object: the handler, the task, the stop-flag, the stopping sequence."""

    __slots__ = ('abandoned', 'calling', 'cancelled', 'exiting', 'handler', 'spawns', 'stopper', 'task',
                 'terminator')

    def __init__(self, *, handler: DaemonHandler, spawns: ObjectSpawns) -> None:
        super().__init__()
        self.handler = handler
        self.spawns = spawns
        self.stopper = DaemonStopper()
        self.task: asyncio.Task[None] | None = None
        self.terminator: asyncio.Task[None] | None = None
        self.abandoned = False
        self.exiting = False  # whether the stopping sequence is of the operator's exit (bounded in time)
        self.calling = False  # whether the daemon's function runs now (only then can it be cancelled)
        self.cancelled = False  # whether its stopping sequence has cancelled the function

    def __repr__(self) -> str:
        return f'<{type(self).__name__} {self.handler.id!r} running={self.running} stopper={self.stopper!r}>'

    @property
    def running(self) -> bool:
        """Whether the object must still wait for the daemon (it runs and is not abandoned)."""
        return self.task is not None and not self.task.done() and not self.abandoned


class Timer:
    """One timer of one object: its schedule and its retrying state (no task while it waits)."""

    __slots__ = ('due', 'finished', 'fns', 'handler', 'idle_mark', 'last_due', 'spawns', 'state', 'stopped',
                 'task')

    def __init__(self, *, handler: TimerHandler, spawns: ObjectSpawns) -> None:
        super().__init__()
        self.handler = handler
        self.spawns = spawns
        self.due: float | None = None  # the deadline of its only valid heap entry; None if not scheduled
        self.last_due: float | None = None  # the deadline of its latest call (for its lateness)
        self.task: asyncio.Task[None] | None = None  # only while the function runs
        self.state: HandlerState | None = None  # the retrying state since the last success, if any
        self.fns: list[PatchFn] | None = None  # the transformation functions to retry on the next call
        self.idle_mark: float | None = None  # the object's change that an idle-only timer has served
        self.stopped = False  # by the framework: the object is deleted, does not match, etc.
        self.finished = False  # failed for good, or a once-only timer has run: never again for this object

    def __repr__(self) -> str:
        return f'<{type(self).__name__} {self.handler.id!r} due={self.due} running={self.task is not None}>'


def initial_delay_of(
        handler: SpawningHandler,
        kwargs: Callable[[], Mapping[str, Any]],
        logger: Logger,
) -> float:
    """
    The handler's initial delay: as declared, or as its callback computes it from the handler's kwargs.

    A failing or misbehaving callback means no delay (it is logged): the handler is not lost because of it.
    """
    delay = handler.initial_delay
    if callable(delay):
        try:
            delay = delay(**kwargs())
            return max(0.0, float(delay)) if delay is not None else 0.0
        except Exception as e:
            logger.exception(f'The initial delay of {handler.id!r} has failed; starting with no delay: {e}')
            return 0.0
    return max(0.0, float(delay)) if delay is not None else 0.0


async def execute_and_apply(
        *,
        settings: OperatorSettings,
        vault: Vault,
        handler: SpawningHandler,
        cause: ResourceSpawningCause,
        state: HandlerState,
        logger: loggers.ObjectLogger,
        daemon: Daemon | None = None,
        calling: Callable[[], None] | None = None,
        called: Callable[[], None] | None = None,
        spawns: ObjectSpawns | None = None,
        seat: Hold | None = None,
) -> Outcome:
    """
    Call a daemon's or timer's function once (with the usual error handling), then apply its patch.

    ``calling`` is notified right before the function is called; ``called`` when the function is over,
    before its patch is applied (e.g. for the timers to measure their intervals from the function's end,
    not from the API's answer, and to know when the call is in the framework's own steps).

    ``spawns`` is the object's record: its calls see their own latest writes even if the echo is late
    (:meth:`ObjectSpawns.remember_own_write`, :meth:`ObjectSpawns.see_own_write`).

    ``seat`` is the call's place in the framework's own hands (e.g. the timers'): it is lent to others during
    the patch's retry backoffs, and in flight if its capacity lends so (:func:`kopf._clients.api.request`).

    The result goes to the status under the handler's id. The API errors of patching are logged, not raised:
    the daemon or timer goes on. If the transformation functions of the patch fail because the object
    has changed meanwhile, they are kept in the patch (for the timers to retry them on the next run).

    For a ``daemon``, only the function's own run can be cancelled by its stopping sequence: a cancelled
    function is over, but the framework's steps after it (e.g. applying its patch) are done as usual.
    """
    if spawns is not None:
        spawns.see_own_write()
    if daemon is not None:
        daemon.calling = True
    if calling is not None:
        calling()
    try:
        outcome = await execution.execute_handler_once(
            settings=settings, handler=handler, cause=cause, state=state, logger=logger)
    except asyncio.CancelledError:
        if daemon is None or not daemon.cancelled:
            raise
        outcome = Outcome(final=True)
    finally:
        if daemon is not None:
            daemon.calling = False
    if called is not None:
        called()
    patch = cause.patch
    execution.deliver_results(outcomes={handler.id: outcome}, patch=patch)
    if patch:
        try:
            # Only the version is remembered (the patch's own fields), unless the response is (with its fns).
            latest = await application.apply_patch(settings=settings, vault=vault, resource=cause.resource,
                                                   body=cause.body, patch=patch, logger=logger, seat=seat,
                                                   version_only=True)
            if spawns is not None and latest is not None:
                spawns.remember_own_write(patch, latest)  # the object writer never modifies the patch
        except (APIConflictError, APIUnprocessableEntityError) as e:
            if patch.fns:
                logger.warning(f'The patch of {handler.id!r} has failed; its transformation functions '
                               f'will be retried on the next run: {e}')
                fns = list(patch.fns)
                patch.clear()
                patch.fns[:] = fns
                return outcome
            logger.exception(f'The patch of {handler.id!r} has failed: {e}')
        except APIError as e:
            logger.exception(f'The patch of {handler.id!r} has failed: {e}')
        patch.clear()
        patch.fns.clear()
    return outcome


def _merged(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """A shallow copy of ``base`` with a merge-patch applied (RFC 7386: None removes), its paths copied."""
    result = dict(base)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping):
            old = result.get(key)
            result[key] = _merged(old if isinstance(old, Mapping) else {}, value)
        else:
            result[key] = value
    return result
