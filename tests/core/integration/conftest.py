"""
Operator-level integration tests: whole operators (``kopf.operator``) against the emulator.

Every test creates the CRD of ``examples/crd.yaml`` (with the status subresource) in a fresh
emulator, starts one or more operators in the test's event loop, acts on the objects via the
API as a user would do (raw HTTP), and waits for the outcomes with timeouts (never sleeps).
The emulator serves from its own thread, so the time is real; the delays are kept short.

The helpers are fixtures, since the test modules cannot import each other (importlib mode);
the user of the emulator (``cluster``) is shared with other areas: see ``tests/_cluster.py``.
"""
import asyncio
import contextlib
import logging
import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

import kopf
from kopf.testing import eventually_async
from kopf.testing.emulator import KubernetesEmulator

from ..._cluster import CRD, CRDS, GROUP, KEX, NAMESPACE, EmulatorUser

PLURAL = KEX.plural


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
async def cluster(emulator: KubernetesEmulator) -> AsyncIterator[EmulatorUser]:
    async with EmulatorUser(emulator, spec={'field': 'value'}) as cluster:
        await cluster.request('POST', CRDS, CRD)
        yield cluster


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
def operator(cluster: EmulatorUser) -> OperatorFactory:
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
    await eventually_async(lambda: watch_count(emulator) > before, within=within, interval=0.01,
                           message='The operator does not watch the objects.')


# The requests that are not activity: the re-connections of the watches, the operators' coordination.
_NOT_ACTIVITY_RESOURCES = frozenset({'kopfpeerings', 'clusterkopfpeerings', 'leases'})


@pytest.fixture
def quiet(cluster: EmulatorUser) -> Callable[..., Any]:
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
        name = f'operator-{kwargs["identity"]}' if kwargs.get('identity') else None  # in the captured logs
        self.thread = threading.Thread(target=self._main, kwargs=kwargs, daemon=True, name=name)

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
def gates() -> Iterator[list[threading.Event]]:
    """The threading events that sync handlers wait on: all of them are set at the end of the test."""
    events: list[threading.Event] = []
    yield events
    for event in events:
        event.set()
