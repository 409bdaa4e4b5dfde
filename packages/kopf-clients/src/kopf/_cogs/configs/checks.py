"""
The settings' sections whose fields are checked when set: a bad value fails where it is set, in one line.

Here, at the bottom of the stack, for the client's own sections (``settings.networking``); kopf-core's
sections use the same base with their own checks.
"""
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

__all__ = ['CheckedFields', 'check_positive_integer']


def check_positive_integer(path: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{path} must be a positive integer, got {value!r}.')


class CheckedFields:
    """
    A section whose fields in ``_checks`` are checked whenever they are set (on creation too).

    A bad value fails right where it is set (e.g. in a startup handler) with a one-line error,
    not later, when the operator uses it.
    """

    _section: ClassVar[str]
    _checks: ClassVar[Mapping[str, Callable[[str, Any], None]]]

    def __setattr__(self, name: str, value: Any) -> None:
        check = self._checks.get(name)
        if check is not None:
            check(f'settings.{self._section}.{name}', value)
        super().__setattr__(name, value)
