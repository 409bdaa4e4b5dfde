"""
Bad input gets the status codes and Status objects of real API servers, never a crash.

The same raw requests on any API server (the ``k8s_api`` switch): the emulator by default, the real
control plane in tox's ``realapi`` env. Each test has its own namespace (the real server is shared).
"""
import json
import pathlib
import ssl
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import aiohttp
import pytest
import yaml

from kopf.testing import Cluster

pytestmark = pytest.mark.kube_api

REPO = pathlib.Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((REPO / 'examples' / 'crd.yaml').read_text())


class Reply:
    """A response: the code, the decoded JSON body (if any), the headers."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str], raw: bytes) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.raw = raw

    def __repr__(self) -> str:
        return f'<Reply {self.status} {self.raw[:300]!r}>'


class RawApi:
    """A minimal HTTP client: sends exactly what it is told to send (plus the kubeconfig's credentials)."""

    def __init__(self, session: aiohttp.ClientSession, ssl_context: ssl.SSLContext | None) -> None:
        self.session = session
        self.ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str | None = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        all_headers = dict(headers or {})
        if body is not None:
            data = json.dumps(body).encode()
            content_type = content_type or 'application/json'
        if content_type is not None:
            all_headers['Content-Type'] = content_type
        # Without a content type, send none at all (aiohttp would add application/octet-stream).
        skipped = () if content_type is not None else ('Content-Type',)
        async with self.session.request(
            method, path, data=data, headers=all_headers, skip_auto_headers=skipped, ssl=self.ssl
        ) as response:
            raw = await response.read()
            try:
                decoded = json.loads(raw) if raw else None
            except ValueError:
                decoded = None
            return Reply(response.status, decoded, response.headers, raw)

    async def get(self, path: str, **kwargs: Any) -> Reply:
        return await self.request('GET', path, **kwargs)

    async def post(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return await self.request('POST', path, body, **kwargs)

    async def put(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return await self.request('PUT', path, body, **kwargs)

    async def patch(
        self,
        path: str,
        body: Any = None,
        *,
        content_type: str = 'application/merge-patch+json',
        **kwargs: Any,
    ) -> Reply:
        return await self.request('PATCH', path, body, content_type=content_type, **kwargs)

    async def delete(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return await self.request('DELETE', path, body, **kwargs)


@pytest.fixture()
def cluster(k8s_api: Any) -> Cluster:
    return Cluster(k8s_api.kubeconfig_path)


@pytest.fixture()
async def api(cluster: Cluster) -> AsyncIterator[RawApi]:
    async with aiohttp.ClientSession(
        cluster.url, headers=cluster.auth_headers, timeout=aiohttp.ClientTimeout(total=30)
    ) as session:
        yield RawApi(session, cluster.ssl_context)


@pytest.fixture()
def ns(cluster: Cluster) -> Iterator[str]:
    name = f'bad-{uuid.uuid4().hex[:8]}'
    cluster.create_namespace(name)
    yield name
    cluster.delete(f'/api/v1/namespaces/{name}')


@pytest.fixture()
def crd(cluster: Cluster) -> None:
    cluster.apply_crd(CRD)  # idempotent: shared by the tests of a session's real server


@pytest.fixture()
def cms(ns: str) -> str:
    return f'/api/v1/namespaces/{ns}/configmaps'


@pytest.fixture()
def kexes(ns: str) -> str:
    return f'/apis/kopf.dev/v1/namespaces/{ns}/kopfexamples'


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
async def test_malformed_json_bodies(api, data: bytes, cms: str) -> None:
    assert_status(await api.post(cms, data=data, content_type='application/json'), 400, 'BadRequest')


@pytest.mark.parametrize('body', [[], 'string', 123])
async def test_non_object_bodies(api, body: Any, cms: str) -> None:
    reply = await api.post(cms, body, content_type='application/json')
    assert_status(reply, 400, 'BadRequest')


async def test_null_body_is_an_empty_object_of_a_builtin_kind(api, cms: str) -> None:
    reply = await api.post(cms, data=b'null', content_type='application/json')
    assert_status(reply, 422, 'Invalid')
    assert reply.body['details']['causes'][0]['field'] == 'metadata.name'


async def test_bodies_of_wrong_types(api, cms: str) -> None:
    assert_status(
        await api.post(cms, {'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': 'x'}}),
        400,
        'BadRequest',
    )
    assert_status(
        await api.post(cms, {'apiVersion': 'apps/v1', 'kind': 'ConfigMap', 'metadata': {'name': 'x'}}),
        400,
        'BadRequest',
    )
    assert_status(
        await api.post(cms, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': 'x'}), 400, 'BadRequest'
    )


async def test_missing_content_type_means_json(api, cms: str) -> None:
    reply = await api.post(cms, data=b'{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}')
    assert reply.status == 201


@pytest.mark.parametrize('content_type', ['text/plain', 'application/xml'])
async def test_unsupported_object_content_types(api, content_type: str, cms: str) -> None:
    reply = await api.post(cms, data=b'{}', content_type=content_type)
    assert_status(reply, 415, 'UnsupportedMediaType')


async def test_protobuf_content_type_with_no_protobuf(api, cms: str) -> None:
    # Built-in kinds take protobuf; what is not protobuf is a bad request, not an unsupported type.
    reply = await api.post(cms, data=b'{}', content_type='application/vnd.kubernetes.protobuf')
    assert_status(reply, 400, 'BadRequest')
    assert 'protobuf' in reply.body['message']


@pytest.mark.parametrize('content_type', ['application/json', 'text/plain', None])
async def test_unsupported_patch_content_types(api, content_type: str | None, cms: str) -> None:
    await api.post(cms, configmap('cm1'))
    reply = await api.request('PATCH', f'{cms}/cm1', data=b'{}', content_type=content_type)
    assert_status(reply, 415, 'UnsupportedMediaType')


async def test_strategic_merge_patch_of_custom_objects_is_unsupported(api, crd, kexes: str) -> None:
    await api.post(kexes, {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex1'}})
    reply = await api.patch(
        f'{kexes}/kex1', {'spec': {}}, content_type='application/strategic-merge-patch+json'
    )
    assert_status(reply, 415, 'UnsupportedMediaType')
    assert 'application/merge-patch+json' in reply.body['message']


@pytest.mark.parametrize(
    'path',
    [
        '/api/v1/namespaces/default/unknowns',
        '/api/v1/unknowns',
        '/apis/apps/v1/namespaces/default/unknowns',
        '/apis/apps/v9/deployments',
        '/api/v1/namespaces/default/configmaps/cm1/unknown-subresource',
        '/api/v1/namespaces/default/namespaces/default',  # a cluster-scoped resource in a namespace
        '/api/v1/namespaces/default/configmaps/a/b/c/d',
    ],
)
async def test_unknown_resources(api, path: str) -> None:
    assert_status(await api.get(path), 404, 'NotFound')


@pytest.mark.parametrize(
    'path',
    [
        '/apis/unknown.example.com/v1/things',
        '/apis/nocrd.kopf.dev/v1/namespaces/default/kopfexamples',  # a group of no CRD (yet)
        '/apis/nocrd.kopf.dev/v1',
        '/totally/unknown',
    ],
)
async def test_unknown_groups_and_urls(api, path: str) -> None:
    # Outside of the served API groups, real servers answer in plain text, not with a Status.
    reply = await api.get(path)
    assert (reply.status, reply.headers['Content-Type'], reply.raw) == (
        404, 'text/plain; charset=utf-8', b'404 page not found\n')


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
async def test_names_violating_dns_1123(api, name: str, rule: str, cms: str) -> None:
    reply = await api.post(cms, configmap(name))
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


async def test_missing_name(api, cms: str) -> None:
    reply = await api.post(cms, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {}})
    assert_status(reply, 422, 'Invalid')
    assert reply.body['details']['causes'][0]['reason'] == 'FieldValueRequired'


@pytest.mark.parametrize(
    'metadata',
    [
        {'labels': {'bad key!': 'v'}},
        {'labels': {'k': 'bad value!'}},
        {'labels': {'k': 'x' * 64}},
        {'finalizers': ['bad finalizer']},
        {'ownerReferences': [{'name': 'x'}]},
    ],
)
async def test_invalid_metadata(api, metadata: dict[str, Any], cms: str) -> None:
    reply = await api.post(
        cms, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1', **metadata}}
    )
    assert_status(reply, 422, 'Invalid')
    await api.post(cms, configmap('cm2'))
    reply = await api.patch(f'{cms}/cm2', {'metadata': metadata})
    assert_status(reply, 422, 'Invalid')


@pytest.mark.parametrize(
    'metadata',
    [
        {'labels': {'k': 1}},
        {'labels': 'not-a-map'},
        {'annotations': {'k': 1}},
        {'finalizers': 'not-a-list'},
        {'finalizers': [1]},
        {'ownerReferences': 'x'},
        {'name': 5},
    ],
)
async def test_metadata_of_wrong_types(api, metadata: dict[str, Any], cms: str) -> None:
    # A body that does not decode into Kubernetes' types is a bad request (400) when created or replaced;
    # in a patch, the same is found only once patched: an invalid patch (422).
    reply = await api.post(cms, configmap('cm1', metadata={'name': 'cm1', **metadata}))
    assert_status(reply, 400, 'BadRequest')
    assert 'cannot unmarshal' in reply.body['message']
    created = await api.post(cms, configmap('cm2'))
    replaced = {**created.body, 'metadata': {**created.body['metadata'], **metadata}}
    reply = await api.put(f'{cms}/cm2', replaced)
    assert_status(reply, 400, 'BadRequest')
    if 'name' not in metadata:
        reply = await api.patch(f'{cms}/cm2', {'metadata': metadata})
        assert_status(reply, 422, 'Invalid')
    assert (await api.get(f'{cms}/cm2')).body['metadata'] == created.body['metadata']  # nothing stored


@pytest.mark.parametrize(
    'patch',
    [
        b'{',
        b'[',
        b'"a string"',
        b'[1, 2]',
    ],
)
async def test_malformed_merge_patches(api, patch: bytes, cms: str) -> None:
    await api.post(cms, configmap('cm1'))
    reply = await api.request('PATCH', f'{cms}/cm1', data=patch, content_type='application/merge-patch+json')
    assert_status(reply, 400, 'BadRequest')


@pytest.mark.parametrize(
    'patch',
    [
        {'op': 'add', 'path': '/a'},  # not a list
        ['not-an-object'],
        [{'op': 1, 'path': '/data'}],
    ],
)
async def test_malformed_json_patches(api, patch: Any, cms: str) -> None:
    await api.post(cms, configmap('cm1', data={'a': 'b'}))
    reply = await api.patch(f'{cms}/cm1', patch, content_type='application/json-patch+json')
    assert_status(reply, 400, 'BadRequest')


@pytest.mark.parametrize(
    'patch',
    [
        [{'op': 'unknown', 'path': '/data'}],
        [{'op': 'add', 'value': 1}],
        [{'op': 'add', 'path': 'no-slash', 'value': 1}],
        [{'op': 'move', 'path': '/data/x'}],
        [{'op': 'add', 'path': '/data/c', 'value': 'd'}, {'op': 'unknown', 'path': '/data'}],
    ],
)
async def test_invalid_json_patch_operations(api, patch: Any, cms: str) -> None:
    # The patch decodes (a list of operations), but an operation is unknown or incomplete: 422.
    await api.post(cms, configmap('cm1', data={'a': 'b'}))
    reply = await api.patch(f'{cms}/cm1', patch, content_type='application/json-patch+json')
    assert_status(reply, 422, 'Invalid')
    assert (await api.get(f'{cms}/cm1')).body['data'] == {'a': 'b'}  # nothing applied


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
async def test_inapplicable_json_patches(api, patch: Any, cms: str) -> None:
    await api.post(cms, configmap('cm1', data={'a': 'b'}))
    reply = await api.patch(f'{cms}/cm1', patch, content_type='application/json-patch+json')
    assert_status(reply, 422, 'Invalid')
    assert (await api.get(f'{cms}/cm1')).body['data'] == {'a': 'b'}  # nothing applied


async def test_patch_that_breaks_the_object(api, cms: str) -> None:
    created = await api.post(cms, configmap('cm1'))
    reply = await api.patch(
        f'{cms}/cm1',
        [{'op': 'replace', 'path': '', 'value': [1]}],
        content_type='application/json-patch+json',
    )
    assert_status(reply, 422, 'Invalid')
    reply = await api.patch(f'{cms}/cm1', {'metadata': None})
    assert_status(reply, 400, 'BadRequest')
    reply = await api.patch(f'{cms}/cm1', {'kind': 'Secret'})
    assert_status(reply, 422, 'Invalid')
    reply = await api.patch(f'{cms}/cm1', {'apiVersion': 'v2'})
    assert_status(reply, 422, 'Invalid')
    assert (await api.get(f'{cms}/cm1')).body == created.body  # nothing applied


@pytest.mark.parametrize(
    'query',
    [
        'limit=abc',
        'timeoutSeconds=x&watch=true',
        'labelSelector=a%3D%3D%3D',
        'fieldSelector=nonsense',
    ],
)
async def test_invalid_query_parameters(api, query: str, cms: str) -> None:
    reply = await api.request('GET', f'{cms}?{query}')
    assert_status(reply, 400, 'BadRequest')


async def test_negative_limit_means_no_limit(api, cms: str) -> None:
    await api.post(cms, configmap('cm1'))
    await api.post(cms, configmap('cm2'))
    reply = await api.get(f'{cms}?limit=-1')
    assert reply.status == 200, reply
    assert [item['metadata']['name'] for item in reply.body['items']] == ['cm1', 'cm2']
    assert not reply.body['metadata'].get('continue')


@pytest.mark.parametrize('method, options, query', [
    ('POST', 'CreateOptions', 'dryRun=Some'),
    ('POST', 'CreateOptions', 'dryRun=All&dryRun=Some'),
    ('PUT', 'UpdateOptions', 'dryRun=Some'),
    ('PATCH', 'PatchOptions', 'dryRun=Some'),
    ('DELETE', 'DeleteOptions', 'dryRun=Some'),
])
async def test_invalid_dry_run(api, cms: str, method: str, options: str, query: str) -> None:
    created = await api.post(cms, configmap('cm1'))
    path = f'{cms}?{query}' if method == 'POST' else f'{cms}/cm1?{query}'
    body = configmap('cm2') if method == 'POST' else {} if method == 'PATCH' else created.body
    content_type = 'application/merge-patch+json' if method == 'PATCH' else None
    reply = await api.request(method, path, body if method != 'DELETE' else None, content_type=content_type)
    assert_status(reply, 422, 'Invalid')
    assert reply.body['details']['kind'] == options
    assert reply.body['details']['group'] == 'meta.k8s.io'
    assert reply.body['details']['causes'][0]['field'] == 'dryRun'
    assert (await api.get(f'{cms}/cm1')).body == created.body  # nothing happened
    assert (await api.get(f'{cms}/cm2')).status == 404


async def test_unsupported_methods(api, cms: str) -> None:
    await api.post(cms, configmap('cm1'))
    assert_status(await api.post(f'{cms}/cm1', configmap('cm1')), 405, 'MethodNotAllowed')
    assert_status(await api.put(cms, configmap('cm1')), 405, 'MethodNotAllowed')
    assert_status(
        await api.request('PATCH', cms, {}, content_type='application/merge-patch+json'),
        405,
        'MethodNotAllowed',
    )
    assert_status(await api.post('/api/v1/configmaps', configmap('cm1')), 405, 'MethodNotAllowed')
    assert_status(await api.post('/version', {}), 405, 'MethodNotAllowed')


@pytest.mark.parametrize('accept', ['text/html', 'application/xml'])
async def test_unacceptable_response_types(api, cms: str, accept: str) -> None:
    # NB: not protobuf: real servers send it for the built-in kinds; the emulator only JSON (406).
    reply = await api.get(cms, headers={'Accept': accept})
    assert_status(reply, 406, 'NotAcceptable')


async def test_too_large_bodies(api, cms: str) -> None:
    data = b'{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "'
    data += b'x' * (4 * 1024 * 1024) + b'"}}'
    assert_status(
        await api.post(cms, data=data, content_type='application/json'), 413, 'RequestEntityTooLarge'
    )


async def test_invalid_delete_options(api, cms: str) -> None:
    await api.post(cms, configmap('cm1'))
    assert_status(
        await api.delete(f'{cms}/cm1', data=b'{', content_type='application/json'), 400, 'BadRequest'
    )
    assert_status(await api.delete(f'{cms}/cm1', {'propagationPolicy': 'Sometimes'}), 422, 'Invalid')
    assert (await api.get(f'{cms}/cm1')).status == 200
