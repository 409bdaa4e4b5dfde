"""
The records that the event path passes along: a delivery, the operator's scope, one object's event.

* :class:`Delivery` is what the queueing gives the processor (and the indexer) for one object's latest
  event: the event and the facts of its delivery, explicitly (not in context variables).
* :class:`OperatorScope` is what the processing needs from the operator: made once per operator.
* :class:`ObjectEvent` is one object's event in the processing: the delivery with the object's memory,
  the views of its body, the patch being accumulated, the loggers, the seat. Made once per processed event.
"""
import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from kopf._clients.vault import Vault
from kopf._cogs.structs.bodies import Body, RawBody, RawEvent
from kopf._cogs.structs.patches import Patch
from kopf._cogs.structs.references import Resource
from kopf._core.actions import lifecycles, loggers
from kopf._core.engines.spawning import SpawningEngine
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.registries import OperatorRegistry
from kopf._core.reactor import pacing
from kopf._core.reactor.inventory import ResourceMemories, ResourceMemory

__all__ = ['Delivery', 'ObjectEvent', 'OperatorScope', 'never_held_back']


def never_held_back(moment: float) -> bool:
    return False


@dataclasses.dataclass(slots=True, eq=False)
class Delivery:
    """
    One object's latest event as the queueing delivers it, with the facts of the delivery.

    ``pressure`` is set when newer events of the object arrive meanwhile (the sleeps end on it).
    ``namespace`` is the watch-stream's (``None`` if cluster-wide), not the object's.
    ``received_at`` is when the event arrived (the loop's time): the timers count from then.
    ``held_back_since(moment)`` says whether the watch-stream has been held back since the moment: by the
    back-pressure (not read), or interrupted and re-established (e.g. while the API server restarts); so the
    echoes of the patches made since then come late, but surely.
    """

    raw_event: RawEvent
    resource: Resource
    namespace: str | None = None
    pressure: asyncio.Event | None = None
    received_at: float | None = None
    held_back_since: Callable[[float], bool] = never_held_back


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OperatorScope:
    """
    What the processing needs from the operator, made once and shared by all objects' events.

    ``memobase`` is the operator's memo (every new object gets a shallow copy of it); ``indices`` are
    given to the handlers as kwargs; ``pacer`` paces the framework's own steps of all objects (None:
    unpaced); ``spawner`` runs the daemons & timers (None: they are not run, only the finalizer is kept).
    """

    registry: OperatorRegistry
    settings: OperatorSettings
    vault: Vault
    memories: ResourceMemories
    memobase: object | None = None
    lifecycle: lifecycles.LifeCycleFn | None = None
    indices: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    pacer: pacing.Pacer | None = None
    spawner: SpawningEngine | None = None


@dataclasses.dataclass(slots=True, kw_only=True)
class ObjectEvent:
    """One object's event in the processing: everything its steps need besides the operator's scope."""

    scope: OperatorScope
    delivery: Delivery
    raw_body: RawBody  # the delivery's object: read at every step
    memory: ResourceMemory
    body: Body
    patch: Patch
    logger: loggers.ObjectLogger  # for what is posted as k8s-events if configured so
    local_logger: loggers.ObjectLogger  # for the frequent technical messages, never posted
    seat: pacing.Seat | None
    watching: bool  # the resource has event handlers
    spawning: bool  # the resource has daemons or timers (run if there is a spawner)
    debug: bool  # whether the objects' debug logs are on (if not, the frequent ones are not even made)

    @property
    def gone(self) -> bool:
        return self.delivery.raw_event['type'] == 'DELETED'

    def lending(self, delay: float = 0) -> AbstractAsyncContextManager[None]:
        """Let other objects be processed while this one waits for handlers or sleeps (see :mod:`.pacing`)."""
        return self.seat.lending(delay) if self.seat is not None else contextlib.nullcontext()
