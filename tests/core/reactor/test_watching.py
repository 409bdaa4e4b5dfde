"""
The watchers against the emulator: whatever happens to the watch-streams, the latest state is processed.
"""
import asyncio
import collections
import logging
import re
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from kopf._clients.vault import Vault
from kopf._cogs.structs.references import Resource
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.reactor import pacing
from kopf._core.reactor.contexts import Delivery
from kopf._core.reactor.queueing import watcher
from kopf.testing.emulator import KubernetesEmulator

Kube = Any  # the conftest's raw client
Eventually = Callable[..., Coroutine[Any, Any, None]]

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', namespaced=True,
               verbs=frozenset({'list', 'watch'}))


class LatestStates:
    """A processor that remembers the latest processed state of every object (and checks the overlaps)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.types: dict[str, str | None] = {}
        self.active: collections.Counter[str] = collections.Counter()
        self.overlaps = 0

    async def __call__(self, delivery: Delivery) -> None:
        raw_event = delivery.raw_event
        name = raw_event['object']['metadata']['name']
        self.active[name] += 1
        self.overlaps += self.active[name] > 1
        try:
            await asyncio.sleep(0.01)  # let the events overlap with the processing
            self.values[name] = raw_event['object'].get('spec', {}).get('value')
            self.types[name] = raw_event['type']
        finally:
            self.active[name] -= 1


class GatedProcessor:
    """A processor that holds the pacer's only seat until the gate opens: a slow processing, one at a time."""

    def __init__(self, settings: OperatorSettings, vault: Vault) -> None:
        self.settings = settings
        self.vault = vault
        self.pacer = pacing.Pacer(seats=1)
        self.gate = asyncio.Event()
        self.states = LatestStates()
        self.held_back: list[bool] = []  # whether the stream was held back, as the consistency waits see it
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(watcher(settings=self.settings, vault=self.vault, resource=KEX,
                                                namespace='default', processor=self, pacer=self.pacer))

    async def __call__(self, delivery: Delivery) -> None:
        async with self.pacer.seat():  # as the real processing does
            await self.gate.wait()
            self.held_back.append(delivery.held_back_since(0))
            await self.states(delivery)


@pytest.fixture
async def gated(settings: OperatorSettings, vault: Vault, kex_crd: None,
                caplog: pytest.LogCaptureFixture) -> AsyncIterator[GatedProcessor]:
    """A watcher with the gated processor (started when the test is ready), and its debug logs."""
    caplog.set_level(logging.DEBUG, 'kopf._core.reactor.queueing')
    processor = GatedProcessor(settings, vault)
    yield processor
    if processor.task is not None:
        processor.task.cancel()
        await asyncio.wait([processor.task])


@pytest.fixture
async def states(settings: OperatorSettings, vault: Vault, kex_crd: None) -> AsyncIterator[LatestStates]:
    processor = LatestStates()
    task = asyncio.create_task(watcher(settings=settings, vault=vault, resource=KEX, namespace='default',
                                       processor=processor))
    yield processor
    task.cancel()
    await asyncio.wait([task])


async def test_latest_state_survives_the_stream_disruptions(
        states: LatestStates, kube: Kube, emulator: KubernetesEmulator, eventually: Eventually,
) -> None:
    await kube.create_kex('kex1', spec={'value': 0})
    await eventually(lambda: states.values.get('kex1') == 0)

    # Closed by the server (as on its timeout).
    assert emulator.drop_watches(path='kopfexamples') == 1
    await kube.patch_kex('kex1', {'spec': {'value': 1}})
    await eventually(lambda: states.values.get('kex1') == 1)

    # Broken mid-stream, then the reconnection fails with 5xx a few times.
    emulator.fail_requests(2, status=503, verb='watch')
    emulator.drop_watches(path='kopfexamples', abort=True)
    for value in range(2, 12):
        await kube.patch_kex('kex1', {'spec': {'value': value}})
    await eventually(lambda: states.values.get('kex1') == 11)

    # Throttled by the server (HTTP 429 with Retry-After).
    emulator.fail_requests(1, status=429, verb='watch', retry_after=0.1)
    emulator.drop_watches(path='kopfexamples')
    await kube.patch_kex('kex1', {'spec': {'value': 12}})
    await eventually(lambda: states.values.get('kex1') == 12)

    assert states.overlaps == 0
    assert emulator.requests.count('watch', 'kopfexamples') >= 5


async def test_objects_deleted_while_not_watching_are_processed_as_deleted(
        states: LatestStates, kube: Kube, emulator: KubernetesEmulator, eventually: Eventually,
) -> None:
    await kube.create_kex('kex1', spec={'value': 1})
    await kube.create_kex('kex2', spec={'value': 2})
    await eventually(lambda: states.values.get('kex1') == 1 and states.values.get('kex2') == 2)

    # Not watching for a while: the watch requests fail (even after the retries).
    emulator.fail_requests(None, status=503, verb='watch')
    emulator.drop_watches(path='kopfexamples')
    await kube.delete_kex('kex2')
    await kube.patch_kex('kex1', {'spec': {'value': 10}})
    emulator.forget_history()  # the resumption is impossible now: 410 Gone, and a relisting
    emulator.clear_faults()

    await eventually(lambda: states.types.get('kex2') == 'DELETED' and states.values.get('kex1') == 10)
    assert states.types['kex1'] is None  # it came from the relisting


async def test_watch_stream_start_and_stop_are_logged(
        settings: OperatorSettings, vault: Vault, kex_crd: None, caplog: pytest.LogCaptureFixture,
        emulator: KubernetesEmulator, eventually: Eventually,
) -> None:
    caplog.set_level(logging.DEBUG, 'kopf._core.reactor.queueing')
    task = asyncio.create_task(watcher(settings=settings, vault=vault, resource=KEX, namespace=None,
                                       processor=LatestStates()))
    await eventually(lambda: emulator.open_watches == 1)
    task.cancel()
    await asyncio.wait([task])
    messages = [rec.getMessage() for rec in caplog.records if rec.name == 'kopf._core.reactor.queueing']
    assert messages == [
        'Starting the watch-stream for kopfexamples.v1.kopf.dev cluster-wide.',
        'Stopping the watch-stream for kopfexamples.v1.kopf.dev cluster-wide.',
    ]


async def test_failing_watcher_restarts_with_delays(
        settings: OperatorSettings, vault: Vault, kex_crd: None, kube: Kube, caplog: pytest.LogCaptureFixture,
        emulator: KubernetesEmulator, eventually: Eventually,
) -> None:
    emulator.fail_requests(2, status=403, verb='list', path='kopfexamples')
    states = LatestStates()
    task = asyncio.create_task(watcher(settings=settings, vault=vault, resource=KEX, namespace='default',
                                       processor=states))
    try:
        await kube.create_kex('kex1', spec={'value': 1})
        await eventually(lambda: states.values.get('kex1') == 1)
    finally:
        task.cancel()
        await asyncio.wait([task])
    failures = [record for record in caplog.records if 'has failed' in record.getMessage()]
    assert len(failures) == 2
    assert failures[0].getMessage().startswith(
        'Watcher for kopfexamples.v1.kopf.dev@default has failed: HTTP 403')
    assert failures[0].levelno == logging.ERROR


async def test_watch_stream_is_held_back_while_the_backlog_is_full_and_nothing_is_lost(
        gated: GatedProcessor, kube: Kube, caplog: pytest.LogCaptureFixture,
        emulator: KubernetesEmulator, eventually: Eventually,
) -> None:
    gated.start()
    await eventually(lambda: emulator.open_watches == 1)
    for index in range(10):
        await kube.create_kex(f'kex{index}', spec={'value': index})
    await eventually(lambda: any('is held back' in message for message in caplog.messages))
    # At least twice the pacer's seats (1); more if several events came in one chunk of the stream.
    pattern = r"The watch-stream for kopfexamples.v1.kopf.dev in 'default' is held back: " \
              r"(\d+) objects wait for their processing."
    backlogs = [int(match.group(1)) for message in caplog.messages
                if (match := re.fullmatch(pattern, message)) is not None]
    assert backlogs and all(backlog >= 2 for backlog in backlogs)

    # Broken while held back: resumed from where it was read, with nothing lost.
    emulator.drop_watches(path='kopfexamples', abort=True)
    await kube.patch_kex('kex9', {'spec': {'value': 'last'}})
    gated.gate.set()
    await eventually(lambda: len(gated.states.values) == 10 and gated.states.values['kex9'] == 'last')
    assert {name: value for name, value in gated.states.values.items() if name != 'kex9'} == \
           {f'kex{index}': index for index in range(9)}
    assert gated.states.overlaps == 0
    assert all(gated.held_back)  # every one of them was seen while or after the stream was held back


async def test_listing_is_never_held_back_so_the_watching_starts_at_once(
        gated: GatedProcessor, kube: Kube, caplog: pytest.LogCaptureFixture,
        emulator: KubernetesEmulator, eventually: Eventually,
) -> None:
    # The listing is in memory anyway; the echoes of the patches made meanwhile come via the watching.
    for index in range(10):
        await kube.create_kex(f'kex{index}', spec={'value': index})
    gated.start()
    await eventually(lambda: emulator.open_watches == 1)  # while all but one wait for the only seat
    assert not any('is held back' in message for message in caplog.messages)
    gated.gate.set()
    await eventually(lambda: gated.states.values == {f'kex{index}': index for index in range(10)})
