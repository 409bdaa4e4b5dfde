"""
The declared handlers: what function to call, for what, with which options and filters.

The handlers are immutable records made by the decorators of ``kopf.on`` (or directly,
in embedded operators and tests). All their options except ``fn`` and ``id`` default to "not set",
so the framework's defaults apply (e.g. the back-off comes from ``settings.execution``).

The hierarchy follows what the framework does with them::

    BaseHandler
    ├── ActivityHandler              startup, cleanup, login, probe
    └── ResourceHandler              selector + filters (labels, annotations, when, field, value)
        ├── WatchingHandler          @kopf.on.event: every raw watch-event, errors ignored
        ├── ChangingHandler          @kopf.on.create/update/delete/resume/field, sub-handlers
        ├── SpawningHandler          long-living per-object activities:
        │   ├── DaemonHandler        @kopf.daemon
        │   └── TimerHandler         @kopf.timer
        ├── IndexingHandler          @kopf.index
        └── WebhookHandler           @kopf.on.validate/mutate
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, NewType

from kopf._cogs.structs.dicts import FieldPath
from kopf._cogs.structs.references import Selector

if TYPE_CHECKING:
    from kopf._core.intents.callbacks import DelayFn, HandlerFn, WhenFilterFn
    from kopf._core.intents.filters import MetaFilter, ValueFilter

# The handler's identifier: unique per object within one operator; the key of its progress records,
# its results in the status, and (for indexers) the name of the index.
HandlerId = NewType('HandlerId', str)


class ErrorsMode(enum.Enum):
    """How the arbitrary exceptions of a handler (other than Kopf's own error classes) are treated."""

    IGNORED = enum.auto()
    TEMPORARY = enum.auto()
    PERMANENT = enum.auto()


class Reason(enum.StrEnum):
    """What has happened to an object, as the framework sees it (the ``reason`` kwarg of handlers)."""

    CREATE = 'create'
    UPDATE = 'update'
    DELETE = 'delete'
    RESUME = 'resume'
    NOOP = 'noop'
    FREE = 'free'
    GONE = 'gone'


# The reasons for which the changing handlers are invoked; the others only need the framework's reaction.
HANDLER_REASONS: frozenset[Reason] = frozenset({Reason.CREATE, Reason.UPDATE, Reason.DELETE, Reason.RESUME})
REACTING_REASONS: frozenset[Reason] = frozenset({Reason.NOOP, Reason.FREE, Reason.GONE})


class Activity(enum.StrEnum):
    """The operator-level activities with their own handlers (not related to any object)."""

    STARTUP = 'startup'
    CLEANUP = 'cleanup'
    AUTHENTICATION = 'authentication'
    PROBE = 'probe'


class WebhookType(enum.StrEnum):
    """The kinds of admission webhooks."""

    VALIDATING = 'validating'
    MUTATING = 'mutating'


# The operations of admission requests, as Kubernetes names them.
ADMISSION_OPERATIONS: frozenset[str] = frozenset({'CREATE', 'UPDATE', 'DELETE', 'CONNECT'})


@dataclasses.dataclass(frozen=True, kw_only=True)
class BaseHandler:
    """
    What every handler has: the function, the id, the param, and the error-handling options.

    ``errors``, ``timeout``, ``retries``, ``backoff`` of ``None`` mean the framework's defaults:
    the errors are retried (except where the docs say they are ignored), forever, with the back-off
    from ``settings.execution.default_backoff``.
    """

    fn: HandlerFn
    id: HandlerId
    param: Any = None
    errors: ErrorsMode | None = None
    timeout: float | None = None
    retries: int | None = None
    backoff: float | None = None

    def __str__(self) -> str:
        return f'Handler {self.id!r}'


@dataclasses.dataclass(frozen=True, kw_only=True)
class ActivityHandler(BaseHandler):
    activity: Activity


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResourceHandler(BaseHandler):
    """
    A handler of objects of some resources, with optional filters (all must match: AND).

    ``selector`` is ``None`` only for sub-handlers: they serve whatever their parent serves.
    ``field`` with no ``value`` means that the field must be present (see the filters module).
    ``value`` of ``None`` means "not filtered by value": ``None`` cannot be a criterion itself,
    since it means an absent field (use ``kopf.ABSENT`` for that).
    """

    selector: Selector | None = None
    labels: MetaFilter | None = None
    annotations: MetaFilter | None = None
    when: WhenFilterFn | None = None
    field: FieldPath | None = None
    value: ValueFilter | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class WatchingHandler(ResourceHandler):
    """A silent spy on the raw watch-events: no progress is stored, errors are logged and ignored."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChangingHandler(ResourceHandler):
    """
    A handler of the detected changes: creation, update, deletion, resuming, field changes.

    ``reason`` of ``None`` means any of the handling reasons (field handlers and sub-handlers).
    ``initial`` marks the resuming handlers: they run once per object per operator lifetime,
    mixed into whatever cause is being handled at that moment, but not into a deletion
    unless ``deleted`` is set.
    ``requires_finalizer`` (non-optional deletion handlers) blocks the object's actual deletion
    until the handlers are done.
    ``field_needs_change`` (update and field handlers) requires the field to be changed
    in the diff, and applies ``value`` to either the old or the new value of the field;
    ``old``/``new`` filter the old and the new values separately.
    """

    reason: Reason | None = None
    initial: bool | None = None
    deleted: bool | None = None
    requires_finalizer: bool | None = None
    field_needs_change: bool | None = None
    old: ValueFilter | None = None
    new: ValueFilter | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpawningHandler(ResourceHandler):
    """
    A long-living per-object activity (daemons and timers): runs while the object matches the filters.

    Their objects get a finalizer so that the activity stops before the object is actually deleted.
    """

    requires_finalizer: bool | None = True
    initial_delay: float | DelayFn | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DaemonHandler(SpawningHandler):
    cancellation_backoff: float | None = None  # how long to wait after the stop-flag before cancelling
    cancellation_timeout: float | None = None  # how long to wait after cancelling before abandoning
    cancellation_polling: float | None = None  # how often to check a non-cancellable daemon for exit


@dataclasses.dataclass(frozen=True, kw_only=True)
class TimerHandler(SpawningHandler):
    interval: float | None = None  # between the invocations (or between their starts, if sharp)
    sharp: bool | None = None  # whether the interval is counted from the start of the previous run
    idle: float | None = None  # how long the object must stay unchanged before the timer triggers


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexingHandler(ResourceHandler):
    """An indexing function: its id is the name of the index (and of the kwarg that carries it)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class WebhookHandler(ResourceHandler):
    """
    An admission handler: validating or mutating, for some operations and subresources.

    ``operations`` of ``None`` means all operations. ``subresource`` of ``None`` means only
    the main body of the objects, ``'*'`` means the main body and all the subresources.
    """

    reason: WebhookType
    operations: Collection[str] | None = None
    subresource: str | None = None
    persistent: bool | None = None
    side_effects: bool | None = None
    ignore_failures: bool | None = None
