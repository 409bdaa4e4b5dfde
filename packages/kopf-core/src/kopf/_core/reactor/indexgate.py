"""
The index gate of one watch-stream: its objects are indexed first, processed only once the indices are ready.

If an ``indexer`` is given (for the resources with ``@kopf.index`` handlers), it gets every event of an
object before the processor, outside of the worker limit. The processing of every object waits until
the operator's indices are ready (``readiness``): until every watch-stream of the indexed resources has
all the objects of its initial listing indexed; the objects' newer events are indexed meanwhile (the
processor then gets the latest event only). The stream's own readiness toggle is turned on when the last
object of its initial listing is indexed (see :mod:`kopf._core.engines.indexing`).
"""
import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Protocol

from kopf._cogs.structs.bodies import RawEvent
from kopf._core.actions import loggers
from kopf._core.engines.indexing import IndexingReadiness, ReadinessToggle
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.reactor.contexts import Delivery

__all__ = ['IndexGate', 'PendingEvent']


class PendingEvent(Protocol):
    """What the gate needs of an object's stream: its latest unprocessed event, its arrival, the pressure."""

    pending: RawEvent | None
    received_at: float
    pressure: asyncio.Event


class IndexGate:
    """
    The indexing of one watch-stream's objects, and their wait for the operator's indices to be ready.

    ``deliver(raw_event, stream)`` makes the delivery of an object's event for the indexer.
    """

    def __init__(
            self,
            *,
            settings: OperatorSettings,
            deliver: Callable[[RawEvent, PendingEvent], Delivery],
            indexer: Callable[[Delivery], Awaitable[object]] | None = None,
            readiness: IndexingReadiness | None = None,
            toggle: ReadinessToggle | None = None,
    ) -> None:
        super().__init__()
        self._settings = settings
        self._deliver = deliver
        self._indexer = indexer
        self._readiness = readiness
        self._toggle = toggle if indexer is not None else None
        self._unindexed: set[Hashable] = set()  # the objects of the initial listing not indexed yet
        self._listing = False  # a listing is being fed now

    @property
    def indexing(self) -> bool:
        return self._indexer is not None

    @property
    def open(self) -> bool:
        """Whether an event would pass with nothing done or waited for: no indexing, the indices are ready."""
        return self._indexer is None and (self._readiness is None or self._readiness.ready)

    def listed(self, key: Hashable) -> None:
        """An object of a listing: the stream is ready once all of its initial listing are indexed."""
        if self._toggle is not None:
            self._listing = True
            self._unindexed.add(key)

    def listing_finished(self) -> None:
        self._listing = False
        self._check_indexed()

    def _check_indexed(self) -> None:
        if self._toggle is not None and not self._listing and not self._unindexed:
            self._toggle.turn_on()
            self._toggle = None  # only the first listing matters

    async def admit(
            self, key: Hashable, raw_event: RawEvent, stream: PendingEvent, closing: asyncio.Event,
    ) -> RawEvent | None:
        """
        Index the object's event; then wait for the indices' readiness, indexing the newer events meanwhile.

        Returns the latest event of the object to be processed, or None if the streams are closing.
        """
        if self._indexer is not None:
            await self._index(key, raw_event, stream)
        if self._readiness is None or self._readiness.ready:
            return raw_event
        readiness = asyncio.create_task(self._readiness.wait(), name=f'readiness waiter for {key!r}')
        try:
            while not readiness.done():
                if closing.is_set():
                    return None
                if stream.pending is not None:
                    raw_event, stream.pending = stream.pending, None
                    stream.pressure.clear()
                    if self._indexer is not None:
                        await self._index(key, raw_event, stream)
                    continue
                stream.pressure.clear()  # nothing is pending: only the new events must wake us up
                pressure = asyncio.create_task(stream.pressure.wait(), name=f'pressure waiter for {key!r}')
                try:
                    await asyncio.wait([readiness, pressure], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    pressure.cancel()
        finally:
            readiness.cancel()
        return raw_event

    async def _index(self, key: Hashable, raw_event: RawEvent, stream: PendingEvent) -> None:
        """Index the object's event; the errors of the indexing functions are handled by the indexer."""
        assert self._indexer is not None
        try:
            await self._indexer(self._deliver(raw_event, stream))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            object_logger = loggers.ObjectLogger(body=raw_event['object'], settings=self._settings)
            object_logger.exception(f'Indexing has failed with an unexpected error: {e!r}')
        finally:
            if self._toggle is not None and key in self._unindexed:
                self._unindexed.discard(key)
                self._check_indexed()
