"""
The unknown fields of built-in objects and of ``metadata``, as real kube-apiservers prune them.

Shared by the emulator's own tests (``tests/emulator/test_schemas.py``) and the fidelity tests
(``tests/kubeapi/test_fidelity.py``, on both the emulator and a real kube-apiserver v1.37).
A built-in kind's unknown fields are warned of in the order of the body; a custom object's, sorted.
"""
import json
from typing import Any, NamedTuple

_OWNER = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': 'owner', 'uid': 'u1', 'zzz': 1}
_KEPT_OWNER = {key: value for key, value in _OWNER.items() if key != 'zzz'}


class Pruned(NamedTuple):
    id: str
    path: str  # the plural under the namespace, with its group if any ("coordination.k8s.io/leases")
    body: dict[str, Any]
    params: dict[str, str]
    code: int
    expected: dict[str, Any]  # some fields of the stored object (``None``: absent), or the Status's message
    warnings: list[str]


_STRICT = ('ConfigMap in version "v1" cannot be handled as a ConfigMap: strict decoding error: '
           'unknown field "metadata.foo"')


def _unknown(*paths: str) -> list[str]:
    return [f'unknown field "{path}"' for path in paths]


CASES: list[Pruned] = [
    Pruned('configmap', 'configmaps', {
        'bar': 2, 'apiVersion': 'v1', 'kind': 'ConfigMap',
        'metadata': {'name': 'pruned', 'foo': 1, 'ownerReferences': [_OWNER]}, 'data': {'a': 'b'}, 'aaa': 3,
    }, {}, 201, {'bar': None, 'aaa': None, 'data': {'a': 'b'}, 'metadata.foo': None,
                 'metadata.ownerReferences': [_KEPT_OWNER]},
        _unknown('bar', 'metadata.foo', 'metadata.ownerReferences[0].zzz', 'aaa')),
    Pruned('configmap-strict', 'configmaps', {
        'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'strict', 'foo': 1},
    }, {'fieldValidation': 'Strict'}, 400, {'message': _STRICT}, []),
    Pruned('configmap-ignored', 'configmaps', {
        'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'ignored', 'foo': 1}, 'bar': 1,
    }, {'fieldValidation': 'Ignore'}, 201, {'bar': None, 'metadata.foo': None}, []),
    Pruned('lease-status', 'coordination.k8s.io/leases', {
        'apiVersion': 'coordination.k8s.io/v1', 'kind': 'Lease', 'metadata': {'name': 'lease'},
        'spec': {'holderIdentity': 'a'}, 'status': {'x': 1},
    }, {}, 201, {'status': None, 'spec': {'holderIdentity': 'a'}}, _unknown('status')),
    Pruned('event-as-kopf-posts-it', 'events', {  # all fields known: nothing pruned, no warnings
        'apiVersion': 'v1', 'kind': 'Event', 'metadata': {'generateName': 'kopf-event-'},
        'action': 'Action', 'reason': 'Logging', 'message': 'Hello', 'type': 'Normal',
        'source': {'component': 'kopf'}, 'reportingComponent': 'kopf', 'reportingInstance': 'dev',
        'firstTimestamp': '2026-01-01T00:00:00Z', 'lastTimestamp': '2026-01-01T00:00:00Z', 'count': 1,
        'eventTime': None, 'involvedObject': {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': 'x',
                                              'namespace': '<namespace>'},
    }, {}, 201, {'reason': 'Logging', 'message': 'Hello', 'count': 1}, []),
]


def body(case: Pruned, namespace: str) -> dict[str, Any]:
    """The case's body, in the namespace (where it names it)."""
    return json.loads(json.dumps(case.body).replace('<namespace>', namespace))


def url(namespace: str, path: str) -> str:
    group, _, plural = path.rpartition('/')
    base = f'/apis/{group}/v1' if group else '/api/v1'
    return f'{base}/namespaces/{namespace}/{plural}'


def check(case: Pruned, code: int, body: Any, warned: list[str]) -> None:
    if case.code >= 300:
        assert (code, body.get('message'), warned) == (case.code, case.expected['message'], case.warnings)
        return
    found = {}
    for key in case.expected:
        value = body
        for step in key.split('.'):
            value = value.get(step) if isinstance(value, dict) else None
        found[key] = value
    assert (code, found, warned) == (case.code, case.expected, case.warnings), body
