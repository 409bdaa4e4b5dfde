"""
Whom the webhook servers let in (#40): TLS 1.2+, required client certificates, no plain HTTP unless asked,
the limits of a request's size and time, and the warnings of the refusals (one per cause, not per client).

The clients are raw sockets (asyncio's streams, with SSL contexts made here): they can do what
the HTTP libraries do not, e.g. an old TLS version, no certificate, or a request that never ends.
"""
import asyncio
import base64
import contextlib
import logging
import pathlib
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest

import kopf
from kopf._webhooks.http import WARNING_INTERVAL
from kopf.testing.apiserver import pki

pytestmark = pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")

BODY = b'{"n": 1}'


def post(body: bytes = BODY, *, length: int | None = None) -> bytes:
    length = len(body) if length is None else length
    head = f'POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n'
    return head.encode() + body


#
# A server with a recording handler, and the raw clients.
#

class Served:
    def __init__(self, port: int, config: Any) -> None:
        super().__init__()
        self.port = port
        self.config = config
        self.calls: list[Any] = []


@contextlib.asynccontextmanager
async def serving(**kwargs: Any) -> AsyncIterator[Served]:
    served = Served(0, None)

    async def fn(request: Any, *, webhook: Any = None, headers: Any = None, sslpeer: Any = None) -> Any:
        served.calls.append(request)
        subject = dict(pair for rdn in sslpeer['subject'] for pair in rdn) if sslpeer else None
        return {'request': request, 'peer': (subject or {}).get('commonName')}

    server = kopf.WebhookServer(addr='127.0.0.1', port=0, **kwargs)
    async with server:
        served.config = await asyncio.wait_for(server(fn).__anext__(), timeout=5)
        served.port = int(served.config['url'].rsplit(':', 1)[1].split('/')[0])
        yield served


def client_context(served: Served | None = None, *,
                   minimum: ssl.TLSVersion = ssl.TLSVersion.MINIMUM_SUPPORTED,
                   maximum: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED,
                   cert: tuple[pathlib.Path, pathlib.Path] | None = None) -> ssl.SSLContext:
    """A client trusting the server's CA bundle (or anything if none), of some TLS versions, with a cert."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if served is not None and 'caBundle' in served.config:
        context.load_verify_locations(cadata=base64.b64decode(served.config['caBundle']).decode())
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if minimum < ssl.TLSVersion.TLSv1_2:
        context.set_ciphers('DEFAULT:@SECLEVEL=0')  # OpenSSL 3 does TLS 1.0/1.1 only at level 0
    context.minimum_version = minimum
    context.maximum_version = maximum
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


async def exchange(port: int, data: bytes, *, context: ssl.SSLContext | None) -> bytes | None:
    """Send the data, read until the server closes; None if refused at the TLS level (no HTTP at all)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection('127.0.0.1', port, ssl=context), 5)
    except (ssl.SSLError, ConnectionError):
        return None
    try:
        writer.write(data)
        answer = await asyncio.wait_for(reader.read(), timeout=5)
    except (ssl.SSLError, ConnectionError):  # e.g. TLS 1.3's late alerts on the client certificates
        return None
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()
    return answer or None


def status_of(answer: bytes | None) -> int | None:
    return None if answer is None else int(answer.split(b' ', 2)[1])


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith('kopf')]


#
# TLS 1.2 or newer only.
#

def tls11_is_possible(tmp_path: pathlib.Path) -> bool:
    """Whether the local OpenSSL can do TLS 1.1 at all (both sides at the lowest security level)."""
    cert, key = kopf.WebhookServer.build_certificate(['localhost'])
    (tmp_path / 'probe.pem').write_bytes(cert)
    (tmp_path / 'probe-key.pem').write_bytes(key)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / 'probe.pem', tmp_path / 'probe-key.pem')
    client = client_context(minimum=ssl.TLSVersion.TLSv1, maximum=ssl.TLSVersion.TLSv1_1)
    try:
        server_context.set_ciphers('DEFAULT:@SECLEVEL=0')
        server_context.minimum_version = ssl.TLSVersion.TLSv1
    except (ssl.SSLError, ValueError):
        return False
    bios = [ssl.MemoryBIO() for _ in range(4)]
    server = server_context.wrap_bio(bios[0], bios[1], server_side=True)
    client_side = client.wrap_bio(bios[2], bios[3])
    for _ in range(10):
        done = 0
        for side, outgoing, incoming in [(client_side, bios[3], bios[0]), (server, bios[1], bios[2])]:
            try:
                side.do_handshake()
                done += 1
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass
            except ssl.SSLError:
                return False
            incoming.write(outgoing.read())
        if done == 2:
            return client_side.version() == 'TLSv1.1'
    return False


def lax_server_context(tmp_path: pathlib.Path) -> ssl.SSLContext:
    """A user's context that allows TLS 1.0 & 1.1 with the weakest ciphers."""
    cert, key = kopf.WebhookServer.build_certificate(['127.0.0.1'])
    (tmp_path / 'server.pem').write_bytes(cert)
    (tmp_path / 'server-key.pem').write_bytes(key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / 'server.pem', tmp_path / 'server-key.pem')
    context.set_ciphers('DEFAULT:@SECLEVEL=0')
    context.minimum_version = ssl.TLSVersion.TLSv1
    return context


@pytest.mark.parametrize('version, expected', [
    pytest.param(ssl.TLSVersion.TLSv1_1, None, id='tls1.1-refused'),
    pytest.param(ssl.TLSVersion.TLSv1_2, 200, id='tls1.2-served'),
    pytest.param(ssl.TLSVersion.TLSv1_3, 200, id='tls1.3-served'),
])
@pytest.mark.parametrize('given_context', [False, True], ids=['self-signed', 'given-context'])
async def test_tls_versions(tmp_path: pathlib.Path, given_context: bool,
                            version: ssl.TLSVersion, expected: int | None) -> None:
    if version == ssl.TLSVersion.TLSv1_1 and not tls11_is_possible(tmp_path):
        pytest.skip('The local OpenSSL cannot do TLS 1.1 at all, even at @SECLEVEL=0.')
    kwargs: dict[str, Any] = {'context': lax_server_context(tmp_path)} if given_context else {}
    async with serving(**kwargs) as served:
        context = client_context(minimum=min(version, ssl.TLSVersion.TLSv1_2), maximum=version)
        context.minimum_version = version  # exactly this version, nothing newer to fall back to
        answer = await exchange(served.port, post(), context=context)
    assert status_of(answer) == expected
    assert len(served.calls) == (1 if expected else 0)


async def test_given_context_of_only_old_tls_versions_is_an_error(tmp_path: pathlib.Path) -> None:
    context = lax_server_context(tmp_path)
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ValueError, match=r'allows only .*TLSv1_1.*TLS 1.2 or newer is required'):
        async with serving(context=context):
            pass


#
# The client certificates: required if asked, verified only by the given CAs.
#

def issue(ca: pki.CertificateAuthority, name: str,
          directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A client certificate signed by the CA: the paths of its certificate & key."""
    pair = ca.issue_client_certificate(name)
    certfile, keyfile = directory / f'{name}.pem', directory / f'{name}-key.pem'
    certfile.write_bytes(pair.cert_pem)
    keyfile.write_bytes(pair.key_pem)
    return certfile, keyfile


@pytest.fixture
def cas(tmp_path: pathlib.Path) -> dict[str, Any]:
    """Our CA (trusted by the server), another one, and the clients' certificates signed by them."""
    ours, other = pki.CertificateAuthority.generate('ours'), pki.CertificateAuthority.generate('other')
    (tmp_path / 'ca.pem').write_bytes(ours.cert_pem)
    return {
        'cafile': tmp_path / 'ca.pem',
        'other': other,
        'right': issue(ours, 'apiserver', tmp_path),
        'wrong': issue(other, 'intruder', tmp_path),
    }


@pytest.mark.parametrize('version', [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3],
                         ids=['tls1.2', 'tls1.3'])
async def test_required_client_certificates(cas: dict[str, Any], version: ssl.TLSVersion,
                                            caplog: pytest.LogCaptureFixture) -> None:
    async with serving(verify_mode=ssl.CERT_REQUIRED, verify_cafile=cas['cafile']) as served:
        answers = {}
        for name, cert in [('none', None), ('wrong', cas['wrong']), ('right', cas['right'])]:
            context = client_context(served, minimum=version, maximum=version, cert=cert)
            answers[name] = await exchange(served.port, post(), context=context)
    assert status_of(answers['none']) is None
    assert status_of(answers['wrong']) is None
    assert status_of(answers['right']) == 200
    assert answers['right'] is not None and answers['right'].endswith(b'"peer":"apiserver"}')
    assert len(served.calls) == 1
    warnings = warnings_of(caplog)
    assert len(warnings) == 2
    assert 'presented no certificate, but verify_mode=CERT_REQUIRED' in warnings[0]
    assert 'its certificate is not trusted' in warnings[1]


@pytest.mark.parametrize('kwargs', [
    pytest.param({'verify_mode': ssl.CERT_REQUIRED}, id='required'),
    pytest.param({}, id='optional'),  # as in the docs' example: verified if presented
])
async def test_public_cas_of_the_system_are_not_trusted_for_client_certificates(
        cas: dict[str, Any], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any],
) -> None:
    # The "system's" trust store of OpenSSL has the other CA, e.g. a public one, which signs anyone:
    # ssl.create_default_context() does not load it for the client certificates, and so must it stay.
    (tmp_path / 'system.pem').write_bytes(cas['other'].cert_pem)
    monkeypatch.setenv('SSL_CERT_FILE', str(tmp_path / 'system.pem'))
    monkeypatch.setenv('SSL_CERT_DIR', str(tmp_path / 'nowhere'))
    async with serving(verify_cafile=cas['cafile'], **kwargs) as served:
        wrong = await exchange(served.port, post(), context=client_context(served, cert=cas['wrong']))
        right = await exchange(served.port, post(), context=client_context(served, cert=cas['right']))
    assert status_of(wrong) is None
    assert status_of(right) == 200
    assert len(served.calls) == 1


async def test_without_verification_clients_without_certificates_are_served() -> None:
    async with serving() as served:
        answer = await exchange(served.port, post(), context=client_context(served))
    assert status_of(answer) == 200
    assert answer is not None and answer.endswith(b'"peer":null}')


async def test_bad_ca_of_the_client_certificates_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    (tmp_path / 'ca.pem').write_bytes(b'not a certificate')
    with pytest.raises(ValueError, match=r'^The CA certificates of verify_cafile=/verify_capath='
                                         r'/verify_cadata= cannot be loaded \(.*\): give PEM files'):
        async with serving(verify_mode=ssl.CERT_REQUIRED, verify_cafile=tmp_path / 'ca.pem'):
            pass


@pytest.mark.parametrize('kwargs, message', [
    ({'insecure': True, 'verify_cafile': 'ca.pem'},
     r'^insecure=True serves plain HTTP, where no client certificates are verified: '
     r'drop verify_cafile= or insecure=True\.$'),
    ({'insecure': True, 'verify_mode': ssl.CERT_REQUIRED, 'verify_cadata': 'x'},
     r'^insecure=True .*: drop verify_mode=/verify_cadata= or insecure=True\.$'),
    ({'verify_mode': ssl.CERT_REQUIRED},
     r'^verify_mode=<VerifyMode.CERT_REQUIRED: 2> verifies the client certificates, but no CA is given '
     r'to verify them with: add verify_cafile=, verify_capath= or verify_cadata=\.$'),
    ({'max_body_size': 0}, r'^max_body_size= must be a positive number of bytes, got 0\.$'),
    ({'request_timeout': -1}, r'^request_timeout= must be a positive number of seconds, got -1\.$'),
])
def test_contradicting_or_bad_options_are_clear_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kopf.WebhookServer(**kwargs)


#
# No review over plain HTTP, unless asked for.
#

async def test_plain_http_to_the_https_server_gets_no_review(caplog: pytest.LogCaptureFixture) -> None:
    async with serving() as served:
        answers = [await exchange(served.port, post(), context=None) for _ in range(3)]
    assert served.config['url'].startswith('https://')
    assert answers == [None, None, None]
    assert served.calls == []
    warnings = warnings_of(caplog)
    assert len(warnings) == 1  # not one per request
    assert warnings[0].startswith('Refused a plain-HTTP request from 127.0.0.1:')
    assert warnings[0].endswith('the webhook server serves only HTTPS; use https:// URLs.')


async def test_plain_http_only_when_asked_for(caplog: pytest.LogCaptureFixture) -> None:
    async with serving(insecure=True) as served:
        answer = await exchange(served.port, post(), context=None)
    assert served.config == {'url': served.config['url']}  # no caBundle
    assert served.config['url'].startswith('http://127.0.0.1:')
    assert status_of(answer) == 200
    assert warnings_of(caplog) == []  # on the loopback: nobody else can reach it


async def test_plain_http_on_all_interfaces_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    server = kopf.WebhookServer(addr='0.0.0.0', port=0, insecure=True)
    async with server:
        async def fn(request: Any, **_: Any) -> Any:
            return {}
        await asyncio.wait_for(server(fn).__anext__(), timeout=5)
    assert warnings_of(caplog) == [
        'The webhook server serves plain HTTP (insecure=True) on 0.0.0.0: anyone who can reach it can send '
        'reviews; listen on localhost (addr=) unless this is meant.']


#
# The limits: the size of a request's body, the time of a handshake and of a request.
#

async def test_oversized_body_gets_413_without_the_handler(caplog: pytest.LogCaptureFixture) -> None:
    async with serving(max_body_size=len(BODY)) as served:
        context = client_context(served)
        fitting = await exchange(served.port, post(BODY), context=context)
        oversized = await exchange(served.port, post(BODY + b' '), context=context)
        # Only the head, as a client that waits for the answer before sending a huge body: not read at all.
        announced = await exchange(served.port, post(b'', length=10**9), context=context)
    assert status_of(fitting) == 200
    assert status_of(oversized) == 413
    assert status_of(announced) == 413
    assert oversized is not None and b'\r\nConnection: close\r\n' in oversized
    assert len(served.calls) == 1
    warnings = warnings_of(caplog)
    assert len(warnings) == 1  # not one per request
    assert warnings[0].startswith('Refused a webhook request from 127.0.0.1:')
    assert warnings[0].endswith(f'The request body is above the limit of {len(BODY)} bytes. '
                                f'If the reviews are this big, raise WebhookServer(max_body_size=...).')


@pytest.mark.looptime
async def test_repeated_warnings_are_one_per_cause_per_interval(cas: dict[str, Any],
                                                                caplog: pytest.LogCaptureFixture) -> None:
    kwargs = {'verify_mode': ssl.CERT_REQUIRED, 'verify_cafile': cas['cafile'], 'max_body_size': 10}
    async with serving(**kwargs) as served:
        for _ in range(3):
            assert await exchange(served.port, post(), context=client_context(served)) is None
            assert await exchange(served.port, post(), context=None) is None
            with_cert = client_context(served, cert=cas['right'])
            assert status_of(await exchange(served.port, post(b'x' * 11), context=with_cert)) == 413
        first = warnings_of(caplog)
        await asyncio.sleep(WARNING_INTERVAL)
        caplog.clear()
        assert await exchange(served.port, post(), context=client_context(served)) is None
        later = warnings_of(caplog)
    assert len(first) == 3
    assert [w.split(':')[0] for w in first] == ['Refused a TLS client 127.0.0.1',
                                                'Refused a plain-HTTP request from 127.0.0.1',
                                                'Refused a webhook request from 127.0.0.1']
    assert len(later) == 1
    assert later[0].endswith('(2 more like this since the last warning.)')
    assert served.calls == []


@pytest.mark.looptime
@pytest.mark.parametrize('tls', [False, True], ids=['http', 'https'])
@pytest.mark.parametrize('what', ['head', 'body'])
async def test_slow_client_is_disconnected(tls: bool, what: str) -> None:
    """Slowloris: the request trickles in, a byte a second, never ending; the deadline is since its start."""
    data = post(b'{"n": 1, "padding": "' + b'x' * 100 + b'"}')
    data = data[:data.index(b'\r\n\r\n')] if what == 'head' else data[:-1]
    async with serving(insecure=not tls, request_timeout=5) as served:
        context = client_context(served) if tls else None
        reader, writer = await asyncio.open_connection('127.0.0.1', served.port, ssl=context)
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def trickle() -> None:
            for byte in data:
                writer.write(bytes([byte]))
                await asyncio.sleep(1)  # the client's pace, not a synchronisation

        trickling = asyncio.create_task(trickle())
        try:
            answer = await asyncio.wait_for(reader.read(), timeout=60)
            closed = loop.time()
        finally:
            trickling.cancel()
            writer.close()
    assert status_of(answer) == 408
    assert 5 <= closed - started <= 7
    assert served.calls == []


@pytest.mark.looptime
async def test_stalled_tls_handshake_is_disconnected() -> None:
    async with serving(handshake_timeout=3) as served:
        reader, writer = await asyncio.open_connection('127.0.0.1', served.port)
        writer.write(b'\x16\x03\x01')  # the beginning of a TLS record, and then nothing
        started = asyncio.get_running_loop().time()
        answer = await asyncio.wait_for(reader.read(), timeout=60)
        closed = asyncio.get_running_loop().time()
        writer.close()
    assert answer == b''
    assert 3 <= closed - started <= 4
    assert served.calls == []
