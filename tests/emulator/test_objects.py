"""Objects: create, read, list, update, the status subresource, generations, resource versions."""

import random
import re
from typing import Any

import pytest

CMS = '/api/v1/namespaces/default/configmaps'
KEXES = '/apis/kopf.dev/v1/namespaces/default/kopfexamples'


def configmap(name: str, **fields: Any) -> dict[str, Any]:
    return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name}, **fields}


def kex(name: str, **fields: Any) -> dict[str, Any]:
    return {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': name}, **fields}


async def test_create_fills_system_metadata(api) -> None:
    reply = await api.post(CMS, configmap('cm1', data={'a': 'b'}))
    assert reply.status == 201
    metadata = reply.body['metadata']
    assert metadata['name'] == 'cm1'
    assert metadata['namespace'] == 'default'
    assert re.fullmatch(r'[0-9a-f-]{36}', metadata['uid'])
    assert re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ', metadata['creationTimestamp'])
    assert 'generation' not in metadata  # ConfigMaps have none, like in a real API server
    assert int(metadata['resourceVersion']) > 0
    assert reply.body['data'] == {'a': 'b'}

    fetched = await api.get(f'{CMS}/cm1')
    assert fetched.status == 200
    assert fetched.body == reply.body


async def test_create_ignores_client_provided_system_fields(api) -> None:
    body = configmap('cm1')
    body['metadata'].update(
        uid='fake', resourceVersion='999', generation=5, deletionTimestamp='2020-01-01T00:00:00Z'
    )
    reply = await api.post(CMS, body)
    assert reply.status == 201
    assert reply.body['metadata']['uid'] != 'fake'
    assert reply.body['metadata']['generation'] == 5  # ConfigMaps have none: kept, like in real servers
    assert 'deletionTimestamp' not in reply.body['metadata']


async def test_create_with_generate_name(api) -> None:
    reply = await api.post(
        CMS, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'generateName': 'cm-'}}
    )
    assert reply.status == 201
    assert re.fullmatch(r'cm-[a-z0-9]{5}', reply.body['metadata']['name'])


async def test_generated_name_taken_already_is_generated_again(api, monkeypatch) -> None:
    # As real servers do since Kubernetes 1.30: the client never sees a 409 for a generated name.
    # The random choices are made predictable: the first generated name is taken, the second is not.
    suffixes = iter(['bbbbb', 'bbbbb', 'ccccc'])
    monkeypatch.setattr(random, 'choices', lambda population, k: list(next(suffixes)))
    body = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'generateName': 'cm-'}}
    assert (await api.post(CMS, body)).body['metadata']['name'] == 'cm-bbbbb'
    reply = await api.post(CMS, body)
    assert reply.status == 201
    assert reply.body['metadata']['name'] == 'cm-ccccc'


async def test_duplicates_conflict(api) -> None:
    assert (await api.post(CMS, configmap('cm1'))).status == 201
    reply = await api.post(CMS, configmap('cm1'))
    assert reply.status == 409
    assert reply.body == {
        'kind': 'Status',
        'apiVersion': 'v1',
        'metadata': {},
        'status': 'Failure',
        'message': 'configmaps "cm1" already exists',
        'reason': 'AlreadyExists',
        'details': {'name': 'cm1', 'kind': 'configmaps'},
        'code': 409,
    }


async def test_missing_objects_are_not_found(api, crd) -> None:
    reply = await api.get(f'{KEXES}/absent')
    assert reply.status == 404
    assert reply.body['reason'] == 'NotFound'
    assert reply.body['message'] == 'kopfexamples.kopf.dev "absent" not found'
    assert reply.body['details'] == {'name': 'absent', 'group': 'kopf.dev', 'kind': 'kopfexamples'}
    for method in ['PUT', 'PATCH', 'DELETE']:
        body = kex('absent') if method == 'PUT' else {}
        content_type = 'application/merge-patch+json' if method == 'PATCH' else None
        reply = await api.request(method, f'{KEXES}/absent', body, content_type=content_type)
        assert reply.status == 404, method


async def test_namespace_must_exist(api) -> None:
    reply = await api.post('/api/v1/namespaces/absent/configmaps', configmap('cm1'))
    assert reply.status == 404
    assert reply.body['message'] == 'namespaces "absent" not found'


async def test_namespace_in_body_must_match_url(api) -> None:
    body = configmap('cm1')
    body['metadata']['namespace'] = 'kube-system'
    reply = await api.post(CMS, body)
    assert reply.status == 400
    assert reply.body['reason'] == 'BadRequest'


async def test_resource_versions_grow_globally(api, crd) -> None:
    versions = []
    for index in range(3):
        versions.append(
            int((await api.post(CMS, configmap(f'cm{index}'))).body['metadata']['resourceVersion'])
        )
        versions.append(int((await api.post(KEXES, kex(f'kex{index}'))).body['metadata']['resourceVersion']))
    patched = await api.patch(f'{CMS}/cm0', {'data': {'x': 'y'}})
    versions.append(int(patched.body['metadata']['resourceVersion']))
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    listed = await api.get(CMS)
    assert int(listed.body['metadata']['resourceVersion']) == versions[-1]


async def test_update_with_stale_resource_version_conflicts(api) -> None:
    created = (await api.post(CMS, configmap('cm1', data={'a': '1'}))).body
    first = dict(created, data={'a': '2'})
    assert (await api.put(f'{CMS}/cm1', first)).status == 200
    second = dict(created, data={'a': '3'})
    reply = await api.put(f'{CMS}/cm1', second)
    assert reply.status == 409
    assert reply.body['reason'] == 'Conflict'
    assert 'the object has been modified' in reply.body['message']


async def test_update_of_custom_objects_requires_resource_version(api, crd) -> None:
    await api.post(KEXES, kex('kex1', spec={'a': 1}))
    reply = await api.put(f'{KEXES}/kex1', kex('kex1', spec={'a': 2}))
    assert reply.status == 422
    assert reply.body['details']['causes'][0]['field'] == 'metadata.resourceVersion'


async def test_update_cannot_rename(api) -> None:
    created = (await api.post(CMS, configmap('cm1'))).body
    renamed = dict(created, metadata=dict(created['metadata'], name='cm2'))
    reply = await api.put(f'{CMS}/cm1', renamed)
    assert reply.status == 400


async def test_noop_updates_keep_the_resource_version(api) -> None:
    created = (await api.post(CMS, configmap('cm1', data={'a': 'b'}))).body
    reply = await api.patch(f'{CMS}/cm1', {'data': {'a': 'b'}})
    assert reply.status == 200
    assert reply.body['metadata']['resourceVersion'] == created['metadata']['resourceVersion']


async def test_generation_changes_only_with_spec(api, crd) -> None:
    created = (await api.post(KEXES, kex('kex1', spec={'field': 1}))).body
    assert created['metadata']['generation'] == 1
    labelled = await api.patch(f'{KEXES}/kex1', {'metadata': {'labels': {'a': 'b'}}})
    assert labelled.body['metadata']['generation'] == 1
    status = await api.patch(f'{KEXES}/kex1/status', {'status': {'phase': 'Ok'}})
    assert status.body['metadata']['generation'] == 1
    spec = await api.patch(f'{KEXES}/kex1', {'spec': {'field': 2}})
    assert spec.body['metadata']['generation'] == 2
    other = await api.patch(f'{KEXES}/kex1', {'data': {'new': 'field'}})
    assert other.body['metadata']['generation'] == 3


async def test_status_subresource_is_separate(api, crd) -> None:
    created = await api.post(KEXES, kex('kex1', spec={'a': 1}, status={'ignored': True}))
    assert 'status' not in created.body  # not settable on creation

    main = await api.patch(f'{KEXES}/kex1', {'spec': {'a': 2}, 'status': {'x': 1}})
    assert main.body['spec'] == {'a': 2}
    assert 'status' not in main.body

    status = await api.patch(
        f'{KEXES}/kex1/status', {'spec': {'a': 3}, 'status': {'x': 1}, 'metadata': {'labels': {'l': 'v'}}}
    )
    assert status.status == 200
    assert status.body['spec'] == {'a': 2}
    assert status.body['status'] == {'x': 1}
    assert 'labels' not in status.body['metadata']

    read = await api.get(f'{KEXES}/kex1/status')
    assert read.body == status.body

    replaced = await api.put(f'{KEXES}/kex1/status', dict(read.body, status={'y': 2}))
    assert replaced.status == 200
    assert replaced.body['status'] == {'y': 2}


async def test_status_without_subresource_is_a_normal_field(api, crd) -> None:
    created = await api.post(
        '/apis/kopf.dev/v1beta1/namespaces/default/kopfexamples',
        {
            'apiVersion': 'kopf.dev/v1beta1',
            'kind': 'KopfExample',
            'metadata': {'name': 'kex1'},
            'status': {'a': 1},
        },
    )
    assert created.status == 201
    assert created.body['status'] == {'a': 1}
    assert (await api.get('/apis/kopf.dev/v1beta1/namespaces/default/kopfexamples/kex1/status')).status == 404
    configmap_status = await api.get(f'{CMS}/absent/status')
    assert configmap_status.status == 404


async def test_objects_are_served_in_every_version(api, crd) -> None:
    await api.post(KEXES, kex('kex1', spec={'a': 1}))
    other = await api.get('/apis/kopf.dev/v1beta1/namespaces/default/kopfexamples/kex1')
    assert other.status == 200
    assert other.body['apiVersion'] == 'kopf.dev/v1beta1'
    assert other.body['spec'] == {'a': 1}

    beta = '/apis/kopf.dev/v1beta1/namespaces/default/kopfexamples/kex1'
    unchanged = await api.patch(beta, {'spec': {'a': 1}})
    assert unchanged.body['apiVersion'] == 'kopf.dev/v1beta1'
    assert unchanged.body['metadata']['resourceVersion'] == other.body['metadata']['resourceVersion']
    changed = await api.patch(beta, {'spec': {'a': 2}})
    assert changed.body['apiVersion'] == 'kopf.dev/v1beta1'
    assert (await api.get(f'{KEXES}/kex1')).body['apiVersion'] == 'kopf.dev/v1'
    listed = await api.get('/apis/kopf.dev/v1beta1/kopfexamples')
    assert [item['apiVersion'] for item in listed.body['items']] == ['kopf.dev/v1beta1']


async def test_cluster_scoped_objects(api) -> None:
    reply = await api.post(
        '/api/v1/namespaces',
        {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'ns1', 'namespace': 'ignored'}},
    )
    assert reply.status == 201
    assert 'namespace' not in reply.body['metadata']
    assert reply.body['status'] == {'phase': 'Active'}
    assert reply.body['metadata']['labels'] == {'kubernetes.io/metadata.name': 'ns1'}
    assert (await api.get('/api/v1/namespaces/default/namespaces/ns1')).status == 404


async def test_dry_run_stores_nothing(api) -> None:
    reply = await api.post(f'{CMS}?dryRun=All', configmap('cm1'))
    assert reply.status == 201
    assert (await api.get(f'{CMS}/cm1')).status == 404


async def test_kind_and_api_version_default_to_the_url(api) -> None:
    reply = await api.post(CMS, {'metadata': {'name': 'cm1'}, 'data': {'a': 'b'}})
    assert reply.status == 201
    assert reply.body['kind'] == 'ConfigMap'
    assert reply.body['apiVersion'] == 'v1'


async def test_yaml_bodies_are_accepted(api) -> None:
    text = b'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm1\ndata:\n  a: b\n'
    reply = await api.post(CMS, data=text, content_type='application/yaml')
    assert reply.status == 201
    assert reply.body['data'] == {'a': 'b'}


# ---------------------------------------------------------------------------------------------
# Lists & selectors.


@pytest.fixture
async def labelled(api) -> None:
    for name, labels in [
        ('a', {'app': 'x', 'tier': 'web'}),
        ('b', {'app': 'y', 'tier': 'db'}),
        ('c', {'app': 'z'}),
        ('d', {}),
    ]:
        reply = await api.post(CMS, dict(configmap(name), metadata={'name': name, 'labels': labels}))
        assert reply.status == 201


@pytest.mark.parametrize(
    'selector, expected',
    [
        ('app=x', ['a']),
        ('app==x', ['a']),
        ('app!=x', ['b', 'c', 'd']),
        ('app in (x,y)', ['a', 'b']),
        ('app notin (x, y)', ['c', 'd']),
        ('tier', ['a', 'b']),
        ('!tier', ['c', 'd']),
        ('app in (x,y),tier=db', ['b']),
        ('', ['a', 'b', 'c', 'd']),
    ],
)
async def test_label_selectors(api, labelled, selector: str, expected: list[str]) -> None:
    reply = await api.request('GET', f'{CMS}?labelSelector={selector}')
    assert reply.status == 200
    assert [item['metadata']['name'] for item in reply.body['items']] == expected


async def test_invalid_label_selector(api, labelled) -> None:
    reply = await api.get(f'{CMS}?labelSelector=app in (x')
    assert reply.status == 400
    assert reply.body['reason'] == 'BadRequest'


async def test_field_selectors(api, labelled) -> None:
    await api.post('/api/v1/namespaces/kube-system/configmaps', configmap('a'))
    by_name = await api.get('/api/v1/configmaps?fieldSelector=metadata.name=a')
    assert [(item['metadata']['namespace'], item['metadata']['name']) for item in by_name.body['items']] == [
        ('default', 'a'),
        ('kube-system', 'a'),
    ]
    by_namespace = await api.get('/api/v1/configmaps?fieldSelector=metadata.namespace!=default')
    assert [item['metadata']['name'] for item in by_namespace.body['items']] == ['a']
    both = await api.get('/api/v1/configmaps?fieldSelector=metadata.namespace=default,metadata.name!=a')
    assert [item['metadata']['name'] for item in both.body['items']] == ['b', 'c', 'd']
    unknown = await api.get(f'{CMS}?fieldSelector=spec.unknown=x')
    assert unknown.status == 400


async def test_list_across_namespaces(api) -> None:
    await api.post('/api/v1/namespaces/kube-system/configmaps', configmap('x'))
    await api.post(CMS, configmap('y'))
    reply = await api.get('/api/v1/configmaps')
    assert reply.body['kind'] == 'ConfigMapList'
    assert [(item['metadata']['namespace'], item['metadata']['name']) for item in reply.body['items']] == [
        ('default', 'y'),
        ('kube-system', 'x'),
    ]
    in_namespace = await api.get('/api/v1/namespaces/kube-system/configmaps')
    assert [item['metadata']['name'] for item in in_namespace.body['items']] == ['x']


async def test_pagination(api) -> None:
    for index in range(7):
        await api.post(CMS, configmap(f'cm{index}'))
    names: list[str] = []
    token = ''
    pages = 0
    while True:
        reply = await api.get(f'{CMS}?limit=3' + (f'&continue={token}' if token else ''))
        assert reply.status == 200
        pages += 1
        names.extend(item['metadata']['name'] for item in reply.body['items'])
        token = reply.body['metadata'].get('continue', '')
        if not token:
            break
        assert reply.body['metadata']['remainingItemCount'] == 7 - len(names)
    assert pages == 3
    assert names == [f'cm{index}' for index in range(7)]
    assert (await api.get(f'{CMS}?limit=3&continue=garbage!')).status == 400


async def test_non_ascii_and_big_integers_are_stored_and_sent_as_they_are(api, crd) -> None:
    # As real servers do: UTF-8 on the wire (not \u-escapes); integers beyond 64 bits are kept exactly.
    for name, spec in [('kex1', {'text': 'Grüße, 世界'}), ('kex2', {'text': 'Grüße', 'big': 2**70})]:
        reply = await api.post(KEXES, kex(name, spec=spec))
        assert reply.status == 201, reply
        fetched = await api.get(f'{KEXES}/{name}')
        assert spec['text'].encode() in fetched.raw
        assert fetched.body['spec'] == spec


async def test_pagination_sees_the_names_that_come_and_go_between_pages(api) -> None:
    # The names are sorted once per change of the set of names (not per page): a name that comes or goes
    # between the pages must be seen or missed as in the live store, in every namespace of a cluster-wide
    # list.
    for namespace in ['default', 'kube-system']:
        for index in range(4):
            await api.post(f'/api/v1/namespaces/{namespace}/configmaps', configmap(f'cm{index}'))
    first = await api.get('/api/v1/configmaps?limit=3')
    assert [item['metadata']['name'] for item in first.body['items']] == ['cm0', 'cm1', 'cm2']
    assert first.body['metadata']['remainingItemCount'] == 5
    await api.post(CMS, configmap('cm25'))  # after the token's position: seen
    await api.post(CMS, configmap('cm15'))  # before it: not seen
    await api.delete(f'{CMS}/cm3')  # not listed yet: not seen
    await api.post('/api/v1/namespaces/kube-system/configmaps', configmap('cm9'))
    token = first.body['metadata']['continue']
    rest = await api.get(f'/api/v1/configmaps?limit=100&continue={token}')
    assert [(item['metadata']['namespace'], item['metadata']['name']) for item in rest.body['items']] == [
        ('default', 'cm25'),
        *[('kube-system', f'cm{index}') for index in [0, 1, 2, 3, 9]],
    ]
    assert 'continue' not in rest.body['metadata']
