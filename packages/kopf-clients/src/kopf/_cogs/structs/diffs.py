"""
Differences between two states of an object (or of a field), as given to handlers in ``diff``.

A diff is a sequence of items ``(operation, field, old, new)``, where ``field`` is a tuple
of keys relative to the diffed value (empty for the value itself). The mappings are
compared key by key recursively; all other values (lists included) are compared as wholes.

As in Kubernetes, ``None`` means an absent value: a key with ``None`` is the same as
no key at all, and ``None`` is put as ``old`` of added values and as ``new`` of removed ones.
"""
import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, overload

from kopf._cogs.helpers import jsons
from kopf._cogs.structs.dicts import FieldPath, FieldSpec, parse_field, resolve

__all__ = [
    'Diff',
    'DiffItem',
    'DiffOperation',
    'FieldPath',
    'FieldSpec',
    'diff',
    'parse_field',
    'reduce',
]


class DiffOperation(enum.StrEnum):
    ADD = 'add'
    CHANGE = 'change'
    REMOVE = 'remove'

    def __repr__(self) -> str:  # the plain string, so that the diffs look like the tuples in logs.
        return repr(self.value)


class DiffItem(NamedTuple):
    """One change: what happened (add/change/remove) to which field, from which old to which new value."""

    operation: DiffOperation
    field: FieldPath
    old: Any
    new: Any

    def __repr__(self) -> str:
        return repr(tuple(self))

    @property
    def op(self) -> DiffOperation:
        return self.operation


class Diff(Sequence[DiffItem]):
    """
    An immutable sequence of diff items.

    It equals to any sequence with the same items, including plain tuples
    such as ``(('add', ('spec', 'field'), None, 'value'),)``.
    """

    __slots__ = ('_items',)
    _items: tuple[DiffItem, ...]

    def __init__(self, items: Iterable[DiffItem | tuple[str, FieldPath, Any, Any]] = (), /) -> None:
        super().__init__()
        self._items = tuple(
            item if isinstance(item, DiffItem) else
            DiffItem(DiffOperation(item[0]), tuple(item[1]), item[2], item[3])
            for item in items
        )

    @classmethod
    def _of(cls, items: Iterable[DiffItem]) -> 'Diff':
        """A diff of ready items, unchecked: for the diffs computed here (one in every handling cycle)."""
        made = cls.__new__(cls)
        made._items = tuple(items)
        return made

    def __repr__(self) -> str:
        return repr(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[DiffItem]:
        return iter(self._items)

    @overload
    def __getitem__(self, index: int) -> DiffItem: ...

    @overload
    def __getitem__(self, index: slice) -> 'Diff': ...

    def __getitem__(self, index: int | slice) -> 'DiffItem | Diff':
        if isinstance(index, slice):
            return Diff(self._items[index])
        return self._items[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return self._items == tuple(other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self) -> int:
        return hash(self._items)


def diff(a: Any, b: Any, *, fields: Iterable[FieldSpec] | None = None) -> Diff:
    """
    Compute the difference from the old state ``a`` to the new state ``b``.

    If ``fields`` are given, only those fields are compared (the paths in the items
    are still from the root); otherwise, the whole values are.
    """
    items: list[DiffItem] = []
    if fields is None:
        if not _surely_same(a, b):
            _diff_into(items, a, b, ())
    else:
        for field in fields:
            path = parse_field(field)
            _diff_into(items, resolve(a, path, None), resolve(b, path, None), path)
    return Diff._of(items)


def reduce(d: Diff, field: FieldSpec) -> Diff:
    """
    Narrow a diff of a whole value to one of its fields, with the paths relative to that field.

    The items about other fields are dropped. The items about the field's parents
    (e.g. a whole ``spec`` added when narrowing to ``spec.field``) are re-diffed
    at the level of the field, so that only the relevant part of them is left.
    """
    path = parse_field(field)
    if not path:
        return d if isinstance(d, Diff) else Diff(d)
    items: list[DiffItem] = []
    for item in d:
        if item.field[:len(path)] == path:  # the item is inside the field (or is the field itself)
            items.append(DiffItem(item.operation, item.field[len(path):], item.old, item.new))
        elif path[:len(item.field)] == item.field:  # the item is a parent of the field
            subpath = path[len(item.field):]
            old = resolve(item.old, subpath, None) if isinstance(item.old, Mapping) else None
            new = resolve(item.new, subpath, None) if isinstance(item.new, Mapping) else None
            _diff_into(items, old, new, ())
    return Diff._of(items)


_LEAF_TYPES: frozenset[type] = frozenset({str, int, float, bool, list})


def _surely_same(a: Any, b: Any) -> bool:
    """
    Whether the diff of two dicts is surely empty, known without walking them in Python.

    The usual case of every handling cycle is an unchanged essence. Equal dicts are not enough:
    the diff tells ``1`` from ``1.0`` and ``True`` (which are equal in Python), but their JSON differs.
    So, equal dicts with the same JSON (encoded natively, if it is; else the walk is cheaper) have no diff.
    Anything else (incl. the same keys in another order) is walked as usual.
    """
    if not jsons.ACCELERATED or type(a) is not dict or type(b) is not dict or a != b:
        return False
    try:
        return jsons.dumps(a) == jsons.dumps(b)
    except (TypeError, ValueError):  # not JSON: the walk tells what it can
        return False


def _diff_into(items: list[DiffItem], a: Any, b: Any, path: FieldPath) -> None:
    # Into one list rather than via nested generators: a diff is computed in every handling cycle.
    if a is None and b is None:
        return
    elif a is None:
        items.append(DiffItem(DiffOperation.ADD, path, None, b))
    elif b is None:
        items.append(DiffItem(DiffOperation.REMOVE, path, a, None))
    elif (type(a) is dict and type(b) is dict) or (
            # The ABCs' checks are Python-level calls: not for the usual leaves, which are surely no mappings.
            type(a) not in _LEAF_TYPES and type(b) not in _LEAF_TYPES
            and isinstance(a, Mapping) and isinstance(b, Mapping)
    ):
        for key in a:
            _diff_into(items, a[key], b.get(key), (*path, key))
        for key in b:
            if key not in a:
                _diff_into(items, None, b[key], (*path, key))
    elif type(a) is not type(b) or a != b:  # so that 1 == 1.0 == True are not taken as unchanged.
        items.append(DiffItem(DiffOperation.CHANGE, path, a, b))
