"""
The object store: current objects, one global resourceVersion, watch history and live watchers.

Stored bodies are never modified in place: every change stores a new dict (that shares the
unchanged branches with the old one). This allows handing the same body to the HTTP responses,
the watch history and the watchers without copying, and encoding each version only once.

Everything here is synchronous and runs on the emulator's event loop, so that each mutation is
atomic with regard to the others and the events are always delivered in resourceVersion order.
"""

import asyncio
import bisect
import collections
import json
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Literal

from kopf.testing.emulator import selectors
from kopf.testing.emulator.resources import ResourceInfo, StorageKey
from kopf.testing.emulator.sharding import ShardSelector

_orjson: ModuleType | None
try:
    import orjson as _orjson
except ImportError:  # optional: the standard library does the same, slower
    _orjson = None

EventType = Literal['ADDED', 'MODIFIED', 'DELETED']

ObjectRef = tuple[StorageKey, str, str]  # (storage key, namespace or "", name)


def encode(body: Any) -> bytes:
    """
    Compact UTF-8 JSON, as real servers send it: every stored object and every response goes through it.

    With orjson (installed with kopf-clients), the emulator makes fewer instructions per PATCH than with the
    standard library's encoding (benchmarks/README.md); it is the API server of all the tests and benchmarks.
    What orjson refuses (integers beyond 64 bits, non-string keys) is encoded by the standard library.
    """
    if _orjson is not None:
        try:
            encoded: bytes = _orjson.dumps(body)
            return encoded
        except TypeError:
            pass
    return json.dumps(body, separators=(',', ':'), ensure_ascii=False).encode('utf-8')


def with_resource_version(body: dict[str, Any], resource_version: int) -> dict[str, Any]:
    return {**body, 'metadata': {**body.get('metadata', {}), 'resourceVersion': str(resource_version)}}


def with_api_version(body: dict[str, Any], api_version: str) -> dict[str, Any]:
    return body if body.get('apiVersion') == api_version else {**body, 'apiVersion': api_version}


class StoredObject:
    """An object as stored, with its JSON encoding made once at storing time."""

    __slots__ = ('body', 'encoded')

    def __init__(self, body: dict[str, Any], encoded: bytes | None = None) -> None:
        self.body = body
        self.encoded = encoded if encoded is not None else encode(body)

    @property
    def namespace(self) -> str:
        return str(self.body['metadata'].get('namespace') or '')

    @property
    def name(self) -> str:
        return str(self.body['metadata']['name'])

    def encoded_as(self, api_version: str) -> bytes:
        if self.body.get('apiVersion') == api_version:
            return self.encoded
        return encode(with_api_version(self.body, api_version))


class WatchEvent:
    """One change in the history of a resource; its wire form is built once for all watchers."""

    __slots__ = ('_line', 'body', 'encoded', 'old_body', 'resource_version', 'type')

    def __init__(
        self,
        type: EventType,
        body: dict[str, Any],
        encoded: bytes,
        resource_version: int,
        old_body: dict[str, Any] | None = None,
    ) -> None:
        self.type = type
        self.body = body  # for DELETED: the last state of the object with the deletion's resourceVersion
        self.encoded = encoded
        self.resource_version = resource_version
        self.old_body = old_body  # for MODIFIED only: to tell watchers with selectors what stopped matching
        self._line: bytes | None = None

    def line(self) -> bytes:
        if self._line is None:
            self._line = b'{"type":"' + self.type.encode() + b'","object":' + self.encoded + b'}\n'
        return self._line


def event_line(type: str, body: dict[str, Any]) -> bytes:
    return b'{"type":"' + type.encode() + b'","object":' + encode(body) + b'}\n'


class Watcher:
    """One open watch stream: its filters, and the encoded events waiting to be written to it."""

    def __init__(
        self,
        info: ResourceInfo,
        *,
        namespace: str | None,
        label_selector: selectors.LabelSelector,
        field_selector: selectors.FieldSelector,
        path: str,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        shard_selector: ShardSelector | None = None,
    ) -> None:
        self.info = info
        self.shard_selector = shard_selector
        self.transform = transform  # e.g. into a Table for kubectl: then every event is encoded separately
        self.api_version = info.api_version
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.path = path
        self.pending: list[bytes] = []
        self.wakeup = asyncio.Event()
        self.closed = False
        self.aborted = False
        self.sent = 0  # the events of objects queued for it (not the bookmarks): see watch_events()
        # Like kube-apiserver's watchers: a client that does not read is cut off (see :meth:`send`); set once
        # subscribed (the initial and the replayed events, queued before, are never too many).
        self.capacity: int | None = None  # events waiting while the writing is blocked
        self.patience = 0.0  # for how long the writing can be blocked before they are too many
        self.blocked_since: float | None = None  # when the writing to the client started waiting for it
        self.terminated = False
        self._filtered = bool(namespace is not None or label_selector or field_selector or transform
                              or shard_selector is not None)

    def matches(self, body: dict[str, Any]) -> bool:
        metadata = body.get('metadata', {})
        if self.namespace is not None and metadata.get('namespace') != self.namespace:
            return False
        if self.label_selector and not selectors.labels_match(self.label_selector, metadata.get('labels')):
            return False
        if self.shard_selector is not None and not self.shard_selector.matches(body):
            return False
        return not self.field_selector or selectors.fields_match(self.field_selector, body)

    def push(self, line: bytes) -> None:
        self.pending.append(line)
        self.wakeup.set()

    def send(self, line: bytes) -> None:
        """
        Queue an event of an object (counted), not a service line (e.g. a bookmark).

        As kube-apiserver does with a watcher whose channels are full (its client does not read, and the
        sockets' buffers are full too), the stream is ended if the event finds the capacity filled and the
        writing blocked for longer than the patience (the server's dispatch budget): the unwritten events are
        dropped, the client gets the end of the stream after what is in the sockets, and it re-watches from
        the last version it has seen (kube-apiserver counts these in ``apiserver_terminated_watchers_total``).
        """
        if (self.capacity is not None and len(self.pending) >= self.capacity and
                self.blocked_since is not None and time.monotonic() - self.blocked_since >= self.patience):
            self.terminated = True
            self.pending.clear()
            self.close()
            return
        if self.closed:
            return
        self.sent += 1
        self.pending.append(line)
        self.wakeup.set()

    def offer(self, event: WatchEvent) -> None:
        """Queue the event as this watcher sees it: filters can turn it into ADDED or DELETED."""
        if not self._filtered:
            if event.body.get('apiVersion') == self.api_version:
                self.send(event.line())
            else:
                self.send(event_line(event.type, with_api_version(event.body, self.api_version)))
            return

        matches_now = self.matches(event.body)
        matched_before = event.old_body is not None and self.matches(event.old_body)
        if event.type != 'MODIFIED':
            if matches_now:
                self.send(self._line_for(event.type, event))
        elif matches_now and matched_before:
            self.send(self._line_for('MODIFIED', event))
        elif matches_now:
            self.send(self._line_for('ADDED', event))
        elif matched_before and event.old_body is not None:
            # Like real API servers: the last state that matched, but at the new resourceVersion.
            last_seen = with_resource_version(event.old_body, event.resource_version)
            self.send(self.render('DELETED', last_seen))

    def _line_for(self, type: str, event: WatchEvent) -> bytes:
        if type == event.type and self.transform is None and event.body.get('apiVersion') == self.api_version:
            return event.line()
        return self.render(type, event.body)

    def render(self, type: str, body: dict[str, Any]) -> bytes:
        """The wire form of an event as this watcher needs it (its API version, maybe transformed)."""
        converted = with_api_version(body, self.api_version)
        return event_line(type, self.transform(converted) if self.transform is not None else converted)

    def close(self, *, abort: bool = False) -> None:
        self.closed = True
        self.aborted = self.aborted or abort
        self.wakeup.set()


class ResourceState:
    """The objects, the retained history and the watchers of one storage (group and plural)."""

    def __init__(self, history_limit: int) -> None:
        self.objects: dict[str, dict[str, StoredObject]] = {}  # namespace ("" if none) -> name -> object
        self.history: collections.deque[WatchEvent] = collections.deque(maxlen=history_limit)
        self.replayable_after = 0  # all events with resourceVersion above it are still in the history
        self.watchers: set[Watcher] = set()
        self.count = 0
        # The sorted names of each namespace, made on the first listing after a name came or went (not on
        # every page of a paginated listing: that made a listing of N objects by pages cost O(N²)).
        self.sorted_names: dict[str, list[str]] = {}

    def names_in(self, namespace: str) -> list[str]:
        names = self.sorted_names.get(namespace)
        if names is None:
            names = self.sorted_names[namespace] = sorted(self.objects.get(namespace, {}))
        return names

    def remember(self, event: WatchEvent) -> None:
        history = self.history
        if history.maxlen is not None and len(history) >= history.maxlen:
            self.replayable_after = history[0].resource_version
        history.append(event)
        for watcher in self.watchers:
            watcher.offer(event)


class ObjectStore:
    """All stored objects of all resources, with the global resourceVersion counter."""

    def __init__(self, *, history_limit: int = 10_000) -> None:
        self.history_limit = history_limit
        self.last_resource_version = 0
        self._states: dict[StorageKey, ResourceState] = {}
        self.finished_watches: list[tuple[str, int]] = []  # (path, events sent) of the watches ended so far
        self.terminated_watches: list[str] = []  # the paths of those ended for their clients' not reading
        self._namespace_counts: collections.Counter[str] = collections.Counter()
        self._dependents: dict[str, set[ObjectRef]] = {}
        self._uids: set[str] = set()

    def next_resource_version(self) -> int:
        self.last_resource_version += 1
        return self.last_resource_version

    def state(self, key: StorageKey) -> ResourceState:
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = ResourceState(self.history_limit)
        return state

    def states(self) -> Iterator[tuple[StorageKey, ResourceState]]:
        yield from list(self._states.items())

    def get(self, key: StorageKey, namespace: str | None, name: str) -> StoredObject | None:
        state = self._states.get(key)
        if state is None:
            return None
        return state.objects.get(namespace or '', {}).get(name)

    def objects(
        self, key: StorageKey, namespace: str | None = None, *, after: tuple[str, str] | None = None
    ) -> Iterator[StoredObject]:
        """
        The current objects, sorted by namespace and name (the order of lists and continue tokens).

        With ``after`` (a namespace and a name, as in a continue token), only those that sort after it.
        """
        state = self._states.get(key)
        if state is None:
            return
        namespaces = [namespace] if namespace is not None else sorted(state.objects)
        for found_namespace in namespaces:
            if after is not None and found_namespace < after[0]:
                continue
            by_name = state.objects.get(found_namespace, {})
            names = state.names_in(found_namespace)
            start = _start_of(names, found_namespace, after)
            for name in names[start:]:
                stored = by_name.get(name)
                if stored is not None:
                    yield stored

    def count_after(self, key: StorageKey, namespace: str | None, after: tuple[str, str] | None) -> int:
        """How many objects :meth:`objects` yields with the same arguments (without going through them)."""
        state = self._states.get(key)
        if state is None:
            return 0
        namespaces = [namespace] if namespace is not None else list(state.objects)
        total = 0
        for found_namespace in namespaces:
            if after is not None and found_namespace < after[0]:
                continue
            names = state.names_in(found_namespace)
            start = _start_of(names, found_namespace, after)
            total += len(names) - start
        return total

    def count(self, key: StorageKey) -> int:
        state = self._states.get(key)
        return state.count if state is not None else 0

    def count_in_namespace(self, namespace: str) -> int:
        return self._namespace_counts[namespace]

    def uid_exists(self, uid: str) -> bool:
        return uid in self._uids

    def dependents_of(self, uid: str) -> list[ObjectRef]:
        return sorted(self._dependents.get(uid, ()))

    def put(self, key: StorageKey, body: dict[str, Any], old_body: dict[str, Any] | None) -> StoredObject:
        """Store a new or changed object (its resourceVersion already set) and notify the watchers."""
        stored = StoredObject(body)
        metadata = body['metadata']
        namespace = metadata.get('namespace') or ''
        name = metadata['name']
        state = self.state(key)
        by_name = state.objects.setdefault(namespace, {})
        if name not in by_name:
            state.sorted_names.pop(namespace, None)
            state.count += 1
            if namespace:
                self._namespace_counts[namespace] += 1
        by_name[name] = stored
        if old_body is None:
            self._uids.add(str(metadata.get('uid')))
        self._index_owners(key, namespace, name, old_body, body)
        event_type: EventType = 'ADDED' if old_body is None else 'MODIFIED'
        state.remember(
            WatchEvent(event_type, body, stored.encoded, int(metadata['resourceVersion']), old_body)
        )
        return stored

    def remove(self, key: StorageKey, body: dict[str, Any]) -> bytes:
        """Forget an object and notify the watchers; the body is its last state with a new resourceVersion."""
        metadata = body['metadata']
        namespace = metadata.get('namespace') or ''
        name = metadata['name']
        state = self.state(key)
        by_name = state.objects.get(namespace, {})
        if by_name.pop(name, None) is not None:
            state.sorted_names.pop(namespace, None)
            state.count -= 1
            if namespace:
                self._namespace_counts[namespace] -= 1
        if not by_name:
            state.objects.pop(namespace, None)
        self._uids.discard(str(metadata.get('uid')))
        self._index_owners(key, namespace, name, body, None)
        encoded = encode(body)
        state.remember(WatchEvent('DELETED', body, encoded, int(metadata['resourceVersion'])))
        return encoded

    def _index_owners(
        self,
        key: StorageKey,
        namespace: str,
        name: str,
        old_body: dict[str, Any] | None,
        new_body: dict[str, Any] | None,
    ) -> None:
        old_uids = _owner_uids(old_body)
        new_uids = _owner_uids(new_body)
        if old_uids == new_uids:
            return
        ref: ObjectRef = (key, namespace, name)
        for uid in old_uids - new_uids:
            refs = self._dependents.get(uid)
            if refs is not None:
                refs.discard(ref)
                if not refs:
                    del self._dependents[uid]
        for uid in new_uids - old_uids:
            self._dependents.setdefault(uid, set()).add(ref)

    def forget_history(self) -> None:
        """Drop the retained history, so that watching from any past resourceVersion fails with 410 Gone."""
        for state in self._states.values():
            state.history.clear()
            state.replayable_after = self.last_resource_version

    def watchers(self) -> list[Watcher]:
        return [watcher for state in self._states.values() for watcher in state.watchers]


def _owner_uids(body: dict[str, Any] | None) -> frozenset[str]:
    if body is None:
        return frozenset()
    references = body['metadata'].get('ownerReferences')
    if not references:
        return frozenset()
    return frozenset(
        str(reference['uid'])
        for reference in references
        if isinstance(reference, dict) and reference.get('uid')
    )


def _start_of(names: list[str], namespace: str, after: tuple[str, str] | None) -> int:
    """Where the sorted names of a namespace go past ``after`` (a namespace and a name)."""
    return bisect.bisect_right(names, after[1]) if after is not None and namespace == after[0] else 0


def parse_number(text: str) -> int | float:
    """
    A JSON number with a fraction or an exponent as the API server keeps it: whole ones are integers.

    The server decodes the whole ones into integers, the others into Go's float64 (encoded back in
    the shortest form): ``1.0`` and ``1e3`` come back as ``1`` and ``1000``; 1e21 and above as floats.
    """
    value = float(text)
    return int(value) if value.is_integer() and abs(value) < 1e21 else value


def as_stored_numbers(value: Any) -> Any:
    """The same as :func:`parse_number` for the floats of an already decoded value (YAML, patches)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 1e21 else value
    if isinstance(value, dict):
        return {key: as_stored_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_stored_numbers(item) for item in value]
    return value
