"""
The changes settled without a worker (`processing.settle_change`), against the general path.

The queueing does not start a worker for a change of an object with no worker if the settling says that it
is done with (e.g. the echoes of the timers' own patches, every tick): so the settling must never say so when
the general processing of the same event would do more (make a request, call a handler, log a message), and
it must leave the daemons & timers as the general path does (they see the object's new state, stop when
their filters stop matching). Every combination of the handlers' kinds and the changes below is given to
both, each to its own operator's scope with its own spawning engine, after the same first event: the settling
first (then, if it says no, the general path as the worker would), and the general path alone.
"""
import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import kopf
from kopf._clients.vault import Vault
from kopf._cogs.structs.bodies import RawBody, RawEvent
from kopf._cogs.structs.references import Resource
from kopf._core.engines.spawning import SpawningEngine
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.registries import OperatorRegistry
from kopf._core.reactor.contexts import Delivery, OperatorScope
from kopf._core.reactor.inventory import ResourceMemories
from kopf._core.reactor.processing import process_event, settle_change

from ...._cluster import NAMESPACE

FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'
OBJECTS = 'kopf.objects'  # the level of the per-object loggers (e.g. set by kopf.configure() in other tests)


def register(kinds: str, registry: OperatorRegistry, plural: str, calls: list[str]) -> None:
    """The handlers of the registry's variant (a few kinds, '+'-joined); the daemons & timers never call."""
    def fn(**kwargs: Any) -> None:
        calls.append(str(kwargs.get('reason') or kwargs.get('type')))

    async def daemon_fn(stopped: kopf.DaemonStopped, **_: Any) -> None:
        await stopped.wait()

    for kind in kinds.split('+'):
        if kind == 'timer':
            kopf.timer(plural, registry=registry, id='timer_fn', interval=100, initial_delay=100)(fn)
        elif kind == 'labelled-timer':
            kopf.timer(plural, registry=registry, id='timer_fn', interval=100, initial_delay=100,
                       labels={'x': 'y'})(fn)
        elif kind == 'daemon':
            kopf.daemon(plural, registry=registry, id='daemon_fn')(daemon_fn)
        elif kind == 'create':
            kopf.on.create(plural, registry=registry, id='create_fn')(fn)
        elif kind == 'event':
            kopf.on.event(plural, registry=registry, id='event_fn')(fn)
        else:
            raise ValueError(kind)


class Scope:
    """One operator's processing with its own spawning engine and memories (for the same objects)."""

    def __init__(self, registry: OperatorRegistry, settings: OperatorSettings, vault: Vault) -> None:
        self.spawner = SpawningEngine(registry=registry, settings=settings, vault=vault)
        self.scope = OperatorScope(registry=registry, settings=settings, memories=ResourceMemories(),
                                   vault=vault, spawner=self.spawner)

    async def process(self, raw_event: RawEvent, resource: Resource) -> None:
        await process_event(Delivery(raw_event, resource, NAMESPACE), scope=self.scope)

    def live_body(self, body: RawBody) -> Any:
        memory = self.scope.memories.get(body)
        spawns = memory.spawns if memory is not None else None
        return None if spawns is None else dict(spawns.body)

    def spawned(self, body: RawBody) -> tuple[list[str], list[str]]:
        """The object's scheduled timers & running daemons (by their handlers' ids)."""
        memory = self.scope.memories.get(body)
        spawns = memory.spawns if memory is not None else None
        if spawns is None:
            return [], []
        timers = sorted(str(timer.handler.id) for timer in spawns.timers.values() if timer.due is not None)
        daemons = sorted(str(daemon.handler.id) for daemon in spawns.daemons.values() if daemon.running)
        return timers, daemons


@pytest.fixture
async def scopes(registry: OperatorRegistry, settings: OperatorSettings,
                 vault: Vault) -> AsyncIterator[tuple[Scope, Scope]]:
    settled, general = Scope(registry, settings, vault), Scope(registry, settings, vault)
    yield settled, general
    await settled.spawner.shutdown()
    await general.spawner.shutdown()


# The changes: the object's metadata at creation, and what happens before the event given to both.
CHANGES = ['spec', 'same', 'unfinalized', 'unlabelled', 'deleting', 'unknown']
REGISTRIES = ['timer', 'daemon', 'labelled-timer', 'timer+daemon', 'timer+create', 'timer+event', 'create']

# Where the settling is meant to be used (and only there): the known objects with only daemons & timers,
# with our finalizer as it must be (incl. after the change), not being deleted.
SETTLED = {
    *((kinds, change) for kinds in ['timer', 'daemon', 'timer+daemon', 'labelled-timer']
      for change in ['spec', 'same']),
    ('timer', 'unlabelled'), ('daemon', 'unlabelled'), ('timer+daemon', 'unlabelled'),
    # And the echoes of our own latest patch that need nothing, of any resource: here, the create handler's
    # patch (unchanged since, or changed by a patch that changed nothing: our finalizer was removed already).
    ('create', 'same'), ('create', 'unfinalized'),
}


@pytest.mark.parametrize('change', CHANGES)
@pytest.mark.parametrize('kinds', REGISTRIES)
async def test_settling_agrees_with_the_general_path(
        registry: OperatorRegistry, cluster: Any, kex: Resource, scopes: tuple[Scope, Scope],
        requests: Callable[..., int], messages: Callable[[], list[str]], caplog: pytest.LogCaptureFixture,
        kinds: str, change: str) -> None:
    caplog.set_level(logging.INFO, logger=OBJECTS)  # with the debug logs, nothing is settled: see below
    calls: list[str] = []
    register(kinds, registry, kex.plural, calls)
    settled, general = scopes
    # A foreign finalizer too: the object stays when deleted, even with no need of our finalizer.
    await cluster.create(metadata={'finalizers': [FINALIZER, 'other/x'], 'labels': {'x': 'y'}})
    first = cluster.get()
    assert first is not None
    if change != 'unknown':
        for scope in scopes:
            await scope.process({'type': 'ADDED', 'object': first}, kex)
    if change == 'spec':
        await cluster.patch('kex1', {'spec': {'field': 'changed'}})
    elif change == 'unfinalized':
        await cluster.patch('kex1', {'metadata': {'finalizers': ['other/x']}})
    elif change == 'unlabelled':
        await cluster.patch('kex1', {'metadata': {'labels': None}})
    elif change == 'deleting':
        await cluster.delete()
    body = cluster.get()
    assert body is not None
    await asyncio.sleep(0)  # the daemons started by the first event begin running
    calls.clear()
    caplog.clear()
    before = requests()

    # The settling, then (if it says no) the general path as the worker would; vs the general path alone.
    raw_event: RawEvent = {'type': 'MODIFIED', 'object': body}
    done = settle_change(raw_event=raw_event, resource=kex, scope=settled.scope)
    assert requests() == before  # the settling makes no requests, whatever it says
    assert not calls and not messages()
    if not done:
        await settled.process({'type': 'MODIFIED', 'object': body}, kex)
    await asyncio.sleep(0)
    after_settling = (requests() - before, calls[:], messages())
    calls.clear()
    caplog.clear()
    await general.process({'type': 'MODIFIED', 'object': body}, kex)
    await asyncio.sleep(0)
    assert settled.spawned(body) == general.spawned(body)
    assert settled.live_body(body) == general.live_body(body)
    if done:
        assert after_settling == (0, [], [])
        assert (requests() - before, calls, messages()) == (0, [], [])  # the general path did nothing either
    assert done == ((kinds, change) in SETTLED)


async def test_no_settling_with_debug_logs(
        registry: OperatorRegistry, cluster: Any, kex: Resource, scopes: tuple[Scope, Scope]) -> None:
    register('timer', registry, kex.plural, [])
    settled, _ = scopes
    await cluster.create(metadata={'finalizers': [FINALIZER]})
    body = cluster.get()
    await settled.process({'type': 'ADDED', 'object': body}, kex)
    # The debug logs are on in these tests by default: the general path logs for each event, so it goes there.
    raw_event: RawEvent = {'type': 'MODIFIED', 'object': body}
    assert not settle_change(raw_event=raw_event, resource=kex, scope=settled.scope)


async def test_no_settling_without_the_spawning_engine(
        registry: OperatorRegistry, cluster: Any, kex: Resource, scopes: tuple[Scope, Scope],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=OBJECTS)
    register('timer', registry, kex.plural, [])
    settled, _ = scopes
    await cluster.create(metadata={'finalizers': [FINALIZER]})
    body = cluster.get()
    await settled.process({'type': 'ADDED', 'object': body}, kex)
    scope = OperatorScope(registry=registry, settings=settled.scope.settings, memories=settled.scope.memories,
                          vault=settled.scope.vault)  # e.g. the operator runs no daemons & timers
    assert not settle_change(raw_event={'type': 'MODIFIED', 'object': body}, resource=kex, scope=scope)
