"""
The per-object serialisation of the handling, and the parallelism across the objects (the worker limit).
"""
import threading
from collections.abc import Callable
from typing import Any

import pytest

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]  # the conftest's factory of running operators (async context managers)
Eventually = Callable[..., Any]
Quiet = Callable[..., Any]


class Concurrency:
    """Tracks how many handlers run at the same time (now, and at most)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.highest = 0

    def __enter__(self) -> None:
        with self.lock:
            self.active += 1
            self.highest = max(self.highest, self.active)

    def __exit__(self, *_: Any) -> None:
        with self.lock:
            self.active -= 1


async def test_rapid_updates_of_one_object_are_handled_serially_and_the_latest_wins(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet, gates: list[threading.Event],
) -> None:
    gate = threading.Event()
    gates.append(gate)
    concurrency = Concurrency()
    handled: list[Any] = []

    @kopf.on.update('kopfexamples', registry=registry)
    def update_fn(spec: Any, **_: Any) -> None:
        with concurrency:
            handled.append(spec['field'])
            gate.wait(timeout=10)  # slow: until the test has made all its changes

    async with operator(registry, settings):
        await cluster.create('kex1', {'field': 0})
        await eventually(lambda: cluster.diffbase() is not None)
        await cluster.patch('kex1', {'spec': {'field': 1}})
        await eventually(lambda: len(handled) == 1)  # and it is blocked now
        for value in range(2, 11):
            await cluster.patch('kex1', {'spec': {'field': value}})
        await quiet()  # all the changes have arrived while the handler is busy
        gate.set()
        await eventually(lambda: cluster.diffbase() == {'spec': {'field': 10}})
        await quiet()

    assert concurrency.highest == 1
    assert handled == [1, 10]  # the first change, then all the others at once as the latest state
    assert cluster.progress_annotations() == {}


@pytest.mark.parametrize('worker_limit, expected', [(2, 2), (None, 4)])
async def test_different_objects_are_handled_in_parallel_up_to_the_worker_limit(
        worker_limit: int | None, expected: int,
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet, gates: list[threading.Event],
) -> None:
    gate = threading.Event()
    gates.append(gate)
    concurrency = Concurrency()
    handled: list[str] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(name: str, **_: Any) -> None:
        with concurrency:
            gate.wait(timeout=10)
            handled.append(name)

    settings.queueing.worker_limit = worker_limit
    async with operator(registry, settings):
        for name in ['kex1', 'kex2', 'kex3', 'kex4']:
            await cluster.create(name)
        await eventually(lambda: concurrency.active == expected)
        await quiet()  # give the others a chance to start, if they wrongly could
        assert concurrency.active == expected
        gate.set()
        await eventually(lambda: len(handled) == 4)
        await eventually(lambda: all(cluster.diffbase(name) is not None for name in handled))
        await quiet()

    assert concurrency.highest == expected
    assert sorted(handled) == ['kex1', 'kex2', 'kex3', 'kex4']
