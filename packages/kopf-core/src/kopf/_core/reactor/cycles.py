"""
One handling cycle of an object: the change's detection, our finalizer, the handlers, the release.

A cycle is run for every processed event of a resource with change handlers, or with daemons & timers
(then, as the same cycle with no change handlers: no essences, diff-bases or consistency waits, only our
finalizer for them). Its steps, in this order, each in one place:

1. **the change** (change handlers only): wait for our own latest patch to arrive (:mod:`.versions`),
   then detect the cause: what has happened since the object was handled last (the diff-base);
2. **the finalizer while the object lives**: decided once (:func:`finalizers.decide`): it is there if and
   only if something that matches the object needs it. An added finalizer goes out before the handlers run
   (with whatever is accumulated so far), so that the deletion handlers are guaranteed even for objects
   deleted during their first handling, as Kopf does;
3. **the handlers** of the cause, one step of them (the mid-cycle re-runs: :mod:`.reruns`);
4. **the release for the deletion**: once the deletion handlers are done and the daemons & timers have
   exited, decided once too (the same :func:`finalizers.decide`);
5. **the end**: the accumulated patch is applied (its version remembered, maybe as a settled echo);
   if some handlers must wait, the cycle sleeps and "touches" the object then.

Everything is accumulated into one :class:`kopf.Patch` and applied at the end with as few requests as the
API allows: our finalizer as a merge-patch of the whole list guarded by the object's ``resourceVersion``
(if the object has changed since, the finalizer is changed separately with a guarded JSON-patch against
the fresh object); the handlers' own changes, results and progress records; the diff-base once all the
handlers of a change are finished; the removal of the "touch" marker. So a creation handler with a result
costs one request for resources without the status subresource, two for those with it.

The reasons of the change handling are described in :mod:`kopf._core.intents.causes`. The objects seen
in the initial listing get their resuming handlers mixed into their first update or resuming cycle (but
not into their creation, nor into their deletion unless the handlers accept the deleted objects), once
per operator lifetime.
"""
import logging
from collections.abc import Mapping, Sequence

from kopf._clients.errors import APIUnprocessableEntityError
from kopf._cogs.helpers import metering, tracing
from kopf._cogs.structs.bodies import Body, BodyEssence, RawBody
from kopf._core.actions import application, execution, lifecycles, progression
from kopf._core.intents import causes
from kopf._core.intents.handlers import HANDLER_REASONS, ChangingHandler, Reason
from kopf._core.persistence import finalizers, progress
from kopf._core.reactor import pacing, reruns, versions
from kopf._core.reactor.contexts import ObjectEvent

__all__ = ['apply_changes', 'finalizer_decision', 'run_cycle']

# How the handling cycles are named in the logs: "Creation is in progress", "Updating is processed", etc.
_TITLES: Mapping[str, str] = {
    Reason.CREATE: 'Creation',
    Reason.UPDATE: 'Updating',
    Reason.DELETE: 'Deletion',
    Reason.RESUME: 'Resuming',
}


def _title(reason: str) -> str:
    return _TITLES.get(reason, reason.capitalize())


def finalizer_decision(
        raw_body: RawBody, finalizer: str, *, requires: bool, deletion_done: bool = False,
) -> finalizers.FinalizerDecision | None:
    """The one decision about our finalizer per cycle (see the module's description); None: no change."""
    return finalizers.decide(body=raw_body, finalizer=finalizer, requires_finalizer=requires,
                             deletion_done=deletion_done)


async def run_cycle(event: ObjectEvent, *, changing: bool, requires_finalizer: bool | None = None) -> bool:
    """
    Run one handling cycle of the object (see the module's description).

    ``changing``: the resource has change handlers (otherwise, only daemons & timers: only the finalizer).
    ``requires_finalizer``: whether the daemons & timers need our finalizer, if already known.
    Returns whether our finalizer is released for the object's deletion (nothing but the deletion can come).
    """
    scope = event.scope
    raw_body = event.raw_body
    if event.gone:
        if changing and scope.registry.changing.has_handlers(event.delivery.resource):
            event.logger.debug('Deleted, really deleted, and we are notified.')
        return False
    finalizer: str = scope.settings.persistence.finalizer
    if event.memory.released and finalizers.is_deletion_blocked(raw_body, finalizer):
        # Our finalizer is gone for good: a state with it is from before the release (see :mod:`.versions`).
        event.local_logger.debug('Released for the deletion already: this state with our finalizer is from '
                                 'before the release, nothing to handle.')
        if event.patch:
            await apply_changes(event)  # the event handlers' results, as for any other state
        return True

    # 1. The change: only from a consistent state.
    cause: causes.ResourceChangingCause | None = None
    handled = False
    if changing:
        if not versions.is_consistent(event.memory, raw_body):
            if event.patch:
                # The event handlers' results do not depend on the consistency: apply them now;
                # the change handling happens when our own patches (this one included) arrive.
                await apply_changes(event)
                return False
            if not await versions.wait_for_consistency(
                    event.memory, pressure=event.delivery.pressure,
                    held_back_since=event.delivery.held_back_since,
                    consistency_timeout=scope.settings.persistence.consistency_timeout,
                    lending=event.lending(), logger=event.local_logger):
                return False  # a newer event has arrived meanwhile: it will be processed instead of this one.
        cause, old, new = _detect_cause(event)
        handled = scope.registry.changing.prematch(cause)
        if tracing.tracer is not None:
            tracing.annotate('kopf.cause', str(cause.reason))

    # 2. Our finalizer while the object lives: there if and only if something needs it.
    # (The checks read the raw body, not its view: the same data, with no Python-level call per read.)
    deletion_ongoing = finalizers.is_deletion_ongoing(raw_body)
    requires = False  # as the cycle leaves it: while deleted, our finalizer goes once the object is released
    if not deletion_ongoing:
        if cause is not None:
            requires = scope.registry.requires_finalizer(cause)
        elif requires_finalizer is not None:
            requires = requires_finalizer
        else:
            spawning_cause = causes.ResourceSpawningCause(
                resource=event.delivery.resource, body=event.body, patch=event.patch,
                logger=event.local_logger, memo=event.memory.memo, indices=scope.indices)
            requires = scope.registry.spawning.requires_finalizer(spawning_cause)
        decision = finalizer_decision(raw_body, finalizer, requires=requires)
        if decision is not None:
            _apply_decision(event, decision, finalizer)
            # A finalizer that is added goes out BEFORE the handlers run: if the object is deleted
            # while they run (even the very first time), it waits for the deletion handlers instead of
            # vanishing. This costs a request per object's life, but guarantees the deletion handlers,
            # as Kopf does. The cycle goes on at once, without waiting for the patch's watch-event.
            blocking_first = (decision.action == finalizers.FinalizerAction.ADD and cause is not None
                              and handled and cause.reason in HANDLER_REASONS)
            if blocking_first and not await _block_deletion_first(event):
                return False  # the object is gone: nothing to handle, the deletion event will come.

    # 3. The handlers.
    done = True
    delays: list[float] = []
    if cause is None or not handled:
        pass  # no change handlers, or none of them is interested in the object as it is now.
    elif cause.reason in HANDLER_REASONS:
        done, delays = await _run_handlers(event, cause=cause, old=old, new=new)
    elif cause.reason == Reason.NOOP:
        event.logger.debug('Something has changed, but we are not interested (the essence is the same).')
    elif cause.reason == Reason.FREE:
        event.logger.debug('Deletion, but we are done with it, and we do not care.')

    # 4. The release for the deletion: the daemons & timers hold the object until they exit;
    # if they are slow, the object is handled again soon. (The body is not patched until the cycle's end.)
    released = False
    if deletion_ongoing and finalizers.is_deletion_blocked(raw_body, finalizer):
        if done and not await _spawning_exited(event):
            done = False
            delays.append(0)
        decision = finalizer_decision(raw_body, finalizer, requires=False, deletion_done=done)
        if decision is not None:
            _apply_decision(event, decision, finalizer)
            released = True

    # 5. The end.
    await _finish_cycle(event, delays=delays, handled=handled, done=done and changing,
                        essence=new if cause is not None else None, requires_finalizer=requires,
                        released=released)
    return released


def _apply_decision(event: ObjectEvent, decision: finalizers.FinalizerDecision, finalizer: str) -> None:
    if event.debug:
        event.local_logger.debug(decision.message)
    finalizers.apply_decision(decision, body=event.raw_body, patch=event.patch, finalizer=finalizer)


def _detect_cause(event: ObjectEvent) -> tuple[causes.ResourceChangingCause, BodyEssence | None, BodyEssence]:
    """What has happened to the object since it was handled last time; and its old & new essences."""
    scope = event.scope
    persistence = scope.settings.persistence
    memory = event.memory
    body = event.body
    resource = event.delivery.resource

    old = progression.fetch_diffbase(storage=persistence.diffbase_storage, body=body, logger=event.logger)
    old = progress.without_records(persistence.progress_storage, essence=old) if old is not None else None
    new = _essence(event, body)

    cause = causes.detect_changing_cause(
        event_type=event.delivery.raw_event['type'],
        resource=resource,
        body=body,
        old=old,
        new=new,
        finalizer=persistence.finalizer,
        initial=memory.noticed_by_listing and not memory.fully_handled_once,
        logger=event.logger,
        patch=event.patch,
        memo=memory.memo,
        indices=scope.indices,
    )
    if cause.reason == Reason.CREATE:
        cause.initial = False  # the objects created during the downtime are not resumed (as in Kopf).
    return cause, old, new


def _essence(event: ObjectEvent, body: Body) -> BodyEssence:
    """The object's essence as its changes are detected (and as it is stored as the diff-base)."""
    scope = event.scope
    persistence = scope.settings.persistence
    # The essences never contain the storages' own data, even if the progress is stored in the spec.
    extra_fields = scope.registry.changing.get_extra_fields(event.delivery.resource)
    essence = persistence.diffbase_storage.build(body=body, extra_fields=extra_fields)
    return progress.without_records(persistence.progress_storage, essence=essence)


async def _run_handlers(
        event: ObjectEvent,
        *,
        cause: causes.ResourceChangingCause,
        old: BodyEssence | None,
        new: BodyEssence,
) -> tuple[bool, list[float]]:
    """
    One step of a handling cycle: the due handlers once each, their progress and results into the patch.

    Returns whether all the handlers of the cause are finished, and the delays of the unfinished ones.
    """
    scope = event.scope
    registry = scope.registry
    persistence = scope.settings.persistence
    storage = persistence.progress_storage
    body = event.body
    patch = event.patch
    logger = event.logger
    title = _title(cause.reason)

    resource_handlers = registry.changing.get_resource_handlers(event.delivery.resource)
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
    if event.debug:
        logger.debug('%s is in progress: %r', title, event.raw_body)
        if cause.diff and cause.old is not None:
            logger.debug('%s diff: %r', title, cause.diff)

    memory = event.memory
    if memory.cycle_purpose != purpose or purpose != cause.reason:
        memory.cycle_purpose = memory.cycle_essences = None  # not the cycle the essences belong to

    state = state.with_purpose(cause.reason).with_handlers(cause_handlers)
    runnable: Sequence[ChangingHandler] = cause_handlers
    if memory.cycle_essences:
        state, runnable = reruns.restart_outdated(memory, state=state, handlers=cause_handlers, essence=new,
                                                  storage=storage, body=body, patch=patch, logger=logger)
    async with event.lending(pacing.LENDING_DELAY):
        outcomes = await execution.execute_handlers_once(
            lifecycle=(scope.lifecycle if scope.lifecycle is not None else
                       lifecycles.get_default_lifecycle()),
            settings=scope.settings,
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
        reruns.remember_essences(memory, purpose=cause.reason, outcomes=outcomes, essence=new)

    if done:
        if cause_handlers and logger.logger.isEnabledFor(logging.INFO):  # the counting is not for nothing
            success, failure, _ = state.counts
            logger.info(f'{title} is processed: {success} succeeded; {failure} failed.')
        # The sub-handlers store their records in this very step: those are removed from the patch.
        if stored or state.has_subrefs:
            state.purge(body=body, patch=patch, storage=storage, handlers=resource_handlers)
        if new != old:
            persistence.diffbase_storage.store(body=body, patch=patch, essence=new)
        memory.fully_handled_once = True
        meters = metering.meters
        if meters is not None:
            resource = event.delivery.resource
            name = f'{resource.plural}.{resource.group}' if resource.group else resource.plural
            meters.child(meters.changes_handled, name, cause.reason).inc()

    progress.untouch(storage, body=body, patch=patch)  # touch(value=None) & flush(), if needed at all
    return done, ([] if done else state.delays)


async def _spawning_exited(event: ObjectEvent) -> bool:
    """
    Whether the object's daemons & timers (stopped as it is being deleted) have exited, so it can be released.

    Waits for them, but only as long as no newer event of the object arrives, and at most for the polling
    period of the daemons: if they are still running then, the object is "touched" and handled again.
    """
    spawner = event.scope.spawner
    if spawner is None or not event.spawning:
        return True  # nothing was ever spawned for the object: no need to give up the seat to wait
    async with event.lending():
        return await spawner.wait_until_idle(
            event.memory, wakeup=event.delivery.pressure,
            within=event.scope.settings.background.cancellation_polling)


async def _finish_cycle(event: ObjectEvent, *, delays: list[float], handled: bool, done: bool,
                        essence: BodyEssence | None, requires_finalizer: bool, released: bool) -> None:
    """
    Apply the accumulated patch; if some handlers must wait, sleep and "touch" the object then.

    ``done``: the change handling's cycle is over; if nothing is due and the patch has only the framework's
    own writes (:func:`versions.settles`; the object writer never modifies the patch), its version is settled
    --- unless the patched object has changes of others too (see :func:`_settles`). ``essence``: the handled
    essence of the object (None if its change was not detected); ``requires_finalizer``: the cycle's decision;
    ``released``: the patch removes our finalizer for the deletion (then, only the new version is read from
    the API's response: what the patched object has beyond it cannot make its echo due, see :func:`_settles`).
    """
    patching = bool(event.patch)
    latest = await _apply_patch(event, releasing=released)
    patched = latest is not None
    if (latest is not None and done and not delays and essence is not None and
            _settles(event, latest, essence=essence, requires_finalizer=requires_finalizer,
                     released=released)):
        event.memory.settled_version = event.memory.expected_version

    if handled and not patching and not delays and event.debug:
        event.local_logger.debug('Handling cycle is finished, waiting for new changes.')

    # The object's patch causes a new event and a new cycle anyway, unless the handlers must wait.
    # Otherwise, sleep until the nearest delayed handler is due, and "touch" the object to wake it up.
    must_wait = bool(delays) and not (patched and min(delays) <= 0)
    if must_wait:
        async with event.lending():
            must_touch = await application.sleep_for_delays(delays=delays, wakeup=event.delivery.pressure,
                                                            patched=patched, logger=event.local_logger)
    if must_wait and must_touch:
        scope = event.scope
        touched = await application.touch(
            settings=scope.settings, vault=scope.vault, resource=event.delivery.resource, body=event.body,
            storage=scope.settings.persistence.progress_storage, logger=event.local_logger, seat=event.seat)
        versions.remember_version(event.memory, old_raw=event.raw_body, new_raw=touched)


def _settles(event: ObjectEvent, latest: RawBody, *, essence: BodyEssence, requires_finalizer: bool,
             released: bool) -> bool:
    """
    Whether the patched object will be handled exactly as it has just been (see :func:`versions.settles`).

    No handler of another kind (event handlers, daemons, timers) may see the object: they get every change,
    and their echoes too. The patch has no precondition (but for the finalizers): it is applied on top of
    what others have changed since the handled version (e.g. while the handlers ran), so the patched object
    (``latest``, the API's response) must have the handled ``essence`` and deletion state, and our finalizer
    as the cycle has decided: otherwise, its echo brings a change to handle (the changes between batched in).
    An object ``released`` for its deletion needs none of it (``latest`` has only its version then): its
    deletion goes on and our finalizer is gone (no one can add finalizers to an object being deleted), so its
    echo is nothing to do (:attr:`.causes.Reason.FREE`) whatever others have changed.
    """
    if event.watching or event.spawning:
        return False
    scope = event.scope
    resource = event.delivery.resource
    blind = scope.registry.changing.is_blind_to_own_writes(resource)
    if not versions.settles(event.patch, blind_to_own_writes=blind):
        return False
    if released:
        return True
    if finalizers.is_deletion_ongoing(latest) != finalizers.is_deletion_ongoing(event.raw_body):
        return False
    finalizer = scope.settings.persistence.finalizer
    if finalizer_decision(latest, finalizer, requires=requires_finalizer, deletion_done=True):
        return False
    return _essence(event, Body._wrapping(latest)) == essence


async def apply_changes(event: ObjectEvent) -> bool:
    """Apply the accumulated patch (if not empty); True if the object has got a new version from it."""
    return await _apply_patch(event) is not None


async def _apply_patch(event: ObjectEvent, *, releasing: bool = False) -> RawBody | None:
    """
    Apply the accumulated patch (if not empty); the patched object if it has got a new version from it.

    ``releasing``: the patch removes our finalizer for the deletion; once it is applied (or the object is
    gone), the object is remembered as released (see :mod:`.versions`). Only the version of the returned
    object is read then: it may have nothing else (see ``version_only`` of :func:`.application.apply_patch`).
    """
    if not event.patch:
        return None
    scope = event.scope
    try:
        latest = await application.apply_patch(settings=scope.settings, vault=scope.vault,
                                               resource=event.delivery.resource, body=event.body,
                                               patch=event.patch, logger=event.local_logger, seat=event.seat,
                                               version_only=releasing)
    except APIUnprocessableEntityError as e:
        # Repeating the same patch cannot help: say why, once, with the fix (not a traceback per retry).
        event.local_logger.error(_explain_rejected_patch(e))
        return None
    event.memory.settled_version = None  # the caller decides if the new version is settled
    if releasing:
        event.memory.released = True  # applied, or the object is gone: either way, for good
    if latest is None:
        return None  # the object is gone: nothing to wait for, the deletion event will come.
    return latest if versions.remember_version(event.memory, old_raw=event.raw_body, new_raw=latest) else None


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


async def _block_deletion_first(event: ObjectEvent) -> bool:
    """Apply the accumulated patch with our added finalizer now; False if the object is gone."""
    scope = event.scope
    latest = await application.apply_patch(settings=scope.settings, vault=scope.vault,
                                           resource=event.delivery.resource, body=event.body,
                                           patch=event.patch, logger=event.local_logger, seat=event.seat)
    event.patch.clear()  # applied: the handlers start with a clean patch
    event.patch.fns.clear()
    if latest is None:
        return False
    versions.remember_version(event.memory, old_raw=event.raw_body, new_raw=latest)
    return True
