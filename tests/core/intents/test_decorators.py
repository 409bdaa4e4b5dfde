import functools
import inspect
from typing import Any

import pytest

import kopf.on
from kopf._cogs.structs.references import EVERYTHING, Selector
from kopf._core.intents import handlers
from kopf._core.intents.filters import ABSENT, PRESENT
from kopf._core.intents.handlers import Activity, ErrorsMode, Reason, WebhookType
from kopf._core.intents.registries import OperatorRegistry


def timer(*args: Any, **kwargs: Any) -> Any:
    """``kopf.on.timer`` with an interval (the timers require it), for the tests of all decorators alike."""
    return kopf.on.timer(*args, **{'interval': 1, **kwargs})

RESOURCE = ['arg1', 'arg2', 'arg3', 'group', 'version', 'kind', 'plural', 'singular', 'shortcut', 'category']
EXECUTION = ['id', 'param', 'errors', 'timeout', 'retries', 'backoff']
FILTERS = ['labels', 'annotations', 'when', 'field', 'value']

# The parameters of Kopf 1.45.2, in order; all default to None except where noted.
EXPECTED_PARAMETERS = {
    'startup': [*EXECUTION, 'registry'],
    'cleanup': [*EXECUTION, 'registry'],
    'login': [*EXECUTION, 'registry'],
    'probe': [*EXECUTION, 'registry'],
    'resume': [*RESOURCE, *EXECUTION, 'deleted', *FILTERS, 'registry'],
    'create': [*RESOURCE, *EXECUTION, *FILTERS, 'registry'],
    'update': [*RESOURCE, *EXECUTION, *FILTERS, 'old', 'new', 'registry'],
    'delete': [*RESOURCE, *EXECUTION, 'optional', *FILTERS, 'registry'],
    'field': [*RESOURCE, *EXECUTION, *FILTERS, 'old', 'new', 'registry'],
    'index': [*RESOURCE, *EXECUTION, *FILTERS, 'registry'],
    'event': [*RESOURCE, 'id', 'param', *FILTERS, 'registry'],
    'daemon': [*RESOURCE, *EXECUTION, 'initial_delay', 'cancellation_backoff', 'cancellation_timeout',
               'cancellation_polling', *FILTERS, 'registry'],
    'timer': [*RESOURCE, *EXECUTION, 'interval', 'initial_delay', 'sharp', 'idle', *FILTERS, 'registry'],
    'validate': [*RESOURCE, 'id', 'param', 'operation', 'operations', 'subresource', 'persistent',
                 'side_effects', 'ignore_failures', *FILTERS, 'registry'],
    'mutate': [*RESOURCE, 'id', 'param', 'operation', 'operations', 'subresource', 'persistent',
               'side_effects', 'ignore_failures', *FILTERS, 'registry'],
    'subhandler': [*EXECUTION, 'labels', 'annotations', 'when', 'field', 'value', 'old', 'new'],
    'register': ['fn', *EXECUTION, 'labels', 'annotations', 'when'],
}


@pytest.mark.parametrize('name, expected', list(EXPECTED_PARAMETERS.items()))
def test_signatures(name, expected):
    parameters = inspect.signature(getattr(kopf.on, name)).parameters
    assert list(parameters) == expected
    for parameter in parameters.values():
        if parameter.name in ('arg1', 'arg2', 'arg3'):
            assert parameter.kind is inspect.Parameter.POSITIONAL_ONLY
            assert parameter.default is None
        elif parameter.name == 'fn':
            assert parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            assert parameter.default is inspect.Parameter.empty
        elif name == 'field' and parameter.name == 'field':
            assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
            assert parameter.default is inspect.Parameter.empty
        else:
            assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
            assert parameter.default is None


def test_public_names_of_the_module():
    assert sorted(kopf.on.__all__) == sorted(EXPECTED_PARAMETERS)


def fn(**_: Any) -> None:
    pass


def all_handlers(registry: OperatorRegistry) -> list[Any]:
    return [
        *registry.activities.get_all_handlers(),
        *registry.watching.get_all_handlers(),
        *registry.changing.get_all_handlers(),
        *registry.spawning.get_all_handlers(),
        *registry.indexing.get_all_handlers(),
        *registry.webhooks.get_all_handlers(),
    ]


@pytest.mark.parametrize('decorator, activity', [
    (kopf.on.startup, Activity.STARTUP),
    (kopf.on.cleanup, Activity.CLEANUP),
    (kopf.on.login, Activity.AUTHENTICATION),
    (kopf.on.probe, Activity.PROBE),
])
def test_activity_decorators(decorator, activity, registry):
    result = decorator(id='x', param=1, errors=ErrorsMode.PERMANENT, timeout=2, retries=3, backoff=4,
                       registry=registry)(fn)
    assert result is fn
    [handler] = registry.activities.get_all_handlers()
    assert handler == handlers.ActivityHandler(
        fn=fn, id='x', param=1, errors=ErrorsMode.PERMANENT, timeout=2, retries=3, backoff=4,
        activity=activity,
    )
    assert registry.activities.get_handlers(activity) == [handler]


def test_activity_defaults(registry):
    kopf.on.startup(registry=registry)(fn)
    [handler] = registry.activities.get_all_handlers()
    assert handler == handlers.ActivityHandler(fn=fn, id='fn', errors=ErrorsMode.TEMPORARY,
                                               activity=Activity.STARTUP)


COMMON = {'id': 'x', 'param': 'p', 'errors': ErrorsMode.PERMANENT, 'timeout': 1.5, 'retries': 2, 'backoff': 3}


def when_fn(**_: Any) -> bool:
    return True


@pytest.mark.parametrize('decorator, options, cls, attrs', [
    (kopf.on.resume, {}, handlers.ChangingHandler,
     {'reason': Reason.RESUME, 'initial': True, 'deleted': None, 'field_needs_change': None,
      'requires_finalizer': None}),
    (kopf.on.resume, {'deleted': True}, handlers.ChangingHandler,
     {'reason': Reason.RESUME, 'initial': True, 'deleted': True}),
    (kopf.on.create, {}, handlers.ChangingHandler,
     {'reason': Reason.CREATE, 'initial': None, 'field_needs_change': None, 'requires_finalizer': None}),
    (kopf.on.update, {}, handlers.ChangingHandler,
     {'reason': Reason.UPDATE, 'field_needs_change': True, 'old': None, 'new': None}),
    (kopf.on.update, {'field': 'spec.a', 'old': 1, 'new': PRESENT}, handlers.ChangingHandler,
     {'reason': Reason.UPDATE, 'field_needs_change': True, 'field': ('spec', 'a'), 'old': 1, 'new': PRESENT,
          'id': 'x/spec.a'}),
    (kopf.on.delete, {}, handlers.ChangingHandler,
     {'reason': Reason.DELETE, 'requires_finalizer': True}),
    (kopf.on.delete, {'optional': True}, handlers.ChangingHandler,
     {'reason': Reason.DELETE, 'requires_finalizer': False}),
    (kopf.on.delete, {'optional': False}, handlers.ChangingHandler,
     {'reason': Reason.DELETE, 'requires_finalizer': True}),
    (kopf.on.field, {'field': 'spec.a'}, handlers.ChangingHandler,
     {'reason': None, 'field_needs_change': True, 'field': ('spec', 'a'), 'id': 'x/spec.a'}),
    (kopf.on.field, {'field': ['spec', 'a'], 'value': 'v'}, handlers.ChangingHandler,
     {'reason': None, 'field_needs_change': True, 'field': ('spec', 'a'), 'value': 'v', 'id': 'x/spec.a'}),
    (kopf.on.daemon, {'initial_delay': 1, 'cancellation_backoff': 2, 'cancellation_timeout': 3,
                      'cancellation_polling': 4}, handlers.DaemonHandler,
     {'initial_delay': 1, 'cancellation_backoff': 2, 'cancellation_timeout': 3, 'cancellation_polling': 4,
          'requires_finalizer': True}),
    (kopf.on.daemon, {'initial_delay': when_fn}, handlers.DaemonHandler, {'initial_delay': when_fn}),
    (kopf.on.timer, {'interval': 1, 'initial_delay': 2, 'sharp': True, 'idle': 3}, handlers.TimerHandler,
     {'interval': 1, 'initial_delay': 2, 'sharp': True, 'idle': 3, 'requires_finalizer': True}),
    (kopf.on.index, {}, handlers.IndexingHandler, {'id': 'x'}),
    (kopf.on.index, {'field': 'spec.a'}, handlers.IndexingHandler, {'id': 'x', 'field': ('spec', 'a')}),
])
def test_resource_decorators_with_execution_options(decorator, options, cls, attrs, registry):
    labels = {'l': 'v'}
    annotations = {'a': ABSENT}
    result = decorator('kopf.dev', 'v1', 'kopfexamples', registry=registry, labels=labels,
                       annotations=annotations, when=when_fn, **COMMON, **options)(fn)
    assert result is fn
    [handler] = all_handlers(registry)
    assert type(handler) is cls
    assert handler.fn is fn
    assert handler.selector == Selector('kopf.dev', 'v1', 'kopfexamples')
    assert handler.labels == labels and handler.annotations == annotations and handler.when is when_fn
    assert handler.param == 'p' and handler.errors == ErrorsMode.PERMANENT
    assert (handler.timeout, handler.retries, handler.backoff) == (1.5, 2, 3)
    expected = {'id': 'x', 'field': None, 'value': None, **attrs}
    assert {name: getattr(handler, name) for name in expected} == expected


@pytest.mark.parametrize('decorator, errors', [
    (kopf.on.resume, ErrorsMode.TEMPORARY),
    (kopf.on.create, ErrorsMode.TEMPORARY),
    (kopf.on.update, ErrorsMode.TEMPORARY),
    (kopf.on.delete, ErrorsMode.TEMPORARY),
    (kopf.on.daemon, ErrorsMode.TEMPORARY),
    (timer, ErrorsMode.TEMPORARY),
    (kopf.on.index, ErrorsMode.IGNORED),
    (kopf.on.event, ErrorsMode.IGNORED),
    (kopf.on.validate, None),
    (kopf.on.mutate, None),
])
def test_default_errors_modes(decorator, errors, registry):
    decorator('kopfexamples', registry=registry)(fn)
    [handler] = all_handlers(registry)
    assert handler.errors == errors
    assert handler.id == 'fn'
    assert (handler.timeout, handler.retries, handler.backoff, handler.param) == (None, None, None, None)


def test_event_decorator(registry):
    kopf.on.event('pods', id='spy', param=1, field='spec.x', value='y', registry=registry)(fn)
    [handler] = registry.watching.get_all_handlers()
    assert handler == handlers.WatchingHandler(
        fn=fn, id='spy/spec.x', param=1, errors=ErrorsMode.IGNORED,
        selector=Selector('pods'), field=('spec', 'x'), value='y',
    )


@pytest.mark.parametrize('decorator, webhook_type', [
    (kopf.on.validate, WebhookType.VALIDATING),
    (kopf.on.mutate, WebhookType.MUTATING),
])
def test_webhook_decorators(decorator, webhook_type, registry):
    decorator('kopfexamples', id='hook', param=1, operations=['CREATE', 'UPDATE'], subresource='status',
              persistent=True, side_effects=False, ignore_failures=True, registry=registry)(fn)
    [handler] = registry.webhooks.get_all_handlers()
    assert handler == handlers.WebhookHandler(
        fn=fn, id='hook', param=1, reason=webhook_type, selector=Selector('kopfexamples'),
        operations=frozenset({'CREATE', 'UPDATE'}), subresource='status',
        persistent=True, side_effects=False, ignore_failures=True,
    )


@pytest.mark.parametrize('operation, operations, expected', [
    (None, None, None),
    ('CREATE', None, frozenset({'CREATE'})),
    (None, ['DELETE', 'CONNECT'], frozenset({'DELETE', 'CONNECT'})),
])
def test_webhook_operations(operation, operations, expected, registry):
    kopf.on.validate('kopfexamples', operation=operation, operations=operations, registry=registry)(fn)
    [handler] = registry.webhooks.get_all_handlers()
    assert handler.operations == expected


@pytest.mark.parametrize('args, kwargs', [
    (('kopf.dev', 'v1', 'kopfexamples'), {}),
    (('kopf.dev/v1', 'kopfexamples'), {}),
    (('kopfexamples.kopf.dev',), {}),
    (('kopfexamples',), {'group': 'kopf.dev', 'version': 'v1'}),
    ((), {'kind': 'KopfExample'}),
    ((), {'plural': 'kopfexamples'}),
    ((), {'singular': 'kopfexample'}),
    ((), {'shortcut': 'kex'}),
    ((), {'category': 'all'}),
    ((EVERYTHING,), {}),
    (('kopf.dev', EVERYTHING), {}),
    ((lambda resource: resource.plural == 'kopfexamples',), {}),
])
@pytest.mark.parametrize('decorator', [
    kopf.on.resume, kopf.on.create, kopf.on.update, kopf.on.delete, kopf.on.event,
    kopf.on.daemon, timer, kopf.on.index, kopf.on.validate, kopf.on.mutate,
])
def test_resource_specifications(decorator, args, kwargs, registry):
    decorator(*args, **kwargs, registry=registry)(fn)
    [handler] = all_handlers(registry)
    assert handler.selector == Selector(*args, **kwargs)


def test_field_decorator_with_positional_resource(registry):
    kopf.on.field('kopfexamples', field='spec.a', registry=registry)(fn)
    [handler] = registry.changing.get_all_handlers()
    assert handler.selector == Selector('kopfexamples')


def test_default_registry_is_used_if_none_is_given(default_registry):
    kopf.on.create('kopfexamples')(fn)
    kopf.on.startup()(fn)
    kopf.on.daemon('kopfexamples')(fn)
    kopf.on.validate('kopfexamples')(fn)
    assert len(default_registry.changing) == 1
    assert len(default_registry.activities) == 1
    assert len(default_registry.spawning) == 1
    assert len(default_registry.webhooks) == 1


def test_stacked_decorators_register_in_the_order_of_application(registry):
    @kopf.on.resume('kopfexamples', registry=registry)
    @kopf.on.create('kopfexamples', registry=registry)
    @kopf.on.update('kopfexamples', field='spec.a', registry=registry)
    @kopf.on.update('kopfexamples', field='spec', registry=registry)
    def stacked(**_: Any) -> None:
        pass

    assert [(h.reason, h.id) for h in registry.changing.get_all_handlers()] == [
        (Reason.UPDATE, 'stacked/spec'),
        (Reason.UPDATE, 'stacked/spec.a'),
        (Reason.CREATE, 'stacked'),
        (Reason.RESUME, 'stacked'),
    ]


#
# Ids of the handlers and the supported kinds of callables.
#

class Namespace:
    @kopf.on.create('kopfexamples', registry=(static_registry := OperatorRegistry()))
    @staticmethod
    def static_above(**_: Any) -> None:
        pass

    @staticmethod
    @kopf.on.create('kopfexamples', registry=static_registry)
    def static_below(**_: Any) -> None:
        pass

    def method(self, **_: Any) -> None:
        pass


def test_static_methods_are_supported_in_any_order():
    ids = [handler.id for handler in Namespace.static_registry.changing.get_all_handlers()]
    fns = [handler.fn for handler in Namespace.static_registry.changing.get_all_handlers()]
    assert ids == ['static_above', 'static_below']
    assert fns == [Namespace.static_above, Namespace.static_below]
    Namespace.static_above()  # still a usable static method
    Namespace.static_below()


def test_bound_methods_of_specific_instances_are_supported(registry):
    instance = Namespace()
    kopf.on.create('kopfexamples', registry=registry)(instance.method)
    [handler] = registry.changing.get_all_handlers()
    assert handler.fn == instance.method
    assert handler.id == 'method'


def outer(**_: Any) -> None:
    pass


@functools.wraps(outer)
def wrapper(**kwargs: Any) -> None:
    outer(**kwargs)


class CallableObject:
    def __call__(self, **_: Any) -> None:
        pass


@pytest.mark.parametrize('fn, id, field, expected', [
    (outer, None, None, 'outer'),
    (outer, 'explicit', None, 'explicit'),
    (outer, None, 'spec.field', 'outer/spec.field'),
    (outer, 'explicit', 'spec.field', 'explicit/spec.field'),
    (outer, None, ['spec', 'a', 'b'], 'outer/spec.a.b'),
    (outer, 'with/slash', None, 'with/slash'),
    (functools.partial(outer, x=1), None, None, 'outer'),
    (wrapper, None, None, 'outer'),
    (CallableObject(), None, None, 'CallableObject'),
])
def test_handler_ids(fn, id, field, expected, registry):
    kopf.on.create('kopfexamples', id=id, field=field, registry=registry)(fn)
    [handler] = registry.changing.get_all_handlers()
    assert handler.id == expected


def test_lambda_ids_are_their_locations(registry):
    fn = lambda **_: None  # noqa: E731
    kopf.on.create('kopfexamples', registry=registry)(fn)
    [handler] = registry.changing.get_all_handlers()
    assert handler.id == f'lambda@test_decorators.py:{fn.__code__.co_firstlineno}'
