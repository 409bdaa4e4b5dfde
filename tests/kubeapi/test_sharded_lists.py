"""
The server-side sharded lists & watches (``?shardSelector=``, KEP-5866, the feature gate
``ShardedListAndWatch``) on the emulator and on the real kube-apiserver, with the gate on and off:
the same scenarios, the same answers.

What they pin (as probed on kube-apiserver v1.37.2; see :mod:`kopf.testing.emulator.sharding`):
the hash is the 64-bit FNV-1a of the uid (the framework's :func:`~kopf._core.engines.sharding.fnv1a_64`),
the ranges are ``[start, end)`` of 16 lowercase hex digits (``0x10000000000000000`` for the end of the
last one), joined with ``||``; the lists of the built-in resources echo the selector (canonical) in
``metadata.shardInfo``, those of custom resources do not; the watches filter the events too; an invalid
selector is HTTP 500; without the gate, the parameter is ignored silently.
"""
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from kopf._core.engines.sharding import fnv1a_64
from kopf.testing.emulator import KubernetesEmulator

from .._waiting import wait_until

pytestmark = pytest.mark.real_apiserver

WAIT = 30.0
GATE = 'ShardedListAndWatch'
GROUP = 'shards.kopf.dev'
PLURAL = 'shardeds'
CRD = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': f'{PLURAL}.{GROUP}'},
    'spec': {
        'group': GROUP, 'scope': 'Namespaced',
        'names': {'plural': PLURAL, 'singular': 'sharded', 'kind': 'Sharded'},
        'versions': [{'name': 'v1', 'served': True, 'storage': True, 'schema': {
            'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}}}],
    },
}
HALF = 1 << 63
END = 1 << 64


def hexed(value: int) -> str:
    return f'0x{value:016x}'


def shard_range(start: int, end: int, field: str = 'object.metadata.uid') -> str:
    return f"shardRange({field}, '{hexed(start)}', '{hexed(end)}')"


class Api:
    """Raw HTTP to one API server; the responses are ``(status code, JSON body)``."""

    def __init__(self, kind: str, url: str, *, gate: bool,
                 token: str | None = None, ca_path: Any = None) -> None:
        self.kind = kind
        self.gate = gate
        self.url = url
        self.session = requests.Session()
        self.verify = str(ca_path) if ca_path is not None else True
        if token:
            self.session.headers['Authorization'] = f'Bearer {token}'
        self.crd_ready = False

    def __call__(self, method: str, path: str, body: Any = None, **params: str) -> tuple[int, Any]:
        response = self.session.request(method, self.url + path, json=body, params=params or None,
                                        verify=self.verify, timeout=WAIT)
        try:
            return response.status_code, response.json()
        except ValueError:  # e.g. "404 page not found" while a new CRD's resource is not served yet
            return response.status_code, response.text

    def watch(self, path: str, **params: str) -> requests.Response:
        return self.session.get(self.url + path, params={'watch': 'true', **params}, stream=True,
                                verify=self.verify, timeout=WAIT)


@pytest.fixture(scope='module')
def gate_off_control_plane(k8s_control_plane_assets: Any) -> Iterator[Any]:
    from kopf.testing.apiserver import KubernetesControlPlane

    assets = k8s_control_plane_assets
    with KubernetesControlPlane(etcd_path=assets.etcd, kube_apiserver_path=assets.kube_apiserver) as plane:
        yield plane


@pytest.fixture(scope='module', params=['emulator', 'real', 'emulator-without-gate', 'real-without-gate'])
def server(request: pytest.FixtureRequest) -> Iterator[Api]:
    gate = not request.param.endswith('-without-gate')
    if request.param.startswith('emulator'):
        with KubernetesEmulator(feature_gates={GATE: gate}) as emulator:
            api = Api(request.param, emulator.url, gate=gate)
            yield api
            api.session.close()
        return
    if gate:
        plane = request.getfixturevalue('k8s_control_plane')
        if not plane.feature_gates.get(GATE):
            pytest.skip(f'The control plane of the session has no {GATE} (kube-apiserver < 1.36).')
    else:
        plane = request.getfixturevalue('gate_off_control_plane')
    api = Api(request.param, plane.url, gate=gate, token=plane.token, ca_path=plane.ca_path)
    yield api
    api.session.close()


@pytest.fixture()
def ns(server: Api) -> Iterator[str]:
    name = f'shards-{uuid.uuid4().hex[:8]}'
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
    wait_until(lambda: server('GET', f'/apis/{GROUP}/v1/{PLURAL}')[0] == 200)
    # A real server delays the creation of custom objects for 2 s after the CRD is established.
    wait_until(lambda: server('POST', f'/apis/{GROUP}/v1/namespaces/default/{PLURAL}',
                              {'apiVersion': f'{GROUP}/v1', 'kind': 'Sharded',
                               'metadata': {'generateName': 'probe-'}})[0] == 201)
    server.crd_ready = True


def cms(ns: str) -> str:
    return f'/api/v1/namespaces/{ns}/configmaps'


def crs(ns: str) -> str:
    return f'/apis/{GROUP}/v1/namespaces/{ns}/{PLURAL}'


def create(server: Api, path: str, count: int) -> dict[str, int]:
    """Create the objects; their hashes by name."""
    kind = {'apiVersion': f'{GROUP}/v1', 'kind': 'Sharded'} if PLURAL in path else {'apiVersion': 'v1',
                                                                                    'kind': 'ConfigMap'}
    hashes = {}
    for index in range(count):
        code, body = server('POST', path, {**kind, 'metadata': {'name': f'obj{index}'}})
        assert code == 201, body
        hashes[body['metadata']['name']] = fnv1a_64(body['metadata']['uid'])
    return hashes


def listed(server: Api, path: str, selector: str) -> tuple[set[str], dict[str, Any]]:
    code, body = server('GET', path, shardSelector=selector)
    assert code == 200, body
    return {item['metadata']['name'] for item in body['items']}, body['metadata']


@pytest.mark.parametrize('resource', ['configmaps', 'custom'])
def test_lists_keep_the_ranges_of_the_uids_fnv1a_hashes(server: Api, ns: str, crd: None,
                                                        resource: str) -> None:
    path = cms(ns) if resource == 'configmaps' else crs(ns)
    hashes = create(server, path, 30)
    if not server.gate:  # ignored: all of them, whatever the selector
        assert listed(server, path, shard_range(0, HALF))[0] == set(hashes)
        assert listed(server, path, 'garbage')[0] == set(hashes)
        return

    def within(*ranges: tuple[int, int]) -> set[str]:
        return {name for name, value in hashes.items() if any(start <= value < end for start, end in ranges)}

    assert listed(server, path, shard_range(0, HALF))[0] == within((0, HALF))
    assert listed(server, path, shard_range(HALF, END))[0] == within((HALF, END))
    ordered = sorted(hashes.values())
    low, high = ordered[5], ordered[20]  # the start is inclusive, the end exclusive
    assert listed(server, path, shard_range(low, high))[0] == within((low, high))
    assert len(within((low, high))) == 15
    two = f'{shard_range(0, low)} || {shard_range(high, END)}'
    assert listed(server, path, two)[0] == within((0, low), (high, END))
    assert listed(server, path, shard_range(0, 0xffffffffffffffff))[0] == set(hashes)


def test_built_in_lists_echo_the_selector_canonically_and_custom_ones_do_not(server: Api, ns: str,
                                                                             crd: None) -> None:
    given = f"""  ( shardRange(object.metadata.uid,"{hexed(HALF)}", '0x10000000000000000')
                || shardRange(object.metadata.uid, '{hexed(0)}', '{hexed(1 << 62)}') )  """
    _, metadata = listed(server, cms(ns), given)
    if server.gate:
        assert metadata['shardInfo'] == {'selector': f'{shard_range(HALF, END)} || {shard_range(0, 1 << 62)}'}
    else:
        assert 'shardInfo' not in metadata
    _, metadata = listed(server, crs(ns), given)
    assert 'shardInfo' not in metadata  # kube-apiserver 1.37 filters the custom resources with no echo


def test_the_pages_apply_the_selector_of_their_own_request(server: Api, ns: str) -> None:
    hashes = create(server, cms(ns), 20)
    code, first = server('GET', cms(ns), shardSelector=shard_range(0, HALF), limit='3')
    assert code == 200, first
    token = first['metadata'].get('continue')
    if not server.gate:
        assert len(first['items']) == 3 and token
        return
    names = [item['metadata']['name'] for item in first['items']]
    while token:
        code, page = server('GET', cms(ns), shardSelector=shard_range(0, HALF), limit='3',
                            **{'continue': token})
        assert code == 200, page
        names.extend(item['metadata']['name'] for item in page['items'])
        token = page['metadata'].get('continue')
    assert sorted(names) == sorted(name for name, value in hashes.items() if value < HALF)


@pytest.mark.parametrize('selector, message', [
    (f"shardRange(object.metadata.uid, '0x0', '{hexed(HALF)}')",
     'hexStart must be a 0x-prefixed 16-digit hex value, got "0x0" (did you mean "0x0000000000000000"?)'),
    (f"shardRange(object.metadata.uid, '{hexed(0)}', '0X8000000000000000')",
     'hexEnd must have \'0x\' prefix, got "0X8000000000000000"'),
    (f"shardRange(object.metadata.uid, '{hexed(0)}', '0x800000000000000A')",
     'hexEnd: invalid hex character "A" in "0x800000000000000A"'),
    (f"shardRange(object.metadata.uid, '{hexed(0)}', '0x10000000000000001')",
     "hexEnd: 17-digit hex value must be '0x10000000000000000' (2^64), got \"0x10000000000000001\""),
    (f"shardRange(object.metadata.uid, '{hexed(HALF)}', '{hexed(HALF)}')",
     'shard range start 0x8000000000000000 must be less than end 0x8000000000000000'),
    (f"shardRange(object.metadata.name, '{hexed(0)}', '{hexed(HALF)}')",
     'unsupported field path "object.metadata.name"; '
     'supported: object.metadata.uid, object.metadata.namespace'),
    (f"{shard_range(0, HALF)} && {shard_range(0, 1)}",
     'unsupported function "_&&_"; only shardRange() and || are allowed'),
    (f"{shard_range(0, HALF)} || {shard_range(HALF, END, 'object.metadata.namespace')}",
     'all shard ranges must use the same field, got "object.metadata.uid" and "object.metadata.namespace"'),
    (f"shardRange(object.metadata.uid, '{hexed(0)}')", 'shardRange() requires exactly 3 arguments, got 2'),
    ('garbage', 'unexpected expression kind 3; expected shardRange() call or || operator'),
])
def test_invalid_selectors_fail_lists_and_watches_with_500(server: Api, ns: str,
                                                          selector: str, message: str) -> None:
    code, body = server('GET', cms(ns), shardSelector=selector)
    if not server.gate:
        assert code == 200 and 'shardInfo' not in body['metadata']
        return
    assert (code, body) == (500, {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                                  'message': f'invalid shard selector: {message}', 'code': 500})
    with server.watch(cms(ns), shardSelector=selector) as response:
        assert response.status_code == 500
        assert response.json()['message'] == f'invalid shard selector: {message}'


@pytest.mark.parametrize('resource', ['configmaps', 'custom'])
def test_watches_send_only_the_events_of_the_ranges(server: Api, ns: str, crd: None, resource: str) -> None:
    path = cms(ns) if resource == 'configmaps' else crs(ns)
    hashes = create(server, path, 20)

    def kept(name: str) -> bool:
        return hashes[name] < HALF or not server.gate

    seen: list[tuple[str, str]] = []
    with server.watch(path, shardSelector=shard_range(0, HALF), allowWatchBookmarks='true',
                      sendInitialEvents='true', resourceVersionMatch='NotOlderThan') as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:  # the initial events, till their end's bookmark
            event = json.loads(line)
            if event['type'] == 'BOOKMARK':
                assert set(event['object']['metadata']) == {'resourceVersion', 'annotations'}  # no shard info
                break
            seen.append((event['type'], event['object']['metadata']['name']))
        assert sorted(seen) == sorted(('ADDED', name) for name in hashes if kept(name))

        # The live events: deletions & creations until the latest creation is in the range (at least 10 of
        # each), so that the events of all the others have come before it.
        seen.clear()
        kind = {'apiVersion': 'v1', 'kind': 'ConfigMap'} if resource == 'configmaps' else \
            {'apiVersion': f'{GROUP}/v1', 'kind': 'Sharded'}
        deleted: list[str] = []
        created: list[str] = []
        while len(created) < 10 or not kept(created[-1]):
            deleted.append(f'obj{len(deleted)}')
            assert server('DELETE', f'{path}/{deleted[-1]}')[0] == 200
            created.append(f'obj{20 + len(created)}')
            code, body = server('POST', path, {**kind, 'metadata': {'name': created[-1]}})
            assert code == 201, body
            hashes[created[-1]] = fnv1a_64(body['metadata']['uid'])
        for line in lines:
            event = json.loads(line)
            if event['type'] != 'BOOKMARK':
                seen.append((event['type'], event['object']['metadata']['name']))
            if seen and seen[-1] == ('ADDED', created[-1]):
                break
    assert sorted(seen) == sorted([('DELETED', name) for name in deleted if kept(name)] +
                                  [('ADDED', name) for name in created if kept(name)])
