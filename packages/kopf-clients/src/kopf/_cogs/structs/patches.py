"""
Patches accumulated by handlers, to be applied to objects after the handlers are done.

A :class:`Patch` is a merge-patch (RFC 7386): a dict where nested dicts are merged
into the object and ``None`` deletes a key. Since merge-patches cannot express changes
inside lists (e.g. to one of the status conditions), a patch also carries transformation
functions (``patch.fns``): callables that get a copy of the raw body and modify it in place.
The whole thing can be turned into a JSON-patch (RFC 6902) against a specific body:
the merge-patch and the functions are applied to a deep copy, and the result is diffed.
A merge-patch alone (the usual one, e.g. of every mutating admission review) is converted directly
by :func:`merge_to_json_patch`, with the same result: this is the one converter of the framework.
"""
import copy
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, NotRequired, TypedDict, cast

import jsonpatch

from kopf._cogs.structs import dicts
from kopf._cogs.structs.bodies import RawBody

# A transformation function: modifies the raw body (a deep copy of it) in place.
PatchFn = Callable[[RawBody], None]

# One operation of a JSON-patch (RFC 6902): e.g. ``{'op': 'add', 'path': '/spec/x', 'value': 1}``.
JSONPatchItem = TypedDict('JSONPatchItem', {
    'op': str,
    'path': str,
    'value': NotRequired[Any],
    'from': NotRequired[str],
})
JSONPatch = list[JSONPatchItem]


def merge_into(target: MutableMapping[str, Any], patch: Mapping[str, Any]) -> None:
    """
    Apply a merge-patch (RFC 7386) to a mapping in place.

    ``None`` removes the key; a mapping is merged into the existing mapping (or replaces
    a non-mapping value); any other value (lists included) replaces the old value as a whole.
    The patch's values are copied, so the patch and the target never share mutable data.
    """
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping):
            existing = target.get(key)
            if not isinstance(existing, MutableMapping):
                existing = target[key] = {}
            merge_into(existing, value)
        else:
            target[key] = copy.deepcopy(value)


def apply_merge_patch(obj: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """Return a new dict: the object with the merge-patch (RFC 7386) applied; the object is intact."""
    result = copy.deepcopy(dict(obj))
    merge_into(result, patch)
    return result


def merge_to_json_patch(merge: Mapping[str, Any], body: Mapping[str, Any]) -> JSONPatch:
    """
    The JSON-patch (RFC 6902) that does to the body what the merge-patch (RFC 7386) does.

    It is converted directly, key by key, with no copies of the body (cheaper than applying the merge-patch
    to a copy and diffing the result, as :meth:`Patch.as_json_patch` does with the transformation functions):
    the removals of the existing keys, the additions of the new ones, the replacements of the changed values
    (the lists and other non-mappings as wholes, as the merge-patches replace them). The unchanged values
    get no operations: the values are compared as JSON (RFC 6902's equality: ``1`` and ``1.0`` are the same
    number, but ``true`` is not ``1``). The keys are escaped as JSON pointers (RFC 6901) need it.
    The nested ``None`` of a new mapping mean "absent" there (not in the lists: they are values as a whole).
    The values are copies: the operations and the merge-patch share no mutable data.
    """
    operations: JSONPatch = []
    _merge_to_json_patch(merge, dicts.raw_mapping(body), '', operations)
    return operations


def _merge_to_json_patch(merge: Mapping[str, Any], target: Mapping[str, Any], prefix: str,
                         operations: JSONPatch) -> None:
    # On the path of every mutating admission review: the exact-type checks go before the ABCs' ones
    # (Python-level calls), the equal scalars of the same type are known unchanged without a call.
    for key, value in merge.items():
        path = f'{prefix}/{key.replace("~", "~0").replace("/", "~1")}'
        exists = key in target
        current = target[key] if exists else None
        if value is None:
            if exists:
                operations.append({'op': 'remove', 'path': path})
        elif type(value) is dict or (type(value) not in _SCALARS and isinstance(value, Mapping)):
            if exists and (type(current) is dict or (type(current) not in _SCALARS and
                                                     isinstance(current, Mapping))):
                _merge_to_json_patch(value, current, path, operations)
            else:  # a new mapping (no non-mapping equals it): the nested None mean "absent" there
                new = _without_nones(value)
                operations.append({'op': 'replace' if exists else 'add', 'path': path, 'value': new})
        elif not exists or current != value or (  # equal in Python, but maybe not in JSON (1 & true):
                (type(current) is not type(value) or type(value) not in _SCALARS) and
                not same_json(current, value)):
            new = value if type(value) in _SCALARS else copy.deepcopy(value)
            operations.append({'op': 'replace' if exists else 'add', 'path': path, 'value': new})


def _without_nones(value: Mapping[str, Any]) -> dict[str, Any]:
    """A new value from a merge-patch: the nested mappings merged into nothing (copied, the lists too)."""
    return {key: (item if type(item) in _SCALARS else
                  _without_nones(item) if type(item) is dict or isinstance(item, Mapping) else
                  copy.deepcopy(item))
            for key, item in value.items() if item is not None}


def same_json(a: Any, b: Any) -> bool:
    """
    Whether two values are the same JSON: as ``==`` in Python, but the booleans are not the numbers.

    As RFC 6902 compares the values (e.g. in its ``test`` operation): the numbers by their values
    (``1`` is ``1.0``), the objects regardless of the keys' order, the arrays item by item.
    """
    if a != b:  # the different values are known so at C speed
        return False
    kind = type(a)
    if kind is bool or type(b) is bool:
        return kind is type(b)
    if kind is str or kind is int or kind is float or a is None:
        return True
    if isinstance(a, Mapping):  # equal to a mapping: b is a mapping with the same keys
        return all(same_json(item, b[key]) for key, item in a.items())
    if isinstance(a, list):  # equal to a list: b is a list of the same length
        return all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return True


_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None)})


class _SubPatch(MutableMapping[str, Any]):
    """
    A mutable view of a dict nested in a patch, e.g. of ``patch['spec']``.

    The dict is created in the parent only on the first write, so merely looking
    at ``patch.spec`` does not make the patch non-empty.
    """

    def __init__(self, parent: MutableMapping[str, Any], key: str) -> None:
        super().__init__()
        self._parent = parent
        self._key = key

    def _existing(self) -> Mapping[str, Any]:
        value = self._parent.get(self._key)
        return value if type(value) is dict or (value is not None and isinstance(value, Mapping)) else {}

    def _ensured(self) -> MutableMapping[str, Any]:
        value = self._parent.get(self._key)
        # (None, i.e. absent, is the usual non-dict: the ABC's check is a Python-level call even for it.)
        if type(value) is not dict and (value is None or not isinstance(value, MutableMapping)):
            value = self._parent[self._key] = {}
        return value

    def __repr__(self) -> str:
        return repr(self._existing())

    def __len__(self) -> int:
        return len(self._existing())

    def __iter__(self) -> Iterator[str]:
        return iter(self._existing())

    def __getitem__(self, key: str) -> Any:
        return self._existing()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._ensured()[key] = value

    def __delitem__(self, key: str) -> None:
        value = self._parent.get(self._key)
        if not isinstance(value, MutableMapping):
            raise KeyError(key)
        del value[key]


class MetaPatch(_SubPatch):
    """The patch of ``metadata``, with the patches of ``labels`` and ``annotations`` in it."""

    def __init__(self, parent: MutableMapping[str, Any]) -> None:
        super().__init__(parent, 'metadata')

    @property
    def labels(self) -> MutableMapping[str, Any]:
        return _SubPatch(self, 'labels')

    @property
    def annotations(self) -> MutableMapping[str, Any]:
        return _SubPatch(self, 'annotations')


class SpecPatch(_SubPatch):
    def __init__(self, parent: MutableMapping[str, Any]) -> None:
        super().__init__(parent, 'spec')


class StatusPatch(_SubPatch):
    def __init__(self, parent: MutableMapping[str, Any]) -> None:
        super().__init__(parent, 'status')


class Patch(dict[str, Any]):
    """
    A merge-patch being accumulated for an object, plus the transformation functions.

    The patch is "empty" (false in boolean context) only if there are neither
    the merge-patch keys nor the functions: pending functions need a request too.

    The ``meta``/``metadata``, ``spec``, ``status`` sub-patches are tiny views made
    on every access (not kept, to avoid reference cycles): they write into the patch itself.

    ``body`` is the object's state the patch is made for; it is used by default
    to build the JSON-patch (e.g. for admission responses).
    """

    fns: list[PatchFn]

    def __init__(
            self,
            src: MutableMapping[str, Any] | None = None,
            /,
            body: Mapping[str, Any] | None = None,
    ) -> None:
        if src is None:  # the usual case, made for every event & every timer's tick: no copying
            super().__init__()
            self.fns = []
        else:
            super().__init__(src)
            self.fns = list(src.fns) if isinstance(src, Patch) else []
        self._body = body

    def __copy__(self) -> 'Patch':
        return Patch(self, body=self._body)

    def __bool__(self) -> bool:
        return len(self) > 0 or bool(self.fns)

    def __repr__(self) -> str:
        if self.fns:
            names = ', '.join(getattr(fn, '__qualname__', repr(fn)) for fn in self.fns)
            return f'{super().__repr__()} + fns=[{names}]'
        return super().__repr__()

    @property
    def body(self) -> Mapping[str, Any] | None:
        return self._body

    @property
    def metadata(self) -> MetaPatch:
        return MetaPatch(self)

    @property
    def meta(self) -> MetaPatch:
        return MetaPatch(self)

    @property
    def spec(self) -> SpecPatch:
        return SpecPatch(self)

    @property
    def status(self) -> StatusPatch:
        return StatusPatch(self)

    def as_json_patch(
            self,
            body: Mapping[str, Any] | None = None,
            *,
            merge: bool = True,
            guarded: bool | None = None,
    ) -> JSONPatch:
        """
        Convert the patch to a JSON-patch (RFC 6902) against the given (or the remembered) body.

        The merge-patch (unless ``merge=False``, e.g. when it is sent separately) and then
        the transformation functions are applied to a deep copy of the body, and the JSON-patch
        is the difference between the original and the result. The body is not modified.
        Without the functions, the merge-patch is converted directly (see :func:`merge_to_json_patch`):
        the result is the same, but the lists are replaced as wholes, as the merge-patch replaces them.

        A ``guarded`` JSON-patch starts with a test of ``metadata.resourceVersion``, so that
        it fails (HTTP 422) if the object has changed since the body was fetched, instead of
        silently breaking the lists by the positions computed for another state.
        By default, it is guarded only if there are functions and the body has a version.
        """
        base: Mapping[str, Any] = body if body is not None else self._body if self._body is not None else {}
        if not self.fns:  # the merge-patch alone (e.g. of every admission review): converted directly
            ops = merge_to_json_patch(self, base) if merge else []
            if not guarded or not ops:  # by default, not guarded: there are no functions
                return ops
            original: Mapping[str, Any] = dicts.raw_mapping(base)
        else:
            original = dict(base)  # only read (the nested values are raw dicts even if the body is a view).
            target = copy.deepcopy(original)
            if merge:
                merge_into(target, self)
            for fn in self.fns:
                fn(cast(RawBody, target))  # RawBody is a plain dict at runtime.
            ops = cast(JSONPatch, list(jsonpatch.make_patch(original, target).patch))

        resource_version = dicts.resolve(original, ('metadata', 'resourceVersion'), None)
        if guarded is None:
            guarded = resource_version is not None  # there are functions (see above)
        if guarded and ops:
            if resource_version is None:
                raise ValueError('Cannot guard the JSON-patch: the body has no metadata.resourceVersion.')
            ops.insert(0, {'op': 'test', 'path': '/metadata/resourceVersion', 'value': resource_version})
        return ops
