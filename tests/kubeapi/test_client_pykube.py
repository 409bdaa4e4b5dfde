"""pykube-ng works against the emulator unchanged."""

from collections.abc import Iterator
from typing import Any

import pytest

pykube = pytest.importorskip('pykube')

CRD_BODY: dict[str, Any] = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': 'kopfexamples.kopf.dev'},
    'spec': {
        'group': 'kopf.dev',
        'scope': 'Namespaced',
        'names': {'plural': 'kopfexamples', 'singular': 'kopfexample', 'kind': 'KopfExample'},
        'versions': [{'name': 'v1', 'served': True, 'storage': True}],
    },
}


@pytest.fixture
def api(k8s_emulator) -> Iterator[Any]:
    api = pykube.HTTPClient(pykube.KubeConfig.from_file(str(k8s_emulator.kubeconfig_path)))
    yield api
    api.session.close()


def test_configmaps(api) -> None:
    configmap = pykube.ConfigMap(
        api,
        {
            'apiVersion': 'v1',
            'kind': 'ConfigMap',
            'metadata': {'name': 'cm1', 'labels': {'app': 'x'}},
            'data': {'a': 'b'},
        },
    )
    configmap.create()
    assert configmap.obj['metadata']['uid']

    configmap.obj['data']['c'] = 'd'
    configmap.update()
    configmap.reload()
    assert configmap.obj['data'] == {'a': 'b', 'c': 'd'}

    found = list(pykube.ConfigMap.objects(api, namespace='default').filter(selector={'app': 'x'}))
    assert [item.name for item in found] == ['cm1']
    assert configmap.exists()

    configmap.delete()
    assert not configmap.exists()


def test_watch(api) -> None:
    configmap = pykube.ConfigMap(api, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1'}})
    configmap.create()
    since = configmap.obj['metadata']['resourceVersion']
    configmap.patch({'data': {'x': 'y'}})
    configmap.delete()
    stream = pykube.ConfigMap.objects(api, namespace='default').watch(since=since)
    events = []
    for event in stream:
        events.append((event.type, event.object.name))
        if len(events) == 2:
            break
    assert events == [('MODIFIED', 'cm1'), ('DELETED', 'cm1')]


def test_custom_objects(api) -> None:
    pykube.object_factory(api, 'apiextensions.k8s.io/v1', 'CustomResourceDefinition')(api, CRD_BODY).create()
    kind = pykube.object_factory(api, 'kopf.dev/v1', 'KopfExample')
    obj = kind(
        api,
        {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex1'}, 'spec': {'a': 1}},
    )
    obj.create()
    obj.patch({'spec': {'b': 2}})
    assert obj.obj['spec'] == {'a': 1, 'b': 2}
    assert [item.name for item in kind.objects(api, namespace=pykube.all)] == ['kex1']
    obj.delete()
    assert not obj.exists()
