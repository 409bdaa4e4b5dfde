"""The official ``kubernetes`` client works against the emulator unchanged."""

from collections.abc import Iterator
from typing import Any

import pytest

kubernetes = pytest.importorskip('kubernetes')

from kubernetes import client, config, dynamic, watch  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

CRD_BODY: dict[str, Any] = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': 'kopfexamples.kopf.dev'},
    'spec': {
        'group': 'kopf.dev',
        'scope': 'Namespaced',
        'names': {'plural': 'kopfexamples', 'singular': 'kopfexample', 'kind': 'KopfExample'},
        'versions': [
            {
                'name': 'v1',
                'served': True,
                'storage': True,
                'subresources': {'status': {}},
                'schema': {
                    'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}
                },
            }
        ],
    },
}


@pytest.fixture
def api_client(k8s_emulator) -> Iterator[Any]:
    api_client = config.new_client_from_config(config_file=str(k8s_emulator.kubeconfig_path))
    with api_client:
        yield api_client


def test_configmaps_create_patch_read_delete(api_client) -> None:
    core = client.CoreV1Api(api_client)
    created = core.create_namespaced_config_map(
        'default',
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name='cm1', labels={'app': 'test'}), data={'a': 'b'}),
    )
    assert created.metadata.uid
    assert created.metadata.creation_timestamp is not None

    patched = core.patch_namespaced_config_map('cm1', 'default', {'data': {'c': 'd'}})
    assert patched.data == {'a': 'b', 'c': 'd'}
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)

    listed = core.list_namespaced_config_map('default', label_selector='app=test')
    assert [item.metadata.name for item in listed.items] == ['cm1']

    with pytest.raises(ApiException) as error:
        core.create_namespaced_config_map(
            'default', client.V1ConfigMap(metadata=client.V1ObjectMeta(name='cm1'))
        )
    assert error.value.status == 409

    core.delete_namespaced_config_map('cm1', 'default')
    with pytest.raises(ApiException) as error:
        core.read_namespaced_config_map('cm1', 'default')
    assert error.value.status == 404


def test_watch_stream(api_client) -> None:
    core = client.CoreV1Api(api_client)
    start = core.list_namespaced_config_map('default').metadata.resource_version
    core.create_namespaced_config_map('default', client.V1ConfigMap(metadata=client.V1ObjectMeta(name='cm1')))
    core.patch_namespaced_config_map('cm1', 'default', {'data': {'x': 'y'}})
    core.delete_namespaced_config_map('cm1', 'default')

    seen = []
    watcher = watch.Watch()
    for event in watcher.stream(
        core.list_namespaced_config_map, 'default', resource_version=start, timeout_seconds=30
    ):
        seen.append((event['type'], event['object'].metadata.name))
        if len(seen) == 3:
            watcher.stop()
    assert seen == [('ADDED', 'cm1'), ('MODIFIED', 'cm1'), ('DELETED', 'cm1')]


def test_custom_resources(api_client) -> None:
    extensions = client.ApiextensionsV1Api(api_client)
    extensions.create_custom_resource_definition(CRD_BODY)
    custom = client.CustomObjectsApi(api_client)
    body = {
        'apiVersion': 'kopf.dev/v1',
        'kind': 'KopfExample',
        'metadata': {'name': 'kex1'},
        'spec': {'a': 1},
    }
    created = custom.create_namespaced_custom_object('kopf.dev', 'v1', 'default', 'kopfexamples', body)
    assert created['metadata']['generation'] == 1

    patched = custom.patch_namespaced_custom_object(
        'kopf.dev', 'v1', 'default', 'kopfexamples', 'kex1', {'spec': {'b': 2}}
    )
    assert patched['spec'] == {'a': 1, 'b': 2}
    assert patched['metadata']['generation'] == 2

    status = custom.patch_namespaced_custom_object_status(
        'kopf.dev', 'v1', 'default', 'kopfexamples', 'kex1', {'status': {'phase': 'Done'}}
    )
    assert status['status'] == {'phase': 'Done'}

    listed = custom.list_cluster_custom_object('kopf.dev', 'v1', 'kopfexamples')
    assert [item['metadata']['name'] for item in listed['items']] == ['kex1']

    seen = []
    watcher = watch.Watch()
    for event in watcher.stream(
        custom.list_namespaced_custom_object,
        'kopf.dev',
        'v1',
        'default',
        'kopfexamples',
        resource_version=created['metadata']['resourceVersion'],
        timeout_seconds=30,
    ):
        seen.append((event['type'], event['object']['metadata']['generation']))
        if len(seen) == 2:
            watcher.stop()
    assert seen == [('MODIFIED', 2), ('MODIFIED', 2)]


def test_dynamic_client_discovers_resources(api_client) -> None:
    client.ApiextensionsV1Api(api_client).create_custom_resource_definition(CRD_BODY)
    dynamic_client = dynamic.DynamicClient(api_client)
    resource = dynamic_client.resources.get(api_version='kopf.dev/v1', kind='KopfExample')
    assert resource.namespaced is True
    resource.create(
        body={'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex1'}},
        namespace='default',
    )
    fetched = resource.get(name='kex1', namespace='default')
    assert fetched.metadata.name == 'kex1'
    pods = dynamic_client.resources.get(api_version='v1', kind='Pod')
    assert pods.namespaced is True
