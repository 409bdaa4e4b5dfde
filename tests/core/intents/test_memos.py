import copy
import pickle

import pytest

from kopf._core.intents.memos import Memo, make_object_memo


def test_attributes_and_keys_are_the_same():
    memo = Memo()
    memo.f1 = 100
    memo['f2'] = 200
    assert memo['f1'] == 100
    assert memo.f2 == 200
    assert set(memo.keys()) == {'f1', 'f2'}
    assert isinstance(memo, dict)


def test_missing_attributes_raise_attribute_errors():
    memo = Memo()
    with pytest.raises(AttributeError, match="no attribute or key 'missing'"):
        _ = memo.missing
    with pytest.raises(AttributeError, match="no attribute or key 'missing'"):
        del memo.missing
    assert getattr(memo, 'missing', 'default') == 'default'


def test_deleting_attributes_deletes_keys():
    memo = Memo(x=1)
    del memo.x
    assert 'x' not in memo


def test_dict_methods_take_precedence_over_keys():
    memo = Memo()
    memo['keys'] = 'a value'
    assert callable(memo.keys)
    assert memo['keys'] == 'a value'


def test_repr():
    assert repr(Memo(a=1)) == "Memo({'a': 1})"


def test_shallow_copy_is_a_memo_with_shared_values():
    shared = []
    memo = Memo(queue=shared)
    copied = copy.copy(memo)
    assert type(copied) is Memo
    assert copied == memo and copied is not memo
    copied.new_key = 1
    assert 'new_key' not in memo
    copied.queue.append('x')
    assert memo.queue == ['x']


def test_deep_copy_and_pickling():
    memo = Memo(queue=[1])
    deep = copy.deepcopy(memo)
    deep.queue.append(2)
    assert memo.queue == [1]
    assert pickle.loads(pickle.dumps(memo)) == memo


def test_object_memo_from_nothing_is_a_new_empty_memo():
    memo1 = make_object_memo(None)
    memo2 = make_object_memo(None)
    assert memo1 == Memo() and memo1 is not memo2


def test_object_memo_is_a_shallow_copy_of_the_operator_memo():
    queue = []
    operator_memo = Memo(queue=queue)
    object_memo = make_object_memo(operator_memo)
    object_memo.is_seen = True
    operator_memo.later = 'not replicated'
    object_memo.queue.append('shared')
    assert 'is_seen' not in operator_memo
    assert 'later' not in object_memo
    assert operator_memo.queue == ['shared']


def test_object_memo_of_a_custom_class_that_shares_itself():
    class Global:
        def __copy__(self):
            return self

    operator_memo = Global()
    assert make_object_memo(operator_memo) is operator_memo
