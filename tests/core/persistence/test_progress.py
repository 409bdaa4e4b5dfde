"""
The progress storages' own contract, beyond the one-to-one comparison with Kopf's storages.
"""
import json
from typing import Any

import pytest

from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.patches import Patch
from kopf._core.persistence import (
    AnnotationsProgressStorage,
    MultiProgressStorage,
    ProgressRecord,
    ProgressStorage,
    SmartProgressStorage,
    StatusProgressStorage,
)
from kopf._core.persistence.progress import holds_no_records, untouch, without_records

RECORD: ProgressRecord = {'started': '2020-01-01T00:00:00+00:00', 'stopped': None, 'delayed': None,
                          'purpose': 'create', 'retries': 1, 'success': True, 'failure': False,
                          'message': None, 'subrefs': None}
LONG_ID = 'x' * 70


def _annotations(patch: Patch) -> dict[str, Any]:
    return dict(patch.get('metadata', {}).get('annotations', {}))


@pytest.mark.parametrize('verbose, expected', [
    (False, '{"started":"2020-01-01T00:00:00+00:00","purpose":"create","retries":1,'
            '"success":true,"failure":false}'),
    (True, '{"started":"2020-01-01T00:00:00+00:00","stopped":null,"delayed":null,"purpose":"create",'
           '"retries":1,"success":true,"failure":false,"message":null,"subrefs":null}'),
])
def test_records_are_compact_json_in_their_own_order(verbose: bool, expected: str) -> None:
    storage = AnnotationsProgressStorage(verbose=verbose)
    patch = Patch()
    storage.store(key='create_fn', record=RECORD, body=Body({}), patch=patch)
    assert _annotations(patch) == {'kopf.zalando.org/create_fn': expected}


@pytest.mark.parametrize('present_keys, expected_started', [
    ([0, 1], 'v2'),  # the V2 key takes precedence
    ([1], 'v1'),  # as written by older Kopf versions
    ([0], 'v2'),
    ([], None),
])
def test_long_keys_are_read_in_order_of_precedence(
        present_keys: list[int], expected_started: str | None,
) -> None:
    storage = AnnotationsProgressStorage()
    keys = list(storage.make_keys(LONG_ID))
    values = ['{"started":"v2"}', '{"started":"v1"}']
    body = Body({'metadata': {'annotations': {keys[index]: values[index] for index in present_keys}}})
    record = storage.fetch(key=LONG_ID, body=body)
    assert (record or {}).get('started') == expected_started


@pytest.mark.parametrize('storage', [AnnotationsProgressStorage(), SmartProgressStorage()], ids=type)
def test_fetched_records_are_private(storage: ProgressStorage) -> None:
    body = Body({'metadata': {'annotations': {'kopf.zalando.org/fn': '{"retries":1,"subrefs":["fn/a"]}'}}})
    record = storage.fetch(key='fn', body=body)
    assert record is not None
    record['retries'] = 100
    record['subrefs'].append('fn/b')  # type: ignore[union-attr]
    assert storage.fetch(key='fn', body=body) == {'retries': 1, 'subrefs': ['fn/a']}


def test_status_records_are_private() -> None:
    raw = {'status': {'kopf': {'progress': {'fn': {'retries': 1}}}}}
    record = StatusProgressStorage().fetch(key='fn', body=Body(raw))
    assert record is not None
    record['retries'] = 100
    assert raw == {'status': {'kopf': {'progress': {'fn': {'retries': 1}}}}}


def test_invalid_records_fail_rather_than_restart_the_handlers() -> None:
    body = Body({'metadata': {'annotations': {'kopf.zalando.org/fn': '{broken'}}})
    with pytest.raises(ValueError):
        AnnotationsProgressStorage().fetch(key='fn', body=body)


@pytest.mark.parametrize('kwargs, field, touch_field', [
    ({}, ('status', 'kopf', 'progress'), ('status', 'kopf', 'dummy')),
    ({'name': 'my-op'}, ('status', 'my-op', 'progress'), ('status', 'my-op', 'dummy')),
    ({'field': 'status.my-op'}, ('status', 'my-op'), ('status', 'kopf', 'dummy')),
    ({'field': ['status', 'a.b'], 'touch_field': ('status', 't')}, ('status', 'a.b'), ('status', 't')),
])
def test_status_fields(kwargs: dict[str, Any], field: tuple[str, ...], touch_field: tuple[str, ...]) -> None:
    storage = StatusProgressStorage(**kwargs)
    assert storage.field == field
    assert storage.touch_field == touch_field


def test_status_fields_can_be_changed_later() -> None:
    storage = StatusProgressStorage(name='my-op')
    storage.field = 'status.{name}.other'
    storage.touch_field = ['status', 'touched']
    assert storage.field == ('status', 'my-op', 'other')
    assert storage.touch_field == ('status', 'touched')


SMART_BODY = {
    'metadata': {'annotations': {'kopf.zalando.org/both': '{"started":"annotations"}'}},
    'status': {'kopf': {'progress': {'both': {'started': 'status'}, 'legacy': {'started': 'legacy'}}}},
}


@pytest.mark.parametrize('key, expected', [('both', 'annotations'), ('legacy', 'legacy'), ('none', None)])
def test_smart_storage_reads_annotations_then_status(key: str, expected: str | None) -> None:
    record = SmartProgressStorage().fetch(key=key, body=Body(SMART_BODY))
    assert (record or {}).get('started') == expected


def test_smart_storage_writes_only_annotations_but_purges_both() -> None:
    storage = SmartProgressStorage()
    patch = Patch()
    storage.store(key='legacy', record={'started': 'new'}, body=Body(SMART_BODY), patch=patch)
    storage.touch(body=Body(SMART_BODY), patch=patch, value='now')
    assert json.loads(json.dumps(patch)) == {'metadata': {'annotations': {
        'kopf.zalando.org/legacy': '{"started":"new"}',
        'kopf.zalando.org/touch-dummy': 'now',
    }}}
    patch = Patch()
    storage.purge(key='both', body=Body(SMART_BODY), patch=patch)
    assert json.loads(json.dumps(patch)) == {
        'metadata': {'annotations': {'kopf.zalando.org/both': None}},
        'status': {'kopf': {'progress': {'both': None}}},
    }


def test_multi_storage_writes_all_and_reads_the_first_found() -> None:
    first = AnnotationsProgressStorage(prefix='first.example.com')
    second = StatusProgressStorage(field='status.second')
    storage = MultiProgressStorage([first, second])
    body = Body({'status': {'second': {'fn': {'started': 'second'}}}})
    assert storage.fetch(key='fn', body=body) == {'started': 'second'}
    patch = Patch()
    storage.store(key='fn', record={'started': 'new'}, body=body, patch=patch)
    assert json.loads(json.dumps(patch)) == {
        'metadata': {'annotations': {'first.example.com/fn': '{"started":"new"}',
                                     'first.example.com/kopf-managed': 'yes'}},
        'status': {'second': {'fn': {'started': 'new'}}},
    }
    assert storage.fetch(key='fn', body=Body(patch)) == {'started': 'new'}  # the first one now


@pytest.mark.parametrize('storage, nulls_kept', [
    (AnnotationsProgressStorage(), False),
    (AnnotationsProgressStorage(verbose=True), True),
    (StatusProgressStorage(), True),
    (SmartProgressStorage(), False),
    (MultiProgressStorage([StatusProgressStorage(), AnnotationsProgressStorage()]), True),
    (MultiProgressStorage([AnnotationsProgressStorage(), StatusProgressStorage()]), False),
])
def test_records_survive_the_roundtrip_through_the_object(storage: ProgressStorage, nulls_kept: bool) -> None:
    patch = Patch()
    storage.store(key='fn/sub', record=RECORD, body=Body({}), patch=patch)
    expected = {key: value for key, value in RECORD.items() if nulls_kept or value is not None}
    assert storage.fetch(key='fn/sub', body=Body(json.loads(json.dumps(patch)))) == expected


@pytest.mark.parametrize('storage', [
    AnnotationsProgressStorage(), StatusProgressStorage(), SmartProgressStorage(),
], ids=type)
def test_clearing_keeps_the_original_essence(storage: ProgressStorage) -> None:
    essence: Any = {'metadata': {'annotations': {'kopf.zalando.org/fn': '{}', 'a': 'b'}, 'labels': {}},
                    'status': {'kopf': {'progress': {'fn': {}}}}, 'spec': {'x': 1}}
    original = json.dumps(essence)
    cleared = storage.clear(essence=essence)
    assert json.dumps(essence) == original
    assert cleared.get('spec') == {'x': 1}
    assert 'labels' not in cleared.get('metadata', {})


#
# The check that lets a handling cycle skip the reads & purges of the records.
#

BUILT_IN_STORAGES = [
    pytest.param(AnnotationsProgressStorage(), id='annotations'),
    pytest.param(AnnotationsProgressStorage(prefix='my-op.example.com'), id='annotations-own-prefix'),
    pytest.param(StatusProgressStorage(), id='status'),
    pytest.param(StatusProgressStorage(field='status.my-op'), id='status-own-field'),
    pytest.param(SmartProgressStorage(), id='smart'),
    pytest.param(MultiProgressStorage([AnnotationsProgressStorage(), StatusProgressStorage()]), id='multi'),
    pytest.param(MultiProgressStorage([SmartProgressStorage(prefix='my-op.example.com'),
                                       StatusProgressStorage(field='status.my-op')]), id='multi-nested'),
]


def _stored_on_object(storage: ProgressStorage, key: str) -> Body:
    """An object with the record of the handler as the storage stores it (incl. Kopf's old status records)."""
    patch = Patch()
    storage.store(key=key, record=RECORD, body=Body({}), patch=patch)
    if isinstance(storage, SmartProgressStorage):  # it writes no status records, but reads Kopf's old ones
        return Body({'status': {'kopf': {'progress': {key: dict(RECORD)}}}})
    return Body(json.loads(json.dumps(patch)))


@pytest.mark.parametrize('storage', BUILT_IN_STORAGES)
@pytest.mark.parametrize('key', ['create_fn', LONG_ID, 'parent/child'])
def test_objects_with_records_are_never_assumed_empty(storage: ProgressStorage, key: str) -> None:
    body = _stored_on_object(storage, key)
    assert storage.fetch(key=key, body=body) is not None  # as a sanity check of the arrangement
    assert not holds_no_records(storage, keys=['other_fn', key], body=body)


@pytest.mark.parametrize('storage', BUILT_IN_STORAGES)
@pytest.mark.parametrize('body', [
    pytest.param({}, id='bare'),
    pytest.param({'metadata': {'annotations': {
        'kopf.zalando.org/last-handled-configuration': '{"spec":{}}\n',
        'kopf.zalando.org/other_fn': json.dumps(RECORD),
        'example.com/create_fn': 'x',
    }}, 'status': {'kopf': {'progress': {'other_fn': RECORD}}, 'create_fn': {'message': 'hello'}}},
        id='records-of-other-handlers'),
])
def test_objects_without_the_handlers_records_are_empty(
        storage: ProgressStorage, body: dict[str, Any],
) -> None:
    assert holds_no_records(storage, keys=['create_fn', 'delete_fn'], body=Body(body))


class _ElsewhereStorage(AnnotationsProgressStorage):
    """A subclass of a built-in storage that keeps its records elsewhere (not on the object)."""

    def fetch(self, *, key: str, body: Body) -> ProgressRecord | None:
        return RECORD


@pytest.mark.parametrize('storage', [
    pytest.param(_ElsewhereStorage(), id='subclass'),
    pytest.param(MultiProgressStorage([AnnotationsProgressStorage(), _ElsewhereStorage()]),
                 id='multi-with-it'),
])
def test_custom_storages_are_never_assumed_empty(storage: ProgressStorage) -> None:
    assert not holds_no_records(storage, keys=['create_fn'], body=Body({}))


#
# The clearing of the essences that skips the copies when there is nothing to clear.
#

ESSENCES_TO_CLEAR = [
    pytest.param({'spec': {'x': 1}, 'metadata': {'labels': {'a': 'b'}, 'annotations': {'a': 'b'}}},
                 id='plain'),
    pytest.param({'spec': {'x': 1}, 'metadata': {'annotations': {'kopf.zalando.org/fn': '{}', 'a': 'b'}}},
                 id='with-annotations-records'),
    pytest.param({'spec': {'x': 1}, 'metadata': {'annotations': {'my-op.example.com/fn': '{}'}}},
                 id='with-records-of-own-prefix'),
    pytest.param({'spec': {'x': 1}, 'status': {'kopf': {'progress': {'fn': {}}}}}, id='with-status-records'),
    pytest.param({'spec': {'x': 1}, 'status': {'my-op': {'fn': {}}}}, id='with-status-records-own-field'),
    pytest.param({'spec': {'x': 1}, 'status': {'kopf': {}}}, id='with-empty-dicts-on-the-path'),
    pytest.param({'spec': {'x': 1}, 'metadata': {}}, id='with-empty-metadata'),
    pytest.param({'spec': {'x': 1}, 'metadata': {'labels': {}, 'annotations': {'a': 'b'}}},
                 id='with-empty-labels'),
    pytest.param({'spec': {'x': 1}, 'metadata': {'annotations': {}}}, id='with-empty-annotations'),
    pytest.param({'spec': {}, 'status': {}}, id='with-empty-status'),
]


class _ClearingStorage(AnnotationsProgressStorage):
    """A subclass of a built-in storage that also clears something of its own from the essences."""

    def clear(self, *, essence: Any) -> Any:
        cleared = dict(super().clear(essence=essence))
        cleared.pop('spec', None)
        return cleared


@pytest.mark.parametrize('essence', ESSENCES_TO_CLEAR)
@pytest.mark.parametrize('storage', [
    *BUILT_IN_STORAGES,
    pytest.param(_ClearingStorage(), id='custom-subclass'),
    pytest.param(MultiProgressStorage([AnnotationsProgressStorage(), _ClearingStorage()]),
                 id='multi-with-custom'),
])
def test_essences_are_cleared_as_the_storages_clear_them(storage: ProgressStorage, essence: Any) -> None:
    original = json.dumps(essence)
    assert without_records(storage, essence=essence) == storage.clear(essence=essence)
    assert json.dumps(essence) == original


@pytest.mark.parametrize('storage', BUILT_IN_STORAGES)
def test_essences_without_records_are_not_copied(storage: ProgressStorage) -> None:
    essence: Any = {'spec': {'x': 1}, 'metadata': {'labels': {'a': 'b'}, 'annotations': {'a': 'b'}}}
    assert without_records(storage, essence=essence) is essence


#
# The end of a cycle: the dummy value removed (if any), the batched records flushed.
#

def _touched_on_object(storage: ProgressStorage) -> dict[str, Any]:
    """An object with the dummy value as the storage writes it (the status as Kopf's old versions did)."""
    patch = Patch()
    storage.touch(body=Body({}), patch=patch, value='dummy')
    touched: dict[str, Any] = json.loads(json.dumps(patch))
    touched.setdefault('status', {}).setdefault('kopf', {})['dummy'] = 'dummy'
    return touched


@pytest.mark.parametrize('storage', BUILT_IN_STORAGES)
@pytest.mark.parametrize('touched', [False, True])
def test_untouching_is_the_same_as_touching_with_none(storage: ProgressStorage, touched: bool) -> None:
    raw = _touched_on_object(storage) if touched else {'metadata': {'annotations': {'a': 'b'}}}
    expected, actual = Patch(), Patch()
    storage.touch(body=Body(raw), patch=expected, value=None)
    untouch(storage, body=Body(raw), patch=actual)
    assert actual == expected
    assert bool(actual) is touched


class _BatchingStorage(AnnotationsProgressStorage):
    """A subclass of a built-in storage that batches its records until flushed."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed = 0

    def flush(self) -> None:
        self.flushed += 1


@pytest.mark.parametrize('wrap', [
    pytest.param(lambda s: s, id='alone'),
    pytest.param(lambda s: MultiProgressStorage([AnnotationsProgressStorage(), s]), id='in-multi'),
])
def test_untouching_flushes_the_custom_storages(wrap: Any) -> None:
    batching = _BatchingStorage()
    untouch(wrap(batching), body=Body({}), patch=Patch())
    assert batching.flushed == 1
