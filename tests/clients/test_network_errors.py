"""
Network failures in the logs: a short "what and where" instead of the whole connection-error object,
both in the lines of the retries (their prefix is as in Kopf) and in the final error.
"""
import logging
import socket
import ssl

import aiohttp
import pytest

from kopf._clients import api, errors, fallback
from kopf._clients.connections import (
    CannotConnect,
    ConnectionPool,
    Disconnected,
    MalformedResponse,
    NetworkError,
)
from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import StandaloneClientSettings
from kopf._cogs.structs.credentials import ConnectionInfo

SECRET_TOKEN = 'sEcReT-tOkEn-123'


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


async def _connection_error(url: str) -> BaseException:
    """The error of the lean client, and the same of aiohttp (as translated for the proxied requests)."""
    pool = ConnectionPool(url, ssl_context=None, headers={})
    try:
        await pool.request('GET', '/api')
    except NetworkError as e:
        return e
    finally:
        await pool.close()
    raise AssertionError(f'{url} has unexpectedly answered.')


async def _aiohttp_error(url: str) -> BaseException:
    async with aiohttp.ClientSession() as session:
        try:
            await session.get(url, ssl=False)
        except aiohttp.ClientError as e:
            return fallback.translate(e)
    raise AssertionError(f'{url} has unexpectedly answered.')


@pytest.mark.parametrize('scheme', ['http', 'https'])
async def test_refused_connection_names_the_url(scheme: str) -> None:
    port = _closed_port()
    for error in [await _connection_error(f'{scheme}://127.0.0.1:{port}'),
                  await _aiohttp_error(f'{scheme}://127.0.0.1:{port}/api')]:
        assert errors.describe_network_error(error) == f'connection refused to {scheme}://127.0.0.1:{port}'
        assert errors.describe_error(error) == f'connection refused to {scheme}://127.0.0.1:{port}'


@pytest.mark.parametrize('error, expected', [
    (Disconnected(), 'the server has closed the connection unexpectedly'),
    (fallback.translate(aiohttp.ServerDisconnectedError()),
     'the server has closed the connection unexpectedly'),
    (TimeoutError(), 'timed out'),
    (fallback.translate(aiohttp.ServerTimeoutError('Timeout on reading data from socket')),
     'timed out: Timeout on reading data from socket'),
    (MalformedResponse('Malformed HTTP response: not an HTTP/1.x status line'),
     'Malformed HTTP response: not an HTTP/1.x status line'),
    (fallback.translate(aiohttp.ClientPayloadError('Response payload is not completed')),
     'Response payload is not completed'),
])
def test_other_network_errors(error: BaseException, expected: str) -> None:
    assert errors.describe_network_error(error) == expected


def test_untrusted_certificates_name_the_ca_to_trust() -> None:
    os_error = ssl.SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed')
    os_error.verify_message = 'self-signed certificate in certificate chain'
    error = CannotConnect('https://127.0.0.1:6443', os_error)
    assert errors.describe_network_error(error) == (
        'the TLS certificate of https://127.0.0.1:6443 cannot be verified: '
        'self-signed certificate in certificate chain; trust the CA of the server '
        '(the cluster\'s "certificate-authority-data" or "certificate-authority" in the kubeconfig)')


def test_non_network_errors_are_described_by_their_text() -> None:
    assert errors.describe_error(ValueError('boom')) == 'boom'


@pytest.mark.looptime
async def test_retry_lines_are_short_and_say_the_delay(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    port = _closed_port()
    settings = StandaloneClientSettings()
    settings.networking.error_backoffs = [1, 2.5]
    info = ConnectionInfo(server=f'http://127.0.0.1:{port}', token=SECRET_TOKEN)
    async with Vault({'main': info}) as vault:
        with pytest.raises(CannotConnect):
            await api.request('GET', '/api', settings=settings, vault=vault)
    assert [m for m in caplog.messages if 'will retry' in m] == [
        f'Request attempt #1 failed; will retry: GET /api -> connection refused to http://127.0.0.1:{port}, '
        f'retrying in 1 s',
        f'Request attempt #2 failed; will retry: GET /api -> connection refused to http://127.0.0.1:{port}, '
        f'retrying in 2.5 s',
    ]
    assert SECRET_TOKEN not in caplog.text


async def test_vault_names_the_rejection_without_secrets() -> None:
    info = ConnectionInfo(server='https://k8s.example.com', token=SECRET_TOKEN)
    async with Vault({'main': info}) as vault:
        assert vault.rejection is None
        error = errors.make_error(401, {'kind': 'Status', 'code': 401, 'reason': 'Unauthorized'},
                                  method='GET', url='https://k8s.example.com/api')
        await vault.invalidate('main', info, exc=error)
        assert vault.rejection == 'the API server rejected the credentials (401 Unauthorized)'
        await vault.populate({'main': info})  # the same rejected credentials again: ignored
        assert vault.is_empty()
