"""
Changes in the middle of a handling cycle: the handlers done before the change run again with it.

A handling cycle of several handlers takes several steps (events): the default lifecycle runs one
handler per step, with a patch of the progress after each. If the object's essence changes between
the steps, the handlers done before the change are started anew in the same cycle (unlike Kopf,
nolar/kopf#641), so that every handler's last call got the essence stored as the diff-base at the end.
Which essence each handler got is remembered in memory only, for the current cycle (see :mod:`.inventory`).
"""
from collections.abc import Mapping, Sequence

from kopf._cogs.structs import dicts
from kopf._cogs.structs.bodies import Body, BodyEssence
from kopf._cogs.structs.patches import Patch
from kopf._core.actions import loggers, progression
from kopf._core.intents.handlers import ChangingHandler, HandlerId
from kopf._core.persistence.progress import ProgressStorage
from kopf._core.reactor.inventory import ResourceMemory

__all__ = ['remember_essences', 'restart_outdated']


def remember_essences(
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


def restart_outdated(
        memory: ResourceMemory,
        *,
        state: progression.State,
        handlers: Sequence[ChangingHandler],
        essence: BodyEssence,
        storage: ProgressStorage,
        body: Body,
        patch: Patch,
        logger: loggers.ObjectLogger,
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
    seen = memory.cycle_essences or {}
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
            logger.info(f'Handler {handler.id!r} is re-run: the object has changed since it ran.')
            restarted.append(handler.id)
        if _restart_subhandlers(handler_state.subrefs, storage=storage, body=body, patch=patch,
                                logger=logger):
            waiting.add(handler.id)
    if restarted:
        state = state.with_restarted(restarted)
    if waiting:
        return state, [handler for handler in handlers if handler.id not in waiting]
    return state, handlers


def _restart_subhandlers(
        subrefs: Sequence[HandlerId],
        *,
        storage: ProgressStorage,
        body: Body,
        patch: Patch,
        logger: loggers.ObjectLogger,
) -> bool:
    """Remove the records of the succeeded sub-handlers (so that they run anew); True if there were any."""
    removed = False
    for subref in subrefs:
        try:
            record = storage.fetch(key=subref, body=body)
        except ValueError:  # unreadable: the sub-handler starts anew anyway (see the progression)
            continue
        if isinstance(record, Mapping) and record.get('success') is True:
            logger.info(f'Handler {subref!r} is re-run: the object has changed since it ran.')
            storage.purge(key=subref, body=body, patch=patch)
            removed = True
    return removed
