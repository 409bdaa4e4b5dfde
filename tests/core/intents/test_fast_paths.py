"""
The registries' fast paths, pinned to the general ones: for random handlers and objects, the same answers.

The registries remember what depends only on the resource (and the reason), and skip the filters when no
handler has any; here, random handlers are declared one by one (so that the remembered answers must be
dropped in between), and after each declaration, the answers for random objects are compared with
the general path: the filters of every handler checked for the object, and a registry with nothing
remembered yet (the same handlers put into a new one).
"""
import logging
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kopf
from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.references import Resource
from kopf._core.intents import filters, registries
from kopf._core.intents.causes import ResourceChangingCause, detect_changing_cause
from kopf._core.intents.handlers import Reason
from kopf._core.intents.registries import HandlerKinds, OperatorRegistry

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LOGGER = logging.getLogger('tests.intents.fast_paths')
FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'
KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', namespaced=True)
POD = Resource('', 'v1', 'pods', kind='Pod', namespaced=True)


def fn1(**_: Any) -> None:
    pass


def fn2(**_: Any) -> None:
    pass


def spec_x_is_1(spec: Any, **_: Any) -> bool:
    return bool(spec.get('x') == 1)


PLURALS = st.sampled_from(['kopfexamples', 'pods'])
FNS = st.sampled_from([fn1, fn2])  # few: the same functions are declared again (deduplicated by id & fn)
META_FILTERS = st.none() | st.sampled_from([{'a': 'b'}, {'a': kopf.PRESENT}, {'a': kopf.ABSENT}])
OBJECT_FILTERS = st.fixed_dictionaries({}, optional={
    'labels': META_FILTERS, 'annotations': META_FILTERS, 'when': st.none() | st.just(spec_x_is_1),
})
CHANGE_FILTERS = st.fixed_dictionaries({}, optional={
    'field': st.sampled_from(['spec.x', 'status.y']),
    'old': st.sampled_from([0, 1, {'spec': {'x': 0}}]), 'new': st.sampled_from([0, 1]),
})
KINDS = ['create', 'update', 'update', 'delete', 'resume', 'field', 'event', 'timer', 'daemon']


@st.composite
def declarations(draw: st.DrawFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """A decorator of ``kopf.on``, its positional and keyword arguments (except the registry)."""
    kind = draw(st.sampled_from(KINDS))
    kwargs: dict[str, Any] = draw(OBJECT_FILTERS)
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    if kind == 'update':  # old= & new= without field= are of the whole body
        kwargs.update({key: value for key, value in draw(CHANGE_FILTERS).items() if value is not None})
    if kind == 'field':
        kwargs['field'] = draw(st.sampled_from(['spec.x', 'status.y']))
    if kind == 'delete':
        kwargs['optional'] = draw(st.booleans())
    if kind == 'timer':
        kwargs['interval'] = 1
    return kind, (draw(PLURALS),), kwargs


BODIES = st.builds(
    lambda labels, spec: {'apiVersion': 'v1', 'kind': 'Pod',
                          'metadata': {'name': 'n', 'namespace': 'ns', 'uid': 'u', **labels}, 'spec': spec},
    st.sampled_from([{}, {'labels': {'a': 'b'}}, {'labels': {'a': 'c'}}, {'annotations': {'a': 'b'}}]),
    st.sampled_from([{}, {'x': 1}, {'x': 0}]),
)


def make_cause(
        resource: Resource, raw: dict[str, Any], reason: Reason, initial: bool,
) -> ResourceChangingCause:
    old = {'spec': {'x': 0}} if reason == Reason.UPDATE else None
    cause = detect_changing_cause(event_type='MODIFIED', resource=resource, body=Body(raw), old=old,
                                  new={'spec': raw['spec']}, finalizer=FINALIZER, initial=initial,
                                  logger=LOGGER)
    cause.reason = reason
    return cause


REASONS = [Reason.CREATE, Reason.UPDATE, Reason.UPDATE, Reason.DELETE, Reason.RESUME]


def cold_copy(registry: OperatorRegistry) -> OperatorRegistry:
    """The same handlers in a new registry: nothing remembered yet."""
    fresh = OperatorRegistry()
    for name in ['watching', 'changing', 'spawning']:
        for handler in getattr(registry, name).get_all_handlers():
            getattr(fresh, name).append(handler)
    return fresh


@SETTINGS
@given(st.lists(declarations(), min_size=1, max_size=6),
       st.lists(st.tuples(BODIES, st.sampled_from(REASONS), st.booleans()), min_size=1, max_size=3))
def test_remembered_and_unfiltered_answers_are_the_general_ones(
        declared: list[tuple[str, tuple[Any, ...], dict[str, Any]]],
        objects: list[tuple[dict[str, Any], Reason, bool]],
) -> None:
    registry = OperatorRegistry()
    for kind, args, kwargs in declared:
        getattr(kopf.on, kind)(*args, registry=registry, **kwargs)(fn1 if len(kwargs) % 2 else fn2)
        cold = cold_copy(registry)
        for resource in [KEX, POD]:
            general_kinds = HandlerKinds(*(any(
                handler.selector is None or handler.selector.check(resource)
                for handler in getattr(registry, name).get_all_handlers()
            ) for name in ['watching', 'spawning', 'changing']))
            assert registry.get_handler_kinds(resource) == general_kinds
            for raw, reason, initial in objects:
                cause = make_cause(resource, raw, reason, initial)
                changing = registry.changing
                handlers = changing.get_resource_handlers(resource)
                general = registries.ResourceRegistry.get_handlers(changing, cause)  # all filters checked
                assert changing.get_handlers(cause) == general == cold.changing.get_handlers(cause)
                assert changing.prematch(cause) == any(filters.prematch(h, cause) for h in handlers)
                assert changing.requires_finalizer(cause) == any(
                    h.requires_finalizer and filters.prematch(h, cause) for h in handlers)
                assert changing.requires_finalizer(cause) == cold.changing.requires_finalizer(cause)
                for handler in handlers:  # the filter-less handlers are known to match without checks
                    if filters.prematches_all(handler):
                        assert filters.prematch(handler, cause)
                    if filters.matches_all(handler):
                        assert filters.match(handler, cause)
