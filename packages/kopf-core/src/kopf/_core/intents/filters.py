"""
Filters of the handlers: which objects (and which changes of them) a handler is interested in.

All the criteria of a handler must match (AND). The criteria are:

* ``labels=`` and ``annotations=``: per key, a specific value, :data:`PRESENT`, :data:`ABSENT`,
  or a callback of the value (``None`` if the key is absent) and the handler's kwargs.
  An empty string is a present value like any other.
* ``field=`` with ``value=``: the same kinds of criteria for the field's value; a field with
  no value criterion must be present.
* ``when=``: a callback of the handler's kwargs only.
* For the update & field handlers (those with ``field_needs_change``), the field must be changed
  (modified, added, removed): ``value=`` then matches if either the old or the new value does,
  while ``old=``/``new=`` match the old and the new values separately.

The callbacks get the same kwargs as the handler would (incl. ``param``), and are called
only when all the cheaper criteria have matched.

The callback combinators (:func:`not_`, :func:`any_`, :func:`all_`, :func:`none_`) work both
for the whole-object callbacks and for the value callbacks: they pass all their arguments through.
"""
import enum
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar, cast

from kopf._cogs.structs import dicts
from kopf._core.intents.callbacks import MetaFilterFn
from kopf._core.intents.causes import (
    BaseCause,
    FieldChange,
    ResourceCause,
    ResourceChangingCause,
    narrow_to_field,
)
from kopf._core.intents.handlers import ChangingHandler, ResourceHandler


class MetaFilterToken(enum.Enum):
    """Special criteria of the value filters: the value must be present, or must be absent."""

    PRESENT = 1
    ABSENT = 2


PRESENT = MetaFilterToken.PRESENT
ABSENT = MetaFilterToken.ABSENT

# The criteria of the labels & annotations: key -> value, token, or callback.
MetaFilter = Mapping[str, str | MetaFilterToken | MetaFilterFn]

# The criterion of a field's value (and of old/new): any value, a token, or a callback.
ValueFilter = Any

_FnT = TypeVar('_FnT', bound=Callable[..., bool])


#
# Callback combinators.
#

def not_(fn: _FnT) -> _FnT:
    """A callback that passes when the given one does not."""
    _check_callables('not_', [fn])

    def not_fn(*args: Any, **kwargs: Any) -> bool:
        return not fn(*args, **kwargs)

    return cast(_FnT, not_fn)


def any_(fns: Collection[_FnT]) -> _FnT:
    """A callback that passes when at least one of the given ones does (none given: never)."""
    snapshot = _check_callables('any_', fns)

    def any_fn(*args: Any, **kwargs: Any) -> bool:
        return any(fn(*args, **kwargs) for fn in snapshot)

    return cast(_FnT, any_fn)


def all_(fns: Collection[_FnT]) -> _FnT:
    """A callback that passes when all of the given ones do (none given: always)."""
    snapshot = _check_callables('all_', fns)

    def all_fn(*args: Any, **kwargs: Any) -> bool:
        return all(fn(*args, **kwargs) for fn in snapshot)

    return cast(_FnT, all_fn)


def none_(fns: Collection[_FnT]) -> _FnT:
    """A callback that passes when none of the given ones does (none given: always)."""
    snapshot = _check_callables('none_', fns)

    def none_fn(*args: Any, **kwargs: Any) -> bool:
        return not any(fn(*args, **kwargs) for fn in snapshot)

    return cast(_FnT, none_fn)


def _check_callables(name: str, fns: Any) -> tuple[Callable[..., bool], ...]:
    # Checked when combined (i.e. at decoration time), not when the filter is evaluated for an object.
    # The collection is copied, so that its later modifications do not change the combined filter.
    if callable(fns) or isinstance(fns, (str, bytes)) or not isinstance(fns, Collection):
        raise TypeError(f'kopf.{name}() expects a collection of callables, got {fns!r}.')
    snapshot = tuple(fns)
    for fn in snapshot:
        if not callable(fn):
            raise TypeError(f'kopf.{name}() expects callables only, got {fn!r}.')
    return snapshot


#
# Matching.
#

class _LazyKwargs:
    """The kwargs of the callbacks, built only if some callback is actually called, and only once."""

    __slots__ = ('_cause', '_handler', '_kwargs')

    def __init__(self, cause: BaseCause, handler: ResourceHandler) -> None:
        super().__init__()
        self._cause = cause
        self._handler = handler
        self._kwargs: dict[str, Any] | None = None

    def __call__(self) -> dict[str, Any]:
        if self._kwargs is None:
            self._kwargs = self._cause.kwargs_for(self._handler)
        return self._kwargs


def check_value(criterion: ValueFilter, value: Any, kwargs: Callable[[], Mapping[str, Any]]) -> bool:
    """Check one value (``None`` if absent) against one criterion: a literal, a token, or a callback."""
    if criterion is MetaFilterToken.PRESENT:
        return value is not None
    if criterion is MetaFilterToken.ABSENT:
        return value is None
    if callable(criterion):
        return bool(criterion(value, **kwargs()))
    return bool(value == criterion)


def match_metadata(
        criteria: MetaFilter | None,
        actual: Mapping[str, str],
        kwargs: Callable[[], Mapping[str, Any]],
) -> bool:
    """Check the labels or annotations of an object against the criteria (all must match)."""
    if not criteria:
        return True
    return all(check_value(criterion, actual.get(key), kwargs) for key, criterion in criteria.items())


def match(handler: ResourceHandler, cause: ResourceCause) -> bool:
    """
    Whether the handler's filters match the object and its change, as the cause describes them.

    The resource and the reason are not checked here: the registries select by them beforehand.
    """
    return _match(handler, cause, with_changes=True)


def prematch(handler: ResourceHandler, cause: ResourceCause) -> bool:
    """
    Whether the handler's filters match the object's current state, regardless of its changes.

    The update & field handlers only need their metadata and ``when=`` criteria to match,
    i.e. the object is "in scope" even if the field is not changed now. This decides which objects
    the framework keeps its state on; the rest are processed silently (the "stealth mode").
    """
    return _match(handler, cause, with_changes=False)


def prematches_all(handler: ResourceHandler) -> bool:
    """Whether :func:`prematch` is true for every object: the handler has no filters of the objects' state."""
    return not handler.labels and not handler.annotations and not handler.field and handler.when is None


def matches_all(handler: ResourceHandler) -> bool:
    """Whether :func:`match` is true for every object and change: the handler has no filters at all."""
    return prematches_all(handler) and (not isinstance(handler, ChangingHandler) or (
        not handler.field_needs_change and handler.old is None and handler.new is None))


def _match(handler: ResourceHandler, cause: ResourceCause, *, with_changes: bool) -> bool:
    # Most handlers have no filters at all (matched a few times per event): nothing to prepare then.
    # (The same as prematches_all() and matches_all(), inlined.)
    if not handler.labels and not handler.annotations and not handler.field and handler.when is None:
        if not with_changes or not isinstance(handler, ChangingHandler):
            return True
        if not handler.field_needs_change and handler.old is None and handler.new is None:
            return True

    kwargs = _LazyKwargs(cause, handler)
    # The views of the metadata are made only if needed: most handlers have no metadata filters.
    if handler.labels and not match_metadata(handler.labels, cause.body.metadata.labels, kwargs):
        return False
    if handler.annotations and not match_metadata(handler.annotations, cause.body.metadata.annotations,
                                                  kwargs):
        return False

    if isinstance(handler, ChangingHandler) and handler.field_needs_change:
        if with_changes and not _match_field_change(handler, cause, kwargs):
            return False
    else:
        if not _match_field_value(handler, cause, kwargs):
            return False
        changing = isinstance(handler, ChangingHandler)
        if with_changes and changing and not _match_old_new(cast(ChangingHandler, handler), cause, kwargs):
            return False

    return handler.when is None or bool(handler.when(**kwargs()))


def _match_field_value(handler: ResourceHandler, cause: ResourceCause, kwargs: _LazyKwargs) -> bool:
    if not handler.field:
        return True
    criterion = handler.value if handler.value is not None else MetaFilterToken.PRESENT
    return check_value(criterion, dicts.resolve(cause.body, handler.field, None), kwargs)


def _match_old_new(handler: ChangingHandler, cause: ResourceCause, kwargs: _LazyKwargs) -> bool:
    # E.g. for the sub-handlers: no change is required, but the old/new criteria are still applied.
    if handler.old is None and handler.new is None:
        return True
    if not isinstance(cause, ResourceChangingCause):
        return False
    change = narrow_to_field(cause, handler.field or ())
    return _match_old_and_new(handler, change, kwargs)


def _match_field_change(handler: ChangingHandler, cause: ResourceCause, kwargs: _LazyKwargs) -> bool:
    if not isinstance(cause, ResourceChangingCause):
        return False
    change = narrow_to_field(cause, handler.field or ())
    if not change.diff:
        return False
    if handler.value is not None:
        old_matches = check_value(handler.value, change.old, kwargs)
        if not old_matches and not check_value(handler.value, change.new, kwargs):
            return False
    return _match_old_and_new(handler, change, kwargs)


def _match_old_and_new(handler: ChangingHandler, change: FieldChange, kwargs: _LazyKwargs) -> bool:
    old_matches = handler.old is None or check_value(handler.old, change.old, kwargs)
    return old_matches and (handler.new is None or check_value(handler.new, change.new, kwargs))
