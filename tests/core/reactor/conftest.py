"""
Shared fixtures of the reactor's tests: fast settings, the emulator's credentials, a raw API client.

The tests against the emulator run in real time (the emulator serves from its own thread, and
the virtual time of looptime would expire the network timeouts instantly), so they wait for
conditions with timeouts instead of sleeping (the ``eventually`` fixture). The helpers are fixtures,
since the test modules cannot import each other (pytest runs in the importlib mode).
"""
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kopf._clients.vault import Vault
from kopf._cogs.structs.credentials import ConnectionInfo, VaultKey
from kopf._cogs.structs.references import Resource
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import Activity, ActivityHandler, HandlerId
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing.emulator import KubernetesEmulator

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', singular='kopfexample',
               namespaced=True, verbs=frozenset({'list', 'watch', 'get', 'patch'}))


def make_crd(plural: str, kind: str, group: str) -> dict[str, Any]:
    return {
        'apiVersion': 'apiextensions.k8s.io/v1',
        'kind': 'CustomResourceDefinition',
        'metadata': {'name': f'{plural}.{group}'},
        'spec': {
            'group': group,
            'scope': 'Namespaced',
            'names': {'plural': plural, 'singular': kind.lower(), 'kind': kind},
            'versions': [{
                'name': 'v1', 'served': True, 'storage': True,
                'schema': {'openAPIV3Schema': {'type': 'object',
                                               'x-kubernetes-preserve-unknown-fields': True}},
            }],
        },
    }


class Kube:
    """A minimal raw client of the emulator, to arrange the cluster's state from the tests."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def _request(self, method: str, path: str, body: Any = None, content_type: str | None = None,
                       ) -> Any:
        headers = {'Content-Type': content_type or 'application/json'} if body is not None else {}
        data = json.dumps(body).encode() if body is not None else None
        async with self.session.request(method, path, data=data, headers=headers) as response:
            text = await response.text()
            assert response.status < 400, f'{method} {path} -> {response.status}: {text}'
            return json.loads(text) if text else None

    async def create_crd(self, plural: str = 'kopfexamples', kind: str = 'KopfExample',
                         group: str = 'kopf.dev') -> None:
        await self._request('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions',
                            make_crd(plural, kind, group))

    async def delete_crd(self, name: str) -> None:
        await self._request('DELETE', f'/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}')

    async def create_namespace(self, name: str) -> None:
        await self._request('POST', '/api/v1/namespaces',
                            {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}})

    async def delete_namespace(self, name: str) -> None:
        await self._request('DELETE', f'/api/v1/namespaces/{name}')

    async def create_kex(self, name: str, namespace: str = 'default', spec: Any = None) -> dict[str, Any]:
        body = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
                'metadata': {'name': name, 'namespace': namespace}, 'spec': spec or {}}
        result: dict[str, Any] = await self._request(
            'POST', f'/apis/kopf.dev/v1/namespaces/{namespace}/kopfexamples', body)
        return result

    async def patch_kex(self, name: str, patch: Any, namespace: str = 'default') -> None:
        await self._request('PATCH', f'/apis/kopf.dev/v1/namespaces/{namespace}/kopfexamples/{name}',
                            patch, content_type='application/merge-patch+json')

    async def delete_kex(self, name: str, namespace: str = 'default') -> None:
        await self._request('DELETE', f'/apis/kopf.dev/v1/namespaces/{namespace}/kopfexamples/{name}')


@pytest.fixture
async def kube(emulator: KubernetesEmulator) -> AsyncIterator[Kube]:
    async with aiohttp.ClientSession(emulator.url, timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield Kube(session)


@pytest.fixture
async def kex_crd(kube: Kube) -> None:
    await kube.create_crd()


@pytest.fixture
def settings() -> OperatorSettings:
    """The settings that make the operator react fast: short delays, timeouts, windows."""
    settings = OperatorSettings()
    settings.networking.error_backoffs = [0.05, 0.05, 0.05]
    settings.networking.request_timeout = 10
    settings.watching.reconnect_backoff = 0.01
    settings.queueing.batch_window = 0.01
    settings.queueing.idle_timeout = 0.5
    settings.queueing.exit_timeout = 1.0
    settings.queueing.error_delays = [0.05]
    settings.process.ultimate_exiting_timeout = 10
    return settings


@pytest.fixture
async def vault(emulator: KubernetesEmulator) -> AsyncIterator[Vault]:
    vault = Vault({VaultKey('emulator'): ConnectionInfo(server=emulator.url)})
    yield vault
    await vault.close()


@pytest.fixture
def registry(emulator: KubernetesEmulator) -> OperatorRegistry:
    """A registry with a login handler for the emulator (faster than the default login functions)."""
    registry = OperatorRegistry()

    def login_to_emulator(**_: Any) -> ConnectionInfo:
        return ConnectionInfo(server=emulator.url)

    registry.activities.append(ActivityHandler(fn=login_to_emulator, id=HandlerId('login_to_emulator'),
                                               activity=Activity.AUTHENTICATION))
    return registry
