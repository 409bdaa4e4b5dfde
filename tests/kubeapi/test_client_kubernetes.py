"""
The official ``kubernetes`` client works unchanged against any API server (the ``k8s_api`` switch).

The emulator by default, the real control plane in tox's ``realapi`` env: the same calls, the same results.
Each test has its own namespace; the CRD is the examples' one, shared by the tests of a real server.
"""

import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

kubernetes = pytest.importorskip('kubernetes')

from kubernetes import client, config, dynamic, watch  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from .._waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.kube_api

CRD_BODY: dict[str, Any] = yaml.safe_load(
    (pathlib.Path(__file__).resolve().parents[2] / 'examples' / 'crd.yaml').read_text()
)


@pytest.fixture
def api_client(k8s_api: Any) -> Iterator[Any]:
    api_client = config.new_client_from_config(config_file=str(k8s_api.kubeconfig_path))
    with api_client:
        yield api_client


@pytest.fixture
def namespace(api_client: Any) -> Iterator[str]:
    name = f'client-{uuid.uuid4().hex[:8]}'
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)  # on a real server without controllers, it stays Terminating: no matter


def create_crd(api_client: Any) -> None:
    """Create the CRD unless it exists (a shared server); wait until its objects are served."""
    extensions = client.ApiextensionsV1Api(api_client)
    try:
        extensions.create_custom_resource_definition(CRD_BODY)
    except ApiException as e:
        if e.status != 409:
            raise
    name = CRD_BODY['metadata']['name']
    wait_until(lambda: any(c.type == 'Established' and c.status == 'True'
                           for c in extensions.read_custom_resource_definition(name).status.conditions or []))

    def served() -> bool:  # a real server answers "429 storage is (re)initializing" for a moment
        try:
            custom = client.CustomObjectsApi(api_client)
            custom.list_cluster_custom_object('kopf.dev', 'v1', 'kopfexamples', limit=1)
        except ApiException as e:
            if e.status in (404, 429, 503):
                return False
            raise
        return True
    wait_until(served)


def test_configmaps_create_patch_read_delete(api_client, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    created = core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name='cm1', labels={'app': 'test'}), data={'a': 'b'}),
    )
    assert created.metadata.uid
    assert created.metadata.creation_timestamp is not None

    patched = core.patch_namespaced_config_map('cm1', namespace, {'data': {'c': 'd'}})
    assert patched.data == {'a': 'b', 'c': 'd'}
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)

    listed = core.list_namespaced_config_map(namespace, label_selector='app=test')
    assert [item.metadata.name for item in listed.items] == ['cm1']

    with pytest.raises(ApiException) as error:
        core.create_namespaced_config_map(
            namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name='cm1'))
        )
    assert error.value.status == 409

    core.delete_namespaced_config_map('cm1', namespace)
    with pytest.raises(ApiException) as error:
        core.read_namespaced_config_map('cm1', namespace)
    assert error.value.status == 404


def test_watch_stream(api_client, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    start = core.list_namespaced_config_map(namespace).metadata.resource_version
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name='cm1')))
    core.patch_namespaced_config_map('cm1', namespace, {'data': {'x': 'y'}})
    core.delete_namespaced_config_map('cm1', namespace)

    seen = []
    watcher = watch.Watch()
    for event in watcher.stream(
        core.list_namespaced_config_map, namespace, resource_version=start, timeout_seconds=30
    ):
        seen.append((event['type'], event['object'].metadata.name))
        if len(seen) == 3:
            watcher.stop()
    assert seen == [('ADDED', 'cm1'), ('MODIFIED', 'cm1'), ('DELETED', 'cm1')]


def test_custom_resources(api_client, namespace: str) -> None:
    create_crd(api_client)
    custom = client.CustomObjectsApi(api_client)
    body = {
        'apiVersion': 'kopf.dev/v1',
        'kind': 'KopfExample',
        'metadata': {'name': 'kex1', 'labels': {'test': namespace}},
        'spec': {'a': 1},
    }
    created = custom.create_namespaced_custom_object('kopf.dev', 'v1', namespace, 'kopfexamples', body)
    assert created['metadata']['generation'] == 1

    patched = custom.patch_namespaced_custom_object(
        'kopf.dev', 'v1', namespace, 'kopfexamples', 'kex1', {'spec': {'b': 2}}
    )
    assert patched['spec'] == {'a': 1, 'b': 2}
    assert patched['metadata']['generation'] == 2

    status = custom.patch_namespaced_custom_object_status(
        'kopf.dev', 'v1', namespace, 'kopfexamples', 'kex1', {'status': {'phase': 'Done'}}
    )
    assert status['status'] == {'phase': 'Done'}

    # Across all namespaces; only this test's objects (a shared server has others' too).
    listed = custom.list_cluster_custom_object(
        'kopf.dev', 'v1', 'kopfexamples', label_selector=f'test={namespace}'
    )
    assert [item['metadata']['name'] for item in listed['items']] == ['kex1']

    seen = []
    watcher = watch.Watch()
    for event in watcher.stream(
        custom.list_namespaced_custom_object,
        'kopf.dev',
        'v1',
        namespace,
        'kopfexamples',
        resource_version=created['metadata']['resourceVersion'],
        timeout_seconds=30,
    ):
        seen.append((event['type'], event['object']['metadata']['generation']))
        if len(seen) == 2:
            watcher.stop()
    assert seen == [('MODIFIED', 2), ('MODIFIED', 2)]


def test_dynamic_client_discovers_resources(api_client, namespace: str) -> None:
    create_crd(api_client)
    dynamic_client = dynamic.DynamicClient(api_client)
    resource = dynamic_client.resources.get(api_version='kopf.dev/v1', kind='KopfExample')
    assert resource.namespaced is True
    resource.create(
        body={'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex1'}},
        namespace=namespace,
    )
    fetched = resource.get(name='kex1', namespace=namespace)
    assert fetched.metadata.name == 'kex1'
    pods = dynamic_client.resources.get(api_version='v1', kind='Pod')
    assert pods.namespaced is True
