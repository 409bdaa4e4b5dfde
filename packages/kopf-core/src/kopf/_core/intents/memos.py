"""
In-memory containers for arbitrary values of operator developers: the ``memo`` kwarg.

There is one memo for the whole operator (given to the activity handlers) and one memo
per individual object (given to all handlers of that object). An object's memo starts
as a shallow copy of the operator's memo at the object's first appearance: the keys set later
on either side are not shared, but the mutable values (lists, dicts, nested memos) are.

Embedded operators may use any class for the memo, as long as ``copy.copy()`` works on it;
a class whose ``__copy__`` returns ``self`` makes one memo shared by all objects.
"""
import copy
from typing import Any


class Memo(dict[Any, Any]):
    """
    A dict whose keys are also accessible as attributes: ``memo.x`` is ``memo['x']``.

    The dict's own attributes and methods (``memo.keys``, ``memo.get``, ...) take precedence:
    such keys are accessible only as dict keys.
    """

    def __repr__(self) -> str:
        return f'{type(self).__name__}({dict.__repr__(self)})'

    def __copy__(self) -> 'Memo':
        return type(self)(self)

    def __getattr__(self, name: str) -> Any:
        # Only called when the regular lookup fails, i.e. for the keys, never for the dict's methods.
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f'{type(self).__name__!r} object has no attribute or key {name!r}') from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(f'{type(self).__name__!r} object has no attribute or key {name!r}') from None


def make_object_memo(operator_memo: object | None) -> Any:
    """
    Make the memo of a newly seen object from the operator's memo: a shallow copy of it.

    With no operator's memo, the object gets a new empty :class:`Memo`.
    """
    if operator_memo is None:
        return Memo()
    return copy.copy(operator_memo)
