"""
Causes: what has happened, with everything the handlers get as kwargs; and their detection.

A cause is made by the reactor for every event it processes (or for every activity), and then
the matching handlers are selected for it (see the registries) and invoked with its kwargs.

The detection of the changing causes is pure: the caller provides the facts (the event type,
the body, the last handled essence from the diff-base storage, whether the object is being seen
for the first time), and gets the reason. Whether our finalizer is on the object is asked of
:mod:`kopf._core.persistence.finalizers`, which alone decides when it is added or removed.
"""
import dataclasses
from collections.abc import Mapping, MutableSequence
from typing import Any

from kopf._cogs.helpers.typedefs import Logger
from kopf._cogs.structs import dicts, diffs
from kopf._cogs.structs.bodies import Body, RawEvent, RawEventType
from kopf._cogs.structs.patches import Patch
from kopf._cogs.structs.references import Resource
from kopf._core.intents.handlers import (
    Activity,
    BaseHandler,
    HandlerId,
    Reason,
    ResourceHandler,
    WebhookType,
)
from kopf._core.persistence import finalizers


@dataclasses.dataclass(kw_only=True)
class BaseCause:
    """
    What every cause has: a logger, a memo, and the indices of the operator.

    The indices go into the kwargs last and override the framework's own kwargs of the same names:
    this way, new kwargs of the framework never break the operators whose indices have those names.
    """

    logger: Logger
    memo: Any = None
    indices: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    # The kwargs are built once per cause (a cause is not changed once its handlers are called),
    # and copied for every use: the lifecycle, every handler, every filtering callback.
    _built_kwargs: dict[str, Any] | None = dataclasses.field(default=None, init=False, repr=False,
                                                             compare=False)

    def _own_kwargs(self) -> dict[str, Any]:
        return {'logger': self.logger, 'memo': self.memo}

    def _shared_kwargs(self) -> dict[str, Any]:
        built = self._built_kwargs
        if built is None:
            built = self._own_kwargs()
            if self.indices:
                built.update(self.indices)
            self._built_kwargs = built
        return built

    @property
    def kwargs(self) -> dict[str, Any]:
        """The kwargs for the handlers and filters of this cause, except the handler-specific ones."""
        return dict(self._shared_kwargs())  # a new dict every time: it is safe to modify it

    def kwargs_for(self, handler: BaseHandler) -> dict[str, Any]:
        """The kwargs for a specific handler: the cause's kwargs plus the handler's ``param``."""
        kwargs = dict(self._shared_kwargs())  # a new dict every time: it is safe to modify it
        kwargs['param'] = handler.param
        if self.indices:
            kwargs.update(self.indices)  # the indices win, even over the param
        return kwargs


@dataclasses.dataclass(kw_only=True)
class ActivityCause(BaseCause):
    activity: Activity
    settings: Any  # OperatorSettings; loosely typed to keep the causes free of the settings' imports.

    def _own_kwargs(self) -> dict[str, Any]:
        return {**super()._own_kwargs(), 'activity': self.activity, 'settings': self.settings}


@dataclasses.dataclass(kw_only=True)
class ResourceCause(BaseCause):
    """A cause related to an individual object of some resource."""

    resource: Resource
    body: Body
    patch: Patch = dataclasses.field(default_factory=Patch)

    def _own_kwargs(self) -> dict[str, Any]:
        body = self.body
        meta = body.metadata
        # The same as meta.uid/.name/.namespace, read from the metadata as it is now, without 3x3 calls.
        raw_meta = dicts.raw_mapping(meta)
        uid, name, namespace = raw_meta.get('uid'), raw_meta.get('name'), raw_meta.get('namespace')
        return {
            'logger': self.logger,  # as in BaseCause, but with no intermediate dicts: this is done often
            'memo': self.memo,
            'resource': self.resource,
            'patch': self.patch,
            'body': body,
            'spec': body.spec,
            'meta': meta,
            'status': body.status,
            'uid': uid if isinstance(uid, str) else None,
            'name': name if isinstance(name, str) else None,
            'namespace': namespace if isinstance(namespace, str) else None,
            'labels': meta.labels,
            'annotations': meta.annotations,
        }


@dataclasses.dataclass(kw_only=True)
class ResourceWatchingCause(ResourceCause):
    """A raw watch-event as it arrived (type ``None`` is for the initial listing)."""

    type: RawEventType
    event: RawEvent

    def _own_kwargs(self) -> dict[str, Any]:
        return {**super()._own_kwargs(), 'type': self.type, 'event': self.event}


@dataclasses.dataclass(kw_only=True)
class ResourceChangingCause(ResourceCause):
    """
    A detected change of an object: its reason, and the old & new essences with the diff between them.

    ``initial`` means that the object is seen for the first time in this operator's lifetime
    and its resuming handlers are due (they are mixed into whatever the reason is).
    """

    reason: Reason
    initial: bool = False
    diff: diffs.Diff = dataclasses.field(default_factory=diffs.Diff)
    old: Any = None
    new: Any = None

    @property
    def deleted(self) -> bool:
        """Whether the object is being deleted (it has a deletion timestamp)."""
        return finalizers.is_deletion_ongoing(self.body)

    def _own_kwargs(self) -> dict[str, Any]:
        kwargs = super()._own_kwargs()
        kwargs.update(reason=self.reason, diff=self.diff, old=self.old, new=self.new)
        return kwargs

    def kwargs_for(self, handler: BaseHandler) -> dict[str, Any]:
        kwargs = super().kwargs_for(handler)
        field = handler.field if isinstance(handler, ResourceHandler) else None
        if field:
            narrowed = narrow_to_field(self, field)
            kwargs.update(diff=narrowed.diff, old=narrowed.old, new=narrowed.new)
            kwargs.update(self.indices)  # the indices still win
        return kwargs


@dataclasses.dataclass(kw_only=True)
class ResourceSpawningCause(ResourceCause):
    """An object for which the daemons and timers are spawned (or stopped), in its current state."""


@dataclasses.dataclass(kw_only=True)
class ResourceIndexingCause(ResourceCause):
    """An object to be (re-)indexed in its current state."""


@dataclasses.dataclass(kw_only=True)
class ResourceWebhookCause(ResourceCause):
    """
    An admission request for an object.

    ``webhook`` is the id of the handler the request is addressed to (from the webhook's URL),
    or None if the request is for all the handlers of that type; ``reason`` (the webhook type)
    is None if the request is not addressed: then, the handlers of both types are selected.
    """

    reason: WebhookType | None
    webhook: HandlerId | None = None
    operation: str | None = None
    subresource: str | None = None
    dryrun: bool = False
    userinfo: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    warnings: MutableSequence[str] = dataclasses.field(default_factory=list)
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    sslpeer: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # empty without a client certificate

    def _own_kwargs(self) -> dict[str, Any]:
        return {
            **super()._own_kwargs(),
            'operation': self.operation,
            'subresource': self.subresource,
            'dryrun': self.dryrun,
            'userinfo': self.userinfo,
            'warnings': self.warnings,
            'headers': self.headers,
            'sslpeer': self.sslpeer,
        }


@dataclasses.dataclass(frozen=True)
class FieldChange:
    """The old & new values of one field and the diff between them (relative to the field)."""

    old: Any
    new: Any
    diff: diffs.Diff


def narrow_to_field(cause: ResourceChangingCause, field: dicts.FieldSpec) -> FieldChange:
    """Narrow the cause's old/new/diff to one field, as the field handlers see them."""
    if not dicts.parse_field(field):  # the root: as is (resolving would turn an absent None into {})
        return FieldChange(old=cause.old, new=cause.new, diff=cause.diff)
    return FieldChange(
        old=dicts.resolve(cause.old, field, None),
        new=dicts.resolve(cause.new, field, None),
        diff=diffs.reduce(cause.diff, field),
    )


#
# Detection.
#

def detect_changing_reason(
        *,
        event_type: RawEventType | str,
        body: Mapping[str, Any],
        old: Any,
        diff: diffs.Diff,
        finalizer: str,
        initial: bool,
) -> Reason:
    """
    Decide what has happened to the object, in this order of precedence:

    * ``GONE``: the object is deleted from the cluster (the DELETED watch-event): only forget it.
    * ``FREE``: it is being deleted, but not blocked by our finalizer: nothing to do for it anymore.
    * ``DELETE``: it is being deleted and blocked by our finalizer: the deletion handlers are due.
    * ``CREATE``: it has never been handled (there is no diff-base, i.e. no last handled essence).
    * ``UPDATE``: its essence differs from the last handled one.
    * ``RESUME``: nothing has changed, but it is seen for the first time in this operator's lifetime.
    * ``NOOP``: nothing to do.

    The resuming handlers are due whenever ``initial`` is true, not only for ``RESUME``:
    see :attr:`ResourceChangingCause.initial` and the changing registry.
    """
    if event_type == 'DELETED':
        return Reason.GONE
    if finalizers.is_deletion_ongoing(body):
        return Reason.DELETE if finalizers.is_deletion_blocked(body, finalizer) else Reason.FREE
    if old is None:
        return Reason.CREATE
    if diff:
        return Reason.UPDATE
    if initial:
        return Reason.RESUME
    return Reason.NOOP


def detect_changing_cause(
        *,
        event_type: RawEventType | str,
        resource: Resource,
        body: Body,
        old: Any,
        new: Any,
        finalizer: str,
        initial: bool,
        logger: Logger,
        patch: Patch | None = None,
        memo: Any = None,
        indices: Mapping[str, Any] | None = None,
) -> ResourceChangingCause:
    """
    Detect the changing cause of an event: compute the diff of the essences and the reason.

    ``old`` is the last handled essence from the diff-base storage (None if never handled),
    ``new`` is the current essence of the body (as the same storage builds it).
    ``initial`` is the caller's knowledge: the object is seen for the first time in this
    operator's lifetime (in the initial listing, not as a fresh creation), and its resuming
    handlers have not succeeded yet.
    """
    diff = diffs.diff(old, new)
    reason = detect_changing_reason(
        event_type=event_type, body=body, old=old, diff=diff, finalizer=finalizer, initial=initial,
    )
    return ResourceChangingCause(
        reason=reason,
        initial=initial,
        diff=diff,
        old=old,
        new=new,
        resource=resource,
        body=body,
        patch=patch if patch is not None else Patch(body=body),
        logger=logger,
        memo=memo,
        indices=indices if indices is not None else {},
    )
