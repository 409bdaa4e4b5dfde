"""
The echoes of our own patches: not processed at all when nothing can come out of them.

When a patch has only the framework's own writes (the status, our finalizer, Kopf's annotations),
nothing was due after it, and none of the resource's handlers looks at those fields, the processing of
the patch's very version would only find that nothing has changed. Its echo is skipped (with the usual
logs, i.e. not at the debug level, which logs the "no changes" as Kopf does). Any other version, any
patch of other fields, any filter that sees the whole body: processed as usual.

The processing's work is seen through a diff-base storage of our own (a public extension point),
which counts how often the last handled essence is read: once per processed event.
"""
import logging
from collections.abc import Callable
from typing import Any

import pytest

import kopf
from kopf._cogs.structs.bodies import Body, BodyEssence
from kopf._cogs.structs.references import Resource
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.registries import OperatorRegistry
from kopf._core.reactor.contexts import OperatorScope
from kopf._core.reactor.processing import finish_unattended


class CountingDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    def __init__(self) -> None:
        super().__init__()
        self.fetches = 0

    def fetch(self, *, body: Body) -> BodyEssence | None:
        self.fetches += 1
        return super().fetch(body=body)


@pytest.fixture
def storage(settings: OperatorSettings) -> CountingDiffBaseStorage:
    storage = CountingDiffBaseStorage()
    settings.persistence.diffbase_storage = storage
    return storage


@pytest.fixture(autouse=True)
def _info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger='kopf.objects')


@pytest.fixture
def calls() -> list[str]:
    return []


@pytest.fixture
def create_and_delete(registry: OperatorRegistry, kex: Resource, calls: list[str]) -> None:
    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> Any:
        calls.append('create')
        return {'message': 'hello'}

    @kopf.on.update(kex.plural, registry=registry)
    def update_fn(**_: Any) -> None:
        calls.append('update')

    @kopf.on.delete(kex.plural, registry=registry)
    def delete_fn(**_: Any) -> None:
        calls.append('delete')


@pytest.fixture
async def handled(create_and_delete: None, storage: CountingDiffBaseStorage,
                  operator: Any, cluster: Any) -> None:
    """The object created and handled once (as seen in the listing); its echoes have not come yet."""
    await cluster.create()
    await operator.process(type=None)


@pytest.mark.usefixtures('create_and_delete')
async def test_own_echo_is_not_processed(
        operator: Any, cluster: Any, storage: CountingDiffBaseStorage, calls: list[str],
        requests: Callable[..., int], messages: Callable[[], list[str]],
) -> None:
    await cluster.create()
    await operator.process(type=None)
    assert calls == ['create']
    assert storage.fetches == 1
    handled = cluster.get()
    assert handled['status'] == {'create_fn': {'message': 'hello'}}
    requests_before = requests()

    await operator.process()  # the echo of the status patch (the latest one)
    assert storage.fetches == 1  # not processed
    assert requests() == requests_before
    assert calls == ['create']
    assert cluster.get() == handled

    # The consistency is noticed as the processing would: the next change is handled at once.
    await cluster.patch('kex1', {'spec': {'field': 'changed'}})
    await operator.process()
    assert calls == ['create', 'update']
    assert storage.fetches == 2
    assert messages()[-1] == 'Updating is processed: 1 succeeded; 0 failed.'


def scope_of(operator: Any) -> OperatorScope:
    return OperatorScope(registry=operator.registry, settings=operator.settings, memories=operator.memories,
                         vault=operator.vault)


@pytest.mark.usefixtures('handled')
async def test_own_echo_with_no_worker_is_dropped_by_the_queueing(
        operator: Any, cluster: Any, storage: CountingDiffBaseStorage, calls: list[str], kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]],
) -> None:
    # E.g. it comes after the object's worker has left: no new worker is started only to drop it.
    requests_before, messages_before = requests(), messages()
    echo = {'type': 'MODIFIED', 'object': cluster.get()}
    assert finish_unattended(raw_event=echo, resource=kex, scope=scope_of(operator))  # type: ignore[arg-type]
    assert storage.fetches == 1
    assert requests() == requests_before
    assert messages() == messages_before

    # The consistency is noticed as the processing would: the next change is handled at once.
    await cluster.patch('kex1', {'spec': {'field': 'changed'}})
    await operator.process()
    assert calls == ['create', 'update']


@pytest.mark.usefixtures('handled')
async def test_other_versions_with_no_worker_go_to_the_workers(
        operator: Any, cluster: Any, storage: CountingDiffBaseStorage, kex: Resource,
) -> None:
    await cluster.patch('kex1', {'status': {'other': 'x'}}, subresource='status')
    event = {'type': 'MODIFIED', 'object': cluster.get()}
    assert not finish_unattended(raw_event=event, resource=kex, scope=scope_of(operator))  # type: ignore[arg-type]
    assert storage.fetches == 1


@pytest.mark.usefixtures('handled')
async def test_own_echo_with_no_worker_goes_to_a_worker_with_debug_logs(
        operator: Any, cluster: Any, kex: Resource, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger='kopf.objects')  # the general path logs "no changes" for it
    echo = {'type': 'MODIFIED', 'object': cluster.get()}
    assert not finish_unattended(raw_event=echo, resource=kex, scope=scope_of(operator))  # type: ignore[arg-type]


@pytest.mark.usefixtures('create_and_delete')
async def test_echo_processed_with_debug_logs(
        operator: Any, cluster: Any, storage: CountingDiffBaseStorage, calls: list[str],
        caplog: pytest.LogCaptureFixture, messages: Callable[[], list[str]],
) -> None:
    caplog.set_level(logging.DEBUG, logger='kopf.objects')
    await cluster.create()
    await operator.process(type=None)
    await operator.process()
    assert storage.fetches == 2
    assert calls == ['create']
    assert messages()[-2:] == ['Something has changed, but we are not interested (the essence is the same).',
                               'Handling cycle is finished, waiting for new changes.']


@pytest.mark.usefixtures('handled')
async def test_earlier_echoes_are_dropped_until_the_settled_one(
        operator: Any, cluster: Any, storage: CountingDiffBaseStorage, calls: list[str], kex: Resource,
) -> None:
    # E.g. the echo of the main patch before the status patch's one: it could only wait for ours, which comes.
    body = cluster.get()
    body['metadata']['resourceVersion'] = str(int(body['metadata']['resourceVersion']) - 1)
    earlier = {'type': 'MODIFIED', 'object': body}
    assert finish_unattended(raw_event=earlier, resource=kex, scope=scope_of(operator))  # type: ignore[arg-type]
    await operator.process(body=body)  # by a worker: not waiting for our patch for the consistency timeout
    assert storage.fetches == 1
    await operator.process()  # the latest echo: skipped, it is the version of our latest patch
    assert storage.fetches == 1
    assert calls == ['create']

    # The consistency is noticed as the processing would: the next change is handled at once.
    await cluster.patch('kex1', {'spec': {'field': 'changed'}})
    await operator.process()
    assert calls == ['create', 'update']


async def test_a_change_of_others_under_our_patch_is_not_settled(
        registry: OperatorRegistry, kex: Resource, operator: Any, cluster: Any, calls: list[str],
) -> None:
    # A merge-patch has no precondition: ours goes on top of a change made while the handler ran.
    @kopf.on.create(kex.plural, registry=registry)
    async def create_fn(**_: Any) -> Any:
        calls.append('create')
        await cluster.patch('kex1', {'spec': {'field': 'changed'}})
        return {'message': 'hello'}

    @kopf.on.update(kex.plural, registry=registry)
    def update_fn(new: Any, **_: Any) -> None:
        calls.append(f'update to {new["spec"]["field"]}')

    await cluster.create()
    await operator.process(type=None)
    assert calls == ['create']
    echo = {'type': 'MODIFIED', 'object': cluster.get()}  # our patch's version, with the change in it
    assert not finish_unattended(raw_event=echo, resource=kex, scope=scope_of(operator))  # type: ignore[arg-type]
    await operator.process()
    assert calls == ['create', 'update to changed']


@pytest.mark.usefixtures('handled')
async def test_other_versions_are_processed(
        operator: Any, cluster: Any, storage: CountingDiffBaseStorage, calls: list[str],
) -> None:
    await cluster.patch('kex1', {'status': {'other': 'x'}}, subresource='status')  # batched with our echo
    await operator.process()
    assert storage.fetches == 2
    assert calls == ['create']


@pytest.mark.usefixtures('handled')
async def test_deletion_echo_and_deleted_event(
        operator: Any, cluster: Any, storage: CountingDiffBaseStorage, calls: list[str],
) -> None:
    await operator.process()
    await cluster.delete('kex1')
    await operator.settle(first='MODIFIED')
    assert calls == ['create', 'delete']
    assert cluster.get() is None
    assert len(operator.memories) == 0


@pytest.mark.usefixtures('create_and_delete')
async def test_release_echo_is_not_processed(
        operator: Any, cluster: Any, storage: CountingDiffBaseStorage, calls: list[str], kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]],
) -> None:
    # Another finalizer keeps the released object: its echo is the object as our release has left it.
    await cluster.create(metadata={'finalizers': ['example.com/foreign']})
    await operator.settle(first=None)
    await cluster.delete('kex1')
    await operator.process()
    assert calls == ['create', 'delete']
    fetches, requests_before, messages_before = storage.fetches, requests(), messages()

    echo = {'type': 'MODIFIED', 'object': cluster.get()}
    assert echo['object']['metadata']['finalizers'] == ['example.com/foreign']
    assert finish_unattended(raw_event=echo, resource=kex, scope=scope_of(operator))  # type: ignore[arg-type]
    assert storage.fetches == fetches
    assert requests() == requests_before
    assert messages() == messages_before


async def test_handlers_patching_the_spec_see_their_echo(
        registry: OperatorRegistry, kex: Resource, operator: Any, cluster: Any,
        storage: CountingDiffBaseStorage, calls: list[str],
) -> None:
    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(patch: kopf.Patch, **_: Any) -> None:
        calls.append('create')
        patch.spec['field'] = 'patched'

    @kopf.on.update(kex.plural, registry=registry)
    def update_fn(**_: Any) -> None:
        calls.append('update')

    await cluster.create()
    await operator.process(type=None)
    await operator.process()
    assert storage.fetches == 2
    assert calls == ['create', 'update']  # the diff-base has the spec before the patch (as in Kopf)


async def test_handlers_labelling_the_object_see_their_echo(
        registry: OperatorRegistry, kex: Resource, operator: Any, cluster: Any,
        storage: CountingDiffBaseStorage, calls: list[str],
) -> None:
    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(patch: kopf.Patch, **_: Any) -> None:
        calls.append('create')
        patch.meta.labels['marked'] = 'yes'
        patch.meta.annotations['mine/note'] = 'yes'

    @kopf.on.update(kex.plural, registry=registry, labels={'marked': 'yes'})
    def update_fn(**_: Any) -> None:
        calls.append('update')

    await cluster.create()
    await operator.process(type=None)
    await operator.process()
    assert storage.fetches == 2


@pytest.mark.parametrize('filters', [
    pytest.param({'when': lambda **_: True}, id='when'),
    pytest.param({'annotations': {'kopf.zalando.org/last-handled-configuration': kopf.PRESENT}},
                 id='annotations'),
    pytest.param({'labels': {'app': lambda value, **_: True}}, id='callable-labels'),
    pytest.param({'field': 'status.phase', 'value': kopf.ABSENT}, id='status-field'),
])
async def test_filters_looking_at_own_writes_see_the_echo(
        registry: OperatorRegistry, kex: Resource, operator: Any, cluster: Any,
        storage: CountingDiffBaseStorage, filters: dict[str, Any],
) -> None:
    @kopf.on.delete(kex.plural, registry=registry, **filters)
    def delete_fn(**_: Any) -> None:
        pass

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> str:
        return 'done'

    await cluster.create(metadata={'labels': {'app': 'x'}})
    await operator.process(type=None)
    await operator.process()
    assert storage.fetches == 2


@pytest.mark.parametrize('kind', ['event', 'timer'])
async def test_other_kinds_of_handlers_see_the_echo(
        registry: OperatorRegistry, kex: Resource, operator: Any, cluster: Any,
        storage: CountingDiffBaseStorage, kind: str,
) -> None:
    if kind == 'event':
        @kopf.on.event(kex.plural, registry=registry)
        def event_fn(**_: Any) -> None:
            pass
    else:
        @kopf.timer(kex.plural, registry=registry, interval=100)
        def timer_fn(**_: Any) -> None:
            pass

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> str:
        return 'done'

    await cluster.create()
    await operator.process(type=None)
    await operator.process()
    assert storage.fetches == 2

