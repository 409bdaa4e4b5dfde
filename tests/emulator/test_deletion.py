"""Deletion: finalizers, preconditions, collections, and cascades (namespaces, CRDs, owners)."""

from typing import Any

CMS = '/api/v1/namespaces/default/configmaps'
KEXES = '/apis/kopf.dev/v1/namespaces/default/kopfexamples'
CRDS = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions'


def configmap(name: str, **metadata: Any) -> dict[str, Any]:
    return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name, **metadata}}


def kex(name: str, **metadata: Any) -> dict[str, Any]:
    return {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': name, **metadata}}


async def test_delete_without_finalizers_removes_at_once(api) -> None:
    created = (await api.post(CMS, configmap('cm1'))).body
    reply = await api.delete(f'{CMS}/cm1')
    assert reply.status == 200
    assert reply.body['metadata']['uid'] == created['metadata']['uid']
    assert int(reply.body['metadata']['resourceVersion']) > int(created['metadata']['resourceVersion'])
    assert (await api.get(f'{CMS}/cm1')).status == 404


async def test_finalizers_postpone_the_deletion(api, crd) -> None:
    await api.post(KEXES, kex('kex1', finalizers=['kopf.dev/a', 'kopf.dev/b']))
    reply = await api.delete(f'{KEXES}/kex1')
    assert reply.status == 200
    assert reply.body['metadata']['deletionTimestamp'].endswith('Z')
    assert reply.body['metadata']['deletionGracePeriodSeconds'] == 0

    kept = await api.get(f'{KEXES}/kex1')
    assert kept.status == 200
    assert kept.body['metadata']['deletionTimestamp'] == reply.body['metadata']['deletionTimestamp']

    again = await api.delete(f'{KEXES}/kex1')  # repeated deletions change nothing
    assert again.status == 200
    assert again.body['metadata']['resourceVersion'] == kept.body['metadata']['resourceVersion']

    adding = await api.patch(
        f'{KEXES}/kex1', {'metadata': {'finalizers': ['kopf.dev/a', 'kopf.dev/b', 'new/c']}}
    )
    assert adding.status == 422
    assert 'no new finalizers can be added' in adding.body['message']

    one_left = await api.patch(f'{KEXES}/kex1', {'metadata': {'finalizers': ['kopf.dev/b']}})
    assert one_left.status == 200
    assert (await api.get(f'{KEXES}/kex1')).status == 200

    none_left = await api.request(
        'PATCH',
        f'{KEXES}/kex1',
        [{'op': 'remove', 'path': '/metadata/finalizers'}],
        content_type='application/json-patch+json',
    )
    assert none_left.status == 200
    assert (await api.get(f'{KEXES}/kex1')).status == 404


async def test_deletion_timestamp_cannot_be_patched(api) -> None:
    await api.post(CMS, configmap('cm1', finalizers=['x/y']))
    reply = await api.patch(f'{CMS}/cm1', {'metadata': {'deletionTimestamp': '2020-01-01T00:00:00Z'}})
    assert reply.status == 200
    assert 'deletionTimestamp' not in reply.body['metadata']


async def test_delete_preconditions(api) -> None:
    created = (await api.post(CMS, configmap('cm1'))).body
    wrong_uid = await api.delete(f'{CMS}/cm1', {'preconditions': {'uid': 'other'}})
    assert wrong_uid.status == 409
    wrong_version = await api.delete(f'{CMS}/cm1', {'preconditions': {'resourceVersion': '1'}})
    assert wrong_version.status == 409
    right = await api.delete(
        f'{CMS}/cm1',
        {
            'preconditions': {
                'uid': created['metadata']['uid'],
                'resourceVersion': created['metadata']['resourceVersion'],
            }
        },
    )
    assert right.status == 200


async def test_delete_collection_with_selector(api) -> None:
    await api.post(CMS, configmap('a', labels={'x': '1'}))
    await api.post(CMS, configmap('b', labels={'x': '2'}))
    await api.post(CMS, configmap('c', labels={'x': '1'}))
    reply = await api.delete(f'{CMS}?labelSelector=x=1')
    assert reply.status == 200
    assert reply.body['kind'] == 'ConfigMapList'
    assert [item['metadata']['name'] for item in reply.body['items']] == ['a', 'c']
    assert [item['metadata']['name'] for item in (await api.get(CMS)).body['items']] == ['b']


async def test_system_namespaces_cannot_be_deleted(api) -> None:
    reply = await api.delete('/api/v1/namespaces/default')
    assert reply.status == 403
    assert reply.body['message'] == 'namespaces "default" is forbidden: this namespace may not be deleted'
    assert (await api.get('/api/v1/namespaces/default')).status == 200


async def test_namespace_deletion_deletes_the_contents(api, crd) -> None:
    await api.post(
        '/api/v1/namespaces', {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'ns1'}}
    )
    await api.post('/api/v1/namespaces/ns1/configmaps', configmap('plain'))
    await api.post('/apis/kopf.dev/v1/namespaces/ns1/kopfexamples', kex('blocked', finalizers=['x/y']))

    reply = await api.delete('/api/v1/namespaces/ns1')
    assert reply.status == 200
    assert reply.body['status']['phase'] == 'Terminating'
    assert (await api.get('/api/v1/namespaces/ns1/configmaps/plain')).status == 404

    refused = await api.post('/api/v1/namespaces/ns1/configmaps', configmap('late'))
    assert refused.status == 403
    assert 'because it is being terminated' in refused.body['message']
    # As real servers: the cause says why, so that clients need not parse the message.
    assert refused.body['details']['causes'] == [{
        'reason': 'NamespaceTerminating',
        'message': 'namespace ns1 is being terminated',
        'field': 'metadata.namespace',
    }]

    blocked = await api.get('/apis/kopf.dev/v1/namespaces/ns1/kopfexamples/blocked')
    assert blocked.body['metadata']['deletionTimestamp']
    assert (await api.get('/api/v1/namespaces/ns1')).status == 200

    await api.patch(
        '/apis/kopf.dev/v1/namespaces/ns1/kopfexamples/blocked', {'metadata': {'finalizers': None}}
    )
    assert (await api.get('/apis/kopf.dev/v1/namespaces/ns1/kopfexamples/blocked')).status == 404
    assert (await api.get('/api/v1/namespaces/ns1')).status == 404


async def test_crd_deletion_deletes_the_custom_objects(api, crd) -> None:
    await api.post(KEXES, kex('plain'))
    await api.post(KEXES, kex('blocked', finalizers=['x/y']))
    reply = await api.delete(f'{CRDS}/kopfexamples.kopf.dev')
    assert reply.status == 200
    assert reply.body['metadata']['deletionTimestamp']
    assert (await api.get(f'{KEXES}/plain')).status == 404
    assert (await api.get(f'{KEXES}/blocked')).status == 200
    refused = await api.post(KEXES, kex('late'))
    assert refused.status == 405

    await api.patch(f'{KEXES}/blocked', {'metadata': {'finalizers': []}})
    assert (await api.get(f'{CRDS}/kopfexamples.kopf.dev')).status == 404
    assert (await api.get('/apis/kopf.dev/v1')).status == 404


async def test_owned_objects_are_garbage_collected(api, crd) -> None:
    owner = (await api.post(KEXES, kex('owner'))).body
    reference = {
        'apiVersion': 'kopf.dev/v1',
        'kind': 'KopfExample',
        'name': 'owner',
        'uid': owner['metadata']['uid'],
    }
    other_owner = (await api.post(CMS, configmap('other-owner'))).body
    other_reference = {
        'apiVersion': 'v1',
        'kind': 'ConfigMap',
        'name': 'other-owner',
        'uid': other_owner['metadata']['uid'],
    }
    await api.post(CMS, configmap('child', ownerReferences=[reference]))
    await api.post(CMS, configmap('shared', ownerReferences=[reference, other_reference]))
    await api.post(CMS, configmap('unrelated'))

    await api.delete(f'{KEXES}/owner')
    assert (await api.get(f'{CMS}/child')).status == 404
    assert (await api.get(f'{CMS}/shared')).status == 200  # another owner is still alive
    assert (await api.get(f'{CMS}/unrelated')).status == 200

    await api.delete(f'{CMS}/other-owner')
    assert (await api.get(f'{CMS}/shared')).status == 404


async def test_orphaning_keeps_the_owned_objects(api) -> None:
    owner = (await api.post(CMS, configmap('owner'))).body
    reference = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': 'owner', 'uid': owner['metadata']['uid']}
    await api.post(CMS, configmap('child', ownerReferences=[reference]))
    await api.delete(f'{CMS}/owner?propagationPolicy=Orphan')
    child = await api.get(f'{CMS}/child')
    assert child.status == 200
    assert 'ownerReferences' not in child.body['metadata']
