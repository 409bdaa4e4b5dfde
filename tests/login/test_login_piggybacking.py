import asyncio
import base64
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from kopf._clients.logins import login_via_async_client, login_via_client, login_via_pykube
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError

CA_PEM = b'-----BEGIN CERTIFICATE-----\nfake-ca\n-----END CERTIFICATE-----\n'
CERT_PEM = b'-----BEGIN CERTIFICATE-----\nfake-client\n-----END CERTIFICATE-----\n'
KEY_PEM = b'-----BEGIN PRIVATE KEY-----\nfake-key-SECRET\n-----END PRIVATE KEY-----\n'

logger = logging.getLogger('kopf.tests.login')
needs_pykube = pytest.mark.skipif(importlib.util.find_spec('pykube') is None, reason='no pykube-ng')
needs_kubernetes = pytest.mark.skipif(importlib.util.find_spec('kubernetes') is None, reason='no kubernetes')


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode('ascii')


@pytest.fixture()
def kubeconfig_with_token(make_kubeconfig: Any, write_kubeconfig: Any,
                          monkeypatch: pytest.MonkeyPatch) -> Path:
    path = write_kubeconfig(make_kubeconfig(
        cluster={'certificate-authority': 'ca.crt', 'proxy-url': 'http://proxy:3128'},
        user={'token': 'token-SECRET'},
        context={'namespace': 'team-b'},
    ))
    (path.parent / 'ca.crt').write_bytes(CA_PEM)
    monkeypatch.setenv('KUBECONFIG', str(path))
    return path


def hide_module(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make a library look uninstalled: a None in sys.modules makes its import fail."""
    for module_name in list(sys.modules):
        if module_name == name or module_name.startswith(f'{name}.'):
            monkeypatch.delitem(sys.modules, module_name)
    monkeypatch.setitem(sys.modules, name, None)


# pykube-ng


@needs_pykube
def test_pykube_token_ca_namespace_proxy(settings: Any, kubeconfig_with_token: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    info = login_via_pykube(settings=settings, logger=logger)
    assert info is not None
    assert info.server == 'https://k8s.example.com:6443'
    assert info.ca_data == CA_PEM
    assert info.scheme == 'Bearer'
    assert info.token == 'token-SECRET'
    assert info.default_namespace == 'team-b'
    assert info.proxy_url == 'http://proxy:3128'
    assert info.insecure is None
    assert info.trust_env is False
    assert 'SECRET' not in caplog.text


@needs_pykube
def test_pykube_certificates_basic_auth_insecure(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(
        cluster={'insecure-skip-tls-verify': True},
        user={'username': 'admin', 'password': 'p4ss',
              'client-certificate': 'client.crt', 'client-key-data': b64(KEY_PEM)},
    ))
    (path.parent / 'client.crt').write_bytes(CERT_PEM)
    monkeypatch.setenv('KUBECONFIG', str(path))
    settings.networking.trust_env = True
    info = login_via_pykube(settings=settings, logger=logger)
    assert info is not None
    assert info.insecure is True
    assert info.username == 'admin'
    assert info.password == 'p4ss'
    assert info.certificate_data == CERT_PEM
    assert info.private_key_data == KEY_PEM
    assert info.token is None
    assert info.default_namespace == 'default'  # pykube-ng's own default.
    assert info.trust_env is True


@needs_pykube
def test_pykube_exec_plugin(settings: Any, plugin: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    section = plugin.exec_section(command='./plugin.py', token='pykube-exec',
                                  expiration='2099-01-01T00:00:00Z')
    path = write_kubeconfig(make_kubeconfig(user={'exec': section}))
    monkeypatch.setenv('KUBECONFIG', str(path))
    first = login_via_pykube(settings=settings, logger=logger)
    second = login_via_pykube(settings=settings, logger=logger)
    assert first is not None and second is not None
    assert first.token == second.token == 'pykube-exec'
    assert first.expiration is not None and first.expiration.year == 2099
    assert plugin.runs == 1


@needs_pykube
def test_pykube_uses_the_first_existing_file(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = write_kubeconfig(make_kubeconfig(server='https://first'), 'one.yaml')
    second = write_kubeconfig(make_kubeconfig(server='https://second'), 'two.yaml')
    paths = [tmp_path / 'missing.yaml', first, second]
    monkeypatch.setenv('KUBECONFIG', os.pathsep.join(str(path) for path in paths))
    info = login_via_pykube(settings=settings, logger=logger)
    assert info is not None
    assert info.server == 'https://first'


@needs_pykube
def test_pykube_without_any_config(settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    assert login_via_pykube(settings=settings, logger=logger) is None
    assert 'neither' in caplog.text


def test_pykube_not_installed(settings: Any, kubeconfig_with_token: Path, monkeypatch: pytest.MonkeyPatch,
                              caplog: pytest.LogCaptureFixture) -> None:
    hide_module(monkeypatch, 'pykube')
    caplog.set_level(logging.DEBUG)
    assert login_via_pykube(settings=settings, logger=logger) is None
    assert 'pykube-ng is not installed' in caplog.text


@needs_pykube
def test_pykube_malformed_yaml(settings: Any, write_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig('users:\n- name: u\n  user: {token: "SECRET-TOKEN\n')
    monkeypatch.setenv('KUBECONFIG', str(path))
    with pytest.raises(LoginError) as excinfo:
        login_via_pykube(settings=settings, logger=logger)
    assert str(path) in str(excinfo.value)
    assert 'SECRET' not in str(excinfo.value)


@needs_pykube
def test_pykube_missing_kubeconfig_in_env(settings: Any, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('KUBECONFIG', str(tmp_path / 'missing.yaml'))
    with pytest.raises(LoginError) as excinfo:
        login_via_pykube(settings=settings, logger=logger)
    assert str(tmp_path / 'missing.yaml') in str(excinfo.value)


@needs_pykube
def test_pykube_broken_entry(settings: Any, write_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig({
        'clusters': [{'name': 'c', 'cluster': {'server': 'https://x'}}],
        'users': [{'name': 'u', 'token': 'SECRET-misplaced'}],
        'contexts': [{'name': 'x', 'context': {'cluster': 'c', 'user': 'u'}}],
        'current-context': 'x',
    })
    monkeypatch.setenv('KUBECONFIG', str(path))
    with pytest.raises(LoginError) as excinfo:
        login_via_pykube(settings=settings, logger=logger)
    assert str(path) in str(excinfo.value)
    assert "'user'" in str(excinfo.value)
    assert 'SECRET' not in str(excinfo.value)


# The official kubernetes client


@needs_kubernetes
def test_client_token_ca_namespace_proxy(settings: Any, kubeconfig_with_token: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    info = login_via_client(settings=settings, logger=logger)
    assert info is not None
    assert info.server == 'https://k8s.example.com:6443'
    assert info.ca_path is not None and Path(info.ca_path).read_bytes() == CA_PEM
    assert info.scheme == 'Bearer'
    assert info.token == 'token-SECRET'
    assert info.default_namespace == 'team-b'
    assert info.proxy_url == 'http://proxy:3128'
    assert info.insecure is None
    assert 'SECRET' not in caplog.text


@needs_kubernetes
def test_client_basic_auth_certificates_insecure(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(
        cluster={'insecure-skip-tls-verify': True},
        user={'username': 'admin', 'password': 'p:4ss',
              'client-certificate': 'client.crt', 'client-key-data': b64(KEY_PEM)},
    ))
    (path.parent / 'client.crt').write_bytes(CERT_PEM)
    monkeypatch.setenv('KUBECONFIG', str(path))
    settings.networking.trust_env = True
    info = login_via_client(settings=settings, logger=logger)
    assert info is not None
    assert info.insecure is True
    assert info.username == 'admin'
    assert info.password == 'p:4ss'
    assert info.token is None
    assert info.certificate_path == str(path.parent / 'client.crt')
    assert info.private_key_path is not None and Path(info.private_key_path).read_bytes() == KEY_PEM
    assert info.trust_env is True


@needs_kubernetes
def test_client_merges_several_files(settings: Any, write_kubeconfig: Any,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    first = write_kubeconfig({
        'contexts': [{'name': 'dev', 'context': {'cluster': 'c', 'user': 'u', 'namespace': 'dev-ns'}}],
        'current-context': 'dev',
    }, 'first.yaml')
    second = write_kubeconfig({
        'clusters': [{'name': 'c', 'cluster': {'server': 'https://merged'}}],
        'users': [{'name': 'u', 'user': {'token': 'merged-token'}}],
    }, 'second.yaml')
    monkeypatch.setenv('KUBECONFIG', os.pathsep.join([str(first), str(second)]))
    info = login_via_client(settings=settings, logger=logger)
    assert info == ConnectionInfo(server='https://merged', scheme='Bearer', token='merged-token',
                                  default_namespace='dev-ns')


@needs_kubernetes
def test_client_without_any_config(settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    assert login_via_client(settings=settings, logger=logger) is None
    assert 'neither' in caplog.text


def test_client_not_installed(settings: Any, kubeconfig_with_token: Path, monkeypatch: pytest.MonkeyPatch,
                              caplog: pytest.LogCaptureFixture) -> None:
    hide_module(monkeypatch, 'kubernetes')
    caplog.set_level(logging.DEBUG)
    assert login_via_client(settings=settings, logger=logger) is None
    assert 'not installed' in caplog.text


@needs_kubernetes
def test_client_malformed_yaml(settings: Any, write_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig('users:\n- name: u\n  user: {token: "SECRET-TOKEN\n')
    monkeypatch.setenv('KUBECONFIG', str(path))
    with pytest.raises(LoginError) as excinfo:
        login_via_client(settings=settings, logger=logger)
    assert str(path) in str(excinfo.value)
    assert 'SECRET' not in str(excinfo.value)


@needs_kubernetes
def test_client_errors_do_not_quote_entries(settings: Any, write_kubeconfig: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # The library names a malformed entry by its whole content, token included.
    path = write_kubeconfig({
        'clusters': [{'name': 'c', 'cluster': {'server': 'https://x'}}],
        'users': [{'name': 'u', 'token': 'SECRET-misplaced'}],
        'contexts': [{'name': 'x', 'context': {'cluster': 'c', 'user': 'u'}}],
        'current-context': 'x',
    })
    monkeypatch.setenv('KUBECONFIG', str(path))
    with pytest.raises(LoginError) as excinfo:
        login_via_client(settings=settings, logger=logger)
    assert str(path) in str(excinfo.value)
    assert 'Expected key user' in str(excinfo.value)
    assert 'SECRET' not in str(excinfo.value)
    assert excinfo.value.__cause__ is None and excinfo.value.__suppress_context__


# kubernetes_asyncio (not necessarily installed)


async def test_async_client_not_installed(settings: Any, kubeconfig_with_token: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    hide_module(monkeypatch, 'kubernetes_asyncio')
    caplog.set_level(logging.DEBUG)
    assert await login_via_async_client(settings=settings, logger=logger) is None
    assert 'kubernetes_asyncio is not installed' in caplog.text


@pytest.mark.skipif(importlib.util.find_spec('kubernetes_asyncio') is None, reason='no kubernetes_asyncio')
async def test_async_client_token_ca_namespace(settings: Any, kubeconfig_with_token: Path) -> None:
    info = await login_via_async_client(settings=settings, logger=logger)
    assert info is not None
    assert info.server == 'https://k8s.example.com:6443'
    assert info.ca_path is not None
    assert info.token == 'token-SECRET'
    assert info.default_namespace == 'team-b'
    assert await asyncio.to_thread(Path(info.ca_path).read_bytes) == CA_PEM
