"""
Pacing of the processing: how many objects are in the framework's own hands at once.

A burst of events (e.g. the initial listing of thousands of objects, all of them due for handling)
would otherwise start the processing of all the objects at once: every object would get as far as
its first API request and wait there, with its body, patch, cause, loggers and a deep stack of
coroutines alive, until all the others are there too --- so the memory peaks with the burst's size,
and the first objects are finished only when the last ones are.

So the processing of an object takes a seat (one of ``settings.queueing.processing_seats``, shared by all
the resources of the operator) for its own steps: parsing, detecting the causes, storing the progress,
and sending the API requests. The handlers, the sleeps, and the waits for the API server are not the
framework's steps: while they last, the seat can be lent to another object (see :meth:`Seat.lending`): at
once for the sleeps and the retries' backoffs, and only after a short while for the handlers and the
requests in flight (``settings.execution.lending_delay``), so that the quick ones (most of them) keep the
seat and the object is finished without more waiting. A request lends the seat in flight only once it has
its request slot (see :func:`kopf._clients.api.request`), so the objects in the framework's hands are at
most the seats plus the client's request slots (and those in the handlers), plus the reserve below. While
it waits for a slot (all are taken: the API server is slower than the framework), it cedes the seat at
once to an object back from its request or handler, if one waits for a seat: the objects waiting for the
API server do not keep those that could go on; and if it waits longer than the lending delay, it lends the
seat to a new object, but only within the pacer's reserve (``settings.queueing.processing_reserve``,
:data:`RESERVE_PER_SEAT` new objects per seat by default): so on a busy API server, up to ten times as many
objects are prepared and wait for the slots, and the server gets the next request as soon as it takes one
(as if there were more seats), while on a fast one (the slots are free soon) the seats stay as few as
configured. Those who return from a handler, a sleep or a request take the next free seat before any new
object, so that the started objects are finished first and the new ones are started only when there is a
free seat. The seats are the units of a :class:`kopf._cogs.aiokits.capacity.Capacity`, as the timers'
calls in the framework's hands are.

This is not a limit on how many objects can be handled in parallel (that is ``settings.queueing.
worker_limit``, unlimited by default): the slow handlers of all objects run concurrently anyway.
It only paces the framework's own work, which is CPU- and API-bound, and gains nothing from
more concurrency than the CPU and the API server can serve.

The number of seats is a trade-off. Every object in the framework's hands costs its data at the peak,
and the more objects are in hands at once, the colder their data is in the CPU's caches when their
turn comes again (after a request, after a sync handler's call in a thread): the same work costs more
CPU. Too few seats cost CPU too: the sync handlers' calls go to the threads in smaller batches
(more switches of the GIL). The requests' latency is covered by the lending: with fewer seats than the
client's request slots (``settings.networking.max_concurrent_requests`` per credential), the slots are
still kept busy by a slow server. The default was chosen by benchmarks/core_handling.py (see the figures in
benchmarks/README.md, "Figures cited by the code").
"""
from collections.abc import Iterator

from kopf._cogs.aiokits import capacity
from kopf._core.intents import configuration
from kopf._core.intents.configuration import QueueingSettings

__all__ = ['DEFAULT_SEATS', 'LENDING_DELAY', 'Pacer', 'Seat']

# How many objects are processed by the framework at once (the handlers and sleeps excluded), by default:
# the operators take ``settings.queueing.processing_seats``; a pacer made with no number takes this.
DEFAULT_SEATS: int = QueueingSettings.processing_seats

# How long a running handler keeps its object's seat before lending it to another object: the pacer's own
# delay (``settings.execution.lending_delay``), whatever this constant's value says (a number set here instead
# is used as is, e.g. by the benchmarks).
LENDING_DELAY: float = capacity.OWN_LENDING_DELAY


# How many new objects per seat may be let in (by default) while the seated ones wait for the API client's
# request slots (all taken: a busy API server), at most: prepared, they wait for the slots too (see above).
RESERVE_PER_SEAT: int = configuration.RESERVE_PER_SEAT

# One processing's place in the pacer: taken at the start, released at the end, lent in between.
Seat = capacity.Hold


class Pacer(capacity.Capacity[object]):  # nothing is queued: the processing's objects await their seats
    """
    The seats of the processing: a capacity whose returning holders (urgent) go before the new ones.

    The seats are handed over directly from the releaser to the next waiter in the queues,
    so that nobody can sneak in between; the cancelled waiters are removed from the queues.
    """

    def __init__(self, seats: int | None = None, *,
                 lending_delay: float = capacity.DEFAULT_LENDING_DELAY, reserve: int | None = None) -> None:
        seats = DEFAULT_SEATS if seats is None else seats
        if seats < 1:
            raise ValueError(f'The pacer needs at least one seat, got {seats!r}.')
        reserve = RESERVE_PER_SEAT * seats if reserve is None else reserve  # None: as many per seat
        super().__init__(seats, lending_delay=lending_delay, reserve=reserve)

    @property
    def seats(self) -> int:
        """How many objects can be in the framework's hands at once (taken and free seats together)."""
        return self.limit

    def seat(self) -> Seat:
        return Seat(self)

    def gauges(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """The seats taken (by the objects in the framework's own steps) and free; the reserve used."""
        free = self.free  # negative while the returning holders have taken theirs back beyond the limit
        yield 'kopf_processing_seats', {'state': 'taken'}, float(self.limit - free)
        yield 'kopf_processing_seats', {'state': 'free'}, float(max(free, 0))
        yield 'kopf_processing_reserve_used', {}, float(self.reserved)
