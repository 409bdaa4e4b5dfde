import base64
import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from kopf._clients.logins import login_with_service_account
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError

CA_PEM = b'-----BEGIN CERTIFICATE-----\nfake-ca\n-----END CERTIFICATE-----\n'


def make_jwt(claims: dict[str, Any]) -> str:
    def encode(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip('=')
    return f'{encode({"alg": "RS256", "kid": "k"})}.{encode(claims)}.c2lnbmF0dXJl'


@pytest.fixture()
def account_dir(tmp_path: Path) -> Path:
    directory = tmp_path / 'serviceaccount'
    directory.mkdir()
    (directory / 'token').write_text('opaque-token-1\n')
    (directory / 'ca.crt').write_bytes(CA_PEM)
    (directory / 'namespace').write_text('operators')
    return directory


@pytest.fixture()
def in_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('KUBERNETES_SERVICE_HOST', '10.96.0.1')
    monkeypatch.setenv('KUBERNETES_SERVICE_PORT', '443')


def login(settings: Any, account_dir: Path) -> ConnectionInfo:
    info = login_with_service_account(settings=settings, service_account_dir=account_dir)
    assert info is not None
    return info


def test_not_in_cluster(settings: Any, account_dir: Path) -> None:
    assert login_with_service_account(settings=settings, service_account_dir=account_dir) is None


def test_standard_directory_absent(settings: Any, in_cluster: None) -> None:
    # The real mount point does not exist in the test environment: like a pod with no token mounted.
    assert not Path('/var/run/secrets/kubernetes.io/serviceaccount/token').exists()
    assert login_with_service_account(settings=settings) is None


@pytest.mark.usefixtures('in_cluster')
def test_in_cluster(settings: Any, account_dir: Path) -> None:
    info = login(settings, account_dir)
    assert info == ConnectionInfo(
        server='https://10.96.0.1:443',
        ca_path=str(account_dir / 'ca.crt'),
        scheme='Bearer',
        token='opaque-token-1',
        default_namespace='operators',
    )


@pytest.mark.usefixtures('in_cluster')
def test_no_token_mounted(settings: Any, account_dir: Path) -> None:
    (account_dir / 'token').unlink()
    assert login_with_service_account(settings=settings, service_account_dir=account_dir) is None


@pytest.mark.usefixtures('in_cluster')
def test_optional_files(settings: Any, account_dir: Path) -> None:
    (account_dir / 'ca.crt').unlink()
    (account_dir / 'namespace').unlink()
    info = login(settings, account_dir)
    assert info.ca_path is None
    assert info.default_namespace is None


def test_ipv6_host_and_custom_port(settings: Any, account_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('KUBERNETES_SERVICE_HOST', 'fd00::1')
    monkeypatch.setenv('KUBERNETES_SERVICE_PORT', '6443')
    assert login(settings, account_dir).server == 'https://[fd00::1]:6443'


@pytest.mark.usefixtures('in_cluster')
def test_token_rotation(settings: Any, account_dir: Path) -> None:
    assert login(settings, account_dir).token == 'opaque-token-1'
    (account_dir / 'token').write_text('opaque-token-2')
    assert login(settings, account_dir).token == 'opaque-token-2'


@pytest.mark.usefixtures('in_cluster')
def test_trust_env(settings: Any, account_dir: Path) -> None:
    settings.networking.trust_env = True
    assert login(settings, account_dir).trust_env is True


@pytest.mark.usefixtures('in_cluster')
def test_jwt_expiration_with_a_margin(settings: Any, account_dir: Path) -> None:
    expires = datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(hours=1)
    (account_dir / 'token').write_text(make_jwt({'sub': 'system:serviceaccount:x:y',
                                                 'exp': int(expires.timestamp())}))
    info = login(settings, account_dir)
    assert info.expiration == expires - datetime.timedelta(minutes=1)


@pytest.mark.usefixtures('in_cluster')
def test_jwt_expiring_very_soon_is_used_until_its_end(settings: Any, account_dir: Path) -> None:
    expires = datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(seconds=30)
    (account_dir / 'token').write_text(make_jwt({'exp': int(expires.timestamp())}))
    assert login(settings, account_dir).expiration == expires


@pytest.mark.usefixtures('in_cluster')
def test_jwt_without_exp(settings: Any, account_dir: Path) -> None:
    (account_dir / 'token').write_text(make_jwt({'sub': 'legacy-secret-based-token'}))
    assert login(settings, account_dir).expiration is None


@pytest.mark.usefixtures('in_cluster')
def test_expired_jwt(settings: Any, account_dir: Path) -> None:
    (account_dir / 'token').write_text(make_jwt({'exp': 1_000_000_000, 'secret': 'SECRET'}))
    with pytest.raises(LoginError) as excinfo:
        login_with_service_account(settings=settings, service_account_dir=account_dir)
    message = str(excinfo.value)
    assert str(account_dir / 'token') in message
    assert 'expired at 2001-09-09T01:46:40+00:00' in message
    assert 'eyJ' not in message  # no part of the token itself.


@pytest.mark.usefixtures('in_cluster')
def test_empty_token(settings: Any, account_dir: Path) -> None:
    (account_dir / 'token').write_text('\n')
    with pytest.raises(LoginError) as excinfo:
        login_with_service_account(settings=settings, service_account_dir=account_dir)
    assert str(account_dir / 'token') in str(excinfo.value)
    assert 'empty' in str(excinfo.value)


@pytest.mark.usefixtures('in_cluster')
def test_unreadable_token(settings: Any, account_dir: Path) -> None:
    (account_dir / 'token').unlink()
    (account_dir / 'token').mkdir()
    with pytest.raises(LoginError) as excinfo:
        login_with_service_account(settings=settings, service_account_dir=account_dir)
    assert str(account_dir / 'token') in str(excinfo.value)
