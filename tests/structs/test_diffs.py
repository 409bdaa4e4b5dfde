import pytest

from kopf._cogs.structs.diffs import Diff, DiffItem, DiffOperation, diff, reduce

ADD, CHANGE, REMOVE = DiffOperation.ADD, DiffOperation.CHANGE, DiffOperation.REMOVE


def test_operations_are_strings():
    assert ADD == 'add' and CHANGE == 'change' and REMOVE == 'remove'
    assert DiffOperation('add') is ADD
    assert str(REMOVE) == 'remove'


def test_item_fields_and_properties():
    item = DiffItem(ADD, ('spec', 'x'), None, 1)
    assert item.operation is ADD
    assert item.op is ADD
    assert item.field == ('spec', 'x')
    assert item.old is None
    assert item.new == 1
    op, field, old, new = item
    assert (op, field, old, new) == ('add', ('spec', 'x'), None, 1)
    assert item == ('add', ('spec', 'x'), None, 1)
    assert repr(item) == "('add', ('spec', 'x'), None, 1)"


def test_diff_is_an_immutable_sequence_equal_to_plain_tuples():
    d = Diff([('add', ('a',), None, 1), DiffItem(REMOVE, ('b',), 2, None)])
    assert len(d) == 2
    assert isinstance(d[0], DiffItem)
    assert d[0].op is ADD
    assert d == (('add', ('a',), None, 1), ('remove', ('b',), 2, None))
    assert d == [('add', ('a',), None, 1), ('remove', ('b',), 2, None)]
    assert d != (('add', ('a',), None, 1),)
    assert d != 'not-a-diff'
    assert isinstance(d[1:], Diff)
    assert d[1:] == (('remove', ('b',), 2, None),)
    assert hash(d) == hash(Diff(d))
    assert repr(d) == "(('add', ('a',), None, 1), ('remove', ('b',), 2, None))"
    assert not Diff()
    with pytest.raises(TypeError):
        d[0] = d[1]


@pytest.mark.parametrize('a, b, expected', [
    # Equal values have no diff.
    (None, None, ()),
    ({}, {}, ()),
    ({'a': 1}, {'a': 1}, ()),
    ([1, 2], [1, 2], ()),
    ('x', 'x', ()),
    # Scalars and lists are compared as wholes.
    ('x', 'y', (('change', (), 'x', 'y'),)),
    ([1, 2], [1, 3], (('change', (), [1, 2], [1, 3]),)),
    (1, True, (('change', (), 1, True),)),
    # Absence (None) vs. presence.
    (None, 'x', (('add', (), None, 'x'),)),
    ('x', None, (('remove', (), 'x', None),)),
    (None, {'a': 1}, (('add', (), None, {'a': 1}),)),
    ({'a': 1}, None, (('remove', (), {'a': 1}, None),)),
    # Type changes.
    ('x', {'a': 1}, (('change', (), 'x', {'a': 1}),)),
    ({'a': 1}, [1], (('change', (), {'a': 1}, [1]),)),
    # Keys: added, changed, removed, recursively.
    ({}, {'a': 1}, (('add', ('a',), None, 1),)),
    ({'a': 1}, {}, (('remove', ('a',), 1, None),)),
    ({'a': 1}, {'a': 2}, (('change', ('a',), 1, 2),)),
    ({'a': {'b': 1}}, {'a': {'b': 2}}, (('change', ('a', 'b'), 1, 2),)),
    ({}, {'a': {'b': 1}}, (('add', ('a',), None, {'b': 1}),)),
    ({'a': {'b': 1}}, {'a': 'x'}, (('change', ('a',), {'b': 1}, 'x'),)),
    # Keys with None are the same as absent keys.
    ({'a': None}, {}, ()),
    ({}, {'a': None}, ()),
    ({'a': None}, {'a': 1}, (('add', ('a',), None, 1),)),
    ({'a': 1}, {'a': None}, (('remove', ('a',), 1, None),)),
])
def test_diff(a, b, expected):
    assert diff(a, b) == expected


@pytest.mark.parametrize('a, b, expected', [
    # Equal in Python, but not the same values: the diff sees them even in equal dicts.
    ({'a': 1}, {'a': 1.0}, (('change', ('a',), 1, 1.0),)),
    ({'a': 1}, {'a': True}, (('change', ('a',), 1, True),)),
    ({'a': {'b': 0}}, {'a': {'b': False}}, (('change', ('a', 'b'), 0, False),)),
    ({'a': {'b': 1.0}}, {'a': {'b': 1}}, (('change', ('a', 'b'), 1.0, 1),)),
    # The same in another order of the keys: no diff.
    ({'a': 1, 'b': {'c': 2, 'd': 3}}, {'b': {'d': 3, 'c': 2}, 'a': 1}, ()),
    # Not JSON at all (the values are compared in Python).
    ({'a': {1: 'x'}}, {'a': {1: 'x'}}, ()),
    ({'a': {1, 2}}, {'a': {1, 2}}, ()),
])
def test_diff_of_equal_dicts_tells_equal_values_of_other_types(a, b, expected):
    assert diff(a, b) == expected


def test_diff_of_the_docs_example():
    old = {'metadata': {'labels': {'label2': 'old-value', 'label3': 'old-value'}}, 'spec': {'size': '1G'}}
    new = {'metadata': {'labels': {'label1': 'new-value', 'label2': 'new-value'}}, 'spec': {'size': '2G'}}
    assert set(diff(old, new)) == {
        ('add', ('metadata', 'labels', 'label1'), None, 'new-value'),
        ('change', ('metadata', 'labels', 'label2'), 'old-value', 'new-value'),
        ('remove', ('metadata', 'labels', 'label3'), 'old-value', None),
        ('change', ('spec', 'size'), '1G', '2G'),
    }


def test_diff_order_is_old_keys_first_then_new_keys():
    assert diff({'b': 1, 'a': 1}, {'c': 1, 'a': 2, 'b': 2}) == (
        ('change', ('b',), 1, 2),
        ('change', ('a',), 1, 2),
        ('add', ('c',), None, 1),
    )


def test_diff_restricted_to_fields():
    old = {'spec': {'x': 1, 'y': 1}, 'status': {'z': 1}, 'metadata': {'labels': {'a': 'b'}}}
    new = {'spec': {'x': 2, 'y': 1}, 'status': {'z': 2}, 'metadata': {'labels': {'a': 'c'}}}
    assert diff(old, new, fields=['spec', ('metadata', 'labels')]) == (
        ('change', ('spec', 'x'), 1, 2),
        ('change', ('metadata', 'labels', 'a'), 'b', 'c'),
    )
    assert diff(old, new, fields=['spec.missing']) == ()
    assert diff(None, new, fields=['status.z']) == (('add', ('status', 'z'), None, 2),)


FULL = Diff([
    ('add', ('metadata', 'labels', 'label1'), None, 'new-value'),
    ('change', ('metadata', 'labels', 'label2'), 'old-value', 'new-value'),
    ('remove', ('metadata', 'labels', 'label3'), 'old-value', None),
    ('change', ('spec', 'size'), '1G', '2G'),
])


@pytest.mark.parametrize('d, field, expected', [
    # The docs' example: the paths become relative, the unrelated fields are dropped.
    (FULL, 'metadata.labels', (
        ('add', ('label1',), None, 'new-value'),
        ('change', ('label2',), 'old-value', 'new-value'),
        ('remove', ('label3',), 'old-value', None),
    )),
    (FULL, ['metadata', 'labels', 'label2'], (('change', (), 'old-value', 'new-value'),)),
    (FULL, ('spec',), (('change', ('size',), '1G', '2G'),)),
    (FULL, 'status', ()),
    (FULL, 'spec.size.deeper', ()),
    (FULL, None, FULL),
    (FULL, '', FULL),
    # A parent added/removed/changed as a whole: re-diffed at the field's level.
    (Diff([('add', ('spec',), None, {'a': {'b': 1}, 'c': 2})]), 'spec.a', (('add', (), None, {'b': 1}),)),
    (Diff([('add', ('spec',), None, {'a': {'b': 1}})]), 'spec.a.b', (('add', (), None, 1),)),
    (Diff([('add', ('spec',), None, {'c': 2})]), 'spec.a', ()),
    (Diff([('remove', ('spec',), {'a': 1}, None)]), 'spec.a', (('remove', (), 1, None),)),
    (Diff([('change', ('spec',), 'x', {'a': 1})]), 'spec.a', (('add', (), None, 1),)),
    (Diff([('change', ('spec',), {'a': 1}, {'a': 2})]), 'spec.a', (('change', (), 1, 2),)),
    (Diff([('add', (), None, {'spec': {'a': 1}})]), 'spec', (('add', (), None, {'a': 1}),)),
])
def test_reduce(d, field, expected):
    assert reduce(d, field) == expected


def test_reduce_of_a_diff_equals_a_diff_of_the_field():
    old = {'spec': {'a': {'x': 1, 'y': 2}}, 'status': {}}
    new = {'spec': {'a': {'x': 1, 'y': 3, 'z': 4}}}
    assert reduce(diff(old, new), 'spec.a') == diff(old['spec']['a'], new['spec']['a'])
    assert reduce(diff(None, new), 'spec.a') == diff(None, new['spec']['a'])
    assert reduce(diff(old, None), 'spec.a') == diff(old['spec']['a'], None)
