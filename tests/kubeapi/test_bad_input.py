"""Bad input gets the status codes and Status objects of real API servers, never a crash."""

from typing import Any

import pytest

CMS = '/api/v1/namespaces/default/configmaps'
KEXES = '/apis/kopf.dev/v1/namespaces/default/kopfexamples'


def configmap(name: str, **fields: Any) -> dict[str, Any]:
    return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name}, **fields}


def assert_status(reply, code: int, reason: str) -> None:
    assert reply.status == code, reply
    assert reply.headers['Content-Type'].startswith('application/json')
    assert reply.body['kind'] == 'Status'
    assert reply.body['apiVersion'] == 'v1'
    assert reply.body['status'] == 'Failure'
    assert reply.body['code'] == code
    assert reply.body['reason'] == reason
    assert reply.body['message']


@pytest.mark.parametrize('data', [b'{', b'{"kind": ', b'not json at all', b'\xff\xfe', b''])
async def test_malformed_json_bodies(api, data: bytes) -> None:
    assert_status(await api.post(CMS, data=data, content_type='application/json'), 400, 'BadRequest')


@pytest.mark.parametrize('body', [[], 'string', 123, None])
async def test_non_object_bodies(api, body: Any) -> None:
    data = b'null' if body is None else None
    reply = await api.post(CMS, body, data=data, content_type='application/json')
    assert_status(reply, 400, 'BadRequest')


async def test_bodies_of_wrong_types(api) -> None:
    assert_status(
        await api.post(CMS, {'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': 'x'}}),
        400,
        'BadRequest',
    )
    assert_status(
        await api.post(CMS, {'apiVersion': 'apps/v1', 'kind': 'ConfigMap', 'metadata': {'name': 'x'}}),
        400,
        'BadRequest',
    )
    assert_status(
        await api.post(CMS, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': 'x'}), 400, 'BadRequest'
    )


async def test_missing_content_type_means_json(api) -> None:
    reply = await api.post(CMS, data=b'{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}')
    assert reply.status == 201


@pytest.mark.parametrize(
    'content_type', ['text/plain', 'application/xml', 'application/vnd.kubernetes.protobuf']
)
async def test_unsupported_object_content_types(api, content_type: str) -> None:
    reply = await api.post(CMS, data=b'{}', content_type=content_type)
    assert_status(reply, 415, 'UnsupportedMediaType')


@pytest.mark.parametrize('content_type', ['application/json', 'text/plain', None])
async def test_unsupported_patch_content_types(api, content_type: str | None) -> None:
    await api.post(CMS, configmap('cm1'))
    reply = await api.request('PATCH', f'{CMS}/cm1', data=b'{}', content_type=content_type)
    assert_status(reply, 415, 'UnsupportedMediaType')


async def test_strategic_merge_patch_of_custom_objects_is_unsupported(api, crd) -> None:
    await api.post(KEXES, {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex1'}})
    reply = await api.patch(
        f'{KEXES}/kex1', {'spec': {}}, content_type='application/strategic-merge-patch+json'
    )
    assert_status(reply, 415, 'UnsupportedMediaType')
    assert 'application/merge-patch+json' in reply.body['message']


@pytest.mark.parametrize(
    'path',
    [
        '/api/v1/namespaces/default/unknowns',
        '/api/v1/unknowns',
        '/apis/unknown.example.com/v1/things',
        '/apis/kopf.dev/v1/namespaces/default/kopfexamples',  # no CRD yet
        '/api/v1/namespaces/default/configmaps/cm1/unknown-subresource',
        '/api/v1/namespaces/default/namespaces/default',  # a cluster-scoped resource in a namespace
        '/api/v1/namespaces/default/configmaps/a/b/c/d',
        '/totally/unknown',
    ],
)
async def test_unknown_resources(api, path: str) -> None:
    assert_status(await api.get(path), 404, 'NotFound')


@pytest.mark.parametrize(
    'name, rule',
    [
        ('UpperCase', 'subdomain'),
        ('under_score', 'subdomain'),
        ('-leading-dash', 'subdomain'),
        ('trailing-dash-', 'subdomain'),
        ('x' * 254, 'subdomain'),
        ('spaces in name', 'subdomain'),
    ],
)
async def test_names_violating_dns_1123(api, name: str, rule: str) -> None:
    reply = await api.post(CMS, configmap(name))
    assert_status(reply, 422, 'Invalid')
    assert reply.body['details']['kind'] == 'ConfigMap'
    assert reply.body['details']['causes'][0]['field'] == 'metadata.name'
    assert 'RFC 1123' in reply.body['message'] or 'no more than' in reply.body['message']


@pytest.mark.parametrize('name', ['dots.are.not.allowed', 'x' * 64, 'Upper'])
async def test_namespace_names_must_be_dns_labels(api, name: str) -> None:
    reply = await api.post(
        '/api/v1/namespaces', {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}}
    )
    assert_status(reply, 422, 'Invalid')


async def test_missing_name(api) -> None:
    reply = await api.post(CMS, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {}})
    assert_status(reply, 422, 'Invalid')
    assert reply.body['details']['causes'][0]['reason'] == 'FieldValueRequired'


@pytest.mark.parametrize(
    'metadata',
    [
        {'labels': {'bad key!': 'v'}},
        {'labels': {'k': 'bad value!'}},
        {'labels': {'k': 'x' * 64}},
        {'labels': {'k': 1}},
        {'labels': 'not-a-map'},
        {'annotations': {'k': 1}},
        {'finalizers': 'not-a-list'},
        {'finalizers': ['bad finalizer']},
        {'ownerReferences': [{'name': 'x'}]},
    ],
)
async def test_invalid_metadata(api, metadata: dict[str, Any]) -> None:
    reply = await api.post(
        CMS, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1', **metadata}}
    )
    assert_status(reply, 422, 'Invalid')
    await api.post(CMS, configmap('cm2'))
    reply = await api.patch(f'{CMS}/cm2', {'metadata': metadata})
    assert_status(reply, 422, 'Invalid')


@pytest.mark.parametrize(
    'patch',
    [
        b'{',
        b'[',
        b'"a string"',
        b'[1, 2]',
    ],
)
async def test_malformed_merge_patches(api, patch: bytes) -> None:
    await api.post(CMS, configmap('cm1'))
    reply = await api.request('PATCH', f'{CMS}/cm1', data=patch, content_type='application/merge-patch+json')
    assert_status(reply, 400, 'BadRequest')


@pytest.mark.parametrize(
    'patch',
    [
        {'op': 'add', 'path': '/a'},  # not a list
        [{'op': 'unknown', 'path': '/data'}],
        [{'op': 'add', 'value': 1}],
        [{'op': 'add', 'path': 'no-slash', 'value': 1}],
        ['not-an-object'],
        [{'op': 'move', 'path': '/data/x'}],
    ],
)
async def test_malformed_json_patches(api, patch: Any) -> None:
    await api.post(CMS, configmap('cm1', data={'a': 'b'}))
    reply = await api.patch(f'{CMS}/cm1', patch, content_type='application/json-patch+json')
    assert_status(reply, 400, 'BadRequest')


@pytest.mark.parametrize(
    'patch',
    [
        [{'op': 'test', 'path': '/data/a', 'value': 'wrong'}],
        [{'op': 'remove', 'path': '/data/absent'}],
        [{'op': 'replace', 'path': '/nested/absent/path', 'value': 1}],
        [{'op': 'add', 'path': '/data/a/b', 'value': 1}],
        [{'op': 'test', 'path': '/data/a', 'value': 'b'}, {'op': 'test', 'path': '/data/a', 'value': 'c'}],
    ],
)
async def test_inapplicable_json_patches(api, patch: Any) -> None:
    await api.post(CMS, configmap('cm1', data={'a': 'b'}))
    reply = await api.patch(f'{CMS}/cm1', patch, content_type='application/json-patch+json')
    assert_status(reply, 422, 'Invalid')
    assert (await api.get(f'{CMS}/cm1')).body['data'] == {'a': 'b'}  # nothing applied


async def test_patch_that_breaks_the_object(api) -> None:
    await api.post(CMS, configmap('cm1'))
    reply = await api.patch(
        f'{CMS}/cm1',
        [{'op': 'replace', 'path': '', 'value': [1]}],
        content_type='application/json-patch+json',
    )
    assert_status(reply, 400, 'BadRequest')
    reply = await api.patch(f'{CMS}/cm1', {'metadata': None})
    assert_status(reply, 400, 'BadRequest')
    reply = await api.patch(f'{CMS}/cm1', {'kind': 'Secret'})
    assert_status(reply, 400, 'BadRequest')


@pytest.mark.parametrize(
    'query',
    [
        'limit=abc',
        'limit=-1',
        'timeoutSeconds=x&watch=true',
        'labelSelector=a%3D%3D%3D',
        'fieldSelector=nonsense',
        'dryRun=Some',
    ],
)
async def test_invalid_query_parameters(api, query: str) -> None:
    method = 'POST' if 'dryRun' in query else 'GET'
    reply = await api.request(method, f'{CMS}?{query}', configmap('cm1') if method == 'POST' else None)
    assert_status(reply, 400, 'BadRequest')


async def test_unsupported_methods(api) -> None:
    await api.post(CMS, configmap('cm1'))
    assert_status(await api.post(f'{CMS}/cm1', configmap('cm1')), 405, 'MethodNotAllowed')
    assert_status(await api.put(CMS, configmap('cm1')), 405, 'MethodNotAllowed')
    assert_status(
        await api.request('PATCH', CMS, {}, content_type='application/merge-patch+json'),
        405,
        'MethodNotAllowed',
    )
    assert_status(await api.post('/api/v1/configmaps', configmap('cm1')), 405, 'MethodNotAllowed')
    assert_status(await api.post('/version', {}), 405, 'MethodNotAllowed')


async def test_unacceptable_response_types(api) -> None:
    reply = await api.get(CMS, headers={'Accept': 'application/vnd.kubernetes.protobuf'})
    assert_status(reply, 406, 'NotAcceptable')


async def test_too_large_bodies(api) -> None:
    data = b'{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "'
    data += b'x' * (4 * 1024 * 1024) + b'"}}'
    assert_status(
        await api.post(CMS, data=data, content_type='application/json'), 413, 'RequestEntityTooLarge'
    )


async def test_invalid_delete_options(api) -> None:
    await api.post(CMS, configmap('cm1'))
    assert_status(
        await api.delete(f'{CMS}/cm1', data=b'{', content_type='application/json'), 400, 'BadRequest'
    )
    assert_status(await api.delete(f'{CMS}/cm1', {'propagationPolicy': 'Sometimes'}), 422, 'Invalid')
    assert (await api.get(f'{CMS}/cm1')).status == 200
