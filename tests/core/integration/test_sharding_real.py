"""
Sharding on the real kube-apiserver with the server-side sharded lists & watches (``ShardedListAndWatch``).

Two replicas (threads) split the ConfigMaps of a namespace of their own: the built-in resources' listings
echo the applied selector, so the replicas know (and say) that the server filters the objects for them.
The timings are shortened (leases of 2 s, renewed every 0.2 s); the waits are for the outcomes.
"""
import collections
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Literal

import pytest

import kopf
from kopf._core.engines.sharding import fair_share, shard_of

pytestmark = pytest.mark.real_apiserver

COUNT = 8
NAME = 'op'
CONFIRMED = 'The API server filters the objects of configmaps.v1 in {namespace!r} by the shards'

Handled = collections.Counter[tuple[str, str]]  # (replica, object name) -> how many times


@pytest.fixture()
def plane(k8s_control_plane: Any) -> Any:
    if not k8s_control_plane.feature_gates.get('ShardedListAndWatch'):
        pytest.skip('The control plane of the session has no ShardedListAndWatch (kube-apiserver < 1.36).')
    return k8s_control_plane


@pytest.fixture()
def namespace(plane: Any) -> Iterator[str]:
    name = f'shards-{uuid.uuid4().hex[:8]}'
    plane.kubectl('create', 'namespace', name)
    yield name
    plane.kubectl('delete', 'namespace', name, '--wait=false')


def kubectl_json(plane: Any, *args: str) -> Any:
    result = plane.kubectl(*args, '-o', 'json')
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def holders(plane: Any, namespace: str) -> dict[int, str]:
    leases = kubectl_json(plane, 'get', 'leases', '-n', namespace, '-l', f'kopf.dev/sharding={NAME}')['items']
    result: dict[int, str] = {}
    for lease in leases:
        name, holder = lease['metadata']['name'], lease.get('spec', {}).get('holderIdentity')
        if name.startswith(f'{NAME}-shard-') and holder:
            result[int(name.removeprefix(f'{NAME}-shard-'))] = holder
    return result


def settled(plane: Any, namespace: str, names: set[str]) -> dict[int, str] | Literal[False]:
    """The holders if all shards are held by these replicas only, each its fair share; else False."""
    shards = holders(plane, namespace)
    counts = collections.Counter(shards.values())
    fair = {name: fair_share(name, names, COUNT) for name in names}
    return shards if len(shards) == COUNT and counts == fair else False


def create_configmaps(plane: Any, namespace: str, names: list[str]) -> None:
    items = [{'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name, 'namespace': namespace}}
             for name in names]
    result = plane.kubectl('create', '-f', '-', input=json.dumps({'apiVersion': 'v1', 'kind': 'List',
                                                                  'items': items}))
    assert result.returncode == 0, result.stderr


def uids(plane: Any, namespace: str) -> dict[str, str]:
    items = kubectl_json(plane, 'get', 'configmaps', '-n', namespace)['items']
    return {item['metadata']['name']: item['metadata']['uid'] for item in items}


async def test_replicas_on_the_real_server_handle_every_object_exactly_once_and_hand_over_on_exit(
        plane: Any, namespace: str, settings_factory: Callable[[], kopf.OperatorSettings],
        threaded_operator: Any, eventually: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    lock = threading.Lock()
    handled: Handled = collections.Counter()

    def start(identity: str) -> Any:
        registry = kopf.OperatorRegistry()
        settings = settings_factory()
        settings.posting.enabled = False
        settings.sharding.name = NAME
        settings.sharding.namespace = namespace
        settings.sharding.count = COUNT
        settings.sharding.lease_duration = 2
        settings.sharding.renew_deadline = 1.2
        settings.sharding.retry_period = 0.2
        settings.sharding.handover_timeout = 2

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=plane.url, ca_path=str(plane.ca_path), token=plane.token)

        @kopf.on.create('configmaps', registry=registry)
        def created(name: str, **_: Any) -> None:
            with lock:
                handled[(identity, name)] += 1

        operator = threaded_operator(registry=registry, settings=settings, namespaces=[namespace],
                                    identity=identity, standalone=True)
        operator.thread.start()
        return operator

    first = [f'cm{index}' for index in range(200)]
    second = [f'cm{index}' for index in range(200, 300)]
    stays = start('stays')
    try:
        leaves = start('leaves')
        try:
            owners: dict[int, str] = await eventually(
                lambda: settled(plane, namespace, {'stays', 'leaves'}), within=20)
            create_configmaps(plane, namespace, first)
            await eventually(lambda: len(handled) == len(first), within=60)
            assert holders(plane, namespace) == owners
        finally:
            await leaves.stop(within=20)

        # Released on exit: taken over by the other replica within a few retry periods.
        await eventually(lambda: settled(plane, namespace, {'stays'}), within=5)
        create_configmaps(plane, namespace, second)
        await eventually(lambda: len(handled) == len(first) + len(second), within=60)
    finally:
        await stays.stop(within=20)

    assert set(handled.values()) == {1}  # every one once
    assert sorted(name for _, name in handled) == sorted(first + second)
    by_uid = uids(plane, namespace)
    for replica, name in handled:
        if name in first:
            assert owners[shard_of(by_uid[name], COUNT)] == replica, name
        else:
            assert replica == 'stays', name
    confirmed = CONFIRMED.format(namespace=namespace)
    assert len([r for r in caplog.records if r.getMessage().startswith(confirmed)
                and r.levelno == logging.INFO]) == 2  # once per replica, though rewatched on every change
