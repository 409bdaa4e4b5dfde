"""
Spawning: which daemons & timers run for which objects; one engine per operator for both.

The processing calls :meth:`SpawningEngine.process` on every event of every object of the resources
with daemons or timers (it is cheap: no API calls, no waiting). For every such event:

* the object's latest state is remembered (the daemons & timers see it via their live ``body`` etc.);
* if the object is being deleted or is gone, all its daemons are stopped (``RESOURCE_DELETED``) and
  its timers stop ticking; the processing keeps our finalizer on the object until they exit
  (:meth:`SpawningEngine.wait_until_idle`), so that the object is not gone while they run;
* otherwise, the handlers' filters are evaluated against the object as it is now: the matching
  daemons & timers are started if they do not run yet (a daemon that is still stopping is not
  started again until it exits); those that do not match anymore are stopped (``FILTERS_MISMATCH``).

A daemon that has exited by itself, or a timer that has failed for good, is not started again for
the object until it stops matching its filters (or the operator restarts).

The whole engine can be paused (all the daemons stopped with ``OPERATOR_PAUSING``, all the timers
stopped) and resumed (everything started again as if the objects were new), e.g. for peering;
and shut down when the operator exits (``OPERATOR_EXITING``): nothing is left running after that.
"""
import asyncio
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from kopf._clients.vault import Vault
from kopf._cogs.helpers import metering
from kopf._cogs.helpers.typedefs import Logger
from kopf._cogs.structs.bodies import Body, RawBody
from kopf._cogs.structs.patches import Patch
from kopf._cogs.structs.references import Resource
from kopf._core.actions import loggers
from kopf._core.engines.daemons import Daemons
from kopf._core.engines.spawns import DaemonStoppingReason, ObjectSpawns
from kopf._core.engines.timers import Timers
from kopf._core.intents.causes import ResourceSpawningCause
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import DaemonHandler, HandlerId, SpawningHandler, TimerHandler
from kopf._core.intents.registries import OperatorRegistry
from kopf._core.persistence.finalizers import is_deletion_ongoing

__all__ = ['SpawningEngine', 'daemon_killer']

class ObjectMemory(Protocol):
    """What the engine needs of the object's in-memory state (the reactor's memory of the object)."""

    memo: Any
    spawns: ObjectSpawns | None  # the place for the engine's own record of the object


class SpawningEngine:
    """The daemons and timers of one operator (see the module's description)."""

    def __init__(
            self,
            *,
            registry: OperatorRegistry,
            settings: OperatorSettings,
            vault: Vault,
            indices: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.registry = registry
        self.settings = settings
        self.indices: Mapping[str, Any] = indices if indices is not None else {}
        self.daemons = Daemons(settings=settings, vault=vault, indices=self.indices)
        self.timers = Timers(settings=settings, vault=vault, indices=self.indices)
        self._objects: dict[int, ObjectSpawns] = {}  # by id(): for pausing & resuming
        # The resources whose daemons & timers have no filters (as of these handlers of the registry).
        self._unfiltered: dict[Resource, tuple[tuple[SpawningHandler, ...],
                                               tuple[tuple[SpawningHandler, ...], bool] | None]] = {}
        self._paused = False
        self._closed = False
        # The daemons & timers as gauges, read when the metrics are scraped (nothing per event).
        meters = metering.meters
        self._unmeter = meters.add_gauges(self._gauges) if meters is not None else None

    @property
    def paused(self) -> bool:
        return self._paused

    def process(
            self,
            *,
            memory: ObjectMemory,
            resource: Resource,
            raw_body: RawBody,
            gone: bool,
            logger: Logger | None = None,
            received_at: float | None = None,
    ) -> bool:
        """
        React to an event of the object: remember its state, start or stop its daemons & timers.

        ``logger`` is the object's, for the handlers' filters (made from the object's body if needed and
        not given: usually it is not needed, e.g. for the echo of every timer's patch). ``received_at`` is
        when the event has arrived (the loop's time), if known: a new object's timers count their
        ``initial_delay`` (and the idle ones their quiet period) from when the object became visible to the
        operator, not from when its processing could start (e.g. the last of 10,000 listed objects is
        processed seconds after the first).

        Returns whether any of its daemons & timers that keep the object from deletion matches it now
        (i.e. whether our finalizer is needed while the object lives), so that nobody re-evaluates it.
        """
        spawns = memory.spawns
        if spawns is not None and spawns.owner is not self:
            spawns = None  # e.g. memories shared with a previous operator: its records are not ours.

        deleted = gone or is_deletion_ongoing(raw_body)
        now = asyncio.get_running_loop().time()
        if received_at is not None and received_at < now:
            now = received_at
        if spawns is None:
            if deleted or self._closed:
                return False
            spawns = ObjectSpawns(owner=self, body=Body(raw_body), resource=resource, memo=memory.memo,
                                  changed_at=now)
            memory.spawns = spawns
            self._objects[id(spawns)] = spawns
        else:
            spawns.notice_state(raw_body)
            spawns.changed_at = now

        if deleted:
            self._stop_everything(spawns, DaemonStoppingReason.RESOURCE_DELETED)
            if gone:
                memory.spawns = None
                self._objects.pop(id(spawns), None)
            return False
        elif not self._paused and not self._closed:
            needed = self._respawn(spawns, logger=logger, since=now)
            self.timers.notice_change(spawns)
            return needed
        else:
            return self._requires_finalizer(spawns, logger=logger)

    async def wait_until_idle(
            self,
            memory: ObjectMemory,
            *,
            within: float | None = None,
            wakeup: asyncio.Event | None = None,
    ) -> bool:
        """
        Wait until the object's daemons have exited (or are abandoned), and its timers' calls are over.

        True if nothing runs for the object anymore; False if the time is over, or if woken up earlier
        (e.g. by a new event of the object).
        """
        spawns = memory.spawns
        if spawns is None or spawns.owner is not self:
            return True
        return await spawns.wait_until_idle(within=within, wakeup=wakeup)

    async def pause(self) -> None:
        """Stop all the daemons (``OPERATOR_PAUSING``) and timers until resumed; wait until they exit."""
        self._paused = True
        for spawns in list(self._objects.values()):
            for timer in list(spawns.timers.values()):
                self.timers.stop(timer)
            for daemon in list(spawns.daemons.values()):
                if daemon.stopper.reason == DaemonStoppingReason.DONE:
                    del spawns.daemons[daemon.handler.id]  # exited before: it can run again after the pause
        await self.daemons.stop_all(DaemonStoppingReason.OPERATOR_PAUSING)
        await asyncio.gather(*(spawns.wait_until_idle(within=None, wakeup=None)
                               for spawns in list(self._objects.values())))

    def resume(self, *, respawn: bool = True) -> None:
        """
        Start the daemons & timers of all the known objects again, as if the objects were new.

        With ``respawn=False``, only unpause: the objects' next events start them (e.g. when the watch-streams
        list the objects anew after a pause, so that the objects deleted meanwhile are not revived).
        """
        if self._closed or not self._paused:
            return
        self._paused = False
        if not respawn:
            return
        for spawns in list(self._objects.values()):
            self._respawn(spawns, logger=None)

    async def disown(self, disowned: Callable[[str], bool]) -> None:
        """
        Stop the daemons (``OPERATOR_PAUSING``) & timers of the objects given away (by their uids), e.g. to
        another replica (the sharding); forget their records; wait until they exit (the callers bound it).
        """
        released: list[ObjectSpawns] = []
        for key, spawns in list(self._objects.items()):
            uid = spawns.body.get('metadata', {}).get('uid')
            if uid and disowned(uid):
                self._stop_everything(spawns, DaemonStoppingReason.OPERATOR_PAUSING)
                del self._objects[key]
                released.append(spawns)
        await asyncio.gather(*(spawns.wait_until_idle(within=None, wakeup=None) for spawns in released))

    async def shutdown(self) -> None:
        """Stop everything for good (``OPERATOR_EXITING``): nothing of this engine runs after this."""
        self._closed = True
        if self._unmeter is not None:
            self._unmeter()
        for spawns in list(self._objects.values()):
            for timer in list(spawns.timers.values()):
                self.timers.stop(timer)
        await self.timers.stop_all()
        await self.daemons.stop_all(DaemonStoppingReason.OPERATOR_EXITING, exiting=True)
        for spawns in list(self._objects.values()):
            spawns.notify()
        self._objects.clear()

    def _gauges(self) -> Iterator[tuple[str, dict[str, str], float]]:
        daemons: dict[str, int] = {}
        timers: dict[tuple[str, str], int] = {}
        for spawns in list(self._objects.values()):
            resource = spawns.resource
            name = f'{resource.plural}.{resource.group}' if resource.group else resource.plural
            running = sum(1 for daemon in spawns.daemons.values() if daemon.running)
            if running or spawns.daemons:
                daemons[name] = daemons.get(name, 0) + running
            for timer in spawns.timers.values():
                state = 'running' if timer.task is not None else 'scheduled' if timer.due is not None else ''
                if state:
                    timers[name, state] = timers.get((name, state), 0) + 1
        for name, count in daemons.items():
            yield 'kopf_daemons_running', {'resource': name}, count
        for (name, state), count in timers.items():
            yield 'kopf_timers', {'resource': name, 'state': state}, count

    def _stop_everything(self, spawns: ObjectSpawns, reason: DaemonStoppingReason) -> None:
        for timer in list(spawns.timers.values()):
            self.timers.stop(timer)
        for daemon in list(spawns.daemons.values()):
            if daemon.running:
                self.daemons.stop(daemon, reason)
            elif daemon.task is not None and daemon.task.done():
                del spawns.daemons[daemon.handler.id]

    def _unfiltered_handlers(self, resource: Resource) -> tuple[tuple[SpawningHandler, ...], bool] | None:
        """The resource's daemons & timers and if any needs our finalizer; None if any of them has filters."""
        handlers = self.registry.spawning.get_resource_handlers(resource)
        known = self._unfiltered.get(resource)
        if known is not None and known[0] is handlers:  # the same tuple unless the registry has changed
            return known[1]
        unfiltered: tuple[tuple[SpawningHandler, ...], bool] | None = None
        if all(not handler.labels and not handler.annotations and handler.when is None and not handler.field
               for handler in handlers):
            unfiltered = handlers, any(handler.requires_finalizer for handler in handlers)
        self._unfiltered[resource] = (handlers, unfiltered)
        return unfiltered

    def _requires_finalizer(self, spawns: ObjectSpawns, *, logger: Logger | None) -> bool:
        return self.registry.spawning.requires_finalizer(self._make_cause(spawns, logger=logger))

    def _make_cause(self, spawns: ObjectSpawns, *, logger: Logger | None) -> ResourceSpawningCause:
        if logger is None:
            logger = loggers.LocalObjectLogger(body=spawns.body, settings=self.settings)
        return ResourceSpawningCause(resource=spawns.resource, body=spawns.transient_body(), logger=logger,
                                     patch=Patch(body=spawns.body), memo=spawns.memo, indices=self.indices)

    def _respawn(self, spawns: ObjectSpawns, *, logger: Logger | None, since: float | None = None) -> bool:
        """
        Start the matching daemons & timers that do not run yet; stop those that do not match anymore.

        ``since`` is when the object became matching (its event's arrival); the new timers count from it.

        Returns whether any of the matching ones keeps the object from deletion (needs our finalizer).
        """
        # The usual case on every event (e.g. the echo of every timer's patch): with no filters,
        # all the handlers match always, and once all of them have their records, nothing changes.
        unfiltered = self._unfiltered_handlers(spawns.resource)
        if unfiltered is not None:
            handlers, needs_finalizer = unfiltered
            if len(spawns.daemons) + len(spawns.timers) == len(handlers):
                return needs_finalizer

        cause = self._make_cause(spawns, logger=logger)
        matching: set[HandlerId] = set()
        needs_finalizer = False
        for handler in self.registry.spawning.iter_handlers(cause):
            matching.add(handler.id)
            needs_finalizer = needs_finalizer or bool(handler.requires_finalizer)
            if isinstance(handler, DaemonHandler) and handler.id not in spawns.daemons:
                self.daemons.spawn(spawns, handler)
            elif isinstance(handler, TimerHandler) and handler.id not in spawns.timers:
                self.timers.start(spawns, handler, since=since)

        for handler_id, daemon in list(spawns.daemons.items()):
            if handler_id not in matching:
                if daemon.running:
                    self.daemons.stop(daemon, DaemonStoppingReason.FILTERS_MISMATCH)
                else:
                    del spawns.daemons[handler_id]  # e.g. exited by itself: it can run again when matching
        for handler_id, timer in list(spawns.timers.items()):
            if handler_id not in matching:
                self.timers.stop(timer)
        return needs_finalizer


async def daemon_killer(engine: SpawningEngine) -> None:
    """
    A core task of the operator: it does nothing until cancelled, then shuts the engine down.

    This way, the operator stops the daemons & timers in its usual order of stopping the core tasks:
    after the watchers (no new objects come), but before the credentials and the events' poster
    (so that the daemons can still patch the objects and post their last messages).
    """
    try:
        await asyncio.Event().wait()
    finally:
        await engine.shutdown()
