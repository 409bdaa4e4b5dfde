"""
Registries of the declared handlers, and the selection of the handlers for a cause.

An :class:`OperatorRegistry` holds all handlers of an operator, by kind: activities, and
the resource handlers for watching, changing, spawning (daemons & timers), indexing, webhooks.
The decorators of ``kopf.on`` put the handlers into the default registry unless told otherwise.

The lookups are made for every event of every object, so the part that depends only on
the resource (and for the changing handlers, on the reason) is cached; the caches are dropped
whenever a handler is added. Only the filters that depend on the object are evaluated per event.

The handlers are selected in the order of their declaration, and deduplicated by their function
and id: a function declared for several overlapping causes (e.g. resuming & creation,
or two selectors of the same resource) runs once per occasion.
"""
import functools
import inspect
import os.path
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, Generic, NamedTuple, TypeVar

from kopf._cogs.structs import dicts
from kopf._cogs.structs.references import Resource, Selector
from kopf._core.intents import filters
from kopf._core.intents.causes import (
    ResourceCause,
    ResourceChangingCause,
    ResourceWebhookCause,
)
from kopf._core.intents.handlers import (
    HANDLER_REASONS,
    Activity,
    ActivityHandler,
    BaseHandler,
    ChangingHandler,
    HandlerId,
    IndexingHandler,
    Reason,
    ResourceHandler,
    SpawningHandler,
    WatchingHandler,
    WebhookHandler,
)

HandlerT = TypeVar('HandlerT', bound=BaseHandler)
ResourceHandlerT = TypeVar('ResourceHandlerT', bound=ResourceHandler)


class GenericRegistry(Generic[HandlerT]):
    """A sequence of handlers in the order of declaration."""

    def __init__(self) -> None:
        super().__init__()
        self._handlers: list[HandlerT] = []

    def __repr__(self) -> str:
        return f'<{type(self).__name__}: {[handler.id for handler in self._handlers]!r}>'

    def __len__(self) -> int:
        return len(self._handlers)

    def __bool__(self) -> bool:
        return bool(self._handlers)

    def append(self, handler: HandlerT) -> None:
        """Add a handler; adding the very same (equal) handler again changes nothing."""
        if any(existing == handler for existing in self._handlers):
            return
        self._handlers.append(handler)
        self._invalidate()

    def get_all_handlers(self) -> list[HandlerT]:
        return list(self._handlers)

    def _invalidate(self) -> None:
        _registries_changed()


# The number of changes of all registries so far: the answers remembered by the operators' registries
# (e.g. which kinds of handlers a resource has) hold until any registry changes. Under a lock, so that
# no change is lost between the threads (the registries change rarely, if ever, at runtime).
_generation = 0
_generation_lock = threading.Lock()


def _registries_changed() -> None:
    global _generation
    with _generation_lock:
        _generation += 1


class ActivityRegistry(GenericRegistry[ActivityHandler]):
    def get_handlers(self, activity: Activity) -> list[ActivityHandler]:
        return deduplicated(handler for handler in self._handlers if handler.activity == activity)


class ResourceRegistry(GenericRegistry[ResourceHandlerT], Generic[ResourceHandlerT]):
    """Handlers of some resources: selectable by the resource, then by the filters per object."""

    def __init__(self) -> None:
        super().__init__()
        self._by_resource: dict[Resource, tuple[ResourceHandlerT, ...]] = {}
        self._unfiltered: dict[Resource, _Unfiltered] = {}

    def _invalidate(self) -> None:
        super()._invalidate()
        self._by_resource.clear()
        self._unfiltered.clear()

    def _unfiltered_of(self, resource: Resource) -> '_Unfiltered':
        """What is known of the resource's handlers regardless of the objects, if none filters the objects."""
        try:
            return self._unfiltered[resource]
        except KeyError:
            pass
        handlers = self.get_resource_handlers(resource)
        unfiltered = self._unfiltered[resource] = _Unfiltered(
            prematch=all(filters.prematches_all(handler) for handler in handlers),
            requires_finalizer=any(handler.requires_finalizer for handler in handlers
                                   if isinstance(handler, ChangingHandler)),
        )
        return unfiltered

    def get_selectors(self) -> frozenset[Selector]:
        """All the resource specifications of the handlers (sub-handlers have none)."""
        return frozenset(handler.selector for handler in self._handlers if handler.selector is not None)

    def select_resources(self, resources: Collection[Resource]) -> frozenset[Resource]:
        """The resources (out of those existing in the cluster) that these handlers serve."""
        selected: set[Resource] = set()
        for selector in self.get_selectors():
            selected |= selector.select(resources)
        return frozenset(selected)

    def has_handlers(self, resource: Resource) -> bool:
        # Asked several times for every event: the cached answer is read without one more call.
        handlers = self._by_resource.get(resource)
        return bool(handlers if handlers is not None else self.get_resource_handlers(resource))

    def get_resource_handlers(self, resource: Resource) -> tuple[ResourceHandlerT, ...]:
        """The handlers of the resource, regardless of the filters (cached)."""
        try:
            return self._by_resource[resource]
        except KeyError:
            pass
        handlers = tuple(
            handler for handler in self._handlers
            if handler.selector is None or handler.selector.check(resource)
        )
        self._by_resource[resource] = handlers
        return handlers

    def iter_handlers(self, cause: ResourceCause) -> Iterator[ResourceHandlerT]:
        """The handlers whose filters match the cause's object (and change), deduplicated."""
        yield from _iter_deduplicated(self._iter_candidates(cause), lambda h: filters.match(h, cause))

    def get_handlers(self, cause: ResourceCause) -> list[ResourceHandlerT]:
        return list(self.iter_handlers(cause))

    def prematch(self, cause: ResourceCause) -> bool:
        """Whether any handler is interested in the object in its current state (changes aside)."""
        # Asked for every event: usually, no handler filters the objects, and no handler is checked then.
        if self._unfiltered_of(cause.resource).prematch:
            return self.has_handlers(cause.resource)
        return any(filters.prematch(handler, cause) for handler in self.get_resource_handlers(cause.resource))

    def _iter_candidates(self, cause: ResourceCause) -> Iterable[ResourceHandlerT]:
        return self.get_resource_handlers(cause.resource)


class WatchingRegistry(ResourceRegistry[WatchingHandler]):
    pass


class ChangingRegistry(ResourceRegistry[ChangingHandler]):
    """
    The handlers of the detected changes; also used for the sub-handlers of a running handler.

    A handler matches a cause's reason if it is declared for that reason, or for any reason
    (the field handlers, the sub-handlers). The resuming handlers (``initial``) match any handling
    reason while the object is seen for the first time, except the deletion unless ``deleted``.
    The reasons that need only the framework's reaction (noop, free, gone) match nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        # The candidates of a reason, and the same deduplicated if none of them filters the objects (or None).
        self._by_reason: dict[tuple[Resource, Reason, bool],
                              tuple[tuple[ChangingHandler, ...], tuple[ChangingHandler, ...] | None]] = {}
        self._extra_fields: dict[Resource, frozenset[dicts.FieldPath]] = {}
        self._blind: dict[Resource, bool] = {}

    def _invalidate(self) -> None:
        super()._invalidate()
        self._by_reason.clear()
        self._extra_fields.clear()
        self._blind.clear()

    def _iter_candidates(self, cause: ResourceCause) -> Iterable[ChangingHandler]:
        candidates = self._candidates_of(cause)
        return candidates[0] if candidates is not None else ()

    def _candidates_of(
            self, cause: ResourceCause,
    ) -> tuple[tuple[ChangingHandler, ...], tuple[ChangingHandler, ...] | None] | None:
        if not isinstance(cause, ResourceChangingCause):
            return None
        return self._candidates_by_reason(cause.resource, cause.reason, cause.initial)

    def _candidates_by_reason(
            self, resource: Resource, reason: Reason, initial: bool,
    ) -> tuple[tuple[ChangingHandler, ...], tuple[ChangingHandler, ...] | None]:
        key = (resource, reason, initial)
        try:
            return self._by_reason[key]
        except KeyError:
            pass
        handlers = tuple(
            handler for handler in self.get_resource_handlers(resource)
            if matches_reason(handler, reason=reason, initial=initial)
        )
        matching = tuple(deduplicated(handlers)) if all(map(filters.matches_all, handlers)) else None
        candidates = self._by_reason[key] = (handlers, matching)
        return candidates

    def resumes_nothing(self, resource: Resource) -> bool:
        """Whether no handler is due for an unchanged object seen for the first time (no resuming ones)."""
        return not self._candidates_by_reason(resource, Reason.RESUME, True)[0]

    def finalizer_regardless_of_objects(self, resource: Resource) -> bool | None:
        """
        Whether our finalizer is needed for every object or for none (as :meth:`requires_finalizer` says);
        None if it depends on the object: some handlers filter the objects.
        """
        unfiltered = self._unfiltered_of(resource)
        return unfiltered.requires_finalizer if unfiltered.prematch else None

    def get_handlers(self, cause: ResourceCause) -> list[ChangingHandler]:
        # Asked for every event: usually, no handler filters the objects, and no handler is checked then.
        candidates = self._candidates_of(cause)
        if candidates is not None and candidates[1] is not None:
            return list(candidates[1])
        return super().get_handlers(cause)

    def requires_finalizer(self, cause: ResourceCause) -> bool:
        """Whether a non-optional deletion handler is interested in the object (in its current state)."""
        unfiltered = self._unfiltered_of(cause.resource)
        if unfiltered.prematch:  # asked for every event: usually, no handler filters the objects
            return unfiltered.requires_finalizer
        return any(
            handler.requires_finalizer and filters.prematch(handler, cause)
            for handler in self.get_resource_handlers(cause.resource)
        )

    def get_extra_fields(self, resource: Resource) -> frozenset[dicts.FieldPath]:
        """
        The fields that the change-detecting handlers of the resource watch for changes.

        The essence of the objects (the diff-base) must keep them even if it normally drops them
        (e.g. ``status.x``), otherwise their changes would never be seen.
        """
        try:
            return self._extra_fields[resource]
        except KeyError:
            pass
        fields = frozenset(
            handler.field for handler in self.get_resource_handlers(resource)
            if handler.field and handler.field_needs_change
        )
        self._extra_fields[resource] = fields
        return fields

    def is_blind_to_own_writes(self, resource: Resource) -> bool:
        """
        Whether the framework's writes (status, finalizers, Kopf's annotations) cannot change the matching.

        I.e. none of the resource's handlers looks at them: no ``when=`` and no callable values anywhere
        (they get the whole body), no annotation filters, no fields in the status or metadata
        (neither filtered nor watched for changes). Then an object that differs from a handled one only by
        such writes is handled the same way (see the echoes of our own patches in the processing).
        """
        try:
            return self._blind[resource]
        except KeyError:
            pass
        blind = all(_is_blind_to_own_writes(handler) for handler in self.get_resource_handlers(resource))
        self._blind[resource] = blind
        return blind


_OWN_ROOTS = frozenset({'status', 'metadata'})  # where the framework writes to the objects


class HandlerKinds(NamedTuple):
    """Which kinds of handlers a resource has (see :meth:`OperatorRegistry.get_handler_kinds`)."""

    watching: bool  # the event handlers
    spawning: bool  # the daemons & timers
    changing: bool  # the change-detecting handlers (creation, update, deletion, resuming, fields)


class ListingPlan(NamedTuple):
    """
    What decides about a listed object that may need nothing (see :meth:`OperatorRegistry.get_listing_plan`).

    Only for the resources with change handlers alone, none of them resuming or filtering the objects.
    """

    requires_finalizer: bool  # our finalizer is needed for every object (or for none)
    handler_ids: tuple[str, ...]  # whose progress records the objects may hold
    extra_fields: frozenset[dicts.FieldPath]  # the essences' extra fields (see get_extra_fields())


class _Unfiltered(NamedTuple):
    """What is known of a resource's handlers regardless of the objects, if none of them filters them."""

    prematch: bool  # whether none filters the objects (by labels, annotations, fields, when=): all prematch
    requires_finalizer: bool  # whether any needs our finalizer (for every object, if none filters them)


def _is_blind_to_own_writes(handler: ChangingHandler) -> bool:
    values = [handler.value, handler.old, handler.new, *(handler.labels or {}).values()]
    return (handler.when is None and handler.annotations is None and not any(map(callable, values))
            and not (handler.field and handler.field[0] in _OWN_ROOTS))


def matches_reason(handler: ChangingHandler, *, reason: Reason, initial: bool) -> bool:
    """Whether a changing handler is due for the reason (see :class:`ChangingRegistry`)."""
    if reason not in HANDLER_REASONS:
        return False
    if handler.initial:
        return initial and (reason != Reason.DELETE or bool(handler.deleted))
    return handler.reason is None or handler.reason == reason


class SpawningRegistry(ResourceRegistry[SpawningHandler]):
    def requires_finalizer(self, cause: ResourceCause) -> bool:
        """Whether a daemon or a timer that keeps the object from deletion is interested in the object."""
        return any(
            handler.requires_finalizer and filters.match(handler, cause)
            for handler in self.get_resource_handlers(cause.resource)
        )


class IndexingRegistry(ResourceRegistry[IndexingHandler]):
    pass


class WebhooksRegistry(ResourceRegistry[WebhookHandler]):
    """
    The admission handlers: selected by the webhook type, the addressed handler id (if any),
    the operation, and the subresource, then by the usual filters.
    """

    def _iter_candidates(self, cause: ResourceCause) -> Iterable[WebhookHandler]:
        if not isinstance(cause, ResourceWebhookCause):
            return ()
        return (
            handler for handler in self.get_resource_handlers(cause.resource)
            if (cause.reason is None or handler.reason == cause.reason)
            and (cause.webhook is None or handler.id == cause.webhook)
            and (handler.operations is None or cause.operation in handler.operations)
            and (handler.subresource == '*' or handler.subresource == cause.subresource)
        )


class OperatorRegistry:
    """
    All the handlers of an operator, by kind.

    Usually populated by the ``@kopf.on...`` decorators (into the default registry),
    but can be created and populated explicitly, e.g. for embedded operators and tests.
    """

    activities: ActivityRegistry
    watching: WatchingRegistry
    changing: ChangingRegistry
    spawning: SpawningRegistry
    indexing: IndexingRegistry
    webhooks: WebhooksRegistry

    def __init__(self) -> None:
        super().__init__()
        self.activities = ActivityRegistry()
        self.watching = WatchingRegistry()
        self.changing = ChangingRegistry()
        self.spawning = SpawningRegistry()
        self.indexing = IndexingRegistry()
        self.webhooks = WebhooksRegistry()
        self._kinds: dict[Resource, tuple[int, HandlerKinds]] = {}
        self._plans: dict[Resource, tuple[int, ListingPlan | None]] = {}

    def get_handler_kinds(self, resource: Resource) -> 'HandlerKinds':
        """
        Which kinds of handlers the resource has: the same as their registries' ``has_handlers()``.

        Asked for every event: remembered per resource until any registry changes, so that it is one call.
        """
        known = self._kinds.get(resource)
        generation = _generation  # read before the registries: if they change meanwhile, it is asked anew
        if known is not None and known[0] == generation:
            return known[1]
        kinds = HandlerKinds(watching=self.watching.has_handlers(resource),
                             spawning=self.spawning.has_handlers(resource),
                             changing=self.changing.has_handlers(resource))
        self._kinds[resource] = (generation, kinds)
        return kinds

    def get_listing_plan(self, resource: Resource) -> ListingPlan | None:
        """
        What a listed object's handling depends on, if it can need nothing (else None): only change handlers,
        none resuming the objects (they are due for every listed object), none filtering them (then, our
        finalizer is needed for all of them or for none). Asked for every listed object: remembered per
        resource until any registry changes, as :meth:`get_handler_kinds`.
        """
        known = self._plans.get(resource)
        generation = _generation  # read before the registries: if they change meanwhile, it is asked anew
        if known is not None and known[0] == generation:
            return known[1]
        kinds = self.get_handler_kinds(resource)
        requires = self.changing.finalizer_regardless_of_objects(resource)
        plan: ListingPlan | None = None
        if (kinds.changing and not kinds.watching and not kinds.spawning and requires is not None
                and self.changing.resumes_nothing(resource)):
            plan = ListingPlan(
                requires_finalizer=requires,
                handler_ids=tuple(handler.id for handler in self.changing.get_resource_handlers(resource)),
                extra_fields=self.changing.get_extra_fields(resource),
            )
        self._plans[resource] = (generation, plan)
        return plan

    def __repr__(self) -> str:
        parts = ', '.join(f'{name}={len(registry)}' for name, registry in self._all_registries().items())
        return f'<{type(self).__name__}: {parts}>'

    def _all_registries(self) -> dict[str, GenericRegistry[Any]]:
        return {
            'activities': self.activities,
            'watching': self.watching,
            'changing': self.changing,
            'spawning': self.spawning,
            'indexing': self.indexing,
            'webhooks': self.webhooks,
        }

    def _watched_registries(self) -> tuple[ResourceRegistry[Any], ...]:
        # The webhooks get their objects in the admission requests, not via the watch-streams.
        return (self.watching, self.changing, self.spawning, self.indexing)

    def get_selectors(self) -> frozenset[Selector]:
        """The resource specifications that need watching (all resource handlers except webhooks)."""
        return frozenset().union(*(registry.get_selectors() for registry in self._watched_registries()))

    def select_resources(self, resources: Collection[Resource]) -> frozenset[Resource]:
        """Which of the cluster's resources need watching, with the names' ambiguities resolved."""
        selected: set[Resource] = set()
        for selector in self.get_selectors():
            selected |= selector.select(resources)
        return frozenset(selected)

    def has_handlers(self, resource: Resource) -> bool:
        """Whether the resource needs watching: any handler except webhooks serves it."""
        return any(registry.has_handlers(resource) for registry in self._watched_registries())

    def requires_finalizer(self, cause: ResourceCause) -> bool:
        """Whether our finalizer must block the object's deletion: for the deletion handlers or daemons."""
        return self.changing.requires_finalizer(cause) or self.spawning.requires_finalizer(cause)


#
# Deduplication and ids.
#

def deduplicated(handlers: Iterable[HandlerT]) -> list[HandlerT]:
    """The handlers without repetitions of the same function with the same id; the first one stays."""
    return list(_iter_deduplicated(handlers, lambda handler: True))


def _iter_deduplicated(
        handlers: Iterable[HandlerT],
        predicate: Callable[[HandlerT], bool],
) -> Iterator[HandlerT]:
    seen: set[tuple[Any, HandlerId]] = set()
    for handler in handlers:
        key = (_function_key(handler.fn), handler.id)
        if key not in seen and predicate(handler):
            seen.add(key)
            yield handler


def _function_key(fn: Any) -> Any:
    # Bound methods are made anew on every attribute access but are equal: compare them by value.
    # Unhashable callables (e.g. instances of eq-dataclasses with __call__) can only be compared by identity.
    try:
        hash(fn)
    except TypeError:
        return ('id', id(fn))
    return ('fn', fn)


def get_callable_id(fn: Callable[..., Any]) -> str:
    """
    The default handler id of a function: its name.

    Partials and decorated functions (``functools.wraps``) are named after the wrapped function.
    Lambdas have no meaningful names, so their source location is used instead.
    """
    while True:
        wrapped = getattr(fn, '__wrapped__', None)
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif isinstance(fn, (staticmethod, classmethod)):
            fn = fn.__func__
        elif wrapped is not None and callable(wrapped):
            fn = wrapped
        else:
            break
    name = getattr(fn, '__name__', None)
    if name == '<lambda>':
        code = getattr(fn, '__code__', None)
        if code is not None:
            return f'lambda@{os.path.basename(code.co_filename)}:{code.co_firstlineno}'
    if isinstance(name, str) and name:
        return name
    if not inspect.isroutine(fn):  # a callable object: named after its class
        return type(fn).__name__
    return repr(fn)


def generate_id(
        fn: Callable[..., Any],
        *,
        id: str | None,
        prefix: str | None = None,
        suffix: str | None = None,
) -> HandlerId:
    """
    Make the id of a handler: ``[prefix/]{id or the function's name}[/suffix]``.

    The prefix is the parent handler's id (for sub-handlers), the suffix is the field
    (for the handlers with ``field=``), so that one function can be declared for several fields.
    """
    real_id = id if id is not None else get_callable_id(fn)
    if suffix:
        real_id = f'{real_id}/{suffix}'
    if prefix:
        real_id = f'{prefix}/{real_id}'
    return HandlerId(real_id)


#
# The default registry.
#

_default_registry: OperatorRegistry | None = None


def get_default_registry() -> OperatorRegistry:
    """The registry used by the decorators and the operator unless another one is given to them explicitly."""
    global _default_registry
    if _default_registry is None:
        _default_registry = OperatorRegistry()
    return _default_registry


def set_default_registry(registry: OperatorRegistry) -> None:
    """Replace the registry used by the decorators and the operator unless another one is given to them."""
    global _default_registry
    _default_registry = registry
