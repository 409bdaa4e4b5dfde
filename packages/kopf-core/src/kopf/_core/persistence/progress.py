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

Besides the general methods (:meth:`~ProgressStorage.fetch`, :meth:`~ProgressStorage.store`, etc.),
every storage answers a few questions that let a handling cycle skip the general work when it would do
nothing (e.g. most objects have no records at all): :meth:`~ProgressStorage.holds_no_records`,
:meth:`~ProgressStorage.holds_no_touch`, :meth:`~ProgressStorage.holds_nothing_to_clear`, and both of the
first two at once, :meth:`~ProgressStorage.holds_no_state` (for the listed objects that need nothing).
Their answers are derived from the general methods: by default, "maybe" (then, the general methods
are called); a built-in storage answers for itself with one look at the object, unless a descendant
redefines the general methods that the answer is derived from (then, it answers "maybe" again).
The property tests (tests/core/persistence/test_fast_paths.py) pin the answers to the general methods.
"""
import abc
from collections.abc import Collection, Mapping
from typing import Any, ClassVar, TypedDict, cast

from kopf._cogs.structs import bodies, dicts, patches
from kopf._core.persistence import conventions

# Called for every event, twice: a global name is found faster than a static method via the instance.
_has_empty_stanzas = conventions.StorageStanzaCleaner.has_empty_stanzas


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

    # The fast answers: True only if the general methods would surely do nothing; False means "maybe".
    # Only the storage itself can tell it without calling them: by default, it is "maybe", which is
    # always correct (the general methods are then called as usual). The general methods of each answer:
    _FAST_ANSWERS: ClassVar[Mapping[str, tuple[str, ...]]] = {
        'holds_no_records': ('fetch', 'purge'),
        'holds_no_touch': ('touch', 'flush'),
        'holds_nothing_to_clear': ('clear',),
        # Both of the first two answers at once: derived from theirs, if a class redefines them itself.
        'holds_no_state': ('fetch', 'purge', 'touch', 'flush', 'holds_no_records', 'holds_no_touch'),
    }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """
        A class that redefines the general methods of an inherited fast answer gets the default one ("maybe").

        E.g. a descendant of :class:`AnnotationsProgressStorage` that keeps its records elsewhere
        (its own :meth:`fetch`) does not inherit the answer "no records, the annotations have none".
        The answers that a class defines itself are kept: its author knows the class's methods.
        Done once per class: the built-in answers cost nothing more than their own calls.
        """
        super().__init_subclass__(**kwargs)
        for answer, general in ProgressStorage._FAST_ANSWERS.items():
            if answer in cls.__dict__:
                continue
            owner = next(base for base in cls.__mro__ if answer in base.__dict__)
            if any(getattr(cls, name) is not getattr(owner, name) for name in general):
                setattr(cls, answer, ProgressStorage.__dict__[answer])

    def holds_no_records(self, *, keys: Collection[str], body: bodies.Body) -> bool:
        """
        Whether the object surely holds no records of these handlers: nothing to fetch or to purge.

        True means that :meth:`fetch` returns ``None`` for every key, and that :meth:`purge`
        of every key changes nothing (neither the patch, nor anything elsewhere): then,
        a handling cycle skips both. By default, False ("maybe some").
        """
        return False

    def holds_no_touch(self, *, body: bodies.Body) -> bool:
        """
        Whether ``touch(value=None)`` and then :meth:`flush` surely change nothing.

        They are done at every cycle's end. By default, False ("maybe something"): they are called then.
        """
        return False

    def holds_nothing_to_clear(self, *, essence: bodies.BodyEssence) -> bool:
        """
        Whether :meth:`clear` surely returns an essence equal to this one: then, the essence is used as is.

        By default, False ("maybe something"): the essence is cleared then.
        """
        return False

    def holds_no_state(self, *, keys: Collection[str], body: bodies.Body) -> bool:
        """
        Whether both :meth:`holds_no_records` of these handlers and :meth:`holds_no_touch`: one question.

        Asked for every listed object at an operator's start (most of them hold nothing). By default,
        the two answers themselves; a built-in storage answers both with one look at the object.
        """
        return self.holds_no_records(keys=keys, body=body) and self.holds_no_touch(body=body)

    def locate(self, *, key: str, body: bodies.Body) -> tuple[str, Any] | None:
        """
        Where the handler's record is on this object (in words), and the stored value as it is.

        For the messages about the unreadable records. None if the record is not on the object,
        or if the storage keeps its records elsewhere (as the custom ones do by default).
        """
        return None


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

    def holds_no_records(self, *, keys: Collection[str], body: bodies.Body) -> bool:
        annotations = conventions.annotations_of(dicts.raw_mapping(body))
        return not annotations or self._no_records_among(annotations, keys=keys, body=body)

    def holds_no_touch(self, *, body: bodies.Body) -> bool:
        annotations = conventions.annotations_of(dicts.raw_mapping(body))
        return not annotations or self._no_touch_among(annotations, body=body)

    def holds_no_state(self, *, keys: Collection[str], body: bodies.Body) -> bool:
        # The two answers above with one look for the annotations.
        annotations = conventions.annotations_of(dicts.raw_mapping(body))
        return not annotations or (self._no_records_among(annotations, keys=keys, body=body) and
                                   self._no_touch_among(annotations, body=body))

    def _no_records_among(
            self, annotations: Mapping[str, str], *, keys: Collection[str], body: bodies.Body,
    ) -> bool:
        # Both fetch() and purge() look for the same keys: a record is there if any key is.
        for key in keys:
            for full_key in self.make_keys(key, body=body):
                if full_key in annotations:
                    return False
        return True

    def _no_touch_among(self, annotations: Mapping[str, str], *, body: bodies.Body) -> bool:
        # touch(None) removes the dummy annotation if it has a value; flush() does nothing.
        for full_key in self.make_keys(self.touch_key, body=body):
            if annotations.get(full_key) is not None:
                return False
        return True

    def holds_nothing_to_clear(self, *, essence: bodies.BodyEssence) -> bool:
        # clear() removes the annotations of the prefix, then the empty stanzas (if any: checked first).
        if _has_empty_stanzas(essence):
            return False
        metadata: Any = essence.get('metadata')  # a dict if present: the empty stanzas' check is passed
        annotations: Any = metadata.get('annotations') if metadata is not None else None
        if annotations is not None and type(annotations) is not dict and not isinstance(annotations, Mapping):
            return True  # the clearing skips them
        if annotations:
            head = self.prefix + '/'
            for name in annotations:
                if name.startswith(head):
                    return False
        return True

    def locate(self, *, key: str, body: bodies.Body) -> tuple[str, Any] | None:
        annotations = conventions.annotations_of(body)
        for full_key in self.make_keys(key, body=body):
            if annotations.get(full_key) is not None:
                return f'The annotation {full_key!r}', annotations[full_key]
        return None


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

    def holds_no_records(self, *, keys: Collection[str], body: bodies.Body) -> bool:
        # Both fetch() and purge() look into the field only if it is a mapping (the usual dict first).
        # The same as dicts.resolve(..., None), inlined: this is done for every cycle.
        container: Any = dicts.raw_mapping(body)
        for step in self._field:
            if type(container) is not dict and (container is None or not isinstance(container, Mapping)):
                return True
            container = container.get(step)
        if type(container) is not dict and (container is None or not isinstance(container, Mapping)):
            return True
        for key in keys:  # noqa: SIM110  # not any() of a generator: this is done for every cycle
            if key in container:
                return False
        return True

    def holds_no_touch(self, *, body: bodies.Body) -> bool:
        # touch(None) removes the dummy field if it has a value; flush() does nothing.
        return dicts.resolve(dicts.raw_mapping(body), self._touch_field, None) is None

    def holds_nothing_to_clear(self, *, essence: bodies.BodyEssence) -> bool:
        # clear() removes the field and the dicts left empty on its path, then the empty stanzas.
        # Only the first key is checked: the essences rarely have a status at all.
        field = self._field
        if field and field[0] in essence:  # maybe the records, or the empty dicts on its path to remove
            return False
        return not _has_empty_stanzas(essence)

    def locate(self, *, key: str, body: bodies.Body) -> tuple[str, Any] | None:
        container = dicts.resolve(body, self.field, None)
        if isinstance(container, Mapping) and container.get(key) is not None:
            return f'The field {".".join((*self.field, key))!r}', container[key]
        return None


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

    def holds_no_touch(self, *, body: bodies.Body) -> bool:
        return True  # it never touches, and flushes nothing

    def holds_no_state(self, *, keys: Collection[str], body: bodies.Body) -> bool:
        return self.holds_no_records(keys=keys, body=body)  # and never a touch


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

    # Each general method does the same in all the storages: nothing if nothing in each of them.
    # (Not all() of a generator: these are asked for every cycle, and a generator's steps are calls.)

    def holds_no_records(self, *, keys: Collection[str], body: bodies.Body) -> bool:
        for storage in self.storages:  # noqa: SIM110
            if not storage.holds_no_records(keys=keys, body=body):
                return False
        return True

    def holds_no_touch(self, *, body: bodies.Body) -> bool:
        for storage in self.storages:  # noqa: SIM110
            if not storage.holds_no_touch(body=body):
                return False
        return True

    def holds_nothing_to_clear(self, *, essence: bodies.BodyEssence) -> bool:
        for storage in self.storages:  # noqa: SIM110
            if not storage.holds_nothing_to_clear(essence=essence):
                return False
        return True

    def holds_no_state(self, *, keys: Collection[str], body: bodies.Body) -> bool:
        for storage in self.storages:  # noqa: SIM110
            if not storage.holds_no_state(keys=keys, body=body):
                return False
        return True

    def locate(self, *, key: str, body: bodies.Body) -> tuple[str, Any] | None:
        for storage in self.storages:
            found = storage.locate(key=key, body=body)
            if found is not None:
                return found
        return None


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
    """The same as ``storage.holds_no_records(...)``: kept for the callers of this name."""
    return storage.holds_no_records(keys=keys, body=body)


def untouch(storage: ProgressStorage, *, body: bodies.Body, patch: patches.Patch) -> None:
    """
    The end of a handling cycle: the same as ``storage.touch(value=None)``, then ``storage.flush()``.

    Done for every cycle, though the objects are rarely touched (only to wake up the sleeping handlers):
    if the storage tells that nothing would change (as the built-in ones do with one look), nothing is done.
    """
    if not storage.holds_no_touch(body=body):
        storage.touch(body=body, patch=patch, value=None)
        storage.flush()


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
    if the storage tells that the clearing would change nothing, the essence itself is returned.
    """
    if storage.holds_nothing_to_clear(essence=essence):
        return essence
    return storage.clear(essence=essence)
