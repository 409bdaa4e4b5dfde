"""
The processing of the objects' events against the emulator, with no watching or queueing.

The tests arrange the objects via the emulator's API, and then act as the watch-stream would:
they take the object's current state from the emulator and give it to the processing as an event,
again and again until the processing makes no more requests (i.e. the echoes of its own patches
cause nothing). The requests are counted by the emulator.

There is no fake time here: the emulator serves from its own thread, and the virtual time would
expire the network timeouts while waiting for it. The delays in the tests are short instead.
The user of the emulator (``cluster``) is shared with other areas: see ``tests/_cluster.py``.
"""
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from kopf._clients.vault import Vault
from kopf._cogs.structs.bodies import RawBody, RawEvent, RawEventType
from kopf._cogs.structs.references import Resource
from kopf._core.actions.lifecycles import LifeCycleFn
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.registries import OperatorRegistry
from kopf._core.reactor.contexts import Delivery, OperatorScope, never_held_back
from kopf._core.reactor.inventory import ResourceMemories
from kopf._core.reactor.processing import process_event
from kopf.testing.emulator import KubernetesEmulator

from ...._cluster import CRDS, GROUP, KEX, NAMESPACE, EmulatorUser, crd_of

# One resource with the status subresource (as most CRDs have it), one without.
PLAIN = Resource(GROUP, 'v1', 'kopfplains', kind='KopfPlain', singular='kopfplain', namespaced=True)
CRDS_ARRANGED = [crd_of(KEX), crd_of(PLAIN)]


class Operator:
    """
    The processing of one operator (its registry, settings, memories), fed with events by the tests.

    The memories can be replaced to simulate a restart of the operator.
    """

    def __init__(self, *, registry: OperatorRegistry, settings: OperatorSettings, vault: Vault,
                 cluster: EmulatorUser, emulator: KubernetesEmulator) -> None:
        self.registry = registry
        self.settings = settings
        self.vault = vault
        self.cluster = cluster
        self.emulator = emulator
        self.memories = ResourceMemories()
        self.memo: object | None = None
        self.lifecycle: LifeCycleFn | None = None
        self.last_bodies: dict[str, RawBody] = {}
        self.finished: list[bool] = []  # what the processing of each event has returned, in order

    def restart(self) -> None:
        """Forget everything in memory, as a new operator process would start."""
        self.memories = ResourceMemories()

    async def process(
            self,
            name: str = 'kex1',
            *,
            type: RawEventType | str = 'MODIFIED',
            body: RawBody | None = None,
            resource: Resource = KEX,
            pressure: Any = None,
            held_back_since: Callable[[float], bool] = never_held_back,
    ) -> RawBody:
        """Process one event of the object: its current state unless the body is given."""
        if body is None:
            body = self.cluster.get(name, resource=resource)
            assert body is not None, f'The object {name!r} does not exist.'
        self.last_bodies[name] = body
        raw_event: RawEvent = {'type': type, 'object': body}  # type: ignore[typeddict-item]
        scope = OperatorScope(registry=self.registry, settings=self.settings, memories=self.memories,
                              vault=self.vault, memobase=self.memo, lifecycle=self.lifecycle)
        delivery = Delivery(raw_event, resource, NAMESPACE, pressure, held_back_since=held_back_since)
        finished = await process_event(delivery, scope=scope)
        self.finished.append(finished)
        return body

    async def settle(self, name: str = 'kex1', *, first: RawEventType | str = 'ADDED',
                     resource: Resource = KEX, limit: int = 20) -> int:
        """
        Process the object's events as the watch-stream would deliver them, until it stops changing.

        The first event is of the given type (``None`` for the initial listing), the next ones are
        the object's states after the processing's own patches. Returns the number of events.
        When the object disappears, its deletion event is processed, and that is the end.
        """
        event_type: RawEventType | str = first
        for count in range(1, limit + 1):
            body = self.cluster.get(name, resource=resource)
            if body is None:
                await self.process(name, type='DELETED', body=self.last_bodies[name], resource=resource)
                return count
            await self.process(name, type=event_type, body=body, resource=resource)
            if self.cluster.get(name, resource=resource) == body:
                return count  # no changes, no new events (even if some patches changed nothing)
            event_type = 'MODIFIED'
        raise AssertionError(f'The object {name!r} has not settled in {limit} events.')


@pytest.fixture
def settings() -> OperatorSettings:
    settings = OperatorSettings()
    settings.networking.error_backoffs = [0.01, 0.01, 0.01]
    settings.networking.request_timeout = 10
    return settings


@pytest.fixture
def registry() -> OperatorRegistry:
    return OperatorRegistry()


@pytest.fixture
async def cluster(emulator: KubernetesEmulator) -> AsyncIterator[EmulatorUser]:
    async with EmulatorUser(emulator, spec={'field': 'value', 'items': ['item1', 'item2']}) as cluster:
        for crd in CRDS_ARRANGED:
            await cluster.request('POST', CRDS, crd)
        yield cluster


@pytest.fixture
def operator(registry: OperatorRegistry, settings: OperatorSettings, vault: Vault,
             cluster: EmulatorUser, emulator: KubernetesEmulator) -> Operator:
    return Operator(registry=registry, settings=settings, vault=vault, cluster=cluster, emulator=emulator)


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)


@pytest.fixture
def requests(emulator: KubernetesEmulator) -> Callable[..., int]:
    """The number of requests to the objects (not to the CRDs), by verb and subresource."""
    def requests(verb: str | None = None, name: str | None = None, subresource: str | None = None) -> int:
        return sum(emulator.requests.count(verb, plural, group=GROUP, name=name, subresource=subresource)
                   for plural in [KEX.plural, PLAIN.plural])
    return requests


@pytest.fixture
def kex() -> Resource:
    """The resource with the status subresource."""
    return KEX


@pytest.fixture
def plain() -> Resource:
    """The resource without the status subresource."""
    return PLAIN
