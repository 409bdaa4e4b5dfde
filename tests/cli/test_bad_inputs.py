"""
Bad inputs, one table: each row is what goes wrong and the exact message the operator logs for it.

Every row runs a whole operator (``kopf run`` via ``KopfRunner``, with the default logins) against
the emulator (or against nothing, if it cannot even log in). For the rows the operator can survive,
the check is that nothing crashes (no traceback, the exit code 0), nothing is lost (every change of
the object handled, each exactly once, unless the row says otherwise), and the object's handling
resumes after the bad input. For the rows it cannot survive (a kubeconfig that cannot be used at all),
the check is one line with the cause and the fix, no traceback, no secret, the exit code 1.

Kept elsewhere, not repeated here (each a table of its own, with the same checks):

* garbage in Kopf's own annotations — the handlers' progress records (``kopf.zalando.org/<handler>``)
  and the diff-base (``kopf.zalando.org/last-handled-configuration``): not JSON, JSON of a wrong
  type, fields of wrong types: ``tests/core/integration/test_unreadable_records.py``;
* the kubeconfig's every field, one login function at a time (no operator around them):
  ``tests/login/test_login_kubeconfig.py``, the exec plugins' failure modes (no status, no
  credentials, a bad expiration, another API version, interactive plugins, not executable):
  ``tests/login/test_login_execplugins.py``;
* the watch-stream's every kind of garbage line (cut mid-line, invalid UTF-8, not an object, no
  type, an unknown type) for the client alone: ``tests/clients/test_watching.py``;
* the credentials rejected for good, the RBAC's 403, a closed port: ``tests/cli/test_bad_cluster.py``.
"""
import dataclasses
import functools
import json
import pathlib
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

import kopf
from kopf.testing import KopfRunner, KubernetesEmulator

from .conftest import SECRET, kubeconfig_doc

GROUP, PLURAL, NAMESPACE = 'kopf.dev', 'kopfexamples', 'default'
OBJECT_PATH = f'/apis/{GROUP}/v1/namespaces/{NAMESPACE}/{PLURAL}'
HTML = b'<html><body><h1>502 Bad Gateway</h1></body></html>'
WAIT_TIMEOUT = 10.0
LOG_LINE = re.compile(r'^\[[^]]+\] (?P<logger>\S+)\s+\[(?P<level>\w+)\s*\] (?P<message>.*)$')
CRD = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': f'{PLURAL}.{GROUP}'},
    'spec': {
        'scope': 'Namespaced', 'group': GROUP,
        'names': {'kind': 'KopfExample', 'plural': PLURAL, 'singular': 'kopfexample'},
        'versions': [{'name': 'v1', 'served': True, 'storage': True, 'subresources': {'status': {}},
                      'schema': {'openAPIV3Schema': {'type': 'object',
                                                     'x-kubernetes-preserve-unknown-fields': True}}}],
    },
}


def _exec_user(command: str, *args: str) -> dict[str, Any]:
    return kubeconfig_doc(users=[{'name': 'u', 'user': {'exec': {
        'apiVersion': 'client.authentication.k8s.io/v1', 'command': command, 'args': list(args),
        'interactiveMode': 'Never', 'installHint': 'Install it with: pip install fake-cloud-cli',
    }}}])


def _nested(depth: int) -> Any:
    value: Any = 'bottom'
    for _ in range(depth):
        value = {'level': value}
    return value


# An exec credential plugin (a Python script): its token comes from a file next to it, so that a
# test can rotate it; with "fail" or "garbage" in that file, it fails or prints garbage instead.
PLUGIN = '''
import json, pathlib, sys
token = (pathlib.Path(sys.argv[0]).parent / 'plugin-token.txt').read_text().strip()
if token == 'fail':
    sys.stderr.write('fake-cloud: the session has expired; run `fake-cloud login`\\n')
    sys.exit(3)
if token == 'garbage':
    print('Welcome to fake-cloud!')
    sys.exit(0)
print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential',
                  'status': {'token': token}}))
'''


class Scene:
    """The emulator, the operator's kubeconfig (a token file or an exec plugin), and a user's requests."""

    def __init__(self, emulator: KubernetesEmulator, directory: pathlib.Path) -> None:
        self.emulator = emulator
        self.directory = directory
        self.token_path = directory / 'token.txt'
        self.plugin_path = directory / 'plugin.py'
        self.plugin_token_path = directory / 'plugin-token.txt'
        self.calls: list[tuple[str, Any]] = []  # (handler, spec) of every handler call

    def kubeconfig(self, user: dict[str, Any]) -> dict[str, Any]:
        return kubeconfig_doc(clusters=[{'name': 'c', 'cluster': {'server': self.emulator.url}}],
                           users=[{'name': 'u', 'user': user}])

    def token_file_user(self, token: str) -> dict[str, Any]:
        self.token_path.write_text(token + '\n')
        return {'tokenFile': str(self.token_path)}

    def exec_user(self, token: str) -> dict[str, Any]:
        self.plugin_path.write_text(PLUGIN)
        self.plugin_token_path.write_text(token)
        return {'exec': {'apiVersion': 'client.authentication.k8s.io/v1', 'command': sys.executable,
                         'args': [str(self.plugin_path)], 'interactiveMode': 'Never'}}

    def request(self, method: str, path: str, body: Any = None) -> Any:
        # The user's own requests use a token that the emulator always accepts (see accept_tokens()).
        request = urllib.request.Request(f'{self.emulator.url}{path}', method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={'Content-Type': 'application/json',
                                                  'Authorization': 'Bearer user-token'})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def create(self, spec: dict[str, Any]) -> None:
        self.request('POST', OBJECT_PATH, {'apiVersion': f'{GROUP}/v1', 'kind': 'KopfExample',
                                           'metadata': {'name': 'kex1'}, 'spec': spec})

    def change(self, spec: dict[str, Any]) -> None:
        """Replace the spec (by PUT: the operator's PATCHes are the only ones, for the faults to hit)."""
        for attempt in range(10):
            body = self.request('GET', f'{OBJECT_PATH}/kex1')
            try:
                self.request('PUT', f'{OBJECT_PATH}/kex1', {**body, 'spec': spec})
                return
            except urllib.error.HTTPError as e:  # the operator has patched it since the GET: read it anew
                if e.code != 409 or attempt == 9:
                    raise

    def rotate_tokens(self, old: str, new: str) -> None:
        """The old token expires (401 from now on); the new one is in the token file & the plugin's."""
        self.emulator.accept_tokens({new, 'user-token'})
        if self.token_path.exists():
            self.token_path.write_text(new + '\n')
        if self.plugin_token_path.exists():
            self.plugin_token_path.write_text(new)

    def wait_for_call(self, handler: str, spec: Any) -> None:
        _wait_until(lambda: (handler, spec) in self.calls,
                    f'{handler} has not been called with {str(spec)[:200]}; '
                    f'the calls: {[(h, str(s)[:100]) for h, s in self.calls]}')


def _wait_until(condition: Callable[[], bool], failure: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(failure)
        time.sleep(0.02)


@dataclasses.dataclass(frozen=True)
class BadInput:
    """
    One row: what goes wrong, when, and what the operator must say about it.

    A row either breaks the kubeconfig (``kubeconfig``: the operator cannot start; ``message`` is the
    cause after "Cannot log in to the Kubernetes cluster: "), or disturbs a running operator
    (``disturb``: called after the object's creation has been handled, then the object's ``spec``
    is changed to ``changed``; ``message`` is logged at ``level`` as is; or, if the operator ``exits``
    for it, ``message`` is the cause of its exit, as for the kubeconfigs).
    """

    id: str
    message: str | None
    level: str = 'WARNING'
    kubeconfig: str | dict[str, Any] | None = None  # the content of a broken kubeconfig (None: no file)
    user: Callable[[Scene], dict[str, Any]] | None = None  # the operator's kubeconfig user, if special
    disturb: Callable[[Scene], None] | None = None
    changed: Any = dataclasses.field(default_factory=lambda: {'field': 'changed'})
    # The handler calls after the disturbance: (handler, spec); the update with the changed spec by default.
    calls_after: Callable[['BadInput'], list[tuple[str, Any]]] | None = None
    exits: bool = False  # the disturbance cannot be survived: the operator exits with the message

    @property
    def refuses_to_start(self) -> bool:
        return self.disturb is None


def _injected(scene: Scene, line: bytes) -> bool:
    return scene.emulator.inject_watch_line(line, path=PLURAL) >= 1


def _inject_lines(*lines: bytes) -> Callable[[Scene], None]:
    def disturb(scene: Scene) -> None:
        for line in lines:
            # Under load, the operator's watch-stream may be between its reconnections for a moment:
            # inject again until some stream has got the line (nothing is injected when none is open).
            _wait_until(functools.partial(_injected, scene, line), 'No watch-stream has got the line.')
    return disturb


def _respond_with_html(status: int, method: str) -> Callable[[Scene], None]:
    def disturb(scene: Scene) -> None:
        scene.emulator.fail_requests(1, status=status, method=method, path=f'{PLURAL}/kex1$', raw_body=HTML)
    return disturb


HUGE = {'field': 'huge', 'blob': 'x' * 1_500_000}
DEEP = {'field': 'deep', 'deep': _nested(500)}
ANNOTATIONS_TOO_LONG = (
    "[default/kex1] The API has rejected the patch of the object as invalid: "
    'KopfExample.kopf.dev "kex1" is invalid: metadata.annotations: Too long: '
    'must have at most 262144 bytes. The outcome of this handling is not stored; '
    'the handlers will run again on the next change of the object. '
    "Kopf's annotations (e.g. the diff-base: the object's essence as last handled) do not fit "
    "the API's limit for all annotations together: exclude the big fields from the diff-base "
    '(kopf.AnnotationsDiffBaseStorage(ignored_fields=[...]) in settings.persistence.diffbase_storage) '
    'or store it elsewhere (kopf.StatusDiffBaseStorage).'
)
NOT_JSON = f"the response is not JSON: {HTML!r}"

BAD_INPUTS: list[BadInput] = [
    # The API's responses and watch-streams.
    BadInput('watch-line-not-json',
             "Skipping an unparseable line in the watch-stream: b'<html>garbage</html>'",
             disturb=_inject_lines(b'<html>garbage</html>')),
    BadInput('watch-line-not-an-event',
             """Skipping an unrecognised line in the watch-stream: b'{"type": "ADDED", "object": "kex1"}'""",
             disturb=_inject_lines(b'{"type": "ADDED", "object": "kex1"}')),
    BadInput('watch-line-invalid-utf8',
             """Skipping an unparseable line in the watch-stream: b'{"type": "ADDED", "x": "\\xff\\xfe"}'""",
             disturb=_inject_lines(b'{"type": "ADDED", "x": "\xff\xfe"}')),
    BadInput('response-200-not-json',
             '[default/kex1] Request attempt #1 failed; will retry: PATCH {path}/kex1 -> '
             'HTTP 200 for PATCH {url}{path}/kex1: ' + NOT_JSON + ', retrying in 0.05 s',
             disturb=_respond_with_html(200, 'PATCH')),
    BadInput('response-502-not-json',
             '[default/kex1] Request attempt #1 failed; will retry: PATCH {path}/kex1 -> '
             'HTTP 502 for PATCH {url}{path}/kex1: ' + HTML.decode() + ', retrying in 0.05 s',
             disturb=_respond_with_html(502, 'PATCH')),
    # The objects themselves.
    BadInput('huge-body-1.5MB', ANNOTATIONS_TOO_LONG, level='ERROR', disturb=lambda scene: None, changed=HUGE,
             # The outcome of the huge change cannot be stored: once smaller, the object is handled again.
             calls_after=lambda row: [('update_fn', HUGE), ('update_fn', {'field': 'small again'})]),
    BadInput('deeply-nested-500-levels', None, disturb=lambda scene: None, changed=DEEP),
    # The credentials: expired and rotated (401, then a new login brings the new token).
    BadInput('token-file-rotated', 'Re-authentication has finished.', level='INFO',
             user=lambda scene: scene.token_file_user('token-1'),
             disturb=lambda scene: scene.rotate_tokens('token-1', 'token-2')),
    BadInput('exec-plugin-token-rotated', 'Re-authentication has finished.', level='INFO',
             user=lambda scene: scene.exec_user('token-1'),
             disturb=lambda scene: scene.rotate_tokens('token-1', 'token-2')),
    BadInput('exec-plugin-token-expired-for-good',
             "The exec credential plugin '{python}' (user 'u' in {kubeconfig}) failed with exit code 3: "
             'fake-cloud: the session has expired; run `fake-cloud login`',
             user=lambda scene: scene.exec_user('token-1'),
             disturb=lambda scene: scene.rotate_tokens('token-1', 'fail'), exits=True),

    # The kubeconfig: the operator cannot start at all.
    BadInput('kubeconfig-missing',
             'The kubeconfig file {path} does not exist; create it or fix $KUBECONFIG.'),
    BadInput('kubeconfig-invalid-yaml',
             "The kubeconfig file {path} is not valid YAML at line 4, column 6: "
             "expected ',' or '}}', but got ':'; fix its syntax.",
             kubeconfig=f'clusters:\n- name: c\n  cluster: {{server: x\nusers: [{{token: {SECRET}}}\n'),
    BadInput('kubeconfig-no-current-context',
             'No "current-context" field is set in the kubeconfig ({path}); '
             "set it to one of the contexts ('ctx'), e.g.: kubectl config use-context ctx",
             kubeconfig=kubeconfig_doc(**{'current-context': None})),
    BadInput('kubeconfig-unknown-context',
             "The context 'prod' is not defined in the kubeconfig ({path}); known contexts: 'ctx'.",
             kubeconfig=kubeconfig_doc(**{'current-context': 'prod'})),
    BadInput('kubeconfig-missing-cluster',
             """The "cluster" field of the context 'ctx' in {path} refers to the cluster 'gone', """
             "which is not defined in the kubeconfig ({path}); known clusters: 'c'.",
             kubeconfig=kubeconfig_doc(contexts=[{'name': 'ctx',
                                                  'context': {'cluster': 'gone', 'user': 'u'}}])),
    BadInput('kubeconfig-missing-user',
             """The "user" field of the context 'ctx' in {path} refers to the user 'gone', """
             "which is not defined in the kubeconfig ({path}); known users: 'u'.",
             kubeconfig=kubeconfig_doc(contexts=[{'name': 'ctx',
                                                  'context': {'cluster': 'c', 'user': 'gone'}}])),
    BadInput('kubeconfig-missing-ca-file',
             """Cannot read the file {dir}/absent-ca.crt (field "certificate-authority" of the cluster 'c' """
             "in {path}): No such file or directory; fix the path or the file permissions.",
             kubeconfig=kubeconfig_doc(clusters=[{'name': 'c', 'cluster': {
                 'server': 'https://127.0.0.1:1', 'certificate-authority': 'absent-ca.crt'}}])),
    BadInput('kubeconfig-missing-client-certificate',
             """Cannot read the file /nonexistent/client.crt (field "client-certificate" of the user 'u' """
             "in {path}): No such file or directory; fix the path or the file permissions.",
             kubeconfig=kubeconfig_doc(users=[{'name': 'u', 'user': {
                 'client-certificate': '/nonexistent/client.crt',
                 'client-key': '/nonexistent/client.key'}}])),
    BadInput('kubeconfig-no-server',
             """The cluster 'c' in {path} has no server URL; set its "server" field.""",
             kubeconfig=kubeconfig_doc(clusters=[{'name': 'c', 'cluster': {}}])),
    BadInput('kubeconfig-server-not-a-url',
             """The "server" field of the cluster 'c' in {path} is not an http:// or https:// URL: """
             "'127.0.0.1 6443'; set it to the API server's URL, e.g. https://127.0.0.1:6443.",
             kubeconfig=kubeconfig_doc(clusters=[{'name': 'c', 'cluster': {'server': '127.0.0.1 6443'}}])),
    BadInput('kubeconfig-server-of-another-scheme',
             """The "server" field of the cluster 'c' in {path} is not an http:// or https:// URL: """
             "'ftp://127.0.0.1:6443'; set it to the API server's URL, e.g. https://127.0.0.1:6443.",
             kubeconfig=kubeconfig_doc(clusters=[{'name': 'c', 'cluster': {'server': 'ftp://127.0.0.1:6443'}}])),
    BadInput('kubeconfig-insecure-not-a-boolean',
             """The "insecure-skip-tls-verify" field of the cluster 'c' in {path} must be true or false.""",
             kubeconfig=kubeconfig_doc(clusters=[{'name': 'c', 'cluster': {
                 'server': 'https://127.0.0.1:1', 'insecure-skip-tls-verify': 'maybe'}}])),
    BadInput('kubeconfig-token-not-a-string',
             """The "token" field of the user 'u' in {path} must be a string.""",
             kubeconfig=kubeconfig_doc(users=[{'name': 'u', 'user': {'token': 12345}}])),
    BadInput('kubeconfig-bad-base64',
             """The "client-certificate-data" field of the user 'u' in {path} is not valid base64.""",
             kubeconfig=kubeconfig_doc(users=[{'name': 'u', 'user': {
                 'client-certificate-data': 'not base64!', 'client-key-data': SECRET}}])),
    BadInput('kubeconfig-missing-token-file',
             """Cannot read the file /nonexistent/token (field "tokenFile" of the user 'u' in {path}): """
             'No such file or directory; fix the path or the file permissions.',
             kubeconfig=kubeconfig_doc(users=[{'name': 'u', 'user': {'tokenFile': '/nonexistent/token'}}])),
    # The exec credential plugins: by the first default login in one line, never swallowed by the others.
    BadInput('exec-plugin-fails',
             "The exec credential plugin '{python}' (user 'u' in {path}) failed with exit code 3: "
             'fake-cloud: the session has expired; run `fake-cloud login`',
             kubeconfig=_exec_user(sys.executable, '{dir}/plugin.py')),
    BadInput('exec-plugin-prints-garbage',
             "The exec credential plugin '{python}' (user 'u' in {path}) printed 23 bytes that are not "
             'valid JSON; it must print an ExecCredential object to stdout.',
             kubeconfig=_exec_user(sys.executable, '{dir}/plugin.py')),
    BadInput('exec-plugin-missing',
             "Cannot run the exec credential plugin 'kopf-test-no-such-plugin' (user 'u' in {path}): "
             'the command is not found; install it or fix the path in the kubeconfig. '
             'Install it with: pip install fake-cloud-cli',
             kubeconfig=_exec_user('kopf-test-no-such-plugin')),
]


@pytest.fixture()
def not_in_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv('KUBERNETES_SERVICE_HOST', raising=False)
    monkeypatch.delenv('KUBERNETES_SERVICE_PORT', raising=False)


def _messages(output: str, level: str | None = None) -> list[str]:
    """The log messages (without the time and the logger) of a level, or of all levels."""
    return [match['message'] for line in output.splitlines()
            if (match := LOG_LINE.match(line)) and (level is None or match['level'] == level)]


@pytest.mark.parametrize('row', BAD_INPUTS, ids=[row.id for row in BAD_INPUTS])
def test_bad_input(row: BadInput, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                   not_in_cluster: None, request: pytest.FixtureRequest) -> None:
    if row.refuses_to_start:
        _check_refused_start(row, tmp_path, monkeypatch)
    else:
        emulator: KubernetesEmulator = request.getfixturevalue('k8s_emulator')
        _check_survived_input(row, emulator, tmp_path, monkeypatch)


def _check_refused_start(row: BadInput, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / 'kubeconfig.yaml'
    if row.kubeconfig is not None:
        content = row.kubeconfig if isinstance(row.kubeconfig, str) else json.dumps(row.kubeconfig)
        path.write_text(content.replace('{dir}', str(tmp_path)))
    plugin = tmp_path / 'plugin.py'
    plugin.write_text(PLUGIN)
    (tmp_path / 'plugin-token.txt').write_text('garbage' if 'garbage' in row.id else 'fail')
    monkeypatch.setenv('KUBECONFIG', str(path))

    with KopfRunner(['run', '-A', '--standalone'], registry=kopf.OperatorRegistry(), reraise=False) as runner:
        pass

    expected = (row.message or '').format(path=path, dir=tmp_path, python=sys.executable)
    assert runner.exit_code == 1
    assert runner.stderr.splitlines()[-1] == f'Error: Cannot log in to the Kubernetes cluster: {expected}'
    # The first default login says it in one line; the others read the same file and do not repeat it.
    assert f"Activity 'login_via_pykube' failed permanently: {expected}" in runner.output
    assert runner.output.count(f'failed permanently: {expected}') == 1
    assert 'Traceback' not in runner.output
    assert SECRET not in runner.output


def _check_survived_input(row: BadInput, emulator: KubernetesEmulator, tmp_path: pathlib.Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    scene = Scene(emulator, tmp_path)
    scene.request('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', CRD)
    user = row.user(scene) if row.user is not None else {'token': 'token-1'}
    emulator.accept_tokens({'token-1', 'user-token'})
    kubeconfig_path = tmp_path / 'kubeconfig.yaml'
    kubeconfig_path.write_text(json.dumps(scene.kubeconfig(user)))
    monkeypatch.setenv('KUBECONFIG', str(kubeconfig_path))

    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    def fast(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.networking.error_backoffs = [0.05, 0.1, 0.2]
        settings.watching.reconnect_backoff = 0.01
        settings.queueing.error_delays = [0.05]
        settings.queueing.exit_timeout = 2.0

    @kopf.on.create(GROUP, 'v1', PLURAL, registry=registry)
    def create_fn(spec: kopf.Spec, **_: Any) -> None:
        scene.calls.append(('create_fn', dict(spec)))

    @kopf.on.update(GROUP, 'v1', PLURAL, registry=registry)
    def update_fn(spec: kopf.Spec, **_: Any) -> None:
        scene.calls.append(('update_fn', dict(spec)))

    initial = {'field': 'initial'}
    expected_after = (row.calls_after(row) if row.calls_after is not None
                      else [('update_fn', row.changed)])
    with KopfRunner(['run', '-n', NAMESPACE, '--standalone', '--verbose'], registry=registry,
                    reraise=False) as runner:
        scene.create(initial)
        scene.wait_for_call('create_fn', initial)
        assert row.disturb is not None
        row.disturb(scene)
        if row.exits:
            scene.change(row.changed)
            _wait_until(lambda: runner.finished, 'The operator has not exited.')
        for handler, spec in [] if row.exits else expected_after:
            scene.change(spec)
            scene.wait_for_call(handler, spec)

    assert 'Traceback' not in runner.output
    if row.exits:
        message = (row.message or '').format(python=sys.executable, kubeconfig=kubeconfig_path)
        assert runner.exit_code == 1
        assert runner.stderr.splitlines()[-1] == f'Error: Cannot log in to the Kubernetes cluster: {message}'
        assert scene.calls[0] == ('create_fn', initial)
        return

    assert runner.exit_code == 0, runner.output[-3000:]
    assert SECRET not in runner.output and 'token-2' not in runner.output
    # Nothing lost, nothing repeated: each change handled once, in order.
    assert scene.calls == [('create_fn', initial), *expected_after]
    if row.message is None:
        assert _messages(runner.output, 'WARNING') == _messages(runner.output, 'ERROR') == []
    else:
        expected = row.message.replace('{url}', emulator.url).replace('{path}', OBJECT_PATH)
        assert expected in _messages(runner.output, row.level), _messages(runner.output)
