"""
Objects deleted while their creation is still being handled: retried, or running for the first time.
"""
import threading
import time
from collections.abc import Callable
from typing import Any

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]  # the conftest's factory of running operators (async context managers)
Eventually = Callable[..., Any]
Quiet = Callable[..., Any]

FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'


async def test_deletion_while_the_creation_is_retried(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    created: list[float] = []
    deleted: list[float] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(**_: Any) -> Any:
        created.append(time.monotonic())
        raise kopf.TemporaryError('not yet', delay=0.3)

    @kopf.on.delete('kopfexamples', registry=registry)
    def delete_fn(**_: Any) -> None:
        deleted.append(time.monotonic())

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: 'kopf.zalando.org/create_fn' in cluster.annotations())
        assert cluster.get()['metadata']['finalizers'] == [FINALIZER]
        deletion_requested = time.monotonic()
        await cluster.delete('kex1')
        await eventually(lambda: cluster.get() is None)
        await quiet()

    assert len(created) == 1
    assert created[0] < deletion_requested
    assert len(deleted) == 1


async def test_deletion_while_the_very_first_creation_handler_is_running(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet, gates: list[threading.Event],
) -> None:
    # Kopf 1.45.2 adds its finalizer (a separate patch) before it invokes the first handler,
    # so the deletion handlers are guaranteed to run even if the object is deleted meanwhile.
    gate = threading.Event()
    gates.append(gate)
    started = threading.Event()
    created: list[str] = []
    deleted: list[str] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(name: str, **_: Any) -> Any:
        started.set()
        gate.wait(timeout=10)
        created.append(name)
        return 'created'

    @kopf.on.delete('kopfexamples', registry=registry)
    def delete_fn(name: str, **_: Any) -> None:
        deleted.append(name)

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(started.is_set)
        finalizers_at_deletion = cluster.get()['metadata'].get('finalizers')
        await cluster.delete('kex1')
        gate.set()
        await eventually(lambda: cluster.get() is None)
        await eventually(lambda: created == ['kex1'])
        await quiet()
        await cluster.create('kex2')  # the operator stays alive and well after patching a gone object
        await eventually(lambda: 'kex2' in created)
        await quiet()

    assert deleted == ['kex1']
    assert finalizers_at_deletion == [FINALIZER]


async def test_changes_while_the_very_first_creation_handler_is_running(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet, gates: list[threading.Event],
) -> None:
    gate = threading.Event()
    gates.append(gate)
    started = threading.Event()
    calls: list[tuple[str, Any]] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(spec: Any, **_: Any) -> Any:
        started.set()
        gate.wait(timeout=10)
        calls.append(('create', spec['field']))
        return 'created'

    @kopf.on.update('kopfexamples', registry=registry)
    def update_fn(diff: Any, **_: Any) -> Any:
        calls.append(('update', tuple(diff)))
        return 'updated'

    @kopf.on.delete('kopfexamples', registry=registry)
    def delete_fn(**_: Any) -> None:
        pass

    async with operator(registry, settings):
        await cluster.create('kex1', {'field': 'old'})
        await eventually(started.is_set)
        await cluster.patch('kex1', {'spec': {'field': 'new'}, 'metadata': {'finalizers': ['example.com/x']}})
        gate.set()
        await eventually(lambda: bool((cluster.get() or {}).get('status', {}).get('update_fn')))
        await quiet()

    assert calls == [('create', 'old'), ('update', (('change', ('spec', 'field'), 'old', 'new'),))]
    assert cluster.get()['metadata']['finalizers'] == ['example.com/x', FINALIZER]
    assert cluster.get()['status'] == {'create_fn': 'created', 'update_fn': 'updated'}
    assert cluster.diffbase() == {'spec': {'field': 'new'}}
    assert cluster.progress_annotations() == {}

