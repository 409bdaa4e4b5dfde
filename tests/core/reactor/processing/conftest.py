"""
The processing of the objects' events against the emulator, with no watching or queueing.

The tests arrange the objects via the emulator's API, and then act as the watch-stream would:
they take the object's current state from the emulator and give it to the processing as an event,
again and again until the processing makes no more requests (i.e. the echoes of its own patches
cause nothing). The requests are counted by the emulator.

There is no fake time here: the emulator serves from its own thread, and the virtual time would
expire the network timeouts while waiting for it. The delays in the tests are short instead.
"""
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from kopf._clients.vault import Vault
from kopf._cogs.structs.bodies import RawBody, RawEvent, RawEventType
from kopf._cogs.structs.credentials import ConnectionInfo, VaultKey
from kopf._cogs.structs.references import Resource
from kopf._core.actions.lifecycles import LifeCycleFn
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.registries import OperatorRegistry
from kopf._core.reactor.contexts import Delivery, OperatorScope, never_held_back
from kopf._core.reactor.inventory import ResourceMemories
from kopf._core.reactor.processing import process_event
from kopf.testing.emulator import KubernetesEmulator

GROUP = 'kopf.dev'
NAMESPACE = 'default'

# One resource with the status subresource (as most CRDs have it), one without.
KEX = Resource(GROUP, 'v1', 'kopfexamples', kind='KopfExample', singular='kopfexample',
               namespaced=True, subresources=frozenset({'status'}))
PLAIN = Resource(GROUP, 'v1', 'kopfplains', kind='KopfPlain', singular='kopfplain', namespaced=True)
FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'


def crd_of(resource: Resource) -> dict[str, Any]:
    version: dict[str, Any] = {
        'name': resource.version, 'served': True, 'storage': True,
        'schema': {'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}},
    }
    if 'status' in resource.subresources:
        version['subresources'] = {'status': {}}
    return {
        'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
        'metadata': {'name': f'{resource.plural}.{resource.group}'},
        'spec': {'group': resource.group, 'scope': 'Namespaced', 'versions': [version],
                 'names': {'plural': resource.plural, 'singular': resource.singular, 'kind': resource.kind}},
    }


class Cluster:
    """Arranges the objects via the emulator's API, as a user (or another controller) would do."""

    def __init__(self, session: aiohttp.ClientSession, emulator: KubernetesEmulator) -> None:
        self.session = session
        self.emulator = emulator

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = 'application/json') -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {'Content-Type': content_type} if data is not None else {}
        async with self.session.request(method, path, data=data, headers=headers) as response:
            text = await response.text()
            assert response.status < 400, f'{method} {path} -> {response.status}: {text}'
            return json.loads(text) if text else None

    @staticmethod
    def path(resource: Resource, name: str | None = None, subresource: str | None = None) -> str:
        path = f'/apis/{resource.group}/{resource.version}/namespaces/{NAMESPACE}/{resource.plural}'
        return path + (f'/{name}' if name else '') + (f'/{subresource}' if subresource else '')

    async def create(self, name: str = 'kex1', *, resource: Resource = KEX, **fields: Any) -> RawBody:
        """An object with the given fields; ``metadata`` is merged with the name & namespace."""
        metadata = {'name': name, 'namespace': NAMESPACE, **fields.pop('metadata', {})}
        spec = fields.pop('spec', {'field': 'value', 'items': ['item1', 'item2']})
        body = {'apiVersion': resource.api_version, 'kind': resource.kind,
                'metadata': metadata, 'spec': spec, **fields}
        status = body.pop('status', None)
        result: RawBody = await self.request('POST', self.path(resource), body)
        if status is not None:
            result = await self.patch(name, {'status': status}, resource=resource,
                                      subresource='status' if 'status' in resource.subresources else None)
        return result

    async def patch(self, name: str, patch: Any, *, resource: Resource = KEX,
                    subresource: str | None = None) -> RawBody:
        result: RawBody = await self.request('PATCH', self.path(resource, name, subresource), patch,
                                             content_type='application/merge-patch+json')
        return result

    async def delete(self, name: str, *, resource: Resource = KEX) -> None:
        await self.request('DELETE', self.path(resource, name))

    def get(self, name: str = 'kex1', *, resource: Resource = KEX) -> RawBody | None:
        """The object as it is now in the emulator (no API request is made, none is counted)."""
        obj = self.emulator.get_object(f'{resource.plural}.{resource.group}', name, namespace=NAMESPACE)
        return obj  # type: ignore[return-value]


class Operator:
    """
    The processing of one operator (its registry, settings, memories), fed with events by the tests.

    The memories can be replaced to simulate a restart of the operator.
    """

    def __init__(self, *, registry: OperatorRegistry, settings: OperatorSettings, vault: Vault,
                 cluster: Cluster, emulator: KubernetesEmulator) -> None:
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
def emulator(k8s_emulator: KubernetesEmulator) -> KubernetesEmulator:
    return k8s_emulator


@pytest.fixture
async def vault(emulator: KubernetesEmulator) -> AsyncIterator[Vault]:
    vault = Vault({VaultKey('emulator'): ConnectionInfo(server=emulator.url)})
    yield vault
    await vault.close()


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
async def cluster(emulator: KubernetesEmulator) -> AsyncIterator[Cluster]:
    async with aiohttp.ClientSession(emulator.url, timeout=aiohttp.ClientTimeout(total=10)) as session:
        cluster = Cluster(session, emulator)
        for resource in [KEX, PLAIN]:
            await cluster.request('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions',
                                  crd_of(resource))
        yield cluster


@pytest.fixture
def operator(registry: OperatorRegistry, settings: OperatorSettings, vault: Vault,
             cluster: Cluster, emulator: KubernetesEmulator) -> Operator:
    return Operator(registry=registry, settings=settings, vault=vault, cluster=cluster, emulator=emulator)


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)


@pytest.fixture
def messages(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """The messages logged about the objects so far (without the objects' prefixes)."""
    def messages() -> list[str]:
        return [record.getMessage() for record in caplog.records if record.name == 'kopf.objects']
    return messages


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
