"""
Running the operator: ``kopf.run()``, ``kopf.operator()``, ``kopf.spawn_tasks()``, ``kopf.run_tasks()``.

The life of an operator:

1. The startup activity runs; nothing talks to the API before it succeeds (the startup handlers
   can change the settings, and the changes take effect for everything that follows).
2. The core tasks start: the authenticator (the initial login and re-logins), the observers
   of the resources and namespaces, the orchestrator of the watchers (and their workers).
   The garbage collector is tuned for the bursts of events until the exit (``settings.process``).
   Unless standalone, the replicas coordinate (the peering, the Lease election: :mod:`.coordination`):
   while another replica handles the objects, this one runs no watchers and pauses its daemons & timers.
3. The ready-flag is raised once the watch-streams for the initially known resources are started
   (or once the coordination has decided that this replica must not handle the objects now).
4. The operator runs until the stop-flag is raised, a signal (SIGINT/SIGTERM) is received,
   its task is cancelled, or any core task fails (e.g. no credentials).
5. The core tasks stop: first the watchers (their workers get ``settings.queueing.exit_timeout``
   to finish), then the rest. Then the cleanup activity runs (only if the startup has succeeded),
   and the vault is closed.

The stop requests (flags, signals) are in :mod:`.supervision`, the flags' and tasks' primitives in
:mod:`kopf._cogs.aiokits`;
the process's tuning while operators run (the garbage collector) is in :mod:`.tuning`.

Several operators can run in one process (preferably in separate threads with their own event loops),
each with its own registry, settings, vault, and memo.
"""
import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import importlib.metadata
import logging
import warnings
from collections.abc import Callable, Collection, Coroutine, Iterator, Mapping
from typing import Any

from kopf._clients.errors import describe_error
from kopf._clients.vault import Vault
from kopf._cogs.aiokits import aioflags, aiotasks
from kopf._cogs.helpers import metering, tracing
from kopf._cogs.structs.references import NamespacePattern, Resource
from kopf._core.actions.lifecycles import LifeCycleFn
from kopf._core.engines import (
    activities,
    admission,
    gating,
    indexing,
    leadership,
    metrics,
    peering,
    posting,
    probing,
    sharding,
    spawning,
)
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import Activity
from kopf._core.intents.memos import Memo
from kopf._core.intents.registries import OperatorRegistry, get_default_registry
from kopf._core.reactor import (
    coordination,
    observation,
    orchestration,
    pacing,
    processing,
    queueing,
    supervision,
    tuning,
)
from kopf._core.reactor.contexts import Delivery, OperatorScope
from kopf._core.reactor.inventory import ResourceMemories

logger = logging.getLogger(__name__)

OperatorIndexers = indexing.OperatorIndexers

Identity = peering.Identity

# How long the tasks left running after the operator's exit get to finish before they are cancelled.
HUNG_TASKS_GRACE = 1.0

# How long a forced exit waits for the coordinators' farewells (e.g. releasing the lease) before closing.
FAREWELL_TIMEOUT = leadership.RELEASE_TIMEOUT + 1.0


async def _close_at_exit(
        coordinators: Collection[asyncio.Task[None]],
        vault: Vault,
        stopping: Collection[Coroutine[Any, Any, None]],
) -> None:
    """
    Let the coordinators say farewell (in a forced exit, they are not stopped yet), then close the sessions.

    A coordinator's farewell (the release of the lease) needs the credentials: they are closed only after it.
    """
    leftovers = [task for task in coordinators if not task.done()]
    for task in leftovers:
        task.cancel()  # once: their exit (the release) is not interrupted by a repeated cancellation
    if leftovers:
        await asyncio.wait(leftovers, timeout=FAREWELL_TIMEOUT)
    await asyncio.gather(vault.close(), *stopping)



#
# Public entry points.
#

def run(
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        lifecycle: LifeCycleFn | None = None,
        indexers: OperatorIndexers | None = None,
        registry: OperatorRegistry | None = None,
        settings: OperatorSettings | None = None,
        memories: ResourceMemories | None = None,
        insights: observation.Insights | None = None,
        identity: Identity | None = None,
        standalone: bool | None = None,
        priority: int | None = None,
        peering_name: str | None = None,
        liveness_endpoint: str | None = None,
        clusterwide: bool = False,
        namespaces: Collection[NamespacePattern] = (),
        namespace: NamespacePattern | None = None,
        stop_flag: aioflags.Flag | None = None,
        ready_flag: aioflags.Flag | None = None,
        vault: Vault | None = None,
        memo: object | None = None,
        _command: Coroutine[None, None, None] | None = None,
) -> None:
    """
    Run the operator synchronously until it exits; see :func:`operator` for the options.

    It runs in the given event loop, or else in the current thread's one (a new one is made if there is none).
    ``asyncio.run(kopf.operator(...))`` is the alternative that makes & closes a new loop for one call.
    """
    coro = operator(
        lifecycle=lifecycle, indexers=indexers, registry=registry, settings=settings, memories=memories,
        insights=insights, identity=identity, standalone=standalone, priority=priority,
        peering_name=peering_name, liveness_endpoint=liveness_endpoint, clusterwide=clusterwide,
        namespaces=namespaces, namespace=namespace, stop_flag=stop_flag, ready_flag=ready_flag,
        vault=vault, memo=memo, _command=_command,
    )
    actual_loop = loop if loop is not None else _get_current_loop()
    actual_loop.run_until_complete(coro)


async def operator(
        *,
        lifecycle: LifeCycleFn | None = None,
        indexers: OperatorIndexers | None = None,
        registry: OperatorRegistry | None = None,
        settings: OperatorSettings | None = None,
        memories: ResourceMemories | None = None,
        insights: observation.Insights | None = None,
        identity: Identity | None = None,
        standalone: bool | None = None,
        priority: int | None = None,
        peering_name: str | None = None,
        liveness_endpoint: str | None = None,
        clusterwide: bool = False,
        namespaces: Collection[NamespacePattern] = (),
        namespace: NamespacePattern | None = None,
        stop_flag: aioflags.Flag | None = None,
        ready_flag: aioflags.Flag | None = None,
        vault: Vault | None = None,
        memo: object | None = None,
        _command: Coroutine[None, None, None] | None = None,
) -> None:
    """
    Run the operator in the current event loop until it exits: :func:`spawn_tasks` + :func:`run_tasks`.

    The tasks that exist in the loop before the call are left alone at exit; all the others
    (e.g. spawned by the handlers and not finished) are cancelled once the operator is done.
    """
    existing_tasks = asyncio.all_tasks()
    tasks = await spawn_tasks(
        lifecycle=lifecycle, indexers=indexers, registry=registry, settings=settings, memories=memories,
        insights=insights, identity=identity, standalone=standalone, priority=priority,
        peering_name=peering_name, liveness_endpoint=liveness_endpoint, clusterwide=clusterwide,
        namespaces=namespaces, namespace=namespace, stop_flag=stop_flag, ready_flag=ready_flag,
        vault=vault, memo=memo, _command=_command,
    )
    try:
        await run_tasks(tasks, ignored=existing_tasks)
    finally:
        supervision.operator_is_over()


async def spawn_tasks(
        *,
        lifecycle: LifeCycleFn | None = None,
        indexers: OperatorIndexers | None = None,
        registry: OperatorRegistry | None = None,
        settings: OperatorSettings | None = None,
        memories: ResourceMemories | None = None,
        insights: observation.Insights | None = None,
        identity: Identity | None = None,
        standalone: bool | None = None,
        priority: int | None = None,
        peering_name: str | None = None,
        liveness_endpoint: str | None = None,
        clusterwide: bool = False,
        namespaces: Collection[NamespacePattern] = (),
        namespace: NamespacePattern | None = None,
        stop_flag: aioflags.Flag | None = None,
        ready_flag: aioflags.Flag | None = None,
        vault: Vault | None = None,
        memo: object | None = None,
        _command: Coroutine[None, None, None] | None = None,
) -> Collection[asyncio.Task[None]]:
    """
    Create the root tasks of the operator (to be run by :func:`run_tasks`).

    The registry is the default one unless given; the settings, the vault, the memo, and the insights
    are new ones unless given. ``namespaces`` (plus the older ``namespace``) restricts the operator
    to some namespaces (names, globs, negations, regexps); ``clusterwide=True`` serves the whole cluster.
    ``standalone``, ``priority``, ``peering_name`` go to ``settings.peering`` (see
    :mod:`kopf._core.engines.peering`); ``identity`` is the operator's identity in the peerings
    and the Lease election (``user@host/<time>/<random>`` by default).
    ``_command``, if given, runs instead of the watching (after the startup & login),
    and the operator exits when it is done.
    """
    logger.debug(f'Starting Kopf {_get_version()}.')
    registry = registry if registry is not None else get_default_registry()
    settings = settings if settings is not None else OperatorSettings()
    vault = vault if vault is not None else Vault()
    memo = memo if memo is not None else Memo()
    insights = insights if insights is not None else observation.Insights()
    indexers = indexers if indexers is not None else indexing.OperatorIndexers()
    indexers.ensure(registry.indexing.get_all_handlers())  # the indices exist (empty) from the very start

    if liveness_endpoint is not None:
        probing.parse_liveness_endpoint(liveness_endpoint)  # a bad URL fails now, before any task starts.

    patterns: list[NamespacePattern] = [*namespaces, *([namespace] if namespace is not None else [])]
    if clusterwide and patterns:
        raise TypeError('Either the namespaces or the cluster-wide mode can be used, not both.')
    if not clusterwide and not patterns:
        warnings.warn('Neither the namespaces nor the cluster-wide mode are specified; '
                      'serving the whole cluster. Specify one of them explicitly.',
                      FutureWarning, stacklevel=2)
        clusterwide = True

    if standalone is not None:
        settings.peering.standalone = standalone
    if priority is not None:
        settings.peering.priority = priority
    if peering_name is not None:
        settings.peering.name = peering_name
        settings.peering.mandatory = True
    settings.peering.clusterwide = clusterwide

    loop = asyncio.get_running_loop()
    signal_flag = asyncio.Event()
    signals_installed = supervision.install_signal_handlers(loop, signal_flag)

    # All the operator's tasks (and the handlers' sync threads) see their own operator's event queue,
    # but the caller's context remains untouched (several operators can be spawned from one task).
    event_queue = posting.EventQueue(settings=settings)
    context = contextvars.copy_context()
    context.run(posting.event_queue_var.set, event_queue)

    runner = asyncio.create_task(_run_operator(
        lifecycle=lifecycle, indexers=indexers, memories=memories, registry=registry, settings=settings,
        vault=vault, memo=memo, insights=insights, clusterwide=clusterwide, namespaces=patterns,
        ready_flag=ready_flag, identity=identity,
        liveness_endpoint=liveness_endpoint, command=_command, event_queue=event_queue,
    ), name='operator runner', context=context)
    checker = asyncio.create_task(supervision.stop_flag_checker(
        stop_flag=stop_flag, signal_flag=signal_flag, runner=runner, settings=settings,
        loop=loop if signals_installed else None,
    ), name='stop-flag checker', context=context)
    return [checker, runner]


async def run_tasks(
        root_tasks: Collection[asyncio.Task[Any]],
        *,
        ignored: Collection[asyncio.Task[Any]] = frozenset(),
) -> None:
    """
    Run the root tasks until any of them exits, then stop all of them, and then the hung tasks.

    The root tasks are meant to run forever: the exit of any of them (or the cancellation of this call)
    means the exit of the operator. The hung tasks are all other tasks that appeared in the event loop
    during the operator's run and are still there (except the ``ignored`` ones): they get a short
    time to finish and are cancelled after that. The first failure of the root tasks is re-raised.
    """
    current_task = asyncio.current_task()
    try:
        if root_tasks:
            await asyncio.wait(root_tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await aiotasks.stop_tasks(root_tasks, title='Root tasks', logger=logger)
        hung_tasks = [task for task in asyncio.all_tasks()
                      if task is not current_task and task not in root_tasks and task not in ignored]
        await aiotasks.stop_tasks(hung_tasks, title='Hung tasks', grace=HUNG_TASKS_GRACE, logger=logger)

    for task in root_tasks:
        if not task.cancelled() and task.exception() is not None:
            task.result()  # re-raise the failure as the operator's one.


#
# The operator's own activities: startup, core tasks, cleanup.
#

def make_pacer(settings: OperatorSettings) -> pacing.Pacer:
    """The seats of the processing of all the operator's objects, as the settings say (see the pacing)."""
    return pacing.Pacer(settings.queueing.processing_seats, lending_delay=settings.execution.lending_delay,
                        reserve=settings.queueing.processing_reserve)


def make_indexer(
        *,
        indexers: OperatorIndexers | None,
        memories: ResourceMemories,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        memo: object,
) -> queueing.Processor | None:
    """
    The hook where the indexing plugs into the reactor: every event of the indexed resources goes
    to the indices before the processing (see :mod:`kopf._core.engines.indexing`); None if no indexers.
    """
    if indexers is None:
        return None

    async def indexer(delivery: Delivery, /) -> None:
        raw_event, resource = delivery.raw_event, delivery.resource
        event_type = raw_event['type']
        memory = memories.recall(raw_event['object'], memo=memo, noticed_by_listing=event_type is None,
                                 ephemeral=event_type == 'DELETED')
        await indexers.index_resource_event(raw_event=raw_event, resource=resource, registry=registry,
                                            settings=settings, memo=memory.memo)

    return indexer


async def _run_operator(
        *,
        lifecycle: LifeCycleFn | None,
        indexers: OperatorIndexers | None,
        memories: ResourceMemories | None,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        vault: Vault,
        memo: object,
        insights: observation.Insights,
        clusterwide: bool,
        namespaces: Collection[NamespacePattern],
        ready_flag: aioflags.Flag | None,
        identity: Identity | None,
        liveness_endpoint: str | None,
        command: Coroutine[None, None, None] | None,
        event_queue: posting.EventQueue,
) -> None:
    """The operator's whole life: startup, the core tasks until any of them exits, cleanup."""
    # The indices are maintained by the indexing engine; the handlers only read them.
    indices = indexers.indices if indexers is not None else None
    started = False
    core_tasks: CoreTasks | None = None
    gc_tuning = contextlib.ExitStack()
    # Served from before the startup (answering "not ready" till then) to after the cleanup.
    reporter = None if liveness_endpoint is None else probing.HealthReporter(
        liveness_endpoint, registry=registry, settings=settings, memo=memo, indices=indices)
    meter: metrics.MetricsServer | None = None
    traced = False
    try:
        if reporter is not None:
            await reporter.start()
        try:
            await activities.run_activity(activity=Activity.STARTUP, registry=registry, settings=settings,
                                          memo=memo, indices=indices)
        except asyncio.CancelledError:
            logger.warning('Startup activity is only partially executed due to cancellation.')
            raise
        started = True

        admission.ensure_server_is_configured(registry, settings)
        if settings.metrics.endpoint is not None:  # as configured by now: by the CLI or the startup handlers
            meter = metrics.MetricsServer(settings, reporter=reporter)
            await meter.start()
        traced = _enable_tracing(settings)

        gc_tuning.enter_context(tuning.tuned_gc(settings.process.gc_threshold))
        core_tasks = _spawn_core_tasks(
            lifecycle=lifecycle, indexers=indexers, memories=memories, registry=registry,
            settings=settings, vault=vault, memo=memo, indices=indices, insights=insights,
            clusterwide=clusterwide, namespaces=namespaces, command=command, event_queue=event_queue,
            identity=identity if identity is not None else peering.detect_own_id(manual=False),
        )
        if reporter is not None:
            for key, source in core_tasks.statuses.items():
                reporter.add_status(key, source)

        # Ready means: the startup is over, and the objects are being watched (or the command can run).
        ready = asyncio.create_task(
            vault.wait_for_readiness() if command is not None else insights.watching.wait(),
            name='readiness waiter',
        )
        try:
            await asyncio.wait([ready, *core_tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if ready.done() and not ready.cancelled():
            if reporter is not None:
                reporter.mark_ready()
            aioflags.raise_flag(ready_flag)

        done, _ = await asyncio.wait(list(core_tasks), return_when=asyncio.FIRST_COMPLETED)
        # Retrieve every failure (so that none is reported as "never retrieved"), re-raise the first.
        failed = [task for task in core_tasks
                  if task in done and not task.cancelled() and task.exception() is not None]
        for task in failed:
            # The traceback goes with the exception to the caller (e.g. the CLI): one line here.
            error = task.exception()
            assert error is not None  # filtered above
            logger.error(f'{aiotasks.describe_task(task)} has failed: {describe_error(error)}')
        core_tasks.reported.update(failed)
        if failed:
            failed[0].result()  # re-raise as the operator's failure.

    finally:
        gc_tuning.close()
        if traced:
            tracing.disable()
        try:
            if core_tasks is not None:
                await core_tasks.stop()
            if started:
                try:
                    await activities.run_activity(activity=Activity.CLEANUP, registry=registry,
                                                  settings=settings, memo=memo, indices=indices)
                except activities.ActivityError as e:
                    logger.error(f'Cleanup activity has failed: {e}')
                except asyncio.CancelledError:
                    logger.warning('Cleanup activity is only partially executed due to cancellation.')
                    raise
        finally:
            # Even if the exit is forced: the HTTP sessions must be closed in the loop they belong to,
            # so a repeated cancellation (e.g. of a hung cleanup) must not interrupt the closing.
            # The liveness endpoint's port is released the same way, whatever the cancellations.
            # Even if the exit is forced (e.g. a second Ctrl+C): the lease is released (for a while at most),
            # so that a follower takes over at once instead of waiting for the lease to expire.
            stopping = [server.stop() for server in [reporter, meter] if server is not None]
            coordinators = core_tasks.coordinators if core_tasks is not None else []
            await aiotasks.finish_uninterrupted(_close_at_exit(coordinators, vault, stopping))
            if command is not None and core_tasks is None:
                command.close()  # never started (e.g. the startup has failed): not a forgotten coroutine.


def _enable_tracing(settings: OperatorSettings) -> bool:
    """Turn the OpenTelemetry traces on if the settings say so (by default: if an SDK is configured)."""
    enabled = settings.tracing.enabled
    if enabled is None:
        enabled = settings.tracing.provider is not None or tracing.is_configured()
    if not enabled:
        return False
    tracing.enable(settings.tracing.provider)  # with enabled=True and no opentelemetry-api: what to install
    return True


@dataclasses.dataclass(kw_only=True)
class CoreTasks:
    """
    The operator's core tasks, each known by its role (so that they are stopped in the right order).

    They run forever, so the exit of any of them means the operator's exit.
    """

    authenticator: asyncio.Task[None]
    poster: asyncio.Task[None]
    command: asyncio.Task[None] | None = None
    watching: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)  # the orchestrator
    coordinators: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)  # the Lease election
    observers: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)
    others: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)
    reported: set[asyncio.Task[None]] = dataclasses.field(default_factory=set, init=False)  # failures
    statuses: dict[str, Callable[[], Any]] = dataclasses.field(default_factory=dict)  # for the liveness

    def __iter__(self) -> Iterator[asyncio.Task[None]]:
        yield self.authenticator
        yield self.poster
        if self.command is not None:
            yield self.command
        yield from self.observers
        yield from self.watching
        yield from self.others
        yield from self.coordinators

    async def stop(self) -> None:
        """
        Stop the tasks in the order that keeps the API usable for the finishing workers:
        the watchers (with their workers) first, then the observers and the rest (the daemons),
        then the coordinators (the lease is released only when nothing is handled anymore),
        then the poster of the k8s-events (so that the workers' last messages are still posted),
        the credentials last.
        """
        rest = [*self.observers, *([self.command] if self.command is not None else []), *self.others]
        for group in (self.watching, rest, self.coordinators, [self.poster], [self.authenticator]):
            await aiotasks.stop_tasks(group, title=None, logger=logger)
        logger.debug('Core tasks are stopped.')

        # The tasks that have failed meanwhile, not only the one that ended the operator: usually
        # of the same cause (e.g. a failed re-login fails every API call waiting for it), so only
        # in the debug logs then; on their own, they are errors. Either way, not left to asyncio.
        consequential = bool(self.reported)
        for task in self:
            if task.done() and not task.cancelled() and task not in self.reported:
                error = task.exception()
                if error is not None:
                    log = logger.debug if consequential else logger.error
                    log(f'{aiotasks.describe_task(task)} has failed{" too" if consequential else ""}: '
                        f'{describe_error(error)}')
                    self.reported.add(task)


def _spawn_core_tasks(
        *,
        lifecycle: LifeCycleFn | None,
        indexers: OperatorIndexers | None,
        memories: ResourceMemories | None,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        vault: Vault,
        memo: object,
        indices: Any,
        insights: observation.Insights,
        clusterwide: bool,
        namespaces: Collection[NamespacePattern],
        command: Coroutine[None, None, None] | None,
        event_queue: posting.EventQueue,
        identity: Identity,
) -> CoreTasks:
    """Create the core tasks of the operator."""
    tasks = CoreTasks(
        authenticator=asyncio.create_task(activities.authenticator(
            registry=registry, settings=settings, vault=vault, memo=memo, indices=indices,
        ), name='credentials retriever'),
        poster=asyncio.create_task(posting.poster(
            event_queue=event_queue, vault=vault,
        ), name='poster of events'),
    )

    if command is not None:
        tasks.command = asyncio.create_task(command, name='command')
        return tasks

    limit = settings.queueing.worker_limit
    limiter = asyncio.Semaphore(limit) if limit is not None else None
    memories = memories if memories is not None else ResourceMemories()  # shared by the indexing
    # The daemons & timers are stopped by their core task (one of the "others"): after the watchers,
    # before the poster & the credentials, so that they can still patch the objects and post the events.
    spawner = spawning.SpawningEngine(registry=registry, settings=settings, vault=vault, indices=indices)
    pacer = make_pacer(settings)
    # What the processing needs from the operator: made once, for the processor and the forgetter.
    scope = OperatorScope(registry=registry, settings=settings, vault=vault, memories=memories, memobase=memo,
                          lifecycle=lifecycle, indices=indices if indices is not None else {}, pacer=pacer,
                          spawner=spawner)
    processor: queueing.Processor = functools.partial(processing.process_event, scope=scope)
    forgetter: queueing.Forgetter = functools.partial(processing.finish_unattended, scope=scope)
    tasks.others.append(asyncio.create_task(spawning.daemon_killer(spawner), name='daemon killer'))
    indexer = make_indexer(indexers=indexers, memories=memories, registry=registry,
                           settings=settings, memo=memo)
    readiness = indexers.readiness if indexers is not None else None

    # The replicas' coordination: the peering (per served namespace or cluster-wide) and the Lease election
    # close the gate while the operator must not handle the objects (see the orchestrator).
    gate = gating.HandlingGate()
    if metering.meters is not None:  # read when scraped
        metering.meters.add_gauges(lambda: [('kopf_handling_paused', {}, 0.0 if gate.is_open else 1.0)])
        metering.meters.add_gauges(pacer.gauges)  # the objects in the framework's own steps
    peering_resource = coordination.peering_resource(settings)
    rewatching: orchestration.Rewatching | None = None
    sharded: queueing.Sharded | None = None
    if settings.sharding.name:  # instead of the election (both at once are refused with an error)
        rewatching = orchestration.Rewatching()
        handover = coordination.ShardingHandover(rewatching=rewatching, spawner=spawner, memories=memories,
                                                 indexers=indexers)
        shards = sharding.Sharding(settings=settings, vault=vault, identity=identity, handover=handover,
                                   blocker=gate.blocker(f'sharding {settings.sharding.name!r}'))  # checked
        sharded = shards.filter
        tasks.coordinators.append(asyncio.create_task(coordination.run_sharding(shards), name='sharding'))
        tasks.statuses['kopf.sharding'] = shards.status
    elif settings.election.lease_name:
        blocker = gate.blocker(f'lease {settings.election.lease_name!r}')
        tasks.coordinators.append(asyncio.create_task(coordination.lease_election(
            settings=settings, vault=vault, blocker=blocker, identity=identity,
        ), name='lease election'))

    def watcher_factory(resource: Resource, namespace: str | None) -> Coroutine[Any, Any, None]:
        if peering_resource is not None and resource == peering_resource:
            return coordination.make_peering_coordinator(settings=settings, vault=vault, gate=gate,
                                                         identity=identity, namespace=namespace)
        return queueing.watcher(settings=settings, vault=vault, resource=resource, namespace=namespace,
                                processor=processor, limiter=limiter, readiness=readiness, pacer=pacer,
                                forgetter=forgetter, sharded=sharded,
                                indexer=indexer if registry.indexing.has_handlers(resource) else None)

    tasks.observers = [
        asyncio.create_task(observation.resource_observer(
            settings=settings, registry=registry, vault=vault, insights=insights,
        ), name='resource observer'),
        asyncio.create_task(observation.namespace_observer(
            settings=settings, vault=vault, insights=insights, clusterwide=clusterwide, namespaces=namespaces,
        ), name='namespace observer'),
    ]
    tasks.watching = [
        asyncio.create_task(orchestration.orchestrator(
            insights=insights, watcher_factory=watcher_factory, gate=gate,
            ungated=[peering_resource] if peering_resource is not None else [],
            pausing=coordination.SpawningPauser(spawner), rewatching=rewatching,
        ), name='multidimensional multitasker'),
    ]

    # The admission: the webhook server/tunnel and the managed configurations (see the admission engine).
    if settings.admission.server is not None:
        client_configs = admission.ClientConfigs()

        def recall_memo(raw_body: Mapping[str, Any]) -> Any:
            return memories.recall(raw_body, memo=memo, ephemeral=True).memo  # see the engine

        tasks.others.append(asyncio.create_task(admission.admission_webhook_server(
            registry=registry, settings=settings, insights=insights, configs=client_configs,
            recall_memo=recall_memo, indices=indices,
        ), name='admission webhook server'))
        if settings.admission.managed:
            tasks.others.append(asyncio.create_task(admission.configuration_manager(
                registry=registry, settings=settings, insights=insights, configs=client_configs,
                vault=vault, changed=insights.webhooks_changed,
            ), name='admission webhook manager'))
    return tasks


def _get_current_loop() -> asyncio.AbstractEventLoop:
    """The event loop of the current context (thread); a new one if there is none yet."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        try:
            return asyncio.get_event_loop_policy().get_event_loop()
        except RuntimeError:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            return loop


def _get_version() -> str:
    try:
        return importlib.metadata.version('kopf-core')
    except importlib.metadata.PackageNotFoundError:
        return 'unknown'
