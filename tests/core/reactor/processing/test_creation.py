"""
Creation: the handlers, their results and progress, the diff-base, the finalizer, and the requests made.

The numbers of requests are compared with what Kopf 1.45.2 makes on the same emulator:
one creation handler with a result costs Kopf 1 PATCH without the status subresource, 2 with it,
and 3 with a deletion handler (the finalizer is added with a separate JSON-patch beforehand);
we put the finalizer into the same merge-patch as the rest, so the latter costs 2.
"""
import json
from collections.abc import Callable
from typing import Any

import kopf
from kopf._cogs.structs.references import Resource
from kopf._core.intents.registries import OperatorRegistry

FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'
DIFFBASE = 'kopf.zalando.org/last-handled-configuration'


def essence_of(obj: Any) -> Any:
    return json.loads(obj['metadata']['annotations'][DIFFBASE])


async def test_one_handler_with_result_without_status_subresource(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, plain: Resource,
        requests: Callable[..., int]) -> None:

    @kopf.on.create(plain.plural, registry=registry)
    def create_fn(**_: Any) -> Any:
        return {'message': 'hello'}

    await cluster.create(resource=plain)
    emulator.requests.reset()
    events = await operator.settle(resource=plain)

    obj = cluster.get(resource=plain)
    assert obj['status'] == {'create_fn': {'message': 'hello'}}
    assert essence_of(obj) == {'spec': {'field': 'value', 'items': ['item1', 'item2']}}
    assert not any(key.startswith('kopf.zalando.org/create') for key in obj['metadata']['annotations'])
    assert 'finalizers' not in obj['metadata']
    assert requests('patch') == 1
    assert requests() == 1  # no GETs, no other requests
    assert events == 2  # the creation, and the echo of its patch (which changes nothing)


async def test_one_handler_with_result_with_status_subresource(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int]) -> None:

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> Any:
        return {'message': 'hello'}

    await cluster.create()
    emulator.requests.reset()
    await operator.settle()

    obj = cluster.get()
    assert obj['status'] == {'create_fn': {'message': 'hello'}}
    assert essence_of(obj) == {'spec': {'field': 'value', 'items': ['item1', 'item2']}}
    assert requests('patch', subresource='') == 1
    assert requests('patch', subresource='status') == 1
    assert requests() == 2


async def test_one_handler_without_result_with_status_subresource(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int]) -> None:

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> None:
        pass

    await cluster.create()
    emulator.requests.reset()
    await operator.settle()

    assert 'status' not in cluster.get()
    assert requests() == requests('patch', subresource='') == 1


async def test_finalizer_goes_before_the_handlers(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:
    seen_finalizers: list[list[str]] = []

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> Any:
        # The finalizer must already be on the object: a deletion now would wait for delete_fn.
        seen_finalizers.append(cluster.get()['metadata']['finalizers'])
        return 'created'

    @kopf.on.delete(kex.plural, registry=registry)
    def delete_fn(**_: Any) -> None:
        pass

    await cluster.create(metadata={'finalizers': ['example.com/foreign']})
    emulator.requests.reset()
    await operator.settle()

    obj = cluster.get()
    assert seen_finalizers == [['example.com/foreign', FINALIZER]]
    assert obj['metadata']['finalizers'] == ['example.com/foreign', FINALIZER]
    assert obj['status'] == {'create_fn': 'created'}
    assert DIFFBASE in obj['metadata']['annotations']
    assert requests('patch', subresource='') == 2  # the finalizer first, then the diff-base
    assert requests('patch', subresource='status') == 1
    assert requests() == 3  # as Kopf: the deletion handlers are guaranteed
    assert 'Adding the finalizer, thus preventing the actual deletion.' in messages()


async def test_several_handlers_one_per_cycle_by_default(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:
    calls: list[str] = []

    @kopf.on.create(kex.plural, registry=registry)
    def create_a(**_: Any) -> Any:
        calls.append('a')
        return 'a'

    @kopf.on.create(kex.plural, registry=registry)
    def create_b(**_: Any) -> None:
        calls.append('b')

    await cluster.create()
    emulator.requests.reset()

    # The 1st cycle: only the 1st handler; its progress is stored for the next cycles.
    await operator.process(type='ADDED')
    obj = cluster.get()
    record = json.loads(obj['metadata']['annotations']['kopf.zalando.org/create_a'])
    assert record['success'] is True and record['purpose'] == 'create' and record['retries'] == 1
    assert DIFFBASE not in obj['metadata']['annotations']
    assert calls == ['a']

    # The 2nd cycle: the 2nd handler; the progress is purged, the diff-base is stored.
    await operator.settle(first='MODIFIED')
    obj = cluster.get()
    assert calls == ['a', 'b']
    assert not any(key.startswith('kopf.zalando.org/create') for key in obj['metadata']['annotations'])
    assert DIFFBASE in obj['metadata']['annotations']
    assert obj['status'] == {'create_a': 'a'}
    assert requests('patch', subresource='') == 2
    assert requests('patch', subresource='status') == 1
    assert 'Creation is processed: 2 succeeded; 0 failed.' in messages()


async def test_all_handlers_at_once_with_another_lifecycle(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int]) -> None:

    @kopf.on.create(kex.plural, registry=registry)
    def create_a(**_: Any) -> Any:
        return 'a'

    @kopf.on.create(kex.plural, registry=registry)
    def create_b(**_: Any) -> Any:
        return 'b'

    operator.lifecycle = kopf.lifecycles.all_at_once
    await cluster.create()
    emulator.requests.reset()
    await operator.settle()

    assert cluster.get()['status'] == {'create_a': 'a', 'create_b': 'b'}
    assert requests('patch', subresource='') == 1
    assert requests('patch', subresource='status') == 1


async def test_handlers_patch_goes_with_the_rest(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, plain: Resource,
        requests: Callable[..., int]) -> None:

    @kopf.on.create(plain.plural, registry=registry)
    def create_fn(patch: kopf.Patch, **_: Any) -> Any:
        patch.metadata.labels['touched'] = 'yes'
        patch.status['own'] = 'value'
        return 'result'

    await cluster.create(resource=plain)
    emulator.requests.reset()
    await operator.settle(resource=plain)

    obj = cluster.get(resource=plain)
    assert obj['metadata']['labels'] == {'touched': 'yes'}
    assert obj['status'] == {'own': 'value', 'create_fn': 'result'}
    # The handled essence is the one the handlers have seen; their own changes are an update then
    # (as in Kopf): the update cycle has no handlers here, so it only stores the new diff-base.
    assert essence_of(obj)['metadata'] == {'labels': {'touched': 'yes'}}
    assert requests() == 2


async def test_no_matching_handlers_store_only_the_diffbase(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:

    @kopf.on.update(kex.plural, registry=registry)
    def update_fn(**_: Any) -> None:
        raise AssertionError('Must not be called on creation.')

    await cluster.create()
    emulator.requests.reset()
    await operator.settle()

    assert DIFFBASE in cluster.get()['metadata']['annotations']
    assert requests() == 1
    assert messages()[0].startswith('Creation is in progress: ')
    assert not any('is processed' in message for message in messages())


async def test_objects_not_matching_the_filters_are_not_touched(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:

    @kopf.on.create(kex.plural, labels={'app': 'mine'}, registry=registry)
    def create_fn(**_: Any) -> None:
        raise AssertionError('Must not be called for the objects of other apps.')

    await cluster.create(metadata={'labels': {'app': 'other'}})
    emulator.requests.reset()
    await operator.settle()

    assert DIFFBASE not in cluster.get()['metadata'].get('annotations', {})
    assert requests() == 0
    assert messages() == []
