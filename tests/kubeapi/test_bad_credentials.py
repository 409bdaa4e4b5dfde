"""
Credentials that the API server rejects (401) or that have no RBAC permissions (403), on any API server.

The same operator (``KopfRunner`` with the default logins) on the emulator (by default) and on the real
control plane (tox's ``realapi`` env): the same one line with the cause and the fix, no traceback, and
never the credentials in any log line or exception text. On the real server, the token is simply unknown
and the user (``add_user``) has no RBAC bindings; the emulator accepts only other tokens
(``accept_tokens``) and denies like RBAC by its injected failures (it has no RBAC of its own).

And the credentials that work, of every kind the server takes (a token, a client certificate, a password),
in the most talkative run (``--debug``, a traceback, the log lines posted as k8s-events): none of them in
anything printed or posted.

The kubeconfigs that cannot be used at all, the denied discovery, a closed port:
``tests/cli/test_bad_cluster.py``.
"""
import base64
import gc
import json
import pathlib
import uuid
from typing import Any

import pytest
import yaml

import kopf
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import KopfRunner, eventually

pytestmark = pytest.mark.kube_api

SECRET = 'sEcReT-tOkEn-in-the-kubeconfig'
REJECTION = ('Ran out of valid credentials: the API server rejected the credentials (401 Unauthorized), '
             'and the login handlers have brought no new ones; fix or renew the token or the client '
             'certificate (in the kubeconfig or in the login handlers). '
             'See more: https://docs.kopf.dev/en/stable/authentication/')
CRDS = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions'
CONFIGMAPS = '/api/v1/configmaps'


@pytest.fixture(autouse=True)
def _isolated(restore_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator configures the process-wide logging: restored after every test. Not in a cluster."""
    monkeypatch.delenv('KUBERNETES_SERVICE_HOST', raising=False)
    monkeypatch.delenv('KUBERNETES_SERVICE_PORT', raising=False)


def _with_user(kubeconfig_path: pathlib.Path, user: dict[str, Any], path: pathlib.Path) -> pathlib.Path:
    """A copy of the kubeconfig (its server and CA) with other credentials of its current user."""
    doc = yaml.safe_load(kubeconfig_path.read_text())
    context = next(c['context'] for c in doc['contexts'] if c['name'] == doc['current-context'])
    doc['users'] = [{'name': context['user'], 'user': user}]
    path.write_text(json.dumps(doc))
    return path


def _secrets_of(kubeconfig_path: pathlib.Path) -> list[str]:
    """The credentials in a kubeconfig (tokens, keys; also decoded): none may show up anywhere."""
    doc = yaml.safe_load(kubeconfig_path.read_text())
    found: list[str] = []
    for user in doc['users']:
        for field in ('token', 'client-key-data', 'password'):
            value = user['user'].get(field)
            if value:
                found.append(value)
                if field == 'client-key-data':
                    key = base64.b64decode(value).decode()
                    found.extend(line for line in key.splitlines() if line and not line.startswith('-----'))
    return found


@pytest.mark.parametrize('verbosity', [[], ['--verbose'], ['--debug']])
def test_rejected_credentials_are_named_at_every_verbosity(
        verbosity: list[str], k8s_api: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
) -> None:
    if not k8s_api.is_real:
        k8s_api.server.accept_tokens({'another-token'})  # the emulator accepts any token by default
    path = _with_user(k8s_api.kubeconfig_path, {'token': SECRET}, tmp_path / 'kubeconfig-with-token.yaml')
    monkeypatch.setenv('KUBECONFIG', str(path))

    with KopfRunner(['run', '-A', '--standalone', *verbosity], registry=OperatorRegistry(),
                    reraise=False) as runner:
        pass
    gc.collect()  # the never-awaited failures of tasks are reported by asyncio when the tasks are collected

    assert runner.exit_code == 1
    assert type(runner.exception).__name__ == 'LoginError'
    assert str(runner.exception) == REJECTION
    assert f'Credentials retriever has failed: {REJECTION}' in runner.output
    if '--debug' not in verbosity:  # with --debug, the error propagates as is, with its traceback
        last_line = runner.stderr.splitlines()[-1]
        assert last_line == f'Error: Cannot log in to the Kubernetes cluster: {REJECTION}'
    assert 'Task exception was never retrieved' not in runner.output + caplog.text
    assert SECRET not in runner.output + caplog.text + repr(runner.exception)


def test_forbidden_access_names_the_rbac(
        k8s_api: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
) -> None:
    # A user with no RBAC permissions: the discovery is allowed (for all users), the resources are not.
    user = f'nobody-{uuid.uuid4().hex[:8]}'
    denials = {  # what real servers say for the operator's requests (the CRDs, the handled resource)
        CRDS: f'customresourcedefinitions.apiextensions.k8s.io is forbidden: User "{user}" cannot list '
              f'resource "customresourcedefinitions" in API group "apiextensions.k8s.io" '
              f'at the cluster scope',
        CONFIGMAPS: f'configmaps is forbidden: User "{user}" cannot list resource "configmaps" '
                    f'in API group "" at the cluster scope',
    }
    if k8s_api.is_real:
        path = k8s_api.server.add_user(user, kubeconfig_path=tmp_path / 'nobody.kubeconfig')
    else:
        path = _with_user(k8s_api.kubeconfig_path, {'token': SECRET}, tmp_path / 'nobody.kubeconfig')
        for denied, message in denials.items():
            k8s_api.server.fail_requests(None, status=403, path=f'^{denied}$', message=message)
    monkeypatch.setenv('KUBECONFIG', str(path))
    url = yaml.safe_load(path.read_text())['clusters'][0]['cluster']['server'].rstrip('/')
    registry = OperatorRegistry()

    @kopf.on.event('configmaps', registry=registry)
    def seen(**_: Any) -> None:
        pass

    with KopfRunner(['run', '-A', '--standalone'], registry=registry, reraise=False) as runner:
        eventually(lambda: _assert_in('Watcher for configmaps', caplog.text))

    assert runner.exit_code == 0  # the operator keeps retrying: the permissions can be granted meanwhile
    assert 'Traceback' not in runner.output
    messages = [line.split('] ', 2)[-1] for line in runner.output.splitlines()]
    assert (f'The custom resource definitions cannot be watched, so the resources are scanned only once; '
            f'the CRDs created or deleted later will not be noticed: '
            f'HTTP 403 Forbidden for GET {url}{CRDS}: {denials[CRDS]}') in messages
    watcher_failures = [message for message in messages if message.startswith('Watcher for configmaps')]
    assert watcher_failures[0] == (
        f'Watcher for configmaps.v1@None has failed: '
        f'HTTP 403 Forbidden for GET {url}{CONFIGMAPS}: {denials[CONFIGMAPS]}; '
        f"grant the RBAC permissions to the operator's user or service account "
        f'(see https://docs.kopf.dev/en/stable/deployment/); restarting in 1 seconds.'
    )
    for secret in _secrets_of(path):
        assert secret not in runner.output + caplog.text


def _assert_in(part: str, text: str) -> None:
    assert part in text, f'{part!r} is not logged yet.'


@pytest.mark.real_apiserver  # the emulator serves plain HTTP: no certificates to distrust
def test_untrusted_server_certificate_is_named(
        k8s_control_plane: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
) -> None:
    from kopf.testing.apiserver import pki

    other_ca = pki.CertificateAuthority.generate('another-ca')
    doc = yaml.safe_load(k8s_control_plane.kubeconfig_path.read_text())
    doc['clusters'][0]['cluster']['certificate-authority-data'] = base64.b64encode(other_ca.cert_pem).decode()
    path = tmp_path / 'wrong-ca.kubeconfig'
    path.write_text(json.dumps(doc))
    monkeypatch.setenv('KUBECONFIG', str(path))
    registry = OperatorRegistry()

    @kopf.on.startup(registry=registry)
    def few_retries(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.networking.error_backoffs = [0.01]

    with KopfRunner(['run', '-A', '--standalone'], registry=registry, reraise=False) as runner:
        pass
    assert runner.exit_code == 1
    assert runner.stderr.splitlines()[-1] == (
        f'Error: Cannot reach the Kubernetes API: the TLS certificate of {k8s_control_plane.url} cannot be '
        f'verified: self-signed certificate in certificate chain; trust the CA of the server '
        f'(the cluster\'s "certificate-authority-data" or "certificate-authority" in the kubeconfig)'
    )
    assert 'Traceback' not in runner.output
    for secret in _secrets_of(path):
        assert secret not in runner.output + caplog.text


def _kubeconfigs(k8s_api: Any, tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every kind of credentials that the API server accepts, each in a kubeconfig of its own."""
    if not k8s_api.is_real:  # the emulator accepts any credentials (it authenticates nobody)
        return {
            'token': _with_user(k8s_api.kubeconfig_path, {'token': SECRET}, tmp_path / 'token.yaml'),
            'password': _with_user(k8s_api.kubeconfig_path, {'username': 'admin', 'password': SECRET},
                                   tmp_path / 'password.yaml'),
        }
    doc = yaml.safe_load(k8s_api.kubeconfig_path.read_text())
    paths = {}
    for context in doc['contexts']:  # the admin's client certificate, and the admin's static token
        user = next(u['user'] for u in doc['users'] if u['name'] == context['context']['user'])
        kind = 'token' if user.get('token') else 'certificate'
        paths[kind] = tmp_path / f'{kind}.yaml'
        paths[kind].write_text(json.dumps({**doc, 'current-context': context['name']}))
    return paths


@pytest.mark.parametrize('kind', ['token', 'certificate', 'password'])
def test_no_credential_in_anything_a_debug_run_prints_or_posts(
        kind: str, k8s_api: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
) -> None:
    # The most talkative run: --debug (every request, the logins), an exception's traceback, a retry,
    # the handlers' messages posted as k8s-events, and the operator's own k8s-events.
    import kubernetes

    kubeconfigs = _kubeconfigs(k8s_api, tmp_path)
    if kind not in kubeconfigs:
        pytest.skip(f'This API server takes no {kind} credentials.')
    path = kubeconfigs[kind]
    secrets = _secrets_of(path)
    assert secrets  # else the test checks nothing
    monkeypatch.setenv('KUBECONFIG', str(path))
    namespace = f'test-{uuid.uuid4().hex[:8]}'
    registry = OperatorRegistry()
    calls: list[int] = []

    @kopf.on.startup(registry=registry)
    def post_the_logs(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.loggers = True  # the framework's and the handlers' log lines as k8s-events

    @kopf.on.create('configmaps', registry=registry, backoff=0.1)
    def create_fn(retry: int, logger: kopf.Logger, **_: Any) -> dict[str, str]:
        calls.append(retry)
        if not retry:
            raise ValueError('The first attempt fails with a traceback.')
        logger.info('Handled on the retry.')
        return {'message': 'done'}

    def events() -> str:
        items = core.list_namespaced_event(namespace).items
        return '\n'.join(f'{e.reason}: {e.message}' for e in items)

    client = kubernetes.config.new_client_from_config(config_file=str(path))
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespace({'metadata': {'name': namespace}})
    try:
        with KopfRunner(['run', '--standalone', '--debug', '-n', namespace], registry=registry,
                        timeout=60) as runner:
            core.create_namespaced_config_map(namespace, {'metadata': {'name': 'secretive'}})
            eventually(lambda: _assert_in("Handler 'create_fn' succeeded.", caplog.text), within=30)
            eventually(lambda: _assert_in('Handled on the retry.', events()), within=30)
        printed = runner.output + caplog.text + events() + repr(runner.exception)
    finally:
        core.delete_namespace(namespace)
        client.close()

    assert calls == [0, 1]
    assert 'Traceback' in runner.output  # the first attempt's exception, with its traceback
    assert 'The first attempt fails with a traceback.' in printed  # the handler's failure, posted
    assert "Activity 'login_via_client' succeeded." in printed  # the logins' debug lines are there
    for secret in secrets:
        assert secret not in printed
