"""
The floor of ``benchmarks/core_handling.py`` (``benchmarks/floor_client.py``) against the framework.

The floor is a hand-written client that must make exactly the requests per object that the
framework makes, and leave the same things on the cluster; otherwise, the benchmark compares
the framework with something that does other work. So both handle the same objects (the
framework in one namespace, the floor in another), and their PATCHes per object and the stored
objects are compared. If the framework's requests change, the floor must follow.
"""
import asyncio
import pathlib
import signal
import sys
from collections.abc import Callable
from typing import Any

import pytest

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]  # the conftest's factory of running operators (async context managers)
Eventually = Callable[..., Any]
Quiet = Callable[..., Any]

FLOOR_CLIENT = pathlib.Path(__file__).resolve().parents[3] / 'benchmarks' / 'floor_client.py'
FLOOR_NAMESPACE = 'floor'
OBJECTS: dict[str, dict[str, Any]] = {
    'kex1': {'spec': {'field': 'value'}},
    'kex2': {'spec': {'field': 'other', 'items': [1, 2]},
             'metadata': {'labels': {'app': 'x'}, 'annotations': {'note': 'kept'}}},
}


def patches(cluster: Cluster, namespace: str) -> dict[str, tuple[int, int]]:
    """The PATCH requests to each object: to the object itself, to its status."""
    return {name: (cluster.count('patch', name, namespace=namespace, subresource=''),
                   cluster.count('patch', name, namespace=namespace, subresource='status'))
            for name in OBJECTS}


def stored(cluster: Cluster, name: str, namespace: str) -> dict[str, Any]:
    """What the handling leaves on an object (without the fields that differ by the object's identity)."""
    body = cluster.get(name, namespace=namespace) or {}
    metadata = body.get('metadata', {})
    return {'annotations': metadata.get('annotations'), 'labels': metadata.get('labels'),
            'finalizers': metadata.get('finalizers'), 'status': body.get('status'), 'spec': body.get('spec')}


def handled(cluster: Cluster, namespace: str) -> bool:
    return all('create_fn' in (stored(cluster, name, namespace)['status'] or {}) for name in OBJECTS)


async def start_the_floor(cluster: Cluster, *options: str) -> asyncio.subprocess.Process:
    """The same objects in two namespaces: for the framework, and for the floor client (started here)."""
    await cluster.create_namespace(FLOOR_NAMESPACE)
    for namespace in ('default', FLOOR_NAMESPACE):
        for name, parts in OBJECTS.items():
            await cluster.create(name, parts['spec'], namespace=namespace, metadata=parts.get('metadata'))
    return await asyncio.create_subprocess_exec(
        sys.executable, str(FLOOR_CLIENT), '--server', cluster.emulator.url, '--namespace', FLOOR_NAMESPACE,
        *options)


@pytest.mark.parametrize('client', ['aiohttp', 'lean'])  # the floor and the lean floor
@pytest.mark.parametrize('deletion', [False, True], ids=['create_only', 'create_delete'])
async def test_the_floor_makes_the_frameworks_requests_and_writes(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet, deletion: bool, client: str,
) -> None:

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(**_: Any) -> Any:
        return {'message': 'hello'}

    if deletion:
        @kopf.on.delete('kopfexamples', registry=registry)
        def delete_fn(**_: Any) -> None:
            pass

    floor = await start_the_floor(cluster, '--client', client, *(['--delete-handler'] if deletion else []))
    try:
        async with operator(registry, settings):
            await eventually(lambda: handled(cluster, 'default') and handled(cluster, FLOOR_NAMESPACE))
            await quiet()
            assert patches(cluster, FLOOR_NAMESPACE) == patches(cluster, 'default')
            assert set(patches(cluster, 'default').values()) == {(2, 1) if deletion else (1, 1)}
            for name in OBJECTS:
                assert stored(cluster, name, FLOOR_NAMESPACE) == stored(cluster, name, 'default')

            if deletion:
                for namespace in ('default', FLOOR_NAMESPACE):
                    for name in OBJECTS:
                        await cluster.delete(name, namespace=namespace)
                await eventually(lambda: not any(cluster.get(name, namespace=namespace) for name in OBJECTS
                                                 for namespace in ('default', FLOOR_NAMESPACE)))
                await quiet()
                assert patches(cluster, FLOOR_NAMESPACE) == patches(cluster, 'default')
                assert set(patches(cluster, 'default').values()) == {(3, 1)}
    finally:
        if floor.returncode is None:
            floor.send_signal(signal.SIGINT)
        exit_code = await asyncio.wait_for(floor.wait(), timeout=10)
    assert exit_code == 0


@pytest.mark.parametrize('client', ['aiohttp', 'lean'])
async def test_the_floors_timers_make_the_frameworks_requests_and_writes(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, client: str,
) -> None:
    ticks: dict[str, int] = {}

    # As in benchmarks/operators/timer.py: a per-object counter in the status at every tick.
    @kopf.timer('kopfexamples', interval=0.2, registry=registry)
    def timer_fn(name: str, patch: kopf.Patch, **_: Any) -> None:
        ticks[name] = ticks.get(name, 0) + 1
        patch.status['tick'] = ticks[name]

    def ticked(namespace: str, at_least: int) -> bool:
        return all((stored(cluster, name, namespace)['status'] or {}).get('tick', 0) >= at_least
                   for name in OBJECTS)

    floor = await start_the_floor(cluster, '--client', client, '--timer', '0.2')
    try:
        async with operator(registry, settings):
            await eventually(lambda: ticked('default', 3) and ticked(FLOOR_NAMESPACE, 3))
            for namespace in ('default', FLOOR_NAMESPACE):
                for name in OBJECTS:
                    # The finalizer once, then only the status at every tick.
                    assert cluster.count('patch', name, namespace=namespace, subresource='') == 1
                    assert cluster.count('patch', name, namespace=namespace, subresource='status') >= 3
            for name in OBJECTS:
                ours, floors = stored(cluster, name, 'default'), stored(cluster, name, FLOOR_NAMESPACE)
                assert {**ours, 'status': set(ours['status'])} == {**floors, 'status': set(floors['status'])}
    finally:
        if floor.returncode is None:
            floor.send_signal(signal.SIGINT)
        exit_code = await asyncio.wait_for(floor.wait(), timeout=10)
    assert exit_code == 0
