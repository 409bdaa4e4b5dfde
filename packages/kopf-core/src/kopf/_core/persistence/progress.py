"""
The storages of the handlers' progress: which handlers have started, succeeded, failed, or wait.

The state is kept per handler (by its id), never for all handlers at once: several operators
(with different handler ids) may keep their state in the same place of the same object,
and no merging of states is ever needed. A storage reads from the object's body and writes
into a patch, which the framework applies later; a storage never talks to the API itself.
A storage that keeps the state elsewhere (e.g. in a database) may write there instead,
and may batch its writes until :meth:`ProgressStorage.flush`.

The storages:

* :class:`AnnotationsProgressStorage`: one annotation per handler, ``{prefix}/{id}``,
  with the record serialised as compact JSON (see :mod:`.conventions` for long ids).
* :class:`StatusProgressStorage`: one field per handler in ``status.kopf.progress.{id}``
  (or another field), with the record as is.
* :class:`MultiProgressStorage`: writes to all its storages, reads from the first that has the record.
* :class:`SmartProgressStorage`: the default: annotations, plus reading (but not writing)
  the status storage of Kopf's older versions, so that the objects handled by them continue.
"""
import abc
from collections.abc import Collection, Mapping
from typing import Any, TypedDict, cast

from kopf._cogs.structs import bodies, dicts, patches
from kopf._core.persistence import conventions


class ProgressRecord(TypedDict, total=False):
    """
    The persisted state of one handler of one object.

    The timestamps are ISO-8601 strings (as :meth:`datetime.datetime.isoformat` makes them).
    All fields are optional; absent and ``None`` fields mean the same.
    """
    started: str | None  # when the handler was first attempted
    stopped: str | None  # when the handler has finished, successfully or not
    delayed: str | None  # when the handler should be retried, if it is delayed
    purpose: str | None  # the reason of the handling (create, update, delete, resume)
    retries: int | None  # how many attempts were made so far
    success: bool | None
    failure: bool | None
    message: str | None  # the error of the last failed attempt
    subrefs: Collection[str] | None  # the ids of the sub-handlers, if any


class ProgressStorage(conventions.StorageStanzaCleaner, metaclass=abc.ABCMeta):
    """
    The interface of all storages of the handlers' progress.

    Custom storages must implement :meth:`fetch`, :meth:`store`, and :meth:`purge`;
    :meth:`touch`, :meth:`clear`, :meth:`flush` do nothing by default, which suits
    the storages that keep nothing in the objects themselves.
    """

    @abc.abstractmethod
    def fetch(self, *, key: str, body: bodies.Body) -> ProgressRecord | None:
        """The record of the handler, or ``None`` if the handler has no record yet."""
        raise NotImplementedError

    @abc.abstractmethod
    def store(self, *, key: str, record: ProgressRecord, body: bodies.Body, patch: patches.Patch) -> None:
        """Save the record of the handler (in the patch if it is stored in the object)."""
        raise NotImplementedError

    @abc.abstractmethod
    def purge(self, *, key: str, body: bodies.Body, patch: patches.Patch) -> None:
        """Forget the record of the handler: when the handling of the object's change is over."""
        raise NotImplementedError

    def touch(self, *, body: bodies.Body, patch: patches.Patch, value: str | None) -> None:
        """
        Change a dummy field, so that the object gets a new version and the framework is woken up.

        ``None`` removes the dummy field. If the field has this value already, nothing is changed.
        """

    def clear(self, *, essence: bodies.BodyEssence) -> bodies.BodyEssence:
        """A copy of the essence without the storage's own data (which is not the object's content)."""
        return essence.copy()

    def flush(self) -> None:
        """Write the accumulated records, if the storage batches them; nothing by default."""


class AnnotationsProgressStorage(
    conventions.StorageKeyFormingConvention,
    conventions.StorageKeyMarkingConvention,
    ProgressStorage,
):
    """
    The progress in the annotations: ``{prefix}/{id}``, one per handler, as compact JSON.

    For example, ``kopf.zalando.org/create_fn: {"started":"...","retries":1,"success":true}``.
    By default, the fields with ``None`` are omitted; in the ``verbose`` mode, all of them are written.
    The ``touch_key`` is the name (without the prefix) of the dummy annotation for :meth:`touch`.
    See :mod:`.conventions` for the hashing of long ids and the V1/V2 keys.
    """

    def __init__(
            self,
            *,
            prefix: str = 'kopf.zalando.org',
            verbose: bool = False,
            touch_key: str = 'touch-dummy',
            v1: bool = True,
    ) -> None:
        super().__init__(prefix=prefix, v1=v1)
        self.verbose = verbose
        self.touch_key = touch_key

    def fetch(self, *, key: str, body: bodies.Body) -> ProgressRecord | None:
        annotations = conventions.annotations_of(body)
        for full_key in self.make_keys(key, body=body):
            encoded = annotations.get(full_key)
            if encoded is not None:
                record: ProgressRecord | None = conventions.decode_json(encoded)
                if record is not None:
                    return record
        return None

    def store(self, *, key: str, record: ProgressRecord, body: bodies.Body, patch: patches.Patch) -> None:
        if self.verbose:
            encoded = conventions.encode_json(record)
        else:
            present = {name: value for name, value in record.items() if value is not None}
            encoded = conventions.encode_json(present)
        annotations = patch.meta.annotations
        for full_key in self.make_keys(key, body=body):
            annotations[full_key] = encoded
        self.store_marker(self.prefix, patch, body)

    def purge(self, *, key: str, body: bodies.Body, patch: patches.Patch) -> None:
        annotations = conventions.annotations_of(body)
        for full_key in self.make_keys(key, body=body):
            if full_key in annotations:
                patch.meta.annotations[full_key] = None
            else:  # stored in this same cycle and not applied yet: just forget it
                dicts.remove(patch, ('metadata', 'annotations', full_key), prune=True)

    def touch(self, *, body: bodies.Body, patch: patches.Patch, value: str | None) -> None:
        annotations = conventions.annotations_of(body)
        for full_key in self.make_keys(self.touch_key, body=body):
            if annotations.get(full_key) != value:  # absent & None also mean "no change"
                patch.meta.annotations[full_key] = value
                self.store_marker(self.prefix, patch, body)

    def clear(self, *, essence: bodies.BodyEssence) -> bodies.BodyEssence:
        result = _copy_for_cleaning(essence)
        metadata = result.get('metadata')
        annotations = metadata.get('annotations') if isinstance(metadata, dict) else None
        if isinstance(metadata, dict) and isinstance(annotations, Mapping):
            head = self.prefix + '/'
            metadata['annotations'] = {
                name: value for name, value in annotations.items() if not name.startswith(head)
            }
        self.remove_empty_stanzas(result)
        return result  # type: ignore[return-value]  # not cast(): it is a call, for every event


class StatusProgressStorage(ProgressStorage):
    """
    The progress in a field of the object, ``status.kopf.progress`` by default, one key per handler.

    The records are stored as they are (not serialised), with the ``None`` fields too.
    The ``{name}`` placeholder in the fields is replaced with the ``name``.
    Note: the CRDs must allow unknown fields in the status, or the API will silently drop them.
    """

    def __init__(
            self,
            *,
            name: str = 'kopf',
            field: dicts.FieldSpec = 'status.{name}.progress',
            touch_field: dicts.FieldSpec = 'status.{name}.dummy',
    ) -> None:
        super().__init__()
        self._name = name
        self._field = conventions.parse_named_field(field, name)
        self._touch_field = conventions.parse_named_field(touch_field, name)

    @property
    def field(self) -> dicts.FieldPath:
        return self._field

    @field.setter
    def field(self, field: dicts.FieldSpec) -> None:
        self._field = conventions.parse_named_field(field, self._name)

    @property
    def touch_field(self) -> dicts.FieldPath:
        return self._touch_field

    @touch_field.setter
    def touch_field(self, field: dicts.FieldSpec) -> None:
        self._touch_field = conventions.parse_named_field(field, self._name)

    def fetch(self, *, key: str, body: bodies.Body) -> ProgressRecord | None:
        container = dicts.resolve(body, self._field, None)
        record: Any = container.get(key) if isinstance(container, Mapping) else None
        # A copy, so that the callers can modify it without modifying the body.
        return cast(ProgressRecord, dict(record)) if isinstance(record, Mapping) else record

    def store(self, *, key: str, record: ProgressRecord, body: bodies.Body, patch: patches.Patch) -> None:
        dicts.ensure(patch, (*self._field, key), dict(record))

    def purge(self, *, key: str, body: bodies.Body, patch: patches.Patch) -> None:
        container = dicts.resolve(body, self._field, None)
        if isinstance(container, Mapping) and key in container:
            dicts.ensure(patch, (*self._field, key), None)
        else:  # stored in this same cycle and not applied yet: just forget it
            dicts.remove(patch, (*self._field, key), prune=True)

    def touch(self, *, body: bodies.Body, patch: patches.Patch, value: str | None) -> None:
        if dicts.resolve(body, self._touch_field, None) != value:  # absent & None also mean "no change"
            dicts.ensure(patch, self._touch_field, value)

    def clear(self, *, essence: bodies.BodyEssence) -> bodies.BodyEssence:
        result = _copy_for_cleaning(essence)
        if self._field:
            conventions.remove_along(result, self._field)
        self.remove_empty_stanzas(result)
        return result  # type: ignore[return-value]  # not cast(): it is a call, for every event


class _ReadOnlyStatusProgressStorage(StatusProgressStorage):
    """
    The status storage that is only read and purged: the records of Kopf's older versions.

    The records are not written there anymore, but the existing ones are still honoured
    (so that the handlers that succeeded there are not called again), and they are removed
    at the end of the handling cycle, as the written records are.
    """

    def store(self, *, key: str, record: ProgressRecord, body: bodies.Body, patch: patches.Patch) -> None:
        pass

    def touch(self, *, body: bodies.Body, patch: patches.Patch, value: str | None) -> None:
        pass


class MultiProgressStorage(ProgressStorage):
    """
    Several storages at once: all are written to, the first one with a record is read from.

    Useful for the transition from one storage to another: put the new one first, the old one
    second; once all objects are handled at least once, remove the old one.
    """

    def __init__(self, storages: Collection[ProgressStorage]) -> None:
        super().__init__()
        self.storages = list(storages)

    def fetch(self, *, key: str, body: bodies.Body) -> ProgressRecord | None:
        for storage in self.storages:
            record = storage.fetch(key=key, body=body)
            if record is not None:
                return record
        return None

    def store(self, *, key: str, record: ProgressRecord, body: bodies.Body, patch: patches.Patch) -> None:
        for storage in self.storages:
            storage.store(key=key, record=record, body=body, patch=patch)

    def purge(self, *, key: str, body: bodies.Body, patch: patches.Patch) -> None:
        for storage in self.storages:
            storage.purge(key=key, body=body, patch=patch)

    def touch(self, *, body: bodies.Body, patch: patches.Patch, value: str | None) -> None:
        for storage in self.storages:
            storage.touch(body=body, patch=patch, value=value)

    def clear(self, *, essence: bodies.BodyEssence) -> bodies.BodyEssence:
        for storage in self.storages:
            essence = storage.clear(essence=essence)
        return essence

    def flush(self) -> None:
        for storage in self.storages:
            storage.flush()


class SmartProgressStorage(MultiProgressStorage):
    """
    The default storage: the annotations, plus the status of Kopf's older versions, read-only.

    The annotations take precedence. The records found only in the status (written before
    the switch to the annotations) are honoured and purged, but never written again.
    The arguments are those of :class:`AnnotationsProgressStorage` and :class:`StatusProgressStorage`.
    """

    def __init__(
            self,
            *,
            name: str = 'kopf',
            field: dicts.FieldSpec = 'status.{name}.progress',
            touch_key: str = 'touch-dummy',
            touch_field: dicts.FieldSpec = 'status.{name}.dummy',
            prefix: str = 'kopf.zalando.org',
            v1: bool = True,
            verbose: bool = False,
    ) -> None:
        super().__init__([
            AnnotationsProgressStorage(prefix=prefix, verbose=verbose, touch_key=touch_key, v1=v1),
            _ReadOnlyStatusProgressStorage(name=name, field=field, touch_field=touch_field),
        ])


def holds_no_records(storage: ProgressStorage, *, keys: Collection[str], body: bodies.Body) -> bool:
    """
    Whether the object surely has no records of these handlers in the storage (nothing to fetch or purge).

    Every handling cycle reads the records of all the resource's handlers and purges them at its end,
    though most objects have none (a cycle that ends in one step stores nothing): for the default storage,
    ~15 lookups and removals of absent keys per cycle. One look at the object's annotations and status
    tells the same for the built-in storages. The custom storages (incl. the subclasses of the built-in
    ones, which may keep their records elsewhere) are never assumed empty: False means "maybe some".
    """
    parts = _built_in_parts(storage)
    if parts is None:
        return False
    raw_body = dicts.raw_mapping(body)
    for part in parts:
        kind = type(part)
        if kind is AnnotationsProgressStorage:
            annotations_storage: AnnotationsProgressStorage = part  # type: ignore[assignment]
            annotations = conventions.annotations_of(raw_body)
            if annotations:
                for key in keys:
                    for full_key in annotations_storage.make_keys(key, body=body):
                        if full_key in annotations:
                            return False
        else:  # the status storages, incl. the read-only one
            status_storage: StatusProgressStorage = part  # type: ignore[assignment]
            container = dicts.resolve(raw_body, status_storage._field, None)
            if container is None:
                continue
            if type(container) is not dict or any(key in container for key in keys):
                return False  # maybe some records
    return True


def untouch(storage: ProgressStorage, *, body: bodies.Body, patch: patches.Patch) -> None:
    """
    The end of a handling cycle: the same as ``storage.touch(value=None)``, then ``storage.flush()``.

    Done for every cycle, though the objects are rarely touched (only to wake up the sleeping handlers):
    for the built-in storages (which batch nothing), one look tells that there is nothing to do.
    """
    if not _holds_no_touch(storage, body):
        storage.touch(body=body, patch=patch, value=None)
        storage.flush()


def _holds_no_touch(storage: ProgressStorage, body: bodies.Body) -> bool:
    parts = _built_in_parts(storage)
    if parts is None:
        return False
    raw_body = dicts.raw_mapping(body)
    for part in parts:
        kind = type(part)
        if kind is AnnotationsProgressStorage:
            annotations_storage: AnnotationsProgressStorage = part  # type: ignore[assignment]
            annotations = conventions.annotations_of(raw_body)
            if annotations:
                for full_key in annotations_storage.make_keys(annotations_storage.touch_key, body=body):
                    if annotations.get(full_key) is not None:
                        return False
        elif kind is StatusProgressStorage:  # the read-only one never touches
            status_storage: StatusProgressStorage = part  # type: ignore[assignment]
            if dicts.resolve(raw_body, status_storage._touch_field, None) is not None:
                return False
    return True


# The built-in storages that keep their data on the objects (not the several ones, which consist of them).
_KNOWN_LEAVES: frozenset[type[ProgressStorage]] = frozenset({
    AnnotationsProgressStorage, StatusProgressStorage, _ReadOnlyStatusProgressStorage,
})


def _built_in_parts(storage: ProgressStorage) -> Collection[ProgressStorage] | None:
    """
    The built-in storages that the storage consists of (itself if not several); None if any is a custom one.

    Only for these, the framework knows where their data are on the objects, so that it can tell
    with one look that there are none (see :func:`holds_no_records`). The subclasses are custom ones:
    they may keep their records elsewhere.
    """
    kind = type(storage)
    if kind in _KNOWN_LEAVES:
        return (storage,)
    if kind is not SmartProgressStorage and kind is not MultiProgressStorage:
        return None
    parts: list[ProgressStorage] = storage.storages  # type: ignore[attr-defined]
    for part in parts:
        if type(part) not in _KNOWN_LEAVES:
            break
    else:
        return parts  # the usual case (e.g. the default storage): nothing nested, nothing to make
    flattened: list[ProgressStorage] = []
    for part in parts:
        leaves = _built_in_parts(part)
        if leaves is None:
            return None
        flattened.extend(leaves)
    return flattened


def locate(storage: ProgressStorage, *, key: str, body: bodies.Body) -> tuple[str, Any] | None:
    """
    Where the storage keeps the handler's record on this object (in words), and the stored value as is.

    For the messages about the unreadable records; None if the record is not on the object
    (or the storage is a custom one, which keeps its records unknown where).
    """
    if isinstance(storage, MultiProgressStorage):
        for substorage in storage.storages:
            found = locate(substorage, key=key, body=body)
            if found is not None:
                return found
    elif isinstance(storage, AnnotationsProgressStorage):
        annotations = conventions.annotations_of(body)
        for full_key in storage.make_keys(key, body=body):
            if annotations.get(full_key) is not None:
                return f'The annotation {full_key!r}', annotations[full_key]
    elif isinstance(storage, StatusProgressStorage):
        container = dicts.resolve(body, storage.field, None)
        if isinstance(container, Mapping) and container.get(key) is not None:
            return f'The field {".".join((*storage.field, key))!r}', container[key]
    return None


def _copy_for_cleaning(essence: bodies.BodyEssence) -> dict[str, Any]:
    """
    A copy of the essence that can be cleaned without modifying the original.

    Only the dicts that the cleaning modifies (the top level and the metadata) are copied;
    the rest is shared with the original: copying all of it for every object would be costly.
    """
    result: dict[str, Any] = dict(essence)
    metadata = result.get('metadata')
    if type(metadata) is dict or (metadata is not None and isinstance(metadata, Mapping)):
        result['metadata'] = dict(metadata)
    return result


def without_records(storage: ProgressStorage, *, essence: bodies.BodyEssence) -> bodies.BodyEssence:
    """
    The essence without the storage's own data: the same as ``storage.clear()``, but with no copy if unneeded.

    The essences are built for every event, and they almost never hold any records (the diff-base's
    essence is stored cleared, and the new one is built without the annotations of the storages):
    then, the essence itself is returned, not a copy of it. For the built-in storages only, as with
    :func:`holds_no_records`; the custom ones (incl. the subclasses of the built-in ones) always clear.
    """
    # The clearing would also remove the empty stanzas: then, it is done as usual too.
    stanzas = conventions.StorageStanzaCleaner
    if _holds_no_own_data(storage, essence) and not stanzas.has_empty_stanzas(essence):
        return essence
    return storage.clear(essence=essence)


def _holds_no_own_data(storage: ProgressStorage, essence: bodies.BodyEssence) -> bool:
    parts = _built_in_parts(storage)
    if parts is None:
        return False
    for part in parts:
        if type(part) is AnnotationsProgressStorage:
            annotations_storage: AnnotationsProgressStorage = part
            annotations = conventions.annotations_of(essence)
            if annotations:
                head = annotations_storage.prefix + '/'
                for name in annotations:
                    if name.startswith(head):
                        return False
        else:  # the status storages, incl. the read-only one
            status_storage: StatusProgressStorage = part  # type: ignore[assignment]
            field = status_storage._field
            if field and field[0] in essence:  # maybe the records, or the empty dicts on its path to remove
                return False
    return True
