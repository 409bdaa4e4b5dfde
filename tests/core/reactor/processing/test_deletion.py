"""
Deletion: the finalizer, the deletion handlers, the superseded cycles, and the objects' disappearance.
"""
import json
from collections.abc import Callable
from typing import Any

import pytest

import kopf
from kopf._cogs.structs.references import Resource
from kopf._core.intents.registries import OperatorRegistry

FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'
DIFFBASE = 'kopf.zalando.org/last-handled-configuration'


def retried_deletion(registry: OperatorRegistry, kex: Resource) -> list[int]:
    """A deletion handler that fails its first attempt; the attempts' ``retry`` kwargs, as they come."""
    attempts: list[int] = []

    @kopf.on.delete(kex.plural, registry=registry)
    def delete_fn(retry: int, **_: Any) -> None:
        attempts.append(retry)
        if retry == 0:
            raise kopf.TemporaryError('not yet', delay=0)

    return attempts


async def test_deletion_with_the_finalizer(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:
    calls: list[str] = []

    @kopf.on.delete(kex.plural, registry=registry)
    def delete_fn(reason: str, **_: Any) -> None:
        calls.append(reason)

    await cluster.create()
    await operator.settle()
    assert cluster.get()['metadata']['finalizers'] == [FINALIZER]
    assert len(operator.memories) == 1

    await cluster.delete('kex1')
    version = cluster.get()['metadata']['resourceVersion']
    emulator.requests.reset()
    await operator.settle(first='MODIFIED')

    assert calls == ['delete']
    assert cluster.get() is None
    assert requests() == requests('patch', subresource='') == 1
    assert len(operator.memories) == 0
    assert messages()[-4:] == [
        'Deletion is processed: 1 succeeded; 0 failed.',
        'Removing the finalizer, thus allowing the actual deletion.',
        "Merge-patching the resource with: "
        f"{{'metadata': {{'finalizers': None, 'resourceVersion': '{version}'}}}}",
        'Deleted, really deleted, and we are notified.',
    ]


async def test_only_the_release_of_a_deleted_object_finishes_it(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource) -> None:
    # Finished: nothing but the deletion can come, so the queueing lets the object's worker go at once.
    attempts = retried_deletion(registry, kex)

    await cluster.create()
    await operator.settle()
    assert operator.finished == [False, False]  # the finalizer added, then nothing to do

    await cluster.delete('kex1')
    operator.finished.clear()
    await operator.settle(first='MODIFIED')
    assert attempts == [0, 1]
    assert cluster.get() is None
    assert operator.finished == [False, True, False]  # retried, released, deleted


@pytest.mark.parametrize('watched', [False, True], ids=['changes-only', 'with-event-handlers'])
async def test_a_state_written_under_the_release_is_not_handled_again(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]], watched: bool) -> None:
    # kube-apiserver checks the release (our version-guarded patch emptying the finalizers) against the
    # object, then deletes the object with no version precondition (its `Store.deleteWithoutFinalizers()`):
    # another write that lands in between (here: a controller's status, with our finalizer still on) is
    # deleted too, but its MODIFIED event comes after our release has succeeded, before the deletion's.
    # Seen in the soak on a real control plane: the deletion handler was called again for that state.
    calls: list[str] = []
    seen: list[str | None] = []

    @kopf.on.delete(kex.plural, registry=registry)
    def delete_fn(**_: Any) -> None:
        calls.append('delete')

    if watched:
        @kopf.on.event(kex.plural, registry=registry)
        def event_fn(type: str | None, **_: Any) -> None:
            seen.append(type)

    await cluster.create()
    await operator.settle()
    await cluster.delete('kex1')
    marked = cluster.get()
    written = json.loads(json.dumps(marked))
    written['status'] = {'writer': 1}
    written['metadata']['resourceVersion'] = str(int(marked['metadata']['resourceVersion']) + 1)

    await operator.process(type='MODIFIED', body=marked)  # released: the object is gone
    assert calls == ['delete']
    assert cluster.get() is None
    emulator.requests.reset()
    seen.clear()
    operator.finished.clear()
    await operator.process(type='MODIFIED', body=written)
    await operator.process(type='DELETED', body=written)

    assert calls == ['delete']
    assert requests() == 0
    assert seen == (['MODIFIED', 'DELETED'] if watched else [])  # the event handlers see every event
    assert operator.finished == [True, False]  # still nothing but the deletion can come
    assert len(operator.memories) == 0
    assert ('Released for the deletion already: this state with our finalizer is from before the release, '
            'nothing to handle.') in messages()


async def test_the_echo_of_the_fallback_before_the_release_is_not_handled_again(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    # After a conflict, the release goes as two requests: the rest of the patch (here: the retried handler's
    # progress cleared), then our finalizer's removal by a JSON-patch, answered with the first one's version
    # (the removal itself is not stored). That version's event (our finalizer on, the progress cleared) is
    # the echo of our latest patch, but comes after the release: seen in the soak on a real server when a
    # restart of kube-apiserver delayed the deletion's event. Handled, it called the deletion handler again.
    attempts = retried_deletion(registry, kex)

    await cluster.create()
    await operator.settle()
    await cluster.delete('kex1')
    await operator.process()  # the first attempt fails: its progress is stored
    stale = cluster.get()
    await cluster.patch('kex1', {'metadata': {'labels': {'changed': 'meanwhile'}}})  # by someone else
    await operator.process(body=stale)  # the guarded release is refused; the fallback releases it
    assert attempts == [0, 1]
    assert cluster.get() is None
    assert 'The object has changed meanwhile; the finalizer is changed separately.' in messages()

    history = await watch_history(cluster, since=stale['metadata']['resourceVersion'])
    assert [(e['type'], e['object']['metadata'].get('finalizers')) for e in history] == [
        ('MODIFIED', [FINALIZER]),  # the label
        ('MODIFIED', [FINALIZER]),  # the rest of the patch: the progress cleared
        ('DELETED', [FINALIZER]),
    ]
    await operator.process(type='MODIFIED', body=history[1]['object'])
    await operator.process(type='DELETED', body=history[2]['object'])
    assert attempts == [0, 1]
    assert len(operator.memories) == 0
    assert ('Released for the deletion already: this state with our finalizer is from before the release, '
            'nothing to handle.') in messages()


async def watch_history(cluster: Any, *, since: str) -> list[dict[str, Any]]:
    """The watch-events of the test's objects since the version (the watch ends after a second)."""
    import aiohttp
    params = {'watch': '1', 'resourceVersion': since, 'timeoutSeconds': '1'}
    url = cluster.api.url + cluster.path()
    tls = cluster.api.ssl_context or True
    async with (aiohttp.ClientSession() as session,
                session.get(url, params=params, headers=cluster.api.auth_headers, ssl=tls) as response):
        assert response.status == 200
        return [json.loads(line) for line in (await response.read()).splitlines() if line.strip()]


@pytest.mark.parametrize('decorator, finished', [
    # Others' finalizers hold it, but ours is gone: whatever comes next is processed by a new worker.
    pytest.param(kopf.on.delete, True, id='released-by-us'),
    # Never held by us: not ours to finish, though nothing is to be done for it either.
    pytest.param(kopf.on.create, False, id='never-held-by-us'),
])
async def test_deleted_objects_with_foreign_finalizers_are_finished_only_by_our_release(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        decorator: Any, finished: bool) -> None:

    @decorator(kex.plural, registry=registry)
    def fn(**_: Any) -> None:
        pass

    await cluster.create(metadata={'finalizers': ['example.com/foreign']})
    await operator.settle()
    await cluster.delete('kex1')
    operator.finished.clear()
    await operator.process()
    assert cluster.get()['metadata']['finalizers'] == ['example.com/foreign']
    assert operator.finished == [finished]


async def test_deletion_results_go_before_the_release(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int]) -> None:

    @kopf.on.delete(kex.plural, registry=registry)
    def delete_fn(**_: Any) -> Any:
        return 'deleted'

    await cluster.create(metadata={'finalizers': ['example.com/foreign']})
    await operator.settle()
    await cluster.delete('kex1')
    emulator.requests.reset()
    await operator.process()

    # The status first: after the main patch, the object could be gone (not here: a foreign finalizer).
    obj = cluster.get()
    assert obj['status'] == {'delete_fn': 'deleted'}
    assert obj['metadata']['finalizers'] == ['example.com/foreign']
    assert requests('patch', subresource='status') == 1
    assert requests('patch', subresource='') == 1
    keys = [(key.verb, key.subresource) for key in emulator.requests.snapshot()]
    assert keys == [('patch', 'status'), ('patch', '')]


async def test_deleted_objects_without_our_finalizer_are_free(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> None:
        pass

    await cluster.create(metadata={'finalizers': ['example.com/foreign']})
    await operator.settle()
    await cluster.delete('kex1')
    emulator.requests.reset()
    count = len(messages())
    await operator.settle(first='MODIFIED')

    assert requests() == 0
    assert messages()[count:] == [
        'Deletion, but we are done with it, and we do not care.',
        'Handling cycle is finished, waiting for new changes.',
    ]


async def test_gone_objects_are_forgotten(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> None:
        pass

    await cluster.create()
    await operator.settle()
    await cluster.delete('kex1')
    emulator.requests.reset()
    await operator.settle(first='DELETED')

    assert requests() == 0
    assert len(operator.memories) == 0
    assert messages()[-1] == 'Deleted, really deleted, and we are notified.'


async def test_optional_deletion_handlers_need_no_finalizer(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource) -> None:

    @kopf.on.delete(kex.plural, optional=True, registry=registry)
    def delete_fn(**_: Any) -> None:
        pass

    await cluster.create()
    await operator.settle()
    assert 'finalizers' not in cluster.get()['metadata']


async def test_unneeded_finalizer_is_removed_with_the_creation(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> None:
        pass

    await cluster.create(metadata={'finalizers': ['example.com/first', FINALIZER, 'example.com/last']})
    emulator.requests.reset()
    await operator.settle()

    obj = cluster.get()
    assert obj['metadata']['finalizers'] == ['example.com/first', 'example.com/last']
    assert DIFFBASE in obj['metadata']['annotations']
    assert requests() == 1
    assert 'Removing the finalizer, as there are no handlers requiring it.' in messages()


async def test_finalizer_of_objects_not_matching_anymore_is_removed(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:

    @kopf.on.delete(kex.plural, labels={'app': 'mine'}, registry=registry)
    def delete_fn(**_: Any) -> None:
        pass

    await cluster.create(metadata={'labels': {'app': 'mine'}})
    await operator.settle()
    assert cluster.get()['metadata']['finalizers'] == [FINALIZER]

    await cluster.patch('kex1', {'metadata': {'labels': {'app': 'other'}}})
    count = len(messages())
    await operator.settle(first='MODIFIED')
    assert 'finalizers' not in cluster.get()['metadata']
    assert messages()[count:] == [
        'Removing the finalizer, as there are no handlers requiring it.',
        messages()[count + 1],  # the patch itself
    ]


async def test_object_deleted_while_its_creation_is_retried(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[str] = []

    @kopf.on.create(kex.plural, registry=registry)
    def create_ok(**_: Any) -> Any:
        calls.append('create_ok')
        return 'ok'

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> None:
        calls.append('create_fn')
        raise kopf.TemporaryError('wait', delay=60)

    @kopf.on.delete(kex.plural, registry=registry)
    def delete_fn(**_: Any) -> Any:
        calls.append('delete_fn')
        return 'deleted'

    await cluster.create()
    await operator.process(type='ADDED')  # create_ok + the finalizer
    await operator.process()  # create_fn fails
    annotations = cluster.get()['metadata']['annotations']
    assert json.loads(annotations['kopf.zalando.org/create_ok'])['success'] is True
    assert json.loads(annotations['kopf.zalando.org/create_fn'])['retries'] == 1

    await cluster.delete('kex1')
    await operator.settle(first='MODIFIED')

    assert calls == ['create_ok', 'create_fn', 'delete_fn']
    assert cluster.get() is None
    assert 'Creation is superseded by deletion: 1 succeeded; 0 failed; 1 left to the moment.' in messages()
    assert 'Deletion is processed: 1 succeeded; 0 failed.' in messages()


async def test_update_superseded_by_deletion_keeps_the_progress_of_shared_handlers(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[tuple[str, int]] = []

    @kopf.on.update(kex.plural, registry=registry)
    @kopf.on.delete(kex.plural, registry=registry)
    def fn(reason: str, retry: int, **_: Any) -> None:
        calls.append((reason, retry))
        if reason == 'update':
            raise kopf.TemporaryError('later', delay=0)

    await cluster.create()
    await operator.settle()
    await cluster.patch('kex1', {'spec': {'field': 'changed'}})
    await operator.process()

    await cluster.delete('kex1')
    await operator.settle(first='MODIFIED')

    assert calls == [('update', 0), ('delete', 1)]
    assert 'Updating is superseded by deletion: 0 succeeded; 0 failed; 1 left to the moment.' in messages()
    assert cluster.get() is None


async def test_conflicting_finalizer_changes_fall_back_to_json_patches(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> Any:
        return 'created'

    @kopf.on.delete(kex.plural, registry=registry)
    def delete_fn(**_: Any) -> None:
        pass

    await cluster.create()
    stale = cluster.get()
    # Someone adds their finalizer after the event was sent: the whole list would lose it.
    await cluster.patch('kex1', {'metadata': {'finalizers': ['example.com/foreign']}})
    emulator.requests.reset()
    await operator.process(type='ADDED', body=stale)

    obj = cluster.get()
    assert obj['metadata']['finalizers'] == ['example.com/foreign', FINALIZER]
    assert obj['status'] == {'create_fn': 'created'}
    assert DIFFBASE in obj['metadata']['annotations']
    assert requests('patch', subresource='') == 3  # rejected, then the rest, then the JSON-patch
    assert requests('patch', subresource='status') == 1
    assert 'The object has changed meanwhile; the finalizer is changed separately.' in messages()


async def test_daemons_need_the_finalizer_but_no_diffbase(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:

    @kopf.daemon(kex.plural, registry=registry)
    async def daemon_fn(**_: Any) -> None:
        pass

    await cluster.create()
    emulator.requests.reset()
    await operator.settle()
    assert cluster.get()['metadata']['finalizers'] == [FINALIZER]
    assert 'annotations' not in cluster.get()['metadata']
    assert requests() == 1

    # TODO: the release must wait for the daemons to exit, once they are spawned by the processing.
    await cluster.delete('kex1')
    operator.finished.clear()
    await operator.settle(first='MODIFIED')
    assert cluster.get() is None
    assert operator.finished == [True, False]  # released, then deleted
    assert messages() == [
        'Adding the finalizer, thus preventing the actual deletion.',
        messages()[1],  # the patch
        'Removing the finalizer, thus allowing the actual deletion.',
        messages()[3],  # the patch
    ]


async def test_conflicting_release_falls_back_to_a_json_patch(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int]) -> None:
    calls: list[str] = []

    @kopf.on.delete(kex.plural, registry=registry)
    def delete_fn(**_: Any) -> None:
        calls.append('delete_fn')

    await cluster.create(metadata={'finalizers': ['example.com/foreign']})
    await operator.settle()
    await cluster.delete('kex1')
    stale = cluster.get()
    await cluster.patch('kex1', {'metadata': {'labels': {'changed': 'meanwhile'}}})
    emulator.requests.reset()
    await operator.process(body=stale)

    assert calls == ['delete_fn']
    assert cluster.get()['metadata']['finalizers'] == ['example.com/foreign']
    # Rejected; then nothing else to patch, so the fresh object is read; then the JSON-patch.
    assert requests('patch') == 2
    assert requests('get') == 1
