"""
The API's errors while applying the changes: retried by the client, or escalated to the queueing.
"""
from collections.abc import Callable
from typing import Any

import pytest

import kopf
from kopf._clients.errors import APIError
from kopf._cogs.structs.references import Resource
from kopf._core.intents.registries import OperatorRegistry


@pytest.fixture
def calls(registry: OperatorRegistry, kex: Resource) -> list[str]:
    calls: list[str] = []

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> Any:
        calls.append('create_fn')
        return 'created'

    return calls


@pytest.mark.parametrize('status, retry_after', [(500, None), (503, None), (429, 0)])
async def test_server_errors_are_retried(
        status: int, retry_after: float | None, calls: list[str], operator: Any, cluster: Any,
        emulator: Any, requests: Callable[..., int]) -> None:
    await cluster.create()
    emulator.requests.reset()
    emulator.fail_requests(2, status=status, verb='patch', retry_after=retry_after)
    await operator.settle()

    assert calls == ['create_fn']
    assert cluster.get()['status'] == {'create_fn': 'created'}
    assert requests('patch', subresource='') == 3  # 2 failures & 1 success
    assert requests('patch', subresource='status') == 1


@pytest.mark.parametrize('status', [400, 403])
async def test_unretriable_errors_escalate(
        status: int, calls: list[str], operator: Any, cluster: Any, emulator: Any) -> None:
    await cluster.create()
    emulator.fail_requests(1, status=status, verb='patch')
    with pytest.raises(APIError):
        await operator.process(type='ADDED')
    assert calls == ['create_fn']


async def test_invalid_patches_are_reported_not_escalated(
        calls: list[str], operator: Any, cluster: Any, emulator: Any,
        messages: Callable[[], list[str]]) -> None:
    # E.g. Kopf's annotations too long for the API, or a result that violates the status' schema:
    # repeating the same patch cannot help; one clear error, and the next change is handled anew.
    await cluster.create()
    emulator.fail_requests(1, status=422, verb='patch', message='the patch is invalid')
    await operator.process(type='ADDED')
    assert calls == ['create_fn']
    assert messages()[-1] == (
        'The API has rejected the patch of the object as invalid: the patch is invalid. The outcome of '
        'this handling is not stored; the handlers will run again on the next change of the object.'
    )


async def test_objects_gone_while_being_handled(
        calls: list[str], operator: Any, cluster: Any, emulator: Any, requests: Callable[..., int],
        messages: Callable[[], list[str]]) -> None:
    await cluster.create()
    body = cluster.get()
    await cluster.delete('kex1')
    emulator.requests.reset()

    await operator.process(type='ADDED', body=body)  # the patch finds no object: no errors
    assert calls == ['create_fn']
    assert requests('patch') == 1  # the status part is not sent after the main part is not found
    assert not operator.memories.recall(body).expected_version  # nothing to wait for

    await operator.process(type='DELETED', body=body)
    assert len(operator.memories) == 0
    assert messages()[-1] == 'Deleted, really deleted, and we are notified.'


async def test_inconsistencies_of_the_patched_objects_are_reported(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(patch: kopf.Patch, **_: Any) -> None:
        patch.metadata['generation'] = 100  # the API ignores it, as it ignores the pruned fields
        patch.metadata.labels['kept'] = 'yes'

    await cluster.create()
    await operator.process(type='ADDED')

    assert "Patching failed with inconsistencies: (('change', ('metadata', 'generation'), 1, 100),)" \
        in messages()
