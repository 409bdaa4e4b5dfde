"""
A broken kubeconfig gets the same one-line explanation (the file, the field, what is wrong, the fix)
from the built-in login and from the piggybacking ones, whose libraries' own errors are vague:
the files are checked before the libraries read them. What the libraries support beyond the built-in
login (e.g. the legacy auth-providers) is not rejected by that check, and no exec plugin is run by it.
"""
import logging
from pathlib import Path
from typing import Any

import pytest

import kopf
from kopf._clients.logins.kubeconfig import check_kubeconfig

SECRET = 'sEcReT-tOkEn-in-the-kubeconfig'
LOGGER = logging.getLogger('test')


def _doc(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'ctx',
        'clusters': [{'name': 'clu', 'cluster': {'server': 'https://k8s.example.com:6443'}}],
        'users': [{'name': 'usr', 'user': {'token': SECRET}}],
        'contexts': [{'name': 'ctx', 'context': {'cluster': 'clu', 'user': 'usr'}}],
    }
    doc.update(overrides)
    return doc


# The kubeconfig (None: no file; str: raw text) -> the exact explanation, with {path} and {dir} in it.
CASES: list[tuple[str, str | dict[str, Any] | None, str]] = [
    ('missing-file', None,
     'The kubeconfig file {path} does not exist; create it or fix $KUBECONFIG.'),
    ('invalid-yaml', f'users: [{{token: {SECRET}}}\ncontexts: x\n',
     "The kubeconfig file {path} is not valid YAML at line 2, column 1: "
     "expected ',' or ']', but got '<scalar>'; fix its syntax."),
    ('no-current-context', _doc(**{'current-context': None}),
     'No "current-context" field is set in the kubeconfig ({path}); '
     "set it to one of the contexts ('ctx'), e.g.: kubectl config use-context ctx"),
    ('unknown-context', _doc(**{'current-context': 'prod'}),
     "The context 'prod' is not defined in the kubeconfig ({path}); known contexts: 'ctx'."),
    ('missing-cluster', _doc(contexts=[{'name': 'ctx', 'context': {'cluster': 'gone', 'user': 'usr'}}]),
     """The "cluster" field of the context 'ctx' in {path} refers to the cluster 'gone', """
     "which is not defined in the kubeconfig ({path}); known clusters: 'clu'."),
    ('missing-user', _doc(contexts=[{'name': 'ctx', 'context': {'cluster': 'clu', 'user': 'gone'}}]),
     """The "user" field of the context 'ctx' in {path} refers to the user 'gone', """
     "which is not defined in the kubeconfig ({path}); known users: 'usr'."),
    ('missing-ca-file', _doc(clusters=[{'name': 'clu', 'cluster': {
        'server': 'https://k8s.example.com:6443', 'certificate-authority': 'ca.crt'}}]),
     """Cannot read the file {dir}/ca.crt (field "certificate-authority" of the cluster 'clu' in {path}): """
     "No such file or directory; fix the path or the file permissions."),
    ('missing-client-key', _doc(users=[{'name': 'usr', 'user': {
        'client-certificate-data': 'Y2VydA==', 'client-key': '/nonexistent/client.key'}}]),
     """Cannot read the file /nonexistent/client.key (field "client-key" of the user 'usr' in {path}): """
     "No such file or directory; fix the path or the file permissions."),
    ('no-server', _doc(clusters=[{'name': 'clu', 'cluster': {}}]),
     """The cluster 'clu' in {path} has no server URL; set its "server" field."""),
    ('bad-base64', _doc(clusters=[{'name': 'clu', 'cluster': {
        'server': 'https://k8s.example.com:6443', 'certificate-authority-data': 'not base64!'}}]),
     """The "certificate-authority-data" field of the cluster 'clu' in {path} is not valid base64."""),
]

LOGINS = {
    'builtin': kopf.login_with_kubeconfig,
    'pykube': kopf.login_via_pykube,
    'client': kopf.login_via_client,
}


@pytest.mark.parametrize('login', list(LOGINS))
@pytest.mark.parametrize('content, message', [(c, m) for _, c, m in CASES], ids=[c for c, _, _ in CASES])
def test_the_same_explanation_from_every_login(
        login: str, content: str | dict[str, Any] | None, message: str, settings: Any,
        write_kubeconfig: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / 'kube' / 'config'
    if content is not None:
        path = write_kubeconfig(content)
    monkeypatch.setenv('KUBECONFIG', str(path))
    with pytest.raises(kopf.LoginError) as excinfo:
        LOGINS[login](settings=settings, logger=LOGGER)
    assert str(excinfo.value) == message.format(path=path, dir=path.parent)
    assert SECRET not in str(excinfo.value)


async def test_the_same_explanation_from_the_async_client(
        settings: Any, write_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip('kubernetes_asyncio')
    path = write_kubeconfig(_doc(**{'current-context': 'prod'}))
    monkeypatch.setenv('KUBECONFIG', str(path))
    with pytest.raises(kopf.LoginError) as excinfo:
        await kopf.login_via_async_client(settings=settings, logger=LOGGER)
    assert str(excinfo.value) == \
        f"The context 'prod' is not defined in the kubeconfig ({path}); known contexts: 'ctx'."


@pytest.mark.parametrize('user', [
    pytest.param({'auth-provider': {'name': 'oidc', 'config': {'id-token': SECRET}}}, id='auth-provider'),
    pytest.param({'exec': {'apiVersion': 'client.authentication.k8s.io/v1',
                           'command': '/nonexistent/plugin'}}, id='exec-not-run'),
    pytest.param({}, id='anonymous'),
])
def test_the_check_accepts_what_the_libraries_support(user: dict[str, Any], write_kubeconfig: Any) -> None:
    path = write_kubeconfig(_doc(users=[{'name': 'usr', 'user': user}]))
    check_kubeconfig([path])  # no error
