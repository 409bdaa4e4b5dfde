import importlib.util
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from kopf._clients.logins import (
    default_login_fns,
    login_default,
    login_via_client,
    login_via_pykube,
    login_with_kubeconfig,
    login_with_service_account,
)
from kopf._cogs.structs.credentials import LoginError

both_installed = pytest.mark.skipif(
    importlib.util.find_spec('pykube') is None or importlib.util.find_spec('kubernetes') is None,
    reason='needs both pykube-ng and kubernetes',
)


def hide_module(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make a library look uninstalled: a None in sys.modules makes its import and lookup fail."""
    for module_name in list(sys.modules):
        if module_name == name or module_name.startswith(f'{name}.'):
            monkeypatch.delitem(sys.modules, module_name)
    monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture()
def kubeconfig(make_kubeconfig: Any, write_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = write_kubeconfig(make_kubeconfig(user={'token': 'default-token'}))
    monkeypatch.setenv('KUBECONFIG', str(path))
    return path


@both_installed
def test_piggybacking_when_libraries_are_installed() -> None:
    assert default_login_fns() == [login_via_pykube, login_via_client]


def test_only_one_library(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_module(monkeypatch, 'pykube')
    expected = [login_via_client] if importlib.util.find_spec('kubernetes') else [
        login_with_service_account, login_with_kubeconfig]
    assert default_login_fns() == expected


def test_builtin_logins_without_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_module(monkeypatch, 'pykube')
    hide_module(monkeypatch, 'kubernetes')
    assert default_login_fns() == [login_with_service_account, login_with_kubeconfig]


@both_installed
async def test_login_default_with_libraries(settings: Any, kubeconfig: Path) -> None:
    results = await login_default(settings, logging.getLogger('test'))
    assert set(results) == {'login_via_pykube', 'login_via_client'}
    assert all(info.token == 'default-token' for info in results.values())


async def test_login_default_without_libraries(settings: Any, kubeconfig: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    hide_module(monkeypatch, 'pykube')
    hide_module(monkeypatch, 'kubernetes')
    results = await login_default(settings, logging.getLogger('test'))
    assert list(results) == ['login_with_kubeconfig']
    assert results['login_with_kubeconfig'].token == 'default-token'


async def test_login_default_with_default_arguments(kubeconfig: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    hide_module(monkeypatch, 'pykube')
    hide_module(monkeypatch, 'kubernetes')
    results = await login_default()
    assert results['login_with_kubeconfig'].trust_env is False


async def test_login_default_finds_nothing(settings: Any) -> None:
    with pytest.raises(LoginError) as excinfo:
        await login_default(settings)
    assert 'No credentials' in str(excinfo.value)
    assert '@kopf.on.login' in str(excinfo.value)


async def test_login_default_reports_the_failure(settings: Any, write_kubeconfig: Any,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    hide_module(monkeypatch, 'pykube')
    hide_module(monkeypatch, 'kubernetes')
    path = write_kubeconfig('clusters: [oops\n')
    monkeypatch.setenv('KUBECONFIG', str(path))
    with pytest.raises(LoginError) as excinfo:
        await login_default(settings, logging.getLogger('test'))
    assert str(path) in str(excinfo.value)
    assert 'login_with_kubeconfig failed' in caplog.text
