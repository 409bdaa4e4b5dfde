"""
The HTTP/1.1 parsing of the webhook server's requests (``kopf._cogs.helpers.http1`` under ``http.py``).

The requests are written by a raw client, cut into pieces at every position (each piece written
and drained separately, so that the server reads them as they come); the server's handler echoes
what it got, so the parsing is seen from the outside.
"""
import asyncio
import json
from collections.abc import AsyncIterator, Iterable

import pytest

from kopf._webhooks import http


async def echo(request: http.Request) -> http.HTTPResponse:
    payload = {'method': request.method, 'target': request.target, 'headers': list(request.headers.items()),
               'twice': request.headers.getall('x-twice', []), 'body': request.body.decode()}
    return 200, 'application/json', json.dumps(payload).encode(), ''


@pytest.fixture
async def address() -> AsyncIterator[tuple[str, int]]:
    listener = await http.start_server(echo, host='127.0.0.1', port=0, ssl_context=None, max_body_size=1000)
    try:
        yield '127.0.0.1', listener.port
    finally:
        await http.stop_server(listener)


async def write_in_pieces(writer: asyncio.StreamWriter, pieces: Iterable[bytes]) -> None:
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        for _ in range(3):  # let the server read this piece before the next one is sent
            await asyncio.sleep(0)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await asyncio.wait_for(reader.readuntil(b'\r\n\r\n'), timeout=5)).decode()
    lines = head.split('\r\n')
    pairs = (line.partition(':') for line in lines[1:] if line)
    headers = {name.lower(): value.strip() for name, _, value in pairs}
    body = await reader.readexactly(int(headers.get('content-length', '0')))
    return int(lines[0].split(' ')[1]), headers, body


REQUEST = (b'POST /hooks/a%20b?timeout=10s HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Twice: 1\r\nx-twice: 2\r\n'
           b'X-Spaced:   value  \r\nContent-Length: 13\r\n\r\n{"n": "\xc3\xa9 1"}')
ECHO = {'method': 'POST', 'target': '/hooks/a%20b?timeout=10s', 'twice': ['1', '2'], 'body': '{"n": "é 1"}',
        'headers': [['Host', '127.0.0.1'], ['X-Twice', '1'], ['x-twice', '2'], ['X-Spaced', 'value'],
                    ['Content-Length', '13']]}


async def test_request_cut_anywhere_on_one_connection(address: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*address)
    cuts = [[REQUEST[:i], REQUEST[i:]] for i in range(1, len(REQUEST))]
    cuts.append([REQUEST[i:i + 1] for i in range(len(REQUEST))])
    try:
        for pieces in cuts:
            await write_in_pieces(writer, pieces)
            status, headers, body = await read_response(reader)
            assert (status, json.loads(body)) == (200, ECHO)
            assert 'connection' not in headers  # kept alive
    finally:
        writer.close()


async def test_pipelined_requests_cut_anywhere_are_answered_in_order(address: tuple[str, int]) -> None:
    second = REQUEST.replace(b'/hooks/a%20b', b'/second')
    both = REQUEST + second
    reader, writer = await asyncio.open_connection(*address)
    try:
        for i in range(1, len(both), 7):
            await write_in_pieces(writer, [both[:i], both[i:]])
            first_answer = await read_response(reader)
            second_answer = await read_response(reader)
            assert json.loads(first_answer[2])['target'] == '/hooks/a%20b?timeout=10s'
            assert json.loads(second_answer[2])['target'] == '/second?timeout=10s'
    finally:
        writer.close()


async def test_continue_of_a_pipelined_request_comes_after_the_answer_before_it(
        address: tuple[str, int]) -> None:
    waiting = REQUEST.replace(b'Content-Length: 13\r\n', b'Expect: 100-continue\r\nContent-Length: 13\r\n')
    head, _, body = waiting.partition(b'\r\n\r\n')
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(REQUEST + head + b'\r\n\r\n')
        assert (await read_response(reader))[0] == 200
        interim = await asyncio.wait_for(reader.readuntil(b'\r\n\r\n'), timeout=5)
        writer.write(body)
        status, _, answer = await read_response(reader)
    finally:
        writer.close()
    assert interim == b'HTTP/1.1 100 Continue\r\n\r\n'
    assert (status, json.loads(answer)['body']) == (200, '{"n": "é 1"}')


async def test_request_asking_for_an_upgrade_is_served_as_http(address: tuple[str, int]) -> None:
    upgrading = b'GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n'
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(upgrading + REQUEST)
        first = await read_response(reader)
        second = await read_response(reader)
    finally:
        writer.close()
    assert (first[0], json.loads(first[2])['method']) == (200, 'GET')
    assert (second[0], json.loads(second[2])) == (200, ECHO)


async def assert_refused(reader: asyncio.StreamReader, status: int, reason: str) -> None:
    answer = await read_response(reader)
    rest = await asyncio.wait_for(reader.read(), timeout=5)
    assert answer[0] == status
    assert answer[1]['connection'] == 'close'
    assert reason in answer[2].decode()
    assert rest == b''  # closed


@pytest.mark.parametrize('request_bytes, status, reason', [
    pytest.param(b'NONSENSE\r\n\r\n', 400, 'Malformed HTTP request line.', id='no-request-line'),
    pytest.param(b'POST /a b HTTP/1.1\r\n\r\n', 400, 'Malformed HTTP request line.', id='space-in-target'),
    pytest.param(b'POST / HTTP/1.1\r\nno colon here\r\n\r\n', 400, 'Malformed HTTP header line.',
                 id='no-colon'),
    pytest.param(b'POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n', 400, 'Malformed Content-Length.',
                 id='bad-length'),
    pytest.param(b'POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n',
                 411, 'Chunked request bodies are not supported', id='smuggling-length-first'),
    pytest.param(b'POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 1\r\n\r\nx',
                 411, 'Chunked request bodies are not supported', id='smuggling-chunked-first'),
    pytest.param(b'POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n', 413, 'above the limit of 1000 bytes',
                 id='above-the-limit'),
    pytest.param(b'POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n', 413, 'above the limit of 1000 bytes',
                 id='negative-length'),
])
async def test_bad_requests_are_refused_with_the_reason(
        address: tuple[str, int], request_bytes: bytes, status: int, reason: str) -> None:
    reader, writer = await asyncio.open_connection(*address)
    try:
        middle = len(request_bytes) // 2
        await write_in_pieces(writer, [request_bytes[:middle], request_bytes[middle:]])
        await assert_refused(reader, status, reason)
    finally:
        writer.close()


async def test_bad_request_after_a_good_one_is_refused_after_its_answer(address: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(REQUEST + b'NONSENSE\r\n\r\n' + REQUEST)
        status, _, body = await read_response(reader)
        assert (status, json.loads(body)) == (200, ECHO)
        await assert_refused(reader, 400, 'Malformed HTTP request line.')
    finally:
        writer.close()


async def test_head_above_the_limit_is_refused_before_its_end(address: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(b'POST / HTTP/1.1\r\n')
        line = b'X-Padding: ' + b'x' * 1000 + b'\r\n'
        for _ in range(http.MAX_HEAD_SIZE // len(line) + 2):
            writer.write(line)
        await writer.drain()
        await assert_refused(reader, 431, 'The request headers are too large.')
    finally:
        writer.close()


async def test_request_headers_are_case_insensitive() -> None:
    async def handler(request: http.Request) -> http.HTTPResponse:
        return 200, 'text/plain', request.headers['content-type'].encode(), ''

    listener = await http.start_server(handler, host='127.0.0.1', port=0, ssl_context=None, max_body_size=10)
    try:
        reader, writer = await asyncio.open_connection('127.0.0.1', listener.port)
        writer.write(b'POST / HTTP/1.1\r\nCONTENT-TYPE: application/json\r\nContent-Length: 2\r\n\r\n{}')
        _, _, body = await read_response(reader)
        writer.close()
    finally:
        await http.stop_server(listener)
    assert body == b'application/json'
