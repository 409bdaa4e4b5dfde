"""
Pacing of the processing: how many objects are in the framework's own hands at once.

A burst of events (e.g. the initial listing of thousands of objects, all of them due for handling)
would otherwise start the processing of all the objects at once: every object would get as far as
its first API request and wait there, with its body, patch, cause, loggers and a deep stack of
coroutines alive, until all the others are there too --- so the memory peaks with the burst's size,
and the first objects are finished only when the last ones are.

So the processing of an object takes a seat (one of :data:`DEFAULT_SEATS`, shared by all the
resources of the operator) for its own steps: parsing, detecting the causes, storing the progress,
and the API requests. The handlers and the sleeps are not the framework's steps: while they run,
the seat can be lent to another object (see :meth:`Seat.lending`): at once for the sleeps,
and only after a short while for the handlers, so that the quick handlers (most of them) keep
the seat and the object is finished without more waiting. Those who return from a handler or
a sleep take the next free seat before any new object, so that the started objects are finished
first and the new ones are started only when there is a free seat.

This is not a limit on how many objects can be handled in parallel (that is ``settings.queueing.
worker_limit``, unlimited by default): the slow handlers of all objects run concurrently anyway.
It only paces the framework's own work, which is CPU- and API-bound, and gains nothing from
more concurrency than the CPU and the API server can serve.

The number of seats is a trade-off. Every object in the framework's hands costs ~15 KB at the peak,
and the more objects are in hands at once, the colder their data is in the CPU's caches when their
turn comes again (after a request, after a sync handler's call in a thread): the same work costs more
CPU. Too few seats cost CPU too: the sync handlers' calls go to the threads in smaller batches
(more switches of the GIL), and the requests' latency is not covered (every seated object waits for
its requests, of which at most ``MAX_CONCURRENT_REQUESTS``, 100, are in flight per credential).
On a 2-core machine with 5,000 objects (benchmarks/core_handling.py, interleaved runs, medians of 4),
100 seats handled ~19% more created and ~8% more deleted objects per second than 400 seats, with
~1.5x the context switches; 64 seats were about as good as 100, 200 seats as 400. (The timers of
objects first processed through fewer seats start, and so tick, in a smoother spread: their sync calls
share fewer hand-overs to the threads, ~10% more CPU per tick in benchmarks/engines.py.)
"""
import asyncio
import collections
import contextlib

from kopf._cogs.helpers import alarms

__all__ = ['DEFAULT_SEATS', 'LENDING_DELAY', 'Pacer', 'Seat']

# How many objects are processed by the framework at once (the handlers and sleeps excluded).
# The pacer reads it when created, so it can be tuned before the operator starts.
DEFAULT_SEATS = 100

# How long a running handler keeps its object's seat before lending it to another object, in seconds.
LENDING_DELAY = 0.05


class Pacer:
    """
    A semaphore with two queues: the returning holders (urgent) go before the new ones.

    The seats are handed over directly from the releaser to the next waiter in the queues,
    so that nobody can sneak in between; the cancelled waiters are removed from the queues.
    """

    def __init__(self, seats: int | None = None) -> None:
        super().__init__()
        seats = DEFAULT_SEATS if seats is None else seats
        if seats < 1:
            raise ValueError(f'The pacer needs at least one seat, got {seats!r}.')
        self._seats = seats
        self._free = seats
        self._urgent: collections.deque[asyncio.Future[None]] = collections.deque()
        self._normal: collections.deque[asyncio.Future[None]] = collections.deque()
        self._room_waiters: list[tuple[int, asyncio.Future[None]]] = []
        # The seats lent after a delay: one timer of the loop for all the handlers' calls, not one each.
        self._lendings: alarms.Alarms[_Lending] = alarms.Alarms(_Lending.lend_out)

    @property
    def seats(self) -> int:
        """How many objects can be in the framework's hands at once (taken and free seats together)."""
        return self._seats

    @property
    def free(self) -> int:
        return self._free

    @property
    def waiting(self) -> int:
        return len(self._urgent) + len(self._normal)

    async def acquire(self, *, urgent: bool = False) -> None:
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
                self.release()  # the seat was handed over to us, but we are leaving: hand it over further.
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
            raise

    def release(self) -> None:
        if self._room_waiters:
            self._notify_room()
        for queue in (self._urgent, self._normal):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self._free += 1

    async def wait_for_room(self, backlog: int) -> None:
        """
        Wait until there is room for more newcomers: at once if fewer than ``backlog`` wait for seats,
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

    def seat(self) -> 'Seat':
        return Seat(self)


class Seat:
    """One processing's place in the pacer: taken at the start, released at the end, lent in between."""

    __slots__ = ('_pacer', '_taken')

    def __init__(self, pacer: Pacer) -> None:
        super().__init__()
        self._pacer = pacer
        self._taken = False

    async def __aenter__(self) -> 'Seat':
        await self._pacer.acquire()
        self._taken = True
        return self

    async def __aexit__(self, *_: object) -> None:
        self.leave()

    def leave(self) -> None:
        """Release the seat if it is taken (not lent out now); nothing if not. The same as exiting it."""
        if self._taken:
            self._taken = False
            self._pacer.release()

    def lending(self, delay: float = 0) -> '_Lending':
        """
        Lend the seat to others after the delay (at once if 0) while in the context; take it back after.

        Taking it back goes before the new objects, but after those who are already returning.
        """
        return _Lending(self, delay)


class _Lending:
    """The context of :meth:`Seat.lending`: a class, not a generator, since it wraps every handler's call."""

    __slots__ = ('_delay', '_lent', '_seat', '_timer')

    def __init__(self, seat: Seat, delay: float) -> None:
        self._seat = seat
        self._delay = delay
        self._lent = False
        self._timer: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> None:
        seat = self._seat
        if not seat._taken:  # e.g. nested lending: the outer one has it already.
            return
        self._lent = True
        if self._delay > 0:
            loop = asyncio.get_running_loop()
            if not seat._pacer._lendings.add(self, loop.time() + self._delay):
                self._timer = loop.call_later(self._delay, seat.leave)  # another delay: out of the order
        else:
            seat.leave()

    def lend_out(self) -> None:
        self._seat.leave()

    async def __aexit__(self, *_: object) -> None:
        if self._lent:
            if self._timer is not None:
                self._timer.cancel()
            elif self._delay > 0:
                self._seat._pacer._lendings.discard(self)
            # Taken back if lent out; usually it is still taken (the quick handlers do not lend it out).
            seat = self._seat
            if not seat._taken:
                await seat._pacer.acquire(urgent=True)
                seat._taken = True
