"""API discovery: versions, groups, resource lists, and how CRDs change them."""

import copy

import pytest

CRDS = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions'


async def test_version(api) -> None:
    reply = await api.get('/version')
    assert reply.status == 200
    assert reply.body['major'] == '1'
    assert reply.body['gitVersion'].startswith('v1.')


async def test_core_api_versions(api) -> None:
    reply = await api.get('/api')
    assert reply.status == 200
    assert reply.body['kind'] == 'APIVersions'
    assert reply.body['versions'] == ['v1']


async def test_core_v1_resources(api) -> None:
    reply = await api.get('/api/v1')
    assert reply.status == 200
    assert reply.body['kind'] == 'APIResourceList'
    assert reply.body['groupVersion'] == 'v1'
    resources = {resource['name']: resource for resource in reply.body['resources']}
    assert {
        'namespaces',
        'pods',
        'configmaps',
        'secrets',
        'services',
        'persistentvolumeclaims',
        'events',
    } <= set(resources)
    assert resources['namespaces']['namespaced'] is False
    assert resources['namespaces']['kind'] == 'Namespace'
    assert resources['pods']['namespaced'] is True
    assert resources['pods']['shortNames'] == ['po']
    assert 'all' in resources['pods']['categories']
    assert set(resources['configmaps']['verbs']) == {
        'create',
        'delete',
        'deletecollection',
        'get',
        'list',
        'patch',
        'update',
        'watch',
    }
    assert resources['pods/status']['verbs'] == ['get', 'patch', 'update']
    assert 'configmaps/status' not in resources


@pytest.mark.parametrize(
    'group_version, plural, namespaced',
    [
        ('events.k8s.io/v1', 'events', True),
        ('apiextensions.k8s.io/v1', 'customresourcedefinitions', False),
        ('coordination.k8s.io/v1', 'leases', True),
        ('admissionregistration.k8s.io/v1', 'validatingwebhookconfigurations', False),
        ('admissionregistration.k8s.io/v1', 'mutatingwebhookconfigurations', False),
    ],
)
async def test_builtin_groups(api, group_version: str, plural: str, namespaced: bool) -> None:
    group, version = group_version.split('/')
    groups = await api.get('/apis')
    assert groups.body['kind'] == 'APIGroupList'
    assert group in {entry['name'] for entry in groups.body['groups']}

    group_reply = await api.get(f'/apis/{group}')
    assert group_reply.status == 200
    assert group_reply.body['kind'] == 'APIGroup'
    assert group_reply.body['preferredVersion'] == {'groupVersion': group_version, 'version': version}

    resources = await api.get(f'/apis/{group_version}')
    assert resources.status == 200
    found = {entry['name']: entry for entry in resources.body['resources']}
    assert found[plural]['namespaced'] is namespaced


async def test_unknown_groups_and_versions_are_not_found(api) -> None:
    # Like real servers: a Status for the versions of the served groups, plain text for unknown groups.
    for path in ['/api/v2', '/apis/apps/v7']:
        reply = await api.get(path)
        assert reply.status == 404, path
        assert reply.body['kind'] == 'Status'
        assert reply.body['reason'] == 'NotFound'
    for path in ['/apis/unknown.example.com', '/apis/unknown.example.com/v1']:
        reply = await api.get(path)
        assert (reply.status, reply.headers['Content-Type'], reply.raw) == (
            404, 'text/plain; charset=utf-8', b'404 page not found\n'), path


async def test_crd_registers_all_served_versions(api, crd) -> None:
    group = await api.get('/apis/kopf.dev')
    assert group.status == 200
    assert [entry['version'] for entry in group.body['versions']] == ['v1', 'v1beta1']
    assert group.body['preferredVersion']['version'] == 'v1'

    v1 = await api.get('/apis/kopf.dev/v1')
    resources = {entry['name']: entry for entry in v1.body['resources']}
    assert resources['kopfexamples']['kind'] == 'KopfExample'
    assert resources['kopfexamples']['singularName'] == 'kopfexample'
    assert resources['kopfexamples']['namespaced'] is True
    assert resources['kopfexamples']['shortNames'] == ['kex']
    assert resources['kopfexamples']['categories'] == ['kopf']
    assert 'kopfexamples/status' in resources  # the subresource is declared for v1

    v1beta1 = await api.get('/apis/kopf.dev/v1beta1')
    names = {entry['name'] for entry in v1beta1.body['resources']}
    assert names == {'kopfexamples'}  # no status subresource in this version


async def test_crd_is_established_at_once(crd) -> None:
    conditions = {condition['type']: condition['status'] for condition in crd['status']['conditions']}
    assert conditions == {'NamesAccepted': 'True', 'Established': 'True'}
    assert crd['status']['acceptedNames']['kind'] == 'KopfExample'
    assert crd['status']['storedVersions'] == ['v1']


async def test_crd_update_changes_the_served_versions(api, crd) -> None:
    body = copy.deepcopy(crd)
    body['spec']['versions'][1]['served'] = False
    body['spec']['scope'] = 'Cluster'
    reply = await api.put(f'{CRDS}/kopfexamples.kopf.dev', body)
    assert reply.status == 200, reply
    assert (await api.get('/apis/kopf.dev/v1beta1')).status == 404
    v1 = await api.get('/apis/kopf.dev/v1')
    assert v1.body['resources'][0]['namespaced'] is False


async def test_crd_deletion_unregisters_the_resources(api, crd) -> None:
    reply = await api.delete(f'{CRDS}/kopfexamples.kopf.dev')
    assert reply.status == 200
    assert (await api.get('/apis/kopf.dev')).status == 404
    assert (await api.get('/apis/kopf.dev/v1')).status == 404
    assert 'kopf.dev' not in {group['name'] for group in (await api.get('/apis')).body['groups']}
    assert (await api.get('/apis/kopf.dev/v1/namespaces/default/kopfexamples')).status == 404


@pytest.mark.parametrize(
    'mutation, field',
    [
        (lambda body: body['metadata'].update(name='wrong.kopf.dev'), 'metadata.name'),
        (lambda body: body['spec'].update(group='nodots'), 'spec.group'),
        (lambda body: body['spec'].update(scope='Everywhere'), 'spec.scope'),
        (lambda body: body['spec'].update(versions=[]), 'spec.versions'),
        (lambda body: body['spec']['versions'][0].pop('schema'), 'spec.versions[0].schema.openAPIV3Schema'),
    ],
)
async def test_invalid_crds_are_rejected(api, mutation, field: str) -> None:
    from_conftest = {
        'apiVersion': 'apiextensions.k8s.io/v1',
        'kind': 'CustomResourceDefinition',
        'metadata': {'name': 'things.kopf.dev'},
        'spec': {
            'group': 'kopf.dev',
            'scope': 'Namespaced',
            'names': {'plural': 'things', 'kind': 'Thing'},
            'versions': [{'name': 'v1', 'served': True, 'storage': True, 'schema': {'openAPIV3Schema': {
                'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}}}],
        },
    }
    mutation(from_conftest)
    reply = await api.post(CRDS, from_conftest)
    assert reply.status == 422, reply
    assert reply.body['reason'] == 'Invalid'
    assert field in {cause['field'] for cause in reply.body['details']['causes']}


async def test_openapi_v3_describes_patch_support_per_kind(api, crd) -> None:
    root = await api.get('/openapi/v3')
    assert root.status == 200
    paths = root.body['paths']
    assert 'api/v1' in paths and 'apis/kopf.dev/v1' in paths
    document = await api.get(paths['apis/kopf.dev/v1']['serverRelativeURL'])
    assert document.status == 200
    patches = [operation['patch'] for operation in document.body['paths'].values() if 'patch' in operation]
    kinds = [patch['x-kubernetes-group-version-kind'] for patch in patches]
    assert {'group': 'kopf.dev', 'version': 'v1', 'kind': 'KopfExample'} in kinds
    assert all('application/merge-patch+json' in patch['requestBody']['content'] for patch in patches)
    assert (await api.get('/openapi/v2')).status == 404


async def test_health_endpoints(api) -> None:
    for path in ['/healthz', '/livez', '/readyz']:
        reply = await api.get(path)
        assert reply.status == 200
        assert reply.raw == b'ok'
