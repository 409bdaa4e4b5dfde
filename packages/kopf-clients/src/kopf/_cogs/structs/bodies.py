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
from collections.abc import Callable, Mapping
from typing import Any, Generic, Literal, TypedDict, TypeVar, overload

from kopf._cogs.structs import dicts

_OwnerT = TypeVar('_OwnerT')
_ViewT = TypeVar('_ViewT')


class _lazy_view(Generic[_OwnerT, _ViewT]):  # lower-case: named as the decorator it is used as
    """
    A sub-view made on first access and then kept in the instance's ``__dict__``.

    Unlike ``functools.cached_property``, it takes no lock (Python 3.11 locks every first access):
    the views are made for every processed event, and making a view twice in a race is harmless.
    Being a non-data descriptor, it is not even called once the view is kept in the instance.
    """

    def __init__(self, make: Callable[[_OwnerT], _ViewT]) -> None:
        super().__init__()
        self._make = make
        self._name = make.__name__
        self.__doc__ = make.__doc__

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> '_lazy_view[_OwnerT, _ViewT]': ...

    @overload
    def __get__(self, instance: _OwnerT, owner: type[Any] | None = None) -> _ViewT: ...

    def __get__(self, instance: _OwnerT | None, owner: type[Any] | None = None) -> Any:
        if instance is None:
            return self
        view = instance.__dict__[self._name] = self._make(instance)
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
    @_lazy_view
    def labels(self) -> Labels:
        view: dicts.MappingView[str, str] = dicts.MappingView._nested_in(self, _LABELS)
        return view

    @_lazy_view
    def annotations(self) -> Annotations:
        view: dicts.MappingView[str, str] = dicts.MappingView._nested_in(self, _ANNOTATIONS)
        return view

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
    @_lazy_view
    def metadata(self) -> Meta:
        return Meta._nested_in(self, _METADATA)

    @property
    def meta(self) -> Meta:
        return self.metadata

    @_lazy_view
    def spec(self) -> Spec:
        return Spec._nested_in(self, _SPEC)

    @_lazy_view
    def status(self) -> Status:
        return Status._nested_in(self, _STATUS)
