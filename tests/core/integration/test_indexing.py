"""
Indexing in whole operators against the emulator: the indices are complete before the first handler
of any resource, they follow the objects, they are in the kwargs of all kinds of handlers.

The embedded operators get their own ``kopf.OperatorIndexers`` to look at the indices from outside.
"""
import asyncio
import logging
from typing import Any

import aiohttp
import pytest

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Any  # the conftest's factory of running operators (async context managers)
Eventually = Any

CONFIGMAPS = '/api/v1/namespaces/default/configmaps'


async def create_many(cluster: Cluster, count: int, *, namespace: str = 'default',
                      prefix: str = 'kex') -> None:
    names = [f'{prefix}{i:04d}' for i in range(count)]
    for start in range(0, count, 50):  # not all at once: the emulator is a single thread
        await asyncio.gather(*[cluster.create(name, namespace=namespace) for name in names[start:start + 50]])


async def create_configmap(cluster: Cluster, name: str, *, namespace: str = 'default') -> None:
    await cluster.request('POST', f'/api/v1/namespaces/{namespace}/configmaps',
                          {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name}, 'data': {}})


def contents(index: kopf.Index[Any, Any]) -> dict[Any, list[Any]]:
    return {key: sorted(store, key=repr) for key, store in index.items()}


async def test_indices_are_complete_before_the_first_handlers_of_any_resource(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually,
) -> None:
    count = 500
    await create_many(cluster, count)
    await create_configmap(cluster, 'cm1')
    # The objects of the index come late: the handlers of the configmaps would run long before them.
    cluster.emulator.add_latency(0.5, count=1, verb='list', path='/kopfexamples')
    settings.queueing.worker_limit = 3  # fewer than the objects waiting for the index: no deadlock
    seen: dict[str, int] = {}

    @kopf.index('kopfexamples', registry=registry)
    def kex_names(name: str, **_: Any) -> Any:
        return name

    @kopf.on.event('configmaps', registry=registry)
    def cm_event(kex_names: kopf.Index[None, str], **_: Any) -> None:
        seen.setdefault('cm_event', len(kex_names.get(None, [])))

    @kopf.on.create('configmaps', registry=registry)
    def cm_create(kex_names: kopf.Index[None, str], **_: Any) -> None:
        seen.setdefault('cm_create', len(kex_names.get(None, [])))

    # The same resource as the index's: its handlers wait too, but its indexing does not.
    @kopf.on.event('kopfexamples', registry=registry)
    def kex_event(kex_names: kopf.Index[None, str], **_: Any) -> None:
        seen.setdefault('kex_event', len(kex_names.get(None, [])))

    async with operator(registry, settings):
        await eventually(lambda: len(seen) == 3, within=20)
    assert seen == {'cm_event': count, 'cm_create': count, 'kex_event': count}


async def test_failing_listings_keep_the_handlers_waiting_until_indexed(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, caplog: pytest.LogCaptureFixture,
) -> None:
    await create_many(cluster, 10)
    await create_configmap(cluster, 'cm1')
    cluster.emulator.fail_requests(3, status=403, verb='list', path='/kopfexamples')
    seen: list[int] = []

    @kopf.index('kopfexamples', registry=registry)
    def kex_names(name: str, **_: Any) -> Any:
        return name

    @kopf.on.event('configmaps', registry=registry)
    def cm_event(kex_names: kopf.Index[None, str], **_: Any) -> None:
        seen.append(len(kex_names.get(None, [])))

    async with operator(registry, settings):
        await eventually(lambda: bool(seen), within=10)
    assert seen[0] == 10
    assert 'Watcher for kopfexamples.v1.kopf.dev@default has failed' in caplog.text


async def test_additions_changes_deletions_and_filters_are_followed(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually,
) -> None:
    indexers = kopf.OperatorIndexers()

    @kopf.index('kopfexamples', labels={'indexed': 'yes'}, registry=registry)
    def by_field(name: str, spec: kopf.Spec, **_: Any) -> Any:
        return {spec.get('field'): name}

    await cluster.create('kex1', {'field': 'a'}, metadata={'labels': {'indexed': 'yes'}})
    async with operator(registry, settings, indexers=indexers):
        index = indexers.indices['by_field']
        assert index is indexers['by_field']
        await eventually(lambda: contents(index) == {'a': ['kex1']})

        await cluster.create('kex2', {'field': 'a'}, metadata={'labels': {'indexed': 'yes'}})
        await cluster.create('kex3', {'field': 'b'}, metadata={'labels': {'indexed': 'no'}})
        await eventually(lambda: contents(index) == {'a': ['kex1', 'kex2']})

        await cluster.patch('kex1', {'spec': {'field': 'c'}})
        await eventually(lambda: contents(index) == {'a': ['kex2'], 'c': ['kex1']})

        await cluster.patch('kex2', {'metadata': {'labels': {'indexed': 'no'}}})  # stops matching
        await cluster.patch('kex3', {'metadata': {'labels': {'indexed': 'yes'}}})  # starts matching
        await eventually(lambda: contents(index) == {'b': ['kex3'], 'c': ['kex1']})

        await cluster.delete('kex1')
        await eventually(lambda: contents(index) == {'b': ['kex3']})
    assert contents(indexers['by_field']) == {'b': ['kex3']}  # still readable after the exit


async def test_indices_in_the_kwargs_of_all_kinds_of_handlers(
        emulator: Any, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, caplog: pytest.LogCaptureFixture,
) -> None:
    registry = kopf.OperatorRegistry()  # with our own login handler, to see its kwargs
    indexers = kopf.OperatorIndexers()
    seen: dict[str, Any] = {}

    @kopf.index('kopfexamples', registry=registry)
    def kex_names(name: str, **_: Any) -> Any:
        return name

    @kopf.index('configmaps', id='cm-names', registry=registry)
    def configmap_names(name: str, **_: Any) -> Any:
        return {name: True}

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo:
        seen.setdefault('login', kwargs)
        return kopf.ConnectionInfo(server=emulator.url)

    @kopf.on.startup(registry=registry)
    def startup(**kwargs: Any) -> None:
        seen['startup'] = kwargs

    @kopf.on.cleanup(registry=registry)
    def cleanup(**kwargs: Any) -> None:
        seen['cleanup'] = kwargs

    @kopf.on.probe(registry=registry)
    def probe(kex_names: kopf.Index[None, str], **_: Any) -> Any:
        return sorted(kex_names[None])

    @kopf.on.event('kopfexamples', registry=registry)
    def event_fn(**kwargs: Any) -> None:
        seen.setdefault('event', kwargs)

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(**kwargs: Any) -> None:
        seen.setdefault('create', kwargs)

    @kopf.on.update('kopfexamples', field='spec.field', registry=registry)
    def update_fn(**kwargs: Any) -> None:
        seen.setdefault('update', kwargs)

    @kopf.on.event('kopfexamples', registry=registry)
    def event_with_own_kwarg(kex_names: Any, **_: Any) -> None:
        seen.setdefault('kex_names_in_event', kex_names)

    await create_configmap(cluster, 'cm1')
    async with operator(registry, settings, indexers=indexers, liveness_endpoint='http://127.0.0.1:0/healthz'):
        await cluster.create('kex1')
        await eventually(lambda: 'create' in seen)
        await cluster.patch('kex1', {'spec': {'field': 'changed'}})
        await eventually(lambda: 'update' in seen)
        # The probes as the liveness endpoint reports them (the endpoint's URL is in the logs).
        [url] = [message.split()[-1] for message in caplog.messages
                 if message.startswith('Serving the liveness endpoint at ')]
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 200
            assert await response.json() == {'probe': ['kex1']}

    for kind in ['login', 'startup', 'cleanup', 'event', 'create', 'update']:
        assert seen[kind]['kex_names'] is indexers['kex_names'], kind
        assert seen[kind]['cm-names'] is indexers['cm-names'], kind
    assert contents(seen['create']['cm-names']) == {'cm1': [True]}
    assert contents(seen['cleanup']['kex_names']) == {None: ['kex1']}


async def test_the_indices_override_the_framework_kwargs(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually,
) -> None:
    seen: list[Any] = []

    @kopf.index('kopfexamples', id='name', registry=registry)
    def names(meta: kopf.Meta, **_: Any) -> Any:
        return meta.name  # the kwarg "name" is the index itself here too

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(name: Any, **_: Any) -> None:
        seen.append(name)

    await cluster.create('kex1')
    async with operator(registry, settings):
        await eventually(lambda: bool(seen))
    assert isinstance(seen[0], kopf.Index)
    assert list(seen[0][None]) == ['kex1']


async def test_failing_indexing_functions_do_not_stop_the_operator(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, caplog: pytest.LogCaptureFixture,
) -> None:
    indexers = kopf.OperatorIndexers()
    created: list[str] = []

    @kopf.index('kopfexamples', registry=registry)
    def idx(name: str, spec: kopf.Spec, **_: Any) -> Any:
        if spec.get('field') == 'bad':
            raise ValueError(f'Cannot index {name}.')
        return name

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(name: str, **_: Any) -> None:
        created.append(name)

    await cluster.create('kex1', {'field': 'bad'})
    await cluster.create('kex2', {'field': 'good'})
    async with operator(registry, settings, indexers=indexers):
        await eventually(lambda: sorted(created) == ['kex1', 'kex2'])
        assert contents(indexers['idx']) == {None: ['kex2']}
        await cluster.patch('kex1', {'spec': {'field': 'fixed'}})  # retried on the next event
        await eventually(lambda: contents(indexers['idx']) == {None: ['kex1', 'kex2']})
    assert "Indexer 'idx' failed with an exception and will ignore it: Cannot index kex1." in caplog.text


async def test_unknown_resources_are_reported_and_not_waited_for(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, caplog: pytest.LogCaptureFixture,
) -> None:
    indexers = kopf.OperatorIndexers()
    created: list[str] = []

    @kopf.index('nonexistents.example.com', registry=registry)
    def ghosts(name: str, **_: Any) -> Any:
        return name

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(name: str, ghosts: kopf.Index[None, str], **_: Any) -> None:
        created.append(name)

    await cluster.create('kex1')
    async with operator(registry, settings, indexers=indexers):
        await eventually(lambda: created == ['kex1'])
        assert dict(indexers['ghosts']) == {}
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any(message.startswith("Index 'ghosts' stays empty while its resource is not in the cluster: ")
               and "'nonexistents'" in message for message in warnings), warnings


async def test_late_namespaces_do_not_stop_the_running_handlers(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually,
) -> None:
    indexers = kopf.OperatorIndexers()
    created: list[tuple[str, int]] = []

    @kopf.index('kopfexamples', registry=registry)
    def kex_names(namespace: str, name: str, **_: Any) -> Any:
        return {namespace: name}

    @kopf.on.create('configmaps', registry=registry)
    def create_fn(name: str, kex_names: kopf.Index[str, str], **_: Any) -> None:
        created.append((name, len(kex_names)))

    await cluster.create('kex1')
    async with operator(registry, settings, indexers=indexers, namespaces=['default', 'late-*']):
        await create_configmap(cluster, 'cm1')
        await eventually(lambda: created == [('cm1', 1)])

        # The late namespace's listing is slow, but the existing objects' handlers do not wait for it.
        cluster.emulator.add_latency(3.0, count=1, verb='list', path='/namespaces/late-1/kopfexamples')
        await cluster.create_namespace('late-1')
        await cluster.create('kex2', namespace='late-1')
        await eventually(lambda: cluster.count('list', namespace='late-1') > 0)  # the listing has started
        await create_configmap(cluster, 'cm2')
        await eventually(lambda: len(created) == 2, within=2)
        assert created[1] == ('cm2', 1)

        await eventually(lambda: contents(indexers['kex_names']) == {'default': ['kex1'], 'late-1': ['kex2']})
