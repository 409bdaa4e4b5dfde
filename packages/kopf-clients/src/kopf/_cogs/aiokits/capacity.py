"""
A bounded capacity for the framework's own work, whose units are lent to others while their holders wait.

The framework bounds how much of its own work is in progress at once: e.g. the objects in the processing's
own steps (parsing, deciding, storing, the API requests), or the timers' calls in its hands. The operator's
functions (the handlers) and the sleeps are not the framework's own steps: while a holder is in them,
it lends its unit to others --- at once (e.g. for the sleeps), or after a delay (for the functions: the quick
ones, most of them, keep the unit and are finished without waiting in line again). Back from them, the holder
takes its unit back: it waits for it ahead of the newcomers (:meth:`Hold.lending`, a context manager), or,
if it cannot wait (e.g. in a sync callback), takes it at once, even beyond the limit (:meth:`Hold.take_back`).
A holder that waits for something other than its own steps (e.g. a request for a slot of the API client) can
also cede its unit to a returning holder that waits for one (:meth:`Hold.ceding`): so the holders in hand are
no more than without it, and the returning ones are not held back by the waiting ones; and, if that wait is
long, lend it to a newcomer, but only within the capacity's ``reserve``: a second, larger bound for the
holders in hand while they wait for others (e.g. a busy API server), not for the framework's own steps.

There are two ways to wait for a unit:

* a task awaits :meth:`Capacity.acquire`: the released units are handed over to the waiters directly,
  the urgent ones (those who return) first, so that nobody can sneak in between;
* an item is queued (:meth:`Capacity.take_or_queue`) for the holders that are not tasks yet (e.g. a timer's
  call, whose task is made only once it has a unit): the free units are granted to the items in a batch at
  the loop's next turn after a release, in the order of queueing, after the returning holders have taken
  theirs back, by one callback for all (``on_granted``: no callable per item); it may decline the unit (e.g.
  the call is not needed anymore): then, the unit goes to the next item.

The delayed lendings of one capacity share one timer of the loop (:class:`.alarms.Alarms`), not one each.
"""
import asyncio
import collections
import contextlib
import operator
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from kopf._cogs.aiokits.alarms import Alarms

__all__ = ['DEFAULT_LENDING_DELAY', 'OWN_LENDING_DELAY', 'Capacity', 'Ceding', 'Hold', 'Lending']

_T = TypeVar('_T')

# How long a holder in a function keeps its unit before lending it to others, in seconds (unless configured).
DEFAULT_LENDING_DELAY = 0.05


class _OwnLendingDelay(float):
    """A delay that stands for the capacity's own lending delay, as configured (its value is the default)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return 'OWN_LENDING_DELAY'


# For the callers that give a delay but do not know the capacity's (e.g. a constant of their module).
OWN_LENDING_DELAY: float = _OwnLendingDelay(DEFAULT_LENDING_DELAY)


class Capacity(Generic[_T]):
    """
    A number of units, taken by the holders and handed over to the waiters (see the module's description).

    The waiters are served in order: the urgent ones (the returning holders), then the other awaiting tasks,
    then the queued items (of the type ``_T``, granted to ``on_granted``). The cancelled waiters are removed
    from the queues.
    """

    def __init__(
            self,
            limit: int,
            *,
            lending_delay: float = DEFAULT_LENDING_DELAY,
            lending_in_flight: bool = True,
            reserve: int = 0,
            on_granted: Callable[[_T], bool] | None = None,
    ) -> None:
        super().__init__()
        if limit < 1:
            raise ValueError(f'A capacity needs at least one unit, got {limit!r}.')
        if not lending_delay >= 0:  # NaN too
            raise ValueError(f'A lending delay must be 0 seconds or more, got {lending_delay!r}.')
        if reserve < 0:
            raise ValueError(f'A reserve must be 0 units or more, got {reserve!r}.')
        self._limit = limit
        self._free = limit  # negative while the units taken back at once are beyond the limit
        self._lending_delay = lending_delay
        self._lending_in_flight = lending_in_flight
        self._reserve = reserve  # how many units may be lent to anyone by the ceding holders at most
        self._reserved = 0  # how many are lent so now
        self._urgent: collections.deque[asyncio.Future[None]] = collections.deque()
        self._normal: collections.deque[asyncio.Future[None]] = collections.deque()
        self._queued: collections.deque[_T] = collections.deque()
        self._on_granted = on_granted
        self._granting: asyncio.Handle | None = None
        self._room_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._closed = False
        # The units lent after a delay: one timer of the loop for all the holders, not one each.
        self._lendings: Alarms[Hold | Lending | Ceding] = Alarms(operator.methodcaller('_lend_out'))

    def __repr__(self) -> str:
        return f'<{type(self).__name__} {self._limit - self._free}/{self._limit} waiting={self.waiting}>'

    @property
    def limit(self) -> int:
        """How many units there are (the taken and the free ones together)."""
        return self._limit

    @property
    def lending_delay(self) -> float:
        """How long a holder in a function keeps its unit before lending it (:data:`OWN_LENDING_DELAY`)."""
        return self._lending_delay

    @property
    def lending_in_flight(self) -> bool:
        """
        Whether a holder's request in flight lends its unit after the lending delay (a backoff always does).

        True where the units bound the framework's own CPU steps (the processing's seats); False where they
        bound the calls waiting for the API (the timers' hands): lent in flight, they would bound nothing.
        """
        return self._lending_in_flight

    @property
    def free(self) -> int:
        return self._free

    @property
    def reserve(self) -> int:
        """How many units may be lent to anyone by the ceding holders at most (see :meth:`Hold.ceding`)."""
        return self._reserve

    @property
    def reserved(self) -> int:
        """How many units are lent so now: the holders let in beyond the limit while the ceding ones wait."""
        return self._reserved

    @property
    def waiting(self) -> int:
        """How many wait for units: the awaiting tasks and the queued items."""
        return len(self._urgent) + len(self._normal) + len(self._queued)

    def hold(self) -> 'Hold':
        """A new holder's place: no unit yet (see :class:`Hold`)."""
        return Hold(self)

    async def acquire(self, *, urgent: bool = False) -> None:
        """Take a unit: at once if free and nobody waits before us, else when it is handed over to us."""
        if self._free > 0 and not self._urgent and (urgent or not self._normal):
            self._free -= 1
            return
        queue = self._urgent if urgent else self._normal
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the unit was handed over to us, but we are leaving: hand it over further.
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
            raise

    def try_acquire(self) -> bool:
        """Take a unit if one is free and nobody waits for it; whether it is taken (no waiting)."""
        if self._free > 0 and not self._urgent and not self._normal and not self._queued:
            self._free -= 1
            return True
        return False

    def take_or_queue(self, item: _T) -> bool:
        """
        Take a unit for the item at once (True) as :meth:`try_acquire` does, or queue the item (False).

        A queued item waits with no task: ``on_granted(item)`` is called when a unit is given to it, in turn.
        It returns whether it takes the unit: if not (e.g. it is not needed anymore), the unit goes further.
        """
        if self._free > 0 and not self._urgent and not self._normal and not self._queued:
            self._free -= 1
            return True
        if self._on_granted is None:
            raise TypeError(f'{self!r} cannot queue: it was made with no on_granted callback.')
        self._queued.append(item)
        if self._free > 0 and self._granting is None and not self._closed:  # e.g. only the items wait
            self._granting = asyncio.get_running_loop().call_soon(self._grant)
        return False

    def release(self) -> None:
        """Give a unit back: to the next waiting task directly, or to the queued items soon, or free it."""
        if self._room_waiters:
            self._notify_room()
        if self._urgent or self._normal:  # usually not: no loop over the queues then
            for queue in (self._urgent, self._normal):
                while queue:
                    waiter = queue.popleft()
                    if not waiter.done():
                        waiter.set_result(None)
                        return
        self._free += 1
        if self._queued and self._granting is None and not self._closed:
            # Not right now: e.g. a holder that has lent its unit out will take it back in a moment.
            self._granting = asyncio.get_running_loop().call_soon(self._grant)

    def _cede(self) -> bool:
        """Hand a unit over to the next returning holder that waits for one, if any (never to a newcomer)."""
        urgent = self._urgent
        while urgent:
            waiter = urgent.popleft()
            if not waiter.done():
                waiter.set_result(None)
                if self._room_waiters:
                    self._notify_room()
                return True
        return False

    def _lend_later(self, lender: 'Hold | Lending | Ceding', delay: float) -> asyncio.TimerHandle | None:
        """
        Call the lender's ``_lend_out()`` after the delay: by the shared alarms, or by a timer of its own.

        The timer (returned, to be cancelled) is only for a delay out of the alarms' order (e.g. changed
        meanwhile); otherwise, the lender is discarded from :attr:`_lendings` to cancel it.
        """
        loop = asyncio.get_running_loop()
        if self._lendings.add(lender, loop.time() + delay):
            return None
        return loop.call_later(delay, lender._lend_out)

    def close(self) -> None:
        """No more grants and lendings: the queued items are forgotten, the delayed lendings are not done."""
        self._closed = True
        self._queued.clear()
        if self._granting is not None:
            self._granting.cancel()
            self._granting = None
        self._lendings.cancel()

    def _grant(self) -> None:
        self._granting = None
        queued, on_granted = self._queued, self._on_granted
        assert on_granted is not None  # nothing is queued otherwise
        while queued and self._free > 0 and not self._closed:
            item = queued.popleft()
            self._free -= 1
            if not on_granted(item):
                self._free += 1  # declined: for the next one

    async def wait_for_room(self, backlog: int) -> None:
        """
        Wait until there is room for more newcomers: at once if fewer than ``backlog`` wait for units,
        else until only half of it waits (so that the newcomers are let in by batches, not one by one).
        """
        if self.waiting < backlog:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._room_waiters.append((backlog // 2, waiter))
        try:
            await waiter
        finally:
            if not waiter.done():
                self._room_waiters = [item for item in self._room_waiters if item[1] is not waiter]

    def _notify_room(self) -> None:
        waiting = self.waiting - 1  # as it will be after this release (if someone waits at all)
        remaining = []
        for low_water, waiter in self._room_waiters:
            if waiter.done():
                continue
            if waiting <= low_water:
                waiter.set_result(None)
            else:
                remaining.append((low_water, waiter))
        self._room_waiters = remaining


class Hold:
    """
    One holder's unit of a capacity: taken at the start, left at the end, lent to others in between.

    ``taken``: the unit is taken already (e.g. by :meth:`Capacity.try_acquire` or a grant).
    As an async context manager: the unit is taken (waiting for it) on entering, and left on exiting.

    The unit is lent either in a context (:meth:`lending`: the holder waits to take it back, several
    lendings can be nested), or from sync code (:meth:`lend_later`, then :meth:`take_back`: one at a time,
    taken back at once, with no object made for the lending).
    """

    __slots__ = ('_capacity', '_lent', '_taken')

    def __init__(self, capacity: 'Capacity[Any]', taken: bool = False) -> None:
        # No super().__init__(): made for every object's processing and every timer's call.
        self._capacity = capacity
        self._taken = taken
        self._lent: bool | asyncio.TimerHandle = False  # by lend_later(): in the alarms, or a timer

    def __repr__(self) -> str:
        return f'<{type(self).__name__} taken={self._taken}>'

    @property
    def capacity(self) -> 'Capacity[Any]':
        return self._capacity

    @property
    def taken(self) -> bool:
        """Whether the unit is taken now (not lent out or left)."""
        return self._taken

    async def __aenter__(self) -> 'Hold':
        await self._capacity.acquire()
        self._taken = True
        return self

    async def __aexit__(self, *_: object) -> None:
        self.leave()

    def leave(self) -> None:
        """Release the unit if it is taken (not lent out now); nothing if not. The same as exiting."""
        if self._taken:
            self._taken = False
            self._capacity.release()

    def lending(self, delay: float = 0) -> 'Lending':
        """
        Lend the unit to others after the delay (at once if 0) while in the context; take it back after.

        :data:`OWN_LENDING_DELAY` means the capacity's own delay. Taking the unit back goes before the new
        holders, but after those who are already returning.
        """
        return Lending(self, delay)

    def ceding(self) -> 'Ceding':
        """
        Cede the unit to a returning holder that waits for one now (if any) while in the context.

        Unlike :meth:`lending`, no newcomer gets the unit: only a holder already in hand, which would
        otherwise wait for this one to finish its wait (e.g. for a request slot). It is taken back on
        exiting, as by :meth:`lending`. If nobody returning waits, the unit is lent to anyone after the
        capacity's lending delay if its ``reserve`` allows then (none by default): so there are up to that
        many more holders in hand to wait for it too (e.g. for a busy API server), not more.
        """
        return Ceding(self)

    def lend_later(self) -> None:
        """Lend the unit after the capacity's lending delay (at once if 0), until :meth:`take_back`."""
        capacity = self._capacity
        if not self._taken or self._lent is not False or capacity._closed:
            return
        delay = capacity._lending_delay
        if delay > 0:
            timer = capacity._lend_later(self, delay)
            self._lent = True if timer is None else timer
        else:
            self.leave()

    def take_back(self) -> None:
        """
        Lend no more (after :meth:`lend_later`); if lent out, take the unit back at once, beyond the limit.

        For those who cannot wait for it (e.g. sync callbacks): the unit is over the limit until it is left.
        """
        lent = self._lent
        if lent is True:
            self._capacity._lendings.discard(self)
        elif lent is not False:
            lent.cancel()
        self._lent = False
        if not self._taken:
            self._capacity._free -= 1
            self._taken = True

    def _lend_out(self) -> None:
        self._lent = False
        self.leave()


class Lending:
    """
    One lending of a hold's unit in a context (:meth:`Hold.lending`): the holder waits to take it back.

    A class, not a generator: it wraps every handler's call.
    """

    __slots__ = ('_delay', '_hold', '_lent', '_timer')

    def __init__(self, hold: Hold, delay: float) -> None:
        self._hold = hold
        self._delay = hold._capacity._lending_delay if delay.__class__ is _OwnLendingDelay else delay
        self._lent = False
        self._timer: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> None:
        hold = self._hold
        if not hold._taken:  # e.g. nested lending: the outer one has lent it already.
            return
        delay = self._delay
        if delay > 0:
            capacity = hold._capacity
            if capacity._closed:
                return
            self._lent = True
            self._timer = capacity._lend_later(self, delay)
        else:
            self._lent = True
            hold.leave()

    async def __aexit__(self, *_: object) -> None:
        if not self._lent:
            return
        self._lent = False
        hold = self._hold
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        elif self._delay > 0:
            hold._capacity._lendings.discard(self)
        # Taken back if lent out; usually it is still taken (the quick functions do not lend it out).
        if not hold._taken:
            await hold._capacity.acquire(urgent=True)
            hold._taken = True

    def _lend_out(self) -> None:
        self._hold.leave()


class Ceding:
    """
    One ceding of a hold's unit in a context (:meth:`Hold.ceding`): the holder waits to take it back.

    If nobody returning waits, the unit is lent to anyone after the capacity's lending delay, if its reserve
    allows then.
    """

    __slots__ = ('_ceded', '_hold', '_pending', '_reserved', '_timer')

    def __init__(self, hold: Hold) -> None:
        self._hold = hold
        self._ceded = False
        self._reserved = False
        self._pending = False  # in the capacity's alarms, or a timer of its own, for the reserve's lending
        self._timer: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> None:
        hold = self._hold
        if not hold._taken:
            return
        capacity = hold._capacity
        if capacity._cede():
            hold._taken = False
            self._ceded = True
        elif capacity._reserve > 0 and not capacity._closed:
            delay = capacity._lending_delay
            if delay > 0:
                self._pending = True
                self._timer = capacity._lend_later(self, delay)
            else:
                self._lend_out()

    async def __aexit__(self, *_: object) -> None:
        self.stop()
        if self._ceded:
            self._ceded = False
            hold = self._hold
            if self._reserved:
                self._reserved = False
                hold._capacity._reserved -= 1
            await hold._capacity.acquire(urgent=True)
            hold._taken = True

    def stop(self) -> None:
        """Lend no more from now on (not lent yet: the unit is kept; lent: it is taken back on exiting)."""
        if self._pending:
            self._pending = False
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            else:
                self._hold._capacity._lendings.discard(self)

    def _lend_out(self) -> None:
        self._pending = False
        self._timer = None
        hold = self._hold
        capacity = hold._capacity
        if hold._taken and capacity._reserved < capacity._reserve:
            capacity._reserved += 1
            self._ceded = self._reserved = True
            hold.leave()
