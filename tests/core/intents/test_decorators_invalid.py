"""
Mistakes in the declarations fail when the decorators are called, with messages saying what is wrong.
"""
from typing import Any

import pytest

import kopf.on
from kopf._cogs.structs.references import EVERYTHING
from kopf._core.intents.filters import PRESENT
from kopf._core.intents.handlers import ErrorsMode
from kopf._core.intents.registries import OperatorRegistry


def timer(*args: Any, **kwargs: Any) -> Any:
    """``kopf.on.timer`` with an interval (the timers require it), for the tests of all decorators alike."""
    return kopf.on.timer(*args, **{'interval': 1, **kwargs})

RESOURCE_DECORATORS = [
    kopf.on.resume, kopf.on.create, kopf.on.update, kopf.on.delete, kopf.on.event,
    kopf.on.daemon, timer, kopf.on.index, kopf.on.validate, kopf.on.mutate,
]
EXECUTING_DECORATORS = [  # those with errors/timeout/retries/backoff
    kopf.on.resume, kopf.on.create, kopf.on.update, kopf.on.delete,
    kopf.on.daemon, timer, kopf.on.index,
]
ACTIVITY_DECORATORS = [kopf.on.startup, kopf.on.cleanup, kopf.on.login, kopf.on.probe]


def fn(**_: Any) -> None:
    pass


@pytest.mark.parametrize('args, kwargs, error, message', [
    ((), {}, TypeError, r'A resource name, a category, or EVERYTHING .* is required'),
    (('kopfexamples',), {'kind': 'KopfExample'}, TypeError, r'ambiguous'),
    ((EVERYTHING,), {'plural': 'pods'}, TypeError, r'EVERYTHING cannot be combined with specific names'),
    ((EVERYTHING, 'pods'), {}, TypeError, r'EVERYTHING can only be in place of the resource name'),
    (('kopf.dev', 'v1', ''), {}, ValueError, r'resource name cannot be empty'),
    (('kopf.dev/v1/x', 'kopfexamples'), {}, ValueError, r'group/version'),
    (('kopf.dev', 'kopfexamples'), {'group': 'zalando.org'}, TypeError, r'The group is specified twice'),
    ((), {'kind': 'A', 'plural': 'b'}, TypeError, r'Only one resource name'),
])
@pytest.mark.parametrize('decorator', RESOURCE_DECORATORS)
def test_invalid_resource_specifications(decorator, args, kwargs, error, message, registry):
    name = decorator.__name__
    pattern = rf'@kopf\.(on\.)?{name}\(\): invalid resource specification: .*{message}'
    with pytest.raises(error, match=pattern):
        decorator(*args, **kwargs, registry=registry)
    assert not registry.changing and not registry.spawning and not registry.webhooks


@pytest.mark.parametrize('kwargs, error, message', [
    ({'id': ''}, ValueError, r'id= cannot be empty'),
    ({'id': 123}, TypeError, r'id= must be a string'),
    ({'errors': 'ignored'}, TypeError, r'errors= must be one of kopf.ErrorsMode'),
    ({'timeout': -1}, ValueError, r'timeout= must be non-negative'),
    ({'timeout': '60'}, TypeError, r'timeout= must be a number or None'),
    ({'retries': 1.5}, TypeError, r'retries= must be an integer or None'),
    ({'retries': True}, TypeError, r'retries= must be an integer or None'),
    ({'retries': -1}, ValueError, r'retries= must be non-negative'),
    ({'backoff': -0.1}, ValueError, r'backoff= must be non-negative'),
    ({'registry': 'default'}, TypeError, r'registry= must be a kopf.OperatorRegistry'),
])
@pytest.mark.parametrize('decorator', ACTIVITY_DECORATORS + EXECUTING_DECORATORS)
def test_invalid_execution_options(decorator, kwargs, error, message):
    args = () if decorator in ACTIVITY_DECORATORS else ('kopfexamples',)
    with pytest.raises(error, match=message):
        decorator(*args, **kwargs)


@pytest.mark.parametrize('kwargs, error, message', [
    ({'labels': ['a']}, TypeError, r'labels= must be a mapping'),
    ({'labels': {'a': None}}, TypeError, r"labels=\{'a': None\} is ambiguous; use kopf.ABSENT"),
    ({'labels': {'a': 1}}, TypeError, r"must be a string, kopf.PRESENT/kopf.ABSENT, or a callback"),
    ({'labels': {'': 'x'}}, TypeError, r'labels= keys must be non-empty strings'),
    ({'annotations': {'a': None}}, TypeError, r"annotations=\{'a': None\} is ambiguous"),
    ({'annotations': 'a=b'}, TypeError, r'annotations= must be a mapping'),
    ({'when': True}, TypeError, r"when= must be a callable"),
    ({'field': ''}, ValueError, r'field= cannot be empty'),
    ({'field': []}, ValueError, r'field= cannot be empty'),
    ({'field': 'spec..x'}, ValueError, r'field= has empty parts'),
    ({'field': 123}, TypeError, r'invalid field='),
    ({'field': ('spec', 1)}, TypeError, r'invalid field='),
    ({'value': 'x'}, TypeError, r'value= needs field='),
    ({'value': PRESENT}, TypeError, r'value= needs field='),
])
@pytest.mark.parametrize('decorator', RESOURCE_DECORATORS)
def test_invalid_filters(decorator, kwargs, error, message, registry):
    with pytest.raises(error, match=message):
        decorator('kopfexamples', registry=registry, **kwargs)


@pytest.mark.parametrize('decorator', [kopf.on.update, kopf.on.field])
@pytest.mark.parametrize('kwargs', [{'old': 'x'}, {'new': 'y'}, {'old': 'x', 'new': 'y'}])
def test_value_and_old_new_are_mutually_exclusive(decorator, kwargs, registry):
    with pytest.raises(TypeError, match=r'value= cannot be combined with old=/new='):
        decorator('kopfexamples', field='spec.a', value='z', registry=registry, **kwargs)


def test_update_old_new_without_field_filter_the_whole_object(registry):
    kopf.on.update('kopfexamples', old=lambda value, **_: True, registry=registry)(fn)
    [handler] = registry.changing.get_all_handlers()
    assert handler.field is None


@pytest.mark.parametrize('field', [None, '', ()])
def test_field_decorator_requires_a_field(field, registry):
    with pytest.raises(TypeError, match=r'@kopf\.on\.field\(\) requires a non-empty field='):
        kopf.on.field('kopfexamples', field=field, registry=registry)


def test_field_decorator_without_field_at_all(registry):
    with pytest.raises(TypeError, match=r"missing 1 required keyword-only argument: 'field'"):
        kopf.on.field('kopfexamples', registry=registry)  # type: ignore[call-arg]


@pytest.mark.parametrize('decorator, kwargs, error, message', [
    (kopf.on.delete, {'optional': 'yes'}, TypeError, r'optional= must be True, False, or None'),
    (kopf.on.resume, {'deleted': 1}, TypeError, r'deleted= must be True, False, or None'),
    (kopf.on.timer, {'interval': 0}, ValueError, r'interval= must be positive'),
    (kopf.on.timer, {'interval': -1}, ValueError, r'interval= must be positive'),
    (kopf.on.timer, {'idle': -1}, ValueError, r'idle= must be non-negative'),
    (kopf.on.timer, {'sharp': 'yes'}, TypeError, r'sharp= must be True, False, or None'),
    (kopf.on.timer, {'initial_delay': 'soon'}, TypeError, r'initial_delay= must be a number'),
    (kopf.on.daemon, {'initial_delay': -5}, ValueError, r'initial_delay= must be non-negative'),
    (kopf.on.daemon, {'cancellation_timeout': -1}, ValueError, r'cancellation_timeout= must be non-negative'),
    (kopf.on.daemon, {'cancellation_backoff': 'x'}, TypeError, r'cancellation_backoff= must be a number'),
    (kopf.on.daemon, {'cancellation_polling': 0}, ValueError, r'cancellation_polling= must be positive'),
    (kopf.on.validate, {'operation': 'CREATE', 'operations': ['UPDATE']}, TypeError,
     r'operation= and operations= are mutually exclusive'),
    (kopf.on.validate, {'operation': 'create'}, ValueError, r"unknown admission operation\(s\) \['create'\]"),
    (kopf.on.mutate, {'operations': ['CREATE', 'PATCH']}, ValueError,
     r"unknown admission operation\(s\) \['PATCH'\]"),
    (kopf.on.mutate, {'operations': 'CREATE'}, TypeError, r'operations= must be a collection of strings'),
    (kopf.on.mutate, {'operations': []}, ValueError, r'operations= cannot be empty'),
    (kopf.on.mutate, {'subresource': ''}, TypeError, r'subresource= must be a non-empty string'),
    (kopf.on.validate, {'persistent': 'yes'}, TypeError, r'persistent= must be True, False, or None'),
    (kopf.on.validate, {'side_effects': 0}, TypeError, r'side_effects= must be True, False, or None'),
    (kopf.on.validate, {'ignore_failures': 'no'}, TypeError,
     r'ignore_failures= must be True, False, or None'),
])
def test_invalid_specific_options(decorator, kwargs, error, message, registry):
    with pytest.raises(error, match=message):
        decorator('kopfexamples', registry=registry, **kwargs)


@pytest.mark.parametrize('decorator', ACTIVITY_DECORATORS + RESOURCE_DECORATORS)
def test_non_callables_are_rejected(decorator, registry):
    args = () if decorator in ACTIVITY_DECORATORS else ('kopfexamples',)
    with pytest.raises(TypeError, match=r'decorates functions, got 123'):
        decorator(*args, registry=registry)(123)


@pytest.mark.parametrize('decorator', ACTIVITY_DECORATORS + RESOURCE_DECORATORS)
def test_methods_in_class_bodies_are_rejected(decorator):
    args = () if decorator in ACTIVITY_DECORATORS else ('kopfexamples',)
    registry = OperatorRegistry()
    with pytest.raises(TypeError, match=r'cannot decorate .*Handlers.method\(\): instance and class methods'):
        class Handlers:
            @decorator(*args, registry=registry)
            def method(self, **_: Any) -> None:
                pass

    with pytest.raises(TypeError, match=r'cannot decorate class methods'):
        class ClassHandlers:
            @decorator(*args, registry=registry)
            @classmethod
            def method(cls, **_: Any) -> None:
                pass

    with pytest.raises(TypeError, match=r'cannot decorate .*ClassHandlers2.method\(\)'):
        class ClassHandlers2:
            @classmethod
            @decorator(*args, registry=registry)
            def method(cls, **_: Any) -> None:
                pass

    assert not registry.activities and not registry.changing


def test_nested_functions_named_self_are_fine(registry):
    def factory():
        def inner(self, **_: Any) -> None:  # not a method: defined in a function, not a class
            pass
        return inner

    kopf.on.create('kopfexamples', registry=registry)(factory())
    assert len(registry.changing) == 1


def test_the_errors_enum_is_accepted(registry):
    for mode in ErrorsMode:
        kopf.on.create('kopfexamples', id=mode.name, errors=mode, registry=registry)(fn)
    assert [handler.errors for handler in registry.changing.get_all_handlers()] == list(ErrorsMode)
