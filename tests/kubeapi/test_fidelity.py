"""
The emulator's fidelity: the same raw API scenarios on the emulator and on a real kube-apiserver.

Every scenario runs twice, on a ``KubernetesEmulator`` of this module and on the session's real
control plane (``k8s_control_plane``), in a fresh namespace each, with plain HTTP requests. The
volatile fields (uids, timestamps, resourceVersions, managedFields) are normalised away, and what
comes back is compared to the same expectation, which is what the real server returns. Where the
emulator knowingly differs, its side is ``xfail(strict=True)`` (see "Known differences from a real
kube-apiserver" in the README of kopf-testing).
"""
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from kopf._clients import api
from kopf._clients.connections import Response
from kopf.testing.emulator import KubernetesEmulator

from .. import _builtin_kinds as builtin_kinds
from .. import _cel_libraries as cel_libraries
from .. import _crd_schemas as crd_schemas
from .. import _pruning as pruning
from .._waiting import wait_until

pytestmark = pytest.mark.real_apiserver

WAIT = 30.0
GROUP = 'fidelity.kopf.dev'
PLURAL = 'fidelities'
CRD = crd_schemas.crd(GROUP, PLURAL, 'Fidelity', status=True, schema={
    'type': 'object',
    'properties': {
        'spec': {
            'type': 'object',
            'properties': {
                'size': {'type': 'integer', 'minimum': 1},
                'mode': {'type': 'string', 'default': 'auto'},
                'nested': {'type': 'object', 'properties': {
                    'a': {'type': 'string'}, 'b': {'type': 'string'}}},
                'extra': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
            },
        },
        'status': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
    },
})
VOLATILE = ('uid', 'resourceVersion', 'creationTimestamp', 'managedFields', 'selfLink')
MERGE = 'application/merge-patch+json'
JSON_PATCH = 'application/json-patch+json'
STRATEGIC = 'application/strategic-merge-patch+json'


def known(reason: str) -> Any:
    """Mark the emulator's side of a scenario as a known difference from a real kube-apiserver."""
    return pytest.mark.parametrize('server', [
        pytest.param('emulator', marks=pytest.mark.xfail(strict=True, reason=f'known difference: {reason}')),
        'real',
    ], indirect=True)


class Api:
    """Raw HTTP to one API server; the responses are ``(status code, JSON body)``."""

    def __init__(self, kind: str, url: str, token: str | None = None, ca_path: Any = None) -> None:
        self.kind = kind
        self.url = url
        self.session = requests.Session()
        self.verify = str(ca_path) if ca_path is not None else True  # per request: env vars win over sessions
        if token:
            self.session.headers['Authorization'] = f'Bearer {token}'
        self.crd_ready = False
        self.schematics_ready = False
        self.warnings: list[str] = []  # of the last response

    def __call__(self, method: str, path: str, body: Any = None, *,
                 ctype: str = 'application/json', **params: str) -> tuple[int, Any]:
        response = self.session.request(method, self.url + path, json=body, params=params or None,
                                        headers={'Content-Type': ctype}, verify=self.verify, timeout=WAIT)
        self.warnings = crd_schemas.warnings([response.headers.get('Warning', '')])
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    def close(self) -> None:
        self.session.close()


def norm(obj: Any) -> Any:
    """The object without its volatile fields (and a mere mark for ``deletionTimestamp``)."""
    if isinstance(obj, dict):
        result = {k: norm(v) for k, v in obj.items() if k not in VOLATILE}
        if 'deletionTimestamp' in result:
            result['deletionTimestamp'] = '<set>'
        return result
    if isinstance(obj, list):
        return [norm(v) for v in obj]
    return obj


def failure(answer: tuple[int, Any]) -> tuple[int, str | None, str | None]:
    """The code, the Status's reason and its code, of an error response."""
    code, body = answer
    assert isinstance(body, dict) and body.get('kind') == 'Status', body
    return code, body.get('reason'), body.get('code')


@pytest.fixture(scope='module')
def emulator() -> Iterator[KubernetesEmulator]:
    with KubernetesEmulator() as emulator:
        yield emulator


@pytest.fixture(scope='module', params=['emulator', 'real'])
def server(request: pytest.FixtureRequest) -> Iterator[Api]:
    if request.param == 'emulator':
        emulator = request.getfixturevalue('emulator')
        api = Api('emulator', emulator.url)
    else:
        plane = request.getfixturevalue('k8s_control_plane')
        api = Api('real', plane.url, token=plane.token, ca_path=plane.ca_path)
    yield api
    api.close()


@pytest.fixture()
def ns(server: Api) -> Iterator[str]:
    name = f'fid-{uuid.uuid4().hex[:8]}'
    code, body = server('POST', '/api/v1/namespaces', {'metadata': {'name': name}})
    assert code == 201, body
    yield name
    server('DELETE', f'/api/v1/namespaces/{name}')


@pytest.fixture()
def crd(server: Api) -> None:
    if server.crd_ready:
        return
    code, body = server('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', CRD)
    assert code in (201, 409), body
    path = f'/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{GROUP}'
    wait_until(lambda: any(c['type'] == 'Established' and c['status'] == 'True'
                           for c in (server('GET', path)[1].get('status') or {}).get('conditions') or []))
    wait_until(lambda: server('GET', f'/apis/{GROUP}/v1/{PLURAL}')[0] == 200)
    server.crd_ready = True


@pytest.fixture()
def schematics(server: Api) -> None:
    """The CRD of rich schemas (``tests/_crd_schemas.py``), established."""
    if server.schematics_ready:
        return
    for crd in (crd_schemas.CRD, crd_schemas.RULES_CRD):
        code, body = server('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', crd)
        assert code in (201, 409), body
        group, plural = crd['spec']['group'], crd['spec']['names']['plural']
        wait_until(lambda: server('GET', f'/apis/{group}/v1/{plural}')[0] == 200)  # noqa: B023
    server.schematics_ready = True


def cms(ns: str, name: str = '') -> str:
    return f'/api/v1/namespaces/{ns}/configmaps' + (f'/{name}' if name else '')


def crs(ns: str, name: str = '') -> str:
    return f'/apis/{GROUP}/v1/namespaces/{ns}/{PLURAL}' + (f'/{name}' if name else '')


def configmap(name: str, **extra: Any) -> dict[str, Any]:
    return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name}, **extra}


def fidelity(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {'apiVersion': f'{GROUP}/v1', 'kind': 'Fidelity', 'metadata': {'name': name}, 'spec': spec}


# ------------------------------------------------------------------------------------------------
# Errors.

def test_get_missing_is_404(server: Api, ns: str) -> None:
    code, body = server('GET', cms(ns, 'missing'))
    assert failure((code, body)) == (404, 'NotFound', 404)
    assert body['details'] == {'name': 'missing', 'kind': 'configmaps'}


def test_create_existing_is_409(server: Api, ns: str) -> None:
    assert server('POST', cms(ns), configmap('cm1'))[0] == 201
    code, body = server('POST', cms(ns), configmap('cm1'))
    assert failure((code, body)) == (409, 'AlreadyExists', 409)
    assert body['details'] == {'name': 'cm1', 'kind': 'configmaps'}


def test_update_with_stale_resource_version_is_409(server: Api, ns: str) -> None:
    code, created = server('POST', cms(ns), configmap('cm1', data={'a': '1'}))
    assert code == 201
    assert server('PUT', cms(ns, 'cm1'), {**created, 'data': {'a': '2'}})[0] == 200
    code, body = server('PUT', cms(ns, 'cm1'), {**created, 'data': {'a': '3'}})
    assert failure((code, body)) == (409, 'Conflict', 409)
    assert 'the object has been modified' in body['message']


def test_verb_not_allowed_is_405(server: Api, ns: str) -> None:
    assert server('POST', cms(ns), configmap('cm1'))[0] == 201
    assert failure(server('POST', cms(ns, 'cm1'), configmap('cm1'))) == (405, 'MethodNotAllowed', 405)


def test_schema_violation_is_422(server: Api, ns: str, crd: None) -> None:
    code, body = server('POST', crs(ns), fidelity('f1', {'size': 0}))
    assert failure((code, body)) == (422, 'Invalid', 422)
    assert 'spec.size' in body['message']


def test_strategic_merge_patch_on_custom_resource_is_415(server: Api, ns: str, crd: None) -> None:
    assert server('POST', crs(ns), fidelity('f1', {'size': 1}))[0] == 201
    answer = server('PATCH', crs(ns, 'f1'), {'spec': {'size': 2}}, ctype=STRATEGIC)
    assert failure(answer) == (415, 'UnsupportedMediaType', 415)


# ------------------------------------------------------------------------------------------------
# Patches.

def test_merge_patch_on_configmap(server: Api, ns: str) -> None:
    assert server('POST', cms(ns), configmap('cm1', data={'a': '1', 'b': '2'}))[0] == 201
    code, body = server('PATCH', cms(ns, 'cm1'), {'data': {'a': None, 'c': '3'},
                                                  'metadata': {'labels': {'x': 'y'}}}, ctype=MERGE)
    assert code == 200
    assert norm(body)['data'] == {'b': '2', 'c': '3'}
    assert norm(body)['metadata'] == {'name': 'cm1', 'namespace': ns, 'labels': {'x': 'y'}}


def test_json_patch_on_configmap(server: Api, ns: str) -> None:
    assert server('POST', cms(ns), configmap('cm1', data={'a': '1', 'b': '2'}))[0] == 201
    ops = [{'op': 'remove', 'path': '/data/a'}, {'op': 'add', 'path': '/data/c', 'value': '3'},
           {'op': 'replace', 'path': '/data/b', 'value': '22'}]
    code, body = server('PATCH', cms(ns, 'cm1'), ops, ctype=JSON_PATCH)
    assert (code, body['data']) == (200, {'b': '22', 'c': '3'})
    code, body = server('PATCH', cms(ns, 'cm1'), [{'op': 'remove', 'path': '/data/zzz'}], ctype=JSON_PATCH)
    assert code == 422, body


def test_strategic_merge_patch_on_configmap(server: Api, ns: str) -> None:
    body = configmap('cm1', data={'a': '1'})
    body['metadata']['finalizers'] = ['example.com/one']
    assert server('POST', cms(ns), body)[0] == 201
    patch = {'data': {'a': None, 'b': '2'}, 'metadata': {'finalizers': ['example.com/two']}}
    code, body = server('PATCH', cms(ns, 'cm1'), patch, ctype=STRATEGIC)
    assert (code, body['data'], body['metadata']['finalizers']) == (
        200, {'b': '2'}, ['example.com/two', 'example.com/one'])
    server('PATCH', cms(ns, 'cm1'), {'metadata': {'finalizers': None}}, ctype=MERGE)


def test_merge_patch_on_custom_resource(server: Api, ns: str, crd: None) -> None:
    spec = {'size': 1, 'mode': 'manual', 'nested': {'a': 'x', 'b': 'y'}}
    assert server('POST', crs(ns), fidelity('f1', spec))[0] == 201
    code, body = server('PATCH', crs(ns, 'f1'), {'spec': {'nested': {'a': None, 'b': 'z'}}}, ctype=MERGE)
    assert (code, body['spec']) == (200, {'size': 1, 'mode': 'manual', 'nested': {'b': 'z'}})


def test_patched_objects_have_their_version_once_in_compact_json(server: Api, ns: str, crd: None) -> None:
    # The client reads a patched object's version from the response's text (e.g. for a timer's patch) if the
    # key is there once in compact JSON, else it decodes the whole response: the fast path must be the usual.
    assert server('POST', crs(ns), fidelity('f1', {'size': 1}))[0] == 201
    assert server('POST', cms(ns), configmap('c1', data={'k': 'v'}))[0] == 201
    patches = [(crs(ns, 'f1') + '/status', {'status': {'tick': 1}}), (cms(ns, 'c1'), {'data': {'k': 'w'}})]
    for path, patch in patches:
        response = server.session.request('PATCH', server.url + path, json=patch, verify=server.verify,
                                          headers={'Content-Type': MERGE}, timeout=WAIT)
        assert response.status_code == 200, response.text
        assert response.content.count(b'"resourceVersion":"') == 1, response.text
        version = api.decode_version(Response(200, {}, response.content, 'PATCH', path))
        assert version == response.json()['metadata']['resourceVersion']


# ------------------------------------------------------------------------------------------------
# The status subresource and the generation.

def test_status_subresource_and_generation(server: Api, ns: str, crd: None) -> None:
    code, body = server('POST', crs(ns), {**fidelity('f1', {'size': 1, 'mode': 'm'}), 'status': {'s': 1}})
    assert code == 201
    assert ('status' in body, body['metadata']['generation']) == (False, 1)

    code, body = server('PATCH', crs(ns, 'f1'), {'spec': {'size': 2}, 'status': {'s': 2}}, ctype=MERGE)
    assert (code, body['spec']['size'], 'status' in body) == (200, 2, False)
    assert body['metadata']['generation'] == 2

    code, body = server('PATCH', crs(ns, 'f1') + '/status', {'spec': {'size': 3}, 'status': {'s': 3}},
                        ctype=MERGE)
    assert (code, body['spec']['size'], body['status']) == (200, 2, {'s': 3})
    assert body['metadata']['generation'] == 2

    code, body = server('PATCH', crs(ns, 'f1'), {'metadata': {'labels': {'x': 'y'}}}, ctype=MERGE)
    assert (code, body['metadata']['generation']) == (200, 2)


@pytest.mark.parametrize('path, body', [
    ('/api/v1/namespaces/{ns}/configmaps', configmap('o1')),
    ('/api/v1/namespaces/{ns}/secrets', {'metadata': {'name': 'o1'}, 'data': {}}),
    ('/api/v1/namespaces/{ns}/serviceaccounts', {'metadata': {'name': 'o1'}}),
    ('/apis/coordination.k8s.io/v1/namespaces/{ns}/leases', {'metadata': {'name': 'o1'}, 'spec': {}}),
], ids=['configmaps', 'secrets', 'serviceaccounts', 'leases'])
def test_no_generation_of_kinds_without_spec(server: Api, ns: str, path: str, body: dict[str, Any]) -> None:
    code, created = server('POST', path.format(ns=ns), body)
    assert (code, 'generation' in created['metadata']) == (201, False)
    patch = {'metadata': {'labels': {'x': 'y'}}}
    code, updated = server('PATCH', path.format(ns=ns) + '/o1', patch, ctype=MERGE)
    assert (code, 'generation' in updated['metadata']) == (200, False)
    code, namespace = server('GET', f'/api/v1/namespaces/{ns}')
    assert (code, 'generation' in namespace['metadata']) == (200, False)


def test_given_generation_is_kept_where_there_is_none(server: Api, ns: str) -> None:
    body = configmap('cm1')
    body['metadata']['generation'] = 5
    code, created = server('POST', cms(ns), body)
    assert (code, created['metadata']['generation']) == (201, 5)


# ------------------------------------------------------------------------------------------------
# Watches.

def test_watch_from_an_old_resource_version_replays_the_history(server: Api, ns: str) -> None:
    # The built-in resources' watch caches start with the server: all history is there (no compaction yet).
    assert server('POST', cms(ns), configmap('cm1', data={'a': '1'}))[0] == 201
    assert server('PATCH', cms(ns, 'cm1'), {'data': {'a': '2'}}, ctype=MERGE)[0] == 200
    assert server('DELETE', cms(ns, 'cm1'))[0] == 200
    code, body = server('GET', cms(ns), watch='true', resourceVersion='1', timeoutSeconds='1')
    events = [json.loads(line) for line in body.splitlines()]
    assert code == 200
    assert [(e['type'], e['object']['metadata']['name'], e['object'].get('data')) for e in events] == [
        ('ADDED', 'cm1', {'a': '1'}), ('MODIFIED', 'cm1', {'a': '2'}), ('DELETED', 'cm1', {'a': '2'})]


def test_watch_from_before_the_crd_is_410_gone_in_the_stream(server: Api, ns: str, crd: None) -> None:
    # A real server's watch cache of a custom resource starts when its CRD is established: watching from
    # an older resourceVersion (as after an etcd compaction) is "410 Gone", and not as an HTTP code:
    # as the one ERROR event of a successful watch-stream, with the Status of reason "Expired".
    assert server('POST', crs(ns), fidelity('f1', {'size': 1}))[0] == 201
    code, body = server('GET', crs(ns), watch='true', resourceVersion='1', timeoutSeconds='5')
    events = [body] if isinstance(body, dict) else [json.loads(line) for line in body.splitlines()]
    assert code == 200
    assert [event['type'] for event in events] == ['ERROR'], events
    status = dict(events[0]['object'])
    message = status.pop('message')
    assert status == {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                      'reason': 'Expired', 'code': 410}
    assert message.startswith('too old resource version: 1 ('), message


def test_watch_of_custom_resources_from_a_list_replays_the_history(server: Api, ns: str, crd: None) -> None:
    code, listed = server('GET', crs(ns))
    assert code == 200
    assert server('POST', crs(ns), fidelity('f1', {'size': 1}))[0] == 201
    assert server('PATCH', crs(ns, 'f1'), {'spec': {'size': 2}}, ctype=MERGE)[0] == 200
    code, body = server('GET', crs(ns), watch='true', timeoutSeconds='1',
                        resourceVersion=listed['metadata']['resourceVersion'])
    events = [json.loads(line) for line in body.splitlines()]
    assert code == 200
    assert [(e['type'], e['object']['spec']['size']) for e in events] == [('ADDED', 1), ('MODIFIED', 2)]


def test_watch_whose_client_does_not_read_is_ended(server: Api, ns: str, crd: None) -> None:
    # The events fill the sockets' buffers, then the server's own (a real server's watcher channels: ~200
    # events of a custom resource); then, after its dispatch budget (0.1 s), the stream is ended, what is in
    # the sockets still comes (in order, a prefix), and the client re-watches from the last version it got.
    code, listed = server('GET', crs(ns))
    assert code == 200
    params = {'watch': 'true', 'resourceVersion': listed['metadata']['resourceVersion']}
    with requests.get(server.url + crs(ns), params=params, headers=dict(server.session.headers),
                      verify=server.verify, stream=True, timeout=(5, 30)) as watch:
        assert watch.status_code == 200
        count = 600  # ~30 MB of events: more than the sockets' buffers and the server's channels
        for index in range(count):
            body = fidelity(f'f{index}', {'size': 1, 'extra': {'data': 'x' * 50_000}})
            assert server('POST', crs(ns), body)[0] == 201
        lines = list(watch.iter_lines())  # ends by itself (not by the read timeout, which would raise)
    names = [json.loads(line)['object']['metadata']['name'] for line in lines if line]
    assert 0 < len(names) < count
    assert names == [f'f{index}' for index in range(len(names))]


# ------------------------------------------------------------------------------------------------
# Deletion.

def test_finalizers_and_deletion_timestamp(server: Api, ns: str) -> None:
    body = configmap('cm1')
    body['metadata']['finalizers'] = ['example.com/keep']
    assert server('POST', cms(ns), body)[0] == 201
    code, body = server('DELETE', cms(ns, 'cm1'))
    assert code == 200
    assert norm(body)['metadata']['deletionTimestamp'] == '<set>'
    code, body = server('GET', cms(ns, 'cm1'))
    assert (code, norm(body)['metadata']) == (200, {
        'name': 'cm1', 'namespace': ns, 'finalizers': ['example.com/keep'],
        'deletionTimestamp': '<set>', 'deletionGracePeriodSeconds': 0})
    code, body = server('PATCH', cms(ns, 'cm1'), {'metadata': {'finalizers': None}}, ctype=MERGE)
    assert code == 200
    assert server('GET', cms(ns, 'cm1'))[0] == 404


def test_no_finalizer_can_be_added_to_an_object_being_deleted(server: Api, ns: str, crd: None) -> None:
    # Our finalizer, once removed for the deletion, never comes back: a state with it is from before
    # the release (the operator skips such states, see `kopf._core.reactor.versions`).
    body = {'apiVersion': f'{GROUP}/v1', 'kind': 'Fidelity',
            'metadata': {'name': 'f1', 'finalizers': ['example.com/keep']}, 'spec': {'size': 1}}
    assert server('POST', crs(ns), body)[0] == 201
    assert server('DELETE', crs(ns, 'f1'))[0] == 200
    patch = {'metadata': {'finalizers': ['example.com/keep', 'example.com/new']}}
    code, failed = server('PATCH', crs(ns, 'f1'), patch, ctype=MERGE)
    assert (code, failed['reason']) == (422, 'Invalid')
    assert 'no new finalizers can be added if the object is being deleted' in failed['message']
    code, body = server('GET', crs(ns, 'f1'))
    assert (code, body['metadata']['finalizers']) == (200, ['example.com/keep'])
    assert server('PATCH', crs(ns, 'f1'), {'metadata': {'finalizers': None}}, ctype=MERGE)[0] == 200


def test_removing_the_last_finalizer_of_a_deleted_object_is_seen_only_as_its_deletion(
        server: Api, ns: str) -> None:
    # The release of an object (our finalizer removed) makes no version to wait for: the PATCH answers with
    # the version the object had, and only its deletion comes; a remaining finalizer keeps it (a MODIFIED).
    body = configmap('cm1')
    body['metadata']['finalizers'] = ['example.com/keep', 'example.com/other']
    code, created = server('POST', cms(ns), body)
    assert code == 201
    assert server('DELETE', cms(ns, 'cm1'))[0] == 200
    patch = {'metadata': {'finalizers': ['example.com/other']}}
    code, kept = server('PATCH', cms(ns, 'cm1'), patch, ctype=MERGE)
    assert code == 200
    code, released = server('PATCH', cms(ns, 'cm1'), {'metadata': {'finalizers': None}}, ctype=MERGE)
    assert code == 200
    code, stream = server('GET', cms(ns), watch='true', timeoutSeconds='1',
                          resourceVersion=created['metadata']['resourceVersion'])
    events = [json.loads(line) for line in stream.splitlines()]
    assert [(e['type'], e['object']['metadata'].get('finalizers')) for e in events] == [
        ('MODIFIED', ['example.com/keep', 'example.com/other']),  # the deletion's mark
        ('MODIFIED', ['example.com/other']),
        ('DELETED', ['example.com/other']),  # as last stored: the removal itself is not stored
    ]
    assert events[1]['object']['metadata']['resourceVersion'] == kept['metadata']['resourceVersion']
    assert 'finalizers' not in released['metadata']  # the object as updated,
    assert released['metadata']['resourceVersion'] == kept['metadata']['resourceVersion']  # but not stored
    assert int(events[2]['object']['metadata']['resourceVersion']) > int(kept['metadata']['resourceVersion'])


def test_dry_run_creates_nothing(server: Api, ns: str) -> None:
    code, body = server('POST', cms(ns), configmap('cm1', data={'a': '1'}), dryRun='All')
    assert (code, body['data']) == (201, {'a': '1'})
    assert server('GET', cms(ns, 'cm1'))[0] == 404


# ------------------------------------------------------------------------------------------------
# Lists.

@pytest.mark.parametrize('query, expected', [
    ({'labelSelector': 'app=a'}, ['cm1']),
    ({'labelSelector': 'app in (a,b)'}, ['cm1', 'cm2']),
    ({'labelSelector': 'app!=a'}, ['cm2', 'cm3']),
    ({'labelSelector': '!app'}, ['cm3']),
    ({'labelSelector': 'app,tier=x'}, ['cm2']),
    ({'fieldSelector': 'metadata.name=cm2'}, ['cm2']),
    ({'fieldSelector': 'metadata.name!=cm2'}, ['cm1', 'cm3']),
])
def test_selectors_in_lists(server: Api, ns: str, query: dict[str, str], expected: list[str]) -> None:
    for name, labels in [('cm1', {'app': 'a'}), ('cm2', {'app': 'b', 'tier': 'x'}), ('cm3', {})]:
        body = configmap(name)
        body['metadata']['labels'] = labels
        assert server('POST', cms(ns), body)[0] == 201
    code, body = server('GET', cms(ns), **query)
    assert (code, body['kind']) == (200, 'ConfigMapList')
    assert sorted(item['metadata']['name'] for item in body['items']) == expected


# ------------------------------------------------------------------------------------------------
# CRD schemas.

def test_crd_without_schema_is_422(server: Api) -> None:
    # The schemas are required in apiextensions.k8s.io/v1 (even where nothing is validated by them).
    body = {**CRD, 'metadata': {'name': f'noschemas.{GROUP}'}, 'spec': {
        **CRD['spec'], 'names': {'plural': 'noschemas', 'kind': 'NoSchema'},
        'versions': [{'name': 'v1', 'served': True, 'storage': True}]}}
    code, body = server('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', body)
    assert failure((code, body)) == (422, 'Invalid', 422)
    assert [(c['field'], c['reason']) for c in body['details']['causes']] == [
        ('spec.versions[0].schema.openAPIV3Schema', 'FieldValueRequired')]


def test_crd_pruning_of_unknown_fields(server: Api, ns: str, crd: None) -> None:
    code, body = server('POST', crs(ns), {**fidelity('f1', {'size': 1, 'mode': 'm', 'unknown': 1}), 'top': 1})
    assert (code, body['spec'], 'top' in body) == (201, {'size': 1, 'mode': 'm'}, False)


def test_crd_defaulting(server: Api, ns: str, crd: None) -> None:
    code, body = server('POST', crs(ns), fidelity('f1', {'size': 1}))
    assert (code, body['spec']) == (201, {'size': 1, 'mode': 'auto'})


def test_crd_preserve_unknown_fields(server: Api, ns: str, crd: None) -> None:
    spec = {'size': 1, 'mode': 'm', 'extra': {'any': {'thing': [1, 'x']}}}
    code, body = server('POST', crs(ns), fidelity('f1', spec))
    assert (code, body['spec']) == (201, spec)
    assert server('GET', crs(ns, 'f1'))[1]['spec'] == spec


def test_whole_floats_are_stored_as_integers(server: Api, ns: str, crd: None) -> None:
    # Go's float64 in the shortest form: a mutating webhook's 1.0 is read back as 1 by the operator too.
    numbers = [1.0, 2.5, 1e3, -0.0, 1e21, 12345678901234567.0]
    code, body = server('POST', crs(ns), fidelity('f1', {'size': 1, 'extra': {'numbers': numbers}}))
    expected = '[1, 2.5, 1000, 0, 1e+21, 12345678901234568]'
    assert (code, json.dumps(body['spec']['extra']['numbers'])) == (201, expected)
    patch = {'spec': {'extra': {'numbers': [3.0]}}}
    code, body = server('PATCH', crs(ns, 'f1'), patch, ctype=MERGE)
    assert (code, json.dumps(body['spec']['extra']['numbers'])) == (200, '[3]')


# ------------------------------------------------------------------------------------------------
# Leases.

def test_leases_create_and_update(server: Api, ns: str) -> None:
    path = f'/apis/coordination.k8s.io/v1/namespaces/{ns}/leases'
    lease = {'apiVersion': 'coordination.k8s.io/v1', 'kind': 'Lease', 'metadata': {'name': 'l1'},
             'spec': {'holderIdentity': 'a', 'leaseDurationSeconds': 15}}
    code, created = server('POST', path, lease)
    assert (code, norm(created)['spec']) == (201, {'holderIdentity': 'a', 'leaseDurationSeconds': 15})
    changed = {**created, 'spec': {**created['spec'], 'holderIdentity': 'b', 'leaseTransitions': 1}}
    code, body = server('PUT', f'{path}/l1', changed)
    assert (code, body['spec']['holderIdentity'], body['spec']['leaseTransitions']) == (200, 'b', 1)
    assert failure(server('PUT', f'{path}/l1', changed))[:2] == (409, 'Conflict')


# ------------------------------------------------------------------------------------------------
# Namespaces.

def test_namespace_deletion_marks_it_terminating(server: Api) -> None:
    name = f'fid-{uuid.uuid4().hex[:8]}'
    assert server('POST', '/api/v1/namespaces', {'metadata': {'name': name}})[0] == 201
    assert server('POST', cms(name), configmap('cm1'))[0] == 201
    code, body = server('DELETE', f'/api/v1/namespaces/{name}')
    assert (code, body['status']['phase']) == (200, 'Terminating')
    assert 'deletionTimestamp' in body['metadata']


@known('namespaces and their contents are deleted at once, within the request (no namespace controller)')
def test_terminating_namespace_is_kept_until_emptied(server: Api) -> None:
    # The real control plane has no kube-controller-manager: its namespaces stay Terminating forever.
    name = f'fid-{uuid.uuid4().hex[:8]}'
    assert server('POST', '/api/v1/namespaces', {'metadata': {'name': name}})[0] == 201
    assert server('POST', cms(name), configmap('cm1'))[0] == 201
    assert server('DELETE', f'/api/v1/namespaces/{name}')[0] == 200
    code, body = server('GET', f'/api/v1/namespaces/{name}')
    assert code == 200, body
    assert (body['status']['phase'], body['spec']) == ('Terminating', {'finalizers': ['kubernetes']})
    assert failure(server('POST', cms(name), configmap('cm2')))[:2] == (403, 'Forbidden')


# ------------------------------------------------------------------------------------------------
# The CRDs' structural schemas (the cases shared with tests/emulator/test_schemas.py).

@pytest.mark.parametrize('case', crd_schemas.CREATIONS, ids=[case.id for case in crd_schemas.CREATIONS])
def test_schema_on_creation(server: Api, ns: str, schematics: None, case: crd_schemas.Creation) -> None:
    code, body = server('POST', crd_schemas.path(ns), case.body, **case.params)
    crd_schemas.check_creation(case, code, body, server.warnings)


def _step(server: Api, ns: str, name: str, step: crd_schemas.Step) -> tuple[int, Any, list[str]]:
    code, body = server(step.method, crd_schemas.path(ns, name, step.subresource), step.body,
                        ctype=step.content_type, **step.params)
    return code, body, server.warnings


def test_schema_on_changes(server: Api, ns: str, schematics: None) -> None:
    assert server('POST', crd_schemas.path(ns), crd_schemas.TARGET)[0] == 201
    for step in crd_schemas.STEPS:
        crd_schemas.check_step(step, *_step(server, ns, 'target', step))


@pytest.mark.parametrize('case', crd_schemas.RULED_CREATIONS, ids=[c.id for c in crd_schemas.RULED_CREATIONS])
def test_schema_cel_rules_on_creation(
        server: Api, ns: str, schematics: None, case: crd_schemas.Creation) -> None:
    where = crd_schemas.path(ns, plural=crd_schemas.RULES_PLURAL, group=crd_schemas.RULES_GROUP)
    code, body = server('POST', where, case.body, **case.params)
    crd_schemas.check_creation(case, code, body, server.warnings)


def test_schema_cel_transition_rules(server: Api, ns: str, schematics: None) -> None:
    where = crd_schemas.path(ns, plural=crd_schemas.RULES_PLURAL, group=crd_schemas.RULES_GROUP)
    assert server('POST', where, crd_schemas.RULED)[0] == 201
    for step in crd_schemas.TRANSITIONS:
        code, body = server(step.method, f'{where}/ruled', step.body, ctype=step.content_type, **step.params)
        crd_schemas.check_step(step, code, body, server.warnings)


@pytest.mark.parametrize('case', crd_schemas.REFUSED_SCHEMAS, ids=[c.id for c in crd_schemas.REFUSED_SCHEMAS])
def test_crds_with_invalid_schemas_are_refused(server: Api, case: crd_schemas.RefusedSchema) -> None:
    code, body = server('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions',
                        crd_schemas.checked_crd(case.id, case.schema))
    crd_schemas.check_refused(case, code, body)


@pytest.mark.parametrize('id, schema', crd_schemas.ACCEPTED_SCHEMAS,
                         ids=[id for id, _ in crd_schemas.ACCEPTED_SCHEMAS])
def test_crds_with_odd_but_valid_schemas_are_accepted(server: Api, id: str, schema: Any) -> None:
    crd = crd_schemas.checked_crd(id, schema)
    crds = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions'
    code, body = server('POST', crds, crd)
    try:
        assert code == 201, body
    finally:
        server('DELETE', f'{crds}/{crd["metadata"]["name"]}')


@pytest.mark.parametrize('case', pruning.CASES, ids=[case.id for case in pruning.CASES])
def test_unknown_fields_of_builtin_objects_and_metadata(server: Api, ns: str, case: pruning.Pruned) -> None:
    code, body = server('POST', pruning.url(ns, case.path), pruning.body(case, ns), **case.params)
    pruning.check(case, code, body, server.warnings)


def test_unknown_fields_of_metadata_in_custom_objects(server: Api, ns: str, schematics: None) -> None:
    body = crd_schemas.schematic('meta', {'size': 1, 'unknown': 1}, top=1)
    body['metadata'].update(foo=1, ownerReferences=[{'apiVersion': 'v1', 'kind': 'X', 'name': 'x', 'uid': 'u',
                                                     'zzz': 1}])
    code, created = server('POST', crd_schemas.path(ns), body)
    assert (code, 'foo' in created['metadata'], 'zzz' in created['metadata']['ownerReferences'][0]) == \
        (201, False, False)
    assert server.warnings == [  # all sorted
        'unknown field "metadata.foo"', 'unknown field "metadata.ownerReferences[0].zzz"',
        'unknown field "spec.unknown"', 'unknown field "top"']
    code, patched = server('PATCH', crd_schemas.path(ns, 'meta'), {'metadata': {'annotation': {'a': 'b'}}},
                           ctype=MERGE)
    assert (code, 'annotation' in patched['metadata']) == (200, False)
    assert server.warnings == ['unknown field "metadata.annotation"']


@pytest.fixture()
def libraries_crd(server: Api) -> None:
    """The CRD whose rules use Kubernetes' CEL libraries (``tests/_cel_libraries.py``), established."""
    code, body = server('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', cel_libraries.CRD)
    assert code in (201, 409), body
    wait_until(lambda: server('GET', f'/apis/{cel_libraries.GROUP}/v1/{cel_libraries.PLURAL}')[0] == 200)


def test_schema_cel_libraries_in_a_valid_object(server: Api, ns: str, libraries_crd: None) -> None:
    code, body = server('POST', cel_libraries.path(ns), cel_libraries.library('valid', cel_libraries.VALID))
    assert (code, body['spec']) == (201, cel_libraries.VALID), body


@pytest.mark.parametrize('case', cel_libraries.INVALID, ids=[case.id for case in cel_libraries.INVALID])
def test_schema_cel_libraries_in_invalid_objects(
        server: Api, ns: str, libraries_crd: None, case: cel_libraries.Invalid) -> None:
    spec = {**cel_libraries.VALID, **case.changes}
    code, body = server('POST', cel_libraries.path(ns), cel_libraries.library(case.id, spec))
    cel_libraries.check_invalid(case, code, body)


def test_schema_ratcheting(server: Api, ns: str) -> None:
    # A CRD of its own (another group), since it is changed; removed after the test.
    group = f'r{uuid.uuid4().hex[:8]}.kopf.dev'
    crd = json.loads(json.dumps(crd_schemas.CRD).replace(crd_schemas.GROUP, group))
    crds = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions'
    name = f'{crd_schemas.PLURAL}.{group}'
    assert server('POST', crds, crd)[0] == 201
    try:
        url = f'/apis/{group}/v1/namespaces/{ns}/{crd_schemas.PLURAL}'
        wait_until(lambda: server('GET', url)[0] == 200)
        ratcheted = json.loads(json.dumps(crd_schemas.RATCHETED).replace(crd_schemas.GROUP, group))
        assert server('POST', url, ratcheted)[0] == 201

        def tighten() -> bool:
            current = server('GET', f'{crds}/{name}')[1]
            return server('PUT', f'{crds}/{name}', crd_schemas.tightened(current))[0] == 200
        wait_until(tighten)
        new = json.loads(json.dumps(crd_schemas.RATCHETED_NEW.body).replace(crd_schemas.GROUP, group))
        wait_until(lambda: server('POST', url, new)[0] == 422)  # the new schema is in force
        for step in crd_schemas.RATCHETING:
            subresource = f'/{step.subresource}' if step.subresource else ''
            code, body = server(step.method, f'{url}/ratcheted{subresource}', step.body,
                                ctype=step.content_type, **step.params)
            expected = json.loads(json.dumps(step.expected).replace(crd_schemas.GROUP, group))
            crd_schemas.check_step(step._replace(expected=expected), code, body, server.warnings)
    finally:
        server('DELETE', f'{crds}/{name}')


# ------------------------------------------------------------------------------------------------
# The common built-in kinds: defaults, conversions, statuses (shared with tests/emulator/test_builtins.py).

@pytest.mark.parametrize('case', builtin_kinds.CASES, ids=[case.id for case in builtin_kinds.CASES])
def test_builtin_kind_on_creation(server: Api, ns: str, case: builtin_kinds.Case) -> None:
    code, body = server('POST', builtin_kinds.url(ns, case.path), case.body)
    builtin_kinds.check(case, code, body)


@pytest.mark.parametrize('change', builtin_kinds.CHANGES, ids=[change.id for change in builtin_kinds.CHANGES])
def test_builtin_kinds_on_changes(server: Api, ns: str, change: builtin_kinds.Change) -> None:
    code, created = server('POST', builtin_kinds.url(ns, change.path), change.body)
    assert code == 201, created
    code, body = server('PATCH', builtin_kinds.url(ns, change.path, change.body['metadata']['name']),
                        change.patch, ctype=MERGE)
    builtin_kinds.check_change(change, code, body)


def test_builtin_kinds_on_updates(server: Api, ns: str) -> None:
    for case_id, change in builtin_kinds.UPDATES:
        case = next(case for case in builtin_kinds.CASES if case.id == case_id)
        code, created = server('POST', builtin_kinds.url(ns, case.path), case.body)
        assert code == 201, created
        method, body, content_type = change(created)
        code, updated = server(method, builtin_kinds.url(ns, case.path, case.body['metadata']['name']), body,
                               ctype=content_type)
        builtin_kinds.check_update(case_id, created, code, updated)
