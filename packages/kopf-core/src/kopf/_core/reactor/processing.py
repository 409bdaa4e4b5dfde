"""
Processing of one object's latest watch-event: the event-watching handlers, then the change handling.

The queueing calls :func:`process_resource_event` for every object with its latest (batched) event,
one call at a time per object. Everything an event causes is accumulated into one :class:`kopf.Patch`
and applied at the end of the call with as few requests as the API allows:

* the results of the ``@kopf.on.event`` handlers (they are stored in the status, as Kopf does);
* our finalizer, added or removed as a merge-patch of the whole list of finalizers, guarded by
  the object's ``resourceVersion`` (if the object has changed since, the API rejects the request
  and the finalizer is then changed separately with a guarded JSON-patch against the fresh object);
* the handlers' own changes (the ``patch`` kwarg), their results, their progress records;
* the diff-base (the last handled essence) once all the handlers of a change are finished;
* the removal of the "touch" marker that has woken the object up after the delays.

So, a creation handler with a result costs one request for resources without the status
subresource, and two for those with it (the API drops the status changes sent to the main
endpoint and everything else sent to ``/status``). The one exception: when our finalizer must be
added, it is applied (with whatever is accumulated so far) before the handlers run, so that
the deletion handlers are guaranteed even for objects deleted during their first handling.

The change handling needs a consistent state of the object: our own latest patch must have arrived
via the watch-stream, otherwise the old state of the object would be handled once again.
Until then, or until ``settings.persistence.consistency_timeout`` passes since the patch, the handling
waits; a newer event of the object (the ``stream_pressure``) interrupts the wait, and the newer
event is processed instead. A state known to be stale is not handled even after the timeout: when a newer
event is there already, or when the watch-stream was held back by the back-pressure since the patch
(the echo is late by our own doing, and will come). The event-watching handlers are never delayed by this.

A handling cycle of several handlers takes several steps (events): the default lifecycle runs one
handler per step, with a patch of the progress after each. If the object's essence changes between
the steps, the handlers done before the change are started anew in the same cycle (unlike Kopf,
nolar/kopf#641), so that every handler's last call got the essence stored as the diff-base at the end.
Which essence each handler got is remembered in memory only, for the current cycle (see :mod:`.inventory`).

The reasons of the change handling are described in :mod:`kopf._core.intents.causes`.
The objects seen in the initial listing get their resuming handlers mixed into their first
update or resuming cycle (but not into their creation, nor into their deletion unless the handlers
accept the deleted objects), once per operator lifetime.
"""
import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from kopf._clients.errors import APIUnprocessableEntityError
from kopf._clients.vault import Vault
from kopf._cogs.structs import dicts
from kopf._cogs.structs.bodies import Body, BodyEssence, RawBody, RawEvent
from kopf._cogs.structs.patches import Patch
from kopf._cogs.structs.references import Resource
from kopf._core.actions import application, execution, lifecycles, loggers, progression
from kopf._core.engines.spawning import SpawningEngine
from kopf._core.intents import causes
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import HANDLER_REASONS, ChangingHandler, HandlerId, Reason
from kopf._core.intents.registries import OperatorRegistry
from kopf._core.persistence import diffbase, finalizers, progress
from kopf._core.reactor import pacing
from kopf._core.reactor.inventory import ResourceMemories, ResourceMemory

__all__ = ['forget_deleted', 'process_resource_event']

# How the handling cycles are named in the logs: "Creation is in progress", "Updating is processed", etc.
_TITLES: Mapping[str, str] = {
    Reason.CREATE: 'Creation',
    Reason.UPDATE: 'Updating',
    Reason.DELETE: 'Deletion',
    Reason.RESUME: 'Resuming',
}


def _title(reason: str) -> str:
    return _TITLES.get(reason, reason.capitalize())


def _version_of(raw_body: Mapping[str, Any] | None) -> str | None:
    meta = raw_body.get('metadata') if raw_body is not None else None
    version = meta.get('resourceVersion') if type(meta) is dict or isinstance(meta, Mapping) else None
    return str(version) if version else None


async def process_resource_event(
        *,
        raw_event: RawEvent,
        stream_pressure: asyncio.Event | None = None,
        resource: Resource,
        namespace: str | None = None,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        memories: ResourceMemories,
        vault: Vault,
        memobase: object | None = None,
        lifecycle: lifecycles.LifeCycleFn | None = None,
        indices: Mapping[str, Any] | None = None,
        pacer: pacing.Pacer | None = None,
        spawner: SpawningEngine | None = None,
) -> bool:
    """
    Process the latest event of one object: invoke its handlers, apply the changes, sleep if needed.

    ``stream_pressure`` is set by the queueing when newer events of the object arrive:
    it interrupts the waiting (for the consistency, for the delayed handlers) so that the newer
    event is processed sooner. ``namespace`` is that of the watch-stream (unused here).
    ``memobase`` is the operator's memo: every new object gets a shallow copy of it.
    ``indices`` are the operator's indices, given to the handlers as kwargs.
    ``pacer`` paces the framework's own steps of all objects (see :mod:`.pacing`); None: unpaced.
    ``spawner`` runs the daemons & timers of the objects; None: they are not run (only the finalizer is kept).
    The API errors escape (the queueing logs them and retries the object later).
    Returns whether the object is finished with: our finalizer is released for its deletion, so only
    the deletion can come (the queueing then lets the object's worker go at once).
    """
    # Asked once per event: the debug logs are usually off, and several of them are skipped per event then.
    debug = loggers.object_logger.isEnabledFor(logging.DEBUG)
    if not debug and _is_settled_echo(raw_event, memories=memories):
        return False
    if raw_event['type'] == 'DELETED' and forget_deleted(
            raw_event=raw_event, resource=resource, registry=registry, settings=settings,
            memories=memories, spawner=spawner,
    ):
        return False
    # Not `async with`: its exit would be one more coroutine for every event, only to release the seat.
    seat = pacer.seat() if pacer is not None else None
    if seat is not None:
        await seat.__aenter__()
    try:
        return await _process_event(raw_event=raw_event, stream_pressure=stream_pressure, resource=resource,
                                    registry=registry, settings=settings, memories=memories, vault=vault,
                                    memobase=memobase, lifecycle=lifecycle, indices=indices, seat=seat,
                                    spawner=spawner, debug=debug)
    finally:
        if seat is not None:
            seat.leave()


async def _process_event(
        *,
        raw_event: RawEvent,
        stream_pressure: asyncio.Event | None,
        resource: Resource,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        memories: ResourceMemories,
        vault: Vault,
        memobase: object | None,
        lifecycle: lifecycles.LifeCycleFn | None,
        indices: Mapping[str, Any] | None,
        seat: pacing.Seat | None,
        spawner: SpawningEngine | None = None,
        debug: bool = True,
) -> bool:
    raw_body = raw_event['object']
    event_type = raw_event['type']
    gone = event_type == 'DELETED'
    memory = memories.recall(raw_body, memo=memobase, noticed_by_listing=event_type is None, ephemeral=gone)

    # Asked once per event, not in every step: each is a lookup by the resource (its hash is a Python call).
    watching, spawning, changing = registry.get_handler_kinds(resource)

    # The objects with only daemons & timers: most of their events are the echoes of the timers' own
    # patches, which need only the daemons & timers to be matched again, and nothing written back.
    spawned_need: bool | None = None  # whether the daemons & timers need our finalizer, if known
    if spawner is not None and spawning and not gone and not changing and not watching:
        spawned_need = spawner.process(memory=memory, resource=resource, raw_body=raw_body, gone=False,
                                       logger=loggers.LocalObjectLogger(body=raw_body, settings=settings))
        if not finalizers.is_deletion_ongoing(raw_body) and finalizers.decide(
                body=raw_body, finalizer=settings.persistence.finalizer, requires_finalizer=spawned_need,
        ) is None:
            return False

    body = Body._wrapping(raw_body)  # the same as Body(raw_body), with fewer calls
    patch = Patch(body=body)
    logger = loggers.ObjectLogger(body=raw_body, settings=settings)
    local_logger = logger._twin(loggers.LocalObjectLogger)  # the same as made from the body, but faster
    context = _Context(
        registry=registry,
        settings=settings,
        vault=vault,
        resource=resource,
        memory=memory,
        raw_event=raw_event,
        body=body,
        patch=patch,
        logger=logger,
        local_logger=local_logger,
        stream_pressure=stream_pressure,
        lifecycle=lifecycle,
        indices=indices if indices is not None else {},
        seat=seat,
        spawner=spawner,
        watching=watching,
        spawning=spawning,
        debug=debug,
    )
    try:
        if watching:
            await _process_watching(context)
        if spawned_need is None and spawner is not None and spawning:
            spawned_need = _process_spawning(context)

        if changing:
            return await _process_changing(context)
        elif spawning:
            # The daemons & timers need our finalizer too (to be stopped before the object is deleted).
            return await _process_spawning_finalizer(context, requires_finalizer=spawned_need)
        elif patch and not gone:
            await _apply_changes(context)
        return False
    finally:
        if gone:
            memories.forget(raw_body)


def _is_settled_echo(raw_event: RawEvent, *, memories: ResourceMemories) -> bool:
    """
    Whether the event is the echo of our own latest patch that needs no processing at all.

    It is known when the patch is made (see :func:`_settles`): the version that the patch has made
    differs from the handled one only by the framework's own writes, which nothing looks at, and nothing
    was due after it. So the processing of that very version would do nothing but notice the consistency.
    The object's state is the same for the same version, so a version check is enough for the echo.
    With the debug logs on, the echo is processed as usual (this is not asked): to log what Kopf logs for it.
    """
    if raw_event['type'] != 'MODIFIED':
        return False
    raw_body = raw_event['object']
    memory = memories.get(raw_body)
    if memory is None or memory.settled_version is None or memory.settled_version != _version_of(raw_body):
        return False
    memory.settled_version = memory.expected_version = None  # consistent now, as the processing would find
    return True


def forget_deleted(
        *,
        raw_event: RawEvent,
        resource: Resource,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        memories: ResourceMemories,
        spawner: SpawningEngine | None,
) -> bool:
    """
    Forget the deleted object if nothing else is to be done for it (no event handlers, no daemons).

    Returns whether it is done so. Synchronous: the queueing calls it for the objects that have
    no worker at the deletion (usually: their workers left before the echo of the finalizer's removal),
    so that a worker is not started only to forget the object (see :class:`.queueing.Forgetter`).
    """
    kinds = registry.get_handler_kinds(resource)
    if kinds.watching:
        return False
    if spawner is not None and kinds.spawning:
        return False
    raw_body = raw_event['object']
    if kinds.changing and loggers.object_logger.isEnabledFor(logging.DEBUG):
        logger = loggers.ObjectLogger(body=raw_body, settings=settings)
        logger.debug('Deleted, really deleted, and we are notified.')
    memories.forget(raw_body)
    return True


@dataclasses.dataclass(slots=True, kw_only=True)
class _Context:
    """Everything about one call of the processing, so that the steps need not pass a dozen arguments."""

    registry: OperatorRegistry
    settings: OperatorSettings
    vault: Vault
    resource: Resource
    memory: ResourceMemory
    raw_event: RawEvent
    body: Body
    patch: Patch
    logger: loggers.ObjectLogger  # for what is posted as k8s-events if configured so
    local_logger: loggers.ObjectLogger  # for the frequent technical messages, never posted
    stream_pressure: asyncio.Event | None
    lifecycle: lifecycles.LifeCycleFn | None
    indices: Mapping[str, Any]
    seat: pacing.Seat | None
    spawner: SpawningEngine | None = None
    watching: bool = False  # the resource has event handlers
    spawning: bool = False  # the resource has daemons or timers (run if there is a spawner)
    debug: bool = True  # whether the objects' debug logs are on (if not, the frequent ones are not even made)

    def lending(self, delay: float = 0) -> AbstractAsyncContextManager[None]:
        """Let other objects be processed while this one waits for handlers or sleeps (see :mod:`.pacing`)."""
        return self.seat.lending(delay) if self.seat is not None else contextlib.nullcontext()


#
# The event-watching handlers.
#

async def _process_watching(context: _Context) -> None:
    """Invoke the ``@kopf.on.event`` handlers once each; the results go to the status, errors are ignored."""
    raw_event = context.raw_event
    cause = causes.ResourceWatchingCause(
        resource=context.resource,
        type=raw_event['type'],
        event=raw_event,
        body=context.body,
        patch=context.patch,
        logger=context.local_logger,
        memo=context.memory.memo,
        indices=context.indices,
    )
    handlers = context.registry.watching.get_handlers(cause)
    if not handlers:
        return
    # No state is kept for these handlers: every event is a new attempt, with no retries.
    async with context.lending(pacing.LENDING_DELAY):
        outcomes = await execution.execute_handlers_once(
            lifecycle=lifecycles.all_at_once,
            settings=context.settings,
            handlers=handlers,
            cause=cause,
            state=progression.State.from_scratch(),
            logger=context.local_logger,
        )
    execution.deliver_results(outcomes=outcomes, patch=context.patch)


#
# The daemons & timers.
#

def _process_spawning(context: _Context) -> bool | None:
    """
    Start or stop the object's daemons & timers as the object is now (see the spawning engine).

    Returns whether any of them needs our finalizer on the object (None if unknown: no engine).
    """
    if context.spawner is None:
        return None
    raw_event = context.raw_event
    return context.spawner.process(memory=context.memory, resource=context.resource,
                                   raw_body=raw_event['object'], gone=raw_event['type'] == 'DELETED',
                                   logger=context.local_logger)


async def _spawning_exited(context: _Context) -> bool:
    """
    Whether the object's daemons & timers (stopped as it is being deleted) have exited, so it can be released.

    Waits for them, but only as long as no newer event of the object arrives, and at most for the polling
    period of the daemons: if they are still running then, the object is "touched" and handled again.
    """
    if context.spawner is None or not context.spawning:
        return True  # nothing was ever spawned for the object: no need to give up the seat to wait
    async with context.lending():
        return await context.spawner.wait_until_idle(
            context.memory, wakeup=context.stream_pressure,
            within=context.settings.background.cancellation_polling)


#
# The change handling.
#

async def _process_changing(context: _Context) -> bool:
    """
    Detect what has changed in the object and react: handlers, finalizer, diff-base, sleeping.

    Returns whether our finalizer is released for the object's deletion (nothing but the deletion can come).
    """
    raw_body = context.raw_event['object']
    if context.raw_event['type'] == 'DELETED':
        if context.registry.changing.has_handlers(context.resource):
            context.logger.debug('Deleted, really deleted, and we are notified.')
        return False

    if not _is_consistent(context.memory, raw_body):
        if context.patch:
            # The event handlers' results do not depend on the consistency: apply them now;
            # the change handling happens when our own patches (this one included) arrive.
            await _apply_changes(context)
            return False
        if not await _wait_for_consistency(context):
            return False  # a newer event has arrived meanwhile: it will be processed instead of this one.

    registry = context.registry
    finalizer: str = context.settings.persistence.finalizer
    cause, old, new = _detect_cause(context)

    # While the object lives, our finalizer is there if and only if something needs it.
    # (The checks read the raw body, not its view: the same data, with no Python-level call per read.)
    handled = registry.changing.prematch(cause)
    decision = finalizers.decide(body=raw_body, finalizer=finalizer,
                                 requires_finalizer=registry.requires_finalizer(cause))
    if decision is not None:
        if context.debug:
            context.local_logger.debug(decision.message)
        finalizers.apply_decision(decision, body=raw_body, patch=context.patch, finalizer=finalizer)

        # A finalizer that is added goes out BEFORE the handlers run: if the object is deleted
        # while they run (even the very first time), it waits for the deletion handlers instead of
        # vanishing. This costs a request per object's life, but guarantees the deletion handlers,
        # as Kopf does. The cycle goes on at once, without waiting for the patch's watch-event.
        blocking_first = (decision.action == finalizers.FinalizerAction.ADD
                          and handled and cause.reason in HANDLER_REASONS)
        if blocking_first and not await _block_deletion_first(context):
            return False  # the object is gone: nothing to handle, the deletion event will come.

    done = True
    delays: list[float] = []
    if not handled:
        pass  # none of the handlers is interested in the object as it is now.
    elif cause.reason in HANDLER_REASONS:
        done, delays = await _process_handlers(context, cause=cause, old=old, new=new)
    elif cause.reason == Reason.NOOP:
        context.logger.debug('Something has changed, but we are not interested (the essence is the same).')
    elif cause.reason == Reason.FREE:
        context.logger.debug('Deletion, but we are done with it, and we do not care.')

    # The daemons & timers hold the object until they exit; if they are slow, the object is handled again.
    # (The body is not patched until the cycle's end: its deletion's state is checked once.)
    deletion_ongoing = finalizers.is_deletion_ongoing(raw_body)
    deleting = deletion_ongoing and finalizers.is_deletion_blocked(raw_body, finalizer)
    if done and deleting and not await _spawning_exited(context):
        done = False
        delays.append(0)

    # Once the deletion is handled (or there is nothing to handle), the object is released:
    # as finalizers.decide() would decide for an object with our finalizer, known to be there.
    release: finalizers.FinalizerDecision | None = None
    if done and deleting:
        release = finalizers.RELEASING_DECISION
        if context.debug:
            context.local_logger.debug(release.message)
        finalizers.apply_decision(release, body=raw_body, patch=context.patch, finalizer=finalizer)

    await _finish_cycle(context, delays=delays, handled=handled, done=done)
    return release is not None


async def _process_spawning_finalizer(context: _Context, *, requires_finalizer: bool | None) -> bool:
    """
    The resources with daemons & timers but no change handlers: only our finalizer, no change detection.

    The finalizer is kept while any daemon or timer matches the object, and released once they have
    exited after the object is marked for deletion. There are no essences, diff-bases or consistency
    waits here: the timers' frequent patches of such objects would make them a cost of every tick.
    ``requires_finalizer`` is what the spawning engine has found while matching the object (if known).
    Returns whether our finalizer is released for the object's deletion (nothing but the deletion can come).
    """
    if context.raw_event['type'] == 'DELETED':
        return False
    body = context.body
    finalizer: str = context.settings.persistence.finalizer
    delays: list[float] = []
    decision: finalizers.FinalizerDecision | None = None
    release: finalizers.FinalizerDecision | None = None
    if not finalizers.is_deletion_ongoing(body):
        if requires_finalizer is None:
            cause = causes.ResourceSpawningCause(resource=context.resource, body=body, patch=context.patch,
                                                 logger=context.local_logger, memo=context.memory.memo,
                                                 indices=context.indices)
            requires_finalizer = context.registry.spawning.requires_finalizer(cause)
        decision = finalizers.decide(body=body, finalizer=finalizer, requires_finalizer=requires_finalizer)
    elif not finalizers.is_deletion_blocked(body, finalizer):
        pass  # not ours to release.
    elif await _spawning_exited(context):
        decision = release = finalizers.decide(body=body, finalizer=finalizer,
                                               requires_finalizer=False, deletion_done=True)
    else:
        delays.append(0)  # the daemons are slow to exit: the object is handled again soon.
    if decision is not None:
        context.local_logger.debug(decision.message)
        finalizers.apply_decision(decision, body=body, patch=context.patch, finalizer=finalizer)
    await _finish_cycle(context, delays=delays, handled=False)
    return release is not None


async def _finish_cycle(
        context: _Context,
        *,
        delays: list[float],
        handled: bool,
        done: bool = False,
) -> None:
    """
    Apply the accumulated patch; if some handlers must wait, sleep and "touch" the object then.

    ``done``: the change handling's cycle is over; if nothing is due and the patch has only the framework's
    own writes (:func:`_settles`; the object writer never modifies the patch), its version is settled.
    """
    patching = bool(context.patch)
    patched = await _apply_changes(context)
    if patched and done and not delays and _settles(context):
        context.memory.settled_version = context.memory.expected_version

    if handled and not patching and not delays and context.debug:
        context.local_logger.debug('Handling cycle is finished, waiting for new changes.')

    # The object's patch causes a new event and a new cycle anyway, unless the handlers must wait.
    # Otherwise, sleep until the nearest delayed handler is due, and "touch" the object to wake it up.
    must_wait = bool(delays) and not (patched and min(delays) <= 0)
    if must_wait:
        async with context.lending():
            must_touch = await application.sleep_for_delays(delays=delays, wakeup=context.stream_pressure,
                                                            patched=patched, logger=context.local_logger)
    if must_wait and must_touch:
        touched = await application.touch(
            settings=context.settings, vault=context.vault, resource=context.resource, body=context.body,
            storage=context.settings.persistence.progress_storage, logger=context.local_logger)
        _remember_version(context.memory, old_raw=context.raw_event['object'], new_raw=touched)


def _detect_cause(context: _Context) -> tuple[causes.ResourceChangingCause, BodyEssence | None, BodyEssence]:
    """What has happened to the object since it was handled last time; and its old & new essences."""
    persistence = context.settings.persistence
    memory = context.memory
    body = context.body

    # The essences never contain the storages' own data, even if the progress is stored in the spec.
    extra_fields = context.registry.changing.get_extra_fields(context.resource)
    old = progression.fetch_diffbase(storage=persistence.diffbase_storage, body=body, logger=context.logger)
    new: BodyEssence = persistence.diffbase_storage.build(body=body, extra_fields=extra_fields)
    old = progress.without_records(persistence.progress_storage, essence=old) if old is not None else None
    new = progress.without_records(persistence.progress_storage, essence=new)

    cause = causes.detect_changing_cause(
        event_type=context.raw_event['type'],
        resource=context.resource,
        body=body,
        old=old,
        new=new,
        finalizer=persistence.finalizer,
        initial=memory.noticed_by_listing and not memory.fully_handled_once,
        logger=context.logger,
        patch=context.patch,
        memo=memory.memo,
        indices=context.indices,
    )
    if cause.reason == Reason.CREATE:
        cause.initial = False  # the objects created during the downtime are not resumed (as in Kopf).
    return cause, old, new


async def _process_handlers(
        context: _Context,
        *,
        cause: causes.ResourceChangingCause,
        old: BodyEssence | None,
        new: BodyEssence,
) -> tuple[bool, list[float]]:
    """
    One step of a handling cycle: the due handlers once each, their progress and results into the patch.

    Returns whether all the handlers of the cause are finished, and the delays of the unfinished ones.
    """
    registry = context.registry
    persistence = context.settings.persistence
    storage = persistence.progress_storage
    body = context.body
    patch = context.patch
    logger = context.logger
    title = _title(cause.reason)

    resource_handlers = registry.changing.get_resource_handlers(context.resource)
    cause_handlers = registry.changing.get_handlers(cause)

    # An unfinished cycle of another reason (e.g. an update when the object is deleted) is abandoned,
    # but the handlers serving both keep their progress (retries, delays, start times).
    # Most objects have no records at all (a cycle of one step stores none): then, nothing to read.
    stored = not progress.holds_no_records(storage, keys=[handler.id for handler in resource_handlers],
                                           body=body)
    state = (progression.State.from_storage(body=body, storage=storage, handlers=resource_handlers,
                                            logger=logger) if stored else progression.State())
    purpose = state.purpose
    if purpose is not None and purpose != cause.reason:
        success, failure, pending = state.counts
        logger.info(f'{_title(purpose)} is superseded by {title.lower()}: '
                    f'{success} succeeded; {failure} failed; {pending} left to the moment.')
        state.purge(body=body, patch=patch, storage=storage, handlers=resource_handlers)

    # Lazy formatting: the bodies are big, and the debug logs are usually off.
    if context.debug:
        logger.debug('%s is in progress: %r', title, context.raw_event['object'])
        if cause.diff and cause.old is not None:
            logger.debug('%s diff: %r', title, cause.diff)

    memory = context.memory
    if memory.cycle_purpose != purpose or purpose != cause.reason:
        memory.cycle_purpose = memory.cycle_essences = None  # not the cycle the essences belong to

    state = state.with_purpose(cause.reason).with_handlers(cause_handlers)
    runnable: Sequence[ChangingHandler] = cause_handlers
    if memory.cycle_essences:
        state, runnable = _restart_outdated(context, state=state, handlers=cause_handlers, essence=new)
    seat = context.seat
    async with (seat.lending(pacing.LENDING_DELAY) if seat is not None else contextlib.nullcontext()):
        outcomes = await execution.execute_handlers_once(
            lifecycle=(context.lifecycle if context.lifecycle is not None else
                       lifecycles.get_default_lifecycle()),
            settings=context.settings,
            handlers=runnable,
            cause=cause,
            state=state,
            logger=logger,
        )
    state = state.with_outcomes(outcomes)
    done = state.done
    if not done:  # otherwise, all the records are purged below: storing them first is for nothing
        state.store(body=body, patch=patch, storage=storage)
    execution.deliver_results(outcomes=outcomes, patch=patch)

    if done:
        memory.cycle_purpose = memory.cycle_essences = None
    elif cause.reason != Reason.DELETE:  # the object is going away: its cleanups are not repeated
        _remember_essences(memory, purpose=cause.reason, outcomes=outcomes, essence=new)

    if done:
        if cause_handlers and logger.logger.isEnabledFor(logging.INFO):  # the counting is not for nothing
            success, failure, _ = state.counts
            logger.info(f'{title} is processed: {success} succeeded; {failure} failed.')
        # The sub-handlers store their records in this very step: those are removed from the patch.
        if stored or state.has_subrefs:
            state.purge(body=body, patch=patch, storage=storage, handlers=resource_handlers)
        if new != old:
            persistence.diffbase_storage.store(body=body, patch=patch, essence=new)
        context.memory.fully_handled_once = True

    progress.untouch(storage, body=body, patch=patch)  # touch(value=None) & flush(), if needed at all
    return done, ([] if done else state.delays)


def _remember_essences(
        memory: ResourceMemory,
        *,
        purpose: str,
        outcomes: Mapping[HandlerId, progression.Outcome],
        essence: BodyEssence,
) -> None:
    """
    Remember which essence the handlers have just been called with (for the next steps of the cycle).

    Only for those that have succeeded, and for the unfinished parents of sub-handlers (some of
    their sub-handlers may have succeeded in this call); the failed ones have nothing to repeat.
    """
    seen = memory.cycle_essences
    for key, outcome in outcomes.items():
        succeeded = outcome.final and outcome.exception is None
        parent_in_progress = not outcome.final and bool(outcome.subrefs)
        if succeeded or parent_in_progress:
            if seen is None:
                seen = memory.cycle_essences = {}
                memory.cycle_purpose = purpose
            seen[key] = essence  # the same object for all of them: a reference, not a copy


def _restart_outdated(
        context: _Context,
        *,
        state: progression.State,
        handlers: Sequence[ChangingHandler],
        essence: BodyEssence,
) -> tuple[progression.State, Sequence[ChangingHandler]]:
    """
    Start anew the handlers finished in this cycle with an essence other than the object's current one.

    The object has changed in the middle of the cycle (between its steps): without this, those handlers
    would never see the change, since the diff-base stored at the cycle's end already contains it.
    The field handlers are started anew only if their field has changed. The handlers that have failed
    for good are not: a permanent failure is a decision, not an accident. The handlers finished before
    the operator's restart are unknown here (not remembered), and are not started anew (as in Kopf).

    The same goes for the succeeded sub-handlers of the restarted handlers and of the unfinished ones:
    their records are removed, and their parents wait for the next step (so that the sub-handlers'
    execution does not see the records, which are still on the object in this step).

    Returns the new state and the handlers that can run in this step.
    """
    seen = context.memory.cycle_essences or {}
    restarted: list[HandlerId] = []
    waiting: set[HandlerId] = set()
    for handler in handlers:
        handler_state = state.get(handler.id)
        if handler_state is None or handler_state.failure:
            continue
        if not handler_state.success and not handler_state.subrefs:
            continue  # pending, and it will get the current essence anyway.
        old_essence = seen.get(handler.id)
        if old_essence is None or old_essence is essence:
            continue
        if handler.field:  # only the field is compared: the field handlers are about it, not the rest
            field = handler.field
            changed = dicts.resolve(old_essence, field, None) != dicts.resolve(essence, field, None)
        else:
            changed = old_essence != essence
        if not changed:
            continue
        if handler_state.success:
            context.logger.info(f'Handler {handler.id!r} is re-run: the object has changed since it ran.')
            restarted.append(handler.id)
        if _restart_subhandlers(context, subrefs=handler_state.subrefs):
            waiting.add(handler.id)
    if restarted:
        state = state.with_restarted(restarted)
    if waiting:
        return state, [handler for handler in handlers if handler.id not in waiting]
    return state, handlers


def _restart_subhandlers(context: _Context, *, subrefs: Sequence[HandlerId]) -> bool:
    """Remove the records of the succeeded sub-handlers (so that they run anew); True if there were any."""
    storage = context.settings.persistence.progress_storage
    body, patch = context.body, context.patch
    removed = False
    for subref in subrefs:
        try:
            record = storage.fetch(key=subref, body=body)
        except ValueError:  # unreadable: the sub-handler starts anew anyway (see the progression)
            continue
        if isinstance(record, Mapping) and record.get('success') is True:
            context.logger.info(f'Handler {subref!r} is re-run: the object has changed since it ran.')
            storage.purge(key=subref, body=body, patch=patch)
            removed = True
    return removed


#
# Consistency: our own patches must arrive before the object's changes are handled.
#

def _is_newer(version: str, than: str) -> bool:
    # The versions are opaque strings by the API's contract, but in practice (etcd) they are growing
    # integers; if so, the newer ones mean that ours has been seen (maybe batched with later changes).
    return version.isdigit() and than.isdigit() and int(version) > int(than)


def _is_consistent(memory: ResourceMemory, raw_body: Mapping[str, Any]) -> bool:
    """Whether the version of our own latest patch (if any) has arrived with this or an earlier event."""
    expected = memory.expected_version
    if expected is None:
        return True
    actual = _version_of(raw_body)
    if actual is not None and (actual == expected or _is_newer(actual, expected)):
        memory.expected_version = None
        return True
    return False


async def _wait_for_consistency(context: _Context) -> bool:
    """
    Wait until the consistency timeout since our latest patch; True if the object can be handled now.

    False means that a newer event of the object has arrived meanwhile (it will be processed instead),
    or that our patch is late since the watch-stream was held back (its event will surely come then).
    """
    memory = context.memory
    if context.stream_pressure is not None and context.stream_pressure.is_set():
        return False  # newer already (e.g. when the events come late): never handle a state known to be stale
    loop = asyncio.get_running_loop()
    timeout = context.settings.persistence.consistency_timeout
    remaining = memory.expected_since + (timeout or 0) - loop.time()
    if remaining > 0:
        context.local_logger.debug(f'Waiting for our own patch (version {memory.expected_version}) '
                                   f'to arrive, for {remaining:.3f} seconds at most.')
        async with context.lending():
            left = await application.sleep(remaining, context.stream_pressure)
        if left is not None:
            return False
    if pacing.held_back_since.get()(memory.expected_since):
        # Late by our own doing (the back-pressure): it will come, surely; the stale state is not handled.
        context.local_logger.debug(f'Our own patch (version {memory.expected_version}) is late: '
                                   f'the watch-stream was held back. The object waits for it.')
        return False
    if remaining > 0:
        context.local_logger.debug(f'Our own patch (version {memory.expected_version}) has not arrived '
                                   f'in time; the object is handled as it is now.')
    memory.expected_version = None
    return True


def _remember_version(memory: ResourceMemory, *, old_raw: Mapping[str, Any], new_raw: RawBody | None) -> bool:
    """Remember the version made by our patch (if any) to wait for it; True if a new version was made."""
    new_version = _version_of(new_raw)
    if new_version is None or new_version == _version_of(old_raw):
        return False
    memory.expected_version = new_version
    memory.expected_since = asyncio.get_running_loop().time()
    return True


#
# Applying the accumulated changes (by the object writer).
#

async def _apply_changes(context: _Context) -> bool:
    """Apply the accumulated patch (if not empty); True if the object has got a new version from it."""
    if not context.patch:
        return False
    try:
        latest = await application.apply_patch(settings=context.settings, vault=context.vault,
                                               resource=context.resource, body=context.body,
                                               patch=context.patch, logger=context.local_logger)
    except APIUnprocessableEntityError as e:
        # Repeating the same patch cannot help: say why, once, with the fix (not a traceback per retry).
        context.local_logger.error(_explain_rejected_patch(e))
        return False
    context.memory.settled_version = None  # the caller decides if the new version is settled
    if latest is None:
        return False  # the object is gone: nothing to wait for, the deletion event will come.
    return _remember_version(context.memory, old_raw=context.raw_event['object'], new_raw=latest)


def _settles(context: _Context) -> bool:
    """
    Whether the object patched with the accumulated patch will be handled exactly as the object has just been.

    I.e. the patch has only what the framework itself writes --- the status (handlers' results, progress),
    our finalizer, Kopf's annotations (progress, the diff-base) --- and none of the object's handlers looks
    at those: its essence and every filter's verdict stay the same. No handler of another kind (event
    handlers, daemons, timers) sees the object either: they get every change, and their echoes too.
    """
    registry, resource, patch = context.registry, context.resource, context.patch
    if patch.fns or context.watching or context.spawning:
        return False
    if not registry.changing.is_blind_to_own_writes(resource):
        return False
    for key, value in patch.items():
        if key == 'status':
            continue
        if key != 'metadata' or not (type(value) is dict or isinstance(value, Mapping)):
            return False
        for meta_key, meta_value in value.items():
            if meta_key == 'finalizers':
                continue
            if meta_key != 'annotations' or not (type(meta_value) is dict or isinstance(meta_value, Mapping)):
                return False
            if not all(map(diffbase.is_system_annotation, meta_value)):
                return False
    return True


def _explain_rejected_patch(error: APIUnprocessableEntityError) -> str:
    explanation = error.message or str(error)
    text = (f'The API has rejected the patch of the object as invalid: {explanation}. The outcome of this '
            f'handling is not stored; the handlers will run again on the next change of the object.')
    if 'metadata.annotations' in explanation and 'Too long' in explanation:
        text += (" Kopf's annotations (e.g. the diff-base: the object's essence as last handled) do not fit "
                 "the API's limit for all annotations together: exclude the big fields from the diff-base "
                 "(kopf.AnnotationsDiffBaseStorage(ignored_fields=[...]) in "
                 "settings.persistence.diffbase_storage) or store it elsewhere (kopf.StatusDiffBaseStorage).")
    return text


async def _block_deletion_first(context: _Context) -> bool:
    """Apply the accumulated patch with our added finalizer now; False if the object is gone."""
    latest = await application.apply_patch(settings=context.settings, vault=context.vault,
                                           resource=context.resource, body=context.body,
                                           patch=context.patch, logger=context.local_logger)
    context.patch.clear()  # applied: the handlers start with a clean patch
    context.patch.fns.clear()
    if latest is None:
        return False
    _remember_version(context.memory, old_raw=context.raw_event['object'], new_raw=latest)
    return True
