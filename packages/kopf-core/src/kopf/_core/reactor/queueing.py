"""
Per-object serialisation of the watch-events: one watch-stream in, one short-lived worker per object out.

A watcher consumes the endless stream of one resource in one namespace (or cluster-wide)
and multiplexes the events into per-object streams, keyed by the objects' uids (or by their
namespaces & names if they have no uids). For every object, at most one worker exists at a time,
so the events of one object are never processed concurrently; different objects are processed
in parallel (up to ``settings.queueing.worker_limit`` at once, shared by the whole operator).

Batching: an object's stream holds only the latest unprocessed event. The events that arrive
while the object is being processed replace each other, and only the latest one is processed:
the processing always works with the latest known state of the object. The first event after
a quiet period (e.g. of a new object, or of one seen in a listing) is processed at once, as Kopf does;
but when the object has just been processed (within ``settings.queueing.batch_window``), the events
are batched until they stop arriving within the window of each other: e.g. the watch-events caused by
the processing's own patches come in quick succession, and only the latest of them is processed.
A deletion ends the batching at once: nothing comes after it, so there is nothing to wait for.
The newer events also set the delivery's ``pressure``, so that a processor sleeping on something
(e.g. for its delayed handlers) can wake up earlier.

Workers exit once their batching window has passed with no new events (or right after the object
is deleted, or released by our finalizer for its deletion: only the deletion can come after that),
and their streams are forgotten: an idle object costs no task and no queue, only a small
record of its identity (to notice its disappearance while the watch-stream was not watching). An idle
worker would keep nothing else: past the window, a new event is processed at once anyway, by a new worker
as well as by the old one. Only the objects that come back within ``settings.queueing.idle_timeout``
after their worker has left (e.g. with the echoes of their timers' patches every second) keep their next
worker for the whole idle timeout, as all did before: a new worker for every event would cost more.
The idle workers of a watch-stream share one timer of the event loop (for the one that went idle first):
not one per worker, which the loop would keep in its heap of timers (with Python-level comparisons)
and cancel at almost every event. So do the batching windows of its workers (waited for after nearly
every processing, for the echoes of its own patches). See :mod:`kopf._cogs.aiokits.alarms`.
The final event of a deleted object that has no worker (e.g. the late echo of the finalizer's removal)
starts none if the object needs nothing but to be forgotten (no event handlers, no daemons, no indices);
nor does a listed object that needs nothing, or a change that needs only to be noticed (e.g. the echoes of
the timers' own patches, every tick): see :class:`Forgetter`.

Back-pressure and deferral (when too many objects wait for the pacer's seats, the new workers are deferred,
and then the watch-stream is not read for a while) are the :class:`.backlog.Backlog`'s; the facts of every
delivery (:class:`.contexts.Delivery`) tell the processing whether the stream was held back: by the
back-pressure, or by an interruption (the watch request ended and is re-established, e.g. while the API
server restarts): the events made meanwhile, the echoes of the processing's own patches too, come late.

When a re-listing (at the start, or after the server forgot the history) has no object that
was known before, the object is considered deleted: a synthetic ``DELETED`` event is processed
for it, with a skeleton body made of its last known identity (apiVersion, kind, name, namespace, uid).

Unexpected errors of the processing are logged and throttled per object with the delays
of ``settings.queueing.error_delays`` (the last delay repeats; a success resets the sequence);
meanwhile, the object's new events are batched as usual, and only the latest one is processed next.

On exit, the workers get ``settings.queueing.exit_timeout`` to finish what they are doing (their
streams get the pressure to hurry up, also for the events still pending, which are processed then:
nothing they could wait for, e.g. the echoes of their own patches, will come) and are cancelled after that.

Indexing, and the wait for the operator's indices to be ready, are the :class:`.indexgate.IndexGate`'s.

With the sharding (:mod:`kopf._core.engines.sharding`), the events of the objects of other replicas are
dropped as the first thing (``owns``: a cached lookup by the uid), before anything is remembered of them;
the objects given away meanwhile are not processed anymore (their pending events are dropped by their
workers), and are not reported as deleted when a re-listing does not have them. The watch-streams ask the
server only for the objects of the shards held when they start (see :class:`Sharded`): the servers that
can filter them do, so that most of the other replicas' events never come here.

The processor is pluggable: see :class:`Processor`.
"""
import asyncio
import contextlib
import dataclasses
import functools
import logging
import sys
from collections.abc import Awaitable, Callable, Hashable, Iterator, Mapping
from typing import Any, Literal, NamedTuple, Protocol, cast

from kopf._clients import watching
from kopf._clients.connections import NetworkError
from kopf._clients.errors import APIForbiddenError
from kopf._clients.vault import Vault
from kopf._clients.watching import Bookmark
from kopf._cogs.aiokits import alarms
from kopf._cogs.aiokits.backoffs import iter_backoffs
from kopf._cogs.helpers import metering
from kopf._cogs.structs.bodies import RawBody, RawEvent
from kopf._cogs.structs.credentials import LoginError
from kopf._cogs.structs.references import Resource
from kopf._core.actions import loggers
from kopf._core.engines.indexing import IndexingReadiness, ReadinessToggle
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.reactor import pacing
from kopf._core.reactor.backlog import Backlog
from kopf._core.reactor.contexts import Delivery
from kopf._core.reactor.indexgate import IndexGate, PendingEvent

logger = logging.getLogger(__name__)

class Processor(Protocol):
    """
    The per-object processing cycle: called for the latest event of an object, one call at a time per object.

    The delivery (:class:`.contexts.Delivery`) carries the event and the facts of its delivery: its
    ``pressure`` is set when newer events of the same object arrive during the call.
    Whatever the processor needs besides (settings, registry, memories, etc.) is bound in advance,
    e.g. with :func:`functools.partial`. Exceptions escaping it are logged and throttled.
    It returns True if the object is finished with: nothing but its deletion can come (e.g. our finalizer
    is released from a deleted object); then its worker exits at once, not waiting for more events to batch.
    """

    def __call__(self, delivery: Delivery, /) -> Awaitable[bool | None]: ...


class Forgetter(Protocol):
    """
    The finishing of an object's event without a worker, if the object needs nothing else.

    Called for the ``DELETED`` events of the objects that have no worker at that moment (usually,
    their workers have left before the echo of the finalizer's removal came), for the listed objects
    (type ``None``) that have none, and for their other events unless the stream's gate would hold them (the
    indexing of the stream's objects, or the indices not ready yet):
    it returns whether the event is done with: the deleted object is forgotten, the listed one needs nothing
    now (e.g. it was handled before a restart and has not changed since then), or the change needs nothing
    but to be noticed (e.g. the echoes of the timers' patches, shown to the timers). If not (e.g. the event
    handlers or the daemons must see the deletion), the event goes to a worker and to the processor, as all
    the other events do.
    Synchronous: it must not wait for anything. Whatever it needs is bound in advance, as for the processor.
    """

    def __call__(self, *, raw_event: RawEvent, resource: Resource) -> bool: ...


class Sharded(Protocol):
    """What the watchers need of the sharding (given by the reactor: the queueing knows no coordinators)."""

    def owns(self, uid: str) -> bool:
        """Whether the object (by its uid) is this replica's to handle now: called for every event."""

    def selector(self) -> str | None:
        """The server-side ``shardSelector`` of the objects handled now (None for all objects)."""

    def applied(self, what: str, echo: str | None) -> None:
        """What the server has said of the selector in a listing: what it has applied (None if nothing)."""


class ObjectIdentity(NamedTuple):
    """The least that is remembered about an idle object: enough to report its disappearance."""

    api_version: str | None
    kind: str | None
    namespace: str | None
    name: str | None
    uid: str | None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> 'ObjectIdentity':
        meta = body.get('metadata') or {}
        # These are kept for every idle object: the values common to many objects are shared, not copied.
        return cls(_shared(body.get('apiVersion')), _shared(body.get('kind')),
                   _shared(meta.get('namespace')), meta.get('name'), meta.get('uid'))

    @property
    def key(self) -> Hashable:
        return _object_key(self.uid, self.namespace, self.name)

    def as_body(self) -> RawBody:
        meta = {key: value for key, value in [('name', self.name), ('namespace', self.namespace),
                                              ('uid', self.uid)] if value is not None}
        body = {key: value for key, value in [('apiVersion', self.api_version), ('kind', self.kind)]
                if value is not None}
        return cast(RawBody, {**body, 'metadata': meta})


def _object_key(uid: str | None, namespace: str | None, name: str | None) -> Hashable:
    """How the objects are known in the queueing: by their uids, or by their names if they have none."""
    return uid if uid else (namespace, name)


def _shared(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


class _Pressure(asyncio.Event):
    """
    An :class:`asyncio.Event` as small as a flag: the list of its waiters exists only while it is waited for.

    Every active object has one (the "stream pressure"), but only the sleeping processors wait for it;
    the standard one makes a queue of waiters (~600 bytes) for every object of a burst of thousands.
    All the methods are its own (none of the base class's internals is used), so it behaves the same.
    """

    def __init__(self) -> None:  # not the base class's: no queue of waiters in advance
        self._flag = False
        self._futures: list[asyncio.Future[bool]] | None = None

    def __repr__(self) -> str:
        waiters = len(self._futures) if self._futures else 0
        return f'<{type(self).__name__} [{"set" if self._flag else "unset"}, waiters:{waiters}]>'

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if not self._flag:
            self._flag = True
            for future in self._futures or ():
                if not future.done():
                    future.set_result(True)

    def clear(self) -> None:
        self._flag = False

    async def wait(self) -> Literal[True]:
        if self._flag:
            return True
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._futures is None:
            self._futures = []
        self._futures.append(future)
        try:
            await future
            return True
        finally:
            self._futures.remove(future)
            if not self._futures:
                self._futures = None


@dataclasses.dataclass(eq=False, slots=True)
class _Stream:
    """An active object: its latest unprocessed event, the pressure flag, and its only worker."""

    pressure: asyncio.Event
    pending: RawEvent | None = None
    worker: asyncio.Task[None] | None = None
    events: int = 0  # how many events have arrived so far (to tell them from the timers' wake-ups)
    received_at: float = 0.0  # when the pending event has arrived (the loop's time)
    returning: bool = False  # its previous worker left within the idle timeout: this one waits for it


# The events of the objects with no worker that may need no processing even if gated (see :class:`Forgetter`).
_UNATTENDED: frozenset[str | None] = frozenset({'DELETED', None})


def _is_final(stream: _Stream) -> bool:
    # Nothing comes after the deletion (of this uid): no reason to wait for more events to batch them.
    return stream.pending is not None and stream.pending['type'] == 'DELETED'


def _forget(key: Hashable) -> None:
    pass  # the object's parting is over: it is only removed from the alarms


def _press(stream: _Stream) -> None:
    # As _wait_or_expire() does: the waiter sees no new events counted, or nothing pending.
    stream.pressure.set()


@dataclasses.dataclass(eq=False, slots=True)
class _Throttle:
    """The error delays of a failing object: where it is in the sequence, and the last delay used."""

    delays: Iterator[float]
    last_delay: float | None = None


class ObjectStreams:
    """
    The multiplexer of one watch-stream into the per-object workers (see the module's description).

    Feed it with the items of :func:`kopf._clients.watching.infinite_watch` (raw events and bookmarks);
    close it when the watch-stream is over, to let the workers finish gracefully.
    """

    def __init__(
            self,
            *,
            processor: Processor,
            resource: Resource,
            namespace: str | None,
            settings: OperatorSettings,
            limiter: asyncio.Semaphore | None = None,
            indexer: Processor | None = None,
            readiness: IndexingReadiness | None = None,
            toggle: ReadinessToggle | None = None,
            pacer: pacing.Pacer | None = None,
            forgetter: Forgetter | None = None,
            owns: Callable[[str], bool] | None = None,
    ) -> None:
        super().__init__()
        self._processor = processor
        self._owns = owns
        # Not for the indexed resources: the indices must see the deletion, in order with the other events.
        self._forgetter = forgetter if indexer is None else None
        # The back-pressure and the deferral of the new workers, by the pacer of the processing (the same
        # as the processor's); not for the indexed resources: every listed object must be indexed before
        # any is processed, so the indexing of none can be held back.
        self._backlog = Backlog(pacer=pacer if indexer is None else None, start=self._start_deferred,
                                name=repr(resource),
                                limit=pacer.seats if pacer is not None else pacing.DEFAULT_SEATS)
        self.was_held_back_since = self._backlog.was_held_back_since  # by the back-pressure (not read)
        self._interrupted_at = float('-inf')  # when the watch-stream ended last (then, it is re-established)
        self._interrupted_now = False  # nothing has come from the stream since it ended last
        self._resource = resource
        self._namespace = namespace
        self._settings = settings
        self._limiter = limiter
        self._gate = None if indexer is None and readiness is None else IndexGate(
            settings=settings, deliver=self._deliver, indexer=indexer, readiness=readiness, toggle=toggle)
        self._streams: dict[Hashable, _Stream] = {}
        # What the workers wait for, till an alarm sets their pressure (one loop timer for each kind):
        self._idle_timeouts: alarms.Alarms[_Stream] = alarms.Alarms(_press)  # the returning objects' idling
        self._idle_windows: alarms.Alarms[_Stream] = alarms.Alarms(_press)  # the others' idling: a window
        self._batch_windows: alarms.Alarms[_Stream] = alarms.Alarms(_press)  # the silence after a processing
        self._partings: alarms.Alarms[Hashable] = alarms.Alarms(_forget)  # the workers left lately: till
                                                                           # the idle timeout, to tell returns
        self._known: dict[Hashable, ObjectIdentity] = {}
        self._listing: set[Hashable] | None = None
        self._throttles: dict[Hashable, _Throttle] = {}
        self._closing = asyncio.Event()
        # The objects & the backlog as gauges, read when the metrics are scraped (nothing per event).
        meters = metering.meters
        self._unmeter = meters.add_gauges(self._gauges) if meters is not None else None

    def _gauges(self) -> Iterator[tuple[str, dict[str, str], float]]:
        resource = self._resource
        name = f'{resource.plural}.{resource.group}' if resource.group else resource.plural
        yield 'kopf_objects', {'resource': name, 'state': 'known'}, len(self._known)
        yield 'kopf_objects', {'resource': name, 'state': 'active'}, len(self._streams)
        yield 'kopf_workqueue_depth', {'resource': name}, self._backlog.backlog

    @property
    def active_count(self) -> int:
        """How many objects have a worker now (i.e. are being processed or were recently)."""
        return len(self._streams)

    @property
    def known_count(self) -> int:
        """How many objects are known to exist (as of the latest events)."""
        return len(self._known)

    def feed(self, item: RawEvent | Bookmark) -> None:
        """Route a watch-event to its object's worker (starting one if needed); interpret the bookmarks."""
        self._interrupted_now = False
        if item is Bookmark.LISTED:
            self._finish_listing()
            return
        raw_event = item
        raw_body = raw_event['object']
        meta = raw_body.get('metadata') or {}
        uid = meta.get('uid')
        if uid and self._owns is not None and not self._owns(uid):
            return  # another replica's object (the sharding): as if never seen, at the least cost
        key = _object_key(uid, meta.get('namespace'), meta.get('name'))  # as the identity's key (made below)
        if raw_event['type'] is None:
            if self._listing is None:
                self._listing = set()
            self._listing.add(key)
            if self._gate is not None:
                self._gate.listed(key)
        if raw_event['type'] == 'DELETED':
            self._known.pop(key, None)
        elif not uid or key not in self._known:
            # An object known by its uid keeps its identity: the same uid is never another object.
            # (So the identity is made only for the new objects, not for every event: it is a few calls.)
            identity = ObjectIdentity.from_body(raw_body)
            if self._known.get(key) != identity:  # usually the same: keep the old one, let the new one go
                self._known[key] = identity
        self._dispatch(key, raw_event)

    def _finish_listing(self) -> None:
        listed, self._listing = self._listing or set(), None
        vanished = [identity for key, identity in self._known.items() if key not in listed]
        for identity in vanished:
            del self._known[identity.key]
            if identity.uid and self._owns is not None and not self._owns(identity.uid):
                continue  # not listed since it is not ours anymore (the sharding), not since it is gone
            self._dispatch(identity.key, cast(RawEvent, {'type': 'DELETED', 'object': identity.as_body()}))
        if self._gate is not None:
            self._gate.listing_finished()

    def _dispatch(self, key: Hashable, raw_event: RawEvent) -> None:
        stream = self._streams.get(key)
        # Not the changes while gated: the indexing, the wait for the indices' readiness go first (workers).
        if (stream is None and (raw_event['type'] in _UNATTENDED or self._gate is None or self._gate.open)
                and self._forget(key, raw_event)):
            return
        now = asyncio.get_running_loop().time()
        if stream is None:
            stream = _Stream(pressure=_Pressure(), returning=self._is_returning(key, now))
            self._streams[key] = stream
            if self._backlog.crowded:
                self._backlog.defer(key)
            else:
                self._start(key, stream)
        stream.pending = raw_event
        stream.received_at = now
        stream.events += 1
        stream.pressure.set()

    def _forget(self, key: Hashable, raw_event: RawEvent) -> bool:
        """
        Finish an event of an object without a worker if it needs nothing else (see :class:`Forgetter`).

        A worker would cost more than the forgetting itself: its task, its stack of coroutines, its stream.
        E.g. in a mass deletion, the echoes of the finalizers' removals (the objects' final ``DELETED``
        events) come after the workers have left, since the watch-stream is held back by the back-pressure;
        at a restart, most listed objects have been handled before and need nothing.
        """
        if self._forgetter is None:
            return False
        deleted = raw_event['type'] == 'DELETED'
        if not deleted and key in self._throttles:
            return False  # it has failed lately: its worker retries it in time
        try:
            forgotten = self._forgetter(raw_event=raw_event, resource=self._resource)
        except Exception:
            return False  # the worker processes it as any other event: it logs the error and retries
        if forgotten and deleted:
            self._throttles.pop(key, None)
            self._partings.discard(key)  # a deleted uid never returns
        return forgotten

    def _start(self, key: Hashable, stream: _Stream) -> None:
        self._backlog.worker_created()
        # The loop's own method: asyncio.create_task() names the task by one more call (for every object).
        loop = asyncio.get_running_loop()
        stream.worker = loop.create_task(self._worker(key, stream), name=f'worker for {key!r}')

    def _start_deferred(self, key: Hashable) -> bool:
        """Start a deferred object's worker (see :class:`.backlog.Backlog`); False if it needs none now."""
        stream = self._streams.get(key)
        if stream is None or stream.worker is not None:
            return False
        self._start(key, stream)
        return True

    def interrupted(self) -> None:
        """
        The watch-stream has ended or failed, and is being re-established (see :meth:`held_back_since`).

        A listing handed over page by page and not finished is void then: the objects it has named so far
        are not proof of their existence (the next listing starts anew: the vanished ones are told by it).
        """
        self._interrupted_at = asyncio.get_running_loop().time()
        self._interrupted_now = True
        self._listing = None

    def held_back_since(self, moment: float) -> bool:
        """
        Whether the events made since the moment come late, but surely: the watch-stream was held back.

        Either by the back-pressure (not read for a while), or by an interruption of the stream (its
        request ended in any way) since the moment or before it and nothing has come since then: the
        re-established stream brings the events made meanwhile (replayed from the last known version, or
        with a relisting), only later than usual. E.g. the echoes of the processing's own patches, which
        the processing must wait for rather than handle a state known to be older (a re-run of the handlers).
        """
        return self._interrupted_now or self._interrupted_at >= moment or self.was_held_back_since(moment)

    def _deliver(self, raw_event: RawEvent, stream: PendingEvent) -> Delivery:
        return Delivery(raw_event, self._resource, self._namespace, stream.pressure, stream.received_at,
                        self.held_back_since)

    @property
    def backlog(self) -> int:
        """How many objects wait for their processing: for the pacer's seats, or for their workers' start."""
        return self._backlog.backlog

    @property
    def backlogged(self) -> bool:
        """Whether so many objects wait for processing that the watch-stream should not be read for now."""
        return self._backlog.backlogged

    async def wait_for_room(self) -> None:
        """Wait until the backlog is below its limit again (at once if not backlogged, or if closing)."""
        await self._backlog.wait_for_room()

    async def close(self, *, exit_timeout: float | None = None) -> None:
        """
        Let the workers process what they have and exit; cancel those still working after the timeout.

        The idle workers exit at once; the busy ones see the pressure (as if new events arrived).
        """
        self._closing.set()
        if self._unmeter is not None:
            self._unmeter()
        self._idle_timeouts.cancel()  # the pressure below wakes up the idle and the batching workers
        self._idle_windows.cancel()
        self._partings.cancel()
        self._batch_windows.cancel()
        self._backlog.close()  # the deferred ones start as if never deferred: they process what they have
        for stream in self._streams.values():
            stream.pressure.set()
        workers = [stream.worker for stream in self._streams.values() if stream.worker is not None]
        if not workers:
            return
        _, pending = await asyncio.wait(workers, timeout=exit_timeout)
        for task in pending:
            task.cancel()
        if pending:
            logger.debug(f'Cancelling {len(pending)} workers of {self._resource!r}: not exited in time.')
            await asyncio.wait(pending)

    async def _worker(self, key: Hashable, stream: _Stream) -> None:
        self._backlog.worker_running()
        loop = asyncio.get_running_loop()
        processed_at: float | None = None  # when the latest processing has ended (in the loop's time)
        try:
            while True:
                if stream.pending is None:
                    if self._closing.is_set():
                        break
                    await self._wait_while_idle(stream)
                    if stream.pending is None:
                        if not self._closing.is_set():
                            self._remember_parting(key)
                        break  # idle for too long, or closing with nothing left to do.

                # The first event after a quiet period goes at once; the events right after a processing
                # (e.g. the echoes of its own patches) are batched until they stop coming.
                window = self._settings.queueing.batch_window
                if processed_at is not None and loop.time() - processed_at < window and not _is_final(stream):
                    await self._wait_for_silence(stream)
                raw_event, stream.pending = stream.pending, None
                received_at = stream.received_at
                stream.pressure.clear()
                if self._closing.is_set():
                    # The watch-stream is gone: nothing that the processing could wait for will come (e.g.
                    # the echo of its own patch); it hurries up, as the busy ones do when the closing starts.
                    stream.pressure.set()

                if self._gate is not None:
                    latest = await self._gate.admit(key, raw_event, stream, self._closing)
                    if latest is None:
                        break  # closing while waiting: the handlers never ran, nothing to finish.
                    if latest is not raw_event:
                        raw_event, received_at = latest, stream.received_at

                if self._owns is not None and type(key) is str and not self._owns(key):
                    break  # given away meanwhile (the sharding): not processed here, its new owner lists it

                finished = await self._process(key, raw_event, stream, received_at)
                processed_at = loop.time()

                # Nothing can come after the deletion (of this uid): do not keep the worker for nothing.
                # Nor when the processing has finished with the object: only its deletion can come.
                if (finished or raw_event['type'] == 'DELETED') and stream.pending is None:
                    self._throttles.pop(key, None)
                    break
        finally:
            # No awaits between the final check of the pending event and the forgetting of the stream:
            # a new event can arrive only while this worker awaits something, so none can be lost.
            if self._streams.get(key) is stream:
                del self._streams[key]

    async def _wait_while_idle(self, stream: _Stream) -> None:
        """
        Wait for a new event, or until the idle timeout is over (then, the alarm sets the pressure).

        Only the workers of the returning objects wait for the whole idle timeout; the others wait only
        as long as their new events would be batched (the batching window, if shorter). The batching window
        is the only thing an idle worker keeps: past it, a new event is processed at once anyway, by a new
        worker as well as by the old one; but an idle worker costs its task and a stack of coroutines,
        for every object processed within the idle timeout (5 s by default), e.g. after an initial listing
        or a mass deletion. The objects that come back (e.g. with the echoes of
        their timers' patches every second) would cost a new worker every time instead: they keep theirs.
        """
        if stream.pressure.is_set():
            return
        idle_timeout = self._idle_timeout
        window = self._settings.queueing.batch_window
        if stream.returning or idle_timeout is None or idle_timeout <= window:
            await self._wait_or_alarm(self._idle_timeouts, stream, idle_timeout)
        else:
            await self._wait_or_alarm(self._idle_windows, stream, window)

    def _is_returning(self, key: Hashable, now: float) -> bool:
        """
        Whether the object comes back within the idle timeout after its worker has left (and forget that).

        Not while the watch-stream is held back, or was lately: then, the events come late by our own doing
        (e.g. the echoes of the patches made just before the worker left), not by the object's nature;
        and with many objects at once (it is a burst), whose workers would wait for nothing.
        """
        if key not in self._partings:
            return False
        self._partings.discard(key)
        idle_timeout = self._idle_timeout
        return idle_timeout is None or not self.was_held_back_since(now - idle_timeout)

    def _remember_parting(self, key: Hashable) -> None:
        """Remember for the idle timeout that the object's worker has left (if any worker can be brief)."""
        idle_timeout = self._idle_timeout
        if idle_timeout is not None and idle_timeout > self._settings.queueing.batch_window:
            # Refused if out of order (the timeout was reduced meanwhile): then, it is forgotten at once.
            self._partings.add(key, asyncio.get_running_loop().time() + idle_timeout)

    @property
    def _idle_timeout(self) -> float | None:
        # Typed as a number in the settings, but None was always accepted here: the workers never expire.
        idle_timeout: float | None = self._settings.queueing.idle_timeout
        return idle_timeout

    @staticmethod
    async def _wait_or_alarm(waits: alarms.Alarms[_Stream], stream: _Stream, delay: float | None) -> None:
        """Wait for the stream's pressure, set by a new event or by the alarm after the delay (if any)."""
        if delay is None:
            await stream.pressure.wait()
        elif waits.add(stream, asyncio.get_running_loop().time() + delay):
            try:
                await stream.pressure.wait()
            finally:
                waits.discard(stream)
        else:  # e.g. the delay was reduced in the settings meanwhile: out of the alarms' order
            await _wait_or_expire(stream.pressure, delay)

    async def _wait_for_silence(self, stream: _Stream) -> None:
        """Batch the bursts of events: wait until no new events arrive within the batching window."""
        while not self._closing.is_set() and not _is_final(stream):
            stream.pressure.clear()
            events = stream.events
            # The pressure set by the alarm is told from the new events' by their count.
            await self._wait_or_alarm(self._batch_windows, stream, self._settings.queueing.batch_window)
            if stream.events == events and not self._closing.is_set():
                break  # the window has passed in silence (otherwise, it starts anew)

    async def _process(
            self, key: Hashable, raw_event: RawEvent, stream: _Stream, received_at: float,
    ) -> bool | None:
        """Process the event; return whether the object is finished with (see :class:`Processor`)."""
        delivery = Delivery(raw_event, self._resource, self._namespace, stream.pressure, received_at,
                            self.held_back_since)  # not self._deliver(): one call less per event
        try:
            if self._limiter is None:  # the usual case: no nullcontext() & its 3 calls for every event
                finished = await self._processor(delivery)
            else:
                async with self._limiter:
                    finished = await self._processor(delivery)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            await self._throttle(key, raw_event, e)
            return None
        else:
            self._throttles.pop(key, None)
            return finished

    async def _throttle(self, key: Hashable, raw_event: RawEvent, exc: Exception) -> None:
        """Sleep after an unexpected error (new events keep batching meanwhile; closing interrupts it)."""
        object_logger = loggers.ObjectLogger(body=raw_event['object'], settings=self._settings)
        throttle = self._throttles.get(key)
        if throttle is None:
            throttle = self._throttles[key] = _Throttle(iter_backoffs(self._settings.queueing.error_delays))
        delay = next(throttle.delays, throttle.last_delay)
        throttle.last_delay = delay
        # The credentials that ran out are explained (once) by the authentication, the operator exits
        # for them: the same traceback of the API client in every object's log would only bury that.
        # An API unreachable for longer than the request's retries (e.g. kube-apiserver restarting) is
        # said by the error itself, after a warning per failed attempt naming the request: the client's
        # insides add nothing but a traceback per object being handled at the moment.
        with_traceback = not isinstance(exc, (LoginError, NetworkError))
        what = 'Processing has failed' if delay is None else f'Throttling for {delay} seconds'
        if isinstance(exc, APIForbiddenError):
            # Not a bug to trace: the operator's user lacks a permission (e.g. to patch the objects or their
            # status), which the API's message names (the verb, the resource, the namespace): one line.
            object_logger.error(f'{what}: the API has denied the access: {exc}; grant the RBAC permissions '
                                f"to the operator's user or service account "
                                f'(see https://docs.kopf.dev/en/stable/deployment/).')
        elif delay is None:
            object_logger.error(f'{what} with an unexpected error: {exc!r}', exc_info=with_traceback)
        else:
            object_logger.error(f'{what} due to an unexpected error: {exc!r}', exc_info=with_traceback)
        if delay is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._closing.wait()
        object_logger.info('Throttling is over. Switching back to normal operations.')


async def _wait_or_expire(event: asyncio.Event, delay: float | None) -> None:
    """
    Wait until the event is set, or until the delay is over: the event is then set by the timer itself.

    The callers tell one from another by other signs (e.g. the pending or counted events).
    This is much cheaper than ``asyncio.timeout()``, which cancels the waiting task and raises
    ``TimeoutError`` --- this happens for every object at least twice (batching, idling).
    """
    if event.is_set():
        return
    timer = asyncio.get_running_loop().call_later(delay, event.set) if delay is not None else None
    try:
        await event.wait()
    finally:
        if timer is not None:
            timer.cancel()


def describe_resource(resource: Resource) -> str:
    """The resource as the logs name it: ``plural.version.group`` (``plural.version`` for the core API)."""
    return '.'.join(part for part in (resource.plural, resource.version, resource.group) if part)


def describe_scope(namespace: str | None) -> str:
    return f'in {namespace!r}' if namespace is not None else 'cluster-wide'


async def watcher(
        *,
        settings: OperatorSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        processor: Processor,
        limiter: asyncio.Semaphore | None = None,
        indexer: Processor | None = None,
        readiness: IndexingReadiness | None = None,
        pacer: pacing.Pacer | None = None,
        forgetter: Forgetter | None = None,
        sharded: Sharded | None = None,
) -> None:
    """
    Watch one resource in one namespace (or cluster-wide) and process its objects until cancelled.

    ``indexer`` (if the resource is indexed) and ``readiness`` (of the operator's indices): see above.
    ``forgetter``: finishes the deleted & listed objects with no worker at once if it can (see above).
    ``sharded``: which objects are this replica's to handle (the sharding); the events of the others are
    dropped as the first thing, before anything is remembered of them; the server is asked only for
    the objects handled as of every (re)start of the watch-stream (the servers that can, filter them).

    The watch-stream survives the disconnects by itself; if it fails (e.g. HTTP 403 or 404), the failure
    is logged and the watching restarts after a delay from ``settings.queueing.error_delays``
    (the sequence restarts once a listing succeeds). The workers of the objects survive the restarts.
    """
    name = describe_resource(resource)
    scope = describe_scope(namespace)
    # Synchronously at the start: the toggles of all the initial streams exist before any object is processed.
    toggle = readiness.expect(f'{name} {scope}') if readiness is not None and indexer is not None else None
    streams = ObjectStreams(processor=processor, resource=resource, namespace=namespace,
                            settings=settings, limiter=limiter,
                            indexer=indexer, readiness=readiness, toggle=toggle, pacer=pacer,
                            forgetter=forgetter, owns=sharded.owns if sharded is not None else None)
    logger.debug(f'Starting the watch-stream for {name} {scope}.')
    try:
        delays = iter_backoffs(settings.queueing.error_delays)
        last_delay: float = settings.watching.reconnect_backoff
        while True:
            shard_selector = sharded.selector() if sharded is not None else None
            on_shard_info = None
            if sharded is not None and shard_selector is not None:
                on_shard_info = functools.partial(sharded.applied, f'{name} {scope}')
            source = watching.infinite_watch(settings=settings, vault=vault, resource=resource,
                                             namespace=namespace, logger=logger,
                                             on_interruption=streams.interrupted,
                                             shard_selector=shard_selector, on_shard_info=on_shard_info,
                                             paged=True)
            try:
                async with contextlib.aclosing(source):
                    async for item in source:
                        streams.feed(item)
                        if item is Bookmark.LISTED:
                            delays = iter_backoffs(settings.queueing.error_delays)
                        # Back-pressure: the bodies wait in the socket, not in memory. Not for the listings:
                        # they are in memory anyway, and the watching (with the echoes of our patches) starts
                        # after them: held back, the echoes would come long after the patches.
                        if item is not Bookmark.LISTED and item['type'] is not None and streams.backlogged:
                            logger.debug(f'The watch-stream for {name} {scope} is held back: '
                                         f'{streams.backlog} objects wait for their processing.')
                            await streams.wait_for_room()
            except APIForbiddenError as e:
                # Not a bug to trace: the operator's user has no permissions (yet), the fix is in the RBAC.
                streams.interrupted()
                last_delay = next(delays, last_delay)
                logger.error(f'Watcher for {name}@{namespace} has failed: {e}; grant the RBAC permissions '
                             f"to the operator's user or service account "
                             f'(see https://docs.kopf.dev/en/stable/deployment/); '
                             f'restarting in {last_delay} seconds.')
                await asyncio.sleep(last_delay)
            except Exception as e:
                streams.interrupted()
                last_delay = next(delays, last_delay)
                logger.exception(f'Watcher for {name}@{namespace} has failed: {e}; '
                                 f'restarting in {last_delay} seconds.')
                await asyncio.sleep(last_delay)
    finally:
        logger.debug(f'Stopping the watch-stream for {name} {scope}.')
        if toggle is not None:
            toggle.drop()  # nobody should wait for a stream that is gone
        await streams.close(exit_timeout=settings.queueing.exit_timeout)
