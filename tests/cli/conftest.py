"""
Fixtures of the CLI tests.

The command configures the process-wide logging and imports the operator's sources (which
changes ``sys.path`` and ``sys.modules``): all of this is restored after every test. The operators
run in-process via ``KopfRunner`` against the emulator, so the options are observed by their
effects: the logs' format, the API requests, the settings seen by the handlers.
The helpers are fixtures, since the test modules cannot import each other (importlib mode).
"""
import json
import os
import pathlib

import pytest

from kopf.testing.emulator import KubernetesEmulator

WAIT_TIMEOUT = 10.0


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


@pytest.fixture(autouse=True)
def _isolated(restore_logging: None, restore_imports: None) -> None:
    """Every test here changes the logging and imports operator sources: both are restored."""
