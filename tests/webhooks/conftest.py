"""
Admission end to end: operators with validating/mutating handlers and a webhook server, against the emulator.

The emulator calls the webhooks of the stored webhook configurations over TLS, verifying the server's
certificate with the configurations' ``caBundle``, as real apiservers do. The users' requests go
to the emulator via raw HTTP; the answers (codes, messages, ``Warning`` headers) are what users see.
The helpers are fixtures, since the test modules cannot import each other (importlib mode).
"""
import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

import kopf
from kopf.testing.emulator import KubernetesEmulator

GROUP = 'kopf.dev'
PLURAL = 'kopfexamples'
NAMESPACE = 'default'
MANAGED = 'auto.kopf.dev'
VALIDATING = 'validatingwebhookconfigurations.admissionregistration.k8s.io'
MUTATING = 'mutatingwebhookconfigurations.admissionregistration.k8s.io'

CRD = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': f'{PLURAL}.{GROUP}'},
    'spec': {
        'scope': 'Namespaced',
        'group': GROUP,
        'names': {'kind': 'KopfExample', 'plural': PLURAL, 'singular': 'kopfexample',
                  'shortNames': ['kopfexes', 'kopfex', 'kexes', 'kex']},
        'versions': [{
            'name': 'v1', 'served': True, 'storage': True,
            'subresources': {'status': {}},
            'schema': {'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}},
        }],
    },
}


class Answer:
    """What a user sees of an API request: the code, the body, the warnings."""

    def __init__(self, status: int, body: Any, warnings: list[str]) -> None:
        self.status = status
        self.body = body
        self.warnings = warnings

    @property
    def message(self) -> str:
        return str(self.body.get('message', '')) if isinstance(self.body, dict) else ''


class Cluster:
    """A user of the cluster: makes the API requests via the emulator, inspects the stored objects."""

    def __init__(self, session: aiohttp.ClientSession, emulator: KubernetesEmulator) -> None:
        self.session = session
        self.emulator = emulator

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = 'application/json') -> Answer:
        data = json.dumps(body).encode() if body is not None else None
        headers = {'Content-Type': content_type} if data is not None else {}
        async with self.session.request(method, path, data=data, headers=headers) as response:
            text = await response.text()
            headers = response.headers.getall('Warning', [])
            warnings = [value.split(' ', 2)[-1].strip('"') for value in headers]
            return Answer(response.status, json.loads(text) if text else None, warnings)

    @staticmethod
    def path(name: str | None = None, *, namespace: str = NAMESPACE, dry_run: bool = False) -> str:
        path = f'/apis/{GROUP}/v1/namespaces/{namespace}/{PLURAL}' + (f'/{name}' if name else '')
        return path + ('?dryRun=All' if dry_run else '')

    async def create(self, name: str = 'kex1', spec: Any = None, *, labels: dict[str, str] | None = None,
                     dry_run: bool = False) -> Answer:
        body = {'apiVersion': f'{GROUP}/v1', 'kind': 'KopfExample',
                'metadata': {'name': name, 'namespace': NAMESPACE, **({'labels': labels} if labels else {})},
                'spec': spec if spec is not None else {}}
        return await self.request('POST', self.path(dry_run=dry_run), body)

    async def patch(self, name: str, patch: Any, *, dry_run: bool = False) -> Answer:
        return await self.request('PATCH', self.path(name, dry_run=dry_run), patch,
                                  content_type='application/merge-patch+json')

    async def delete(self, name: str = 'kex1', *, dry_run: bool = False) -> Answer:
        return await self.request('DELETE', self.path(name, dry_run=dry_run))

    def get(self, name: str = 'kex1') -> dict[str, Any] | None:
        return self.emulator.get_object(f'{PLURAL}.{GROUP}', name, namespace=NAMESPACE)

    def configuration(self, kind: str, name: str = MANAGED) -> dict[str, Any] | None:
        return self.emulator.get_object(VALIDATING if kind == 'validating' else MUTATING, name)

    def webhook_names(self, kind: str, name: str = MANAGED) -> list[str]:
        configuration = self.configuration(kind, name) or {}
        return [webhook['name'] for webhook in configuration.get('webhooks') or []]


@pytest.fixture
def emulator(k8s_emulator: KubernetesEmulator) -> KubernetesEmulator:
    return k8s_emulator


@pytest.fixture
async def cluster(emulator: KubernetesEmulator) -> AsyncIterator[Cluster]:
    async with aiohttp.ClientSession(emulator.url, timeout=aiohttp.ClientTimeout(total=10)) as session:
        cluster = Cluster(session, emulator)
        answer = await cluster.request('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', CRD)
        assert answer.status < 400, answer.body
        yield cluster


@pytest.fixture
def make_registry(emulator: KubernetesEmulator) -> Callable[[], kopf.OperatorRegistry]:
    """New registries, each with a login handler for the emulator."""

    def make_registry() -> kopf.OperatorRegistry:
        registry = kopf.OperatorRegistry()

        @kopf.on.login(registry=registry)
        def login_to_emulator(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=emulator.url)

        return registry

    return make_registry


@pytest.fixture
def registry(make_registry: Callable[[], kopf.OperatorRegistry]) -> kopf.OperatorRegistry:
    return make_registry()


@pytest.fixture
def settings() -> kopf.OperatorSettings:
    """A local self-signed HTTPS server on a free port, with the managed configurations."""
    settings = kopf.OperatorSettings()
    settings.networking.error_backoffs = [0.05, 0.05, 0.05]
    settings.watching.reconnect_backoff = 0.01
    settings.queueing.exit_timeout = 2.0
    settings.process.ultimate_exiting_timeout = 5
    settings.posting.enabled = False
    settings.admission.server = kopf.WebhookServer(addr='127.0.0.1', port=0)
    settings.admission.managed = MANAGED
    return settings


Eventually = Callable[..., Any]


@pytest.fixture
def eventually() -> Eventually:
    """Wait until the condition is true (checking it often), or fail the test after the timeout."""

    async def eventually(condition: Callable[[], Any], within: float = 5.0, message: str = '') -> None:
        deadline = time.monotonic() + within
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f'The condition has not been met in {within}s. {message}')
            await asyncio.sleep(0.01)

    return eventually


OperatorFactory = Callable[..., contextlib.AbstractAsyncContextManager[asyncio.Task[None]]]


@pytest.fixture
def operator(cluster: Cluster, eventually: Eventually) -> OperatorFactory:
    """
    Run an operator while in the context; wait until it is ready and its webhooks are configured.

    ``configured`` is the number of webhooks to wait for in the managed configurations (both together).
    The operator is stopped at the exit of the context, and its failures are re-raised.
    """

    @contextlib.asynccontextmanager
    async def run(registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, *,
                  configured: int | None = None, **kwargs: Any) -> AsyncIterator[asyncio.Task[None]]:
        stop_flag, ready_flag = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(kopf.operator(
            registry=registry, settings=settings, standalone=True, namespaces=[NAMESPACE],
            stop_flag=stop_flag, ready_flag=ready_flag, **kwargs))
        try:
            await asyncio.wait_for(ready_flag.wait(), timeout=5)
            expected = configured if configured is not None else len(registry.webhooks)
            if settings.admission.managed:
                await eventually(lambda: task.done() or len(cluster.webhook_names('validating')) +
                                 len(cluster.webhook_names('mutating')) == expected,
                                 message='The webhook configurations are not managed.')
            yield task
        finally:
            stop_flag.set()
            await asyncio.wait_for(task, timeout=10)

    return run


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
