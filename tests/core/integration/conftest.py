"""
Operator-level integration tests: whole operators (``kopf.operator``) against the emulator.

Every test creates the CRD of ``examples/crd.yaml`` (with the status subresource) in a fresh
emulator, starts one or more operators in the test's event loop, acts on the objects via the
API as a user would do (raw HTTP), and waits for the outcomes with timeouts (never sleeps).
The emulator serves from its own thread, so the time is real; the delays are kept short.

The helpers are fixtures, since the test modules cannot import each other (importlib mode).
"""
import asyncio
import contextlib
import json
import logging
import pathlib
import subprocess
import sys
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
DIFFBASE = 'kopf.zalando.org/last-handled-configuration'

# As examples/crd.yaml (without the printer columns): KopfExample in kopf.dev, with the status subresource.
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


class Cluster:
    """A user of the cluster: arranges and inspects the objects (and their k8s-events) via the emulator."""

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
    def path(name: str | None = None, *, namespace: str = NAMESPACE, subresource: str | None = None) -> str:
        path = f'/apis/{GROUP}/v1/namespaces/{namespace}/{PLURAL}'
        return path + (f'/{name}' if name else '') + (f'/{subresource}' if subresource else '')

    async def create_namespace(self, name: str) -> None:
        await self.request('POST', '/api/v1/namespaces',
                           {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}})

    async def create(self, name: str = 'kex1', spec: Any = None, *, namespace: str = NAMESPACE,
                     metadata: dict[str, Any] | None = None, status: Any = None,
                     labels: dict[str, str] | None = None) -> dict[str, Any]:
        metadata = {**(metadata or {}), **({'labels': labels} if labels else {})}
        body = {'apiVersion': f'{GROUP}/v1', 'kind': 'KopfExample',
                'metadata': {**metadata, 'name': name, 'namespace': namespace},
                'spec': spec if spec is not None else {'field': 'value'}}
        result: dict[str, Any] = await self.request('POST', self.path(namespace=namespace), body)
        if status is not None:
            result = await self.patch(name, {'status': status}, namespace=namespace, subresource='status')
        return result

    async def patch(self, name: str, patch: Any, *, namespace: str = NAMESPACE,
                    subresource: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self.request(
            'PATCH', self.path(name, namespace=namespace, subresource=subresource), patch,
            content_type='application/merge-patch+json')
        return result

    async def delete(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> None:
        await self.request('DELETE', self.path(name, namespace=namespace))

    def get(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> dict[str, Any] | None:
        """The object as it is now (read directly from the emulator: no request is made or counted)."""
        return self.emulator.get_object(f'{PLURAL}.{GROUP}', name, namespace=namespace)

    def finalizers(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> list[str]:
        metadata = (self.get(name, namespace=namespace) or {}).get('metadata') or {}
        return list(metadata.get('finalizers') or [])

    def status(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> dict[str, Any]:
        return dict((self.get(name, namespace=namespace) or {}).get('status') or {})

    def annotations(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> dict[str, str]:
        body = self.get(name, namespace=namespace) or {}
        return dict(body.get('metadata', {}).get('annotations', {}))

    def progress_annotations(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> dict[str, str]:
        """Kopf's annotations other than the diff-base: the handlers' progress, the touch-markers."""
        return {key: value for key, value in self.annotations(name, namespace=namespace).items()
                if key.startswith('kopf.zalando.org/') and key != DIFFBASE}

    def diffbase(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> Any:
        encoded = self.annotations(name, namespace=namespace).get(DIFFBASE)
        return json.loads(encoded) if encoded is not None else None

    def events(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> list[tuple[str, str, str]]:
        """The k8s-events (core/v1) of an object: (type, reason, message) in the order of posting."""
        events = [event for event in self.emulator.list_objects('events', namespace=namespace)
                  if event.get('involvedObject', {}).get('name') == name]
        events.sort(key=lambda event: int(event['metadata']['resourceVersion']))
        return [(event['type'], event['reason'], event['message']) for event in events]

    def count(self, verb: str, name: str | None = None, *, subresource: str | None = None,
              namespace: str | None = NAMESPACE) -> int:
        """How many requests have been made to the objects (not the CRD) with this verb."""
        return self.emulator.requests.count(verb, PLURAL, group=GROUP, namespace=namespace, name=name,
                                            subresource=subresource)


class RunningOperator:
    """An operator running as a task of the test's event loop, with its own stop-flag."""

    def __init__(self, task: asyncio.Task[None], stop_flag: asyncio.Event, ready_flag: asyncio.Event) -> None:
        self.task = task
        self.stop_flag = stop_flag
        self.ready_flag = ready_flag

    async def stop(self, within: float = 10) -> None:
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


def make_settings() -> kopf.OperatorSettings:
    """The settings that make the operator react fast: short delays, timeouts, backoffs."""
    settings = kopf.OperatorSettings()
    settings.networking.error_backoffs = [0.05, 0.05, 0.05, 0.05, 0.05]
    settings.networking.request_timeout = 10
    settings.watching.reconnect_backoff = 0.01
    settings.queueing.idle_timeout = 0.5
    settings.queueing.exit_timeout = 2.0
    settings.queueing.error_delays = [0.05]
    settings.queueing.batch_window = 0.02
    settings.persistence.consistency_timeout = 2.0
    settings.process.ultimate_exiting_timeout = 5
    return settings


@pytest.fixture
def settings() -> kopf.OperatorSettings:
    return make_settings()


@pytest.fixture
def background_settings(settings: kopf.OperatorSettings) -> kopf.OperatorSettings:
    """For the daemons & timers: more time to exit (the daemons' stopping), no k8s-events to post."""
    settings.process.ultimate_exiting_timeout = 20
    settings.posting.enabled = False
    return settings


@pytest.fixture
def settings_factory() -> Callable[[], kopf.OperatorSettings]:
    return make_settings


@pytest.fixture
def operator(cluster: Cluster) -> OperatorFactory:
    """
    Run an operator (``kopf.operator``) in the background while in the context; wait until it is ready.

    ``async with operator(registry, settings) as running: ...``. On exit, the operator is stopped
    via its stop-flag and awaited, its failures are re-raised. It must be stopped by the test itself,
    not by a fixture's teardown: the operator considers all the tasks that have appeared in the loop
    since its start as its own ones, and cancels them on exit (as documented for embedding).
    """

    @contextlib.asynccontextmanager
    async def run(registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, *,
                  namespaces: Any = (NAMESPACE,), wait: bool = True, **kwargs: Any,
                  ) -> AsyncIterator[RunningOperator]:
        stop_flag, ready_flag = asyncio.Event(), asyncio.Event()
        watches = watch_count(cluster.emulator)
        task = asyncio.create_task(kopf.operator(
            registry=registry, settings=settings, standalone=True, namespaces=list(namespaces),
            stop_flag=stop_flag, ready_flag=ready_flag, **kwargs))
        running = RunningOperator(task, stop_flag, ready_flag)
        try:
            if wait:
                await asyncio.wait_for(ready_flag.wait(), timeout=5)
                await watching(cluster.emulator, watches)
            yield running
        finally:
            if not task.done():
                await running.stop()
        task.result()  # re-raise the failures of the operator

    return run


def watch_count(emulator: KubernetesEmulator) -> int:
    return emulator.requests.count('watch', PLURAL, group=GROUP)


async def watching(emulator: KubernetesEmulator, before: int, within: float = 5) -> None:
    """Wait until a new watch-stream of the objects is started (so that the operator sees new objects)."""
    deadline = time.monotonic() + within
    while watch_count(emulator) <= before:
        if time.monotonic() > deadline:
            raise AssertionError('The operator does not watch the objects.')
        await asyncio.sleep(0.01)


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


# The requests that are not activity: the re-connections of the watches, the operators' coordination.
_NOT_ACTIVITY_RESOURCES = frozenset({'kopfpeerings', 'clusterkopfpeerings', 'leases'})


@pytest.fixture
def quiet(cluster: Cluster) -> Callable[..., Any]:
    """Wait until nothing more happens to the objects: no requests for a while (the operators idle)."""

    def activity() -> dict[Any, int]:
        return {key: count for key, count in cluster.emulator.requests.snapshot().items()
                if key.verb != 'watch' and key.resource not in _NOT_ACTIVITY_RESOURCES}

    async def quiet(period: float = 0.5, within: float = 10.0) -> None:
        deadline = time.monotonic() + within
        last, stable_since = activity(), time.monotonic()
        while time.monotonic() - stable_since < period:
            if time.monotonic() > deadline:
                raise AssertionError('The operators do not settle.')
            await asyncio.sleep(0.02)
            if activity() != last:
                last, stable_since = activity(), time.monotonic()

    return quiet


class ThreadedOperator:
    """``kopf.run()`` in a thread of its own (one event loop per operator, as in separate processes)."""

    def __init__(self, **kwargs: Any) -> None:
        self.stop_flag = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._main, kwargs=kwargs, daemon=True)

    def _main(self, **kwargs: Any) -> None:
        try:
            kopf.run(stop_flag=self.stop_flag, **kwargs)
        except BaseException as e:
            self.errors.append(e)

    async def wait(self, within: float = 10) -> None:
        await asyncio.to_thread(self.thread.join, within)
        assert not self.thread.is_alive(), 'The operator has not exited.'

    async def stop(self, within: float = 10) -> None:
        self.stop_flag.set()
        await self.wait(within)
        assert self.errors == []


@pytest.fixture
def start_kopf_process() -> Callable[..., subprocess.Popen[bytes]]:
    """``kopf run ARGS`` as a subprocess (e.g. to be killed with SIGKILL), its output going to a file."""

    def start(args: list[str], env: dict[str, str], output: pathlib.Path) -> subprocess.Popen[bytes]:
        with open(output, 'w') as stdout:
            return subprocess.Popen([sys.executable, '-m', 'kopf', 'run', *args],
                                    env=env, stdout=stdout, stderr=subprocess.STDOUT)

    return start


@pytest.fixture
def threaded_operator() -> type[ThreadedOperator]:
    """The class of the operators in threads (the test modules cannot import it from here)."""
    return ThreadedOperator


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
    """The threading events that sync handlers wait on: all of them are set at the end of the test."""
    events: list[threading.Event] = []
    yield events
    for event in events:
        event.set()
