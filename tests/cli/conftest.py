"""
Fixtures of the CLI tests.

The command configures the process-wide logging and imports the operator's sources (which
changes ``sys.path`` and ``sys.modules``): all of this is restored after every test. The operators
run in-process via ``KopfRunner`` against the emulator, so the options are observed by their
effects: the logs' format, the API requests, the settings seen by the handlers.
The helpers are fixtures, since the test modules cannot import each other (importlib mode).
"""
import json
import logging
import os
import pathlib
import sys
import textwrap
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
        # Only the modules of the test's own files: re-importing the framework's modules would
        # make duplicate classes and break the next tests.
        for name, module in list(sys.modules.items()):
            filename = getattr(module, '__file__', None)
            if filename and pathlib.Path(filename).is_relative_to(tmp_path):
                del sys.modules[name]


@pytest.fixture()
def registry() -> OperatorRegistry:
    return OperatorRegistry()


@pytest.fixture()
def write_source(tmp_path: pathlib.Path) -> Callable[..., pathlib.Path]:
    """Write a (dedented) source file into the test's directory; return its path."""
    def write(name: str, code: str) -> pathlib.Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(code))
        return path
    return write


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


@pytest.fixture()
def create_configmap() -> Callable[..., None]:
    """Create a ConfigMap in the emulator via its HTTP API, as any client would."""
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
def no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """No credentials anywhere: no kubeconfig, not in a cluster."""
    monkeypatch.setenv('KUBECONFIG', str(tmp_path / 'absent-kubeconfig'))
    monkeypatch.delenv('KUBERNETES_SERVICE_HOST', raising=False)
    monkeypatch.delenv('KUBERNETES_SERVICE_PORT', raising=False)


@pytest.fixture()
def unreachable_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """Credentials for a cluster that does not listen (port 1 is never served for us)."""
    path = tmp_path / 'unreachable-kubeconfig'
    path.write_text(json.dumps({
        'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'nowhere',
        'clusters': [{'name': 'nowhere', 'cluster': {'server': 'http://127.0.0.1:1'}}],
        'users': [{'name': 'nobody', 'user': {}}],
        'contexts': [{'name': 'nowhere', 'context': {'cluster': 'nowhere', 'user': 'nobody'}}],
    }))
    monkeypatch.setenv('KUBECONFIG', str(path))
    monkeypatch.delenv('KUBERNETES_SERVICE_HOST', raising=False)


@pytest.fixture()
def kopf_env(k8s_emulator: KubernetesEmulator) -> dict[str, str]:
    """The environment for a ``kopf`` subprocess that talks to the emulator."""
    return {**os.environ, 'KUBECONFIG': str(k8s_emulator.kubeconfig_path)}
