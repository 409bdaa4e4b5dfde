"""
Our finalizer: the one place that decides when it is added to an object and when it is removed.

Kubernetes does not delete an object while it has any finalizers: it only marks it with
``metadata.deletionTimestamp``. The operator keeps its finalizer on an object while something
must react to the object's deletion (non-optional deletion handlers, daemons or timers that
must be stopped first), and removes it when that is done or no longer needed:

* while the object lives, the finalizer is there if and only if it is required (:func:`decide`);
* once the object is being deleted, it is never added; it is removed when the caller says
  that the deletion is done (the deletion handlers succeeded, the daemons exited).

The decision is written into the accumulated :class:`kopf.Patch` as a merge-patch of the whole
list of finalizers (:func:`apply_decision`); the object writer (:mod:`kopf._core.actions.application`)
guards such a patch by the object's ``resourceVersion``, so that the finalizers added by others
in the meantime are never lost: if the object has changed, the API rejects the patch, and the writer
changes only our finalizer's position with a guarded JSON-patch built here
(:func:`make_blocking_json_patch`, :func:`make_allowing_json_patch`), as Kopf sends it:
``[{"op": "test", "path": "/metadata/resourceVersion", "value": "4"},
{"op": "add", "path": "/metadata/finalizers", "value": ["kopf.zalando.org/KopfFinalizerMarker"]}]``;
the last finalizer is removed with the whole field: ``{"op": "remove", "path": "/metadata/finalizers"}``.
"""
import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from kopf._cogs.structs import patches

DEFAULT_FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'

BLOCKING_MESSAGE = 'Adding the finalizer, thus preventing the actual deletion.'
RELEASING_MESSAGE = 'Removing the finalizer, thus allowing the actual deletion.'
UNNEEDED_MESSAGE = 'Removing the finalizer, as there are no handlers requiring it.'


def _metadata_field(body: Mapping[str, Any], name: str) -> Any:
    # A shortcut of ``dicts.resolve(body, ('metadata', name), None)``: this is checked for every event.
    metadata = body.get('metadata')
    if type(metadata) is dict or isinstance(metadata, Mapping):
        return metadata.get(name)
    return None


def finalizers_of(body: Mapping[str, Any]) -> list[str]:
    """The object's finalizers (a copy); empty if there are none."""
    finalizers = _metadata_field(body, 'finalizers')
    return list(finalizers) if isinstance(finalizers, list) else []


# These two are checked several times per event: _metadata_field() is inlined.

def is_deletion_ongoing(body: Mapping[str, Any]) -> bool:
    """Whether the object is marked for deletion (and waits only for its finalizers to go)."""
    metadata = body.get('metadata')
    if type(metadata) is dict or isinstance(metadata, Mapping):
        return metadata.get('deletionTimestamp') is not None
    return False


def is_deletion_blocked(body: Mapping[str, Any], finalizer: str = DEFAULT_FINALIZER) -> bool:
    """Whether the object has this finalizer (i.e. its actual deletion waits for this operator)."""
    metadata = body.get('metadata')
    if type(metadata) is dict or isinstance(metadata, Mapping):
        finalizers = metadata.get('finalizers')
        return isinstance(finalizers, list) and finalizer in finalizers
    return False


class FinalizerAction(enum.Enum):
    ADD = enum.auto()
    REMOVE = enum.auto()


@dataclasses.dataclass(frozen=True)
class FinalizerDecision:
    """What to do with our finalizer on the object, and the message to log about it."""

    action: FinalizerAction
    message: str


RELEASING_DECISION = FinalizerDecision(FinalizerAction.REMOVE, RELEASING_MESSAGE)
BLOCKING_DECISION = FinalizerDecision(FinalizerAction.ADD, BLOCKING_MESSAGE)
UNNEEDED_DECISION = FinalizerDecision(FinalizerAction.REMOVE, UNNEEDED_MESSAGE)


def decide(
        *,
        body: Mapping[str, Any],
        finalizer: str,
        requires_finalizer: bool,
        deletion_done: bool = False,
) -> FinalizerDecision | None:
    """
    Decide whether our finalizer must be added to or removed from the object (None: neither).

    ``requires_finalizer``: whether anything that matches the object as it is now needs to react
    to its deletion. ``deletion_done``: whether that reaction is over (only for objects being deleted).
    """
    present = is_deletion_blocked(body, finalizer)
    if is_deletion_ongoing(body):
        if present and deletion_done:
            return RELEASING_DECISION
        return None
    if requires_finalizer and not present:
        return BLOCKING_DECISION
    if not requires_finalizer and present:
        return UNNEEDED_DECISION
    return None


def apply_decision(
        decision: FinalizerDecision,
        *,
        body: Mapping[str, Any],
        patch: patches.Patch,
        finalizer: str,
) -> None:
    """
    Put the finalizer change into the patch: a merge-patch of the whole list of finalizers.

    The list is taken from the patch if it is already changed there, so that several changes
    (ours and the handlers') accumulate instead of overwriting each other. An empty list
    removes the field, as the API does by itself when the last finalizer goes.
    """
    current = patch.get('metadata', {}).get('finalizers')
    finalizers = list(current) if current is not None else finalizers_of(body)
    if decision.action is FinalizerAction.ADD and finalizer not in finalizers:
        finalizers.append(finalizer)
    elif decision.action is FinalizerAction.REMOVE:
        finalizers = [name for name in finalizers if name != finalizer]
    patch.metadata['finalizers'] = finalizers or None


def changes_finalizers(patch: Mapping[str, Any]) -> bool:
    """Whether the merge-patch replaces the list of finalizers (and so must be guarded by the version)."""
    metadata = patch.get('metadata')
    return (type(metadata) is dict or isinstance(metadata, Mapping)) and 'finalizers' in metadata


def make_blocking_json_patch(
        body: Mapping[str, Any],
        finalizer: str = DEFAULT_FINALIZER,
        *,
        guarded: bool = True,
) -> patches.JSONPatch:
    """
    The JSON-patch that adds the finalizer; empty if the object has it already.

    It is guarded by a test of the resource version (if the body has one), unless told otherwise.
    """
    finalizers = finalizers_of(body)
    if finalizer in finalizers:
        return []
    ops: patches.JSONPatch
    if isinstance(_metadata_field(body, 'finalizers'), list):
        ops = [{'op': 'add', 'path': f'/metadata/finalizers/{len(finalizers)}', 'value': finalizer}]
    else:
        ops = [{'op': 'add', 'path': '/metadata/finalizers', 'value': [finalizer]}]
    return _guard(body, ops) if guarded else ops


def make_allowing_json_patch(
        body: Mapping[str, Any],
        finalizer: str = DEFAULT_FINALIZER,
        *,
        guarded: bool = True,
) -> patches.JSONPatch:
    """
    The JSON-patch that removes the finalizer; empty if the object does not have it.

    If no other finalizers remain, the whole field is removed. The positions of multiple
    occurrences (normally, there are none) are removed from the last one, so that the earlier
    positions stay valid. It is guarded by a test of the resource version (see above).
    """
    finalizers = finalizers_of(body)
    positions = [index for index, existing in enumerate(finalizers) if existing == finalizer]
    if not positions:
        return []
    ops: patches.JSONPatch
    if len(positions) == len(finalizers):
        ops = [{'op': 'remove', 'path': '/metadata/finalizers'}]
    else:
        ops = [{'op': 'remove', 'path': f'/metadata/finalizers/{index}'} for index in reversed(positions)]
    return _guard(body, ops) if guarded else ops


def _guard(body: Mapping[str, Any], ops: patches.JSONPatch) -> patches.JSONPatch:
    version = _metadata_field(body, 'resourceVersion')
    if version is None:
        return ops
    return [{'op': 'test', 'path': '/metadata/resourceVersion', 'value': version}, *ops]
