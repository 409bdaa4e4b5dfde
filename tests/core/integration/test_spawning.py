"""
The spawning engine by itself (no operator, no API): its costs for many idle objects; pausing & resuming.

The handlers here make no API calls (no patches, no results), so no cluster is needed.
"""
import asyncio
import gc
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import pytest

import kopf
from kopf._clients.vault import Vault
from kopf._cogs.structs.bodies import RawBody
from kopf._cogs.structs.references import Resource
from kopf._core.actions.loggers import LocalObjectLogger
from kopf._core.engines.spawning import SpawningEngine
from kopf._core.reactor.inventory import ResourceMemories

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', namespaced=True)


def make_body(index: int, **metadata: Any) -> RawBody:
    body = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'spec': {'field': index},
            'metadata': {'name': f'kex{index}', 'namespace': 'default', 'uid': f'uid-{index}', **metadata}}
    return body  # type: ignore[return-value]

pytestmark = pytest.mark.usefixtures('background_settings')



@pytest.fixture
async def vault() -> AsyncIterator[Vault]:
    vault = Vault()
    yield vault
    await vault.close()


@pytest.fixture
async def engine(registry: kopf.OperatorRegistry, vault: Vault) -> AsyncIterator[SpawningEngine]:
    engine = SpawningEngine(registry=registry, settings=kopf.OperatorSettings(), vault=vault)
    yield engine
    await engine.shutdown()


def feed(engine: SpawningEngine, memories: ResourceMemories, body: RawBody, *, gone: bool = False) -> None:
    """Give the engine an event of the object, as the processing does."""
    memory = memories.recall(body)
    engine.process(memory=memory, resource=KEX, raw_body=body, gone=gone,
                   logger=LocalObjectLogger(body=body, settings=engine.settings))


async def test_idle_timers_of_many_objects_cost_no_tasks_and_little_memory(
        registry: kopf.OperatorRegistry, engine: SpawningEngine) -> None:

    @kopf.timer('kopfexamples', registry=registry, interval=60, initial_delay=60)
    def every_minute(**_: Any) -> None:
        raise AssertionError('Must not be called in this test.')

    memories = ResourceMemories()
    bodies = [make_body(index) for index in range(1000)]
    tasks_before = len(asyncio.all_tasks())
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for body in bodies:
            feed(engine, memories, body)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert engine.timers.scheduled == 1000
    assert engine.timers.running == 0
    assert len(asyncio.all_tasks()) == tasks_before  # one wake-up handle in the loop, no tasks per timer
    per_object = (after - before) / len(bodies)  # incl. the memories themselves and the per-object memos
    assert per_object < 3000, f'{per_object} bytes per object'

    # The next events of the objects do not add anything.
    for body in bodies:
        feed(engine, memories, body)
    assert engine.timers.scheduled == 1000
    assert len(asyncio.all_tasks()) == tasks_before

    # The deleted objects are forgotten, their timers stop.
    for body in bodies:
        feed(engine, memories, body, gone=True)
    assert engine.timers.scheduled == 0
    assert all(memory.spawns is None for memory in memories)


async def test_many_due_timers_run_as_tasks_only_while_called(
        registry: kopf.OperatorRegistry, engine: SpawningEngine) -> None:
    calls: list[str] = []
    gate = asyncio.Event()

    @kopf.timer('kopfexamples', registry=registry, interval=60)
    async def hourly(name: str, **_: Any) -> None:
        calls.append(name)
        await gate.wait()

    memories = ResourceMemories()
    tasks_before = len(asyncio.all_tasks())
    for index in range(100):
        feed(engine, memories, make_body(index))
    deadline = time.monotonic() + 5
    while len(calls) < 100:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert engine.timers.running == 100
    gate.set()
    while engine.timers.running:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert len(asyncio.all_tasks()) == tasks_before
    assert engine.timers.scheduled == 100


async def test_pausing_stops_everything_and_resuming_restarts_it_as_new(
        registry: kopf.OperatorRegistry, engine: SpawningEngine) -> None:
    events: list[Any] = []
    ticks: list[float] = []

    @kopf.daemon('kopfexamples', registry=registry)
    async def monitor(stopped: kopf.DaemonStopped, **_: Any) -> None:
        events.append('started')
        await stopped.wait()
        events.append(stopped.reason)

    @kopf.timer('kopfexamples', registry=registry, interval=0.02)
    async def ticker(**_: Any) -> None:
        ticks.append(time.monotonic())

    memories = ResourceMemories()
    feed(engine, memories, make_body(1))
    deadline = time.monotonic() + 5
    while not (events == ['started'] and len(ticks) >= 2):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)

    await engine.pause()
    assert events == ['started', kopf.DaemonStoppingReason.OPERATOR_PAUSING]
    paused_at = time.monotonic()
    feed(engine, memories, make_body(1))  # events while paused spawn nothing
    await asyncio.sleep(0.2)
    assert [tick for tick in ticks if tick > paused_at] == []
    assert events == ['started', kopf.DaemonStoppingReason.OPERATOR_PAUSING]

    engine.resume()
    while not (len(events) == 3 and [tick for tick in ticks if tick > paused_at]):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert events[2] == 'started'

    await engine.shutdown()
    assert events[3] == kopf.DaemonStoppingReason.OPERATOR_EXITING


async def test_shared_memories_from_a_previous_engine_are_not_reused(
        registry: kopf.OperatorRegistry, vault: Vault) -> None:
    starts: list[str] = []

    @kopf.daemon('kopfexamples', registry=registry)
    async def monitor(stopped: kopf.DaemonStopped, **_: Any) -> None:
        starts.append('started')
        await stopped.wait()

    memories = ResourceMemories()
    for generation in [1, 2]:  # two operators, one after another, with the same memories
        engine = SpawningEngine(registry=registry, settings=kopf.OperatorSettings(), vault=vault)
        feed(engine, memories, make_body(1))
        feed(engine, memories, make_body(1))
        deadline = time.monotonic() + 5
        while len(starts) < generation:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # a chance for the wrong duplicates (if any) to start
        await engine.shutdown()
    assert starts == ['started', 'started']
