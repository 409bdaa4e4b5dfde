import copy

import jsonpatch
import pytest

from kopf._cogs.structs.bodies import Body, RawBody
from kopf._cogs.structs.patches import Patch, apply_merge_patch, merge_into


@pytest.mark.parametrize('obj, patch, expected', [
    ({}, {}, {}),
    ({'a': 1}, {'a': 2}, {'a': 2}),
    ({'a': 1}, {'b': 2}, {'a': 1, 'b': 2}),
    ({'a': 1, 'b': 2}, {'a': None}, {'b': 2}),
    ({'a': 1}, {'x': None}, {'a': 1}),
    ({'a': {'b': 1, 'c': 2}}, {'a': {'b': None, 'd': 3}}, {'a': {'c': 2, 'd': 3}}),
    ({'a': [1, 2, 3]}, {'a': [4]}, {'a': [4]}),
    ({'a': 'scalar'}, {'a': {'b': 1, 'c': None}}, {'a': {'b': 1}}),
    ({}, {'a': {'b': {'c': 1}}}, {'a': {'b': {'c': 1}}}),
    ({'a': {'b': 1}}, {'a': 'scalar'}, {'a': 'scalar'}),
    ({'a': 1}, {'a': {}}, {'a': {}}),
])
def test_apply_merge_patch(obj, patch, expected):
    original = copy.deepcopy(obj)
    result = apply_merge_patch(obj, patch)
    assert result == expected
    assert obj == original  # pure


def test_merge_into_does_not_share_data_with_the_patch():
    target: dict = {}
    patch = {'a': {'b': [1, 2]}, 'c': [3]}
    merge_into(target, patch)
    target['a']['b'].append(9)
    target['c'].append(9)
    assert patch == {'a': {'b': [1, 2]}, 'c': [3]}


def test_patch_is_a_dict():
    patch = Patch({'spec': {'x': 1}})
    assert isinstance(patch, dict)
    assert patch == {'spec': {'x': 1}}
    assert patch.fns == []
    assert patch.body is None


def test_patch_copies_another_patch_with_its_fns():
    def fn(body: RawBody) -> None:
        pass
    source = Patch({'a': 1})
    source.fns.append(fn)
    patch = Patch(source)
    assert patch == {'a': 1}
    assert patch.fns == [fn]
    assert patch.fns is not source.fns


def test_patch_sub_dicts_are_created_on_writes_only():
    patch = Patch()
    assert patch.spec == {}
    assert patch.status.get('x') is None
    assert 'x' not in patch.meta.labels
    assert patch == {}
    assert not patch

    patch.spec['x'] = 1
    patch.status['kopf'] = {'progress': None}
    patch.meta.labels['app'] = 'a'
    patch.metadata.annotations['note'] = None
    assert patch == {
        'spec': {'x': 1},
        'status': {'kopf': {'progress': None}},
        'metadata': {'labels': {'app': 'a'}, 'annotations': {'note': None}},
    }
    assert patch.meta == patch.metadata
    assert patch.spec['x'] == 1
    assert len(patch.metadata) == 2
    assert set(patch.meta) == {'labels', 'annotations'}
    assert patch.meta.labels == {'app': 'a'}


def test_patch_sub_dicts_follow_the_direct_changes():
    patch = Patch()
    patch['spec'] = {'a': 1}
    assert patch.spec == {'a': 1}
    del patch.spec['a']
    assert patch == {'spec': {}}
    with pytest.raises(KeyError):
        del patch.status['missing']
    patch['spec'] = None  # deletion of the whole spec, then a key is set: the spec becomes a dict again
    patch.spec['b'] = 2
    assert patch == {'spec': {'b': 2}}


def test_shallow_copies_are_independent_at_the_top_level():
    patch = Patch({'spec': {'a': 1}}, body={'spec': {}})
    patch.fns.append(add_finalizer)
    clone = copy.copy(patch)
    assert isinstance(clone, Patch)
    assert clone == patch
    assert clone.fns == patch.fns
    assert clone.body is patch.body
    clone.status['x'] = 1
    clone.fns.clear()
    assert patch == {'spec': {'a': 1}}
    assert patch.fns == [add_finalizer]


def test_deep_copies_write_into_themselves():
    patch = Patch({'spec': {'a': 1}})
    clone = copy.deepcopy(patch)
    clone.spec['b'] = 2
    assert clone == {'spec': {'a': 1, 'b': 2}}
    assert patch == {'spec': {'a': 1}}


def test_patch_with_only_fns_is_true():
    patch = Patch()
    assert not patch
    patch.fns.append(lambda body: None)
    assert patch
    assert patch == {}


BODY: RawBody = {
    'apiVersion': 'kopf.dev/v1',
    'kind': 'KopfExample',
    'metadata': {'name': 'n', 'resourceVersion': '123', 'labels': {'a': 'b'}},
    'spec': {'field': 'value', 'items': [1, 2]},
    'status': {'conditions': [{'type': 'Ready', 'status': 'True'}, {'type': 'Whatever', 'status': 'False'}]},
}


def set_conditions(body: RawBody) -> None:
    conditions = body.setdefault('status', {}).setdefault('conditions', [])
    conditions[:] = [cond for cond in conditions if cond.get('type') != 'Whatever']
    conditions.append({'type': 'Whatever', 'status': 'True'})


def add_finalizer(body: RawBody) -> None:
    body.setdefault('metadata', {}).setdefault('finalizers', []).append('x')


@pytest.mark.parametrize('merge, fns, expected', [
    ({}, [], BODY),
    ({'spec': {'field': 'new'}}, [],
     {**BODY, 'spec': {'field': 'new', 'items': [1, 2]}}),
    ({'spec': {'field': None}}, [],
     {**BODY, 'spec': {'items': [1, 2]}}),
    ({'spec': None, 'status': None}, [],
     {key: val for key, val in BODY.items() if key not in {'spec', 'status'}}),
    ({'metadata': {'labels': {'a': None, 'c': 'd'}, 'annotations': {'x': 'y'}}}, [],
     {**BODY, 'metadata': {'name': 'n', 'resourceVersion': '123',
                           'labels': {'c': 'd'}, 'annotations': {'x': 'y'}}}),
    ({'data': {'new': {'deep': 1}}}, [],
     {**BODY, 'data': {'new': {'deep': 1}}}),
    ({}, [set_conditions],
     {**BODY, 'status': {'conditions': [{'type': 'Ready', 'status': 'True'},
                                        {'type': 'Whatever', 'status': 'True'}]}}),
    ({'status': {'conditions': None}}, [set_conditions],  # the fns see the merged state
     {**BODY, 'status': {'conditions': [{'type': 'Whatever', 'status': 'True'}]}}),
    ({'spec': {'field': 'new'}}, [add_finalizer, add_finalizer],
     {**BODY, 'spec': {'field': 'new', 'items': [1, 2]},
      'metadata': {**BODY['metadata'], 'finalizers': ['x', 'x']}}),
])
def test_json_patch_brings_the_body_to_the_merged_and_transformed_state(merge, fns, expected):
    original = copy.deepcopy(BODY)
    patch = Patch(merge)
    patch.fns.extend(fns)
    ops = patch.as_json_patch(BODY)
    assert jsonpatch.apply_patch(BODY, ops) == expected
    assert original == BODY  # not modified
    guard = {'op': 'test', 'path': '/metadata/resourceVersion', 'value': '123'}
    assert (ops[:1] == [guard]) == bool(fns)


def test_json_patch_of_simple_changes():
    patch = Patch()
    patch.spec['field'] = 'new'
    patch.meta.labels['a'] = None
    patch.status['x'] = {'y': 1}
    ops = patch.as_json_patch(BODY)
    assert sorted(ops, key=lambda op: op['path']) == [
        {'op': 'remove', 'path': '/metadata/labels/a'},
        {'op': 'replace', 'path': '/spec/field', 'value': 'new'},
        {'op': 'add', 'path': '/status/x', 'value': {'y': 1}},
    ]


def test_json_patch_of_a_merge_patch_replaces_the_lists_as_wholes():
    patch = Patch({'spec': {'items': [2]}})  # the general diff would remove the item #0 instead
    assert patch.as_json_patch(BODY) == [{'op': 'replace', 'path': '/spec/items', 'value': [2]}]


@pytest.mark.parametrize('old, new', [(1, True), (0, False), ([1, 0], [True, False]), ('x', {'x': True})])
def test_json_patch_tells_the_booleans_from_the_numbers(old, new):
    ops = Patch({'spec': {'field': new}}).as_json_patch({'spec': {'field': old}})
    assert ops == [{'op': 'replace', 'path': '/spec/field', 'value': new}]


@pytest.mark.parametrize('old, new', [(1, 1.0), ([1, 2.0], [1.0, 2]), ({'x': 1.5}, {'x': 1.5})])
def test_json_patch_of_the_same_numbers_is_empty(old, new):
    assert Patch({'spec': {'field': new}}).as_json_patch({'spec': {'field': old}}) == []


def test_json_patch_escapes_the_keys():
    patch = Patch({'metadata': {'annotations': {'kopf.zalando.org/x~y': 'v'}}})
    ops = patch.as_json_patch({'metadata': {'annotations': {}}})
    assert ops == [{'op': 'add', 'path': '/metadata/annotations/kopf.zalando.org~1x~0y', 'value': 'v'}]


def test_json_patch_uses_the_remembered_body_by_default():
    patch = Patch({'spec': {'field': 'new'}}, body=BODY)
    assert patch.body is BODY
    assert patch.as_json_patch() == [{'op': 'replace', 'path': '/spec/field', 'value': 'new'}]


def test_json_patch_without_a_body_is_against_an_empty_object():
    patch = Patch({'spec': {'field': 'new', 'gone': None}})
    assert patch.as_json_patch() == [{'op': 'add', 'path': '/spec', 'value': {'field': 'new'}}]


def test_json_patch_accepts_body_views():
    patch = Patch({'spec': {'field': 'new'}})
    assert patch.as_json_patch(Body(BODY)) == [{'op': 'replace', 'path': '/spec/field', 'value': 'new'}]


def test_json_patch_of_fns_only_when_merge_is_sent_separately():
    patch = Patch({'spec': {'field': 'new'}})
    patch.fns.append(add_finalizer)
    ops = patch.as_json_patch(BODY, merge=False)
    assert ops == [
        {'op': 'test', 'path': '/metadata/resourceVersion', 'value': '123'},
        {'op': 'add', 'path': '/metadata/finalizers', 'value': ['x']},
    ]


@pytest.mark.parametrize('guarded, fns, expect_test', [
    (None, [], False),
    (None, [add_finalizer], True),
    (True, [], True),
    (False, [add_finalizer], False),
])
def test_json_patch_guarding(guarded, fns, expect_test):
    patch = Patch({'spec': {'field': 'new'}})
    patch.fns.extend(fns)
    ops = patch.as_json_patch(BODY, guarded=guarded)
    has_test = any(op['op'] == 'test' for op in ops)
    assert has_test is expect_test


def test_json_patch_is_not_guarded_when_empty_or_versionless():
    assert Patch().as_json_patch(BODY, guarded=True) == []
    patch = Patch()
    patch.fns.append(add_finalizer)
    ops = patch.as_json_patch({'metadata': {}})
    assert ops == [{'op': 'add', 'path': '/metadata/finalizers', 'value': ['x']}]
    with pytest.raises(ValueError, match=r'resourceVersion'):
        patch.as_json_patch({'metadata': {}}, guarded=True)


def test_fns_get_a_copy_of_the_body():
    seen: list[RawBody] = []
    patch = Patch()
    patch.fns.append(seen.append)
    raw = copy.deepcopy(BODY)
    patch.as_json_patch(raw)
    assert seen == [raw]
    assert seen[0] is not raw
    assert seen[0]['spec'] is not raw['spec']


def test_repr_mentions_fns():
    patch = Patch({'a': 1})
    assert repr(patch) == "{'a': 1}"
    patch.fns.append(set_conditions)
    assert repr(patch) == "{'a': 1} + fns=[set_conditions]"
