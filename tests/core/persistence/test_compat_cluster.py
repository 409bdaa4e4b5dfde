"""
Our storages against what the original Kopf has written to a cluster (the scenario fixtures).

Each scenario fixture has the objects before and after, and every request sent to them.
The requests are replayed on the "before" state, so that the state of the object is known
before each of Kopf's patches. Then, for every patch, we make our storages do what Kopf
has done there (store these records, purge those, touch, store the diff-base) on that state,
and require the very same patch: the same keys, byte-identical values, the same markers.
Also, the objects as Kopf has left them must look handled to our storages, and vice versa.
"""
import copy
import json
import pathlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonpatch
import pytest

from kopf._cogs.structs import dicts
from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.patches import Patch, apply_merge_patch
from kopf._core import persistence

FIXTURES = pathlib.Path(__file__).parent / 'fixtures' / 'kopf-1.45.2'
SCENARIOS = {path.stem: json.loads(path.read_text())
             for path in sorted(FIXTURES.glob('*.json')) if path.name != 'storages.json'}
INVOKED = re.compile(r"Handler '([^']+)' is invoked")


def _default_progress() -> persistence.ProgressStorage:
    return persistence.SmartProgressStorage()


def _default_diffbase() -> persistence.DiffBaseStorage:
    return persistence.AnnotationsDiffBaseStorage()


# How each scenario's operator configured its storages (see the "operator" of the fixtures).
ProgressFactory = Callable[[], persistence.ProgressStorage]
DiffBaseFactory = Callable[[], persistence.DiffBaseStorage]
CONFIGURED: dict[str, tuple[ProgressFactory, DiffBaseFactory]] = {
    'status-progress': (persistence.StatusProgressStorage, _default_diffbase),
    'status-diffbase': (_default_progress, persistence.StatusDiffBaseStorage),
    'custom-prefix': (
        lambda: persistence.AnnotationsProgressStorage(prefix='my-op.example.com'),
        lambda: persistence.AnnotationsDiffBaseStorage(prefix='my-op.example.com'),
    ),
    'verbose-progress': (lambda: persistence.AnnotationsProgressStorage(verbose=True), _default_diffbase),
    'multi-progress': (
        lambda: persistence.MultiProgressStorage([
            persistence.AnnotationsProgressStorage(prefix='my-op.example.com'),
            persistence.StatusProgressStorage(field='status.my-op'),
        ]),
        _default_diffbase,
    ),
}


def storages_of(scenario: str) -> tuple[persistence.ProgressStorage, persistence.DiffBaseStorage]:
    progress_factory, diffbase_factory = CONFIGURED.get(scenario, (_default_progress, _default_diffbase))
    return progress_factory(), diffbase_factory()


def leaf_storages(storage: persistence.ProgressStorage) -> list[persistence.ProgressStorage]:
    if isinstance(storage, persistence.MultiProgressStorage):
        return [leaf for child in storage.storages for leaf in leaf_storages(child)]
    return [storage]


def handler_ids(fixture: dict[str, Any]) -> set[str]:
    """All handler ids seen in the scenario: invoked, or referred to in the status records."""
    ids = {match.group(1) for line in fixture['log'] for match in INVOKED.finditer(line)}
    for request in fixture['requests']:
        for container_path in [('status', 'kopf', 'progress'), ('status', 'my-op')]:
            container = dicts.resolve(request['body'], container_path, None)
            if isinstance(container, dict):
                ids.update(container)
    for state in fixture['objects'].values():
        container = dicts.resolve(state['before'], ('status', 'kopf', 'progress'), None)
        if isinstance(container, dict):
            ids.update(container)
    return ids


def replay(fixture: dict[str, Any], name: str = 'kex1') -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """The requests to the object, each with the object's state right before it."""
    body: dict[str, Any] | None = copy.deepcopy(fixture['objects'][name]['before'])
    for request in fixture['requests']:
        if not request['path'].endswith(f'/{name}') and not request['path'].endswith(f'/{name}/status'):
            continue
        assert body is not None, 'A request to an object that is already deleted.'
        yield copy.deepcopy(body), request
        if request['method'] == 'PATCH' and request['content_type'] == 'application/json-patch+json':
            ops = [op for op in request['body'] if op['op'] != 'test']
            body = jsonpatch.apply_patch(body, ops)
        elif request['method'] == 'PATCH' and request['path'].endswith('/status'):
            body = apply_merge_patch(body, {'status': request['body'].get('status')})
        elif request['method'] == 'PATCH':
            body = apply_merge_patch(body, {k: v for k, v in request['body'].items() if k != 'status'})
        elif request['method'] == 'DELETE':
            if body.get('metadata', {}).get('finalizers'):
                body = apply_merge_patch(body, {'metadata': {'deletionTimestamp': '<deletionTimestamp>'}})
            else:
                body = None


def kopf_patches(fixture: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for body, request in replay(fixture):
        if request['actor'] == 'kopf' and request['method'] == 'PATCH':
            yield body, request


def reproduce_annotations(
        scenario: str,
        body: dict[str, Any],
        annotations: dict[str, Any],
) -> dict[str, Any]:
    """Make our storages write what Kopf has written to these annotations; return our annotations."""
    progress, diffbase = storages_of(scenario)
    leaves = [leaf for leaf in leaf_storages(progress)
              if isinstance(leaf, persistence.AnnotationsProgressStorage)]
    keys_to_ids = {key: (leaf, handler_id)
                   for leaf in leaves for handler_id in handler_ids(SCENARIOS[scenario])
                   for key in leaf.make_keys(handler_id, body=Body(body))}
    touch_keys = {key: leaf for leaf in leaves for key in leaf.make_keys(leaf.touch_key, body=Body(body))}
    diffbase_keys = (set(diffbase.make_keys(diffbase.key, body=Body(body)))
                     if isinstance(diffbase, persistence.AnnotationsDiffBaseStorage) else set())
    patch = Patch()
    for key, value in annotations.items():
        if key in diffbase_keys:
            diffbase.store(body=Body(body), patch=patch, essence=json.loads(value))
        elif key in touch_keys:
            touch_keys[key].touch(body=Body(body), patch=patch, value=value)
        elif key in keys_to_ids:
            leaf, handler_id = keys_to_ids[key]
            if value is None:
                leaf.purge(key=handler_id, body=Body(body), patch=patch)
            else:
                record = leaf.fetch(key=handler_id, body=Body({'metadata': {'annotations': {key: value}}}))
                assert record is not None
                leaf.store(key=handler_id, record=record, body=Body(body), patch=patch)
        elif not key.endswith('/kopf-managed'):  # the markers are expected to come from the storages
            raise AssertionError(f'Kopf has written an annotation that we cannot explain: {key!r}')
    return dict(patch.get('metadata', {}).get('annotations', {}))


ANNOTATING = [(scenario, index) for scenario, fixture in SCENARIOS.items()
              for index, (_, request) in enumerate(kopf_patches(fixture))
              if isinstance(request['body'], dict) and request['body'].get('metadata', {}).get('annotations')]


@pytest.mark.parametrize('scenario, index', ANNOTATING)
def test_annotation_patches_are_reproduced_exactly(scenario: str, index: int) -> None:
    body, request = list(kopf_patches(SCENARIOS[scenario]))[index]
    kopf_annotations = request['body']['metadata']['annotations']
    our_annotations = reproduce_annotations(scenario, body, kopf_annotations)
    assert our_annotations == kopf_annotations


STATUS_PROGRESS = [(scenario, index) for scenario, fixture in SCENARIOS.items()
                   for index, (_, request) in enumerate(kopf_patches(fixture))
                   if request['path'].endswith('/status')
                   and any(isinstance(request['body']['status'].get(field), dict)
                           for field in ('kopf', 'my-op'))]


@pytest.mark.parametrize('scenario, index', STATUS_PROGRESS)
def test_status_progress_patches_are_reproduced_exactly(scenario: str, index: int) -> None:
    body, request = list(kopf_patches(SCENARIOS[scenario]))[index]
    progress, diffbase = storages_of(scenario)
    leaves = [leaf for leaf in leaf_storages(progress) if isinstance(leaf, persistence.StatusProgressStorage)]
    kopf_patch = request['body']
    patch = Patch()
    for leaf in leaves:
        container: dict[str, Any] = dicts.resolve(kopf_patch, leaf.field, {})
        for handler_id, record in container.items():
            if record is None:
                leaf.purge(key=handler_id, body=Body(body), patch=patch)
            else:
                leaf.store(key=handler_id, record=record, body=Body(body), patch=patch)
        touched = dicts.resolve(kopf_patch, leaf.touch_field, ...)
        if touched is not ...:
            leaf.touch(body=Body(body), patch=patch, value=touched)
    if isinstance(diffbase, persistence.StatusDiffBaseStorage):
        encoded = dicts.resolve(kopf_patch, diffbase.field, None)
        if encoded is not None:
            diffbase.store(body=Body(body), patch=patch, essence=json.loads(encoded))
    expected = copy.deepcopy(kopf_patch)
    for field in ['kopf', 'my-op']:  # everything else in the status are the handlers' results
        if not isinstance(expected['status'].get(field), dict):
            expected['status'].pop(field, None)
    expected['status'] = {key: value for key, value in expected['status'].items() if key in ('kopf', 'my-op')}
    assert json.loads(json.dumps(patch)) == expected


HANDLED = [scenario for scenario, fixture in SCENARIOS.items()
           if fixture['objects']['kex1']['after'] is not None and not fixture['notes']
           and scenario not in {'arbitrary-exception', 'verbose-progress'}]  # these are still in progress


@pytest.mark.parametrize('scenario', HANDLED)
def test_diffbase_is_byte_identical_to_kopfs(scenario: str) -> None:
    after = SCENARIOS[scenario]['objects']['kex1']['after']
    _, diffbase = storages_of(scenario)
    patch = Patch()
    diffbase.store(body=Body(after), patch=patch, essence=diffbase.build(body=Body(after)))
    for path, value in _leaves(patch):
        assert dicts.resolve(after, path) == value


@pytest.mark.parametrize('scenario', HANDLED)
def test_objects_handled_by_kopf_look_handled_to_us(scenario: str) -> None:
    after = Body(SCENARIOS[scenario]['objects']['kex1']['after'])
    progress, diffbase = storages_of(scenario)
    assert diffbase.fetch(body=after) == diffbase.build(body=after)
    for handler_id in handler_ids(SCENARIOS[scenario]):
        assert progress.fetch(key=handler_id, body=after) is None  # all purged


@pytest.mark.parametrize('scenario', ['arbitrary-exception', 'verbose-progress'])
def test_objects_in_progress_by_kopf_are_in_progress_for_us(scenario: str) -> None:
    after = Body(SCENARIOS[scenario]['objects']['kex1']['after'])
    progress, diffbase = storages_of(scenario)
    assert diffbase.fetch(body=after) is None  # never finished
    records = {handler_id: progress.fetch(key=handler_id, body=after)
               for handler_id in handler_ids(SCENARIOS[scenario])}
    succeeded = {handler_id for handler_id, record in records.items() if record and record.get('success')}
    delayed = {handler_id for handler_id, record in records.items() if record and record.get('delayed')}
    assert succeeded == {'create_ok'} if scenario == 'arbitrary-exception' else {'create_a'}
    assert delayed == {'create_raises'} if scenario == 'arbitrary-exception' else {'create_retry'}


def test_diffbase_written_by_another_instance_is_recognised() -> None:
    # Kopf has seen this diff-base and has done nothing: we must consider it handled too.
    before = Body(SCENARIOS['diffbase-only-same']['objects']['kex1']['before'])
    diffbase = persistence.AnnotationsDiffBaseStorage()
    assert diffbase.fetch(body=before) == diffbase.build(body=before)
    assert SCENARIOS['diffbase-only-same']['requests'] == []


def test_outdated_diffbase_is_recognised_as_a_change() -> None:
    before = Body(SCENARIOS['diffbase-only-changed']['objects']['kex1']['before'])
    diffbase = persistence.AnnotationsDiffBaseStorage()
    old = diffbase.fetch(body=before)
    new = diffbase.build(body=before)
    assert old is not None
    assert old != new
    assert old['spec'] == {'duration': '1m', 'field': 'old-value'}


def test_legacy_status_records_are_honoured_by_the_default_storage() -> None:
    fixture = SCENARIOS['smart-reads-status']
    before = Body(fixture['objects']['kex1']['before'])
    storage = persistence.SmartProgressStorage()
    done = storage.fetch(key='create_done', body=before)
    pending = storage.fetch(key='create_pending', body=before)
    assert done is not None and done.get('success') is True
    assert pending is not None and pending.get('retries') == 3
    assert not any('MUST NOT BE CALLED' in line for line in fixture['log'])  # Kopf agrees
    # Kopf never writes records to the status with the default storage, only purges them there.
    for _, request in kopf_patches(fixture):
        if request['path'].endswith('/status'):
            records = request['body']['status']['kopf']['progress']
            assert set(records.values()) == {None}


FINALIZING = [(scenario, index) for scenario, fixture in SCENARIOS.items()
              for index, (_, request) in enumerate(kopf_patches(fixture))
              if request['content_type'] == 'application/json-patch+json']


@pytest.mark.parametrize('scenario, index', FINALIZING)
def test_finalizer_json_patches_are_reproduced_exactly(scenario: str, index: int) -> None:
    body, request = list(kopf_patches(SCENARIOS[scenario]))[index]
    kopf_ops = request['body']
    version_test, *kopf_changes = kopf_ops
    assert version_test['op'] == 'test' and version_test['path'] == '/metadata/resourceVersion'
    body['metadata']['resourceVersion'] = version_test['value']  # the replay does not track the versions
    finalizer = persistence.DEFAULT_FINALIZER
    adding = kopf_changes[0]['op'] == 'add'

    direct = (persistence.make_blocking_json_patch(body, finalizer) if adding else
              persistence.make_allowing_json_patch(body, finalizer))
    assert direct == kopf_ops


def _leaves(patch: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in patch.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*path, key))
        else:
            yield (*path, key), value
