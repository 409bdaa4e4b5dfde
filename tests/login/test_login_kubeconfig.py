import base64
import os
from pathlib import Path
from typing import Any

import pytest

from kopf._clients.logins import login_with_kubeconfig
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError

CA_PEM = b'-----BEGIN CERTIFICATE-----\nfake-ca\n-----END CERTIFICATE-----\n'
CERT_PEM = b'-----BEGIN CERTIFICATE-----\nfake-client\n-----END CERTIFICATE-----\n'
KEY_PEM = b'-----BEGIN PRIVATE KEY-----\nfake-key-SECRET\n-----END PRIVATE KEY-----\n'


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode('ascii')


def login(settings: Any, **kwargs: Any) -> ConnectionInfo:
    info = login_with_kubeconfig(settings=settings, **kwargs)
    assert info is not None
    return info


def test_no_kubeconfig_at_all(settings: Any) -> None:
    assert login_with_kubeconfig(settings=settings) is None


def test_empty_kubeconfig_is_like_none(settings: Any, write_kubeconfig: Any,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('KUBECONFIG', str(write_kubeconfig('')))
    assert login_with_kubeconfig(settings=settings) is None


def test_default_location_in_home(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                                  isolated_environment: Path) -> None:
    doc = make_kubeconfig(user={'token': 'home-token'})
    write_kubeconfig(doc, isolated_environment / '.kube' / 'config')
    info = login(settings)
    assert info.server == 'https://k8s.example.com:6443'
    assert info.token == 'home-token'
    assert info.scheme == 'Bearer'


def test_token_namespace_and_relative_ca(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = write_kubeconfig(make_kubeconfig(
        cluster={'certificate-authority': 'certs/ca.crt'},
        user={'token': 'the-token'},
        context={'namespace': 'team-a'},
    ), 'configs/main.yaml')
    (path.parent / 'certs').mkdir()
    (path.parent / 'certs' / 'ca.crt').write_bytes(CA_PEM)
    monkeypatch.setenv('KUBECONFIG', str(path))
    monkeypatch.chdir(tmp_path / 'home')  # relative paths must not depend on the cwd.

    info = login(settings)
    assert info.server == 'https://k8s.example.com:6443'
    assert info.ca_path == str(path.parent / 'certs' / 'ca.crt')
    assert info.ca_data is None
    assert info.token == 'the-token'
    assert info.default_namespace == 'team-a'
    assert info.insecure is None
    assert info.proxy_url is None
    assert info.username is None and info.password is None
    assert info.expiration is None
    assert info.trust_env is False


def test_relative_kubeconfig_path_in_env(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = write_kubeconfig(make_kubeconfig(cluster={'certificate-authority': 'ca.crt'}))
    (path.parent / 'ca.crt').write_bytes(CA_PEM)
    monkeypatch.chdir(path.parent.parent)
    monkeypatch.setenv('KUBECONFIG', os.path.relpath(path))
    info = login(settings)
    assert info.ca_path == str(path.parent / 'ca.crt')
    assert Path(info.ca_path).is_absolute()


def test_data_fields(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(
        cluster={'certificate-authority-data': b64(CA_PEM)},
        user={'client-certificate-data': b64(CERT_PEM), 'client-key-data': b64(KEY_PEM)},
    ))
    monkeypatch.setenv('KUBECONFIG', str(path))
    info = login(settings)
    assert info.ca_data == CA_PEM
    assert info.ca_path is None
    assert info.certificate_data == CERT_PEM
    assert info.private_key_data == KEY_PEM
    assert info.certificate_path is None
    assert info.private_key_path is None
    assert info.token is None
    assert info.scheme is None
    assert 'SECRET' not in repr(info)


def test_client_certificate_files_relative(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(
        user={'client-certificate': 'client.crt', 'client-key': 'client.key'},
    ))
    (path.parent / 'client.crt').write_bytes(CERT_PEM)
    (path.parent / 'client.key').write_bytes(KEY_PEM)
    monkeypatch.setenv('KUBECONFIG', str(path))
    info = login(settings)
    assert info.certificate_path == str(path.parent / 'client.crt')
    assert info.private_key_path == str(path.parent / 'client.key')
    assert info.certificate_data is None
    assert info.private_key_data is None


def test_basic_auth(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(user={'username': 'admin', 'password': 'p4ss'}))
    monkeypatch.setenv('KUBECONFIG', str(path))
    info = login(settings)
    assert info.username == 'admin'
    assert info.password == 'p4ss'
    assert info.token is None
    assert info.scheme is None


def test_token_file_is_reread_on_every_login(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(user={'tokenFile': 'token.txt', 'token': 'inline'}))
    (path.parent / 'token.txt').write_text('from-file-1\n')
    monkeypatch.setenv('KUBECONFIG', str(path))
    assert login(settings).token == 'from-file-1'
    (path.parent / 'token.txt').write_text('from-file-2\n')
    assert login(settings).token == 'from-file-2'


def test_insecure_and_proxy(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(cluster={
        'insecure-skip-tls-verify': True,
        'proxy-url': 'http://proxy.local:3128',
    }))
    monkeypatch.setenv('KUBECONFIG', str(path))
    info = login(settings)
    assert info.insecure is True
    assert info.proxy_url == 'http://proxy.local:3128'


def test_trust_env_is_propagated(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('KUBECONFIG', str(write_kubeconfig(make_kubeconfig())))
    settings.networking.trust_env = True
    assert login(settings).trust_env is True


def test_context_without_user_is_anonymous(settings: Any, write_kubeconfig: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig({
        'clusters': [{'name': 'c', 'cluster': {'server': 'http://localhost:8001'}}],
        'contexts': [{'name': 'x', 'context': {'cluster': 'c'}}],
        'current-context': 'x',
    })
    monkeypatch.setenv('KUBECONFIG', str(path))
    assert login(settings) == ConnectionInfo(server='http://localhost:8001')


def test_context_override(settings: Any, write_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig({
        'clusters': [{'name': 'c1', 'cluster': {'server': 'https://one'}},
                     {'name': 'c2', 'cluster': {'server': 'https://two'}}],
        'contexts': [{'name': 'first', 'context': {'cluster': 'c1'}},
                     {'name': 'second', 'context': {'cluster': 'c2', 'namespace': 'ns2'}}],
        'current-context': 'first',
    })
    monkeypatch.setenv('KUBECONFIG', str(path))
    assert login(settings).server == 'https://one'
    info = login(settings, kubeconfig_context='second')
    assert info.server == 'https://two'
    assert info.default_namespace == 'ns2'


def test_multiple_files_are_merged_first_wins(settings: Any, write_kubeconfig: Any, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    first = write_kubeconfig({
        'clusters': [{'name': 'shared', 'cluster': {'server': 'https://from-first'}}],
        'contexts': [{'name': 'dev', 'context': {'cluster': 'shared', 'user': 'alice'}}],
        'current-context': 'dev',
    }, 'a/first.yaml')
    second = write_kubeconfig({
        'clusters': [{'name': 'shared', 'cluster': {'server': 'https://from-second'}}],
        'users': [{'name': 'alice', 'user': {'client-certificate': 'alice.crt', 'client-key': 'alice.key'}}],
        'contexts': [{'name': 'dev', 'context': {'cluster': 'shared', 'namespace': 'ignored'}},
                     {'name': 'prod', 'context': {'cluster': 'shared'}}],
        'current-context': 'prod',
    }, 'b/second.yaml')
    (second.parent / 'alice.crt').write_bytes(CERT_PEM)
    (second.parent / 'alice.key').write_bytes(KEY_PEM)
    monkeypatch.setenv('KUBECONFIG', os.pathsep.join([str(first), '', str(second)]))

    info = login(settings)
    assert info.server == 'https://from-first'
    assert info.default_namespace is None  # the first file's "dev" context wins entirely.
    # The user is from the second file, so its relative paths are relative to the second file.
    assert info.certificate_path == str(second.parent / 'alice.crt')
    assert info.private_key_path == str(second.parent / 'alice.key')


def test_current_context_from_a_later_file_if_unset_earlier(
        settings: Any, write_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    first = write_kubeconfig({
        'clusters': [{'name': 'c', 'cluster': {'server': 'https://server'}}],
        'contexts': [{'name': 'x', 'context': {'cluster': 'c', 'namespace': 'nsx'}}],
    }, 'first.yaml')
    second = write_kubeconfig({'current-context': 'x'}, 'second.yaml')
    monkeypatch.setenv('KUBECONFIG', os.pathsep.join([str(first), str(second)]))
    assert login(settings).default_namespace == 'nsx'


# Bad input: every error names what is wrong and where, and never quotes secrets.


def login_error(settings: Any, **kwargs: Any) -> str:
    with pytest.raises(LoginError) as excinfo:
        login_with_kubeconfig(settings=settings, **kwargs)
    message = str(excinfo.value)
    assert 'SECRET' not in message
    return message


def test_malformed_yaml(settings: Any, write_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig('users:\n- name: u\n  user:\n    token: SECRET-TOKEN: [oops\n')
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert str(path) in message
    assert 'not valid YAML' in message
    assert 'line 4' in message


def test_malformed_yaml_is_not_chained(settings: Any, write_kubeconfig: Any,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig('token: "SECRET-TOKEN\n')
    monkeypatch.setenv('KUBECONFIG', str(path))
    with pytest.raises(LoginError) as excinfo:
        login_with_kubeconfig(settings=settings)
    assert excinfo.value.__cause__ is None
    assert excinfo.value.__suppress_context__
    assert 'SECRET' not in str(excinfo.value)


def test_not_a_mapping(settings: Any, write_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig('- just\n- a list\n')
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert str(path) in message
    assert 'mapping' in message


def test_malformed_section(settings: Any, write_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig({'clusters': [{'cluster': {'server': 'https://x'}}]})
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert 'clusters[0]' in message
    assert str(path) in message


def test_missing_file_in_env(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    existing = write_kubeconfig(make_kubeconfig())
    missing = tmp_path / 'nowhere' / 'config'
    monkeypatch.setenv('KUBECONFIG', os.pathsep.join([str(existing), str(missing)]))
    message = login_error(settings)
    assert str(missing) in message
    assert 'does not exist' in message
    assert 'KUBECONFIG' in message


def test_directory_in_env(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('KUBECONFIG', str(tmp_path))
    message = login_error(settings)
    assert str(tmp_path) in message
    assert 'directory' in message


def test_no_current_context(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(current_context=None))
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert 'current-context' in message
    assert str(path) in message
    assert 'kubectl config use-context' in message


def test_unknown_context(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(current_context='missing-ctx'))
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert "'missing-ctx'" in message
    assert "known contexts: 'ctx'" in message
    assert str(path) in message


def test_unknown_context_override(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('KUBECONFIG', str(write_kubeconfig(make_kubeconfig())))
    message = login_error(settings, kubeconfig_context='staging')
    assert "'staging'" in message


def test_unknown_cluster(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(context={'cluster': 'ghost'}))
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert "cluster 'ghost'" in message
    assert "context 'ctx'" in message
    assert str(path) in message


def test_unknown_user(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(context={'user': 'nobody'}))
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert "user 'nobody'" in message
    assert str(path) in message


def test_cluster_without_server(settings: Any, write_kubeconfig: Any,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig({
        'clusters': [{'name': 'c', 'cluster': {}}],
        'contexts': [{'name': 'x', 'context': {'cluster': 'c'}}],
        'current-context': 'x',
    })
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert "cluster 'c'" in message
    assert '"server"' in message


def test_missing_ca_file(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(cluster={'certificate-authority': 'gone/ca.crt'}))
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert str(path.parent / 'gone' / 'ca.crt') in message
    assert '"certificate-authority"' in message
    assert "cluster 'clu'" in message


def test_unreadable_client_key(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(user={'client-certificate': 'c.crt', 'client-key': 'keydir'}))
    (path.parent / 'c.crt').write_bytes(CERT_PEM)
    (path.parent / 'keydir').mkdir()  # exists, but cannot be read as a file (even by root).
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert str(path.parent / 'keydir') in message
    assert '"client-key"' in message
    assert "user 'usr'" in message


def test_invalid_base64_data(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(user={
        'client-certificate-data': b64(CERT_PEM),
        'client-key-data': 'SECRET-KEY-but-not-base64!!',
    }))
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert '"client-key-data"' in message
    assert 'base64' in message


def test_certificate_without_key(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(user={'client-certificate-data': b64(CERT_PEM)}))
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert 'client-key' in message
    assert "user 'usr'" in message


def test_empty_token_file(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(user={'tokenFile': 'empty-token'}))
    (path.parent / 'empty-token').write_text('\n')
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert str(path.parent / 'empty-token') in message
    assert 'empty' in message


def test_auth_provider_is_explained(settings: Any, make_kubeconfig: Any, write_kubeconfig: Any,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(user={
        'auth-provider': {'name': 'oidc', 'config': {'id-token': 'SECRET-ID-TOKEN'}},
    }))
    monkeypatch.setenv('KUBECONFIG', str(path))
    message = login_error(settings)
    assert "auth-provider 'oidc'" in message
    assert "user 'usr'" in message
    assert 'kubernetes' in message and 'pykube-ng' in message and 'exec' in message
