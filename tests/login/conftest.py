"""
Fixtures for the login functions: an isolated environment (no kubeconfig, no cluster, an empty
home), kubeconfig files in temporary directories, and a fake exec credential plugin.
"""
import json
import stat
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kopf._cogs.configs.networking import StandaloneClientSettings


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No kubeconfig, no cluster, an empty home: each test sets up only what it needs."""
    for name in ['KUBECONFIG', 'KUBERNETES_SERVICE_HOST', 'KUBERNETES_SERVICE_PORT',
                 'PYKUBE_KUBERNETES_SERVICE_HOST', 'PYKUBE_KUBERNETES_SERVICE_PORT']:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / 'home'
    home.mkdir()
    monkeypatch.setenv('HOME', str(home))
    return home


@pytest.fixture()
def settings() -> StandaloneClientSettings:
    return StandaloneClientSettings()


KubeconfigWriter = Callable[..., Path]


@pytest.fixture()
def write_kubeconfig(tmp_path: Path) -> KubeconfigWriter:
    """Write a kubeconfig document (a dict, or raw text) to a file; return its path."""
    def writer(content: dict[str, Any] | str, path: Path | str = 'kube/config') -> Path:
        full_path = tmp_path / path
        full_path.parent.mkdir(parents=True, exist_ok=True)
        text = content if isinstance(content, str) else yaml.safe_dump(content)
        full_path.write_text(text)
        return full_path
    return writer


def _kubeconfig_doc(
        *,
        server: str = 'https://k8s.example.com:6443',
        cluster: dict[str, Any] | None = None,
        user: dict[str, Any] | None = None,
        context: dict[str, Any] | None = None,
        current_context: str | None = 'ctx',
) -> dict[str, Any]:
    """A single-context kubeconfig with the given extras in the cluster, user, and context."""
    doc: dict[str, Any] = {
        'apiVersion': 'v1',
        'kind': 'Config',
        'clusters': [{'name': 'clu', 'cluster': {'server': server, **(cluster or {})}}],
        'users': [{'name': 'usr', 'user': dict(user or {})}],
        'contexts': [{'name': 'ctx', 'context': {'cluster': 'clu', 'user': 'usr', **(context or {})}}],
    }
    if current_context is not None:
        doc['current-context'] = current_context
    return doc


@pytest.fixture()
def make_kubeconfig() -> Callable[..., dict[str, Any]]:
    return _kubeconfig_doc


PLUGIN_SOURCE = '''\
import json, os, sys

with open(os.environ['PLUGIN_COUNTER'], 'a') as f:
    f.write('run\\n')
with open(os.environ['PLUGIN_RECORD'], 'w') as f:
    json.dump({'argv': sys.argv[1:], 'info': os.environ.get('KUBERNETES_EXEC_INFO'),
               'stdin_is_empty': sys.stdin.read() == ''}, f)

mode = os.environ.get('PLUGIN_MODE', 'token')
info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])
if mode == 'fail':
    print('boom: run `fake-cloud login` first', file=sys.stderr)
    sys.exit(3)
if mode == 'garbage':
    print('not json at all: SECRET-GARBAGE-TOKEN')
    sys.exit(0)
status = {}
if mode == 'token':
    status['token'] = os.environ.get('PLUGIN_TOKEN', 'exec-token-SECRET')
elif mode == 'cert':
    status['clientCertificateData'] = 'CERT-PEM'
    status['clientKeyData'] = 'KEY-PEM-SECRET'
if 'PLUGIN_EXPIRATION' in os.environ:
    status['expirationTimestamp'] = os.environ['PLUGIN_EXPIRATION']
answer = {
    'apiVersion': os.environ.get('PLUGIN_API_VERSION', info['apiVersion']),
    'kind': 'ExecCredential',
}
if mode != 'no-status':
    answer['status'] = status
print(json.dumps(answer))
'''


class Plugin:
    """A fake exec credential plugin: an executable script that records its runs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / 'plugin.py'
        self.counter_path = directory / 'plugin-runs.txt'
        self.record_path = directory / 'plugin-record.json'
        self.path.write_text(f'#!{sys.executable}\n' + textwrap.dedent(PLUGIN_SOURCE))
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    @property
    def runs(self) -> int:
        return len(self.counter_path.read_text().splitlines()) if self.counter_path.exists() else 0

    @property
    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = json.loads(self.record_path.read_text())
        return record

    def exec_section(self, *, command: str | None = None, args: list[str] | None = None,
                     api_version: str = 'client.authentication.k8s.io/v1',
                     **env: str) -> dict[str, Any]:
        """The kubeconfig ``exec`` section that runs this plugin with extra PLUGIN_* variables."""
        variables = {'PLUGIN_COUNTER': str(self.counter_path), 'PLUGIN_RECORD': str(self.record_path)}
        variables.update({f'PLUGIN_{key.upper()}': value for key, value in env.items()})
        return {
            'apiVersion': api_version,
            'command': command if command is not None else str(self.path),
            'args': args or [],
            'env': [{'name': key, 'value': value} for key, value in variables.items()],
            'interactiveMode': 'Never',
        }


@pytest.fixture()
def plugin(tmp_path: Path) -> Plugin:
    # Each test gets its own script path, so remembered credentials never cross tests.
    directory = tmp_path / 'kube'
    directory.mkdir(exist_ok=True)
    return Plugin(directory)

