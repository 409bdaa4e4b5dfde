import pytest

from kopf._cogs.structs.dicts import (
    MappingView,
    ReplaceableMappingView,
    cherrypick,
    ensure,
    parse_field,
    remove,
    resolve,
    walk,
)


@pytest.mark.parametrize('field, expected', [
    (None, ()),
    ('', ()),
    ('spec', ('spec',)),
    ('spec.field', ('spec', 'field')),
    ('metadata.labels.app', ('metadata', 'labels', 'app')),
    (('spec', 'field'), ('spec', 'field')),
    (['spec', 'field'], ('spec', 'field')),
    (('spec.with.dots',), ('spec.with.dots',)),  # tuples are taken as is: keys may contain dots
    ((), ()),
    ([], ()),
])
def test_parse_field(field, expected):
    assert parse_field(field) == expected


@pytest.mark.parametrize('field', [123, ('spec', 1), ['spec', None], {'spec'}])
def test_parse_field_rejects_non_strings(field):
    with pytest.raises(TypeError):
        parse_field(field)


OBJ = {'spec': {'field': 'value', 'nested': {'x': 1}, 'list': [1, 2], 'empty': None}}


@pytest.mark.parametrize('field, expected', [
    ((), OBJ),
    ('spec', OBJ['spec']),
    ('spec.field', 'value'),
    ('spec.nested.x', 1),
    (['spec', 'list'], [1, 2]),
    ('spec.empty', None),
])
def test_resolve_existing(field, expected):
    assert resolve(OBJ, field) == expected
    assert resolve(OBJ, field, 'default') == expected


@pytest.mark.parametrize('field', [
    'status', 'spec.missing', 'spec.field.deeper', 'spec.list.0', 'spec.empty.x',
])
def test_resolve_missing(field):
    assert resolve(OBJ, field, 'default') == 'default'
    assert resolve(OBJ, field, None) is None
    with pytest.raises(KeyError):
        resolve(OBJ, field)


def test_resolve_in_none_as_in_empty():
    assert resolve(None, 'spec', 'default') == 'default'
    assert resolve(None, (), 'default') == {}


def test_ensure_creates_the_intermediate_dicts():
    obj: dict = {'spec': {'other': 1}}
    ensure(obj, 'spec.nested.deep', 'value')
    ensure(obj, ['status', 'x'], 2)
    assert obj == {'spec': {'other': 1, 'nested': {'deep': 'value'}}, 'status': {'x': 2}}


def test_ensure_does_not_overwrite_non_mappings():
    obj = {'spec': {'field': 'value'}}
    with pytest.raises(TypeError, match=r"'spec.field' is str"):
        ensure(obj, 'spec.field.deep', 'x')
    assert obj == {'spec': {'field': 'value'}}


def test_ensure_and_remove_reject_the_root():
    with pytest.raises(ValueError):
        ensure({}, (), 1)
    with pytest.raises(ValueError):
        remove({}, None)


@pytest.mark.parametrize('field, prune, expected', [
    ('status.kopf.progress', False, {'status': {'kopf': {}}, 'spec': {'a': 1}}),
    ('status.kopf.progress', True, {'spec': {'a': 1}}),
    ('spec.a', True, {'status': {'kopf': {'progress': {}}}}),
    ('spec.missing', True, {'status': {'kopf': {'progress': {}}}, 'spec': {'a': 1}}),
    ('spec.a.deeper', True, {'status': {'kopf': {'progress': {}}}, 'spec': {'a': 1}}),
    ('missing.x', True, {'status': {'kopf': {'progress': {}}}, 'spec': {'a': 1}}),
])
def test_remove(field, prune, expected):
    obj = {'status': {'kopf': {'progress': {}}}, 'spec': {'a': 1}}
    remove(obj, field, prune=prune)
    assert obj == expected


def test_remove_prunes_only_the_emptied_parents():
    obj = {'status': {'kopf': {'progress': {}}, 'other': 1}}
    remove(obj, 'status.kopf.progress', prune=True)
    assert obj == {'status': {'other': 1}}


def test_cherrypick():
    src = {'metadata': {'name': 'n', 'labels': {'a': 'b'}, 'uid': 'u'}, 'spec': {'x': 1}}
    dst: dict = {'kind': 'K'}
    cherrypick(src, dst, ['metadata.labels', 'metadata.annotations', 'spec', 'status'])
    assert dst == {'kind': 'K', 'metadata': {'labels': {'a': 'b'}}, 'spec': {'x': 1}}


def test_walk_a_single_object():
    obj = {'spec': {'template': {'metadata': {}}}}
    assert list(walk(obj)) == [obj]


def test_walk_a_list_of_objects():
    obj1, obj2 = {'a': 1}, {'b': 2}
    assert list(walk([obj1, obj2])) == [obj1, obj2]
    assert list(walk(iter([obj1, obj2]))) == [obj1, obj2]


def test_walk_nested_fields():
    obj1 = {'spec': {'template': {'x': 1}, 'jobTemplate': {'y': 2}}}
    obj2 = {'spec': {'template': 'not-a-dict'}}
    result = list(walk([obj1, obj2], nested=['spec.template', ('spec', 'jobTemplate')]))
    assert result == [obj1, obj1['spec']['template'], obj1['spec']['jobTemplate'], obj2]
    assert result[1] is obj1['spec']['template']  # the same objects, to be modified in place
    assert list(walk(obj1, nested='spec.template')) == [obj1, {'x': 1}]


def test_mapping_view_is_live_and_does_not_copy():
    raw = {'spec': {'a': 1}}
    view = MappingView(raw)
    spec = MappingView(view, 'spec')
    assert dict(view) == raw
    assert spec == {'a': 1}
    raw['spec']['b'] = 2
    assert spec == {'a': 1, 'b': 2}
    assert spec['b'] == 2
    assert spec.get('c', 3) == 3
    assert 'a' in spec and 'c' not in spec
    assert len(spec) == 2
    assert list(spec) == ['a', 'b']
    assert repr(spec) == "{'a': 1, 'b': 2}"
    assert view['spec'] is raw['spec']  # nested values are returned as they are
    with pytest.raises(KeyError):
        spec['c']


@pytest.mark.parametrize('raw', [{}, {'spec': None}, {'spec': 'string'}, {'spec': [1, 2]}])
def test_mapping_view_of_absent_or_non_mapping_is_empty(raw):
    view = MappingView(raw, 'spec')
    assert len(view) == 0
    assert dict(view) == {}
    assert view.get('x') is None


def test_mapping_view_is_read_only():
    view = MappingView({'a': 1})
    with pytest.raises(TypeError):
        view['a'] = 2


def test_replaceable_view_propagates_to_nested_views():
    root = ReplaceableMappingView({'spec': {'a': 1}})
    spec = MappingView(root, 'spec')
    deep = MappingView(spec, 'nested')
    assert spec == {'a': 1}
    assert deep == {}
    root._replace_with({'spec': {'a': 2, 'nested': {'x': 'y'}}})
    assert root == {'spec': {'a': 2, 'nested': {'x': 'y'}}}
    assert spec == {'a': 2, 'nested': {'x': 'y'}}
    assert deep == {'x': 'y'}


def test_replaceable_view_wrapping_a_raw_mapping_is_the_same_as_made_by_the_class():
    raw = {'spec': {'a': 1}}
    made, wrapped = ReplaceableMappingView(raw), ReplaceableMappingView._wrapping(raw)
    assert type(wrapped) is ReplaceableMappingView
    assert wrapped == made == raw
    assert (wrapped._source.mapping, wrapped._path) == (made._source.mapping, made._path)
    spec = MappingView(wrapped, 'spec')
    wrapped._replace_with({'spec': {'a': 2}})
    assert spec == {'a': 2}
    assert made == raw  # not shared: each has its own source


@pytest.mark.parametrize('field', [('spec', 1), ['spec', None]])
def test_parse_field_rejects_invalid_fields_every_time(field):
    for _ in range(2):  # not remembered as parsed after the first failure
        with pytest.raises(TypeError):
            parse_field(field)


def test_parse_field_of_many_dynamic_fields_stays_correct_and_bounded():
    from kopf._cogs.structs import dicts
    for i in range(3 * dicts._PARSED_FIELDS_LIMIT):
        assert parse_field(f'spec.f{i}') == ('spec', f'f{i}')
        assert parse_field(('spec', f't{i}')) == ('spec', f't{i}')
    assert len(dicts._parsed_fields) <= dicts._PARSED_FIELDS_LIMIT


def test_views_of_custom_view_classes_follow_the_replacements():
    class CustomView(MappingView):
        pass

    root = ReplaceableMappingView({'spec': {'a': {'x': 1}}})
    custom = CustomView(root, 'spec')
    nested = MappingView(custom, 'a')
    root._replace_with({'spec': {'a': {'x': 2}}})
    assert custom == {'a': {'x': 2}}
    assert nested == {'x': 2}
