"""
The diff-base storages' own contract, beyond the one-to-one comparison with Kopf's storages.
"""
import json
from typing import Any

import pytest

from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.patches import Patch
from kopf._core.persistence import (
    AnnotationsDiffBaseStorage,
    DiffBaseStorage,
    MultiDiffBaseStorage,
    StatusDiffBaseStorage,
)

# The object of the scenarios, as Kopf has seen it, and the diff-base that Kopf has written for it.
BODY: dict[str, Any] = {
    'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
    'metadata': {
        'name': 'kex1', 'namespace': 'default', 'uid': 'u', 'resourceVersion': '4', 'generation': 1,
        'labels': {'somelabel': 'somevalue'},
        'annotations': {'someannotation': 'somevalue',
                        'kubectl.kubernetes.io/last-applied-configuration': '{"apiVersion":"kopf.dev/v1"}\n'},
    },
    'spec': {'duration': '1m', 'field': 'value', 'items': ['item1', 'item2']},
    'status': {'create_fn': {'message': 'hello'}},
}
KOPF_DIFFBASE = ('{"spec":{"duration":"1m","field":"value","items":["item1","item2"]},'
                 '"metadata":{"labels":{"somelabel":"somevalue"},"annotations":{"someannotation":"somevalue"}}}')


@pytest.mark.parametrize('storage, path, value', [
    (AnnotationsDiffBaseStorage(), ('metadata', 'annotations', 'kopf.zalando.org/last-handled-configuration'),
     KOPF_DIFFBASE + '\n'),
    (AnnotationsDiffBaseStorage(prefix='my-op.example.com', key='base'),
     ('metadata', 'annotations', 'my-op.example.com/base'), KOPF_DIFFBASE + '\n'),
    (StatusDiffBaseStorage(), ('status', 'kopf', 'last-handled-configuration'), KOPF_DIFFBASE),
    (StatusDiffBaseStorage(field='status.diff-base'), ('status', 'diff-base'), KOPF_DIFFBASE),
], ids=lambda value: '.'.join(value) if isinstance(value, tuple) else None)
def test_diffbase_is_stored_as_kopf_stores_it(
        storage: DiffBaseStorage, path: tuple[str, ...], value: str,
) -> None:
    patch = Patch()
    storage.store(body=Body(BODY), patch=patch, essence=storage.build(body=Body(BODY)))
    target: Any = patch
    for key in path:
        target = target[key]
    assert target == value


@pytest.mark.parametrize('storage', [AnnotationsDiffBaseStorage(), StatusDiffBaseStorage()], ids=type)
def test_stored_diffbase_is_fetched_as_built(storage: DiffBaseStorage) -> None:
    patch = Patch()
    essence = storage.build(body=Body(BODY))
    storage.store(body=Body(BODY), patch=patch, essence=essence)
    assert storage.fetch(body=Body(json.loads(json.dumps(patch)))) == essence


def test_essence_ignores_the_system_fields_and_its_own_changes() -> None:
    storage = AnnotationsDiffBaseStorage()
    patch = Patch()
    storage.store(body=Body(BODY), patch=patch, essence=storage.build(body=Body(BODY)))
    changed = json.loads(json.dumps(BODY))
    changed['metadata'].update(resourceVersion='5', generation=2, finalizers=['x'])
    changed['metadata']['annotations'].update(patch['metadata']['annotations'])
    changed['metadata']['annotations']['kopf.zalando.org/create_fn'] = '{"started":"..."}'
    changed['status'] = {'anything': 'else'}
    assert storage.build(body=Body(changed)) == storage.build(body=Body(BODY))


def test_essence_excludes_the_marked_prefixes_whatever_was_seen_before() -> None:
    # The verdicts on the unmarked keys are remembered; a marker on the object still excludes its prefix.
    storage = AnnotationsDiffBaseStorage()
    unmarked = {'metadata': {'annotations': {'my-op.example.com/x': '1', 'other.example.com/y': '2'}}}
    marked = {'metadata': {'annotations': {'my-op.example.com/x': '1', 'other.example.com/y': '2',
                                           'my-op.example.com/kopf-managed': 'yes'}}}
    kept_all = {'metadata': {'annotations': {'my-op.example.com/x': '1', 'other.example.com/y': '2'}}}
    kept_foreign = {'metadata': {'annotations': {'other.example.com/y': '2'}}}
    assert storage.build(body=Body(unmarked)) == kept_all
    assert storage.build(body=Body(marked)) == kept_foreign
    assert storage.build(body=Body(unmarked)) == kept_all
    assert storage.build(body=Body({'metadata': {'annotations': {
        'kopf.zalando.org/anything': 'x', 'sub.kopf.zalando.org/y': 'z'}}})) == {}


def test_essence_is_independent_of_the_body() -> None:
    raw = json.loads(json.dumps(BODY))
    essence: Any = AnnotationsDiffBaseStorage().build(body=Body(raw))
    essence['spec']['items'].append('item3')
    essence['metadata']['labels']['new'] = 'label'
    assert raw['spec']['items'] == ['item1', 'item2']
    assert raw['metadata']['labels'] == {'somelabel': 'somevalue'}


@pytest.mark.parametrize('extra_fields, ignored_fields, expected', [
    (None, None, {'spec': {'a': 1, 'b': {'c': 2}}}),
    (['status.x'], None, {'spec': {'a': 1, 'b': {'c': 2}}, 'status': {'x': 10}}),
    (iter(['status.x']), None, {'spec': {'a': 1, 'b': {'c': 2}}, 'status': {'x': 10}}),
    (None, ['spec.b.c'], {'spec': {'a': 1}}),
    (None, ['spec.a', 'spec.b'], {}),
    (['status.x'], ['status'], {'spec': {'a': 1, 'b': {'c': 2}}}),
])
def test_extra_and_ignored_fields(
        extra_fields: Any, ignored_fields: Any, expected: dict[str, Any],
) -> None:
    body = Body({'spec': {'a': 1, 'b': {'c': 2}}, 'status': {'x': 10, 'y': 20}})
    storage = AnnotationsDiffBaseStorage(ignored_fields=ignored_fields)
    assert storage.build(body=body, extra_fields=extra_fields) == expected


def test_multi_storage_writes_all_and_reads_the_first_found() -> None:
    storage = MultiDiffBaseStorage([StatusDiffBaseStorage(field='status.diff-base'),
                                    AnnotationsDiffBaseStorage()])
    only_old = Body({'metadata': {'annotations': {
        'kopf.zalando.org/last-handled-configuration': '{"spec":1}\n'}}})
    assert dict(storage.fetch(body=only_old) or {}) == {'spec': 1}
    patch = Patch()
    storage.store(body=only_old, patch=patch, essence={'spec': 2})  # type: ignore[typeddict-item]
    assert json.loads(json.dumps(patch)) == {
        'status': {'diff-base': '{"spec":2}'},
        'metadata': {'annotations': {'kopf.zalando.org/last-handled-configuration': '{"spec":2}\n'}},
    }
    both = Body({**only_old, 'status': {'diff-base': '{"spec":3}'}})
    assert dict(storage.fetch(body=both) or {}) == {'spec': 3}


def test_multi_storage_excludes_all_storages_data_from_the_essence() -> None:
    storage = MultiDiffBaseStorage([StatusDiffBaseStorage(field='status.diff-base'),
                                    AnnotationsDiffBaseStorage()])
    body = Body({'spec': {'a': 1}, 'status': {'diff-base': '{}', 'other': 1},
                 'metadata': {'annotations': {'kopf.zalando.org/last-handled-configuration': '{}\n'}}})
    assert storage.build(body=body, extra_fields=['status', 'metadata.annotations']) == {
        'spec': {'a': 1}, 'status': {'other': 1}}


@pytest.mark.parametrize('value', ['{', ''])
def test_invalid_diffbase_fails_rather_than_restarts_the_handlers(value: str) -> None:
    body = Body({'metadata': {'annotations': {'kopf.zalando.org/last-handled-configuration': value}}})
    with pytest.raises(ValueError):
        AnnotationsDiffBaseStorage().fetch(body=body)


def test_structured_status_diffbase_is_rejected() -> None:
    body = Body({'status': {'kopf': {'last-handled-configuration': {'spec': {}}}}})
    with pytest.raises(TypeError):
        StatusDiffBaseStorage().fetch(body=body)
