"""
The storages of the diff-base: the essence of an object as it was when last handled successfully.

The essence is what the object "means", without what the system adds: the metadata except
the labels and annotations (and except the annotations of kubectl and of Kopf-based operators),
the status, the API version and kind. New states are compared to the stored essence: if the
essences are equal, nothing essential has changed (e.g. only the status or the resource version);
if they differ, the diff of the essences is given to the update handlers.
It is similar to how ``kubectl apply`` keeps the last applied state in an annotation.

The storages:

* :class:`AnnotationsDiffBaseStorage`: ``kopf.zalando.org/last-handled-configuration``,
  compact JSON with a trailing newline (as kubectl's own last-applied annotation).
* :class:`StatusDiffBaseStorage`: ``status.kopf.last-handled-configuration``, compact JSON.
* :class:`MultiDiffBaseStorage`: writes to all, reads from the first one that has the essence.
"""
import abc
import functools
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from kopf._cogs.helpers import jsons
from kopf._cogs.structs import bodies, dicts, patches
from kopf._core.persistence import conventions

# The top-level fields that are never a part of the essence.
_NON_ESSENTIAL_FIELDS = frozenset({'apiVersion', 'kind', 'metadata', 'status'})

_NOTHING = object()


class DiffBaseStorage(conventions.StorageKeyMarkingConvention, conventions.StorageStanzaCleaner,
                      metaclass=abc.ABCMeta):
    """
    The interface of all diff-base storages, and the definition of the objects' essence.

    Custom storages must implement :meth:`fetch` and :meth:`store`. Overriding :meth:`build`
    changes what is considered essential for all operations on the objects.
    The ``ignored_fields`` are removed from the essence (e.g. the fields that are changed
    by controllers or admission webhooks all the time and must not trigger the handlers).
    """

    ignored_fields: list[dicts.FieldPath]

    def __init__(self, ignored_fields: Iterable[dicts.FieldSpec] | None = None) -> None:
        super().__init__()
        self.ignored_fields = [dicts.parse_field(field) for field in ignored_fields or []]

    def build(
            self,
            *,
            body: bodies.Body,
            extra_fields: Iterable[dicts.FieldSpec] | None = None,
    ) -> bodies.BodyEssence:
        """
        Extract the essence of the object: only the fields that matter for detecting the changes.

        All the top-level fields are kept (deep-copied) except the API version, kind, and status;
        of the metadata, only the labels and the annotations are kept (in this order, and only
        if not empty), without the annotations of kubectl and of Kopf-based operators.
        The ``extra_fields`` are copied as they are, even if they would be removed otherwise
        (e.g. for the handlers of a specific field in the status). The ``ignored_fields`` of the
        storage are removed then, together with the empty dicts on their paths. Finally,
        the empty metadata, labels, annotations, status are removed (but not an empty spec).
        The fields are kept in the order of the object, with the metadata and extra fields last.
        """
        raw_body = dicts.raw_mapping(body)  # many keys are read: resolve the live view only once
        essence: dict[str, Any] = {}
        for field, value in raw_body.items():
            if field not in _NON_ESSENTIAL_FIELDS:
                essence[field] = conventions.copy_json(value)
        self._add_essential_metadata(essence, raw_body)

        for extra_field in extra_fields or ():
            path = dicts.parse_field(extra_field)
            if path:
                value = dicts.resolve(body, path, _NOTHING)
                if value is not _NOTHING:
                    dicts.ensure(essence, path, conventions.copy_json(value))

        for path in self.ignored_fields:
            if path:
                conventions.remove_along(essence, path)

        self.remove_empty_stanzas(essence)
        return essence  # type: ignore[return-value]  # not cast(): it is a call, for every event

    def _add_essential_metadata(self, essence: dict[str, Any], raw_body: Mapping[str, Any]) -> None:
        """Add the object's essential metadata, if any: the labels, the non-system annotations (new dicts)."""
        raw_metadata = raw_body.get('metadata')
        if type(raw_metadata) is dict or isinstance(raw_metadata, Mapping):
            metadata: dict[str, Any] = {}
            labels = raw_metadata.get('labels')
            if labels and (type(labels) is dict or isinstance(labels, Mapping)):
                metadata['labels'] = dict(labels)
            annotations = raw_metadata.get('annotations')
            if annotations and (type(annotations) is dict or isinstance(annotations, Mapping)):
                meaningful = self._remove_system_annotations(annotations)
                if meaningful:
                    metadata['annotations'] = meaningful
            if metadata:
                essence['metadata'] = metadata

    def surely_unchanged(
            self,
            *,
            body: bodies.Body,
            extra_fields: Iterable[dicts.FieldSpec] | None = None,
    ) -> bool:
        """
        Whether the object's essence is surely its stored one (then, nothing has changed), known cheaply.

        ``False`` means "maybe not": then the stored and the built essences are compared as usual.
        The general storages are never sure; see :meth:`AnnotationsDiffBaseStorage.surely_unchanged`.
        """
        return False

    def _remove_system_annotations(self, annotations: Mapping[str, str]) -> dict[str, str]:
        marked_prefixes = self.detect_marked_prefixes(annotations)
        if marked_prefixes:
            return {key: value for key, value in annotations.items()
                    if not is_system_annotation(key, marked_prefixes)}
        # The usual case, for every event: the same few keys on all objects, their verdicts remembered.
        return {key: value for key, value in annotations.items() if not _is_unmarked_system_annotation(key)}

    @abc.abstractmethod
    def fetch(self, *, body: bodies.Body) -> bodies.BodyEssence | None:
        """The stored essence of the object, or ``None`` if it was never handled."""
        raise NotImplementedError

    @abc.abstractmethod
    def store(self, *, body: bodies.Body, patch: patches.Patch, essence: bodies.BodyEssence) -> None:
        """Save the essence as the new diff-base (in the patch if it is stored in the object)."""
        raise NotImplementedError

    def locate(self, *, body: bodies.Body) -> tuple[str, Any] | None:
        """
        Where the diff-base is on this object (in words), and the stored value as it is.

        For the messages about the unreadable diff-bases. None if it is not on the object,
        or if the storage keeps it elsewhere (as the custom ones do by default).
        """
        return None


def is_system_annotation(key: str, marked_prefixes: Collection[str] = ()) -> bool:
    """Whether the annotation is never a part of the essence: Kopf's own (or marked as such), kubectl's."""
    if key in conventions.SYSTEM_ANNOTATIONS:
        return True
    parts = conventions.split_annotation_key(key)
    if parts is None:
        return False
    prefix = parts[0]
    if prefix in marked_prefixes:
        return True
    # Kopf's own prefix is excluded with all its subdomains, marked or not.
    return any(prefix == known or prefix.endswith('.' + known) for known in conventions.KNOWN_PREFIXES)



@functools.lru_cache(maxsize=4096)
def _is_unmarked_system_annotation(key: str) -> bool:
    """The same as :func:`is_system_annotation` with no marked prefixes, remembered for the keys seen."""
    return is_system_annotation(key)

class AnnotationsDiffBaseStorage(conventions.StorageKeyFormingConvention, DiffBaseStorage):
    """
    The diff-base in an annotation: ``{prefix}/{key}``, compact JSON plus a newline.

    See :mod:`.conventions` for the V1/V2 keys (relevant only for very long prefixes or keys).
    """

    def __init__(
            self,
            *,
            prefix: str = 'kopf.zalando.org',
            key: str = 'last-handled-configuration',
            ignored_fields: Iterable[dicts.FieldSpec] | None = None,
            v1: bool = True,
    ) -> None:
        super().__init__(prefix=prefix, v1=v1, ignored_fields=ignored_fields)
        self.key = key

    def build(
            self,
            *,
            body: bodies.Body,
            extra_fields: Iterable[dicts.FieldSpec] | None = None,
    ) -> bodies.BodyEssence:
        # The diff-base is never a part of itself, even if the extra fields bring it back.
        essence = super().build(body=body, extra_fields=extra_fields)
        self.remove_annotations(essence, list(self.make_keys(self.key, body=body)))
        self.remove_empty_stanzas(essence)
        return essence

    def surely_unchanged(
            self,
            *,
            body: bodies.Body,
            extra_fields: Iterable[dicts.FieldSpec] | None = None,
    ) -> bool:
        """
        Whether the stored text is the compact JSON of the object's essence: then the essence is unchanged.

        The essence is the one :meth:`build` makes, but not copied: its values are the object's own,
        only encoded (natively), never modified. Equal texts are equal essences with no diff (the same keys
        in the same order, the same types: ``1``, ``1.0``, ``true`` are all told apart). It is the text that
        :meth:`store` writes, except for non-ASCII texts (stored with escapes) and some floats (``1e+16``).
        Only for this class itself (a descendant may build or store otherwise), with no extra or ignored
        fields, with the native JSON: otherwise, and for the texts written otherwise (e.g. with spaces),
        it says "maybe not", and the general comparison decides.
        Used for the listed objects (:func:`.processing.dismiss_listed`); tested against the general path.
        """
        if (not jsons.ACCELERATED or type(self) is not AnnotationsDiffBaseStorage or extra_fields
                or self.ignored_fields):
            return False
        raw_body = dicts.raw_mapping(body)
        annotations = conventions.annotations_of(raw_body)
        keys = tuple(self.make_keys(self.key, body=body))
        stored: Any = None
        for full_key in keys:  # the first one there, as fetch() reads it
            stored = annotations.get(full_key)
            if stored is not None:
                break
        if type(stored) is not str:
            return False
        essence: dict[str, Any] = {field: value for field, value in raw_body.items()
                                   if field not in _NON_ESSENTIAL_FIELDS}
        self._add_essential_metadata(essence, raw_body)
        if 'metadata' in essence:  # usually not: nothing to remove then (nor the status: not essential)
            self.remove_annotations(essence, keys)
            self.remove_empty_stanzas(essence)
        try:
            encoded = jsons.dumps(essence)
        except (TypeError, ValueError):  # not JSON (never from the API): the general path tells what it can
            return False
        return bool(stored == encoded.decode('utf-8') + '\n')

    def fetch(self, *, body: bodies.Body) -> bodies.BodyEssence | None:
        annotations = conventions.annotations_of(body)
        for full_key in self.make_keys(self.key, body=body):
            encoded = annotations.get(full_key)
            if encoded is not None:
                essence: bodies.BodyEssence | None = conventions.decode_json(encoded)
                if essence is not None:
                    return essence
        return None

    def store(self, *, body: bodies.Body, patch: patches.Patch, essence: bodies.BodyEssence) -> None:
        encoded = conventions.encode_json(essence) + '\n'
        annotations = patch.meta.annotations
        for full_key in self.make_keys(self.key, body=body):
            annotations[full_key] = encoded
        self.store_marker(self.prefix, patch, body)

    def locate(self, *, body: bodies.Body) -> tuple[str, Any] | None:
        annotations = conventions.annotations_of(body)
        for full_key in self.make_keys(self.key, body=body):
            if annotations.get(full_key) is not None:
                return f'The annotation {full_key!r}', annotations[full_key]
        return None


class StatusDiffBaseStorage(DiffBaseStorage):
    """
    The diff-base in a field of the object, ``status.kopf.last-handled-configuration`` by default.

    The essence is stored as a compact JSON string (no trailing newline), not as a structure:
    so that the structural schemas and the merge-patches do not alter it.
    Note: the CRDs must allow unknown fields in the status, or the API will silently drop them.
    """

    def __init__(
            self,
            *,
            name: str = 'kopf',
            field: dicts.FieldSpec = 'status.{name}.last-handled-configuration',
            ignored_fields: Iterable[dicts.FieldSpec] | None = None,
    ) -> None:
        super().__init__(ignored_fields=ignored_fields)
        self._name = name
        self._field = conventions.parse_named_field(field, name)

    @property
    def field(self) -> dicts.FieldPath:
        return self._field

    @field.setter
    def field(self, field: dicts.FieldSpec) -> None:
        self._field = conventions.parse_named_field(field, self._name)

    def build(
            self,
            *,
            body: bodies.Body,
            extra_fields: Iterable[dicts.FieldSpec] | None = None,
    ) -> bodies.BodyEssence:
        # The diff-base is never a part of itself, even if the extra fields bring it back.
        essence = super().build(body=body, extra_fields=extra_fields)
        if self._field:
            conventions.remove_along(essence, self._field)
        self.remove_empty_stanzas(essence)
        return essence

    def fetch(self, *, body: bodies.Body) -> bodies.BodyEssence | None:
        encoded = dicts.resolve(body, self._field, None)
        if encoded is None:
            return None
        if not isinstance(encoded, str):
            raise TypeError(f'The diff-base in {".".join(self._field)} must be a JSON string, '
                            f'got {type(encoded).__name__}.')
        essence: bodies.BodyEssence | None = conventions.decode_json(encoded)
        return essence

    def store(self, *, body: bodies.Body, patch: patches.Patch, essence: bodies.BodyEssence) -> None:
        dicts.ensure(patch, self._field, conventions.encode_json(essence))

    def locate(self, *, body: bodies.Body) -> tuple[str, Any] | None:
        value = dicts.resolve(body, self.field, None)
        if value is not None:
            return f'The field {".".join(self.field)!r}', value
        return None


class MultiDiffBaseStorage(DiffBaseStorage):
    """
    Several storages at once: all are written to, the first one with a diff-base is read from.

    Useful for the transition from one storage to another: put the new one first, the old one
    second; once all objects are handled at least once, remove the old one.
    The essence is built by every storage in turn, each from the previous one's essence,
    so that none of the storages' own data (nor their ignored fields) remain in it.
    """

    def __init__(self, storages: Collection[DiffBaseStorage]) -> None:
        super().__init__()
        self.storages = list(storages)

    def build(
            self,
            *,
            body: bodies.Body,
            extra_fields: Iterable[dicts.FieldSpec] | None = None,
    ) -> bodies.BodyEssence:
        if not self.storages:
            return super().build(body=body, extra_fields=extra_fields)
        extra_fields = list(extra_fields or [])  # it is iterated several times
        source = body
        for storage in self.storages:
            essence = storage.build(body=source, extra_fields=extra_fields)
            source = bodies.Body(essence)
        return essence

    def fetch(self, *, body: bodies.Body) -> bodies.BodyEssence | None:
        for storage in self.storages:
            essence = storage.fetch(body=body)
            if essence is not None:
                return essence
        return None

    def store(self, *, body: bodies.Body, patch: patches.Patch, essence: bodies.BodyEssence) -> None:
        for storage in self.storages:
            storage.store(body=body, patch=patch, essence=essence)

    def locate(self, *, body: bodies.Body) -> tuple[str, Any] | None:
        for storage in self.storages:
            found = storage.locate(body=body)
            if found is not None:
                return found
        return None

