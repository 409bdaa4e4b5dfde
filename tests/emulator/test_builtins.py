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
