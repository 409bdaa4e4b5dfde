import logging
from typing import Any

import pytest

import kopf.on
from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.references import EVERYTHING, Resource, Selector
from kopf._core.intents import registries
from kopf._core.intents.causes import ResourceWebhookCause
from kopf._core.intents.handlers import (
    Activity,
    ActivityHandler,
    ChangingHandler,
    HandlerId,
    Reason,
    WebhookType,
)
from kopf._core.intents.registries import (
    ChangingRegistry,
    OperatorRegistry,
    generate_id,
    get_default_registry,
    set_default_registry,
)

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', singular='kopfexample',
               shortcuts=frozenset({'kex'}), namespaced=True)
POD = Resource('', 'v1', 'pods', kind='Pod', singular='pod', namespaced=True)
POD_METRICS = Resource('metrics.k8s.io', 'v1beta1', 'pods', kind='PodMetrics', namespaced=True)
CORE_EVENT = Resource('', 'v1', 'events', kind='Event', namespaced=True)


def fn1(**_: Any) -> None:
    pass


def fn2(**_: Any) -> None:
    pass


def test_appending_the_same_handler_again_changes_nothing(registry):
    handler = ActivityHandler(fn=fn1, id=HandlerId('fn1'), activity=Activity.STARTUP)
    registry.activities.append(handler)
    registry.activities.append(ActivityHandler(fn=fn1, id=HandlerId('fn1'), activity=Activity.STARTUP))
    assert registry.activities.get_all_handlers() == [handler]


def test_activity_handlers_by_activity_deduplicated(registry):
    kopf.on.startup(registry=registry)(fn1)
    kopf.on.startup(registry=registry, param=1)(fn1)  # same fn & id: deduplicated
    kopf.on.startup(registry=registry, id='other')(fn1)  # another id: kept
    kopf.on.cleanup(registry=registry)(fn2)
    assert [(h.id, h.param) for h in registry.activities.get_handlers(Activity.STARTUP)] == \
        [('fn1', None), ('other', None)]
    assert [h.id for h in registry.activities.get_handlers(Activity.CLEANUP)] == ['fn2']
    assert registry.activities.get_handlers(Activity.PROBE) == []


@pytest.mark.parametrize('spec, resource, expected', [
    (('kopfexamples',), KEX, True),
    (('kex',), KEX, True),
    (('KopfExample',), KEX, True),
    (('kopf.dev', 'v1', 'kopfexamples'), KEX, True),
    (('zalando.org', 'kopfexamples'), KEX, False),
    (('pods',), KEX, False),
    ((EVERYTHING,), KEX, True),
    ((EVERYTHING,), CORE_EVENT, False),  # the core events must be named explicitly
    (('v1', 'events'), CORE_EVENT, True),
])
def test_resource_handlers_by_resource(spec, resource, expected, registry):
    kopf.on.create(*spec, registry=registry)(fn1)
    assert registry.changing.has_handlers(resource) is expected
    assert bool(registry.changing.get_resource_handlers(resource)) is expected


def test_resource_lookups_are_cached_and_refreshed_on_registration(registry):
    kopf.on.create('kopfexamples', registry=registry)(fn1)
    first = registry.changing.get_resource_handlers(KEX)
    assert registry.changing.get_resource_handlers(KEX) is first  # cached: the same tuple
    kopf.on.create('kopfexamples', registry=registry)(fn2)
    assert [h.fn for h in registry.changing.get_resource_handlers(KEX)] == [fn1, fn2]


def test_reason_lookups_are_refreshed_on_registration(registry, changing_cause):
    kopf.on.create('kopfexamples', registry=registry)(fn1)
    cause = changing_cause(reason=Reason.CREATE, new={})
    assert [h.fn for h in registry.changing.get_handlers(cause)] == [fn1]
    kopf.on.create('kopfexamples', registry=registry)(fn2)
    assert [h.fn for h in registry.changing.get_handlers(cause)] == [fn1, fn2]


# Handlers as declared, to be selected per reason & initial flag.
DECLARATIONS = {
    'create': lambda r: kopf.on.create('kopfexamples', id='create', registry=r),
    'update': lambda r: kopf.on.update('kopfexamples', id='update', registry=r),
    'delete': lambda r: kopf.on.delete('kopfexamples', id='delete', registry=r),
    'optional': lambda r: kopf.on.delete('kopfexamples', id='optional', optional=True, registry=r),
    'resume': lambda r: kopf.on.resume('kopfexamples', id='resume', registry=r),
    'resume-deleted': lambda r: kopf.on.resume('kopfexamples', id='resume-deleted', deleted=True, registry=r),
}


@pytest.mark.parametrize('reason, initial, expected', [
    (Reason.CREATE, False, ['create']),
    (Reason.CREATE, True, ['create', 'resume', 'resume-deleted']),
    (Reason.UPDATE, False, ['update']),
    (Reason.UPDATE, True, ['update', 'resume', 'resume-deleted']),
    (Reason.DELETE, False, ['delete', 'optional']),
    (Reason.DELETE, True, ['delete', 'optional', 'resume-deleted']),
    (Reason.RESUME, True, ['resume', 'resume-deleted']),
    (Reason.RESUME, False, []),  # not really possible, but resuming is due only for the initial ones
    (Reason.NOOP, False, []),
    (Reason.NOOP, True, []),
    (Reason.FREE, True, []),
    (Reason.GONE, True, []),
])
def test_changing_handlers_by_reason(reason, initial, expected, registry, changing_cause):
    for declare in DECLARATIONS.values():
        declare(registry)(fn1)
    cause = changing_cause(reason=reason, initial=initial, old={'a': 1}, new={'a': 2})
    assert [h.id for h in registry.changing.get_handlers(cause)] == expected


@pytest.mark.parametrize('reason, old, new, expected', [
    (Reason.CREATE, None, {'spec': {'a': 1}}, True),  # created with the field
    (Reason.CREATE, None, {'spec': {}}, False),
    (Reason.UPDATE, {'spec': {}}, {'spec': {'a': 1}}, True),
    (Reason.UPDATE, {'spec': {'a': 1}}, {'spec': {'a': 1}, 'x': 1}, False),
    (Reason.RESUME, {'spec': {'a': 1}}, {'spec': {'a': 1}}, False),  # no changes
    (Reason.NOOP, {'spec': {'a': 1}}, {'spec': {'a': 2}}, False),
])
def test_field_handlers_serve_any_reason_if_the_field_changes(reason, old, new, expected, registry,
                                                              changing_cause):
    kopf.on.field('kopfexamples', field='spec.a', registry=registry)(fn1)
    cause = changing_cause(reason=reason, old=old, new=new, initial=(reason == Reason.RESUME))
    assert bool(registry.changing.get_handlers(cause)) is expected


def test_same_function_and_id_runs_once_per_occasion(registry, changing_cause):
    @kopf.on.resume('kopfexamples', registry=registry)
    @kopf.on.create('kopfexamples', registry=registry)
    def both(**_: Any) -> None:
        pass

    cause = changing_cause(reason=Reason.CREATE, initial=True, new={})
    [handler] = registry.changing.get_handlers(cause)
    assert handler.reason == Reason.CREATE  # the first declared one wins


def test_same_function_with_different_fields_runs_per_field(registry, changing_cause):
    @kopf.on.update('kopfexamples', field='spec.field', param=10, registry=registry)
    @kopf.on.update('kopfexamples', field='spec', param=1, registry=registry)
    def fields(**_: Any) -> None:
        pass

    cause = changing_cause(reason=Reason.UPDATE, old={'spec': {'field': 1}}, new={'spec': {'field': 2}})
    assert [(h.id, h.param) for h in registry.changing.get_handlers(cause)] == \
        [('fields/spec', 1), ('fields/spec.field', 10)]


def test_same_function_for_overlapping_resources_runs_once(registry, changing_cause):
    kopf.on.create('kopfexamples', registry=registry)(fn1)
    kopf.on.create('kopf.dev', 'v1', 'kopfexamples', registry=registry)(fn1)
    kopf.on.create(EVERYTHING, registry=registry)(fn1)
    assert len(registry.changing.get_handlers(changing_cause(reason=Reason.CREATE, new={}))) == 1


def test_different_functions_with_the_same_id_are_not_deduplicated(registry, changing_cause):
    kopf.on.create('kopfexamples', id='same', registry=registry)(fn1)
    kopf.on.create('kopfexamples', id='same', registry=registry)(fn2)
    assert len(registry.changing.get_handlers(changing_cause(reason=Reason.CREATE, new={}))) == 2


def test_deduplication_of_bound_methods_and_unhashable_callables():
    class Owner:
        def method(self, **_: Any) -> None:
            pass

    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

        def __call__(self, **_: Any) -> None:
            pass

    owner = Owner()
    unhashable = Unhashable()
    handlers = [
        ChangingHandler(fn=owner.method, id=HandlerId('m')),
        ChangingHandler(fn=owner.method, id=HandlerId('m')),  # a new bound method object, but equal
        ChangingHandler(fn=unhashable, id=HandlerId('u')),
        ChangingHandler(fn=unhashable, id=HandlerId('u')),
        ChangingHandler(fn=Unhashable(), id=HandlerId('u')),
    ]
    assert registries.deduplicated(handlers) == [handlers[0], handlers[2], handlers[4]]


def test_filters_are_applied_to_the_candidates(registry, changing_cause, make_body):
    kopf.on.create('kopfexamples', labels={'x': 'y'}, registry=registry)(fn1)
    kopf.on.create('kopfexamples', labels={'x': 'z'}, registry=registry)(fn2)
    cause = changing_cause(reason=Reason.CREATE, raw=make_body(labels={'x': 'z'}), new={})
    assert [h.fn for h in registry.changing.get_handlers(cause)] == [fn2]


@pytest.mark.parametrize('declare, labels, expected', [
    (lambda r: kopf.on.delete('kopfexamples', registry=r), {}, True),
    (lambda r: kopf.on.delete('kopfexamples', optional=True, registry=r), {}, False),
    (lambda r: kopf.on.delete('kopfexamples', labels={'x': 'y'}, registry=r), {'x': 'y'}, True),
    (lambda r: kopf.on.delete('kopfexamples', labels={'x': 'y'}, registry=r), {}, False),
    (lambda r: kopf.on.delete('pods', registry=r), {}, False),
    (lambda r: kopf.on.create('kopfexamples', registry=r), {}, False),
    (lambda r: kopf.on.update('kopfexamples', registry=r), {}, False),
    (lambda r: kopf.on.event('kopfexamples', registry=r), {}, False),
    (lambda r: kopf.on.index('kopfexamples', registry=r), {}, False),
    (lambda r: kopf.on.validate('kopfexamples', registry=r), {}, False),
    (lambda r: kopf.on.daemon('kopfexamples', registry=r), {}, True),
    (lambda r: kopf.on.timer('kopfexamples', interval=1, registry=r), {}, True),
    (lambda r: kopf.on.timer('kopfexamples', interval=1, labels={'x': 'y'}, registry=r), {}, False),
    (lambda r: kopf.on.daemon('kopfexamples', when=lambda **_: False, registry=r), {}, False),
])
def test_finalizer_requirements(declare, labels, expected, registry,
                                changing_cause, spawning_cause, make_body):
    declare(registry)(fn1)
    raw = make_body(labels=labels)
    cause = changing_cause(reason=Reason.NOOP, raw=raw, old={}, new={})
    assert registry.requires_finalizer(cause) is expected
    assert registry.requires_finalizer(spawning_cause(raw)) is expected


def test_unfiltered_lookups_are_refreshed_on_registration(registry, changing_cause, make_body):
    # Without filters, the answers are known per resource and remembered; a filter added later counts.
    labelled = make_body(labels={'x': 'y'})
    unlabelled = make_body()
    kopf.on.create('kopfexamples', registry=registry)(fn1)
    creation = changing_cause(reason=Reason.CREATE, raw=unlabelled, new={})
    assert registry.changing.prematch(creation)
    assert not registry.requires_finalizer(creation)
    assert [h.fn for h in registry.changing.get_handlers(creation)] == [fn1]

    kopf.on.create('kopfexamples', labels={'x': 'y'}, registry=registry)(fn2)
    kopf.on.delete('kopfexamples', labels={'x': 'y'}, registry=registry)(fn2)
    assert not registry.requires_finalizer(changing_cause(reason=Reason.NOOP, raw=unlabelled, old={}, new={}))
    assert registry.requires_finalizer(changing_cause(reason=Reason.NOOP, raw=labelled, old={}, new={}))
    assert [h.fn for h in registry.changing.get_handlers(creation)] == [fn1]
    labelled_creation = changing_cause(reason=Reason.CREATE, raw=labelled, new={})
    assert [h.fn for h in registry.changing.get_handlers(labelled_creation)] == [fn1, fn2]
    assert registry.changing.prematch(creation)  # fn1 has no filters: every object is in scope

    kopf.on.delete('kopfexamples', registry=registry)(fn1)
    assert registry.requires_finalizer(changing_cause(reason=Reason.NOOP, raw=unlabelled, old={}, new={}))


def test_unfiltered_lookups_of_field_and_old_new_handlers(registry, changing_cause):
    # The field & old/new criteria are filters of the changes: such handlers are checked per cause.
    kopf.on.update('kopfexamples', registry=registry)(fn1)
    kopf.on.update('kopfexamples', old='a', registry=registry)(fn2)
    cause = changing_cause(reason=Reason.UPDATE, old={'spec': 1}, new={'spec': 2})
    assert [h.fn for h in registry.changing.get_handlers(cause)] == [fn1]
    assert registry.changing.prematch(cause)


def test_handler_kinds_are_refreshed_on_registration(registry):
    assert registry.get_handler_kinds(KEX) == (False, False, False)
    kopf.on.create('kopfexamples', registry=registry)(fn1)
    assert registry.get_handler_kinds(KEX) == (False, False, True)
    kopf.on.event('kopfexamples', registry=registry)(fn1)
    kopf.on.timer('kopfexamples', interval=1, registry=registry)(fn1)
    assert registry.get_handler_kinds(KEX) == (True, True, True)
    assert registry.get_handler_kinds(POD) == (False, False, False)
    kinds = registry.get_handler_kinds(KEX)
    assert (kinds.watching, kinds.spawning, kinds.changing) == (True, True, True)


def test_extra_fields_of_the_change_detecting_handlers(registry):
    kopf.on.update('kopfexamples', field='status.phase', registry=registry)(fn1)
    kopf.on.field('kopfexamples', field='status.ready', registry=registry)(fn1)
    kopf.on.create('kopfexamples', field='status.other', registry=registry)(fn1)  # checks the body, not diffs
    kopf.on.update('pods', field='status.pod', registry=registry)(fn1)
    assert registry.changing.get_extra_fields(KEX) == {('status', 'phase'), ('status', 'ready')}


def test_prematch_for_the_stealth_mode(registry, changing_cause, make_body):
    kopf.on.create('kopfexamples', labels={'x': 'y'}, registry=registry)(fn1)
    in_scope = changing_cause(reason=Reason.NOOP, raw=make_body(labels={'x': 'y'}), old={}, new={})
    out_of_scope = changing_cause(reason=Reason.NOOP, raw=make_body(labels={'x': 'z'}), old={}, new={})
    assert registry.changing.prematch(in_scope)
    assert not registry.changing.prematch(out_of_scope)


def test_watched_selectors_and_resources(registry):
    kopf.on.event('kex', registry=registry)(fn1)
    kopf.on.create('kopfexamples', registry=registry)(fn1)
    kopf.on.daemon('pods', registry=registry)(fn1)
    kopf.on.index('kopf.dev', 'kopfexamples', registry=registry)(fn1)
    kopf.on.validate('v1', 'events', registry=registry)(fn1)  # webhooks need no watching
    assert registry.get_selectors() == {
        Selector('kex'), Selector('kopfexamples'), Selector('pods'), Selector('kopf.dev', 'kopfexamples'),
    }
    # The ambiguous "pods" resolve to the core ones, as in kubectl.
    assert registry.select_resources([KEX, POD, POD_METRICS, CORE_EVENT]) == {KEX, POD}
    assert registry.has_handlers(KEX)
    assert registry.has_handlers(POD)
    assert not registry.has_handlers(CORE_EVENT)
    assert registry.webhooks.has_handlers(CORE_EVENT)
    assert registry.webhooks.select_resources([KEX, CORE_EVENT]) == {CORE_EVENT}


def webhook_cause(**kwargs: Any) -> ResourceWebhookCause:
    return ResourceWebhookCause(resource=KEX, body=Body({}), logger=logging.getLogger('test'), **kwargs)


@pytest.mark.parametrize('kwargs, expected', [
    ({'operation': 'CREATE'}, ['all', 'create', 'any-subresource']),
    ({'operation': 'UPDATE'}, ['all', 'any-subresource']),
    ({'operation': 'UPDATE', 'subresource': 'status'}, ['status', 'any-subresource']),
    ({'operation': 'UPDATE', 'subresource': 'scale'}, ['any-subresource']),
    ({'operation': 'CREATE', 'webhook': HandlerId('create')}, ['create']),
    ({'operation': 'UPDATE', 'webhook': HandlerId('create')}, []),
    ({'operation': 'CREATE', 'reason': WebhookType.MUTATING}, ['mutating']),
])
def test_webhook_handlers_selection(kwargs, expected, registry):
    kopf.on.validate('kopfexamples', id='all', registry=registry)(fn1)
    kopf.on.validate('kopfexamples', id='create', operation='CREATE', registry=registry)(fn1)
    kopf.on.validate('kopfexamples', id='status', subresource='status', registry=registry)(fn1)
    kopf.on.validate('kopfexamples', id='any-subresource', subresource='*', registry=registry)(fn1)
    kopf.on.mutate('kopfexamples', id='mutating', registry=registry)(fn1)
    kopf.on.validate('pods', id='other-resource', registry=registry)(fn1)
    cause = webhook_cause(**{'reason': WebhookType.VALIDATING, **kwargs})
    assert [h.id for h in registry.webhooks.get_handlers(cause)] == expected


def test_subregistry_handlers_serve_any_resource_and_reason(changing_cause):
    subregistry = ChangingRegistry()
    subregistry.append(ChangingHandler(fn=fn1, id=HandlerId('parent/sub')))
    for reason in [Reason.CREATE, Reason.UPDATE, Reason.DELETE, Reason.RESUME]:
        cause = changing_cause(reason=reason, resource=POD, old={}, new={})
        assert [h.id for h in subregistry.get_handlers(cause)] == ['parent/sub']


@pytest.mark.parametrize('id, prefix, suffix, expected', [
    (None, None, None, 'fn1'),
    ('x', None, None, 'x'),
    (None, 'parent', None, 'parent/fn1'),
    (None, None, 'spec.a', 'fn1/spec.a'),
    ('x', 'parent', 'spec.a', 'parent/x/spec.a'),
    ('x', 'grand/parent', None, 'grand/parent/x'),
])
def test_generate_id(id, prefix, suffix, expected):
    assert generate_id(fn1, id=id, prefix=prefix, suffix=suffix) == expected


def test_default_registry_is_created_once_and_can_be_replaced():
    previous = get_default_registry()
    try:
        assert isinstance(previous, OperatorRegistry)
        assert get_default_registry() is previous
        replacement = OperatorRegistry()
        set_default_registry(replacement)
        assert get_default_registry() is replacement
    finally:
        set_default_registry(previous)


def test_repr(registry):
    kopf.on.create('kopfexamples', registry=registry)(fn1)
    assert repr(registry) == '<OperatorRegistry: activities=0, watching=0, changing=1, spawning=0, ' \
                             'indexing=0, webhooks=0>'
    assert repr(registry.changing) == "<ChangingRegistry: ['fn1']>"
