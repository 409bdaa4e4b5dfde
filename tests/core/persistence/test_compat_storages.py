"""
Our storages against the original Kopf's storages, call by call (``storages.json``).

Every case is a direct call of a Kopf 1.45.2 storage with some inputs, and its outcome:
the result, the patch, or the error. We make the same call on our storage of the same
class and arguments, and require the same outcome: byte-identical annotation keys and values,
the same reading precedence, the same essence (in the same order of fields).
The cases are grouped by the storage and the operation, to keep the number of tests sane;
each test reports all mismatching cases of its group at once.
"""
import collections
import copy
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.patches import Patch

PROBE: dict[str, Any] = json.loads(
    (pathlib.Path(__file__).parent / 'fixtures' / 'kopf-1.45.2' / 'storages.json').read_text()
)
INPUTS = PROBE['inputs']
StorageFactory = Callable[[dict[str, Any]], Any]
ERRORS: dict[str, type[Exception]] = {'JSONDecodeError': json.JSONDecodeError, 'TypeError': TypeError}


def _grouped(section: str) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for case in PROBE[section]:
        spec = PROBE['storages'][case['storage']]
        groups[f"{case['op']}-{_describe(spec)}"].append(case)
    return dict(groups)


def _describe(spec: dict[str, Any]) -> str:
    if 'storages' in spec:
        children = ','.join(_describe(child) for child in spec['storages'])
        return f"{spec['class']}[{children}]"
    kwargs = ','.join(f'{key}={value!r}'[:30] for key, value in spec.get('kwargs', {}).items())
    return f"{spec['class']}({kwargs})"


def _normalised(value: Any) -> Any:
    """As it would be sent to the API: tuples become lists, etc."""
    return json.loads(json.dumps(value))


def _outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {'result': _normalised(fn())}
    except Exception as e:
        for name, cls in ERRORS.items():
            if isinstance(e, cls):
                return {'error': name}
        return {'error': f'unexpected {type(e).__name__}: {e}'}


def _patch_of(fn: Callable[[Patch], None]) -> dict[str, Any]:
    patch = Patch()
    fn(patch)
    return {'patch': _normalised(patch)}


def _expected(case: dict[str, Any]) -> dict[str, Any]:
    return {key: case[key] for key in ('result', 'error', 'patch') if key in case}


PROGRESS_GROUPS = _grouped('progress')
DIFFBASE_GROUPS = _grouped('diffbase')


def _run_progress_case(storage: Any, case: dict[str, Any]) -> dict[str, Any]:
    op = case['op']
    if op == 'fields':
        return {'result': [list(storage.field), list(storage.touch_field)]}
    if op == 'clear':
        source = {**INPUTS['progress_bodies'], **INPUTS['essence_bodies']}[case['essence']]
        essence = copy.deepcopy(source)
        actual = _outcome(lambda: storage.clear(essence=essence))
        if essence != source:
            actual['input_modified'] = True
        # The order of fields matters for the diff-base: compare the serialised forms too.
        if 'result' in actual and json.dumps(actual['result']) != json.dumps(case['result']):
            actual['order'] = list(actual['result'])
        return actual

    body = Body(copy.deepcopy(INPUTS['progress_bodies'][case['body']]))
    key = case.get('key', '')
    record = copy.deepcopy(INPUTS['records'][case['record']]) if 'record' in case else {}
    if op == 'fetch':
        return _outcome(lambda: storage.fetch(key=key, body=body))
    if op == 'purge':
        return _patch_of(lambda patch: storage.purge(key=key, body=body, patch=patch))
    if op == 'store':
        return _patch_of(lambda patch: storage.store(key=key, record=record, body=body, patch=patch))
    if op == 'store_then_purge':
        def store_then_purge(patch: Patch) -> None:
            storage.store(key=key, record=record, body=body, patch=patch)
            storage.purge(key=key, body=body, patch=patch)
        return _patch_of(store_then_purge)
    if op == 'touch':
        return _patch_of(lambda patch: storage.touch(body=body, patch=patch, value=case['value']))
    raise AssertionError(f'Unknown operation: {op}')


def _run_diffbase_case(storage: Any, case: dict[str, Any]) -> dict[str, Any]:
    op = case['op']
    if op == 'fields':
        return {'result': list(storage.field)}
    if op == 'build':
        source = INPUTS['essence_bodies'][case['body']]
        body = Body(copy.deepcopy(source))
        actual = _outcome(lambda: storage.build(body=body, extra_fields=case['extra_fields']))
        if dict(body) != source:
            actual['body_modified'] = True
        # The order of fields matters for the diff-base: compare the serialised forms too.
        if 'result' in actual and json.dumps(actual['result']) != json.dumps(case['result']):
            actual['order'] = list(actual['result'])
        return actual

    body = Body(copy.deepcopy(INPUTS['diffbase_bodies'][case['body']]))
    if op == 'fetch':
        return _outcome(lambda: storage.fetch(body=body))
    if op == 'store':
        essence = copy.deepcopy(INPUTS['diffbase_essences'][case['essence']])
        return _patch_of(lambda patch: storage.store(body=body, patch=patch, essence=essence))
    raise AssertionError(f'Unknown operation: {op}')


@pytest.mark.parametrize('group', sorted(PROGRESS_GROUPS))
def test_progress_storages_behave_as_kopf(group: str, storage_factory: StorageFactory) -> None:
    mismatches = []
    for case in PROGRESS_GROUPS[group]:
        storage = storage_factory(PROBE['storages'][case['storage']])
        actual = _run_progress_case(storage, case)
        if actual != _expected(case):
            mismatches.append({'case': case, 'actual': actual})
    assert mismatches == []


@pytest.mark.parametrize('group', sorted(DIFFBASE_GROUPS))
def test_diffbase_storages_behave_as_kopf(group: str, storage_factory: StorageFactory) -> None:
    mismatches = []
    for case in DIFFBASE_GROUPS[group]:
        storage = storage_factory(PROBE['storages'][case['storage']])
        actual = _run_diffbase_case(storage, case)
        if actual != _expected(case):
            mismatches.append({'case': case, 'actual': actual})
    assert mismatches == []


@pytest.mark.parametrize('case', PROBE['keys'], ids=lambda case: f"{case['storage']}-{case['key'][:24]}")
def test_keys_are_formed_as_by_kopf(case: dict[str, Any], storage_factory: StorageFactory) -> None:
    storage = storage_factory(PROBE['storages'][case['storage']])
    key = case['key']
    replica_set_of_deployment = Body(INPUTS['marking_bodies']['rs-of-deployment'])
    assert storage.make_safe_key(key) == case['make_safe_key']
    assert storage.make_suffix(key) == case['make_suffix']
    assert storage.make_v1_key(key) == case['make_v1_key']
    assert storage.make_v2_key(key) == case['make_v2_key']
    assert list(storage.make_keys(key)) == case['make_keys']
    assert list(storage.make_keys(key, body=replica_set_of_deployment)) == case['marked_keys']


@pytest.mark.parametrize('case', PROBE['marking'], ids=lambda case: case['body'])
def test_keys_are_marked_as_by_kopf(case: dict[str, Any], storage_factory: StorageFactory) -> None:
    storage = storage_factory({'class': 'AnnotationsProgressStorage'})
    body = Body(INPUTS['marking_bodies'][case['body']])
    assert storage.mark_key('fn', body=body) == case['mark_key']
