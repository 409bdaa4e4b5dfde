import base64
import datetime
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kopf._clients.logins import forget_exec_credentials, login_with_kubeconfig
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError

CA_PEM = b'-----BEGIN CERTIFICATE-----\nfake-ca\n-----END CERTIFICATE-----\n'
FAR_FUTURE = '2099-12-31T23:59:59Z'
LONG_AGO = '2001-01-01T00:00:00Z'


@pytest.fixture()
def use_exec(make_kubeconfig: Any, write_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Write a kubeconfig whose user runs the given exec section; point KUBECONFIG to it."""
    def setup(exec_section: dict[str, Any], **cluster: Any) -> Path:
        path = write_kubeconfig(make_kubeconfig(user={'exec': exec_section}, cluster=cluster))
        monkeypatch.setenv('KUBECONFIG', str(path))
        return path
    return setup


def login(settings: Any) -> ConnectionInfo:
    info = login_with_kubeconfig(settings=settings)
    assert info is not None
    return info


def login_error(settings: Any) -> str:
    with pytest.raises(LoginError) as excinfo:
        login_with_kubeconfig(settings=settings)
    message = str(excinfo.value)
    assert 'SECRET' not in message
    return message


def test_token_from_plugin(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(args=['--flag', 'value'], token='plugin-token'))
    info = login(settings)
    assert info.token == 'plugin-token'
    assert info.scheme == 'Bearer'
    assert info.expiration is None
    assert plugin.runs == 1
    assert plugin.record['argv'] == ['--flag', 'value']
    assert plugin.record['stdin_is_empty']
    exec_info = json.loads(plugin.record['info'])
    assert exec_info == {
        'apiVersion': 'client.authentication.k8s.io/v1',
        'kind': 'ExecCredential',
        'spec': {'interactive': False},
    }


def test_v1beta1(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(api_version='client.authentication.k8s.io/v1beta1', token='beta'))
    assert login(settings).token == 'beta'
    assert json.loads(plugin.record['info'])['apiVersion'] == 'client.authentication.k8s.io/v1beta1'


def test_relative_command_resolved_against_the_kubeconfig(
        settings: Any, plugin: Any, use_exec: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_exec(plugin.exec_section(command='./plugin.py', token='relative'))
    monkeypatch.chdir(tmp_path / 'home')
    assert login(settings).token == 'relative'


def test_interpreter_as_the_command(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(command=sys.executable, args=[str(plugin.path)], token='via-python'))
    assert login(settings).token == 'via-python'


def test_cluster_info_is_provided_on_request(settings: Any, plugin: Any, use_exec: Any) -> None:
    section = plugin.exec_section()
    section['provideClusterInfo'] = True
    use_exec(section, **{
        'certificate-authority-data': base64.b64encode(CA_PEM).decode(),
        'extensions': [{'name': 'client.authentication.k8s.io/exec', 'extension': {'audience': 'x'}}],
    })
    login(settings)
    cluster = json.loads(plugin.record['info'])['spec']['cluster']
    assert cluster['server'] == 'https://k8s.example.com:6443'
    assert base64.b64decode(cluster['certificate-authority-data']) == CA_PEM
    assert cluster['config'] == {'audience': 'x'}


def test_client_certificate_from_plugin(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(mode='cert'))
    info = login(settings)
    assert info.certificate_data == b'CERT-PEM'
    assert info.private_key_data == b'KEY-PEM-SECRET'
    assert info.token is None


def test_cached_until_expiration(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(token='cached', expiration=FAR_FUTURE))
    first = login(settings)
    second = login(settings)
    assert plugin.runs == 1
    assert first == second
    assert first.expiration == datetime.datetime(2099, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)


def test_rerun_when_expired(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(token='stale', expiration=LONG_AGO))
    login(settings)
    login(settings)
    assert plugin.runs == 2


def test_not_cached_without_expiration(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(token='unknown-lifetime'))
    login(settings)
    login(settings)
    assert plugin.runs == 2


def test_forgetting_credentials_reruns_the_plugin(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(token='cached', expiration=FAR_FUTURE))
    login(settings)
    forget_exec_credentials()
    login(settings)
    assert plugin.runs == 2


def test_different_plugin_settings_are_cached_separately(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(token='one', expiration=FAR_FUTURE))
    assert login(settings).token == 'one'
    use_exec(plugin.exec_section(token='two', expiration=FAR_FUTURE))
    assert login(settings).token == 'two'
    assert plugin.runs == 2


def test_explicit_token_wins_over_exec(settings: Any, plugin: Any, make_kubeconfig: Any,
                                       write_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_kubeconfig(make_kubeconfig(user={'token': 'static', 'exec': plugin.exec_section()}))
    monkeypatch.setenv('KUBECONFIG', str(path))
    assert login(settings).token == 'static'
    assert plugin.runs == 0


# Failure modes: the message names the plugin's command and the kubeconfig user, never the output.


def test_plugin_fails(settings: Any, plugin: Any, use_exec: Any) -> None:
    path = use_exec(plugin.exec_section(mode='fail'))
    message = login_error(settings)
    assert str(plugin.path) in message
    assert "user 'usr'" in message and str(path) in message
    assert 'exit code 3' in message
    assert 'boom: run `fake-cloud login` first' in message


def test_plugin_prints_garbage(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(mode='garbage'))
    message = login_error(settings)
    assert str(plugin.path) in message
    assert 'not valid JSON' in message


def test_plugin_is_missing(settings: Any, tmp_path: Path, use_exec: Any) -> None:
    section = {
        'apiVersion': 'client.authentication.k8s.io/v1',
        'command': 'kopf-test-no-such-plugin',
        'installHint': 'Install it with: brew install no-such-plugin',
        'interactiveMode': 'Never',
    }
    use_exec(section)
    message = login_error(settings)
    assert "'kopf-test-no-such-plugin'" in message
    assert 'not found' in message
    assert 'brew install no-such-plugin' in message


def test_plugin_is_not_executable(settings: Any, plugin: Any, use_exec: Any) -> None:
    plugin.path.chmod(0o644)
    use_exec(plugin.exec_section())
    message = login_error(settings)
    assert str(plugin.path) in message
    assert 'permission denied' in message


def test_plugin_answers_with_another_api_version(settings: Any, plugin: Any, use_exec: Any) -> None:
    section = plugin.exec_section(api_version='client.authentication.k8s.io/v1')
    section['env'].append({'name': 'PLUGIN_API_VERSION', 'value': 'client.authentication.k8s.io/v1beta1'})
    use_exec(section)
    message = login_error(settings)
    assert "'client.authentication.k8s.io/v1beta1'" in message
    assert "'client.authentication.k8s.io/v1'" in message


def test_plugin_answers_without_status(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(mode='no-status'))
    assert 'without a status' in login_error(settings)


def test_plugin_answers_without_credentials(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(mode='nothing'))
    message = login_error(settings)
    assert 'status.token' in message
    assert 'status.clientCertificateData' in message


def test_plugin_answers_with_bad_expiration(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(expiration='next tuesday'))
    message = login_error(settings)
    assert 'expirationTimestamp' in message
    assert "'next tuesday'" in message


def test_unsupported_api_version_in_kubeconfig(settings: Any, plugin: Any, use_exec: Any) -> None:
    use_exec(plugin.exec_section(api_version='client.authentication.k8s.io/v1alpha1'))
    message = login_error(settings)
    assert "'client.authentication.k8s.io/v1alpha1'" in message
    assert 'client.authentication.k8s.io/v1beta1' in message
    assert plugin.runs == 0


def test_interactive_plugins_are_refused(settings: Any, plugin: Any, use_exec: Any) -> None:
    section = plugin.exec_section()
    section['interactiveMode'] = 'Always'
    use_exec(section)
    message = login_error(settings)
    assert 'interactive' in message
    assert plugin.runs == 0


def test_exec_without_command(settings: Any, use_exec: Any) -> None:
    use_exec({'apiVersion': 'client.authentication.k8s.io/v1'})
    message = login_error(settings)
    assert 'exec.command' in message
    assert "user 'usr'" in message
