"""
A cluster that cannot be used: one line with the cause and the fix, never a traceback or a secret.

No kubeconfig at all, even the discovery denied (403), a port that nobody listens on.
The operators run in-process via ``KopfRunner`` (with the default logins: the piggybacked libraries
are installed here) against the emulator or against nothing at all. The broken kubeconfigs (field by
field) and the exec plugins' failures are rows of the bad inputs' table: ``tests/cli/test_bad_inputs.py``.
The credentials rejected by the API server (401) and a user without RBAC permissions (403) on any API
server, the real one too: ``tests/kubeapi/test_bad_credentials.py``.
"""
import json
import pathlib
import socket

import pytest

from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import KopfRunner, KubernetesEmulator

from .conftest import SECRET, kubeconfig_doc


@pytest.fixture()
def not_in_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv('KUBERNETES_SERVICE_HOST', raising=False)
    monkeypatch.delenv('KUBERNETES_SERVICE_PORT', raising=False)


def test_no_kubeconfig_at_all_says_where_it_was_looked_for(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, not_in_cluster: None,
        registry: OperatorRegistry,
) -> None:
    monkeypatch.delenv('KUBECONFIG', raising=False)
    monkeypatch.setenv('HOME', str(tmp_path))  # no ~/.kube/config there
    with KopfRunner(['run', '-A', '--standalone'], registry=registry, reraise=False) as runner:
        pass
    assert runner.exit_code == 1
    assert runner.stderr.splitlines()[-1] == (
        'Error: Cannot log in to the Kubernetes cluster: Ran out of valid credentials: '
        'the default logins (login_via_pykube, login_via_client) have found neither a kubeconfig '
        '($KUBECONFIG or ~/.kube/config) nor a service account (not in a cluster); '
        'create a kubeconfig or add a login handler (@kopf.on.login). '
        'See more: https://docs.kopf.dev/en/stable/authentication/'
    )
    assert 'Traceback' not in runner.output


@pytest.fixture()
def kubeconfig_with_token(k8s_emulator: KubernetesEmulator, tmp_path: pathlib.Path,
                          monkeypatch: pytest.MonkeyPatch, not_in_cluster: None) -> None:
    doc = k8s_emulator.kubeconfig
    doc['users'][0]['user'] = {'token': SECRET}
    path = tmp_path / 'kubeconfig-with-token.yaml'
    path.write_text(json.dumps(doc))
    monkeypatch.setenv('KUBECONFIG', str(path))


def test_forbidden_discovery_names_the_rbac(k8s_emulator: KubernetesEmulator, kubeconfig_with_token: None,
                                            registry: OperatorRegistry) -> None:
    # Even the discovery denied: fatal at the start (the users of real servers may discover by default).
    k8s_emulator.fail_requests(None, status=403, message='no permissions for you')
    with KopfRunner(['run', '-A', '--standalone'], registry=registry, reraise=False) as runner:
        pass
    assert runner.exit_code == 1
    assert runner.stderr.splitlines()[-1] == (
        f'Error: The Kubernetes API has denied the access (403 Forbidden) for GET {k8s_emulator.url}/api: '
        f"no permissions for you; grant the RBAC permissions to the operator's user or service account "
        f'(see https://docs.kopf.dev/en/stable/deployment/).'
    )
    assert SECRET not in runner.output


def _messages(output: str, marker: str) -> list[str]:
    """The log messages (without the time, the logger, the level) that contain the marker."""
    return [line.split('] ', 2)[-1] for line in output.splitlines() if marker in line]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize('scheme', ['http', 'https'])
def test_closed_port_is_named_in_the_retries_and_in_the_error(
        scheme: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, not_in_cluster: None,
        registry: OperatorRegistry,
) -> None:
    import kopf

    @kopf.on.startup(registry=registry)
    def few_retries(settings: kopf.OperatorSettings, **_: object) -> None:
        settings.networking.error_backoffs = [0.01, 0.02]

    port = _closed_port()
    path = tmp_path / 'kubeconfig.yaml'
    path.write_text(json.dumps(kubeconfig_doc(clusters=[{'name': 'c', 'cluster': {
        'server': f'{scheme}://127.0.0.1:{port}', 'insecure-skip-tls-verify': True}}])))
    monkeypatch.setenv('KUBECONFIG', str(path))

    with KopfRunner(['run', '-A', '--standalone'], registry=registry, reraise=False) as runner:
        pass

    address = f'{scheme}://127.0.0.1:{port}'
    crds = 'GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions'
    refused = f'connection refused to {address}'
    assert _messages(runner.output, 'will retry') == [
        f'Request attempt #1 failed; will retry: {crds} -> {refused}, retrying in 0.01 s',
        f'Request attempt #2 failed; will retry: {crds} -> {refused}, retrying in 0.02 s',
    ]
    assert _messages(runner.output, 'has failed') == [
        f'Resource observer has failed: connection refused to {address}',
    ]
    assert runner.exit_code == 1
    assert runner.stderr.splitlines()[-1] == f'Error: Cannot reach the Kubernetes API: {refused}'
    assert 'ConnectionKey' not in runner.output
    assert SECRET not in runner.output
