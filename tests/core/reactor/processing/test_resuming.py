"""
Resuming: the objects that existed before the operator started (seen in the initial listing).

Their resuming handlers are due once per operator lifetime, mixed into the first cycle of whatever
has happened to them, except the creation (as Kopf does) and the deletion (unless the handlers
accept the deleted objects).
"""
import json
from collections.abc import Callable
from typing import Any

import kopf
from kopf._cogs.structs.references import Resource
from kopf._core.intents.registries import OperatorRegistry

DIFFBASE = 'kopf.zalando.org/last-handled-configuration'
FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'
ESSENCE = {'spec': {'field': 'value', 'items': ['item1', 'item2']}}


def handled_before(essence: Any = ESSENCE) -> dict[str, Any]:
    """The metadata of an object handled by an earlier run of the operator."""
    return {'annotations': {DIFFBASE: json.dumps(essence, separators=(',', ':')) + '\n'}}


async def test_resuming_of_unchanged_objects(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:
    calls: list[str] = []

    @kopf.on.resume(kex.plural, registry=registry)
    def resume_fn(reason: str, **_: Any) -> Any:
        calls.append(reason)
        return reason

    @kopf.on.create(kex.plural, registry=registry)
    @kopf.on.update(kex.plural, registry=registry)
    def other_fn(**_: Any) -> None:
        raise AssertionError('Must not be called: nothing is created or changed.')

    await cluster.create(metadata=handled_before())
    emulator.requests.reset()
    await operator.settle(first=None)

    assert calls == ['resume']
    assert cluster.get()['status'] == {'resume_fn': 'resume'}
    assert requests() == requests('patch', subresource='status') == 1  # no progress, the same diff-base
    assert messages()[0].startswith('Resuming is in progress: ')
    assert 'Resuming is processed: 1 succeeded; 0 failed.' in messages()

    # Once per operator lifetime: the next events of the object are just changes (or none).
    await operator.settle(first='MODIFIED')
    assert calls == ['resume']

    # A new operator process resumes the object again.
    operator.restart()
    await operator.settle(first=None)
    assert calls == ['resume', 'resume']


async def test_resuming_with_no_resuming_handlers_does_nothing(
        registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any, kex: Resource,
        requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> None:
        raise AssertionError('Must not be called for the objects handled before.')

    await cluster.create(metadata=handled_before())
    emulator.requests.reset()
    await operator.settle(first=None)

    assert requests() == 0
    assert [message.split(':')[0] for message in messages()] == [
        'Resuming is in progress',
        'Handling cycle is finished, waiting for new changes.',
    ]


async def test_resuming_is_mixed_into_updates(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[tuple[str, str]] = []

    @kopf.on.resume(kex.plural, registry=registry)
    def resume_fn(reason: str, **_: Any) -> None:
        calls.append(('resume_fn', reason))

    @kopf.on.update(kex.plural, registry=registry)
    def update_fn(reason: str, **_: Any) -> None:
        calls.append(('update_fn', reason))

    await cluster.create(metadata=handled_before({'spec': {'field': 'old'}}))
    await operator.settle(first=None)

    assert calls == [('resume_fn', 'update'), ('update_fn', 'update')]
    assert 'Updating is processed: 2 succeeded; 0 failed.' in messages()


async def test_no_resuming_on_creation(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource) -> None:
    calls: list[str] = []

    @kopf.on.resume(kex.plural, registry=registry)
    def resume_fn(**_: Any) -> None:
        calls.append('resume_fn')

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> None:
        calls.append('create_fn')

    await cluster.create()
    await operator.settle(first=None)
    assert calls == ['create_fn']


async def test_no_resuming_for_the_objects_appeared_after_the_start(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:

    @kopf.on.resume(kex.plural, registry=registry)
    def resume_fn(**_: Any) -> None:
        raise AssertionError('Must not be called: the object is not from the initial listing.')

    await cluster.create(metadata=handled_before())
    await operator.settle(first='ADDED')
    assert messages() == [
        'Something has changed, but we are not interested (the essence is the same).',
        'Handling cycle is finished, waiting for new changes.',
    ]


async def test_resuming_of_deleted_objects(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[str] = []

    @kopf.on.resume(kex.plural, registry=registry)
    def resume_plain(**_: Any) -> None:
        calls.append('resume_plain')

    @kopf.on.resume(kex.plural, deleted=True, registry=registry)
    def resume_deleted(**_: Any) -> None:
        calls.append('resume_deleted')

    @kopf.on.delete(kex.plural, registry=registry)
    def delete_fn(**_: Any) -> None:
        calls.append('delete_fn')

    await cluster.create(metadata={**handled_before(), 'finalizers': [FINALIZER, 'example.com/blocker']})
    await cluster.delete('kex1')
    await operator.settle(first=None)

    assert calls == ['resume_deleted', 'delete_fn']
    assert cluster.get()['metadata']['finalizers'] == ['example.com/blocker']
    assert 'Deletion is processed: 2 succeeded; 0 failed.' in messages()
    assert messages()[-2:] == [
        'Deletion, but we are done with it, and we do not care.',
        'Handling cycle is finished, waiting for new changes.',
    ]
