"""The webhook servers' HTTP layer, byte by byte: keep-alive, pipelining, 100-continue, refusals."""
import asyncio
import base64
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest

import kopf


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


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await asyncio.wait_for(reader.readuntil(b'\r\n\r\n'), timeout=5)).decode()
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
