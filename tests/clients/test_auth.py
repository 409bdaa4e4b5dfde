import contextlib
import os
import pathlib
import ssl
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import aiohttp.test_utils
import kmock
import pytest
from cryptography import x509

from kopf._clients import api, auth
from kopf._clients.connections import CannotConnect, ConnectionPool, NetworkError
from kopf._clients.fallback import FallbackSession
from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import StandaloneClientSettings
from kopf._cogs.helpers import tls
from kopf._cogs.structs.credentials import AiohttpSession, ConnectionInfo, KubeContext

from .._pki import issue_via_intermediate

pytestmark = pytest.mark.looptime

CERTS = pathlib.Path(__file__).parent / 'certs'


@contextlib.asynccontextmanager
async def _serving_tls(context: ssl.SSLContext) -> AsyncIterator[tuple[kmock.RawHandler, str]]:
    """A mock server over HTTPS with this server-side context; its handler and URL."""

    class TLSServer(aiohttp.test_utils.RawTestServer):
        async def start_server(self, *args: Any, **kwargs: Any) -> None:
            await super().start_server(*args, ssl=context, **kwargs)

    async with (
        kmock.RawHandler(strict=True) as handler,
        kmock.Server(handler, server_cls=TLSServer) as server,
    ):
        yield handler, str(server.url).rstrip('/')


@pytest.fixture
async def tls_server() -> AsyncIterator[tuple[kmock.RawHandler, str]]:
    """A mock server over HTTPS that requires a client certificate signed by the test CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(CERTS / 'ca.crt'))
    tls.verify_as_kubernetes(context)  # as kube-apiserver verifies the clients (the test CA has no key usage)
    context.load_cert_chain(CERTS / 'server.crt', CERTS / 'server.key')
    context.verify_mode = ssl.CERT_REQUIRED
    async with _serving_tls(context) as (handler, url):
        handler['get /api'] << (lambda req: {'peer': req._raw_request.transport.get_extra_info('peercert')})
        yield handler, url


def _kopf_tmpdirs() -> set[str]:
    # Only the client's own directories: other tools (e.g. emulators) may create theirs meanwhile.
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith('kopf-credentials-')}


async def test_tls_with_data(tls_server: tuple[kmock.RawHandler, str]) -> None:
    _, url = tls_server
    assert url.startswith('https://')
    info = ConnectionInfo(
        server=url,
        ca_data=(CERTS / 'ca.crt').read_bytes(),
        certificate_data=(CERTS / 'client.crt').read_bytes(),
        private_key_data=(CERTS / 'client.key').read_bytes(),
    )
    tmpdirs_before = _kopf_tmpdirs()
    async with Vault({'main': info}) as vault:
        result = await api.request('GET', '/api', settings=StandaloneClientSettings(), vault=vault)
    subject = dict(pair[0] for pair in result['peer']['subject'])
    assert subject == {'commonName': 'kopf-test-client'}
    assert _kopf_tmpdirs() == tmpdirs_before  # the secrets are not left on the disk


async def test_tls_with_paths(tls_server: tuple[kmock.RawHandler, str]) -> None:
    _, url = tls_server
    info = ConnectionInfo(
        server=url,
        ca_path=str(CERTS / 'ca.crt'),
        certificate_path=str(CERTS / 'client.crt'),
        private_key_path=str(CERTS / 'client.key'),
    )
    async with Vault({'main': info}) as vault:
        result = await api.request('GET', '/api', settings=StandaloneClientSettings(), vault=vault)
    subject = dict(pair[0] for pair in result['peer']['subject'])
    assert subject == {'commonName': 'kopf-test-client'}


async def test_tls_insecure_skips_server_verification(tls_server: tuple[kmock.RawHandler, str]) -> None:
    handler, url = tls_server
    info = ConnectionInfo(
        server=url,
        insecure=True,
        certificate_path=str(CERTS / 'client.crt'),
        private_key_path=str(CERTS / 'client.key'),
    )
    async with Vault({'main': info}) as vault:
        await api.request('GET', '/api', settings=StandaloneClientSettings(), vault=vault)
    assert len(handler) == 1


async def test_tls_unknown_ca_fails(tls_server: tuple[kmock.RawHandler, str]) -> None:
    handler, url = tls_server
    settings = StandaloneClientSettings()
    settings.networking.error_backoffs = []
    info = ConnectionInfo(
        server=url,
        certificate_path=str(CERTS / 'client.crt'),
        private_key_path=str(CERTS / 'client.key'),
    )
    async with Vault({'main': info}) as vault:
        with pytest.raises(CannotConnect) as err:
            await api.request('GET', '/api', settings=settings, vault=vault)
    assert isinstance(err.value.os_error, ssl.SSLCertVerificationError)
    assert len(handler) == 0


async def test_tls_without_client_certificate_fails(tls_server: tuple[kmock.RawHandler, str]) -> None:
    handler, url = tls_server
    settings = StandaloneClientSettings()
    settings.networking.error_backoffs = []
    info = ConnectionInfo(server=url, ca_path=str(CERTS / 'ca.crt'))
    async with Vault({'main': info}) as vault:
        with pytest.raises(NetworkError):  # refused in the handshake, or the connection dropped after it
            await api.request('GET', '/api', settings=settings, vault=vault)
    assert len(handler) == 0


def test_the_test_ca_has_no_key_usage_as_some_clusters_cas() -> None:
    # The TLS tests above connect with it: Python 3.13's default verification alone would reject it.
    ca = x509.load_pem_x509_certificate((CERTS / 'ca.crt').read_bytes())
    assert x509.KeyUsage not in [extension.value.__class__ for extension in ca.extensions]


@pytest.mark.parametrize('key_usage', [True, False], ids=['ca-with-key-usage', 'ca-without-key-usage'])
async def test_tls_trusting_an_intermediate_ca_as_kubectl_does(
        tmp_path: pathlib.Path, key_usage: bool,
) -> None:
    # A kubeconfig's CA can be an intermediate one (not self-signed), and have no key usage extension
    # (e.g. MicroK8s'): kubectl trusts it as given, and so does the client, on every Python version.
    intermediate, server_cert = issue_via_intermediate('server', key_usage=key_usage, server=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*server_cert.write(tmp_path, 'server', chain=(intermediate,)))
    async with _serving_tls(context) as (handler, url):
        handler['get /api'] << {'kind': 'APIVersions'}
        info = ConnectionInfo(server=url, ca_data=intermediate.cert_pem)
        async with Vault({'main': info}) as vault:
            result = await api.request('GET', '/api', settings=StandaloneClientSettings(), vault=vault)
    assert result == {'kind': 'APIVersions'}


def test_tls_verification_is_the_same_on_every_python_version() -> None:
    # Python 3.13 made the default contexts strict (RFC 5280) and partial; Kubernetes (Go) is partial only.
    context = auth.make_ssl_context(ConnectionInfo(server='https://x', ca_path=str(CERTS / 'ca.crt')))
    assert not context.verify_flags & ssl.VERIFY_X509_STRICT
    assert context.verify_flags & ssl.VERIFY_X509_PARTIAL_CHAIN


def test_ssl_context_flags() -> None:
    context = auth.make_ssl_context(ConnectionInfo(server='https://x', insecure=True))
    assert context.verify_mode == ssl.CERT_NONE
    assert not context.check_hostname

    context = auth.make_ssl_context(ConnectionInfo(server='https://x', ca_path=str(CERTS / 'ca.crt')))
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert [cert['subject'] for cert in context.get_ca_certs()] == [((('commonName', 'kopf-test-ca'),),)]


def test_broken_private_key_data_not_leaked() -> None:
    secret = b'-----BEGIN PRIVATE KEY-----\nTOP-SECRET-KEY-MATERIAL\n-----END PRIVATE KEY-----\n'
    info = ConnectionInfo(server='https://x', certificate_data=(CERTS / 'client.crt').read_bytes(),
                          private_key_data=secret)
    tmpdirs_before = _kopf_tmpdirs()
    with pytest.raises(ssl.SSLError) as exc_info:
        auth.make_ssl_context(info)
    assert b'TOP-SECRET' not in str(exc_info.value).encode()
    assert _kopf_tmpdirs() == tmpdirs_before


@pytest.mark.parametrize('info, expected', [
    (ConnectionInfo(server='https://x'), None),
    (ConnectionInfo(server='https://x', token='t'), 'Bearer t'),
    (ConnectionInfo(server='https://x', token='t', scheme='Digest'), 'Digest t'),
    (ConnectionInfo(server='https://x', username='u', password='p'), 'Basic dTpw'),
    (ConnectionInfo(server='https://x', username='u'), 'Basic dTo='),
])
def test_authorization_header(info: ConnectionInfo, expected: str | None) -> None:
    headers = auth.make_headers(info)
    assert headers.get('Authorization') == expected
    assert headers['User-Agent'] == 'kopf'


@pytest.mark.parametrize('info_flag, settings_flag, expected', [
    (False, False, False),
    (True, False, True),
    (False, True, True),
])
async def test_trust_env(info_flag: bool, settings_flag: bool, expected: bool) -> None:
    context = auth.APIContext(ConnectionInfo(server='http://x', trust_env=info_flag), trust_env=settings_flag)
    try:
        # The environment's proxies are aiohttp's business: the lean client serves only without them.
        assert isinstance(context.transport, FallbackSession) is expected
        assert isinstance(context.transport, ConnectionPool) is not expected
    finally:
        await context.close()


async def test_proxy_url(kmock: kmock.RawHandler, server: str) -> None:
    # The mock server plays the proxy: plain-HTTP requests via a proxy go with the full URL.
    kmock['get /api'] << {'proxied': True}
    info = ConnectionInfo(server='http://cluster.example.com:8080', proxy_url=server)
    async with Vault({'main': info}) as vault:
        result = await api.request('GET', '/api', settings=StandaloneClientSettings(), vault=vault)
    assert result == {'proxied': True}
    assert kmock[0].headers['Host'] == 'cluster.example.com:8080'


async def test_custom_aiohttp_session_makes_the_requests_and_stays_open(kmock: kmock.RawHandler) -> None:
    # kopf.AiohttpSession: the requests go through the caller's session (its own headers, its tracing),
    # to the given server; the framework does not close the caller's session.
    seen: list[str] = []

    async def on_request_start(session: Any, context: Any, params: aiohttp.TraceRequestStartParams) -> None:
        seen.append(f'{params.method} {params.url.path}')

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_request_start)
    kmock['get /api'] << (lambda req: {'auth': req.headers.get('Authorization')})
    async with aiohttp.ClientSession(headers={'Authorization': 'Bearer custom'},
                                     trace_configs=[trace]) as session:
        info = AiohttpSession(server=str(kmock.url).rstrip('/'), aiohttp_session=session)
        async with Vault({'main': info}) as vault:
            result = await api.request('GET', '/api', settings=StandaloneClientSettings(), vault=vault)
        assert result == {'auth': 'Bearer custom'}
        assert seen == ['GET /api']
        assert not session.closed
    assert 'custom' not in repr(info)


def test_credentials_are_keyword_only_as_in_kopf() -> None:
    with pytest.raises(TypeError):
        ConnectionInfo('https://example.com')  # type: ignore[misc]
    assert isinstance(ConnectionInfo(server='https://x'), KubeContext)
    assert issubclass(AiohttpSession, KubeContext)
