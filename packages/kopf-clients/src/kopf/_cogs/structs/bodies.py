"""
Kubernetes objects: their raw JSON shapes and the live read-only views given to handlers.

The raw types (``RawBody``, ``RawEvent``, etc.) describe the JSON-decoded dicts
as they come from the API; they are plain dicts at runtime.

:class:`Body` wraps a raw body without copying it. When a newer state of the same object
arrives, the framework replaces the body's source in place, so the handlers and daemons
that hold the body (or its ``spec``/``meta``/``status`` views) see the latest state.
The views are created once per body and resolve their sub-dicts on every access,
which keeps them cheap for thousands of objects and events.
"""
from collections.abc import Mapping
from typing import Any, Generic, Literal, TypedDict, TypeVar, overload

from kopf._cogs.structs import dicts

_ViewT_co = TypeVar('_ViewT_co', covariant=True)


class _nested_view(Generic[_ViewT_co]):  # lower-case: it is used as a property is
    """
    A sub-view by a fixed path (``body.metadata``, ``meta.labels``, etc.): made on first access, then kept.

    The view is kept in the instance's ``__dict__``. Being a non-data descriptor, this is not even called
    once the view is there. Unlike ``functools.cached_property``, it takes no lock (Python 3.11 locks
    every first access): the views are made for every processed event, and making a view twice in a race
    is harmless. It is made as ``MappingView._nested_in()`` makes it, but in one call, not three.
    """

    def __init__(self, cls: type[_ViewT_co], path: 'dicts.FieldPath', doc: str) -> None:
        super().__init__()
        self._cls = cls
        self._path = path
        self._name = ''
        self.__doc__ = doc

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> '_nested_view[_ViewT_co]': ...

    @overload
    def __get__(self, instance: object, owner: type[Any] | None = None) -> _ViewT_co: ...

    def __get__(self, instance: Any, owner: type[Any] | None = None) -> Any:
        if instance is None:
            return self
        cls: Any = self._cls  # a view class
        view = cls.__new__(cls)  # as MappingView._nested_in() makes it
        view._source = instance._source
        view._path = instance._path + self._path
        instance.__dict__[self._name] = view
        return view


# The labels and annotations of an object, as handlers see them (read-only).
Labels = Mapping[str, str]
Annotations = Mapping[str, str]

# The types of watch-events as they are given to handlers; None means the initial listing.
RawEventType = Literal[None, 'ADDED', 'MODIFIED', 'DELETED']

# The types of the raw lines of watch-streams, including the service ones (not given to handlers).
RawInputType = Literal['ADDED', 'MODIFIED', 'DELETED', 'ERROR', 'BOOKMARK']


class RawMeta(TypedDict, total=False):
    name: str
    generateName: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    creationTimestamp: str
    deletionTimestamp: str
    deletionGracePeriodSeconds: int
    labels: dict[str, str]
    annotations: dict[str, str]
    finalizers: list[str]
    ownerReferences: list[dict[str, Any]]
    managedFields: list[dict[str, Any]]


class RawBody(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: RawMeta
    spec: dict[str, Any]
    status: dict[str, Any]


class RawEvent(TypedDict):
    type: RawEventType
    object: RawBody


class RawInput(TypedDict):
    """One line of a watch-stream, before it is interpreted."""
    type: RawInputType
    object: dict[str, Any]


class BodyEssence(TypedDict, total=False):
    """The meaningful part of a body (e.g. for the diff-base): without the system-managed fields."""
    apiVersion: str
    kind: str
    metadata: RawMeta
    spec: dict[str, Any]
    status: dict[str, Any]


# The paths of the views, parsed once.
_METADATA: dicts.FieldPath = ('metadata',)
_SPEC: dicts.FieldPath = ('spec',)
_STATUS: dicts.FieldPath = ('status',)
_LABELS: dicts.FieldPath = ('labels',)
_ANNOTATIONS: dicts.FieldPath = ('annotations',)


class Meta(dicts.MappingView[str, Any]):
    """The live view of an object's ``metadata`` with shortcuts to its well-known fields."""

    def __init__(self, src: Mapping[str, Any], /) -> None:
        super().__init__(src, 'metadata')

    def _get_str(self, key: str) -> str | None:
        value = self._resolve().get(key)
        return value if isinstance(value, str) else None

    # The views are made on first use only: most handlers never look at most of them.
    # (Not ``MappingView[str, str](...)``: a subscripted generic costs more than the view itself.)
    labels: '_nested_view[Labels]' = _nested_view(dicts.MappingView, _LABELS, 'The live view of the labels.')
    annotations: '_nested_view[Annotations]' = _nested_view(dicts.MappingView, _ANNOTATIONS,
                                                             'The live view of the annotations.')

    @property
    def uid(self) -> str | None:
        return self._get_str('uid')

    @property
    def name(self) -> str | None:
        return self._get_str('name')

    @property
    def namespace(self) -> str | None:
        return self._get_str('namespace')

    @property
    def creation_timestamp(self) -> str | None:
        return self._get_str('creationTimestamp')

    @property
    def deletion_timestamp(self) -> str | None:
        return self._get_str('deletionTimestamp')


class Spec(dicts.MappingView[str, Any]):
    """The live view of an object's ``spec``: empty if there is none."""

    def __init__(self, src: Mapping[str, Any], /) -> None:
        super().__init__(src, 'spec')


class Status(dicts.MappingView[str, Any]):
    """The live view of an object's ``status``: empty if there is none."""

    def __init__(self, src: Mapping[str, Any], /) -> None:
        super().__init__(src, 'status')


class Body(dicts.ReplaceableMappingView[str, Any]):
    """
    The live read-only view of a whole object, with its ``meta``, ``spec``, ``status`` views.

    The views are the same objects for the whole life of the body, and they follow
    the in-place replacements of the body's source.
    """

    # The views are made on first use only: most handlers never look at most of them.
    # (Made as Meta(self) & co would make them, but with fewer calls: several of them for every event.)
    metadata = _nested_view(Meta, _METADATA, "The live view of the object's ``metadata``.")
    spec = _nested_view(Spec, _SPEC, "The live view of the object's ``spec``.")
    status = _nested_view(Status, _STATUS, "The live view of the object's ``status``.")

    @property
    def meta(self) -> Meta:
        return self.metadata


def version_of(raw_body: Mapping[str, Any] | None) -> str | None:
    """The object's ``metadata.resourceVersion`` (as a string), or None if it has none."""
    meta = raw_body.get('metadata') if raw_body is not None else None
    version = meta.get('resourceVersion') if type(meta) is dict or isinstance(meta, Mapping) else None
    return str(version) if version else None


def is_newer_version(version: str | None, than: str | None) -> bool:
    """
    Whether a resource version is surely newer than another one.

    The versions are opaque strings by the API's contract, but in practice (etcd) they are growing
    integers (the consistency checks of the reactor and the engines rely on it); if not, nothing is newer.
    """
    return (version is not None and than is not None and version.isdigit() and than.isdigit() and
            int(version) > int(than))
