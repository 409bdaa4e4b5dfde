"""
Coordination of the operator's replicas: which coordinators hold the operator's handling gate.

* The Kopf-compatible peering (:mod:`kopf._core.engines.peering`): one coordinator per served namespace
  (``KopfPeering``) or one cluster-wide (``ClusterKopfPeering``), run by the orchestrator next to
  the watchers (as the "ungated" resource) and following the served namespaces the same way.
* The Lease election (:mod:`kopf._core.engines.leadership`): one core task of the operator, stopped after
  the watchers and the daemons (so that the lease is released only when nothing is handled anymore).
* The sharding (:mod:`kopf._core.engines.sharding`), instead of the election: a core task as the election is;
  its gate's blocker only holds the watchers back until the first shards are taken. Then it filters the
  objects in the queueing and, when its shards change, restarts the watch-streams and forgets the objects
  given away (:class:`ShardingHandover`), without pausing the daemons & timers of the objects kept.

The peering and the election close the gate (:mod:`kopf._core.engines.gating`) while the operator must not
handle the objects; the orchestrator then stops the watchers and pauses the daemons & timers
(see :mod:`.orchestration`).
"""
import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from kopf._clients.vault import Vault
from kopf._cogs.structs.references import Resource
from kopf._core.engines import gating, leadership, peering, sharding
from kopf._core.engines.indexing import OperatorIndexers
from kopf._core.engines.spawning import SpawningEngine
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.reactor.inventory import ResourceMemories
from kopf._core.reactor.orchestration import Rewatching


def peering_resource(settings: OperatorSettings) -> Resource | None:
    """The resource that marks the peering coordinators in the orchestrator; None if standalone."""
    if settings.peering.standalone:
        return None
    if settings.peering.clusterwide:
        return peering.CLUSTER_PEERING_RESOURCES[0]
    return peering.NAMESPACED_PEERING_RESOURCES[0]


def make_peering_coordinator(
        *,
        settings: OperatorSettings,
        vault: Vault,
        gate: gating.HandlingGate,
        identity: peering.Identity,
        namespace: str | None,
) -> Coroutine[Any, Any, None]:
    """
    The coordinator of one peering; its gate's blocker is created at once (blocking until the peers are seen).
    """
    scope = f'in {namespace!r}' if namespace is not None else 'cluster-wide'
    blocker = gate.blocker(f'peering {settings.peering.name!r} {scope}')
    return _coordinate_peering(settings=settings, vault=vault, blocker=blocker, identity=identity,
                               namespace=namespace)


async def _coordinate_peering(
        *,
        settings: OperatorSettings,
        vault: Vault,
        blocker: gating.GateBlocker,
        identity: peering.Identity,
        namespace: str | None,
) -> None:
    try:
        target = await peering.detect_peering(settings=settings, vault=vault, namespace=namespace, wait=True)
        if target is None:
            blocker.discard()  # the standalone mode (in this namespace)
            await asyncio.Event().wait()  # until the namespace is gone or the operator exits
        else:
            await peering.keep_peering(settings=settings, vault=vault, target=target,
                                       own_id=identity, blocker=blocker)
    finally:
        blocker.discard()


async def lease_election(
        *,
        settings: OperatorSettings,
        vault: Vault,
        blocker: gating.GateBlocker,
        identity: peering.Identity,
) -> None:
    """A core task of the operator: the Lease election until cancelled (then the lease is released)."""
    election = leadership.LeaseElection(settings=settings, vault=vault, identity=identity, blocker=blocker)
    try:
        await election.run()
    finally:
        blocker.discard()


async def run_sharding(engine: sharding.Sharding) -> None:
    """A core task of the operator: the sharding until cancelled (then the shards are released)."""
    try:
        await engine.run()
    finally:
        engine.blocker.discard()


class ShardingHandover:
    """What the reactor does when this replica's shards change (see :class:`.sharding.Handover`)."""

    def __init__(self, *, rewatching: Rewatching, spawner: SpawningEngine, memories: ResourceMemories,
                 indexers: OperatorIndexers | None) -> None:
        super().__init__()
        self.rewatching = rewatching
        self.spawner = spawner
        self.memories = memories
        self.indexers = indexers

    async def rewatch(self) -> None:
        await self.rewatching.rewatch()

    async def forget(self, disowned: Callable[[str], bool]) -> None:
        self.memories.forget_uids(disowned)
        if self.indexers is not None:
            self.indexers.discard_uids(disowned)
        await self.spawner.disown(disowned)


class SpawningPauser:
    """Pauses & resumes the daemons & timers along with the watchers (see :mod:`.orchestration`)."""

    def __init__(self, spawner: SpawningEngine) -> None:
        super().__init__()
        self.spawner = spawner

    async def pause(self) -> None:
        await self.spawner.pause()

    def resume(self) -> None:
        # The watch-streams list the objects anew after the pause: their daemons & timers start then,
        # as for new objects; the objects deleted during the pause are not revived.
        self.spawner.resume(respawn=False)
