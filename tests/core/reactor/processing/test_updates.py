"""
Updates: the diffs against the last handled essence, field handlers, non-essential changes, retries.
"""
import asyncio
import json
from collections.abc import Callable
from typing import Any

import kopf
from kopf._cogs.structs.references import Resource
from kopf._core.intents.registries import OperatorRegistry

DIFFBASE = 'kopf.zalando.org/last-handled-configuration'


async def test_update_with_diff_old_new(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:
    seen: list[dict[str, Any]] = []

    @kopf.on.update(kex.plural, registry=registry)
    def update_fn(reason: str, diff: kopf.Diff, old: Any, new: Any, **_: Any) -> Any:
        seen.append({'reason': reason, 'diff': diff, 'old': old, 'new': new})
        return 'updated'

    await cluster.create(metadata={'labels': {'a': 'b'}})
    await operator.settle()
    await cluster.patch('kex1', {'metadata': {'labels': {'c': 'd'}},
                                 'spec': {'field': 'changed', 'items': None}})
    emulator.requests.reset()
    await operator.settle(first='MODIFIED')

    assert len(seen) == 1
    assert seen[0]['reason'] == 'update'
    assert sorted(map(repr, seen[0]['diff'])) == sorted(map(repr, [
        ('add', ('metadata', 'labels', 'c'), None, 'd'),
        ('remove', ('spec', 'items'), ['item1', 'item2'], None),
        ('change', ('spec', 'field'), 'value', 'changed'),
    ]))
    assert seen[0]['old'] == {'metadata': {'labels': {'a': 'b'}},
                              'spec': {'field': 'value', 'items': ['item1', 'item2']}}
    assert seen[0]['new'] == {'metadata': {'labels': {'a': 'b', 'c': 'd'}}, 'spec': {'field': 'changed'}}

    obj = cluster.get()
    assert json.loads(obj['metadata']['annotations'][DIFFBASE]) == seen[0]['new']
    assert obj['status'] == {'update_fn': 'updated'}
    assert requests('patch', subresource='') == 1
    assert requests('patch', subresource='status') == 1
    assert requests() == 2
    assert f"Updating diff: {seen[0]['diff']!r}" in messages()
    assert 'Updating is processed: 1 succeeded; 0 failed.' in messages()


async def test_field_handlers_on_creation_and_updates(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource) -> None:
    seen: list[tuple[Any, ...]] = []

    @kopf.on.field(kex.plural, field='spec.field', registry=registry)
    def field_fn(reason: str, old: Any, new: Any, diff: kopf.Diff, **_: Any) -> Any:
        seen.append((reason, old, new, diff))
        return {'new': new}

    await cluster.create()
    await operator.settle()
    assert seen == [('create', None, 'value', (('add', (), None, 'value'),))]

    await cluster.patch('kex1', {'spec': {'items': ['other']}})
    await operator.settle(first='MODIFIED')
    assert len(seen) == 1  # not for other fields

    await cluster.patch('kex1', {'spec': {'field': 'changed'}})
    await operator.settle(first='MODIFIED')
    assert seen[1:] == [('update', 'value', 'changed', (('change', (), 'value', 'changed'),))]
    assert cluster.get()['status'] == {'field_fn/spec.field': {'new': 'changed'}}


async def test_status_changes_are_not_essential(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:

    @kopf.on.update(kex.plural, registry=registry)
    def update_fn(**_: Any) -> None:
        raise AssertionError('Must not be called for the status changes.')

    await cluster.create()
    await operator.settle()
    await cluster.patch('kex1', {'status': {'external': 'value'}}, subresource='status')
    emulator.requests.reset()
    before = len(messages())
    await operator.settle(first='MODIFIED')

    assert requests() == 0
    assert messages()[before:] == [
        'Something has changed, but we are not interested (the essence is the same).',
        'Handling cycle is finished, waiting for new changes.',
    ]


async def test_update_without_update_handlers_stores_the_new_essence(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int]) -> None:

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> None:
        pass

    await cluster.create()
    await operator.settle()
    await cluster.patch('kex1', {'spec': {'field': 'changed'}})
    emulator.requests.reset()
    await operator.settle(first='MODIFIED')

    essence = json.loads(cluster.get()['metadata']['annotations'][DIFFBASE])
    assert essence['spec']['field'] == 'changed'
    assert requests() == 1


async def test_temporary_errors_are_retried_after_the_delay_with_a_touch(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:
    retries: list[int] = []

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(retry: int, **_: Any) -> Any:
        retries.append(retry)
        if retry < 1:
            raise kopf.TemporaryError('not yet', delay=0.1)
        return 'done'

    await cluster.create()
    emulator.requests.reset()

    # The failure: the progress is stored, no sleeping (the patch's echo comes anyway).
    await operator.process(type='ADDED')
    record = json.loads(cluster.get()['metadata']['annotations']['kopf.zalando.org/create_fn'])
    assert record['retries'] == 1 and record['message'] == 'not yet' and 'delayed' in record
    assert any(message.startswith('Sleeping was skipped because of the patch') for message in messages())

    # The echo: the handler is not due yet: sleep, then touch the object to get a new event.
    await operator.process()
    assert retries == [0]
    assert cluster.get()['metadata']['annotations']['kopf.zalando.org/touch-dummy']
    assert any(message.startswith('Sleeping for 0.') for message in messages())

    # The touch's echo: the handler is retried and succeeds; the touch marker is removed.
    await operator.settle(first='MODIFIED')
    obj = cluster.get()
    assert retries == [0, 1]
    assert obj['status'] == {'create_fn': 'done'}
    assert 'kopf.zalando.org/touch-dummy' not in obj['metadata']['annotations']
    assert 'kopf.zalando.org/create_fn' not in obj['metadata']['annotations']
    assert requests('patch', subresource='') == 3  # the progress, the touch, the diff-base & cleanup
    assert requests('patch', subresource='status') == 1


async def test_sleeping_is_interrupted_by_newer_events(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> None:
        raise kopf.TemporaryError('not yet', delay=60)

    await cluster.create()
    await operator.process(type='ADDED')
    emulator.requests.reset()

    pressure = asyncio.Event()
    asyncio.get_running_loop().call_soon(pressure.set)  # a newer event arrives while sleeping
    await operator.process(pressure=pressure)

    assert requests() == 0  # no touching
    assert any(message.startswith('Sleeping for 59.') for message in messages())
    assert any(message.startswith('Sleeping was interrupted by new changes, 59.') for message in messages())
