"""
The daemons & timers against the emulator: whole operators (``kopf.operator``) in the test's loop.

The tests create the CRD of ``examples/crd.yaml`` (with the status subresource), start operators,
act on the objects via the API as users do, and wait for the outcomes with timeouts (never sleeps).
The emulator serves from its own thread, so the time is real, and the intervals are kept short.
The helpers are fixtures, since the test modules cannot import each other (importlib mode).
"""
import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import pytest

import kopf
from kopf.testing.emulator import KubernetesEmulator

GROUP = 'kopf.dev'
PLURAL = 'kopfexamples'
NAMESPACE = 'default'
FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'

CRD = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': f'{PLURAL}.{GROUP}'},
    'spec': {
        'scope': 'Namespaced',
        'group': GROUP,
        'names': {'kind': 'KopfExample', 'plural': PLURAL, 'singular': 'kopfexample'},
        'versions': [{
            'name': 'v1', 'served': True, 'storage': True,
            'subresources': {'status': {}},
            'schema': {'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}},
        }],
    },
}


class Cluster:
    """A user of the cluster: arranges and inspects the objects via the emulator."""

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
    def path(name: str | None = None, *, subresource: str | None = None) -> str:
        path = f'/apis/{GROUP}/v1/namespaces/{NAMESPACE}/{PLURAL}'
        return path + (f'/{name}' if name else '') + (f'/{subresource}' if subresource else '')

    async def create(self, name: str = 'kex1', spec: Any = None, *,
                     labels: dict[str, str] | None = None) -> dict[str, Any]:
        metadata: dict[str, Any] = {'name': name, 'namespace': NAMESPACE}
        if labels:
            metadata['labels'] = labels
        body = {'apiVersion': f'{GROUP}/v1', 'kind': 'KopfExample', 'metadata': metadata,
                'spec': spec if spec is not None else {'field': 'value'}}
        result: dict[str, Any] = await self.request('POST', self.path(), body)
        return result

    async def patch(self, name: str, patch: Any, *, subresource: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self.request('PATCH', self.path(name, subresource=subresource), patch,
                                                    content_type='application/merge-patch+json')
        return result

    async def delete(self, name: str = 'kex1') -> None:
        await self.request('DELETE', self.path(name))

    def get(self, name: str = 'kex1') -> dict[str, Any] | None:
        """The object as it is now (read directly from the emulator: no request is made)."""
        return self.emulator.get_object(f'{PLURAL}.{GROUP}', name, namespace=NAMESPACE)

    def finalizers(self, name: str = 'kex1') -> list[str]:
        return list(((self.get(name) or {}).get('metadata') or {}).get('finalizers') or [])

    def status(self, name: str = 'kex1') -> dict[str, Any]:
        return dict((self.get(name) or {}).get('status') or {})


class RunningOperator:
    """An operator running as a task of the test's event loop, with its own stop-flag."""

    def __init__(self, task: asyncio.Task[None], stop_flag: asyncio.Event) -> None:
        self.task = task
        self.stop_flag = stop_flag

    async def stop(self, within: float = 15) -> None:
        """Stop the operator gracefully and wait for it to exit; re-raise its failure if any."""
        self.stop_flag.set()
        await asyncio.wait_for(self.task, timeout=within)


OperatorFactory = Callable[..., contextlib.AbstractAsyncContextManager[RunningOperator]]


@pytest.fixture
def emulator(k8s_emulator: KubernetesEmulator) -> KubernetesEmulator:
    return k8s_emulator


@pytest.fixture
async def cluster(emulator: KubernetesEmulator) -> AsyncIterator[Cluster]:
    async with aiohttp.ClientSession(emulator.url, timeout=aiohttp.ClientTimeout(total=10)) as session:
        cluster = Cluster(session, emulator)
        await cluster.request('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', CRD)
        yield cluster


@pytest.fixture
def make_registry(emulator: KubernetesEmulator) -> Callable[[], kopf.OperatorRegistry]:
    """New registries, each with a login handler for the emulator (faster than the default logins)."""

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
    """The settings that make the operator react fast: short delays, timeouts, backoffs."""
    settings = kopf.OperatorSettings()
    settings.networking.error_backoffs = [0.05, 0.05, 0.05]
    settings.networking.request_timeout = 10
    settings.watching.reconnect_backoff = 0.01
    settings.queueing.idle_timeout = 0.5
    settings.queueing.exit_timeout = 2.0
    settings.queueing.error_delays = [0.05]
    settings.queueing.batch_window = 0.02
    settings.persistence.consistency_timeout = 2.0
    settings.process.ultimate_exiting_timeout = 20
    settings.posting.enabled = False
    return settings


@pytest.fixture
def operator(cluster: Cluster) -> OperatorFactory:
    """
    Run an operator (``kopf.operator``) in the background while in the context; wait until it is ready.

    On exit, the operator is stopped via its stop-flag and awaited; its failures are re-raised.
    """

    @contextlib.asynccontextmanager
    async def run(registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings,
                  **kwargs: Any) -> AsyncIterator[RunningOperator]:
        stop_flag, ready_flag = asyncio.Event(), asyncio.Event()
        watches = cluster.emulator.requests.count('watch', PLURAL, group=GROUP)
        task = asyncio.create_task(kopf.operator(
            registry=registry, settings=settings, standalone=True, namespaces=[NAMESPACE],
            stop_flag=stop_flag, ready_flag=ready_flag, **kwargs))
        running = RunningOperator(task, stop_flag)
        try:
            await asyncio.wait_for(ready_flag.wait(), timeout=5)
            deadline = time.monotonic() + 5
            while cluster.emulator.requests.count('watch', PLURAL, group=GROUP) <= watches:
                assert time.monotonic() < deadline, 'The operator does not watch the objects.'
                await asyncio.sleep(0.01)
            yield running
        finally:
            if not task.done():
                await running.stop()
        task.result()

    return run


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


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)


@pytest.fixture
def messages(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """The messages logged about the objects so far (of the per-object loggers)."""

    def messages() -> list[str]:
        return [record.getMessage() for record in caplog.records if record.name == 'kopf.objects']

    return messages


@pytest.fixture
def gates() -> Iterator[list[threading.Event]]:
    """The threading events that sync daemons wait on: all of them are set at the end of the test."""
    events: list[threading.Event] = []
    yield events
    for event in events:
        event.set()
