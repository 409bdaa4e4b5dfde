"""
The key-forming, marking and cleaning conventions, with the values Kopf 1.45.2 wrote to a cluster.
"""
from typing import Any

import pytest

from kopf._cogs.helpers import jsons
from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.patches import Patch
from kopf._core.persistence import conventions
from kopf._core.persistence.progress import AnnotationsProgressStorage

LONG_ID = 'a-very-long-handler-id-' + 'x' * 60


@pytest.mark.parametrize('key, expected', [
    ('create_fn', ['kopf.zalando.org/create_fn']),
    ('create_sub/child1', ['kopf.zalando.org/create_sub.child1']),
    ('field_fn/spec.field', ['kopf.zalando.org/field_fn.spec.field']),
    ('items-watcher/spec.items', ['kopf.zalando.org/items-watcher.spec.items']),
    # 17+46 = 63 chars: no hashing; 17+47 = 64 chars: the V1 key is hashed, the V2 one is not.
    ('v1-boundary-' + 'a' * 34, ['kopf.zalando.org/v1-boundary-' + 'a' * 34]),
    ('v1-boundary-' + 'b' * 35, ['kopf.zalando.org/v1-boundary-' + 'b' * 35,
                                 'kopf.zalando.org/v1-boundary-' + 'b' * 27 + '-I493Kg']),
    (LONG_ID, ['kopf.zalando.org/a-very-long-handler-id-' + 'x' * 33 + '-gMm4Sw',
               'kopf.zalando.org/a-very-long-handler-id-' + 'x' * 16 + '-gMm4Sw']),
    # The standard base64's "+" and "/" become "-" and ".".
    ('hash-8-' + 'z' * 63, ['kopf.zalando.org/hash-8-' + 'z' * 49 + '-TMh-eQ',
                            'kopf.zalando.org/hash-8-' + 'z' * 32 + '-TMh-eQ']),
    ('hash-3-' + 'z' * 63, ['kopf.zalando.org/hash-3-' + 'z' * 49 + '-DK.8DQ',
                            'kopf.zalando.org/hash-3-' + 'z' * 32 + '-DK.8DQ']),
    # A sub-handler of a long parent: V2 hashes the id with "/", V1 hashes the id with ".".
    ('parent-' + 'p' * 63 + '/child', ['kopf.zalando.org/parent-' + 'p' * 49 + '-dFcPvA',
                                       'kopf.zalando.org/parent-' + 'p' * 32 + '-t1GECQ']),
])
def test_keys_as_written_by_kopf(key: str, expected: list[str]) -> None:
    storage = AnnotationsProgressStorage()
    assert list(storage.make_keys(key)) == expected
    assert all(len(full_key.split('/', 1)[1]) <= 63 for full_key in expected)
    assert len(expected[-1]) <= 63  # the V1 key: the whole key is limited


@pytest.mark.parametrize('v1, expected_count', [(True, 2), (False, 1)])
def test_v1_keys_can_be_disabled(v1: bool, expected_count: int) -> None:
    storage = AnnotationsProgressStorage(v1=v1)
    assert len(list(storage.make_keys(LONG_ID))) == expected_count


@pytest.mark.parametrize('prefix', ['', None])
def test_prefix_is_required(prefix: Any) -> None:
    with pytest.raises(ValueError, match='prefixed'):
        AnnotationsProgressStorage(prefix=prefix)


@pytest.mark.parametrize('body, expected', [
    ({'kind': 'ReplicaSet', 'metadata': {'ownerReferences': [{'kind': 'Deployment'}]}}, 'fn-ofDRS'),
    ({'kind': 'ReplicaSet', 'metadata': {'ownerReferences': [{'kind': 'StatefulSet'}]}}, 'fn'),
    ({'kind': 'ReplicaSet', 'metadata': {}}, 'fn'),
    ({'kind': 'Pod', 'metadata': {'ownerReferences': [{'kind': 'Deployment'}]}}, 'fn'),
    ({'metadata': {'ownerReferences': [{'kind': 'Deployment'}]}}, 'fn'),
    ({'kind': 'ReplicaSet', 'metadata': {'ownerReferences': None}}, 'fn'),
])
def test_replicasets_of_deployments_are_marked(body: dict[str, Any], expected: str) -> None:
    assert conventions.CollisionEvadingConvention().mark_key('fn', body=Body(body)) == expected


@pytest.mark.parametrize('body, expected', [
    ({'kind': 'ReplicaSet', 'metadata': {'ownerReferences': [{'kind': 'Deployment'}]}},
     ('kopf.zalando.org/fn-ofDRS',)),
    ({'kind': 'Pod', 'metadata': {'ownerReferences': [{'kind': 'Deployment'}]}},
     ('kopf.zalando.org/fn',)),
])
def test_the_storages_keys_are_marked(body: dict[str, Any], expected: tuple[str, ...]) -> None:
    storage = AnnotationsProgressStorage(v1=False)
    assert tuple(storage.make_keys('fn', body=Body(body))) == expected


class _MarkingEverythingStorage(AnnotationsProgressStorage):
    def mark_key(self, key: str, *, body: Body) -> str:
        return f'{key}-{body.get("kind", "").lower()}'


def test_the_storages_keys_are_marked_as_redefined_for_any_kind() -> None:
    storage = _MarkingEverythingStorage(v1=False)
    assert tuple(storage.make_keys('fn', body=Body({'kind': 'Pod'}))) == ('kopf.zalando.org/fn-pod',)
    assert tuple(storage.make_keys('fn', body=Body({'kind': 'Job'}))) == ('kopf.zalando.org/fn-job',)
    assert tuple(storage.make_keys('fn')) == ('kopf.zalando.org/fn',)


@pytest.mark.parametrize('keys, expected', [
    ([], set()),
    (['a.com/x', 'b.com/kopf-managed', 'c.com/kopf-managed'], {'b.com', 'c.com'}),
    (['kopf-managed', 'a/b/kopf-managed', 'x.com/kopf-managed-not'], set()),
    (['/kopf-managed'], {''}),
])
def test_marked_prefixes_are_detected(keys: list[str], expected: set[str]) -> None:
    assert conventions.StorageKeyMarkingConvention().detect_marked_prefixes(keys) == expected


@pytest.mark.parametrize('prefix, annotations, expected', [
    ('kopf.zalando.org', {}, {}),  # Kopf's own prefix is known to all; never marked
    ('my.com', {}, {'my.com/kopf-managed': 'yes'}),
    ('my.com', {'my.com/kopf-managed': 'whatever'}, {}),
])
def test_markers_are_stored_once(prefix: str, annotations: dict[str, str], expected: dict[str, str]) -> None:
    patch = Patch()
    conventions.StorageKeyMarkingConvention().store_marker(prefix, patch, Body({'metadata': {
        'annotations': annotations}}))
    assert dict(patch.meta.annotations) == expected


@pytest.mark.parametrize('essence, expected', [
    ({}, {}),
    ({'spec': {}, 'status': {}, 'metadata': {'labels': {}, 'annotations': {}}}, {'spec': {}}),
    ({'metadata': {'name': 'x', 'labels': {}}, 'status': {'a': {}}},
     {'metadata': {'name': 'x'}, 'status': {'a': {}}}),
    ({'metadata': {'labels': {'a': 'b'}, 'annotations': {}}}, {'metadata': {'labels': {'a': 'b'}}}),
])
def test_empty_stanzas_are_removed(essence: dict[str, Any], expected: dict[str, Any]) -> None:
    conventions.StorageStanzaCleaner.remove_empty_stanzas(essence)
    assert essence == expected


@pytest.mark.parametrize('essence, path, expected', [
    ({'status': {'kopf': {'progress': {'a': 1}}, 's': 1}}, ('status', 'kopf', 'progress'),
     {'status': {'s': 1}}),
    ({'status': {'kopf': {'progress': {}, 'x': 1}}}, ('status', 'kopf', 'progress'),
     {'status': {'kopf': {'x': 1}}}),
    ({'spec': {'x': {}}}, ('spec', 'x', 'y'), {}),  # empty dicts on the path go even if the field is absent
    ({'spec': {'x': {'z': 1}}}, ('spec', 'x', 'y'), {'spec': {'x': {'z': 1}}}),
    ({'spec': 5}, ('spec', 'x', 'y'), {'spec': 5}),
    ({}, ('spec',), {}),
])
def test_fields_are_removed_with_empty_parents(
        essence: dict[str, Any], path: tuple[str, ...], expected: dict[str, Any],
) -> None:
    original = repr(essence)
    shallow = dict(essence)
    conventions.remove_along(shallow, path)
    assert shallow == expected
    assert repr(essence) == original  # the dicts shared with the original are not modified


@pytest.fixture(params=['orjson', 'stdlib'])
def json_parsing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways of decoding: parsing anew (orjson), or copies of the parsed values (the standard library)."""
    if request.param == 'orjson':
        pytest.importorskip('orjson')
    else:  # as where orjson is not installed (the parsing then falls back to the standard library)
        monkeypatch.setattr(jsons, 'ACCELERATED', False)


@pytest.mark.usefixtures('json_parsing')
def test_decoded_values_are_private_copies() -> None:
    text = '{"started":"x","subrefs":["a/b"],"nested":{"k":[1]}}'
    first = conventions.decode_json(text)
    first['subrefs'].append('mutated')
    first['nested']['k'].append(2)
    first['started'] = 'mutated'
    assert conventions.decode_json(text) == {'started': 'x', 'subrefs': ['a/b'], 'nested': {'k': [1]}}


@pytest.mark.usefixtures('json_parsing')
@pytest.mark.parametrize('text', ['', '{', 'not json'])
def test_invalid_json_fails(text: str) -> None:
    with pytest.raises(ValueError):
        conventions.decode_json(text)


def test_json_is_compact_and_ascii() -> None:
    encoded = conventions.encode_json({'a': [1, None], 'ü': 'ñ "q"'})
    assert encoded == '{"a":[1,null],"\\u00fc":"\\u00f1 \\"q\\""}'


def test_copies_are_deep_for_json_data() -> None:
    source = {'a': [{'b': 1}], 'c': {'d': [2]}}
    copied = conventions.copy_json(source)
    copied['a'][0]['b'] = 100
    copied['c']['d'].append(3)
    assert source == {'a': [{'b': 1}], 'c': {'d': [2]}}


@pytest.mark.parametrize('depth', [10, 500, 5000])
def test_copy_json_of_deeply_nested_data(depth: int) -> None:
    # The API accepts objects nested deeper than Python's recursion limit allows a recursive copy to go.
    source: Any = {'bottom': [{}, []]}
    for level in range(depth):
        source = {'level': level, 'nested': source} if level % 2 else [level, source]
    copied = conventions.copy_json(source)
    original, duplicate = source, copied
    for _ in range(depth):  # the same data, but every container is a new one, at every level
        assert duplicate is not original
        if isinstance(original, dict):
            assert duplicate.keys() == original.keys() and duplicate['level'] == original['level']
            original, duplicate = original['nested'], duplicate['nested']
        else:
            assert len(duplicate) == 2 and duplicate[0] == original[0]
            original, duplicate = original[1], duplicate[1]
    assert duplicate == original == {'bottom': [{}, []]}
    assert duplicate is not original and duplicate['bottom'] is not original['bottom']
