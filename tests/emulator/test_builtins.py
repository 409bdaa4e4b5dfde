"""
The common built-in kinds as real API servers store them: defaults, conversions, initial statuses, checks.

The cases and their expectations are shared with the fidelity tests (``tests/_builtin_kinds.py``),
which check them against a real kube-apiserver too.
"""
import copy

import pytest

from .. import _builtin_kinds as kinds
from .conftest import RawApi

NAMESPACE = 'ns1'


@pytest.fixture
async def namespaced(api: RawApi) -> RawApi:
    assert (await api.post('/api/v1/namespaces', {'metadata': {'name': NAMESPACE}})).status == 201
    return api


@pytest.mark.parametrize('case', kinds.CASES, ids=[case.id for case in kinds.CASES])
async def test_creation(namespaced: RawApi, case: kinds.Case) -> None:
    reply = await namespaced.post(kinds.url(NAMESPACE, case.path), copy.deepcopy(case.body))
    kinds.check(case, reply.status, reply.body)


async def test_updates_are_defaulted_and_keep_the_allocations(namespaced: RawApi) -> None:
    for case_id, change in kinds.UPDATES:
        case = next(case for case in kinds.CASES if case.id == case_id)
        created = await namespaced.post(kinds.url(NAMESPACE, case.path), copy.deepcopy(case.body))
        assert created.status == 201, created
        where = kinds.url(NAMESPACE, case.path, case.body['metadata']['name'])
        method, body, content_type = change(created.body)
        reply = await namespaced.request(method, where, body, content_type=content_type)
        kinds.check_update(case_id, created.body, reply.status, reply.body)


@pytest.mark.parametrize('change', kinds.CHANGES, ids=[change.id for change in kinds.CHANGES])
async def test_what_cannot_change(namespaced: RawApi, change: kinds.Change) -> None:
    created = await namespaced.post(kinds.url(NAMESPACE, change.path), copy.deepcopy(change.body))
    assert created.status == 201, created.body
    where = kinds.url(NAMESPACE, change.path, change.body['metadata']['name'])
    reply = await namespaced.patch(where, copy.deepcopy(change.patch))
    kinds.check_change(change, reply.status, reply.body)


async def test_a_bound_claim_cannot_grow_without_a_storage_class_that_allows_it(namespaced: RawApi) -> None:
    # As the real servers' PersistentVolumeClaimResize admission plugin: the emulator serves no
    # StorageClasses, so none allows the expansion. The status is set as a controller would.
    body = {'apiVersion': 'v1', 'kind': 'PersistentVolumeClaim', 'metadata': {'name': 'bound'},
            'spec': {'accessModes': ['ReadWriteOnce'], 'resources': {'requests': {'storage': '1Gi'}}}}
    where = kinds.url(NAMESPACE, 'persistentvolumeclaims', 'bound')
    assert (await namespaced.post(kinds.url(NAMESPACE, 'persistentvolumeclaims'), body)).status == 201
    assert (await namespaced.patch(f'{where}/status', {'status': {'phase': 'Bound'}})).status == 200
    reply = await namespaced.patch(where, {'spec': {'resources': {'requests': {'storage': '2Gi'}}}})
    assert (reply.status, reply.body['message']) == (403, (
        'persistentvolumeclaims "bound" is forbidden: only dynamically provisioned pvc can be resized and '
        'the storageclass that provisions the pvc must support resize'))
    reply = await namespaced.patch(where, {'spec': {'accessModes': ['ReadWriteMany']}})
    assert (reply.status, reply.body['details']['causes'][0]['field']) == (422, 'spec')


async def test_an_invalid_docker_config_is_refused_without_its_contents(namespaced: RawApi) -> None:
    body = {'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': 'docker'},
            'type': 'kubernetes.io/dockerconfigjson', 'stringData': {'.dockerconfigjson': 'not-json s3cr3t'}}
    reply = await namespaced.post(kinds.url(NAMESPACE, 'secrets'), body)
    [cause] = reply.body['details']['causes']
    found = (reply.status, cause['field'], cause['reason'])
    assert found == (422, 'data[.dockerconfigjson]', 'FieldValueInvalid')
    assert cause['message'].startswith('Invalid value: "<secret contents redacted>": ')
    assert 's3cr3t' not in str(reply.body)
