"""
Fixtures of the KopfRunner tests.

The runner invokes ``kopf run``, which configures the process-wide logging and loads the sources
(changing ``sys.path`` & ``sys.modules``): all of this is restored after every test. Handlers are
declared in the tests themselves, in a fresh registry per test, so they can signal the test.
The helpers are fixtures, since the test modules cannot import each other (importlib mode).
"""
import json
import logging
import pathlib
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kopf._core.intents.registries import OperatorRegistry
from kopf.testing.emulator import KubernetesEmulator

WAIT_TIMEOUT = 10.0


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    names = ['asyncio', 'aiohttp', 'aiohttp.access', 'kopf', 'kopf.objects']
    root = logging.getLogger()
    root_state = (list(root.handlers), root.level)
    states = {name: (list(logging.getLogger(name).handlers), logging.getLogger(name).level,
                     logging.getLogger(name).propagate) for name in names}
    try:
        yield
    finally:
        root.handlers[:] = root_state[0]
        root.setLevel(root_state[1])
        for name, (handlers, level, propagate) in states.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate


@pytest.fixture(autouse=True)
def _restore_imports(tmp_path: pathlib.Path) -> Iterator[None]:
    saved_path = list(sys.path)
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name, module in list(sys.modules.items()):
            filename = getattr(module, '__file__', None)
            if filename and pathlib.Path(filename).is_relative_to(tmp_path):
                del sys.modules[name]


@pytest.fixture(autouse=True)
def _no_leftover_runner_threads() -> Iterator[None]:
    """Every runner's thread must be over by the end of its test: a leak would hide a hang."""
    yield
    leftovers = [thread for thread in threading.enumerate() if thread.name == 'KopfRunner']
    for thread in leftovers:
        thread.join(WAIT_TIMEOUT)
    assert not [thread for thread in leftovers if thread.is_alive()]


@pytest.fixture()
def registry() -> OperatorRegistry:
    return OperatorRegistry()


@pytest.fixture()
def write_source(tmp_path: pathlib.Path) -> Callable[..., pathlib.Path]:
    def write(name: str, code: str) -> pathlib.Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(code))
        return path
    return write


@pytest.fixture()
def create_configmap() -> Callable[..., None]:
    """Create a ConfigMap in an emulator via its HTTP API, as any client would."""
    def create(emulator: KubernetesEmulator, name: str, namespace: str = 'default') -> None:
        body = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name}}
        request = urllib.request.Request(
            f'{emulator.url}/api/v1/namespaces/{namespace}/configmaps', method='POST',
            data=json.dumps(body).encode(), headers={'Content-Type': 'application/json'},
        )
        with urllib.request.urlopen(request, timeout=WAIT_TIMEOUT) as response:
            assert response.status == 201
    return create


@pytest.fixture()
def wait_for() -> Callable[[Callable[[], Any]], Any]:
    """Wait until a condition is truthy, checking it often; fail if it does not happen in time."""
    def wait(condition: Callable[[], Any], timeout: float = WAIT_TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while not (result := condition()):
            if time.monotonic() > deadline:
                pytest.fail(f'The condition was not met in {timeout} seconds.')
            time.sleep(0.01)
        return result
    return wait
