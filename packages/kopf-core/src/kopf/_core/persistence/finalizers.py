"""
The finalizer that blocks the deletion of objects while the operator still has work to do with them.

Kubernetes does not delete an object while it has any finalizers: it only marks it with
``metadata.deletionTimestamp``. The operator adds its finalizer when it needs to react to the
deletion (e.g. there are deletion handlers, or daemons to stop), and removes it when it is done.

Since the finalizers are a list, merge-patches can only replace it as a whole, and could lose
the finalizers added by others in the meantime. So, the changes are made as JSON-patches (RFC 6902)
of the specific positions, guarded by a test of the object's resource version (so that they fail
with HTTP 422 instead of breaking the list if the object has changed meanwhile). This is what
Kopf sends: e.g. ``[{"op": "test", "path": "/metadata/resourceVersion", "value": "4"},
{"op": "add", "path": "/metadata/finalizers", "value": ["kopf.zalando.org/KopfFinalizerMarker"]}]``;
the last finalizer is removed with the whole field: ``{"op": "remove", "path": "/metadata/finalizers"}``.

The changes can be put into a :class:`kopf.Patch` as its transformation functions
(:func:`block_deletion`, :func:`allow_deletion`), which turn into the same JSON-patch when
the patch is converted with :meth:`kopf.Patch.as_json_patch`; or they can be built directly
(:func:`make_blocking_json_patch`, :func:`make_allowing_json_patch`). The merge-patch forms
(:func:`make_blocking_merge_patch`, :func:`make_allowing_merge_patch`) are for the cases where
JSON-patches are not possible (e.g. admission webhooks' mutations) or not needed.
"""
from collections.abc import Mapping
from typing import Any, cast

from kopf._cogs.structs import bodies, patches

DEFAULT_FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'


def finalizers_of(body: Mapping[str, Any]) -> list[str]:
    """The object's finalizers (a copy); empty if there are none."""
    metadata = body.get('metadata')
    finalizers = metadata.get('finalizers') if isinstance(metadata, Mapping) else None
    return list(finalizers) if isinstance(finalizers, list) else []


def is_deletion_ongoing(body: Mapping[str, Any]) -> bool:
    """Whether the object is marked for deletion (and waits only for its finalizers to go)."""
    metadata = body.get('metadata')
    return isinstance(metadata, Mapping) and metadata.get('deletionTimestamp') is not None


def is_deletion_blocked(body: Mapping[str, Any], finalizer: str = DEFAULT_FINALIZER) -> bool:
    """Whether the object has this finalizer (i.e. its deletion waits for this operator)."""
    return finalizer in finalizers_of(body)


def block_deletion(*, body: bodies.Body, patch: patches.Patch, finalizer: str = DEFAULT_FINALIZER) -> None:
    """
    Add the finalizer to the object, unless it is there already.

    The addition goes to the patch as a transformation function, so that it becomes a guarded
    JSON-patch of a single position when applied, not a replacement of the whole list.
    """
    if not is_deletion_blocked(body, finalizer):
        patch.fns.append(_FinalizerAddition(finalizer))


def allow_deletion(*, body: bodies.Body, patch: patches.Patch, finalizer: str = DEFAULT_FINALIZER) -> None:
    """
    Remove the finalizer from the object, if it is there; the empty list is removed as a whole.

    The removal goes to the patch as a transformation function (see :func:`block_deletion`).
    """
    if is_deletion_blocked(body, finalizer):
        patch.fns.append(_FinalizerRemoval(finalizer))


class _FinalizerAddition:
    """A patch function: appends the finalizer to the list (creating it if needed)."""

    __slots__ = ('finalizer',)

    def __init__(self, finalizer: str) -> None:
        self.finalizer = finalizer

    def __repr__(self) -> str:
        return f'add_finalizer({self.finalizer!r})'

    def __call__(self, raw_body: bodies.RawBody) -> None:
        metadata = cast('dict[str, Any]', raw_body.setdefault('metadata', {}))
        finalizers: list[str] = metadata.setdefault('finalizers', [])
        if self.finalizer not in finalizers:
            finalizers.append(self.finalizer)


class _FinalizerRemoval:
    """A patch function: removes the finalizer from the list (and the list if it becomes empty)."""

    __slots__ = ('finalizer',)

    def __init__(self, finalizer: str) -> None:
        self.finalizer = finalizer

    def __repr__(self) -> str:
        return f'remove_finalizer({self.finalizer!r})'

    def __call__(self, raw_body: bodies.RawBody) -> None:
        metadata = cast('dict[str, Any]', raw_body.get('metadata', {}))
        finalizers = metadata.get('finalizers')
        if isinstance(finalizers, list) and self.finalizer in finalizers:
            finalizers[:] = [existing for existing in finalizers if existing != self.finalizer]
            if not finalizers:
                del metadata['finalizers']


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
    if _has_finalizers_field(body):
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


def make_blocking_merge_patch(body: Mapping[str, Any], finalizer: str = DEFAULT_FINALIZER) -> dict[str, Any]:
    """The merge-patch that adds the finalizer (the whole new list); empty if it is there already."""
    finalizers = finalizers_of(body)
    if finalizer in finalizers:
        return {}
    return {'metadata': {'finalizers': [*finalizers, finalizer]}}


def make_allowing_merge_patch(body: Mapping[str, Any], finalizer: str = DEFAULT_FINALIZER) -> dict[str, Any]:
    """The merge-patch that removes the finalizer (the whole new list, or ``None`` if none remain)."""
    finalizers = finalizers_of(body)
    if finalizer not in finalizers:
        return {}
    remaining = [existing for existing in finalizers if existing != finalizer]
    return {'metadata': {'finalizers': remaining or None}}


def _has_finalizers_field(body: Mapping[str, Any]) -> bool:
    metadata = body.get('metadata')
    return isinstance(metadata, Mapping) and isinstance(metadata.get('finalizers'), list)


def _guard(body: Mapping[str, Any], ops: patches.JSONPatch) -> patches.JSONPatch:
    metadata = body.get('metadata')
    version = metadata.get('resourceVersion') if isinstance(metadata, Mapping) else None
    if version is None:
        return ops
    return [{'op': 'test', 'path': '/metadata/resourceVersion', 'value': version}, *ops]
