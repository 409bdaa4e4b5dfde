"""
The dismissal of the listed objects that need nothing (`processing.dismiss_listed`), against the general path.

The queueing does not even start a worker for a listed object if the dismissal says that it needs nothing:
so the dismissal must never say so when the general processing of the same listed event would do something
(make a request, call a handler, log a warning). Every combination of the handlers' kinds and the objects'
states below is given to both: the dismissal first (with no memory of the object, as at a restart), then the
general path (``process_event`` of the same listed event), whose requests, calls and logs are counted.

And the dismissal must be used where it is meant to be: for the objects handled before and unchanged since.
"""
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

import kopf
from kopf._cogs.structs.bodies import RawEvent
from kopf._cogs.structs.references import Resource
from kopf._core.intents.registries import OperatorRegistry
from kopf._core.reactor.contexts import OperatorScope
from kopf._core.reactor.processing import dismiss_listed

DIFFBASE = 'kopf.zalando.org/last-handled-configuration'
FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'
ESSENCE = {'spec': {'field': 'value', 'items': ['item1', 'item2']}}
HANDLED = json.dumps(ESSENCE, separators=(',', ':')) + '\n'
OBJECTS = 'kopf.objects'  # the level of the per-object loggers (e.g. set by kopf.configure() in other tests)
CHANGED = json.dumps({'spec': {'field': 'other'}}, separators=(',', ':')) + '\n'


def register(kinds: str, registry: OperatorRegistry, plural: str, calls: list[str]) -> None:
    """The handlers of the registry's variant (a few kinds, '+'-joined)."""
    def fn(**kwargs: Any) -> None:
        calls.append(str(kwargs.get('reason') or kwargs.get('type')))

    for kind in kinds.split('+'):
        if kind == 'create':
            kopf.on.create(plural, registry=registry, id='create_fn')(fn)
        elif kind == 'update':
            kopf.on.update(plural, registry=registry, id='update_fn')(fn)
        elif kind == 'delete':
            kopf.on.delete(plural, registry=registry, id='delete_fn')(fn)
        elif kind == 'optional-delete':
            kopf.on.delete(plural, registry=registry, id='delete_fn', optional=True)(fn)
        elif kind == 'resume':
            kopf.on.resume(plural, registry=registry, id='resume_fn')(fn)
        elif kind == 'labelled':
            kopf.on.create(plural, registry=registry, id='create_fn', labels={'x': 'y'})(fn)
        elif kind == 'when':
            kopf.on.delete(plural, registry=registry, id='delete_fn', when=lambda **_: True)(fn)
        elif kind == 'field':
            kopf.on.field(plural, registry=registry, id='field_fn', field='spec.field')(fn)
        elif kind == 'event':
            kopf.on.event(plural, registry=registry, id='event_fn')(fn)
        elif kind == 'timer':
            kopf.timer(plural, registry=registry, id='timer_fn', interval=100)(fn)
        else:
            raise ValueError(kind)


def scope_of(operator: Any, registry: OperatorRegistry) -> OperatorScope:
    """What the processing of the test's operator gets (as in the conftest's ``Operator.process``)."""
    return OperatorScope(registry=registry, settings=operator.settings, memories=operator.memories,
                         vault=operator.vault)


# The objects' states: the metadata at creation, and whether the object is being deleted.
STATES: dict[str, tuple[dict[str, Any], bool]] = {
    'handled': ({'annotations': {DIFFBASE: HANDLED}}, False),
    'handled-finalized': ({'annotations': {DIFFBASE: HANDLED}, 'finalizers': [FINALIZER]}, False),
    'handled-foreign-finalizer': ({'annotations': {DIFFBASE: HANDLED}, 'finalizers': ['other/x']}, False),
    'handled-labelled': ({'annotations': {DIFFBASE: HANDLED}, 'labels': {'x': 'y'}}, False),
    'changed': ({'annotations': {DIFFBASE: CHANGED}}, False),
    'changed-finalized': ({'annotations': {DIFFBASE: CHANGED}, 'finalizers': [FINALIZER]}, False),
    'new': ({}, False),
    'new-finalized': ({'finalizers': [FINALIZER]}, False),
    'garbage-diffbase': ({'annotations': {DIFFBASE: 'not json'}}, False),
    'listed-diffbase': ({'annotations': {DIFFBASE: '[1, 2]'}}, False),
    'record': ({'annotations': {DIFFBASE: HANDLED, 'kopf.zalando.org/create_fn': '{"retries": 1}'}}, False),
    'record-finalized': ({'annotations': {DIFFBASE: HANDLED, 'kopf.zalando.org/delete_fn': '{"retries": 1}'},
                          'finalizers': [FINALIZER]}, False),
    'touched': ({'annotations': {DIFFBASE: HANDLED, 'kopf.zalando.org/touch-dummy': 'x'}}, False),
    'deleting': ({'annotations': {DIFFBASE: HANDLED}, 'finalizers': [FINALIZER]}, True),
    'deleting-foreign': ({'annotations': {DIFFBASE: HANDLED}, 'finalizers': ['other/x']}, True),
}

REGISTRIES = ['create', 'update', 'create+delete', 'create+optional-delete', 'create+resume', 'labelled',
              'create+when', 'field', 'create+event', 'create+timer', 'resume']

# Where the dismissal is meant to be used (and only there): the objects handled before, unchanged since,
# with our finalizer as it must be, no handler resuming them, filtering them, or seeing every event.
DISMISSED = {
    *((kinds, state) for kinds in ['create', 'update', 'create+optional-delete']
      for state in ['handled', 'handled-foreign-finalizer']),
    ('create+delete', 'handled-finalized'),
    ('update', 'record'),  # the record is of another handler (create_fn), not of this resource's
}


@pytest.mark.parametrize('state', list(STATES))
@pytest.mark.parametrize('kinds', REGISTRIES)
async def test_dismissal_agrees_with_the_general_path(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]], caplog: pytest.LogCaptureFixture,
        kinds: str, state: str) -> None:
    caplog.set_level(logging.INFO, logger=OBJECTS)  # with the debug logs, nothing is dismissed: see below
    calls: list[str] = []
    register(kinds, registry, kex.plural, calls)
    metadata, deleting = STATES[state]
    await cluster.create(metadata=metadata)
    if deleting:
        await cluster.delete()
    body = cluster.get()
    assert body is not None
    emulator.requests.reset()

    raw_event: RawEvent = {'type': None, 'object': body}
    scope = scope_of(operator, registry)
    dismissed = dismiss_listed(raw_event=raw_event, resource=kex, scope=scope)
    assert len(operator.memories) == 0  # the dismissal remembers nothing
    assert requests() == 0

    await operator.process(type=None, body=body)
    did_something = bool(requests() or calls or messages())
    if dismissed:
        assert not did_something, (requests(), calls, messages())
    assert dismissed == ((kinds, state) in DISMISSED)


async def test_no_dismissal_of_remembered_objects(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=OBJECTS)
    register('create', registry, kex.plural, [])
    await cluster.create(metadata=STATES['handled'][0])
    body = cluster.get()
    raw_event: RawEvent = {'type': None, 'object': body}
    scope = scope_of(operator, registry)
    assert dismiss_listed(raw_event=raw_event, resource=kex, scope=scope)
    operator.memories.recall(body)  # e.g. a relisting after the watch-stream's 410 Gone
    assert not dismiss_listed(raw_event=raw_event, resource=kex, scope=scope)


async def test_no_dismissal_with_debug_logs(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    register('create', registry, kex.plural, [])
    await cluster.create(metadata=STATES['handled'][0])
    body = cluster.get()
    raw_event: RawEvent = {'type': None, 'object': body}
    scope = scope_of(operator, registry)
    assert not dismiss_listed(raw_event=raw_event, resource=kex, scope=scope)
    await operator.process(type=None, body=body)
    assert messages()  # what the dismissal would hide: "Resuming is in progress: ..." & co
