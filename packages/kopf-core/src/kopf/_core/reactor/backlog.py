"""
Back-pressure and deferral of one watch-stream's objects: how many wait for their processing, and what then.

The processing of an object takes a seat of the operator's pacer (see :mod:`.pacing`). When as many
objects wait for the seats as there are seats, the new objects' workers are not started but deferred (in
their order): e.g. an initial listing of 10,000 objects would otherwise start 10,000 workers at once,
each suspended deep in the processing until a seat is free (a stack of coroutines each, for nothing); a
deferred object costs only its latest event, which is kept anyway. They are started by batches as the
waiters get seated. When twice as many objects wait (for seats, or for their workers' start), the watch-
stream is held back (not read) until only half as many wait: its events wait in the sockets' buffers as
bytes, not in memory as bodies. Nothing is lost: the events are only read a bit later. When the buffers are
full for a while (a burst of thousands of events), kube-apiserver ends the stream (its watcher's channels
are full: "Forcing ... watcher close due to unresponsiveness"), and it is re-established from the last version
seen, as after any end: the server replays the rest from its watch cache (see benchmarks/README.md, "#39, an
eleventh round", for how often, and what reading on instead would cost).

Held back, the echoes of our own patches come late: :meth:`Backlog.was_held_back_since` tells it to the
processing (with every delivery) and to the idling workers.
"""
import asyncio
import collections
from collections.abc import Callable, Hashable

from kopf._core.reactor import pacing

__all__ = ['Backlog']


class Backlog:
    """
    The objects of one watch-stream that wait for their processing, and the holding back of the stream.

    ``start(key)`` starts a deferred object's worker; it returns False if the object needs none anymore.
    Without a pacer, nothing is deferred or held back (e.g. for the indexed resources: every listed object
    must be indexed before any is processed, so the indexing of none can be held back).
    """

    def __init__(
            self,
            *,
            pacer: pacing.Pacer | None,
            start: Callable[[Hashable], bool],
            name: str = '',
            limit: int | None = None,
    ) -> None:
        super().__init__()
        self._pacer = pacer
        self._start = start
        self._name = name
        # How many objects may wait for the pacer's seats before the new objects' workers are deferred
        # (as many as are seated); twice as many waiting or deferred hold the watch-stream back.
        self._limit = (limit if limit is not None else
                       pacer.seats if pacer is not None else pacing.DEFAULT_SEATS)
        self._deferred: collections.deque[Hashable] = collections.deque()  # no worker yet: in this order
        self._starter: asyncio.Task[None] | None = None  # starts the deferred workers when there is room
        self._unstarted = 0  # the workers created but not running yet (so not waiting for seats yet)
        self._room: asyncio.Future[None] | None = None  # the watch-stream's reader waits for room here
        self._held_back_at: float | None = None  # since when the watch-stream is held back, if it is now
        self._released_at = float('-inf')  # when it was held back last time, until then
        self._closed = False

    def worker_created(self) -> None:
        """A worker is created (it will wait for a seat once it runs)."""
        self._unstarted += 1

    def worker_running(self) -> None:
        """A created worker runs now (so it is counted by the pacer's waiters, if it waits)."""
        self._unstarted -= 1

    @property
    def crowded(self) -> bool:
        """
        Whether a new object's worker should wait for its start: too many objects wait for the pacer's seats.

        (Also while any are deferred already: the deferred ones go first, in their order.)
        """
        pacer = self._pacer
        return pacer is not None and (bool(self._deferred) or pacer.waiting + self._unstarted >= self._limit)

    def defer(self, key: Hashable) -> None:
        """Start the object's worker later, when there is room (see :attr:`crowded`)."""
        self._deferred.append(key)
        if self._starter is None:
            self._starter = asyncio.create_task(self._start_deferred(), name=f'starter of {self._name}')

    async def _start_deferred(self) -> None:
        """Start the deferred workers in their order, by batches, as the waiters for seats get seated."""
        assert self._pacer is not None
        try:
            while self._deferred:
                await self._pacer.wait_for_room(self._limit)
                self._start_some(self._limit - self._pacer.waiting - self._unstarted)
                await asyncio.sleep(0)  # let the started workers run up to the pacer
        finally:
            self._starter = None

    def _start_some(self, count: int) -> None:
        while count > 0 and self._deferred:
            if self._start(self._deferred.popleft()):
                count -= 1
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)  # the reader looks again whether there is room for more events now

    @property
    def backlog(self) -> int:
        """How many objects wait for their processing: for the pacer's seats, or for their workers' start."""
        return (self._pacer.waiting if self._pacer is not None else 0) + len(self._deferred)

    @property
    def backlogged(self) -> bool:
        """Whether so many objects wait for processing that the watch-stream should not be read for now."""
        pacer = self._pacer  # asked after every watch-event: no more calls than needed
        return pacer is not None and pacer.waiting + len(self._deferred) >= 2 * self._limit

    async def wait_for_room(self) -> None:
        """Wait until the backlog is below its limit again (at once if not backlogged, or if closed)."""
        pacer = self._pacer
        if pacer is None or not self.backlogged or self._closed:
            return  # not held back at all (and not remembered as such)
        loop = asyncio.get_running_loop()
        self._held_back_at = loop.time()
        try:
            while self.backlogged and not self._closed:
                if self._deferred:  # the deferred ones are started by batches as the seats are taken
                    room = self._room = loop.create_future()
                    try:
                        await room
                    finally:
                        self._room = None
                else:  # so, at least that many wait for seats: this waits for sure (no busy loop)
                    await pacer.wait_for_room(2 * self._limit)
        finally:
            self._held_back_at = None
            self._released_at = loop.time()

    def was_held_back_since(self, moment: float) -> bool:
        """Whether the watch-stream has been held back at any time since the moment (in the loop's time)."""
        return self._held_back_at is not None or self._released_at >= moment

    def close(self) -> None:
        """Hold nothing back anymore: release the reader, start all the deferred workers at once."""
        self._closed = True
        if self._room is not None and not self._room.done():
            self._room.set_result(None)
        if self._starter is not None:
            self._starter.cancel()
        self._start_some(len(self._deferred))  # as if never deferred: they process what they have
