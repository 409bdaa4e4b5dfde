"""
Fixtures shared by the test areas (the emulator's `k8s_emulator` comes from kopf-testing's plugin).

The isolation fixtures are not autouse here: the areas that change process-wide state (logging
configuration, imported operator sources) opt in with an autouse fixture of their own.
The helpers are fixtures, since the test modules cannot import each other (importlib mode).
"""
import asyncio
import functools
import json
import logging
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

import kopf
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import eventually, eventually_async
from kopf.testing.emulator import KubernetesEmulator

WAIT_TIMEOUT = 10.0
LOOP_ENV_VAR = 'KOPF_TEST_LOOP'  # 'uvloop': every event loop of the tests is uvloop's (tox's uvloop env)


def pytest_configure(config: pytest.Config) -> None:
    # The policy makes the loops of pytest-asyncio, of KopfRunner and of kopf.run() alike; `kopf run`
    # subprocesses use uvloop whenever it is installed, with or without this.
    loop = os.environ.get(LOOP_ENV_VAR, 'asyncio')
    if loop == 'uvloop':
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    elif loop != 'asyncio':
        raise pytest.UsageError(f'${LOOP_ENV_VAR}={loop!r} is neither asyncio nor uvloop.')


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # looptime's fake time drives asyncio's loops only: uvloop's timers follow libuv's own clock.
    if os.environ.get(LOOP_ENV_VAR, 'asyncio') == 'uvloop':
        reason = f"looptime cannot drive uvloop's clock: run with ${LOOP_ENV_VAR} unset."
        for item in items:
            if _runs_in_looptime(item):
                item.add_marker(pytest.mark.skip(reason=reason))


def _runs_in_looptime(item: pytest.Item) -> bool:
    """As looptime decides it: ``--looptime``/``--no-looptime``, then the markers, the closest one last."""
    flag = item.config.getoption('looptime', None)
    markers = list(item.iter_markers('looptime'))
    enabled = bool((markers or flag is True) and flag is not False)
    for marker in reversed(markers):  # the farthest first: the closest one decides
        enabled = bool(marker.args[0]) if marker.args else enabled
    return enabled


LOGGERS_TO_RESTORE = ['asyncio', 'aiohttp', 'aiohttp.access', 'kopf', 'kopf.objects']


@pytest.fixture()
def restore_logging() -> Iterator[None]:
    """Restore the root logger and the loggers that ``kopf.configure()`` changes."""
    root = logging.getLogger()
    root_state = (list(root.handlers), root.level)
    states = {name: (list(logging.getLogger(name).handlers), logging.getLogger(name).level,
                     logging.getLogger(name).propagate) for name in LOGGERS_TO_RESTORE}
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


@pytest.fixture()
def restore_imports(tmp_path: pathlib.Path) -> Iterator[None]:
    """Restore ``sys.path`` and forget the modules imported from the test's own files."""
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
def wait_for() -> Callable[..., Any]:
    """
    ``kopf.testing.eventually`` for the sync tests, checked often: ``wait_for(check, within=...)``.

    The check passes when it raises no ``AssertionError`` and returns anything but ``False``.
    """
    return functools.partial(eventually, within=WAIT_TIMEOUT, interval=0.01)


@pytest.fixture(name='eventually')
def eventually_fixture() -> Callable[..., Awaitable[Any]]:
    """
    ``kopf.testing.eventually_async`` for the async tests, checked often: ``await eventually(check, ...)``.

    The check runs in the test's event loop (e.g. next to an operator's tasks) and passes when it raises
    no ``AssertionError`` and returns anything but ``False``; by default, it fails after 5 seconds.
    """
    return functools.partial(eventually_async, within=5.0, interval=0.01)


# The server-side sharded lists & watches (KEP-5866, alpha in 1.36+): on in both servers of the tests, as the
# framework uses them when sharding (the gate only acts on the requests with a shardSelector: harmless to
# the others). The tests of the servers without it turn it off themselves.
SHARDED_LIST_AND_WATCH = 'ShardedListAndWatch'


@pytest.fixture()
def k8s_emulator_options() -> dict[str, Any]:
    return {'feature_gates': {SHARDED_LIST_AND_WATCH: True}}


@pytest.fixture(scope='session')
def k8s_control_plane_options(k8s_control_plane_assets: Any) -> dict[str, Any]:
    # Older kube-apiservers refuse to start with an unknown feature gate.
    output = subprocess.run([str(k8s_control_plane_assets.kube_apiserver), '--version'],
                            capture_output=True, text=True, check=False).stdout
    match = re.search(r'v(\d+)\.(\d+)', output)
    if match is None or (int(match.group(1)), int(match.group(2))) < (1, 36):
        return {}
    return {'feature_gates': {SHARDED_LIST_AND_WATCH: True}}


@pytest.fixture()
def emulator(k8s_emulator: KubernetesEmulator) -> KubernetesEmulator:
    return k8s_emulator


@pytest.fixture()
def make_registry(emulator: KubernetesEmulator) -> Callable[[], OperatorRegistry]:
    """New registries, each with a login handler for the emulator (faster than the default logins)."""

    def make_registry() -> OperatorRegistry:
        registry = OperatorRegistry()

        @kopf.on.login(registry=registry)
        def login_to_emulator(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=emulator.url)

        return registry

    return make_registry


@pytest.fixture()
def messages(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """The messages logged about the objects so far (of the per-object loggers, without their prefixes)."""

    def messages() -> list[str]:
        return [record.getMessage() for record in caplog.records if record.name == 'kopf.objects']

    return messages


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
