"""
Many short-lived timers with a common delay, by one timer of the event loop.

The framework waits for the same delays again and again, for every object and event: the batching
windows after a processing (for the echoes of its own patches), the handlers' seats lent to other objects
after a while, the idle workers' expiry. A timer of the loop per wait costs a ``TimerHandle``, a push into
the loop's heap (with Python-level comparisons of the handles, ~log2(n) of them), and a cancelling (most of
these waits end earlier than their timers); with thousands of objects, a visible part of the CPU per object.

With a common delay from now, the deadlines come in growing order, so the earliest one is always the oldest
entry: an ordered dict keeps them sorted for free, and one timer of the loop, for the earliest deadline,
serves all of them. A deadline earlier than the latest one (e.g. the delay was reduced meanwhile) is refused,
and the caller falls back to a timer of its own: the order, and so the promptness of all, are preserved.
Used for the idle workers' expiry and the batching windows (the queueing) and the lent seats (the pacing).
"""
import asyncio
import collections
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ['CLOCK_SLACK', 'Alarms']

_K = TypeVar('_K', bound=Hashable)

# The deadlines this close to the loop's time are due now (the loop's clock is not infinitely precise,
# and the loop runs its timers a bit early, within its clock's resolution).
CLOCK_SLACK = 0.001


class Alarms(Generic[_K]):
    """
    The keys due at their deadlines (in the loop's time): each is given to ``on_due`` once, unless discarded.

    One callback for all the keys: an entry is only the key and its deadline, not a bound method and a tuple
    more for every wait (these are made for nearly every event, and kept for every idle object).
    """

    __slots__ = ('_due', '_latest', '_on_due', '_timer', '_timer_at')

    def __init__(self, on_due: Callable[[_K], object]) -> None:
        super().__init__()
        self._on_due = on_due
        # Not a plain dict: with the entries removed from its head all the time, getting its first item
        # would skip more and more of their emptied slots (until it is resized); an ordered dict's is O(1).
        self._due: collections.OrderedDict[_K, float] = collections.OrderedDict()
        self._latest = float('-inf')
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float('inf')  # the timer's deadline: the same as its when(), without a call

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def add(self, key: _K, deadline: float) -> bool:
        """
        Make the key due at the deadline (in the loop's time); False if it is earlier than the latest one.

        A key must not be added again while it is due (discard it first): it would keep its old place.
        """
        if deadline < self._latest and self._due:
            return False
        self._due[key] = self._latest = deadline
        timer = self._timer
        if timer is None or self._timer_at > deadline:  # none, or still armed for a later, discarded one
            if timer is not None:
                timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(deadline, self._fire)
            self._timer_at = deadline
        return True

    def discard(self, key: _K) -> None:
        # The timer stays armed for a discarded head: it fires once for nothing, and re-arms for the next one.
        self._due.pop(key, None)

    def cancel(self) -> None:
        """Forget all: none of the keys will be due."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due.clear()

    def _fire(self) -> None:
        self._timer = None
        due = self._due
        loop = asyncio.get_running_loop()
        now = loop.time() + CLOCK_SLACK
        while due:
            key, deadline = next(iter(due.items()))
            if deadline > now:
                self._timer = loop.call_at(deadline, self._fire)
                self._timer_at = deadline
                break
            del due[key]
            try:
                self._on_due(key)
            except Exception as e:  # reported as the loop does for its own callbacks; the others still go
                loop.call_exception_handler({'message': f'An alarm has failed for {key!r}', 'exception': e})
        if not due:
            # A dict keeps its size when emptied: its table stays as big as the largest burst ever seen.
            self._due = collections.OrderedDict()
