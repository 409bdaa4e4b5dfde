"""
Lifecycles: which of the pending handlers of an object run in the current handling cycle, and in which order.

A lifecycle is a plain function. It gets the handlers that are neither finished nor sleeping
(positionally, in the order of their declaration), the current per-handler states as ``state=``
(a :class:`kopf._core.actions.progression.State`), and the kwargs of the cause (``body``, ``spec``,
``patch``, ``reason``, etc.) --- it must accept ``**kwargs`` for forward compatibility.
It returns the handlers to execute now: some of the given ones, possibly reordered.
The handlers that are not returned stay pending and are offered again in the next cycle.

This module is the public ``kopf.lifecycles``.
"""
import logging
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from kopf._core.intents.handlers import BaseHandler

if TYPE_CHECKING:
    from kopf._core.actions.progression import State

__all__ = [
    'LifeCycleFn',
    'all_at_once',
    'asap',
    'get_default_lifecycle',
    'one_by_one',
    'randomized',
    'set_default_lifecycle',
    'shuffled',
]

logger = logging.getLogger(__name__)

# Loosely typed: the lifecycles declare different keyword arguments (some need ``state``, others do not).
LifeCycleFn = Callable[..., Sequence[BaseHandler]]

_HandlerT = TypeVar('_HandlerT', bound=BaseHandler)


def all_at_once(handlers: Sequence[_HandlerT], **_: Any) -> Sequence[_HandlerT]:
    """All the pending handlers in one cycle, in the order of their declaration."""
    return list(handlers)


def one_by_one(handlers: Sequence[_HandlerT], **_: Any) -> Sequence[_HandlerT]:
    """Only the first pending handler in the order of declaration; the rest wait for the next cycles."""
    return list(handlers[:1])


def randomized(handlers: Sequence[_HandlerT], **_: Any) -> Sequence[_HandlerT]:
    """One pending handler per cycle, picked at random."""
    return [random.choice(handlers)] if handlers else []


def shuffled(handlers: Sequence[_HandlerT], **_: Any) -> Sequence[_HandlerT]:
    """All the pending handlers in one cycle, in a random order."""
    return random.sample(list(handlers), len(handlers))


def asap(handlers: Sequence[_HandlerT], *, state: 'State', **_: Any) -> Sequence[_HandlerT]:
    """
    One handler per cycle: the one retried the least so far (the first declared of those equal).

    This way, a failing handler does not block the others: after it fails, the next cycle
    picks a handler that has not been tried yet, and the failed one waits for its turn
    (and its delay) until every other pending handler has had as many attempts.
    """
    if len(handlers) <= 1:  # the usual case: one handler per cause (no ranking, no closure)
        return list(handlers)

    def retries(handler: _HandlerT) -> int:
        handler_state = state.get(handler.id)
        return handler_state.retries if handler_state is not None else 0

    return [min(handlers, key=retries)]  # min() is stable: the first one wins among equals.


# None means "not set explicitly": then, the built-in default applies (see below).
_default_lifecycle: LifeCycleFn | None = None


# The built-in lifecycles look only at the handlers and their states: they are called without the cause's
# kwargs, which would be built (a dict of ~15 items) and bound to their ``**_`` for nothing on every call.
CAUSE_BLIND: frozenset[LifeCycleFn] = frozenset({all_at_once, one_by_one, randomized, shuffled, asap})


def get_default_lifecycle() -> LifeCycleFn:
    """The lifecycle used unless the operator or ``kopf.execute()`` is given one: ``asap`` by default."""
    return _default_lifecycle if _default_lifecycle is not None else asap


def set_default_lifecycle(lifecycle: LifeCycleFn | None) -> None:
    """Replace the default lifecycle for the whole process; ``None`` restores the built-in one (``asap``)."""
    global _default_lifecycle
    current = get_default_lifecycle()
    if lifecycle is not None and lifecycle is not current:
        # Replacing a process-wide default silently could hide a conflict between two modules.
        logger.warning(f"The default lifecycle is already set to {current}, overriding it to {lifecycle}.")
    _default_lifecycle = lifecycle
