"""
Consistency: the changes are not handled until our own latest patch arrives via the watch-stream.

The intermediate states (e.g. the echo of the main patch when the status patch follows it)
are imitated with the object's current state and an older version: the emulator keeps no history.
"""
import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import kopf
from kopf._cogs.structs.references import Resource
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.registries import OperatorRegistry


def older(obj: Any, by: int = 1) -> Any:
    obj['metadata']['resourceVersion'] = str(int(obj['metadata']['resourceVersion']) - by)
    return obj


@pytest.fixture
async def created(registry: OperatorRegistry, operator: Any, cluster: Any, emulator: Any,
                  kex: Resource) -> None:
    """An object just created: a main patch and a status patch; their echoes have not arrived yet."""

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> Any:
        return 'created'

    @kopf.on.update(kex.plural, registry=registry)
    def update_fn(**_: Any) -> None:
        raise AssertionError('Must not be called: nothing is changed.')

    await cluster.create()
    await operator.process(type='ADDED')
    emulator.requests.reset()


@pytest.mark.usefixtures('created')
async def test_own_version_arrived(operator: Any, messages: Callable[[], list[str]]) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    await operator.process()
    assert loop.time() - started < 1  # no waiting at all (the timeout is 5 s)
    assert messages()[-2] == 'Something has changed, but we are not interested (the essence is the same).'


@pytest.mark.usefixtures('created')
async def test_newer_version_arrived(operator: Any, cluster: Any, messages: Callable[[], list[str]]) -> None:
    await cluster.patch('kex1', {'status': {'other': 'x'}}, subresource='status')  # batched with ours
    loop = asyncio.get_running_loop()
    started = loop.time()
    await operator.process()
    assert loop.time() - started < 1
    assert messages()[-2] == 'Something has changed, but we are not interested (the essence is the same).'


@pytest.mark.usefixtures('created')
async def test_older_version_with_newer_events_coming(
        operator: Any, cluster: Any, requests: Callable[..., int], messages: Callable[[], list[str]]) -> None:
    count = len(messages())
    pressure = asyncio.Event()
    asyncio.get_running_loop().call_later(0.1, pressure.set)
    await operator.process(body=older(cluster.get()), pressure=pressure)

    assert requests() == 0
    assert [message.split(' (')[0] for message in messages()[count:]] == ['Waiting for our own patch']


@pytest.mark.usefixtures('created')
async def test_older_version_until_the_timeout(
        operator: Any, cluster: Any, settings: OperatorSettings, requests: Callable[..., int],
        messages: Callable[[], list[str]]) -> None:
    settings.persistence.consistency_timeout = 0.2
    count = len(messages())
    loop = asyncio.get_running_loop()
    started = loop.time()
    await operator.process(body=older(cluster.get()))

    # The old state is handled as it is: as if the version has arrived (here, nothing to do anyway).
    assert loop.time() - started >= 0.1  # it is measured from the patch, which was a bit earlier
    assert requests() == 0
    assert messages()[count + 1:] == [
        messages()[count + 1],  # "Our own patch (version N) has not arrived in time..."
        'Something has changed, but we are not interested (the essence is the same).',
        'Handling cycle is finished, waiting for new changes.',
    ]
    assert 'has not arrived in time' in messages()[count + 1]

    # It is not waited for anymore.
    started = loop.time()
    await operator.process(body=older(cluster.get()))
    assert loop.time() - started < 0.1


@pytest.mark.usefixtures('created')
async def test_older_version_after_the_timeout_is_skipped_if_newer_events_have_come(
        operator: Any, cluster: Any, settings: OperatorSettings, requests: Callable[..., int],
        messages: Callable[[], list[str]]) -> None:
    # E.g. the echoes of our patches came late, all at once: the first one is stale, the newer ones wait.
    settings.persistence.consistency_timeout = 0.1
    await asyncio.sleep(0.2)  # the timeout is over
    count = len(messages())
    pressure = asyncio.Event()
    pressure.set()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await operator.process(body=older(cluster.get()), pressure=pressure)

    # The stale state is not handled even after the timeout: the newer event is processed instead.
    assert loop.time() - started < 0.1
    assert requests() == 0
    assert messages()[count:] == []


@pytest.mark.usefixtures('created')
async def test_older_version_after_the_timeout_waits_if_the_watch_stream_was_held_back(
        operator: Any, cluster: Any, settings: OperatorSettings, requests: Callable[..., int],
        messages: Callable[[], list[str]]) -> None:
    # The queueing tells this for every object: here, its watch-stream was held back by the back-pressure.
    settings.persistence.consistency_timeout = 0.1
    await asyncio.sleep(0.2)  # the timeout is over
    count = len(messages())
    await operator.process(body=older(cluster.get()), held_back_since=lambda since: True)

    # The stale state is not handled: the echo of our patch is late by our own doing, and will come.
    assert requests() == 0
    assert len(messages()[count:]) == 1
    expected = 'is late: the watch-stream was held back or interrupted. The object waits for it.'
    assert expected in messages()[count]

    # When it comes, it is processed as usual.
    await operator.process()
    assert messages()[-2] == 'Something has changed, but we are not interested (the essence is the same).'


@pytest.mark.usefixtures('created')
async def test_no_consistency_tracking_with_zero_timeout(
        operator: Any, cluster: Any, settings: OperatorSettings, messages: Callable[[], list[str]]) -> None:
    settings.persistence.consistency_timeout = 0
    await operator.process(body=older(cluster.get()))
    assert messages()[-2] == 'Something has changed, but we are not interested (the essence is the same).'
    assert not any('Waiting for our own patch' in message for message in messages())


async def test_event_handlers_are_not_delayed(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        requests: Callable[..., int]) -> None:
    events: list[str] = []

    @kopf.on.event(kex.plural, registry=registry)
    def event_fn(type: str, **_: Any) -> Any:
        events.append(type)
        return len(events)

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(**_: Any) -> Any:
        return 'created'

    await cluster.create()
    await operator.process(type='ADDED')
    assert cluster.get()['status'] == {'event_fn': 1, 'create_fn': 'created'}

    # The results are applied at once, with no waiting; the changes will be handled later.
    pressure = asyncio.Event()
    pressure.set()
    await operator.process(body=older(cluster.get()), pressure=pressure)
    assert events == ['ADDED', 'MODIFIED']
    assert cluster.get()['status'] == {'event_fn': 2, 'create_fn': 'created'}
