from typing import Any

import pytest

import kopf.on
from kopf._core.intents import filters
from kopf._core.intents.filters import ABSENT, PRESENT, MetaFilterToken, all_, any_, none_, not_
from kopf._core.intents.handlers import Reason
from kopf._core.intents.registries import OperatorRegistry


def timer(*args: Any, **kwargs: Any) -> Any:
    """``kopf.on.timer`` with an interval (the timers require it), for the tests of all decorators alike."""
    return kopf.on.timer(*args, **{'interval': 1, **kwargs})


def no_kwargs() -> dict[str, Any]:
    return {}


def is_x(value, **_):
    return value == 'x'


def is_y(value, **_):
    return value == 'y'


def starts_with_x(value, **_):
    return value is not None and value.startswith('x')


def test_tokens():
    assert PRESENT is MetaFilterToken.PRESENT and PRESENT.value == 1
    assert ABSENT is MetaFilterToken.ABSENT and ABSENT.value == 2


@pytest.mark.parametrize('criterion, value, expected', [
    ('x', 'x', True),
    ('x', 'y', False),
    ('x', None, False),
    ('', '', True),
    (PRESENT, 'x', True),
    (PRESENT, '', True),  # empty strings are values like any other
    (PRESENT, None, False),
    (ABSENT, None, True),
    (ABSENT, '', False),
    (ABSENT, 'x', False),
    (is_x, 'x', True),
    (is_x, 'y', False),
    (is_x, None, False),
    (123, 123, True),
    ({'a': 1}, {'a': 1}, True),
])
def test_check_value(criterion, value, expected):
    assert filters.check_value(criterion, value, no_kwargs) is expected


def test_value_callbacks_get_the_value_positionally_and_the_kwargs():
    calls = []

    def fn(*args, **kwargs):
        calls.append((args, kwargs))
        return True

    assert filters.check_value(fn, 'v', lambda: {'name': 'n', 'param': 1})
    assert calls == [(('v',), {'name': 'n', 'param': 1})]


@pytest.mark.parametrize('criteria, actual, expected', [
    (None, {}, True),
    ({}, {'a': 'b'}, True),
    ({'a': 'b'}, {'a': 'b'}, True),
    ({'a': 'b'}, {'a': 'c'}, False),
    ({'a': 'b'}, {}, False),
    ({'a': PRESENT}, {'a': ''}, True),
    ({'a': PRESENT}, {}, False),
    ({'a': ABSENT}, {}, True),
    ({'a': ABSENT}, {'a': 'b'}, False),
    ({'a': 'b', 'c': ABSENT}, {'a': 'b'}, True),
    ({'a': 'b', 'c': ABSENT}, {'a': 'b', 'c': 'd'}, False),  # all criteria must match
    ({'a': starts_with_x}, {'a': 'xyz'}, True),
    ({'a': starts_with_x}, {}, False),
])
def test_match_metadata(criteria, actual, expected):
    assert filters.match_metadata(criteria, actual, no_kwargs) is expected


#
# Callback combinators.
#

def true_fn(*_, **__):
    return True


def false_fn(*_, **__):
    return False


@pytest.mark.parametrize('combinator, fns, expected', [
    (any_, [], False),
    (any_, [false_fn], False),
    (any_, [false_fn, true_fn], True),
    (any_, [true_fn, true_fn], True),
    (all_, [], True),
    (all_, [false_fn], False),
    (all_, [false_fn, true_fn], False),
    (all_, [true_fn, true_fn], True),
    (none_, [], True),
    (none_, [false_fn], True),
    (none_, [false_fn, true_fn], False),
    (none_, [true_fn, true_fn], False),
])
def test_collection_combinators(combinator, fns, expected):
    assert combinator(fns)('value', name='x') is expected


@pytest.mark.parametrize('fn, expected', [(true_fn, False), (false_fn, True)])
def test_not(fn, expected):
    assert not_(fn)('value', name='x') is expected


def test_combinators_pass_the_arguments_through():
    calls = []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return True

    assert all_([spy, not_(not_(spy))])('v', name='n')
    assert calls == [(('v',), {'name': 'n'}), (('v',), {'name': 'n'})]


def test_combinators_short_circuit():
    calls = []

    def spy(*_, **__):
        calls.append(1)
        return True

    assert any_([true_fn, spy])()
    assert not all_([false_fn, spy])()
    assert not none_([true_fn, spy])()
    assert calls == []


def test_combinators_nest_for_value_filters():
    combined = any_([is_x, all_([starts_with_x, not_(is_y)])])
    assert combined('xyz')
    assert combined('x')
    assert not combined('abc')


def test_combined_collection_is_a_snapshot():
    fns = [false_fn]
    combined = any_(fns)
    fns.append(true_fn)
    assert combined() is False


@pytest.mark.parametrize('combinator', [any_, all_, none_])
@pytest.mark.parametrize('fns', [true_fn, 'fns', [true_fn, 'not callable'], 123])
def test_combinators_reject_non_collections_of_callables(combinator, fns):
    with pytest.raises(TypeError, match=rf'kopf\.{combinator.__name__}\(\) expects'):
        combinator(fns)


def test_not_rejects_non_callables():
    with pytest.raises(TypeError, match=r'kopf\.not_\(\) expects callables only'):
        not_('x')


#
# Matching of handlers (made by the decorators) against causes.
#

def make_handler(decorator: Any, **kwargs: Any) -> Any:
    registry = OperatorRegistry()
    decorator('kopfexamples', registry=registry, **kwargs)(lambda **_: None)
    kinds = [registry.watching, registry.changing, registry.spawning, registry.indexing, registry.webhooks]
    [handler] = [handler for kind in kinds for handler in kind.get_all_handlers()]
    return handler


BODY_KWARGS = {'labels': {'l1': 'v1', 'empty': ''}, 'annotations': {'a1': 'v1'}, 'spec': {'field': 'value'}}


@pytest.mark.parametrize('decorator', [kopf.on.event, kopf.on.create, kopf.on.resume, kopf.on.delete,
                                       kopf.on.daemon, timer, kopf.on.index, kopf.on.validate])
@pytest.mark.parametrize('options, expected', [
    ({}, True),
    ({'labels': {'l1': 'v1'}}, True),
    ({'labels': {'l1': 'other'}}, False),
    ({'labels': {'l1': PRESENT, 'empty': PRESENT}}, True),
    ({'labels': {'l1': ABSENT}}, False),
    ({'labels': {'nope': ABSENT}}, True),
    ({'labels': {'l1': is_x}}, False),
    ({'labels': {'l1': lambda value, **_: value == 'v1'}}, True),
    ({'annotations': {'a1': 'v1'}}, True),
    ({'annotations': {'a1': 'v2'}}, False),
    ({'annotations': {'l1': 'v1'}}, False),  # labels are not annotations
    ({'labels': {'l1': 'v1'}, 'annotations': {'a1': 'v2'}}, False),
    ({'field': 'spec.field'}, True),  # the field is present
    ({'field': 'spec.nope'}, False),
    ({'field': 'spec.field', 'value': 'value'}, True),
    ({'field': 'spec.field', 'value': 'other'}, False),
    ({'field': 'spec.field', 'value': PRESENT}, True),
    ({'field': 'spec.field', 'value': ABSENT}, False),
    ({'field': 'spec.nope', 'value': ABSENT}, True),
    ({'field': ['spec', 'field'], 'value': lambda value, **_: value == 'value'}, True),
    ({'when': lambda name, **_: name == 'kex1'}, True),
    ({'when': lambda name, **_: name == 'kex2'}, False),
    ({'when': lambda spec, **_: spec['field'] == 'value', 'labels': {'l1': 'v1'}}, True),
])
def test_state_filters_of_all_handler_kinds(decorator, options, expected, changing_cause, make_body):
    handler = make_handler(decorator, **options)
    raw = make_body(**BODY_KWARGS)
    cause = changing_cause(reason=Reason.CREATE, raw=raw, new={'spec': {'field': 'value'}})
    assert filters.match(handler, cause) is expected
    assert filters.prematch(handler, cause) is expected


def test_callbacks_are_not_called_when_cheaper_criteria_fail(changing_cause, make_body):
    calls = []
    handler = make_handler(kopf.on.create, labels={'l1': 'other'}, when=lambda **_: calls.append(1))
    assert not filters.match(handler, changing_cause(reason=Reason.CREATE, raw=make_body(**BODY_KWARGS)))
    assert calls == []


def test_callbacks_get_the_handler_kwargs_incl_param(changing_cause, make_body):
    seen: dict[str, Any] = {}

    def when(**kwargs):
        seen.update(kwargs)
        return True

    handler = make_handler(kopf.on.create, when=when, param='p')
    cause = changing_cause(reason=Reason.CREATE, raw=make_body(**BODY_KWARGS), new={'spec': {}},
                           indices={'my_index': 'idx'})
    assert filters.match(handler, cause)
    assert seen['param'] == 'p'
    assert seen['name'] == 'kex1' and seen['namespace'] == 'ns1'
    assert seen['labels'] == {'l1': 'v1', 'empty': ''}
    assert seen['reason'] == Reason.CREATE
    assert seen['my_index'] == 'idx'
    assert seen['patch'] is cause.patch


def test_the_kwargs_are_built_once_per_handler(changing_cause, make_body):
    kwargs_ids = set()

    def spy(*_, **kwargs):
        kwargs_ids.add(id(kwargs['body']))
        return True

    handler = make_handler(kopf.on.create, labels={'l1': spy, 'empty': spy}, when=spy)
    assert filters.match(handler, changing_cause(reason=Reason.CREATE, raw=make_body(**BODY_KWARGS)))
    assert len(kwargs_ids) == 1


# The update handlers: the field must be changed; value= matches the old or the new value.
@pytest.mark.parametrize('options, old, new, expected', [
    ({}, {'spec': {'a': 1}}, {'spec': {'a': 2}}, True),
    ({'field': 'spec.a'}, {'spec': {'a': 1}}, {'spec': {'a': 2}}, True),
    ({'field': 'spec.a'}, {'spec': {'a': 1}}, {'spec': {'a': 1, 'b': 2}}, False),  # not affected
    ({'field': 'spec.a'}, {'spec': {}}, {'spec': {'a': 1}}, True),  # added
    ({'field': 'spec.a'}, {'spec': {'a': 1}}, {'spec': {}}, True),  # removed
    ({'field': 'spec.a'}, {}, {'spec': {'a': 1}}, True),  # added with its parent
    ({'field': 'spec.a', 'value': 'x'}, {'spec': {'a': 'x'}}, {'spec': {'a': 'y'}}, True),
    ({'field': 'spec.a', 'value': 'y'}, {'spec': {'a': 'x'}}, {'spec': {'a': 'y'}}, True),
    ({'field': 'spec.a', 'value': 'z'}, {'spec': {'a': 'x'}}, {'spec': {'a': 'y'}}, False),
    ({'field': 'spec.a', 'value': ABSENT}, {'spec': {}}, {'spec': {'a': 'y'}}, True),
    ({'field': 'spec.a', 'value': PRESENT}, {'spec': {}}, {'spec': {'a': 'y'}}, True),
    ({'field': 'spec.a', 'old': 'x', 'new': 'y'}, {'spec': {'a': 'x'}}, {'spec': {'a': 'y'}}, True),
    ({'field': 'spec.a', 'old': 'x', 'new': 'y'}, {'spec': {'a': 'y'}}, {'spec': {'a': 'x'}}, False),
    ({'field': 'spec.a', 'old': ABSENT, 'new': PRESENT}, {'spec': {}}, {'spec': {'a': 1}}, True),
    ({'field': 'spec.a', 'old': ABSENT, 'new': PRESENT}, {'spec': {'a': 0}}, {'spec': {'a': 1}}, False),
    ({'field': 'spec.a', 'old': PRESENT, 'new': ABSENT}, {'spec': {'a': 0}}, {'spec': {}}, True),
    ({'field': 'spec.a', 'new': 'world'}, {'spec': {'a': 'hello'}}, {'spec': {'a': 'world'}}, True),
    ({'field': 'spec.a', 'new': 'world'}, {'spec': {}}, {'spec': {'a': 'world'}}, True),
    ({'field': 'spec.a', 'new': 'world'}, {'spec': {'a': 'world'}}, {'spec': {'a': 'hello'}}, False),
    ({'field': 'spec.a', 'old': 'world'}, {'spec': {'a': 'world'}}, {'spec': {}}, True),
    ({'field': 'spec.a', 'old': 'world'}, {'spec': {'a': 'hello'}}, {'spec': {'a': 'world'}}, False),
    ({'field': 'spec.a', 'new': is_y}, {'spec': {'a': 'x'}}, {'spec': {'a': 'y'}}, True),
    ({'field': 'spec.a', 'new': 'y'}, {'spec': {'a': 'y'}, 'x': 1}, {'spec': {'a': 'y'}, 'x': 2}, False),
])
def test_update_field_filters(options, old, new, expected, changing_cause):
    for decorator in [kopf.on.update, kopf.on.field]:
        if decorator is kopf.on.field and 'field' not in options:
            continue
        handler = make_handler(decorator, **options)
        cause = changing_cause(reason=Reason.UPDATE, old=old, new=new)
        assert filters.match(handler, cause) is expected


def test_field_value_callbacks_of_update_handlers_get_the_narrowed_kwargs(changing_cause):
    seen = []

    def new_fn(value, *, old, new, diff, **_):
        seen.append((value, old, new, tuple(diff)))
        return True

    handler = make_handler(kopf.on.update, field='spec.a', new=new_fn)
    cause = changing_cause(reason=Reason.UPDATE, old={'spec': {'a': 1}}, new={'spec': {'a': 2}})
    assert filters.match(handler, cause)
    assert seen == [(2, 1, 2, (('change', (), 1, 2),))]


def test_update_handlers_are_in_scope_regardless_of_their_field_changes(changing_cause, make_body):
    # A field handler of a non-existent field keeps all objects in the operator's scope (not stealthy).
    handler = make_handler(kopf.on.field, field='spec.nonexistent', labels={'l1': 'v1'})
    cause = changing_cause(reason=Reason.UPDATE, raw=make_body(**BODY_KWARGS), old={'a': 1}, new={'a': 2})
    assert not filters.match(handler, cause)
    assert filters.prematch(handler, cause)


def test_update_handlers_are_out_of_scope_by_metadata(changing_cause, make_body):
    handler = make_handler(kopf.on.field, field='spec.nonexistent', labels={'l1': 'other'})
    cause = changing_cause(reason=Reason.UPDATE, raw=make_body(**BODY_KWARGS), old={'a': 1}, new={'a': 2})
    assert not filters.prematch(handler, cause)


def test_update_handlers_never_match_non_changing_causes(watching_cause):
    handler = make_handler(kopf.on.update, field='spec.a')
    assert not filters.match(handler, watching_cause())
