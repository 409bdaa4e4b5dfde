"""The webhook servers' HTTP layer, byte by byte: keep-alive, pipelining, 100-continue, refusals."""
import asyncio
import base64
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest

import kopf
from kopf._webhooks import http
from kopf._webhooks.http import HANDSHAKE_TIMEOUT, IDLE_TIMEOUT, REQUEST_TIMEOUT


async def echo(request: Any, *, webhook: Any = None, headers: Any = None, sslpeer: Any = None) -> Any:
    return {'webhook': webhook, 'request': request, 'agent': (headers or {}).get('user-agent')}


@pytest.fixture
async def address() -> AsyncIterator[tuple[str, int]]:
    server = kopf.WebhookServer(addr='127.0.0.1', port=0, insecure=True, path='/hooks')
    async with server:
        config = await asyncio.wait_for(server(echo).__anext__(), timeout=5)
        host, port = config['url'].split('//')[1].split('/')[0].split(':')
        yield host, int(port)


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f'POST {path} HTTP/1.1', 'Host: x', f'Content-Length: {len(body)}', *extra]
    return ('\r\n'.join(head) + '\r\n\r\n').encode() + body


async def read_response(reader: asyncio.StreamReader, *,
                        bound: float = 5) -> tuple[int, dict[str, str], bytes]:
    head = (await asyncio.wait_for(reader.readuntil(b'\r\n\r\n'), timeout=bound)).decode()
    lines = head.split('\r\n')
    status = int(lines[0].split(' ')[1])
    pairs = (line.partition(':') for line in lines[1:] if line)
    headers = {name.lower(): value.strip() for name, _, value in pairs}
    body = await reader.readexactly(int(headers.get('content-length', '0')))
    return status, headers, body


async def test_keep_alive_and_pipelining(address: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(post('/hooks/a', b'{"n": 1}', 'User-Agent: test') + post('/hooks/b', b'{"n": 2}'))
    first = await read_response(reader)
    second = await read_response(reader)
    writer.write(post('/hooks/c', b'{"n": 3}'))
    third = await read_response(reader)
    writer.close()
    assert [status for status, _, _ in (first, second, third)] == [200, 200, 200]
    assert json.loads(first[2]) == {'webhook': 'a', 'request': {'n': 1}, 'agent': 'test'}
    assert json.loads(second[2])['webhook'] == 'b'
    assert json.loads(third[2])['webhook'] == 'c'
    assert first[1]['content-type'] == 'application/json'


async def test_requests_split_into_pieces(address: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*address)
    data = post('/hooks/a', b'{"n": 1}')
    for i in range(len(data)):
        writer.write(data[i:i + 1])
        await writer.drain()
    status, _, body = await read_response(reader)
    writer.close()
    assert status == 200
    assert json.loads(body)['request'] == {'n': 1}


async def test_expect_100_continue(address: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*address)
    body = b'{"n": 1}'
    length = f'Content-Length: {len(body)}'.encode()
    writer.write(post('/hooks/a', b'', 'Expect: 100-continue').replace(b'Content-Length: 0', length))
    interim = await asyncio.wait_for(reader.readuntil(b'\r\n\r\n'), timeout=5)
    writer.write(body)
    status, _, answer = await read_response(reader)
    writer.close()
    assert interim == b'HTTP/1.1 100 Continue\r\n\r\n'
    assert status == 200
    assert json.loads(answer)['request'] == {'n': 1}


@pytest.mark.parametrize('request_bytes, expected_status', [
    (b'NONSENSE\r\n\r\n', 400),
    (b'POST /hooks/a HTTP/1.1\r\nbad header line\r\n\r\n', 400),
    (b'POST /hooks/a HTTP/1.1\r\nContent-Length: x\r\n\r\n', 400),
    (b'POST /hooks/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n0\r\n\r\n', 411),
    (b'POST /hooks/a HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n', 413),
])
async def test_refusals_close_the_connection(address: tuple[str, int], request_bytes: bytes,
                                             expected_status: int) -> None:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(request_bytes)
    status, headers, body = await read_response(reader)
    rest = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    assert status == expected_status
    assert headers['connection'] == 'close'
    assert body  # an explanation
    assert rest == b''  # closed


async def test_connection_close_and_http10(address: tuple[str, int]) -> None:
    for data in [post('/hooks/a', b'{}', 'Connection: close'),
                 post('/hooks/a', b'{}').replace(b'HTTP/1.1', b'HTTP/1.0')]:
        reader, writer = await asyncio.open_connection(*address)
        writer.write(data)
        status, headers, _ = await read_response(reader)
        rest = await asyncio.wait_for(reader.read(), timeout=5)
        writer.close()
        assert status == 200
        assert headers['connection'] == 'close'
        assert rest == b''


async def test_non_utf8_body_is_a_bad_review(address: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(post('/hooks/a', b'\xff\xfe'))
    status, _, body = await read_response(reader)
    writer.close()
    assert status == 400
    assert b'not a JSON admission review' in body


async def test_tls_handshake_failures_do_not_break_the_server() -> None:
    server = kopf.WebhookServer(addr='127.0.0.1', port=0)
    async with server:
        config = await asyncio.wait_for(server(echo).__anext__(), timeout=5)
        port = int(config['url'].rsplit(':', 1)[1])
        # A plain-HTTP client to the HTTPS server: the handshake fails, the server goes on.
        reader, writer = await asyncio.open_connection('127.0.0.1', port)
        writer.write(post('/a', b'{}'))
        try:
            closed_with = await asyncio.wait_for(reader.read(), timeout=5)
        except ConnectionResetError:
            closed_with = b''
        writer.close()
        assert closed_with == b''
        context = ssl.create_default_context(cadata=base64.b64decode(config['caBundle']).decode())
        reader, writer = await asyncio.open_connection('127.0.0.1', port, ssl=context)
        writer.write(post('/a', b'{"n": 1}'))
        status, _, body = await read_response(reader)
        writer.close()
    assert status == 200
    assert json.loads(body)['request'] == {'n': 1}


# The timeouts: a client cannot hold a socket forever. The defaults are used as they are (the time is
# fake with looptime), so these tests also check that the servers get them; each one waits for the
# outcome with a bound, and checks when it happened: not before the timeout, not long after it.

@contextlib.asynccontextmanager
async def serving(fn: Any = echo, **kwargs: Any) -> AsyncIterator[tuple[str, int]]:
    server = kopf.WebhookServer(addr='127.0.0.1', port=0, path='/hooks', **kwargs)
    async with server:
        config = await asyncio.wait_for(server(fn).__anext__(), timeout=5)
        yield '127.0.0.1', int(config['url'].split('//')[1].split('/')[0].split(':')[1])


async def read_until_closed(reader: asyncio.StreamReader, *, bound: float) -> tuple[bytes, float]:
    """All the bytes until the server closes the connection, and when it did (in the loop's time)."""
    data = await asyncio.wait_for(reader.read(), timeout=bound)
    return data, asyncio.get_running_loop().time()


@pytest.mark.looptime
async def test_stalled_tls_handshake_is_closed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with serving() as address:
        reader, writer = await asyncio.open_connection(*address)
        writer.write(b'\x16\x03\x01')  # the beginning of a TLS record, and then nothing
        started = asyncio.get_running_loop().time()
        data, closed = await read_until_closed(reader, bound=HANDSHAKE_TIMEOUT * 2)
        writer.close()
    assert data == b''
    assert HANDSHAKE_TIMEOUT <= closed - started <= HANDSHAKE_TIMEOUT + 2
    assert [r.levelno for r in caplog.records if 'handshake has not finished' in r.message] == [logging.DEBUG]


@pytest.mark.looptime
@pytest.mark.parametrize('partial', [
    pytest.param(b'POST /hooks/a HTTP/1.1\r\nHost: x\r\n', id='head'),
    pytest.param(post('/hooks/a', b'{"n": 1}')[:-3], id='body'),
])
async def test_partial_request_gets_408_and_is_closed(partial: bytes,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with serving(insecure=True) as address:
        reader, writer = await asyncio.open_connection(*address)
        writer.write(partial)
        started = asyncio.get_running_loop().time()
        data, closed = await read_until_closed(reader, bound=REQUEST_TIMEOUT * 2)
        writer.close()
    head, _, body = data.partition(b'\r\n\r\n')
    assert head.split(b'\r\n')[0] == b'HTTP/1.1 408 Request Timeout'
    assert b'Connection: close' in head.split(b'\r\n')
    assert body == b'The request has not arrived in full in time.\n'
    assert REQUEST_TIMEOUT <= closed - started <= REQUEST_TIMEOUT + 2
    assert [r.levelno for r in caplog.records if 'not arrived' in r.message] == [logging.DEBUG]


@pytest.mark.looptime
async def test_tls_partial_request_gets_408_and_is_closed() -> None:
    async with serving() as address:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        reader, writer = await asyncio.open_connection(*address, ssl=context)
        writer.write(b'POST /hooks/a HTTP/1.1\r\n')
        started = asyncio.get_running_loop().time()
        status, headers, _ = await read_response(reader, bound=REQUEST_TIMEOUT * 2)
        closed_at = asyncio.get_running_loop().time()
        writer.close()
    assert status == 408
    assert headers['connection'] == 'close'
    assert REQUEST_TIMEOUT <= closed_at - started <= REQUEST_TIMEOUT + 2


@pytest.mark.looptime
async def test_idle_keep_alive_connection_is_closed_quietly(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with serving(insecure=True) as address:
        reader, writer = await asyncio.open_connection(*address)
        writer.write(post('/hooks/a', b'{"n": 1}'))
        status, headers, _ = await read_response(reader)
        answered = asyncio.get_running_loop().time()
        data, closed = await read_until_closed(reader, bound=IDLE_TIMEOUT * 2)
        writer.close()
    assert status == 200
    assert 'connection' not in headers  # kept alive
    assert data == b''  # no answer to the closing: no request was there
    assert IDLE_TIMEOUT <= closed - answered <= IDLE_TIMEOUT + 2
    assert [r.levelno for r in caplog.records if 'idle connection' in r.message] == [logging.DEBUG]
    assert not [r for r in caplog.records if r.levelno > logging.DEBUG]


@pytest.mark.looptime
async def test_new_connection_without_a_request_is_closed_quietly() -> None:
    async with serving(insecure=True) as address:
        reader, writer = await asyncio.open_connection(*address)
        started = asyncio.get_running_loop().time()
        data, closed = await read_until_closed(reader, bound=REQUEST_TIMEOUT * 2)
        writer.close()
    assert data == b''
    assert REQUEST_TIMEOUT <= closed - started <= REQUEST_TIMEOUT + 2


@pytest.mark.looptime
async def test_active_connection_is_not_closed() -> None:
    async with serving(insecure=True) as address:
        reader, writer = await asyncio.open_connection(*address)
        statuses = []
        for n in range(5):  # far longer than all the timeouts together, but never idle for long
            await asyncio.sleep(IDLE_TIMEOUT * 0.75 if n else 0)
            writer.write(post('/hooks/a', json.dumps({'n': n}).encode()))
            statuses.append((await read_response(reader))[0])
        # Nearly idle, then a slow request: it has its own time since its first byte, not the idle rest.
        await asyncio.sleep(IDLE_TIMEOUT - 1)
        data = post('/hooks/a', b'{"n": 5}')
        writer.write(data[:10])
        await asyncio.sleep(REQUEST_TIMEOUT - 2)
        writer.write(data[10:])
        statuses.append((await read_response(reader))[0])
        writer.write(post('/hooks/a', b'{"n": 6}'))
        statuses.append((await read_response(reader))[0])
        writer.close()
        assert asyncio.get_running_loop().time() > IDLE_TIMEOUT * 4
    assert statuses == [200] * 7


@pytest.mark.looptime
async def test_slow_handler_is_not_cut_by_the_timeouts() -> None:
    async def slow(request: Any, **_: Any) -> Any:
        await asyncio.sleep(IDLE_TIMEOUT + REQUEST_TIMEOUT)
        return {'n': request['n']}

    async with serving(slow, insecure=True) as address:
        reader, writer = await asyncio.open_connection(*address)
        writer.write(post('/hooks/a', b'{"n": 1}'))
        status, _, body = await read_response(reader, bound=IDLE_TIMEOUT * 2)
        writer.close()
    assert status == 200
    assert json.loads(body) == {'n': 1}


@pytest.mark.parametrize('name', ['handshake_timeout', 'request_timeout', 'idle_timeout'])
@pytest.mark.parametrize('value', [0, -1.0])
async def test_timeouts_must_be_positive(name: str, value: float) -> None:
    async def handler(request: http.Request) -> http.HTTPResponse:
        raise AssertionError('never called')

    with pytest.raises(ValueError, match=rf"{name} must be a positive number of seconds, not {value}"):
        await http.start_server(handler, host='127.0.0.1', port=0, ssl_context=None, max_body_size=1,
                                **{name: value})


async def test_short_timeouts_as_parameters() -> None:
    async def handler(request: http.Request) -> http.HTTPResponse:
        return 200, 'text/plain', b'ok', ''

    listener = await http.start_server(handler, host='127.0.0.1', port=0, ssl_context=None, max_body_size=100,
                                       handshake_timeout=0.2, request_timeout=0.2, idle_timeout=0.3)
    try:
        reader, writer = await asyncio.open_connection('127.0.0.1', listener.port)
        writer.write(post('/', b'x'))
        status, _, body = await read_response(reader)
        answered = asyncio.get_running_loop().time()
        data, closed = await read_until_closed(reader, bound=5)
        writer.close()
    finally:
        await http.stop_server(listener)
    assert (status, body, data) == (200, b'ok', b'')
    assert 0.3 <= closed - answered <= 2


@pytest.mark.looptime
async def test_closing_answer_unread_by_the_client_is_dropped_when_idle() -> None:
    big = b'x' * (16 * 1024 * 1024)  # more than the sockets' buffers take: the server waits to send the rest

    async def handler(request: http.Request) -> http.HTTPResponse:
        return 200, 'text/plain', big, ''

    listener = await http.start_server(handler, host='127.0.0.1', port=0, ssl_context=None, max_body_size=100)
    try:
        reader, writer = await asyncio.open_connection('127.0.0.1', listener.port, limit=len(big) * 2)
        writer.transport.pause_reading()  # a client that never reads
        writer.write(post('/', b'x', 'Connection: close'))
        await asyncio.sleep(IDLE_TIMEOUT + 2)
        writer.transport.resume_reading()
        try:
            received = await asyncio.wait_for(reader.read(), timeout=5)
        except ConnectionResetError:  # the kernel drops what it holds when the rest is aborted
            received = b''
        writer.close()
    finally:
        await http.stop_server(listener)
    assert len(received) < len(big)  # without the idle deadline, it all comes when the client reads
