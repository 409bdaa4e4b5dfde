"""The index gate of one watch-stream, alone (see ``reactor/indexgate.py``)."""
import asyncio
import dataclasses
import logging
from typing import Any

import pytest

from kopf._cogs.structs.bodies import RawEvent
from kopf._cogs.structs.references import Resource
from kopf._core.engines.indexing import IndexingReadiness
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.reactor.contexts import Delivery
from kopf._core.reactor.indexgate import IndexGate

pytestmark = pytest.mark.looptime

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', namespaced=True)


@dataclasses.dataclass
class Stream:
    pressure: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    pending: RawEvent | None = None
    received_at: float = 0.0


def event(value: Any, type: str | None = 'MODIFIED') -> RawEvent:
    return {'type': type, 'object': {'metadata': {'name': 'kex1', 'uid': 'u1'}, 'spec': {'v': value}}}  # type: ignore


def deliver(raw_event: RawEvent, stream: Any) -> Delivery:
    return Delivery(raw_event, KEX, None, stream.pressure, stream.received_at)


class Indexer:
    def __init__(self, failing: bool = False) -> None:
        self.values: list[Any] = []
        self.failing = failing

    async def __call__(self, delivery: Delivery) -> None:
        self.values.append(delivery.raw_event['object']['spec']['v'])
        if self.failing:
            raise RuntimeError('boom')


async def test_without_indexing_and_with_ready_indices_the_event_passes_at_once() -> None:
    readiness = IndexingReadiness()
    gate = IndexGate(settings=OperatorSettings(), deliver=deliver, readiness=readiness)
    raw_event = event(1)
    assert await gate.admit('k', raw_event, Stream(), asyncio.Event()) is raw_event


async def test_the_event_is_indexed_first_and_indexing_errors_are_logged_not_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    indexer = Indexer(failing=True)
    gate = IndexGate(settings=OperatorSettings(), deliver=deliver, indexer=indexer)
    raw_event = event(1)
    assert await gate.admit('k', raw_event, Stream(), asyncio.Event()) is raw_event
    assert indexer.values == [1]
    assert any('Indexing has failed with an unexpected error' in r.message and r.levelno == logging.ERROR
               for r in caplog.records)


async def test_waits_for_readiness_and_indexes_the_newer_events_meanwhile() -> None:
    readiness = IndexingReadiness()
    toggle = readiness.expect('other stream')
    indexer = Indexer()
    gate = IndexGate(settings=OperatorSettings(), deliver=deliver, indexer=indexer, readiness=readiness)
    stream = Stream()
    admitted = asyncio.create_task(gate.admit('k', event(1), stream, asyncio.Event()))
    await asyncio.sleep(1)
    assert not admitted.done()
    stream.pending = event(2)
    stream.pressure.set()
    await asyncio.sleep(1)
    assert indexer.values == [1, 2] and stream.pending is None
    toggle.turn_on()
    latest = await asyncio.wait_for(admitted, timeout=0.1)
    assert latest is not None and latest['object']['spec']['v'] == 2


async def test_closing_while_waiting_for_readiness_admits_nothing() -> None:
    readiness = IndexingReadiness()
    readiness.expect('other stream')
    gate = IndexGate(settings=OperatorSettings(), deliver=deliver, readiness=readiness)
    closing = asyncio.Event()
    stream = Stream()
    admitted = asyncio.create_task(gate.admit('k', event(1), stream, closing))
    await asyncio.sleep(1)
    closing.set()
    stream.pressure.set()  # as the closing streams do
    assert await asyncio.wait_for(admitted, timeout=0.1) is None


async def test_the_stream_is_ready_once_its_initial_listing_is_indexed() -> None:
    readiness = IndexingReadiness()
    toggle = readiness.expect('this stream')
    indexer = Indexer()
    gate = IndexGate(settings=OperatorSettings(), deliver=deliver, indexer=indexer, readiness=readiness,
                     toggle=toggle)
    gate.listed('k1')
    gate.listed('k2')
    gate.listing_finished()
    assert not readiness.ready
    await gate._index('k1', event(1, type=None), Stream())
    assert not readiness.ready
    await gate._index('k2', event(2, type=None), Stream())
    assert readiness.ready


async def test_an_empty_initial_listing_makes_the_stream_ready_at_once() -> None:
    readiness = IndexingReadiness()
    toggle = readiness.expect('this stream')
    gate = IndexGate(settings=OperatorSettings(), deliver=deliver, indexer=Indexer(), readiness=readiness,
                     toggle=toggle)
    gate.listing_finished()
    assert readiness.ready
