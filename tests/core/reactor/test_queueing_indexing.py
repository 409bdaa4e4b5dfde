"""
The indexing in the per-object workers: the events are indexed before the processing, the stream's
readiness toggle goes on when its initial listing is indexed, the processing waits for the readiness.

The events are fed directly into the multiplexer (as the watcher does it), the time is looptime's.
"""
import asyncio
import logging
from typing import Any

import pytest

from kopf._clients.watching import Bookmark
from kopf._cogs.structs.bodies import RawEvent
from kopf._cogs.structs.references import Resource
from kopf._core.engines.indexing import IndexingReadiness
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.reactor.contexts import Delivery
from kopf._core.reactor.queueing import Forgetter, ObjectStreams

pytestmark = pytest.mark.looptime

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', namespaced=True)


def event(name: str, value: Any = None, *, type: str | None = 'MODIFIED') -> RawEvent:
    body = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
            'metadata': {'name': name, 'namespace': 'ns1', 'uid': f'uid-{name}'},
            'spec': {'value': value}}
    return {'type': type, 'object': body}  # type: ignore[typeddict-item]


class Recorder:
    """A processor or an indexer: remembers what it got (and when), takes some time, maybe fails."""

    def __init__(self, *, duration: float = 0, failing: bool = False) -> None:
        self.duration = duration
        self.failing = failing
        self.calls: list[tuple[float, str, Any]] = []

    async def __call__(self, delivery: Delivery) -> None:
        raw_event = delivery.raw_event
        body = raw_event['object']
        now = asyncio.get_running_loop().time()
        self.calls.append((now, body['metadata']['name'], body['spec']['value']))
        await asyncio.sleep(self.duration)
        if self.failing:
            raise RuntimeError('boom')

    def values(self, name: str) -> list[Any]:
        return [value for _, obj, value in self.calls if obj == name]


@pytest.fixture
def settings() -> OperatorSettings:
    settings = OperatorSettings()
    settings.queueing.batch_window = 0.1
    settings.queueing.idle_timeout = 5
    settings.queueing.exit_timeout = 2
    return settings


def make_streams(settings: OperatorSettings, *, processor: Recorder, indexer: Recorder | None,
                 readiness: IndexingReadiness, limit: int | None = None,
                 forgetter: Forgetter | None = None) -> ObjectStreams:
    toggle = readiness.expect('kopfexamples in ns1') if indexer is not None else None
    return ObjectStreams(processor=processor, resource=KEX, namespace='ns1', settings=settings,
                         limiter=asyncio.Semaphore(limit) if limit is not None else None,
                         indexer=indexer, readiness=readiness, toggle=toggle, forgetter=forgetter)


async def test_the_initial_listing_is_indexed_before_anything_is_processed(
        settings: OperatorSettings, looptime: float) -> None:
    readiness = IndexingReadiness()
    processor, indexer = Recorder(), Recorder(duration=1)
    streams = make_streams(settings, processor=processor, indexer=indexer, readiness=readiness, limit=1)
    streams.feed(event('kex1', 'a', type=None))
    streams.feed(event('kex2', 'b', type=None))
    await asyncio.sleep(5)
    assert not readiness.ready  # the listing is not over yet: more objects can come
    assert indexer.values('kex1') == ['a'] and indexer.values('kex2') == ['b']
    assert processor.calls == []

    streams.feed(Bookmark.LISTED)
    await asyncio.sleep(0.01)
    assert readiness.ready
    await asyncio.sleep(1)
    assert sorted(name for _, name, _ in processor.calls) == ['kex1', 'kex2']
    await streams.close()


async def test_an_empty_listing_is_ready_at_once(settings: OperatorSettings, looptime: float) -> None:
    readiness = IndexingReadiness()
    streams = make_streams(settings, processor=Recorder(), indexer=Recorder(), readiness=readiness)
    streams.feed(Bookmark.LISTED)
    assert readiness.ready
    await streams.close()


async def test_the_readiness_waits_for_the_slowest_stream(
        settings: OperatorSettings, looptime: float) -> None:
    readiness = IndexingReadiness()
    indexer = Recorder()
    streams = make_streams(settings, processor=Recorder(), indexer=indexer, readiness=readiness)
    other_stream = readiness.expect('pods in ns1')  # e.g. another resource: indexed in 3 seconds
    streams.feed(event('kex1', 'a', type=None))
    streams.feed(Bookmark.LISTED)
    await asyncio.sleep(0.01)
    assert not readiness.ready
    await asyncio.sleep(3)
    other_stream.turn_on()
    assert readiness.ready
    await streams.close()


async def test_newer_events_are_indexed_while_waiting_and_only_the_latest_is_processed(
        settings: OperatorSettings, looptime: float) -> None:
    readiness = IndexingReadiness()
    processor, indexer = Recorder(), Recorder()
    other_stream = readiness.expect('pods in ns1')
    streams = make_streams(settings, processor=processor, indexer=indexer, readiness=readiness)
    streams.feed(event('kex1', 'listed', type=None))
    streams.feed(Bookmark.LISTED)
    for value in ['second', 'third']:
        await asyncio.sleep(1)
        streams.feed(event('kex1', value))
    await asyncio.sleep(1)
    assert indexer.values('kex1') == ['listed', 'second', 'third']
    assert processor.calls == []

    other_stream.turn_on()
    await asyncio.sleep(1)
    assert processor.values('kex1') == ['third']
    await streams.close()


async def test_the_relistings_after_the_readiness_do_not_matter(
        settings: OperatorSettings, looptime: float) -> None:
    readiness = IndexingReadiness()
    processor, indexer = Recorder(), Recorder()
    streams = make_streams(settings, processor=processor, indexer=indexer, readiness=readiness)
    streams.feed(Bookmark.LISTED)
    late_stream = readiness.expect('pods in ns2')  # after the readiness: nobody waits for it
    streams.feed(event('kex1', 'relisted', type=None))
    await asyncio.sleep(1)
    assert processor.values('kex1') == ['relisted']
    late_stream.drop()
    await streams.close()


async def test_indexing_failures_are_logged_and_do_not_block_the_readiness(
        settings: OperatorSettings, looptime: float, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    readiness = IndexingReadiness()
    processor = Recorder()
    streams = make_streams(settings, processor=processor, indexer=Recorder(failing=True), readiness=readiness)
    streams.feed(event('kex1', 'a', type=None))
    streams.feed(Bookmark.LISTED)
    await asyncio.sleep(1)
    assert readiness.ready
    assert processor.values('kex1') == ['a']
    assert "Indexing has failed with an unexpected error: RuntimeError('boom')" in caplog.text
    await streams.close()


async def test_closing_while_waiting_for_the_readiness_exits_at_once(
        settings: OperatorSettings, looptime: float) -> None:
    readiness = IndexingReadiness()
    processor = Recorder()
    readiness.expect('pods in ns1')  # never ready
    streams = make_streams(settings, processor=processor, indexer=None, readiness=readiness)
    streams.feed(event('kex1', 'a', type=None))
    streams.feed(Bookmark.LISTED)
    await asyncio.sleep(1)
    await streams.close(exit_timeout=10)
    assert looptime == 1
    assert processor.calls == []
    assert streams.active_count == 0


async def test_deletions_of_indexed_objects_are_indexed_not_forgotten_without_workers(
        settings: OperatorSettings, looptime: float) -> None:
    # The indices must see the deletion, in order with the object's other events: only a worker does so.
    forgotten: list[str] = []

    def forgetter(*, raw_event: RawEvent, resource: Resource) -> bool:
        forgotten.append(raw_event['object']['metadata']['name'])
        return True

    readiness = IndexingReadiness()
    processor, indexer = Recorder(), Recorder()
    streams = make_streams(settings, processor=processor, indexer=indexer, readiness=readiness,
                           forgetter=forgetter)
    streams.feed(event('kex1', 'a', type=None))
    streams.feed(Bookmark.LISTED)
    await asyncio.sleep(1)
    assert streams.active_count == 0
    streams.feed(event('kex1', 'gone', type='DELETED'))
    await asyncio.sleep(1)
    assert forgotten == []
    assert indexer.values('kex1') == ['a', 'gone']
    assert processor.values('kex1') == ['a', 'gone']
    await streams.close()


async def test_changes_with_no_worker_wait_for_the_readiness_before_being_settled(
        settings: OperatorSettings, looptime: float) -> None:
    # E.g. the timers' echoes: shown to them with no worker, but only once nothing waits for the indices.
    asked: list[Any] = []

    def forgetter(*, raw_event: RawEvent, resource: Resource) -> bool:
        asked.append(raw_event['object']['spec']['value'])
        return raw_event['type'] == 'MODIFIED'

    readiness = IndexingReadiness()
    toggle = readiness.expect('kopfexamples of another stream')  # not ready until turned on
    processor = Recorder()
    streams = make_streams(settings, processor=processor, indexer=None, readiness=readiness,
                           forgetter=forgetter)
    streams.feed(event('kex1', 'a'))  # waits in its worker for the readiness
    await asyncio.sleep(1)
    assert asked == []
    assert processor.values('kex1') == []
    toggle.turn_on()
    await asyncio.sleep(1)
    assert processor.values('kex1') == ['a']
    assert streams.active_count == 0
    streams.feed(event('kex1', 'b'))  # nothing to wait for now: settled with no worker
    assert asked == ['b']
    await asyncio.sleep(1)
    assert processor.values('kex1') == ['a']
    await streams.close()
