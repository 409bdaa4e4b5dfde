"""
The happy paths through the whole operator: creation, update, deletion, resuming, field & event handlers.
"""
from collections.abc import Callable
from typing import Any

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]  # the conftest's factory of running operators (async context managers)
Eventually = Callable[..., Any]
Quiet = Callable[..., Any]

FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'


async def test_creation_stores_the_result_and_the_diffbase_and_leaves_no_progress(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    calls: list[dict[str, Any]] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return {'message': 'hello'}

    async with operator(registry, settings):
        await cluster.create('kex1', {'field': 'value', 'items': ['a', 'b']}, metadata={'labels': {'l': 'v'}})
        await eventually(lambda: bool((cluster.get() or {}).get('status')))
        await quiet()

    body = cluster.get()
    assert body['status'] == {'create_fn': {'message': 'hello'}}
    assert cluster.diffbase() == {'spec': {'field': 'value', 'items': ['a', 'b']},
                                  'metadata': {'labels': {'l': 'v'}}}
    assert cluster.progress_annotations() == {}
    assert 'finalizers' not in body['metadata']  # no deletion handlers, no finalizer
    assert len(calls) == 1
    kwargs = calls[0]
    assert kwargs['reason'] == 'create'
    assert kwargs['name'] == 'kex1' and kwargs['namespace'] == 'default'
    assert kwargs['spec'] == {'field': 'value', 'items': ['a', 'b']}
    assert kwargs['old'] is None
    assert kwargs['retry'] == 0
    assert list(kwargs['diff']) == [('add', (), None, kwargs['new'])]


async def test_update_gets_the_diff_old_and_new(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    created: list[Any] = []
    updated: list[dict[str, Any]] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(**_: Any) -> Any:
        created.append(1)
        return 'created'

    @kopf.on.update('kopfexamples', registry=registry)
    def update_fn(diff: Any, old: Any, new: Any, reason: Any, **_: Any) -> Any:
        updated.append({'diff': diff, 'old': old, 'new': new, 'reason': reason})
        return 'updated'

    async with operator(registry, settings):
        await cluster.create('kex1', {'field': 'value', 'items': ['item1', 'item2']},
                             metadata={'labels': {'somelabel': 'somevalue'}})
        await eventually(lambda: bool((cluster.get() or {}).get('status', {}).get('create_fn')))
        await quiet()
        assert updated == []

        await cluster.patch('kex1', {'metadata': {'labels': {'newlabel': 'newvalue'}},
                                     'spec': {'field': 'changed', 'items': None}})
        await eventually(lambda: bool((cluster.get() or {}).get('status', {}).get('update_fn')))
        await quiet()

        # A change of the status only is not essential: no handlers, no patches.
        patches = cluster.count('patch', 'kex1')
        await cluster.patch('kex1', {'status': {'external': 'value'}}, subresource='status')
        await quiet()
        assert cluster.count('patch', 'kex1') == patches + 1  # only ours

    assert created == [1]
    assert len(updated) == 1
    assert updated[0]['reason'] == 'update'
    assert sorted(map(tuple, updated[0]['diff']), key=repr) == sorted([
        ('remove', ('spec', 'items'), ['item1', 'item2'], None),
        ('change', ('spec', 'field'), 'value', 'changed'),
        ('add', ('metadata', 'labels', 'newlabel'), None, 'newvalue'),
    ], key=repr)
    assert updated[0]['old'] == {'spec': {'field': 'value', 'items': ['item1', 'item2']},
                                 'metadata': {'labels': {'somelabel': 'somevalue'}}}
    assert updated[0]['new'] == {'spec': {'field': 'changed'},
                                 'metadata': {'labels': {'somelabel': 'somevalue', 'newlabel': 'newvalue'}}}
    assert cluster.get()['status'] == {'create_fn': 'created', 'update_fn': 'updated', 'external': 'value'}
    assert cluster.diffbase() == updated[0]['new']
    assert cluster.progress_annotations() == {}


async def test_deletion_runs_the_handler_and_releases_the_object(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    deleted: list[dict[str, Any]] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(**_: Any) -> Any:
        return 'created'

    @kopf.on.delete('kopfexamples', registry=registry)
    def delete_fn(reason: Any, body: Any, **_: Any) -> None:
        deleted.append({'reason': reason, 'deleting': body.metadata.get('deletionTimestamp') is not None})

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: bool((cluster.get() or {}).get('status', {}).get('create_fn')))
        await quiet()
        assert cluster.get()['metadata']['finalizers'] == [FINALIZER]
        assert deleted == []

        await cluster.delete('kex1')
        await eventually(lambda: cluster.get() is None)
        await quiet()

    assert deleted == [{'reason': 'delete', 'deleting': True}]


async def test_deletion_keeps_the_foreign_finalizers(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    deleted: list[str] = []

    @kopf.on.delete('kopfexamples', registry=registry)
    def delete_fn(name: str, **_: Any) -> None:
        deleted.append(name)

    async with operator(registry, settings):
        await cluster.create('kex1', metadata={'finalizers': ['example.com/foreign']})
        await eventually(lambda: FINALIZER in cluster.get()['metadata'].get('finalizers', []))
        await quiet()
        assert cluster.get()['metadata']['finalizers'] == ['example.com/foreign', FINALIZER]

        await cluster.delete('kex1')
        await eventually(lambda: cluster.get()['metadata'].get('finalizers') == ['example.com/foreign'])
        await quiet()
        assert deleted == ['kex1']

        await cluster.patch('kex1', {'metadata': {'finalizers': None}})  # the foreigner releases it
        await eventually(lambda: cluster.get() is None)
        await quiet()

    assert deleted == ['kex1']


async def test_resuming_on_a_restart_runs_once_per_operator_lifetime(
        make_registry: Callable[[], kopf.OperatorRegistry],
        settings_factory: Callable[[], kopf.OperatorSettings],
        cluster: Cluster, operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    calls: list[tuple[str, str]] = []

    def make_handlers() -> kopf.OperatorRegistry:
        registry = make_registry()

        @kopf.on.resume('kopfexamples', registry=registry)
        def resume_fn(name: str, **_: Any) -> None:
            calls.append(('resume', name))

        @kopf.on.create('kopfexamples', registry=registry)
        def create_fn(name: str, **_: Any) -> None:
            calls.append(('create', name))

        @kopf.on.update('kopfexamples', registry=registry)
        def update_fn(name: str, **_: Any) -> None:
            calls.append(('update', name))

        return registry

    # The first operator creates the object; it has seen it as new, so it does not resume it.
    async with operator(make_handlers(), settings_factory()):
        await cluster.create('kex1')
        await eventually(lambda: ('create', 'kex1') in calls)
        await quiet()
    assert calls == [('create', 'kex1')]

    # The second operator finds the object existing & handled: it is resumed, not created again.
    calls.clear()
    async with operator(make_handlers(), settings_factory()):
        await eventually(lambda: ('resume', 'kex1') in calls)
        await quiet()
        assert calls == [('resume', 'kex1')]

        # Later changes are updates; the resuming does not repeat in the lifetime of this operator.
        await cluster.patch('kex1', {'spec': {'field': 'changed'}})
        await eventually(lambda: ('update', 'kex1') in calls)
        await cluster.create('kex2')
        await eventually(lambda: ('create', 'kex2') in calls)
        await quiet()

        # Neither non-essential changes, nor a re-listing (after the history is lost) resume it again.
        await cluster.patch('kex1', {'status': {'external': 'value'}}, subresource='status')
        lists = cluster.count('list')
        cluster.emulator.forget_history()
        # If the operator has already seen the latest event, it resumes from the latest version, which
        # needs no history (as with a real API server): the 410 Gone, and so the re-listing, is then
        # ensured explicitly. (Without it, the test depended on the race of the event and the drop.)
        cluster.emulator.fail_requests(1, status=410, verb='watch', path='/kopfexamples')
        cluster.emulator.drop_watches()
        await eventually(lambda: cluster.count('list') > lists)
        await quiet()

    assert sorted(calls) == [('create', 'kex2'), ('resume', 'kex1'), ('update', 'kex1')]


async def test_field_handlers_on_creation_and_on_changes_of_their_field_only(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    calls: list[tuple[Any, Any, tuple[Any, ...]]] = []

    @kopf.on.field('kopfexamples', field='spec.field', registry=registry)
    def field_fn(old: Any, new: Any, diff: Any, **_: Any) -> Any:
        calls.append((old, new, tuple(diff)))
        return {'new': new}

    async with operator(registry, settings):
        await cluster.create('kex1', {'field': 'value', 'other': 1})
        await eventually(lambda: bool((cluster.get() or {}).get('status')))
        await quiet()
        assert calls == [(None, 'value', (('add', (), None, 'value'),))]

        await cluster.patch('kex1', {'spec': {'other': 2}})  # not our field: the diff-base changes, no calls
        await eventually(lambda: cluster.diffbase()['spec']['other'] == 2)
        await quiet()
        assert len(calls) == 1

        await cluster.patch('kex1', {'spec': {'field': 'changed'}})
        await eventually(lambda: len(calls) == 2)
        await quiet()

    assert calls[1] == ('value', 'changed', (('change', (), 'value', 'changed'),))
    assert cluster.get()['status'] == {'field_fn/spec.field': {'new': 'changed'}}
    assert cluster.progress_annotations() == {}


async def test_event_handlers_see_every_event_including_the_initial_listing(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    seen: list[tuple[Any, str, Any]] = []

    @kopf.on.event('kopfexamples', registry=registry)
    def event_fn(event: Any, type: Any, name: str, spec: Any, **_: Any) -> None:
        assert event['type'] == type
        seen.append((type, name, spec.get('field')))

    await cluster.create('existing', {'field': 'old'})
    async with operator(registry, settings):
        await eventually(lambda: len(seen) >= 1)
        await cluster.create('kex1', {'field': 'a'})
        await eventually(lambda: ('ADDED', 'kex1', 'a') in seen)
        await cluster.patch('kex1', {'spec': {'field': 'b'}})
        await eventually(lambda: ('MODIFIED', 'kex1', 'b') in seen)
        await cluster.delete('kex1')
        await eventually(lambda: ('DELETED', 'kex1', 'b') in seen)
        await quiet()

    assert seen == [(None, 'existing', 'old'), ('ADDED', 'kex1', 'a'),
                    ('MODIFIED', 'kex1', 'b'), ('DELETED', 'kex1', 'b')]
    assert cluster.count('patch') == 1  # only ours: nothing is stored for the event handlers, no finalizer
