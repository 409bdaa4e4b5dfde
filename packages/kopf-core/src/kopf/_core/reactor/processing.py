"""
The entry of one object's latest event into the processing, and its dispatch by the kinds of handlers.

The queueing delivers every object's latest (batched) event (:class:`.contexts.Delivery`), one at a
time per object, to :func:`process_event`, bound to the operator's scope (:class:`.contexts.OperatorScope`).
The event goes one way through the stages, each in its own module:

1. here: the echoes known to need nothing are dropped by their versions (:mod:`.versions`); the deleted
   objects with nothing else to do are only forgotten; the event takes a seat of the pacer (:mod:`.pacing`);
   (before all this, the queueing asks :func:`finish_unattended` about the events of the objects with no
   worker: the deleted objects are forgotten, the listed ones that need nothing are not even processed, the
   settled echoes are dropped, and the changes of the objects with only daemons & timers are only shown to
   them, e.g. the timers' echoes: :func:`settle_change`);
2. here: the ``@kopf.on.event`` handlers (their results go to the status; errors are ignored), then
   the daemons & timers are started or stopped as the object is now (the spawning engine);
3. :mod:`.cycles`: the handling cycle of the change handlers, or, for the resources with only daemons &
   timers, the same cycle with no change handlers (only our finalizer for them); its parts:
   :mod:`.versions` (consistency) and :mod:`.reruns` (changes in the middle of a cycle).

What remains of the event after the event handlers (their results) is applied here only if no cycle runs.
"""
import asyncio
import logging
import time
from typing import TYPE_CHECKING

from kopf._cogs.helpers import metering, tracing
from kopf._cogs.structs import diffs
from kopf._cogs.structs.bodies import Body, RawBody, RawEvent
from kopf._cogs.structs.patches import Patch
from kopf._cogs.structs.references import Resource
from kopf._core.actions import execution, lifecycles, loggers, progression
from kopf._core.engines.spawning import SpawningEngine
from kopf._core.intents import causes
from kopf._core.intents.configuration import OperatorSettings, PersistenceSettings
from kopf._core.intents.handlers import Reason
from kopf._core.intents.registries import ListingPlan
from kopf._core.persistence import finalizers, progress
from kopf._core.reactor import cycles, pacing, versions
from kopf._core.reactor.contexts import Delivery, ObjectEvent, OperatorScope
from kopf._core.reactor.inventory import ResourceMemory

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

__all__ = ['dismiss_listed', 'finish_unattended', 'forget_deleted', 'process_event', 'settle_change']


async def process_event(delivery: Delivery, *, scope: OperatorScope) -> bool:
    """
    Process the latest event of one object: invoke its handlers, apply the changes, sleep if needed.

    The API errors escape (the queueing logs them and retries the object later).
    Returns whether the object is finished with: our finalizer is released for its deletion, so only
    the deletion can come (the queueing then lets the object's worker go at once).
    """
    raw_event = delivery.raw_event
    meters = metering.meters
    if meters is not None:
        _measure_arrival(meters, delivery)
    # Asked once per event: the debug logs are usually off, and several of them are skipped per event then.
    # With them on, the settled echoes are processed as usual: to log what Kopf logs for them.
    debug = loggers.object_logger.isEnabledFor(logging.DEBUG)
    if not debug and versions.is_settled_echo(raw_event, scope.memories.get(raw_event['object'])):
        return False
    if raw_event['type'] == 'DELETED' and forget_deleted(raw_event=raw_event, resource=delivery.resource,
                                                         scope=scope):
        return False
    if tracing.tracer is not None:
        return await _process_traced(tracing.tracer, delivery, scope=scope, debug=debug)
    # Not `async with`: its exit would be one more coroutine for every event, only to release the seat.
    seat = scope.pacer.seat() if scope.pacer is not None else None
    if seat is not None:
        await seat.__aenter__()
    started = time.monotonic() if meters is not None else 0.0
    try:
        return await _dispatch(delivery, scope=scope, seat=seat, debug=debug)
    finally:
        if seat is not None:
            seat.leave()
        if meters is not None:
            duration = time.monotonic() - started
            meters.child(meters.work_duration, _name_of(delivery.resource)).observe(duration)


async def _process_traced(
        tracer: 'Tracer', delivery: Delivery, *, scope: OperatorScope, debug: bool,
) -> bool:
    """As in :func:`process_event`, in a span of its own (the handlers' and requests' spans join it)."""
    raw_body = delivery.raw_event['object']
    meta = raw_body.get('metadata') or {}
    attributes = {'k8s.resource': _name_of(delivery.resource),
                  'k8s.event.type': str(delivery.raw_event['type']),
                  'k8s.namespace.name': meta.get('namespace') or '',
                  'k8s.object.name': meta.get('name') or '',
                  'k8s.object.uid': meta.get('uid') or ''}
    with tracer.start_as_current_span('kopf.process', attributes=attributes) as span:
        seat = scope.pacer.seat() if scope.pacer is not None else None
        if seat is not None:
            await seat.__aenter__()
        try:
            finished = await _dispatch(delivery, scope=scope, seat=seat, debug=debug)
        finally:
            if seat is not None:
                seat.leave()
        span.set_attribute('kopf.finished', finished)
        return finished


def _measure_arrival(meters: metering.Meters, delivery: Delivery) -> None:
    name = _name_of(delivery.resource)
    meters.child(meters.events, name).inc()
    if delivery.received_at is not None:
        waited = asyncio.get_running_loop().time() - delivery.received_at
        meters.child(meters.queue_duration, name).observe(max(0.0, waited))


def _name_of(resource: Resource) -> str:
    return f'{resource.plural}.{resource.group}' if resource.group else resource.plural


def finish_unattended(*, raw_event: RawEvent, resource: Resource, scope: OperatorScope) -> bool:
    """
    Finish an event of an object with no worker, if it needs no processing (see :class:`.queueing.Forgetter`).

    The deleted objects are forgotten (:func:`forget_deleted`); the listed ones are dismissed if their
    handling cycle would find nothing to do (:func:`dismiss_listed`); the changes are settled if they need
    nothing or only to be noticed (:func:`settle_change`). Returns whether it is done so.
    """
    event_type = raw_event['type']
    if event_type == 'DELETED':
        return forget_deleted(raw_event=raw_event, resource=resource, scope=scope)
    if event_type is None:
        return dismiss_listed(raw_event=raw_event, resource=resource, scope=scope)
    return settle_change(raw_event=raw_event, resource=resource, scope=scope)


def settle_change(*, raw_event: RawEvent, resource: Resource, scope: OperatorScope) -> bool:
    """
    Whether a change of a known object is done with before any processing, as the general path would find.

    * The echo of our own latest patch that needs nothing (as :func:`process_event` finds first, see
      :func:`.versions.is_settled_echo`), e.g. one that comes after the object's worker has left.
    * For the resources with only daemons & timers, any change once shown to them, e.g. the echoes of the
      timers' own patches, one per tick of every object: the same first steps as the general path's own for
      such resources (:func:`_show_to_spawner`, see :func:`_dispatch`): the spawning engine notices the state
      (the daemons & timers see it, start or stop by their filters), and the event is done if our finalizer
      needs no change. Otherwise, it goes to a worker: the general path then processes it as usual (the
      engine's noticing of the same state is repeated, with no effect). Not for the objects being deleted
      (their daemons & timers are waited for by the worker), nor with tracing.

    Each would otherwise take a worker (kept for the idle timeout if the object comes back every tick), a
    seat, a delivery. Not for the new objects (no memory: the general path makes it), nor with debug logs
    (the general path logs for each event).
    Tested against the general path (``tests/core/reactor/processing/test_settling.py``).
    """
    if loggers.object_logger.isEnabledFor(logging.DEBUG):
        return False
    raw_body = raw_event['object']
    memory = scope.memories.get(raw_body)
    if memory is None:
        return False
    if not versions.is_settled_echo(raw_event, memory):
        spawner = scope.spawner
        if spawner is None or tracing.tracer is not None:
            return False
        watching, spawning, changing = scope.registry.get_handler_kinds(resource)
        if not spawning or changing or watching or finalizers.is_deletion_ongoing(raw_body):
            return False
        _, done = _show_to_spawner(spawner, memory=memory, resource=resource, raw_body=raw_body,
                                   received_at=asyncio.get_running_loop().time(), settings=scope.settings)
        if not done:
            return False
    meters = metering.meters
    if meters is not None:
        meters.child(meters.events, _name_of(resource)).inc()
    return True


def dismiss_listed(*, raw_event: RawEvent, resource: Resource, scope: OperatorScope) -> bool:
    """
    Whether a listed object needs nothing now: its processing would make no request and call no function.

    E.g. every object of a restarted operator that was handled before, and has not changed since then:
    most of the objects at the start (100,000 of them in a big cluster). Their processing would take a
    worker, a seat, a memory, a cycle each only to find that nothing is due. The decision is the general
    path's own, for a new object (no memory) of the initial listing, and only where it is cheap:

    * only change handlers (no event handlers, daemons, timers, which see every object), none of them
      filtering the objects (so our finalizer is needed for all or for none) nor resuming them;
    * our finalizer as it must be (:func:`.cycles.finalizer_decision`: no change), no deletion;
    * the diff-base equal to the object's essence (no change since it was handled: usually known by its text,
      see :meth:`~.diffbase.DiffBaseStorage.surely_unchanged`), no progress records of the handlers and
      no "touch" (nothing left to purge or untouch).

    Then the cycle would detect a ``RESUME`` with no handlers due, and end with an empty patch.
    The only difference: no memory is made for the object until its next event (then, it is made as for a
    new object: its ``initial`` flag is only for the resuming handlers, which this resource has none of).
    Not with tracing or debug logs (kept as they are). The metrics count the event and its cycle as processed.
    Tested against the general path (``tests/core/reactor/processing/test_dismissal.py``).
    """
    if tracing.tracer is not None or loggers.object_logger.isEnabledFor(logging.DEBUG):
        return False  # the general path has a span and a debug line ("Resuming is in progress") for each
    plan = scope.registry.get_listing_plan(resource)
    if plan is None:
        return False
    raw_body = raw_event['object']
    if scope.memories.get(raw_body) is not None:
        return False  # a relisting of a known object: the versions and the cycles of its memory matter
    if finalizers.is_deletion_ongoing(raw_body):
        return False
    persistence = scope.settings.persistence
    finalizer = persistence.finalizer
    if cycles.finalizer_decision(raw_body, finalizer, requires=plan.requires_finalizer) is not None:
        return False
    body = Body._wrapping(raw_body)
    if not persistence.progress_storage.holds_no_state(keys=plan.handler_ids, body=body):
        return False  # the handlers' records or the touch (nothing to purge or untouch)
    if not _unchanged(body=body, plan=plan, persistence=persistence):
        return False
    meters = metering.meters
    if meters is not None:
        name = _name_of(resource)
        meters.child(meters.events, name).inc()
        meters.child(meters.changes_handled, name, Reason.RESUME).inc()
    return True


def _unchanged(*, body: Body, plan: ListingPlan, persistence: PersistenceSettings) -> bool:
    """Whether the object's essence has no diff from its diff-base (as the cycle's cause detection tells)."""
    diffbase_storage = persistence.diffbase_storage
    if diffbase_storage.surely_unchanged(body=body, extra_fields=plan.extra_fields):
        return True  # the usual case, known without parsing, building, and diffing the essences
    try:
        old = diffbase_storage.fetch(body=body)
    except Exception:
        return False  # the general path reports an unreadable diff-base
    if old is None or type(old) is not dict:
        return False
    new = diffbase_storage.build(body=body, extra_fields=plan.extra_fields)
    storage = persistence.progress_storage
    old = progress.without_records(storage, essence=old)
    new = progress.without_records(storage, essence=new)
    return not diffs.diff(old, new)


def forget_deleted(*, raw_event: RawEvent, resource: Resource, scope: OperatorScope) -> bool:
    """
    Forget the deleted object if nothing else is to be done for it (no event handlers, no daemons).

    Returns whether it is done so. Synchronous: the queueing calls it for the objects that have
    no worker at the deletion (usually: their workers left before the echo of the finalizer's removal),
    so that a worker is not started only to forget the object (see :class:`.queueing.Forgetter`).
    """
    kinds = scope.registry.get_handler_kinds(resource)
    if kinds.watching:
        return False
    if scope.spawner is not None and kinds.spawning:
        return False
    raw_body = raw_event['object']
    if kinds.changing and loggers.object_logger.isEnabledFor(logging.DEBUG):
        logger = loggers.ObjectLogger(body=raw_body, settings=scope.settings)
        logger.debug('Deleted, really deleted, and we are notified.')
    scope.memories.forget(raw_body)
    return True


async def _dispatch(
        delivery: Delivery, *, scope: OperatorScope, seat: pacing.Seat | None, debug: bool,
) -> bool:
    """Run the event through the stages for the kinds of handlers that the resource has."""
    raw_event = delivery.raw_event
    raw_body = raw_event['object']
    resource = delivery.resource
    settings = scope.settings
    spawner = scope.spawner
    gone = raw_event['type'] == 'DELETED'
    memory = scope.memories.recall(raw_body, memo=scope.memobase,
                                   noticed_by_listing=raw_event['type'] is None, ephemeral=gone)

    # Asked once per event, not in every step: each is a lookup by the resource (its hash is a Python call).
    # Without the spawning engine, the daemons & timers are not run, but our finalizer is kept for them.
    watching, spawning, changing = scope.registry.get_handler_kinds(resource)

    # The objects with only daemons & timers: most of their events are the echoes of the timers' own
    # patches, which need only the daemons & timers to be matched again. If the cycle would only find
    # that our finalizer needs no change (the same decision as in the cycle), it is not even prepared.
    requires_finalizer: bool | None = None
    if spawner is not None and spawning and not gone and not changing and not watching:
        requires_finalizer, done = _show_to_spawner(
            spawner, memory=memory, resource=resource, raw_body=raw_body, received_at=delivery.received_at,
            settings=settings)
        if done:
            return False

    body = Body._wrapping(raw_body)  # the same as Body(raw_body), with fewer calls
    logger = loggers.ObjectLogger(body=raw_body, settings=settings)
    event = ObjectEvent(
        scope=scope,
        delivery=delivery,
        raw_body=raw_body,
        memory=memory,
        body=body,
        patch=Patch(body=body),
        logger=logger,
        local_logger=logger._twin(loggers.LocalObjectLogger),  # the same as made from the body, but faster
        seat=seat,
        watching=watching,
        spawning=spawning,
        debug=debug,
    )
    try:
        if watching:
            await _run_watching_handlers(event)
        if spawner is not None and spawning and requires_finalizer is None:
            requires_finalizer = spawner.process(
                memory=memory, resource=resource, raw_body=raw_body, gone=gone,
                received_at=delivery.received_at, logger=event.local_logger)
        if changing or spawning:
            # The daemons & timers need our finalizer too (to be stopped before the object is deleted).
            return await cycles.run_cycle(event, changing=changing, requires_finalizer=requires_finalizer)
        if event.patch and not gone:
            await cycles.apply_changes(event)
        return False
    finally:
        if gone:
            scope.memories.forget(raw_body)


def _show_to_spawner(
        spawner: SpawningEngine, *, memory: ResourceMemory, resource: Resource, raw_body: RawBody,
        received_at: float | None, settings: OperatorSettings,
) -> tuple[bool, bool]:
    """
    Show an object's state to the daemons & timers of a resource with nothing else; what it means for it.

    Returns whether our finalizer is needed for them, and whether the event is done with: the object is not
    being deleted, and our finalizer is as it must be (the same decision as in the cycle, not needed then).
    """
    requires_finalizer = spawner.process(memory=memory, resource=resource, raw_body=raw_body, gone=False,
                                         received_at=received_at)  # the logger is made only if needed
    done = not finalizers.is_deletion_ongoing(raw_body) and cycles.finalizer_decision(
        raw_body, settings.persistence.finalizer, requires=requires_finalizer) is None
    return requires_finalizer, done


async def _run_watching_handlers(event: ObjectEvent) -> None:
    """Invoke the ``@kopf.on.event`` handlers once each; the results go to the status, errors are ignored."""
    raw_event = event.delivery.raw_event
    scope = event.scope
    cause = causes.ResourceWatchingCause(
        resource=event.delivery.resource,
        type=raw_event['type'],
        event=raw_event,
        body=event.body,
        patch=event.patch,
        logger=event.local_logger,
        memo=event.memory.memo,
        indices=scope.indices,
    )
    handlers = scope.registry.watching.get_handlers(cause)
    if not handlers:
        return
    # No state is kept for these handlers: every event is a new attempt, with no retries.
    async with event.lending(pacing.LENDING_DELAY):
        outcomes = await execution.execute_handlers_once(
            lifecycle=lifecycles.all_at_once,
            settings=scope.settings,
            handlers=handlers,
            cause=cause,
            state=progression.State.from_scratch(),
            logger=event.local_logger,
        )
    execution.deliver_results(outcomes=outcomes, patch=event.patch)
