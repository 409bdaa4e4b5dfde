"""
The orchestration of the watchers: exactly one per resource & namespace that needs watching.
"""
import asyncio
from typing import Any

import pytest

from kopf._cogs.structs.references import Resource
from kopf._core.engines.gating import HandlingGate
from kopf._core.reactor.observation import Insights
from kopf._core.reactor.orchestration import Rewatching, get_desired_keys, orchestrator

pytestmark = pytest.mark.looptime

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', namespaced=True)
POD = Resource('', 'v1', 'pods', namespaced=True)
NODE = Resource('', 'v1', 'nodes', namespaced=False)


def test_namespaced_resources_are_watched_per_namespace() -> None:
    keys = get_desired_keys({KEX, POD}, {'ns1', 'ns2'})
    assert keys == {(KEX, 'ns1'), (KEX, 'ns2'), (POD, 'ns1'), (POD, 'ns2')}


def test_clusterwide_mode_watches_all_resources_clusterwide() -> None:
    assert get_desired_keys({KEX, NODE}, {None}) == {(KEX, None), (NODE, None)}


def test_cluster_scoped_resources_are_watched_clusterwide_regardless_of_namespaces() -> None:
    assert get_desired_keys({NODE, KEX}, {'ns1'}) == {(NODE, None), (KEX, 'ns1')}
    assert get_desired_keys({NODE, KEX}, set()) == {(NODE, None)}


class FakeWatchers:
    """Watchers that do nothing but remember that they run."""

    def __init__(self) -> None:
        self.running: set[tuple[Resource, str | None]] = set()
        self.started: list[tuple[Resource, str | None]] = []

    async def __call__(self, resource: Resource, namespace: str | None) -> None:
        self.running.add((resource, namespace))
        self.started.append((resource, namespace))
        try:
            await asyncio.Event().wait()
        finally:
            self.running.discard((resource, namespace))


async def test_watchers_follow_the_insights(looptime: float) -> None:
    insights = Insights()
    watchers = FakeWatchers()
    task = asyncio.create_task(orchestrator(insights=insights, watcher_factory=watchers))

    await asyncio.sleep(1)
    assert not insights.watching.is_set()  # waits until both the resources and namespaces are known
    assert watchers.running == set()

    insights.resources = {KEX}
    insights.namespaces = {'ns1'}
    insights.ready_resources.set()
    insights.ready_namespaces.set()
    await asyncio.wait_for(insights.watching.wait(), timeout=1)
    await asyncio.sleep(0)
    assert watchers.running == {(KEX, 'ns1')}

    insights.namespaces = {'ns1', 'ns2'}
    insights.resources = {KEX, NODE}
    insights.changed.set()
    await asyncio.sleep(1)
    assert watchers.running == {(KEX, 'ns1'), (KEX, 'ns2'), (NODE, None)}

    insights.namespaces = {'ns2'}
    insights.resources = {KEX}
    insights.changed.set()
    await asyncio.sleep(1)
    assert watchers.running == {(KEX, 'ns2')}
    assert len(watchers.started) == 3  # nothing is restarted needlessly

    task.cancel()
    await asyncio.wait([task])
    assert watchers.running == set()


async def test_orchestrator_stops_all_watchers_on_exit(looptime: float) -> None:
    insights = Insights(resources={KEX, POD}, namespaces={None})
    insights.ready_resources.set()
    insights.ready_namespaces.set()
    watchers = FakeWatchers()
    task = asyncio.create_task(orchestrator(insights=insights, watcher_factory=watchers))
    await asyncio.wait_for(insights.watching.wait(), timeout=1)
    await asyncio.sleep(0)
    assert watchers.running == {(KEX, None), (POD, None)}
    task.cancel()
    await asyncio.wait([task])
    assert watchers.running == set()


async def test_the_stopping_watchers_are_awaited(looptime: float) -> None:
    stopped: list[Any] = []

    async def slow_to_stop(resource: Resource, namespace: str | None) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(3)  # e.g. the objects' workers finishing gracefully
            stopped.append((resource, namespace))

    insights = Insights(resources={KEX}, namespaces={'ns1'})
    insights.ready_resources.set()
    insights.ready_namespaces.set()
    task = asyncio.create_task(orchestrator(insights=insights, watcher_factory=slow_to_stop))
    await asyncio.wait_for(insights.watching.wait(), timeout=1)
    task.cancel()
    await asyncio.wait([task])
    assert looptime == 3
    assert stopped == [(KEX, 'ns1')]


class FakePausable:
    """Remembers the order of pausing & resuming relative to the watchers."""

    def __init__(self, watchers: FakeWatchers) -> None:
        self.watchers = watchers
        self.log: list[tuple[str, int]] = []  # (action, how many watchers ran at that moment)

    async def pause(self) -> None:
        self.log.append(('pause', len(self.watchers.running)))
        await asyncio.sleep(1)  # e.g. the daemons stopping

    def resume(self) -> None:
        self.log.append(('resume', len(self.watchers.running)))


PEERING = Resource('kopf.dev', 'v1', 'kopfpeerings', namespaced=True)


async def test_a_closed_gate_stops_the_watchers_and_pauses_after_them(looptime: float) -> None:
    insights = Insights(resources={KEX}, namespaces={'ns1', 'ns2'})
    insights.ready_resources.set()
    insights.ready_namespaces.set()
    gate = HandlingGate()
    watchers = FakeWatchers()
    pausable = FakePausable(watchers)
    task = asyncio.create_task(orchestrator(insights=insights, watcher_factory=watchers, gate=gate,
                                            pausing=pausable))
    await asyncio.wait_for(insights.watching.wait(), timeout=1)
    await asyncio.sleep(0)
    assert watchers.running == {(KEX, 'ns1'), (KEX, 'ns2')}

    blocker = gate.blocker('peering')
    await asyncio.sleep(2)
    assert watchers.running == set()
    assert pausable.log == [('pause', 0)]  # after the watchers have stopped

    blocker.unblock()
    await asyncio.sleep(1)
    assert watchers.running == {(KEX, 'ns1'), (KEX, 'ns2')}
    assert pausable.log == [('pause', 0), ('resume', 0)]  # before the watchers start again
    assert len(watchers.started) == 4  # restarted: the objects are listed anew
    task.cancel()
    await asyncio.wait([task])


async def test_the_ungated_coordinators_run_first_and_regardless_of_the_gate(looptime: float) -> None:
    insights = Insights(resources={KEX}, namespaces={'ns1'})
    insights.ready_resources.set()
    insights.ready_namespaces.set()
    gate = HandlingGate()
    watchers = FakeWatchers()

    def factory(resource: Resource, namespace: str | None) -> Any:
        if resource == PEERING:
            gate.blocker(f'peering in {namespace}')  # synchronously: blocks before any watcher starts
        return watchers(resource, namespace)

    task = asyncio.create_task(orchestrator(insights=insights, watcher_factory=factory, gate=gate,
                                            ungated=[PEERING]))
    await asyncio.sleep(1)
    assert watchers.started == [(PEERING, 'ns1')]  # no object watcher has ever started
    assert not insights.watching.is_set()  # not ready until the coordinators decide

    [blocker] = gate._blockers
    blocker.block()  # decided: a follower; the operator is ready, though it watches nothing
    await asyncio.wait_for(insights.watching.wait(), timeout=1)
    assert watchers.started == [(PEERING, 'ns1')]

    insights.namespaces = {'ns1', 'ns2'}
    insights.changed.set()
    await asyncio.sleep(1)
    assert watchers.running == {(PEERING, 'ns1'), (PEERING, 'ns2')}
    task.cancel()
    await asyncio.wait([task])
    assert watchers.running == set()


async def test_a_failed_coordinator_fails_the_orchestrator(looptime: float) -> None:
    insights = Insights(resources={KEX}, namespaces={'ns1'})
    insights.ready_resources.set()
    insights.ready_namespaces.set()

    async def failing(resource: Resource, namespace: str | None) -> None:
        if resource == PEERING:
            await asyncio.sleep(1)
            raise RuntimeError('no such peering')
        await asyncio.Event().wait()

    task = asyncio.create_task(orchestrator(insights=insights, watcher_factory=failing, gate=HandlingGate(),
                                            ungated=[PEERING]))
    with pytest.raises(RuntimeError, match='no such peering'):
        await asyncio.wait_for(task, timeout=5)
    assert looptime == 1


async def test_a_gate_change_while_stopping_the_watchers_is_not_missed(looptime: float) -> None:
    running: set[Any] = set()

    async def slow_to_stop(resource: Resource, namespace: str | None) -> None:
        running.add((resource, namespace))
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(3)  # e.g. the objects' workers finishing gracefully
            running.discard((resource, namespace))

    insights = Insights(resources={KEX}, namespaces={'ns1', 'ns2'})
    insights.ready_resources.set()
    insights.ready_namespaces.set()
    gate = HandlingGate()
    task = asyncio.create_task(orchestrator(insights=insights, watcher_factory=slow_to_stop, gate=gate))
    await asyncio.wait_for(insights.watching.wait(), timeout=1)
    await asyncio.sleep(0)
    assert running == {(KEX, 'ns1'), (KEX, 'ns2')}

    insights.namespaces = {'ns1'}
    insights.changed.set()
    await asyncio.sleep(1)  # the orchestrator is busy stopping the watcher of ns2
    gate.blocker('lease').block()  # the gate closes meanwhile: noticed once the orchestrator is free
    await asyncio.sleep(10)
    assert running == set()
    task.cancel()
    await asyncio.wait([task])


async def test_a_rewatch_restarts_all_the_watchers_and_returns_once_the_old_ones_are_stopped(
        looptime: float) -> None:
    log: list[tuple[str, str | None, float]] = []

    async def slow_to_stop(resource: Resource, namespace: str | None) -> None:
        log.append(('start', namespace, looptime_now()))
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(3)  # e.g. the objects' workers finishing gracefully
            log.append(('stop', namespace, looptime_now()))

    def looptime_now() -> float:
        return asyncio.get_running_loop().time()

    insights = Insights(resources={KEX}, namespaces={'ns1', 'ns2'})
    insights.ready_resources.set()
    insights.ready_namespaces.set()
    rewatching = Rewatching()
    task = asyncio.create_task(orchestrator(insights=insights, watcher_factory=slow_to_stop,
                                            rewatching=rewatching))
    await asyncio.wait_for(insights.watching.wait(), timeout=1)
    await asyncio.sleep(1)
    await asyncio.gather(rewatching.rewatch(), rewatching.rewatch())  # two at once: restarted once
    assert looptime == 4  # the old ones have stopped (3 s each, in parallel), the new ones are started
    await asyncio.sleep(0)
    assert sorted(log) == [('start', 'ns1', 0), ('start', 'ns1', 4), ('start', 'ns2', 0), ('start', 'ns2', 4),
                           ('stop', 'ns1', 4), ('stop', 'ns2', 4)]
    assert not rewatching.pending
    task.cancel()
    await asyncio.wait([task])
    await rewatching.rewatch()  # the orchestrator is gone: nobody waits for what never comes
