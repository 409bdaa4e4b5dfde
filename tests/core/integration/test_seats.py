"""
The bounds of the framework's own work as the settings set them: the processing's seats, the timers' seats,
and the delay after which a running handler or timer function lends its seat to others.

Whole operators against the emulator; the functions observe how many of them run at once.
"""
import asyncio
import logging
import time
from typing import Any

import pytest

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Any  # the conftest's factory of running operators (async context managers)
Eventually = Any

pytestmark = pytest.mark.usefixtures('background_settings')


@pytest.mark.parametrize('seats, lending_delay, expected_peak', [
    (1, 60, 1),  # one seat, never lent while a handler runs: one handler at a time
    (1, 0.05, 3),  # one seat, lent out by the slow handlers: all of them at once
    (100, 60, 3),  # enough seats for all: all of them at once
])
async def test_slow_handlers_run_at_once_as_the_processing_seats_and_lending_allow(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually,
        seats: int, lending_delay: float, expected_peak: int) -> None:
    settings.queueing.processing_seats = seats
    settings.execution.lending_delay = lending_delay
    handled: set[str] = set()
    running: set[str] = set()
    peak = [0]

    @kopf.on.create('kopfexamples', registry=registry)
    async def create_fn(name: str, **_: Any) -> None:
        running.add(name)
        peak[0] = max(peak[0], len(running))
        await asyncio.sleep(0.3)
        running.discard(name)
        handled.add(name)

    for name in ['kex1', 'kex2', 'kex3']:
        await cluster.create(name)
    async with operator(registry, settings):
        await eventually(lambda: len(handled) == 3, within=10)
    assert peak[0] == expected_peak


@pytest.mark.parametrize('seats', [5, 20])
async def test_timers_due_at_once_are_started_by_the_timer_seats(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, seats: int) -> None:
    settings.background.timer_seats = seats
    count = 60
    calls: set[str] = set()
    max_calls = [0]

    @kopf.timer('kopfexamples', registry=registry, interval=60, initial_delay=0.5)
    async def ticker(name: str, **_: Any) -> str:
        calls.add(name)
        running = sum(1 for task in asyncio.all_tasks() if task.get_coro().__qualname__ == 'Timers._run')
        max_calls[0] = max(max_calls[0], running)
        return 'ticked'  # a result: every call patches the object's status (slowly, see below)

    await asyncio.gather(*(cluster.create(f'kex{i}') for i in range(count)))
    cluster.emulator.add_latency(0.1, verb='patch', path='/status')
    async with operator(registry, settings):
        await eventually(lambda: len(calls) == count, within=30)
    assert seats <= max_calls[0] <= seats + 1  # all due at once: as many as the seats, no more


@pytest.mark.parametrize('lending_delay, expected_peak', [
    (60, 1),  # never lent while the function runs: one function at a time
    (0.05, 3),  # lent out by the slow functions: all of them at once
])
async def test_slow_timer_functions_lend_their_seats_after_the_lending_delay(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, lending_delay: float, expected_peak: int) -> None:
    settings.background.timer_seats = 1
    settings.execution.lending_delay = lending_delay
    ticked: set[str] = set()
    running: set[str] = set()
    peak = [0]

    @kopf.timer('kopfexamples', registry=registry, interval=60)
    async def slow(name: str, **_: Any) -> None:
        running.add(name)
        peak[0] = max(peak[0], len(running))
        await asyncio.sleep(0.3)
        running.discard(name)
        ticked.add(name)

    await asyncio.gather(*(cluster.create(f'kex{i}') for i in range(3)))
    async with operator(registry, settings):
        await eventually(lambda: len(ticked) == 3, within=10)
    assert peak[0] == expected_peak


def _seated_by_one(kind: str, registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings,
                   called: dict[str, float]) -> None:
    """A handler (of the processing) or a timer, with one seat for them, noting its first call per object."""
    if kind == 'handler':
        settings.queueing.processing_seats = 1

        @kopf.on.create('kopfexamples', registry=registry)
        def create_fn(name: str, **_: Any) -> str:
            called.setdefault(name, time.monotonic())
            return 'done'  # a result: the status is patched after the call

    else:
        settings.background.timer_seats = 1

        @kopf.timer('kopfexamples', registry=registry, interval=60, id='create_fn')
        def timer_fn(name: str, **_: Any) -> str:
            called.setdefault(name, time.monotonic())
            return 'done'  # a result: the status is patched after every call


@pytest.mark.parametrize('kind, lending_delay, expected_spread', [
    ('handler', 60, (0.9, 5)),  # never lent during the requests: one object's patch (0.5 s) after another's
    ('handler', 0.05, (0, 0.4)),  # lent out while the patch is in flight: all handlers at once
    ('timer', 0.05, (0.9, 5)),  # the timers' hands bound the calls waiting for the API: not lent in flight
])
async def test_seats_are_lent_while_the_patches_are_in_flight(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually,
        kind: str, lending_delay: float, expected_spread: tuple[float, float]) -> None:
    settings.execution.lending_delay = lending_delay
    called: dict[str, float] = {}
    _seated_by_one(kind, registry, settings, called)

    for name in ['kex1', 'kex2', 'kex3']:
        await cluster.create(name)
    cluster.emulator.add_latency(0.5, verb='patch')
    async with operator(registry, settings):
        await eventually(lambda: len(called) == 3, within=10)
    spread = max(called.values()) - min(called.values())
    assert expected_spread[0] <= spread <= expected_spread[1]


@pytest.mark.parametrize('kind', ['handler', 'timer'])
async def test_seats_are_lent_during_the_retries_backoffs(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, kind: str) -> None:
    settings.execution.lending_delay = 60  # not lent during the functions and the requests in flight
    settings.networking.error_backoffs = [2]
    called: dict[str, float] = {}
    _seated_by_one(kind, registry, settings, called)

    for name in ['kex1', 'kex2']:
        await cluster.create(name)
    cluster.emulator.fail_requests(1, status=503, verb='patch', path='/status')  # the first result's, in 2 s
    async with operator(registry, settings):
        await eventually(lambda: len(called) == 2, within=10)
        # The other object is handled during the first one's backoff, not after it.
        assert max(called.values()) - min(called.values()) < 1
        for name in ['kex1', 'kex2']:
            await eventually(lambda name=name: cluster.status(name).get('create_fn') == 'done', within=10)


# The server's patience is short (20 events waiting for 0.1 s, not 200): the case happens however fast or slow
# the operator and the test's own creations are (with 200, the socket buffers could absorb the burst on a busy
# machine, and the case would not happen).
@pytest.mark.parametrize('k8s_emulator_options', [
    pytest.param({'watcher_capacity': 20}, id='short-patience'),
])
async def test_a_held_back_watch_ended_by_the_server_loses_nothing(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, caplog: pytest.LogCaptureFixture) -> None:
    # One seat: the watch-stream is held back while 2 objects wait; a burst of big objects fills the sockets,
    # and the server ends the stream (as kube-apiserver does): it is re-established from the last version.
    caplog.set_level(logging.INFO, logger='kopf.objects')  # the usual logs: the echoes skipped, not processed
    settings.queueing.processing_seats = 1
    calls: list[str] = []

    @kopf.on.create('kopfexamples', registry=registry)
    async def create_fn(name: str, **_: Any) -> str:
        calls.append(name)
        await asyncio.sleep(0.02)  # slower than the creations (and quicker than the lending delay: seated)
        return name

    names = [f'kex{index}' for index in range(200)]
    async with operator(registry, settings):
        for name in names:  # ~20 MB of events for the creations alone, more with the patches' echoes
            await cluster.create(name, {'field': 'x' * 100_000})
        await eventually(lambda: len(calls) >= len(names), within=60)
        await eventually(lambda: all((cluster.status(name) or {}).get('create_fn') == name for name in names),
                         within=60)
        assert cluster.emulator.terminated_watches  # the case itself: the server has ended the stream
    assert sorted(calls) == sorted(names)  # each once: nothing lost, nothing handled twice
