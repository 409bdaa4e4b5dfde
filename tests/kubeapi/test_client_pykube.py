"""
pykube-ng works unchanged against any API server (the ``k8s_api`` switch).

The emulator by default, the real control plane in tox's ``realapi`` env: the same calls, the same results.
Each test has its own namespace; the CRD is the examples' one, shared by the tests of a real server.
"""

import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from .._waiting import wait_until

pykube = pytest.importorskip('pykube')

pytestmark = pytest.mark.kube_api

CRD_BODY: dict[str, Any] = yaml.safe_load(
    (pathlib.Path(__file__).resolve().parents[2] / 'examples' / 'crd.yaml').read_text()
)


@pytest.fixture
def api(k8s_api: Any) -> Iterator[Any]:
    api = pykube.HTTPClient(pykube.KubeConfig.from_file(str(k8s_api.kubeconfig_path)))
    yield api
    api.session.close()


@pytest.fixture
def namespace(api: Any) -> Iterator[str]:
    name = f'pykube-{uuid.uuid4().hex[:8]}'
    obj = pykube.Namespace(api, {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}})
    obj.create()
    yield name
    obj.delete()  # on a real server without controllers, it stays Terminating: no matter


def test_configmaps(api, namespace: str) -> None:
    configmap = pykube.ConfigMap(
        api,
        {
            'apiVersion': 'v1',
            'kind': 'ConfigMap',
            'metadata': {'name': 'cm1', 'namespace': namespace, 'labels': {'app': 'x'}},
            'data': {'a': 'b'},
        },
    )
    configmap.create()
    assert configmap.obj['metadata']['uid']

    configmap.obj['data']['c'] = 'd'
    configmap.update()
    configmap.reload()
    assert configmap.obj['data'] == {'a': 'b', 'c': 'd'}

    found = list(pykube.ConfigMap.objects(api, namespace=namespace).filter(selector={'app': 'x'}))
    assert [item.name for item in found] == ['cm1']
    assert configmap.exists()

    configmap.delete()
    assert not configmap.exists()


def test_watch(api, namespace: str) -> None:
    configmap = pykube.ConfigMap(
        api, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1', 'namespace': namespace}}
    )
    configmap.create()
    since = configmap.obj['metadata']['resourceVersion']
    configmap.patch({'data': {'x': 'y'}})
    configmap.delete()
    stream = pykube.ConfigMap.objects(api, namespace=namespace).watch(since=since)
    events = []
    for event in stream:
        events.append((event.type, event.object.name))
        if len(events) == 2:
            break
    assert events == [('MODIFIED', 'cm1'), ('DELETED', 'cm1')]


def test_custom_objects(api, namespace: str) -> None:
    crd = pykube.object_factory(api, 'apiextensions.k8s.io/v1', 'CustomResourceDefinition')(api, CRD_BODY)
    try:
        crd.create()
    except pykube.exceptions.HTTPError as e:
        if e.code != 409:  # created by another test of a shared server
            raise
    wait_until(lambda: crd.reload() or any(c['type'] == 'Established' and c['status'] == 'True'
                                           for c in crd.obj.get('status', {}).get('conditions', [])))
    kind = pykube.object_factory(api, 'kopf.dev/v1', 'KopfExample')
    obj = kind(
        api,
        {
            'apiVersion': 'kopf.dev/v1',
            'kind': 'KopfExample',
            'metadata': {'name': 'kex1', 'namespace': namespace, 'labels': {'test': namespace}},
            'spec': {'a': 1},
        },
    )

    def created() -> bool:  # a real server answers "429 storage is (re)initializing" for a moment
        try:
            obj.create()
        except pykube.exceptions.HTTPError as e:
            if e.code in (404, 429, 503):
                return False
            raise
        return True
    wait_until(created)
    obj.patch({'spec': {'b': 2}})
    assert obj.obj['spec'] == {'a': 1, 'b': 2}
    # Across all namespaces; only this test's objects (a shared server has others' too).
    found = kind.objects(api, namespace=pykube.all).filter(selector={'test': namespace})
    assert [item.name for item in found] == ['kex1']
    obj.delete()
    assert not obj.exists()
