"""
A change of the object in the middle of a handling cycle of several steps (issue #16, nolar/kopf#641).

The default lifecycle runs one handler per step, with a patch of the progress after each step.
If the object's essence changes between the steps, the handlers done before the change are started
anew in the same cycle, so that every handler's last call has the essence stored as the diff-base
at the cycle's end. The tests feed the events one by one and change the object between them:
the order of the events is exactly as the watch-stream would deliver them, with no timing involved.
"""
import json
from collections.abc import Callable
from typing import Any

import kopf
from kopf._cogs.structs.references import Resource
from kopf._core.intents.registries import OperatorRegistry

DIFFBASE = 'kopf.zalando.org/last-handled-configuration'
RERUN = "Handler {!r} is re-run: the object has changed since it ran."


def diffbase(cluster: Any) -> Any:
    return json.loads(cluster.get()['metadata']['annotations'][DIFFBASE])


def record_fields(decorator: Callable[..., Any], *ids: str, plural: str, registry: OperatorRegistry,
                  calls: list[tuple[str, Any]]) -> None:
    """Register a handler per id (the same as its function's name would be) that records its spec.field."""
    for handler_id in ids:
        def fn(spec: Any, __id: str = handler_id, **_: Any) -> None:
            calls.append((__id, spec['field']))
        decorator(plural, registry=registry, id=handler_id)(fn)


def progress_keys(cluster: Any) -> list[str]:
    annotations = cluster.get()['metadata'].get('annotations', {})
    return [key for key in annotations if key.startswith('kopf.zalando.org/') and key != DIFFBASE]


async def test_creation_handler_is_rerun_after_a_change_in_the_middle(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[tuple[Any, ...]] = []

    @kopf.on.create(kex.plural, registry=registry)
    def create_a(spec: Any, retry: int, **_: Any) -> Any:
        calls.append(('create_a', spec['field'], retry))
        return spec['field']

    @kopf.on.create(kex.plural, registry=registry)
    def create_b(spec: Any, **_: Any) -> Any:
        calls.append(('create_b', spec['field']))
        return spec['field']

    await cluster.create(spec={'field': 'v1'})
    await operator.process(type='ADDED')  # the first step: create_a only
    assert calls == [('create_a', 'v1', 0)]

    await cluster.patch('kex1', {'spec': {'field': 'v2'}, 'metadata': {'labels': {'x': 'y'}}})
    await operator.settle(first='MODIFIED')

    # Started anew (retry=0), not retried; create_b only once, with the change.
    assert calls == [('create_a', 'v1', 0), ('create_a', 'v2', 0), ('create_b', 'v2')]
    assert diffbase(cluster) == {'spec': {'field': 'v2'}, 'metadata': {'labels': {'x': 'y'}}}
    assert cluster.get()['status'] == {'create_a': 'v2', 'create_b': 'v2'}
    assert progress_keys(cluster) == []
    assert messages().count(RERUN.format('create_a')) == 1
    assert 'Creation is processed: 2 succeeded; 0 failed.' in messages()

    # The cycle's memory is forgotten as the cycle ends: nothing is kept between the cycles.
    memory = next(iter(operator.memories))
    assert memory.cycle_essences is None and memory.cycle_purpose is None


async def test_update_handler_is_rerun_with_the_diff_from_the_diffbase(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[tuple[str, Any, Any]] = []

    @kopf.on.update(kex.plural, registry=registry)
    def update_a(old: Any, new: Any, **_: Any) -> None:
        calls.append(('update_a', old['spec']['field'], new['spec']['field']))

    @kopf.on.update(kex.plural, registry=registry)
    def update_b(old: Any, new: Any, **_: Any) -> None:
        calls.append(('update_b', old['spec']['field'], new['spec']['field']))

    await cluster.create(spec={'field': 'v1'})
    await operator.settle(first='ADDED')
    await cluster.patch('kex1', {'spec': {'field': 'v2'}})
    await operator.process()  # the first step of the update: update_a only
    assert calls == [('update_a', 'v1', 'v2')]

    await cluster.patch('kex1', {'spec': {'field': 'v3'}})
    await operator.settle(first='MODIFIED')

    assert calls == [('update_a', 'v1', 'v2'), ('update_a', 'v1', 'v3'), ('update_b', 'v1', 'v3')]
    assert diffbase(cluster) == {'spec': {'field': 'v3'}}
    assert progress_keys(cluster) == []
    assert messages().count(RERUN.format('update_a')) == 1
    assert 'Updating is processed: 2 succeeded; 0 failed.' in messages()


async def test_field_handler_is_not_rerun_if_its_field_is_the_same(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[tuple[str, Any]] = []

    @kopf.on.field(kex.plural, field='spec.field', registry=registry)
    def field_fn(new: Any, **_: Any) -> None:
        calls.append(('field_fn', new))

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(spec: Any, **_: Any) -> None:
        calls.append(('create_fn', dict(spec)))

    await cluster.create(spec={'field': 'v1', 'other': 'o1'})
    await operator.process(type='ADDED')
    assert calls == [('field_fn', 'v1')]

    await cluster.patch('kex1', {'spec': {'other': 'o2'}})
    await operator.settle(first='MODIFIED')

    assert calls == [('field_fn', 'v1'), ('create_fn', {'field': 'v1', 'other': 'o2'})]
    assert diffbase(cluster) == {'spec': {'field': 'v1', 'other': 'o2'}}
    assert not any('is re-run' in message for message in messages())


async def test_field_handler_is_rerun_if_its_field_has_changed(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[tuple[Any, ...]] = []

    @kopf.on.field(kex.plural, field='spec.field', registry=registry)
    def field_fn(old: Any, new: Any, **_: Any) -> None:
        calls.append(('field_fn', old, new))

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(spec: Any, **_: Any) -> None:
        calls.append(('create_fn', spec['field']))

    await cluster.create(spec={'field': 'v1'})
    await operator.process(type='ADDED')
    await cluster.patch('kex1', {'spec': {'field': 'v2'}})
    await operator.settle(first='MODIFIED')

    assert calls == [('field_fn', None, 'v1'), ('field_fn', None, 'v2'), ('create_fn', 'v2')]
    assert diffbase(cluster) == {'spec': {'field': 'v2'}}
    assert messages().count(RERUN.format('field_fn/spec.field')) == 1


async def test_permanently_failed_handler_is_not_rerun(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[tuple[str, Any]] = []

    @kopf.on.create(kex.plural, registry=registry)
    def create_fail(spec: Any, **_: Any) -> None:
        calls.append(('create_fail', spec['field']))
        raise kopf.PermanentError('no way')

    @kopf.on.create(kex.plural, registry=registry)
    def create_ok(spec: Any, **_: Any) -> None:
        calls.append(('create_ok', spec['field']))

    await cluster.create(spec={'field': 'v1'})
    await operator.process(type='ADDED')
    await cluster.patch('kex1', {'spec': {'field': 'v2'}})
    await operator.settle(first='MODIFIED')

    assert calls == [('create_fail', 'v1'), ('create_ok', 'v2')]
    assert diffbase(cluster) == {'spec': {'field': 'v2'}}
    assert not any('is re-run' in message for message in messages())
    assert 'Creation is processed: 1 succeeded; 1 failed.' in messages()


async def test_nonessential_changes_cause_no_reruns(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[str] = []

    @kopf.on.create(kex.plural, registry=registry)
    def create_a(**_: Any) -> None:
        calls.append('create_a')

    @kopf.on.create(kex.plural, registry=registry)
    def create_b(**_: Any) -> None:
        calls.append('create_b')

    await cluster.create(spec={'field': 'v1'})
    await operator.process(type='ADDED')
    await cluster.patch('kex1', {'status': {'external': 'value'}}, subresource='status')
    await operator.settle(first='MODIFIED')

    assert calls == ['create_a', 'create_b']
    assert not any('is re-run' in message for message in messages())


async def test_restarted_operator_falls_back_to_no_reruns(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[tuple[str, Any]] = []

    record_fields(kopf.on.create, 'create_a', 'create_b', plural=kex.plural, registry=registry, calls=calls)

    await cluster.create(spec={'field': 'v1'})
    await operator.process(type='ADDED')
    operator.restart()  # what the handlers were called with is kept in memory only
    await cluster.patch('kex1', {'spec': {'field': 'v2'}})
    await operator.settle(first=None)

    assert calls == [('create_a', 'v1'), ('create_b', 'v2')]
    assert not any('is re-run' in message for message in messages())


async def test_retried_handler_and_rerun_handler_both_get_the_change(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource) -> None:
    calls: list[tuple[str, Any, int]] = []
    operator.lifecycle = kopf.lifecycles.all_at_once

    @kopf.on.create(kex.plural, registry=registry)
    def create_ok(spec: Any, retry: int, **_: Any) -> None:
        calls.append(('create_ok', spec['field'], retry))

    @kopf.on.create(kex.plural, registry=registry)
    def create_retried(spec: Any, retry: int, **_: Any) -> None:
        calls.append(('create_retried', spec['field'], retry))
        if retry < 1:
            raise kopf.TemporaryError('not yet', delay=0)

    await cluster.create(spec={'field': 'v1'})
    await operator.process(type='ADDED')
    await cluster.patch('kex1', {'spec': {'field': 'v2'}})
    await operator.settle(first='MODIFIED')

    assert calls == [('create_ok', 'v1', 0), ('create_retried', 'v1', 0),
                     ('create_ok', 'v2', 0), ('create_retried', 'v2', 1)]
    assert diffbase(cluster) == {'spec': {'field': 'v2'}}


async def test_rerun_parent_runs_its_subhandlers_anew(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[tuple[str, Any]] = []

    @kopf.on.create(kex.plural, registry=registry)
    def parent_fn(spec: Any, **_: Any) -> None:
        calls.append(('parent_fn', spec['field']))

        @kopf.subhandler()
        def child_fn(spec: Any, **_: Any) -> None:
            calls.append(('child_fn', spec['field']))

    @kopf.on.create(kex.plural, registry=registry)
    def create_b(spec: Any, **_: Any) -> None:
        calls.append(('create_b', spec['field']))

    await cluster.create(spec={'field': 'v1'})
    await operator.process(type='ADDED')
    assert calls == [('parent_fn', 'v1'), ('child_fn', 'v1')]

    await cluster.patch('kex1', {'spec': {'field': 'v2'}})
    await operator.settle(first='MODIFIED')

    # The parent waits for a step, until its sub-handlers' records are removed from the object.
    assert calls[2:] == [('create_b', 'v2'), ('parent_fn', 'v2'), ('child_fn', 'v2')]
    assert diffbase(cluster) == {'spec': {'field': 'v2'}}
    assert progress_keys(cluster) == []
    assert messages().count(RERUN.format('parent_fn')) == 1


async def test_changes_in_every_step_rerun_until_all_have_seen_the_last_one(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource) -> None:
    calls: list[tuple[str, Any]] = []

    record_fields(kopf.on.create, 'create_a', 'create_b', 'create_c', plural=kex.plural, registry=registry,
                  calls=calls)

    await cluster.create(spec={'field': 'v1'})
    await operator.process(type='ADDED')  # create_a with v1
    await cluster.patch('kex1', {'spec': {'field': 'v2'}})
    await operator.process()  # create_a anew with v2
    await operator.process()  # create_b with v2
    await cluster.patch('kex1', {'spec': {'field': 'v3'}})
    await operator.settle(first='MODIFIED')

    last_calls = dict(calls)  # the last call of every handler
    assert last_calls == {'create_a': 'v3', 'create_b': 'v3', 'create_c': 'v3'}
    assert len(calls) == len(set(calls))  # no handler is called twice with the same essence
    assert calls.count(('create_c', 'v3')) == 1
    assert diffbase(cluster) == {'spec': {'field': 'v3'}}


async def test_deletion_handlers_are_not_rerun(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[tuple[str, Any]] = []

    record_fields(kopf.on.delete, 'delete_a', 'delete_b', plural=kex.plural, registry=registry, calls=calls)

    await cluster.create(spec={'field': 'v1'})
    await operator.settle(first='ADDED')
    await cluster.delete('kex1')
    await operator.process()  # the first step of the deletion: delete_a only
    await cluster.patch('kex1', {'spec': {'field': 'v2'}})
    await operator.settle(first='MODIFIED')

    # The object is going away: the cleanups done are not repeated (as in Kopf).
    assert calls == [('delete_a', 'v1'), ('delete_b', 'v2')]
    assert cluster.get() is None
    assert not any('is re-run' in message for message in messages())


async def test_subhandlers_done_before_the_change_are_rerun_while_the_parent_is_unfinished(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[tuple[str, Any]] = []

    @kopf.on.create(kex.plural, registry=registry)
    def parent_fn(spec: Any, **_: Any) -> None:
        calls.append(('parent_fn', spec['field']))

        @kopf.subhandler()
        def child_a(spec: Any, **_: Any) -> None:
            calls.append(('child_a', spec['field']))

        @kopf.subhandler()
        def child_b(spec: Any, **_: Any) -> None:
            calls.append(('child_b', spec['field']))

    await cluster.create(spec={'field': 'v1'})
    await operator.process(type='ADDED')  # one sub-handler per call of the parent
    assert calls == [('parent_fn', 'v1'), ('child_a', 'v1')]

    await cluster.patch('kex1', {'spec': {'field': 'v2'}})
    await operator.settle(first='MODIFIED')

    children = [call for call in calls if call[0] != 'parent_fn']
    assert children == [('child_a', 'v1'), ('child_a', 'v2'), ('child_b', 'v2')]
    assert calls[-1] == ('child_b', 'v2')
    assert diffbase(cluster) == {'spec': {'field': 'v2'}}
    assert progress_keys(cluster) == []
    assert messages().count(RERUN.format('parent_fn/child_a')) == 1
    assert not any(RERUN.format('parent_fn') in message for message in messages())
