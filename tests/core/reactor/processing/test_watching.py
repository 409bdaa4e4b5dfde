"""
The event-watching handlers (``@kopf.on.event``): every event, errors ignored, no state kept.
"""
from collections.abc import Callable
from typing import Any

import pytest

import kopf
from kopf._cogs.structs.references import Resource
from kopf._core.intents.registries import OperatorRegistry


async def test_every_event_with_errors_ignored(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[Any, ...]] = []

    @kopf.on.event(kex.plural, registry=registry)
    def failing_fn(**_: Any) -> None:
        raise ValueError('boom')

    @kopf.on.event(kex.plural, registry=registry)
    def temporary_fn(**_: Any) -> None:
        raise kopf.TemporaryError('later')

    @kopf.on.event(kex.plural, registry=registry)
    def event_fn(type: Any, event: Any, body: Any, name: str, retry: int, **_: Any) -> None:
        seen.append((type, event['type'], event['object'] is body._resolve() or dict(body) == event['object'],
                     name, retry))

    await cluster.create()
    emulator.requests.reset()
    await operator.process(type=None)
    await operator.process(type='MODIFIED')
    await cluster.delete('kex1')
    await operator.process(type='DELETED', body=operator.last_bodies['kex1'])

    assert [item[:2] for item in seen] == [(None, None), ('MODIFIED', 'MODIFIED'), ('DELETED', 'DELETED')]
    assert all(item[2:] == (True, 'kex1', 0) for item in seen)
    assert requests('patch') == 0  # no state is stored, no results to store
    assert len(operator.memories) == 0  # the deleted object is forgotten

    records = [record for record in caplog.records if record.name == 'kopf.objects']
    failures = [(record.levelname, record.getMessage())
                for record in records if 'failed' in record.getMessage()]
    assert failures == [
        ('ERROR', "Handler 'failing_fn' failed with an exception and will ignore it: boom"),
        ('ERROR', "Handler 'temporary_fn' failed temporarily: later"),
    ] * 3
    # Too frequent to be posted as k8s-events: all the messages of these handlers are local.
    assert all(getattr(record, 'kopf_local_only') for record in records)  # noqa: B009


async def test_results_go_to_the_status_with_the_changing_results(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int]) -> None:

    @kopf.on.event(kex.plural, registry=registry)
    def event_fn(**_: Any) -> Any:
        return 'seen'

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> Any:
        return 'created'

    await cluster.create()
    emulator.requests.reset()
    await operator.settle(first=None)

    assert cluster.get()['status'] == {'event_fn': 'seen', 'create_fn': 'created'}
    # The 1st event: 1 patch of the main endpoint (the diff-base), 1 of the status (both results).
    # The echo: the same result again: the API changes nothing (no new version): the end.
    assert requests('patch', subresource='') == 1
    assert requests('patch', subresource='status') == 2


async def test_patches_of_deleted_objects_are_not_applied(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int]) -> None:

    @kopf.on.event(kex.plural, registry=registry)
    def event_fn(patch: kopf.Patch, **_: Any) -> Any:
        patch.metadata.labels['seen'] = 'yes'
        return 'seen'

    await cluster.create()
    body = cluster.get()
    await cluster.delete('kex1')
    emulator.requests.reset()
    await operator.process(type='DELETED', body=body)
    assert requests() == 0


async def test_memos_are_per_object(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource) -> None:
    memos: dict[str, Any] = {}

    @kopf.on.event(kex.plural, registry=registry)
    def event_fn(name: str, memo: kopf.Memo, **_: Any) -> None:
        memo.counter = memo.get('counter', 0) + 1
        memo.shared.append(name)
        memos[name] = memo

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(name: str, memo: kopf.Memo, **_: Any) -> None:
        assert memo is memos[name]

    operator.memo = kopf.Memo(shared=[], operator_only='yes')
    await cluster.create('kex1')
    await cluster.create('kex2')
    await operator.settle('kex1', first=None)
    await operator.settle('kex2', first=None)
    await operator.process('kex1')

    assert memos['kex1'] is not memos['kex2']
    assert memos['kex1'].counter == 3 and memos['kex2'].counter == 2  # incl. the echoes
    assert memos['kex1'].shared is memos['kex2'].shared is operator.memo.shared  # a shallow copy
    assert memos['kex1'].operator_only == 'yes'
    assert 'counter' not in operator.memo
