"""
The CRDs' structural schemas on the emulator: pruning, defaulting, validation, ``fieldValidation``.

The cases and their expectations are shared with the fidelity tests (``tests/_crd_schemas.py``),
which check them against a real kube-apiserver too.
"""
import copy
import urllib.parse
from typing import Any

import pytest

from .. import _crd_schemas as cases
from .conftest import RawApi

NAMESPACE = 'ns1'
CRDS = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions'


def _url(path: str, params: dict[str, str]) -> str:
    return path + ('?' + urllib.parse.urlencode(params) if params else '')


@pytest.fixture
async def schematics(api: RawApi) -> RawApi:
    assert (await api.post('/api/v1/namespaces', {'metadata': {'name': NAMESPACE}})).status == 201
    assert (await api.post(CRDS, copy.deepcopy(cases.CRD))).status == 201
    return api


@pytest.mark.parametrize('case', cases.CREATIONS, ids=[case.id for case in cases.CREATIONS])
async def test_creation(schematics: RawApi, case: cases.Creation) -> None:
    reply = await schematics.post(_url(cases.path(NAMESPACE), case.params), copy.deepcopy(case.body))
    cases.check_creation(case, reply.status, reply.body, cases.warnings(reply.headers.getall('Warning', [])))


async def _apply(api: RawApi, name: str, step: cases.Step) -> tuple[int, Any, list[str]]:
    reply = await api.request(step.method, _url(cases.path(NAMESPACE, name, step.subresource), step.params),
                              copy.deepcopy(step.body), content_type=step.content_type)
    return reply.status, reply.body, cases.warnings(reply.headers.getall('Warning', []))


async def test_changes(schematics: RawApi) -> None:
    assert (await schematics.post(cases.path(NAMESPACE), copy.deepcopy(cases.TARGET))).status == 201
    for step in cases.STEPS:
        cases.check_step(step, *await _apply(schematics, 'target', step))


async def test_an_update_with_defaults_and_unknown_fields(schematics: RawApi) -> None:
    created = await schematics.post(cases.path(NAMESPACE), copy.deepcopy(cases.TARGET))
    body = {**created.body, 'spec': {'size': 3, 'junk': 1}, 'status': {'phase': 'ignored'}}
    reply = await schematics.put(cases.path(NAMESPACE, 'target'), body)
    found = (reply.status, reply.body['spec'], 'status' in reply.body)
    assert found == (200, {'size': 3, **cases.DEFAULTS}, False)
    assert cases.warnings(reply.headers.getall('Warning', [])) == ['unknown field "spec.junk"']


async def test_ratcheting_after_the_schema_tightens(schematics: RawApi) -> None:
    assert (await schematics.post(cases.path(NAMESPACE), copy.deepcopy(cases.RATCHETED))).status == 201
    crd = (await schematics.get(f'{CRDS}/{cases.PLURAL}.{cases.GROUP}')).body
    assert (await schematics.put(f'{CRDS}/{cases.PLURAL}.{cases.GROUP}', cases.tightened(crd))).status == 200
    for step in cases.RATCHETING:
        cases.check_step(step, *await _apply(schematics, 'ratcheted', step))
    case = cases.RATCHETED_NEW
    reply = await schematics.post(cases.path(NAMESPACE), copy.deepcopy(case.body))
    cases.check_creation(case, reply.status, reply.body, cases.warnings(reply.headers.getall('Warning', [])))


async def test_a_schema_that_preserves_everything_keeps_everything(api: RawApi, crd: Any) -> None:
    body = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'e1'},
            'spec': {'any': {'thing': [1, None, 2.5]}}, 'top': None}
    reply = await api.post('/apis/kopf.dev/v1/namespaces/default/kopfexamples', body)
    assert (reply.status, reply.body['spec'], reply.body['top']) == (201, body['spec'], None)
    assert 'Warning' not in reply.headers
