"""
In-memory indexing of the objects: ``@kopf.index``, :class:`kopf.Index`, :class:`kopf.Store`.

Every indexing function (an :class:`~kopf._core.intents.handlers.IndexingHandler`) fills one index,
named by the handler's id. An index maps arbitrary keys to stores (collections) of values; the values
come from the objects: every object *contributes* the result of the function for its current state.
A contribution is replaced as a whole on every change of the object, and removed when the object
is deleted or stops matching the handler's filters (and so are the stores left empty).

What the function returns is its contribution:

* a ``dict`` (strictly ``dict``, not any mapping): its keys & values go into the index;
* ``None``: no change --- the previous contribution (if any) stays as it is;
* anything else: a value under the key ``None``.

The errors of the function depend on its ``errors=`` mode (``IGNORED`` by default):
ignored errors keep the previous contribution, as ``None`` does; the permanent errors drop it and
exclude the object from this index for good; the temporary errors drop it and exclude the object
until the delay is over (the next event of the object after that retries the indexing), until the
``retries=``/``timeout=`` limits turn them into permanent ones. The retrying state is kept in memory
only while the object fails: a success or the object's deletion forgets it.

Readiness: the indices must be complete before any other handler of any resource runs.
Every watch-stream of an indexed resource reports (to :class:`IndexingReadiness`) when all objects
of its initial listing have been indexed; the processing of every object waits until all streams
have reported (:meth:`IndexingReadiness.wait`), while the indexing itself never waits for that.
The readiness is a one-time latch of the operator's startup: the streams that appear later
(new namespaces, new custom resources) fill their indices as their listings arrive, but they do not
stop the handlers of the already-served objects. If the readiness takes long (e.g. a listing fails
again and again), the streams that are not ready yet are reported in the logs periodically.

With the sharding, a replica indexes only the objects of its own shards (the others' events are dropped
before the indexing); the objects of the shards it gives away are removed from its indices.
"""
import asyncio
import dataclasses
import logging
from collections.abc import Callable, Collection, Hashable, ItemsView, Iterable, Iterator, Mapping, ValuesView
from typing import Any, Generic, TypeVar

from kopf._cogs.structs.bodies import Body, RawEvent
from kopf._cogs.structs.references import Resource
from kopf._core.actions import execution, loggers
from kopf._core.actions.progression import HandlerState
from kopf._core.intents.causes import ResourceIndexingCause
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import ErrorsMode, HandlerId, IndexingHandler
from kopf._core.intents.registries import OperatorRegistry

__all__ = [
    'Index',
    'IndexingReadiness',
    'OperatorIndexers',
    'OperatorIndices',
    'ReadinessToggle',
    'Store',
]

logger = logging.getLogger(__name__)

_K = TypeVar('_K')
_V = TypeVar('_V')

# Who contributes to an index: an object, by its uid (or, for bodies without uids, by its resource & name).
ObjectKey = Hashable

# How often the streams that keep the handlers waiting for the indices are reported (seconds).
READINESS_REPORTING_INTERVAL = 30.0


class Store(Collection[_V], Generic[_V]):
    """
    All values under one key of an index, as contributed by the objects (one value per object).

    A read-only collection: the framework changes it as the objects change. The order of the values
    is not guaranteed; the values are not deduplicated (several objects can contribute equal values).
    Iterating it is safe from the handlers' threads while the indexing changes it (a snapshot is iterated).
    """

    __slots__ = ('_values',)

    def __init__(self) -> None:
        super().__init__()
        self._values: dict[ObjectKey, _V] = {}

    def __repr__(self) -> str:
        return repr(list(self._values.values()))

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[_V]:
        return iter(list(self._values.values()))

    def __contains__(self, value: object) -> bool:
        return value in list(self._values.values())

    def _put(self, owner: ObjectKey, value: _V) -> None:
        self._values[owner] = value

    def _discard(self, owner: ObjectKey) -> None:
        self._values.pop(owner, None)


class Index(Mapping[_K, Store[_V]], Generic[_K, _V]):
    """
    One index: a read-only mapping of arbitrary keys to the stores of values indexed under them.

    It is filled by one indexing function (its handler id is the index's name), never has empty stores,
    and exists (maybe empty) as soon as the operator starts. Lookups and per-object updates are O(1)
    for every key of the object. Iterating it is safe from the handlers' threads (a snapshot of the keys).
    """

    __slots__ = ('_contributions', '_stores')

    def __init__(self) -> None:
        super().__init__()
        self._stores: dict[_K, Store[_V]] = {}
        self._contributions: dict[ObjectKey, tuple[_K, ...]] = {}  # the keys where each object has values

    def __repr__(self) -> str:
        return repr(self._stores)

    def __len__(self) -> int:
        return len(self._stores)

    def __iter__(self) -> Iterator[_K]:
        return iter(list(self._stores))

    def __getitem__(self, key: _K) -> Store[_V]:
        return self._stores[key]

    def __contains__(self, key: object) -> bool:
        return key in self._stores

    def items(self) -> ItemsView[_K, Store[_V]]:
        return _SnapshotItemsView(self)

    def values(self) -> ValuesView[Store[_V]]:
        return _SnapshotValuesView(self)

    def _replace(self, owner: ObjectKey, contribution: Mapping[_K, _V]) -> None:
        """Put the object's new contribution instead of its previous one (if any)."""
        old_keys = self._contributions.get(owner, ())
        for key in old_keys:
            if key not in contribution:
                self._discard_value(key, owner)
        for key, value in contribution.items():
            store = self._stores.get(key)
            if store is None:
                store = self._stores[key] = Store()
            store._put(owner, value)
        if contribution:
            self._contributions[owner] = tuple(contribution)
        else:
            self._contributions.pop(owner, None)

    def _discard(self, owner: ObjectKey) -> None:
        """Remove everything the object has contributed (nothing happens if it has not)."""
        for key in self._contributions.pop(owner, ()):
            self._discard_value(key, owner)

    def _discard_value(self, key: _K, owner: ObjectKey) -> None:
        store = self._stores.get(key)
        if store is not None:
            store._discard(owner)
            if not store:
                del self._stores[key]


class _SnapshotItemsView(ItemsView[_K, Store[_V]]):
    # The keys can vanish while an async handler iterates and awaits: iterate what was there at the start.
    _mapping: Index[_K, _V]

    def __iter__(self) -> Iterator[tuple[_K, Store[_V]]]:
        return iter(list(self._mapping._stores.items()))


class _SnapshotValuesView(ValuesView[Store[_V]]):
    _mapping: Index[Any, _V]

    def __iter__(self) -> Iterator[Store[_V]]:
        return iter(list(self._mapping._stores.values()))


def _as_contribution(result: object) -> Mapping[Any, Any]:
    # Strictly dicts are the keyed results: not other mappings, not even dict's descendants (e.g. memos).
    if type(result) is dict:
        return result
    return {None: result}


class OperatorIndices(Mapping[str, Index[Any, Any]]):
    """
    The operator's indices by their names: a live read-only view, injected into the handlers' kwargs.

    The indices declared after the view is made (e.g. by the startup handlers) appear in it too.
    """

    __slots__ = ('_indices',)

    def __init__(self, indices: Mapping[str, Index[Any, Any]]) -> None:
        super().__init__()
        self._indices = indices

    def __repr__(self) -> str:
        return repr(dict(self._indices))

    def __len__(self) -> int:
        return len(self._indices)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._indices))

    def __getitem__(self, name: str) -> Index[Any, Any]:
        return self._indices[name]


class ReadinessToggle:
    """One watch-stream of an indexed resource: whether its initial listing is fully indexed."""

    __slots__ = ('_readiness', 'name', 'on')

    def __init__(self, name: str, readiness: 'IndexingReadiness') -> None:
        super().__init__()
        self.name = name
        self.on = False
        self._readiness = readiness

    def __repr__(self) -> str:
        return f'<{type(self).__name__} {self.name!r} on={self.on}>'

    def turn_on(self) -> None:
        """The initial listing of the stream is indexed (the stream stays known)."""
        if not self.on:
            self.on = True
            self._readiness._reconsider()

    def drop(self) -> None:
        """The stream is gone (e.g. its namespace is not served anymore): nothing to wait for."""
        self._readiness._forget(self)


class IndexingReadiness:
    """
    Whether the indices are filled from the initial listings of all the watch-streams of the operator.

    The watch-streams of the indexed resources make their toggles (:meth:`expect`) synchronously
    when they start, i.e. before any object of any stream is processed; the processing of the objects
    waits (:meth:`wait`) until all the toggles are on. It is a one-time latch: once the indices are
    ready, the later streams (and their toggles) keep nobody waiting.
    """

    def __init__(self, *, reporting_interval: float = READINESS_REPORTING_INTERVAL) -> None:
        super().__init__()
        self._toggles: list[ReadinessToggle] = []
        self._ready = False
        self._event: asyncio.Event | None = None  # made in the operator's loop when someone waits
        self._reporting_interval = reporting_interval
        self._reporter: asyncio.TimerHandle | None = None
        self._waiters = 0

    @property
    def ready(self) -> bool:
        """Whether the handlers can run (checked cheaply for every event; e.g. no indexed streams at all)."""
        return self._ready or self._reconsider()

    def expect(self, name: str) -> ReadinessToggle:
        """A new watch-stream of an indexed resource (``name`` is for the logs); it is not ready yet."""
        toggle = ReadinessToggle(name, self)
        if not self._ready:
            self._toggles.append(toggle)
        return toggle

    async def wait(self) -> None:
        """Wait until all the streams known so far have their initial listings indexed (at once if so)."""
        if self._reconsider():  # e.g. no indexed streams at all
            return
        if self._event is None:
            self._event = asyncio.Event()
        if self._reporter is None:
            loop = asyncio.get_running_loop()
            self._reporter = loop.call_later(self._reporting_interval, self._report)
        self._waiters += 1
        try:
            await self._event.wait()
        finally:
            self._waiters -= 1
            if not self._waiters and self._reporter is not None:  # e.g. the operator exits before ready
                self._reporter.cancel()
                self._reporter = None

    def _forget(self, toggle: ReadinessToggle) -> None:
        if toggle in self._toggles:
            self._toggles.remove(toggle)
            self._reconsider()

    def _reconsider(self) -> bool:
        """Open the latch if all the streams are ready; tell whether it is open."""
        if self._ready or not all(toggle.on for toggle in self._toggles):
            return self._ready
        self._ready = True
        self._toggles.clear()
        if self._event is not None:
            self._event.set()
        if self._reporter is not None:
            self._reporter.cancel()
            self._reporter = None
        logger.debug('The indices are filled from the initial listings; the handlers can run now.')
        return True

    def _report(self) -> None:
        waiting = ', '.join(toggle.name for toggle in self._toggles if not toggle.on)
        logger.warning(f'The handlers are waiting for the indices to be filled from the initial listings '
                       f'of: {waiting}. Check the errors of these watch-streams (e.g. the permissions).')
        loop = asyncio.get_running_loop()
        self._reporter = loop.call_later(self._reporting_interval, self._report)


@dataclasses.dataclass(eq=False)
class _Exclusion:
    """An object excluded from one index after an error: the retrying state, or forever if final."""

    state: HandlerState
    forever: bool


class OperatorIndexers(Mapping[str, Index[Any, Any]]):
    """
    All the indices of one operator by their names (the ids of the indexing handlers), and their filling.

    Give one to :func:`kopf.operator` (``indexers=``) to see the indices from outside of the handlers,
    e.g. in an embedding application or in tests; by default, every operator makes its own.
    ``indices`` is the view given to the handlers as kwargs. One operator at a time can use it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._indices: dict[str, Index[Any, Any]] = {}
        self._exclusions: dict[tuple[HandlerId, ObjectKey], _Exclusion] = {}
        self._effective: dict[int, tuple[IndexingHandler, IndexingHandler]] = {}  # by id(): not hashable
        self.indices = OperatorIndices(self._indices)
        self.readiness = IndexingReadiness()

    def __repr__(self) -> str:
        return f'<{type(self).__name__}: {sorted(self._indices)!r}>'

    def __len__(self) -> int:
        return len(self._indices)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._indices))

    def __getitem__(self, name: str) -> Index[Any, Any]:
        return self._indices[name]

    def ensure(self, handlers: Iterable[IndexingHandler]) -> None:
        """Make the (empty) indices of the handlers, so that they exist even before anything is indexed."""
        for handler in handlers:
            self._indices.setdefault(handler.id, Index())

    async def index_resource_event(
            self,
            *,
            raw_event: RawEvent,
            resource: Resource,
            registry: OperatorRegistry,
            settings: OperatorSettings,
            memo: object = None,
    ) -> None:
        """
        Update all the indices of the resource with the object of this event (the latest one of it).

        Called for every event of the indexed resources, one call at a time per object.
        """
        handlers = registry.indexing.get_resource_handlers(resource)
        if not handlers:
            return
        raw_body = raw_event['object']
        owner = _object_key(resource, raw_body)

        if raw_event['type'] == 'DELETED':
            for handler in handlers:
                self._index_of(handler.id)._discard(owner)
                self._exclusions.pop((handler.id, owner), None)
            return

        body = Body(raw_body)
        cause = ResourceIndexingCause(
            resource=resource,
            body=body,
            logger=loggers.LocalObjectLogger(body=raw_body, settings=settings),
            memo=memo,
            indices=self.indices,
        )
        matching = registry.indexing.get_handlers(cause)
        matching_ids = {handler.id for handler in matching}
        for handler in handlers:
            if handler.id not in matching_ids:  # e.g. the object does not match the filters anymore
                self._index_of(handler.id)._discard(owner)  # (its exclusion, if any, stays till deletion)
        for handler in matching:
            await self._index_by(handler, cause=cause, owner=owner, settings=settings)

    async def _index_by(
            self,
            handler: IndexingHandler,
            *,
            cause: ResourceIndexingCause,
            owner: ObjectKey,
            settings: OperatorSettings,
    ) -> None:
        index = self._index_of(handler.id)
        exclusion = self._exclusions.get((handler.id, owner))
        if exclusion is not None and (exclusion.forever or exclusion.state.sleeping):
            return  # excluded after the errors: permanently, or until the delay is over.

        state = exclusion.state if exclusion is not None else HandlerState.from_scratch()
        outcome = await execution.execute_handler_once(
            settings=settings,
            handler=self._effective_handler(handler),
            cause=cause,
            state=state,
            logger=cause.logger,
        )
        if cause.patch:
            # The kwarg is there for compatibility, but the indexing never talks to the API.
            cause.logger.warning(f'Indexer {handler.id!r} has patched the object, but the patches '
                                 f'of the indexing functions are not applied; use other handlers for that.')
            cause.patch.clear()
            cause.patch.fns.clear()
        if outcome.exception is None:  # a success, or an ignored error (then, the result is None)
            self._exclusions.pop((handler.id, owner), None)
            if outcome.result is not None:
                index._replace(owner, _as_contribution(outcome.result))
        else:
            index._discard(owner)
            self._exclusions[(handler.id, owner)] = _Exclusion(state=state.with_outcome(outcome),
                                                               forever=outcome.final)

    def discard_uids(self, disowned: Callable[[str], bool]) -> None:
        """Remove the contributions of the objects with such uids, e.g. given away to another replica."""
        for index in self._indices.values():
            for owner in [owner for owner in index._contributions
                          if isinstance(owner, str) and disowned(owner)]:
                index._discard(owner)
        for key in [key for key in self._exclusions if isinstance(key[1], str) and disowned(key[1])]:
            del self._exclusions[key]

    def _index_of(self, name: HandlerId) -> Index[Any, Any]:
        index = self._indices.get(name)
        if index is None:
            index = self._indices[name] = Index()
        return index

    def _effective_handler(self, handler: IndexingHandler) -> IndexingHandler:
        # The execution treats the absent errors mode as temporary; for the indexers, it means "ignored".
        # The handlers declared with the decorators have it set; the ones made directly may not.
        # (The original handler is kept with its replacement, so that its id() is not reused meanwhile.)
        cached = self._effective.get(id(handler))
        if cached is None:
            effective = handler
            if handler.errors is None:
                effective = dataclasses.replace(handler, errors=ErrorsMode.IGNORED)
            cached = self._effective[id(handler)] = (handler, effective)
        return cached[1]


def _object_key(resource: Resource, raw_body: Mapping[str, Any]) -> ObjectKey:
    # The uids are unique across the resources and the re-creations of the objects with the same names.
    meta = raw_body.get('metadata') or {}
    uid = meta.get('uid')
    if uid:
        return str(uid)
    return (resource, meta.get('namespace'), meta.get('name'))

