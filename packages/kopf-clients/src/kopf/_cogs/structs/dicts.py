"""
Nested dicts as they come from the Kubernetes API: field paths, lookups, writes, live views.

A "field path" is a tuple of keys from the root of an object down to a value,
e.g. ``('spec', 'template', 'metadata')``. Users may write it as a dotted string,
as a tuple, or as a list (a "field spec"); :func:`parse_field` normalises all forms.

The live views (:class:`MappingView` and :class:`ReplaceableMappingView`) are read-only
windows into a raw dict that never copy it: every access resolves the path anew,
so the views stay cheap and always show the latest state of their source.
"""
import enum
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any, Generic, Self, TypeVar, cast, overload

# A normalised path to a field: a tuple of keys from the object's root.
FieldPath = tuple[str, ...]

# What users may pass as a field: a dotted string, a tuple or a list of keys, or nothing (the root).
FieldSpec = str | tuple[str, ...] | list[str] | None

_K = TypeVar('_K')
_V = TypeVar('_V')
_T = TypeVar('_T')


class _Unset(enum.Enum):
    token = enum.auto()


_UNSET = _Unset.token


# The fields seen so far, parsed: the same few fields are parsed for every object and event.
# Bounded, in case some code makes the fields dynamically (e.g. from the objects' values).
_parsed_fields: dict[str | tuple[str, ...], FieldPath] = {}
_PARSED_FIELDS_LIMIT = 1024


def parse_field(field: FieldSpec) -> FieldPath:
    """
    Normalise a field spec to a field path.

    Dotted strings are split by dots (``'spec.field'`` -> ``('spec', 'field')``);
    tuples and lists are taken key by key; ``None`` and empty values mean the root (``()``).
    """
    if field is None:
        return ()
    if type(field) is str or type(field) is tuple:
        try:
            return _parsed_fields[field]
        except (KeyError, TypeError):  # TypeError: unhashable items in a tuple (invalid anyway)
            pass
        path = _parse_field(field)
        if len(_parsed_fields) < _PARSED_FIELDS_LIMIT:
            _parsed_fields[field] = path
        return path
    return _parse_field(field)


def _parse_field(field: str | tuple[str, ...] | list[str]) -> FieldPath:
    if isinstance(field, str):
        return tuple(field.split('.')) if field else ()
    if isinstance(field, (tuple, list)):
        if not all(isinstance(key, str) for key in field):
            raise TypeError(f'Field paths must consist of strings only, got {field!r}.')
        return tuple(field)
    raise TypeError(f'A field must be a dotted string, a tuple or a list of strings, got {field!r}.')


@overload
def resolve(obj: Mapping[str, Any] | None, field: FieldSpec) -> Any: ...


@overload
def resolve(obj: Mapping[str, Any] | None, field: FieldSpec, default: _T) -> Any | _T: ...


def resolve(
        obj: Mapping[str, Any] | None,
        field: FieldSpec,
        default: Any = _UNSET,
) -> Any:
    """
    Get a value from a nested mapping by a field path.

    Without a default, a missing key (or a non-mapping on the way down) raises ``KeyError``.
    With a default, the default is returned in those cases. ``None`` as the object means
    an empty one (e.g. an absent ``old`` state of a diff).
    """
    path = parse_field(field)
    value: Any = obj if obj is not None else {}
    if type(value) in _view_classes:  # e.g. a body: its raw mapping passes the exact-dict checks below
        value = value._resolve()
    for index, key in enumerate(path):
        # The exact-dict check goes first: it is the usual case, and much faster than the ABC check.
        if (type(value) is dict or isinstance(value, Mapping)) and key in value:
            value = value[key]
        elif default is not _UNSET:
            return default
        elif not isinstance(value, Mapping):
            where = '.'.join(path[:index]) or '<root>'
            raise KeyError(f'Field {where!r} is not a mapping, so {".".join(path)!r} cannot be resolved.')
        else:
            raise KeyError('.'.join(path[:index + 1]))
    return value


def ensure(obj: MutableMapping[str, Any], field: FieldSpec, value: Any) -> None:
    """
    Put a value into a nested mapping by a field path, creating the intermediate dicts.

    An existing intermediate value that is not a mapping is an error: overwriting it
    silently would destroy the data that is there.
    """
    path = parse_field(field)
    if not path:
        raise ValueError('Cannot replace the root object itself; a non-empty field path is needed.')
    parent: MutableMapping[str, Any] = obj
    for index, key in enumerate(path[:-1]):
        child = parent.setdefault(key, {})
        if type(child) is not dict and not isinstance(child, MutableMapping):
            where = '.'.join(path[:index + 1])
            raise TypeError(f'Field {where!r} is {type(child).__name__}, not a mapping: cannot go into it.')
        parent = child
    parent[path[-1]] = value


def remove(obj: MutableMapping[str, Any], field: FieldSpec, *, prune: bool = False) -> None:
    """
    Remove a key from a nested mapping by a field path; absent keys are fine.

    With ``prune``, the intermediate dicts that become empty are removed too,
    so that no empty stanzas (e.g. ``status: {kopf: {}}``) are left behind.
    """
    path = parse_field(field)
    if not path:
        raise ValueError('Cannot remove the root object itself; a non-empty field path is needed.')
    parents: list[MutableMapping[str, Any]] = []
    current: Any = obj
    for key in path[:-1]:
        if (type(current) is not dict and not isinstance(current, MutableMapping)) or key not in current:
            return
        parents.append(current)
        current = current[key]
    if (type(current) is not dict and not isinstance(current, MutableMapping)) or path[-1] not in current:
        return
    del current[path[-1]]
    if prune:
        for parent, key in zip(reversed(parents), reversed(path[:-1]), strict=True):
            child = parent[key]
            if isinstance(child, Mapping) and not child:
                del parent[key]
            else:
                break


def cherrypick(
        src: Mapping[str, Any],
        dst: MutableMapping[str, Any],
        fields: Iterable[FieldSpec],
) -> None:
    """
    Copy the listed fields from one nested mapping to another, skipping the absent ones.

    The values are shared, not copied: the caller decides if a deep copy is needed.
    """
    missing = object()
    for field in fields:
        value = resolve(src, field, missing)
        if value is not missing:
            ensure(dst, field, value)


def walk(
        objs: MutableMapping[str, Any] | Iterable[MutableMapping[str, Any]],
        *,
        nested: str | Iterable[FieldSpec] | None = None,
) -> Iterator[MutableMapping[str, Any]]:
    """
    Iterate over one object or several objects, and over their nested sub-objects.

    ``objs`` is either a single mapping or an iterable of mappings (e.g. a list of children).
    For every object, the mappings found at the ``nested`` field paths (e.g. ``spec.template``
    of a Job or a Deployment) are yielded right after it. Absent or non-mapping nested
    fields are skipped.
    """
    nested_paths: list[FieldPath]
    if nested is None:
        nested_paths = []
    elif isinstance(nested, str):
        nested_paths = [parse_field(nested)]
    else:
        nested_paths = [parse_field(field) for field in nested]

    objects: Iterable[MutableMapping[str, Any]]
    if isinstance(objs, Mapping):  # mappings are iterable too (by keys), so they go first
        objects = [cast('MutableMapping[str, Any]', objs)]
    else:
        objects = objs
    for obj in objects:
        yield obj
        for path in nested_paths:
            sub = resolve(obj, path, None)
            if isinstance(sub, MutableMapping):
                yield sub


class _Source:
    """
    A replaceable reference to a raw mapping, shared by a view and all views nested in it.

    The nested views refer to it rather than to their parent views, so there are no reference
    cycles between the views, and the objects are freed as soon as they are not used.
    """

    __slots__ = ('mapping',)

    def __init__(self, mapping: Mapping[Any, Any]) -> None:
        self.mapping = mapping


class MappingView(Mapping[_K, _V], Generic[_K, _V]):
    """
    A read-only live view of a mapping, or of a mapping nested in another view by a path.

    Nothing is copied: every access goes to the source, so the view always shows its
    latest state, including when the source of a parent view is replaced in place.
    If the path leads to nothing (or to a non-mapping), the view is empty.

    The nested values are returned as they are in the source (not wrapped, not copied).
    """

    __slots__ = ('_path', '_source')
    _source: _Source
    _path: FieldPath

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _view_classes.add(cls)

    def __init__(self, src: Mapping[Any, Any], path: FieldSpec = None, /) -> None:
        super().__init__()
        # The views are made for every processed event: the exact class check is much faster than
        # the ABC's isinstance(); the subclasses of the views are registered when declared.
        if type(src) in _view_classes:
            # Follow the parent's own source (and its replacements), not the parent itself.
            parent: MappingView[Any, Any] = src  # type: ignore[assignment]  # not cast(): it is a call
            self._source = parent._source
            self._path = parent._path + parse_field(path) if path is not None else parent._path
        else:
            self._source = _Source(src)
            self._path = parse_field(path) if path is not None else ()

    @classmethod
    def _nested_in(cls, parent: 'MappingView[Any, Any]', path: FieldPath) -> Self:
        """
        A view nested in a view by a parsed path: the same as ``cls(parent, path)``, with no parsing & checks.

        For the framework's own views made for every event (the bodies' ``meta``, ``spec``, etc.).
        """
        view = cls.__new__(cls)
        view._source = parent._source
        view._path = parent._path + path
        return view

    def _resolve(self) -> Mapping[_K, _V]:
        # This is the hot path of all handlers' kwargs: the exact-dict checks go before the ABC checks.
        mapping: Any = self._source.mapping
        for key in self._path:
            if type(mapping) is not dict and not isinstance(mapping, Mapping):
                return {}
            mapping = mapping.get(key)
        if type(mapping) is dict or isinstance(mapping, Mapping):
            resolved: Mapping[_K, _V] = mapping  # not cast(): a function call, and this is done a lot
            return resolved
        return {}

    def __repr__(self) -> str:
        return repr(self._resolve())

    def __len__(self) -> int:
        return len(self._resolve())

    def __iter__(self) -> Iterator[_K]:
        return iter(self._resolve())

    # The reads of the top-level views (e.g. the bodies, several per event) skip the resolution's call.

    def __getitem__(self, key: _K) -> _V:
        if not self._path and type(mapping := self._source.mapping) is dict:
            value: _V = mapping[key]
            return value
        return self._resolve()[key]

    def __contains__(self, key: object) -> bool:
        if not self._path and type(mapping := self._source.mapping) is dict:
            return key in mapping
        return key in self._resolve()

    def get(self, key: _K, default: Any = None) -> Any:  # a faster shortcut of the Mapping's mixin.
        if not self._path and type(mapping := self._source.mapping) is dict:
            return mapping.get(key, default)
        return self._resolve().get(key, default)


def raw_mapping(obj: Mapping[_K, _V]) -> Mapping[_K, _V]:
    """
    The mapping itself, or the raw mapping behind a live view as it is now: for fast reads of many keys.

    Every access to a view resolves its path anew; when many keys are read at once (e.g. all of them),
    it is faster to resolve once. The result must not be kept: the view's source can be replaced.
    """
    if type(obj) in _view_classes:  # not isinstance(): the views are ABCs, and their checks are slow
        view: MappingView[_K, _V] = obj  # type: ignore[assignment]  # not cast(): it is a call
        if not view._path and type(mapping := view._source.mapping) is dict:
            return mapping
        return view._resolve()
    return obj


_view_classes: set[type[Any]] = {MappingView}


class ReplaceableMappingView(MappingView[_K, _V], Generic[_K, _V]):
    """
    A live view whose source can be replaced in place, e.g. with a newer state of an object.

    All the views derived from it (nested by paths) see the replacement immediately,
    so the handlers that keep references to them always see the latest state.
    A replaceable view never shares its source with the view it is made from:
    replacing it must not affect the other view.
    """

    __slots__ = ()

    def __init__(self, src: Mapping[Any, Any], path: FieldSpec = None, /) -> None:
        super().__init__(src, path)
        if type(src) in _view_classes:
            self._source = _Source(MappingView(src, path))  # nested views of it are still live
            self._path = ()

    @classmethod
    def _wrapping(cls, src: Mapping[_K, _V]) -> Self:
        """
        A view of a raw mapping (not of a view): the same as ``cls(src)``, in one call instead of three.

        For the framework's own views made for every event (the objects' bodies); not for the subclasses
        with their own ``__init__()``, which this skips.
        """
        source = _Source.__new__(_Source)
        source.mapping = src
        view = cls.__new__(cls)
        view._source = source
        view._path = ()
        return view

    def _replace_with(self, src: Mapping[_K, _V]) -> None:
        self._source.mapping = src
