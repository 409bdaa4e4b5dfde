"""
The CRDs' structural schemas on the emulator: pruning, defaulting, validation, ``fieldValidation``.

The cases and their expectations are shared with the fidelity tests (``tests/_crd_schemas.py``),
which check them against a real kube-apiserver too.
"""
import copy
import subprocess
import sys
import textwrap
import urllib.parse
from typing import Any

import pytest

from .. import _cel_libraries as libraries
from .. import _crd_schemas as cases
from .. import _pruning as pruning
from .conftest import RawApi

NAMESPACE = 'ns1'
CRDS = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions'


def _url(path: str, params: dict[str, str]) -> str:
    return path + ('?' + urllib.parse.urlencode(params) if params else '')


@pytest.fixture
async def schematics(api: RawApi) -> RawApi:
    assert (await api.post('/api/v1/namespaces', {'metadata': {'name': NAMESPACE}})).status == 201
    assert (await api.post(CRDS, copy.deepcopy(cases.CRD))).status == 201
    assert (await api.post(CRDS, copy.deepcopy(cases.RULES_CRD))).status == 201
    return api


@pytest.mark.parametrize('case', cases.CREATIONS, ids=[case.id for case in cases.CREATIONS])
async def test_creation(schematics: RawApi, case: cases.Creation) -> None:
    reply = await schematics.post(_url(cases.path(NAMESPACE), case.params), copy.deepcopy(case.body))
    cases.check_creation(case, reply.status, reply.body, cases.warnings(reply.headers.getall('Warning', [])))


@pytest.mark.parametrize('case', cases.RULED_CREATIONS, ids=[case.id for case in cases.RULED_CREATIONS])
async def test_cel_rules_on_creation(schematics: RawApi, case: cases.Creation) -> None:
    where = cases.path(NAMESPACE, plural=cases.RULES_PLURAL, group=cases.RULES_GROUP)
    reply = await schematics.post(where, copy.deepcopy(case.body))
    cases.check_creation(case, reply.status, reply.body, cases.warnings(reply.headers.getall('Warning', [])))


async def _apply(api: RawApi, name: str, step: cases.Step, **where: str) -> tuple[int, Any, list[str]]:
    reply = await api.request(step.method, _url(cases.path(NAMESPACE, name, step.subresource, **where),
                                                step.params),
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


async def test_cel_transition_rules(schematics: RawApi) -> None:
    where = {'plural': cases.RULES_PLURAL, 'group': cases.RULES_GROUP}
    assert (await schematics.post(cases.path(NAMESPACE, **where), copy.deepcopy(cases.RULED))).status == 201
    for step in cases.TRANSITIONS:
        cases.check_step(step, *await _apply(schematics, 'ruled', step, **where))


def test_cel_rules_are_skipped_with_a_warning_without_cel_python() -> None:
    # Another interpreter, where cel-python cannot be imported (as when kopf-testing[cel] is not installed).
    script = textwrap.dedent(f'''
        import json, logging, sys, urllib.request
        sys.modules['celpy'] = None  # not installed
        logging.basicConfig(level=logging.WARNING, format='%(message)s')
        from kopf.testing.emulator import KubernetesEmulator

        def send(url, method, path, body):
            request = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode(),
                                             headers={{'Content-Type': 'application/json'}})
            with urllib.request.urlopen(request) as response:
                return response.status

        with KubernetesEmulator() as emulator:
            send(emulator.url, 'POST', '/api/v1/namespaces', {{'metadata': {{'name': 'ns1'}}}})
            send(emulator.url, 'POST', {CRDS!r}, {cases.RULES_CRD!r})
            body = {cases.ruled('r1', {'min': 3, 'max': 2})!r}
            where = {cases.path(NAMESPACE, plural=cases.RULES_PLURAL, group=cases.RULES_GROUP)!r}
            print('CREATED', send(emulator.url, 'POST', where, body))
    ''')
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=60)
    assert 'CREATED 201' in result.stdout, result.stderr
    assert 'The CEL rules of CRDs (x-kubernetes-validations) are not checked: cel-python is not installed. ' \
           'To check them as real servers do, install kopf-testing[cel].' in result.stderr


@pytest.mark.parametrize('case', cases.REFUSED_SCHEMAS, ids=[case.id for case in cases.REFUSED_SCHEMAS])
async def test_crds_with_invalid_schemas_are_refused(api: RawApi, case: cases.RefusedSchema) -> None:
    reply = await api.post(CRDS, cases.checked_crd(case.id, case.schema))
    cases.check_refused(case, reply.status, reply.body)
    assert (await api.get(f'{CRDS}/{case.id.replace("-", "")}.checks.kopf.dev')).status == 404


@pytest.mark.parametrize('id, schema', cases.ACCEPTED_SCHEMAS, ids=[id for id, _ in cases.ACCEPTED_SCHEMAS])
async def test_crds_with_odd_but_valid_schemas_are_accepted(api: RawApi, id: str, schema: Any) -> None:
    reply = await api.post(CRDS, cases.checked_crd(id, schema))
    assert reply.status == 201, reply.body


async def test_a_crd_update_with_an_invalid_schema_is_refused_and_changes_nothing(schematics: RawApi) -> None:
    crd = (await schematics.get(f'{CRDS}/{cases.PLURAL}.{cases.GROUP}')).body
    crd['spec']['versions'][0]['schema']['openAPIV3Schema']['properties']['spec']['properties']['size'] = {}
    reply = await schematics.put(f'{CRDS}/{cases.PLURAL}.{cases.GROUP}', crd)
    assert (reply.status, [cause['field'] for cause in reply.body['details']['causes']]) == (
        422, ['spec.validation.openAPIV3Schema.properties[spec].properties[size].type'])
    reply = await schematics.post(cases.path(NAMESPACE), cases.schematic('still', {'size': 'x'}))
    assert reply.status == 422  # the old schema still applies


@pytest.mark.parametrize('case', pruning.CASES, ids=[case.id for case in pruning.CASES])
async def test_unknown_fields_of_builtin_objects_and_metadata(api: RawApi, case: pruning.Pruned) -> None:
    assert (await api.post('/api/v1/namespaces', {'metadata': {'name': NAMESPACE}})).status == 201
    where = _url(pruning.url(NAMESPACE, case.path), case.params)
    reply = await api.post(where, pruning.body(case, NAMESPACE))
    pruning.check(case, reply.status, reply.body, cases.warnings(reply.headers.getall('Warning', [])))


async def test_unknown_fields_of_metadata_in_custom_objects(schematics: RawApi) -> None:
    body = cases.schematic('meta', {'size': 1, 'unknown': 1}, top=1)
    body['metadata'].update(foo=1, ownerReferences=[{'apiVersion': 'v1', 'kind': 'X', 'name': 'x', 'uid': 'u',
                                                     'zzz': 1}])
    reply = await schematics.post(cases.path(NAMESPACE), body)
    metadata = reply.body['metadata']
    assert (reply.status, 'foo' in metadata, 'zzz' in metadata['ownerReferences'][0]) == (201, False, False)
    assert cases.warnings(reply.headers.getall('Warning', [])) == [  # all sorted
        'unknown field "metadata.foo"', 'unknown field "metadata.ownerReferences[0].zzz"',
        'unknown field "spec.unknown"', 'unknown field "top"']
    patch = {'metadata': {'annotation': {'a': 'b'}}}  # a typo of "annotations"
    reply = await schematics.patch(cases.path(NAMESPACE, 'meta'), patch)
    assert (reply.status, 'annotation' in reply.body['metadata']) == (200, False)
    assert cases.warnings(reply.headers.getall('Warning', [])) == ['unknown field "metadata.annotation"']


async def test_unknown_fields_of_metadata_without_a_schema(api: RawApi, crd: Any) -> None:
    body = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'e1', 'foo': 1},
            'spec': {'any': 1}}
    reply = await api.post('/apis/kopf.dev/v1/namespaces/default/kopfexamples', body)
    assert (reply.status, 'foo' in reply.body['metadata'], reply.body['spec']) == (201, False, {'any': 1})
    assert cases.warnings(reply.headers.getall('Warning', [])) == ['unknown field "metadata.foo"']


@pytest.fixture
async def libraries_crd(api: RawApi) -> RawApi:
    assert (await api.post('/api/v1/namespaces', {'metadata': {'name': NAMESPACE}})).status == 201
    assert (await api.post(CRDS, copy.deepcopy(libraries.CRD))).status == 201
    return api


async def test_cel_libraries_of_kubernetes_in_a_valid_object(libraries_crd: RawApi) -> None:
    reply = await libraries_crd.post(libraries.path(NAMESPACE), libraries.library('valid', libraries.VALID))
    assert (reply.status, reply.body['spec']) == (201, libraries.VALID)


@pytest.mark.parametrize('case', libraries.INVALID, ids=[case.id for case in libraries.INVALID])
async def test_cel_libraries_of_kubernetes_in_invalid_objects(
        libraries_crd: RawApi, case: libraries.Invalid) -> None:
    spec = {**libraries.VALID, **case.changes}
    reply = await libraries_crd.post(libraries.path(NAMESPACE), libraries.library(case.id, spec))
    libraries.check_invalid(case, reply.status, reply.body)


def test_cel_rules_that_cel_python_cannot_evaluate_are_skipped_with_a_warning_once() -> None:
    # Another interpreter, for its log from the start (the warning is once per rule and process).
    rule = libraries.RULES[libraries.UNSUPPORTED]
    crd = {**libraries.CRD, 'spec': {**libraries.CRD['spec'], 'versions': [{
        'name': 'v1', 'served': True, 'storage': True, 'schema': {'openAPIV3Schema': {
            'type': 'object', 'properties': {'spec': {
                'type': 'object', 'properties': {'s': {'type': 'string'}},
                'x-kubernetes-validations': [{'rule': rule}, {'rule': "self.s.startsWith('x')"}],
            }}}}}]}}
    script = textwrap.dedent(f'''
        import json, logging, urllib.error, urllib.request
        logging.basicConfig(level=logging.WARNING, format='%(message)s')
        from kopf.testing.emulator import KubernetesEmulator

        def send(url, method, path, body):
            request = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode(),
                                             headers={{'Content-Type': 'application/json'}})
            try:
                with urllib.request.urlopen(request) as response:
                    return response.status
            except urllib.error.HTTPError as e:
                return e.code

        with KubernetesEmulator() as emulator:
            send(emulator.url, 'POST', '/api/v1/namespaces', {{'metadata': {{'name': 'ns1'}}}})
            send(emulator.url, 'POST', {CRDS!r}, {crd!r})
            where = {libraries.path(NAMESPACE)!r}
            for name, s in [('o1', 'xy'), ('o2', 'xz'), ('o3', 'y')]:
                print(name, send(emulator.url, 'POST', where, {libraries.library('', {})!r} | {{
                    'metadata': {{'name': name}}, 'spec': {{'s': s}}}}))
    ''')
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ['o1', '201', 'o2', '201', 'o3', '422'], result.stderr
    warning = (f'The CEL rule {rule!r} is not checked by the emulator (its objects pass it as if valid): '
               f'CELParseError: {rule}. Test it on a real API server.')
    assert result.stderr.splitlines() == [warning]


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
