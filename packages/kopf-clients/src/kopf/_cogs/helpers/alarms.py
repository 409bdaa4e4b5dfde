"""
Many short-lived timers with a common delay, by one timer of the event loop.

The framework waits for the same delays again and again, for every object and event: the batching
windows after a processing (for the echoes of its own patches), the handlers' seats lent to other objects
after a while. A timer of the loop per wait costs a ``TimerHandle``, a push into the loop's heap
(with Python-level comparisons of the handles, ~log2(n) of them), and a cancelling (most of these waits
end earlier than their timers); with thousands of objects, this was a visible part of the CPU per object.

With a common delay from now, the deadlines come in growing order, so the earliest one is always the oldest
entry: an ordered dict keeps them sorted for free, and one timer of the loop, for the earliest deadline,
serves all of them. A deadline earlier than the latest one (e.g. the delay was reduced meanwhile) is refused,
and the caller falls back to a timer of its own: the order, and so the promptness of all, are preserved.
"""
import asyncio
import collections
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ['Alarms']

_K = TypeVar('_K', bound=Hashable)

# The deadlines this close to the loop's time are due now (the loop's clock is not infinitely precise,
# and the loop runs its timers a bit early, within its clock's resolution).
_CLOCK_SLACK = 0.001


class Alarms(Generic[_K]):
    """Callbacks at deadlines (in the loop's time), by key; each is called once, unless discarded before."""

    __slots__ = ('_due', '_latest', '_timer')

    def __init__(self) -> None:
        super().__init__()
        # Not a plain dict: with the entries removed from its head all the time, getting its first item
        # would skip more and more of their emptied slots (until it is resized); an ordered dict's is O(1).
        self._due: collections.OrderedDict[_K, tuple[float, Callable[[], object]]] = collections.OrderedDict()
        self._latest = float('-inf')
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._due)

    def add(self, key: _K, deadline: float, callback: Callable[[], object]) -> bool:
        """
        Call back at the deadline (in the loop's time); False if it is earlier than the latest one added.

        A key must not be added again while it is due (discard it first): it would keep its old place.
        """
        if deadline < self._latest and self._due:
            return False
        self._due[key] = (deadline, callback)
        self._latest = deadline
        timer = self._timer
        if timer is None or timer.when() > deadline:  # none, or still armed for a later, discarded one
            if timer is not None:
                timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(deadline, self._fire)
        return True

    def discard(self, key: _K) -> None:
        # The timer stays armed for a discarded head: it fires once for nothing, and re-arms for the next one.
        self._due.pop(key, None)

    def cancel(self) -> None:
        """Forget all: none of the callbacks will be called."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due.clear()

    def _fire(self) -> None:
        self._timer = None
        due = self._due
        loop = asyncio.get_running_loop()
        now = loop.time() + _CLOCK_SLACK
        while due:
            key, (deadline, callback) = next(iter(due.items()))
            if deadline > now:
                self._timer = loop.call_at(deadline, self._fire)
                break
            del due[key]
            try:
                callback()
            except Exception as e:  # reported as the loop does for its own callbacks; the others still go
                loop.call_exception_handler({'message': f'An alarm\'s callback has failed: {callback!r}',
                                             'exception': e})
