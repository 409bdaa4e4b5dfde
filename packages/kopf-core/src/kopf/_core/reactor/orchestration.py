"""
Orchestration of the watchers: one task per (resource, namespace) that needs watching, no more, no less.

The orchestrator follows the :class:`~kopf._core.reactor.observation.Insights`: when a resource
or a served namespace appears, it starts a watcher; when it disappears, it stops the watcher
(which lets its objects' workers finish gracefully). Cluster-scoped resources, and all resources
in the cluster-wide mode, are watched with one cluster-wide stream each; namespaced resources
are watched in every served namespace separately.
"""
import asyncio
import logging
from collections.abc import Callable, Collection, Coroutine
from typing import Any, Protocol

from kopf._cogs.structs.references import Resource
from kopf._core.engines.gating import HandlingGate
from kopf._core.reactor.observation import Insights

logger = logging.getLogger(__name__)

# Where to watch: a resource in a namespace, or cluster-wide (None).
WatchingKey = tuple[Resource, str | None]

# How to watch: a coroutine to run for a resource in a namespace (until cancelled).
WatcherFactory = Callable[[Resource, str | None], Coroutine[Any, Any, None]]


class Pausable(Protocol):
    """What else pauses & resumes with the watchers (the daemons & timers)."""

    async def pause(self) -> None: ...

    def resume(self) -> None: ...


class Rewatching:
    """
    The requests to start all the watch-streams anew, e.g. when the objects this replica handles change
    (the sharding): the new listings see the newly handled objects as new ones.
    """

    def __init__(self) -> None:
        super().__init__()
        self.requested = 0  # how many requests so far (a generation)
        self.completed = 0  # the latest generation whose previous watch-streams are stopped
        self.closed = False  # the orchestrator has exited: no watch-streams run, none will
        self._changed = asyncio.Event()

    @property
    def pending(self) -> bool:
        return self.completed < self.requested

    async def rewatch(self) -> None:
        """Request it, and wait until the watch-streams that ran before the request are stopped."""
        self.requested += 1
        generation = self.requested
        self._notify()
        while self.completed < generation and not self.closed:
            await self.wait_for_change(since=None)

    def close(self) -> None:
        """No watch-streams run anymore (the orchestrator has exited): the requests are done at once."""
        self.closed = True
        self._notify()

    def complete(self, generation: int) -> None:
        """The watch-streams that ran before this generation of requests are stopped (the new ones start)."""
        if generation > self.completed:
            self.completed = generation
            self._notify()

    async def wait_for_change(self, *, since: int | None) -> None:
        """Wait for a change; with ``since`` (a generation of requests seen), at once if requested since."""
        if since is not None and since != self.requested:
            return
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


def get_desired_keys(resources: Collection[Resource], namespaces: Collection[str | None]) -> set[WatchingKey]:
    """All the combinations of resources and namespaces that need their own watch-stream."""
    keys: set[WatchingKey] = set()
    for resource in resources:
        if not resource.namespaced or None in namespaces:
            keys.add((resource, None))
        else:
            keys.update((resource, namespace) for namespace in namespaces if namespace is not None)
    return keys


async def orchestrator(
        *,
        insights: Insights,
        watcher_factory: WatcherFactory,
        gate: HandlingGate | None = None,
        ungated: Collection[Resource] = (),
        pausing: Pausable | None = None,
        rewatching: Rewatching | None = None,
) -> None:
    """
    Start & stop the watchers as the insights change (runs forever; stops all the watchers on exit).

    ``insights.watching`` is set once the watchers of the initial insights are started
    (or, if the gate is closed, once all its coordinators have decided so).

    While the ``gate`` is closed (e.g. another operator with a higher priority handles the objects),
    no watchers run: they are stopped when it closes (their workers finish what they do), and started
    anew when it opens, listing all the objects as if new. The ``ungated`` resources (the peering,
    which decides whether the gate is open) have their tasks running regardless of the gate, started
    before the others (so that they can close the gate before any object is processed) and stopped
    after them; their failure is the orchestrator's failure. ``pausing`` (e.g. the daemons & timers) is
    paused after the watchers are stopped, and resumed before they start again.

    On the requests of ``rewatching``, all the watchers are stopped (their workers finish what they do)
    and started anew; the daemons & timers are not paused for that.
    """
    paused = False
    watchers: dict[WatchingKey, asyncio.Task[None]] = {}
    coordinators: dict[WatchingKey, asyncio.Task[None]] = {}
    try:
        await insights.ready_resources.wait()
        await insights.ready_namespaces.wait()
        while True:
            insights.changed.clear()
            generation = gate.generation if gate is not None else 0  # the changes while busy are not missed
            requested = rewatching.requested if rewatching is not None else 0  # the same
            restarting = rewatching is not None and rewatching.pending

            # The coordinators first: they might close the gate at once (synchronously, when created).
            desired = get_desired_keys(ungated, insights.namespaces)
            obsolete = {key: task for key, task in coordinators.items() if key not in desired}
            for key in obsolete:
                del coordinators[key]
            await _stop_watchers(obsolete.values())
            for key in sorted(desired - coordinators.keys(), key=_sorting_key):
                resource, namespace = key
                coordinators[key] = asyncio.create_task(watcher_factory(resource, namespace),
                                                        name=f'coordinator for {resource!r}@{namespace}')

            gate_open = gate is None or gate.is_open
            desired = get_desired_keys(insights.resources, insights.namespaces) if gate_open else set()
            obsolete = {key: task for key, task in watchers.items() if key not in desired or restarting}
            for key in obsolete:
                del watchers[key]
            await _stop_watchers(obsolete.values())
            if rewatching is not None and restarting:
                rewatching.complete(requested)  # the new ones (if the gate is open) start below

            # Strictly in this order: no watcher runs while paused, none starts before the resuming.
            if not gate_open and not paused:
                logger.debug(f'Pausing the handling: {", ".join(gate.blocked_by) if gate else ""}.')
                paused = True
                if pausing is not None:
                    await pausing.pause()
                continue  # the gate might have changed meanwhile
            if gate_open and paused:
                logger.debug('Resuming the handling.')
                paused = False
                if pausing is not None:
                    pausing.resume()

            for key in sorted(desired - watchers.keys(), key=_sorting_key):
                resource, namespace = key
                watchers[key] = asyncio.create_task(watcher_factory(resource, namespace),
                                                    name=f'watcher for {resource!r}@{namespace}')

            # Ready when the watchers are started, or when it is decided that none should run (a follower).
            if gate is None or gate.decided:
                insights.watching.set()
            running = [task for task in coordinators.values() if not task.done()]
            await _wait_for_changes(insights, gate, running, since=generation,
                                    rewatching=rewatching, requested=requested)
            for task in coordinators.values():
                if task.done() and not task.cancelled() and task.exception() is not None:
                    task.result()  # re-raise: e.g. a mandatory peering that does not exist
    finally:
        await _stop_watchers(watchers.values())
        if rewatching is not None:
            rewatching.close()  # nobody should wait for what never comes
        logger.debug(f'Streaming tasks are stopped: {len(watchers)} watch-streams in total.')
        await _stop_watchers([task for task in coordinators.values() if not task.done()])


async def _wait_for_changes(insights: Insights, gate: HandlingGate | None,
                            coordinators: Collection[asyncio.Task[None]], *, since: int,
                            rewatching: Rewatching | None = None, requested: int = 0) -> None:
    """
    Wait until the insights change, or the gate's blockers change (since then), or a coordinator exits,
    or the watch-streams are requested to start anew (since then).
    """
    if gate is None and not coordinators and rewatching is None:
        await insights.changed.wait()
        return
    waiters: list[asyncio.Task[Any]] = [asyncio.create_task(insights.changed.wait(), name='insights waiter')]
    if gate is not None:
        waiters.append(asyncio.create_task(gate.wait_for_change(since=since), name='gate waiter'))
    if rewatching is not None:
        waiters.append(asyncio.create_task(rewatching.wait_for_change(since=requested),
                                           name='rewatching waiter'))
    try:
        await asyncio.wait([*waiters, *coordinators], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def _stop_watchers(tasks: Collection[asyncio.Task[None]]) -> None:
    """Cancel the watchers and wait until they exit (which includes their workers' graceful exit)."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            logger.error(f'A watcher has failed while stopping: {task.exception()!r}')


def _sorting_key(key: WatchingKey) -> tuple[str, str, str, str]:
    # Only for the stable order of starting (and of the logs), nothing more.
    resource, namespace = key
    return resource.group, resource.version, resource.plural, namespace or ''
