"""
The HTTP/1.1 parsing of the API client's responses (``kopf._cogs.helpers.http1`` under the lean client).

A raw asyncio server writes the bytes of each response exactly as the test says, cut into pieces
at every position (each piece written and drained separately, so that the client reads them as they
come), so that the head, the chunks' sizes, their data and the line ends are each split anywhere.
"""
import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import pytest

from kopf._clients.connections import ConnectionPool, MalformedResponse

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A TCP server that runs the test's script per connection."""

    def __init__(self) -> None:
        self.script: Script | None = None
        self.connections = 0
        self.url = ''
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, '127.0.0.1', 0)
        self.url = f'http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}'

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        assert self.script is not None
        try:
            await self.script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def write_in_pieces(writer: asyncio.StreamWriter, pieces: Iterable[bytes]) -> None:
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        for _ in range(3):  # let the client's transport read this piece before the next one is sent
            await asyncio.sleep(0)


def answering(responses: Iterable[list[bytes]]) -> Script:
    """A script: answer each request (a GET or HEAD, no body) with the next response, in its pieces."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for pieces in responses:
            await reader.readuntil(b'\r\n\r\n')
            await write_in_pieces(writer, pieces)
        await reader.read()  # until the client closes
    return script


def splits(data: bytes) -> list[list[bytes]]:
    """The data cut in two at every position."""
    return [[data[:i], data[i:]] for i in range(1, len(data))]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i:i + 1] for i in range(len(data))]


@pytest.fixture
async def raw() -> AsyncIterator[RawServer]:
    server = RawServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def pool(raw: RawServer) -> AsyncIterator[ConnectionPool]:
    the_pool = ConnectionPool(raw.url, ssl_context=None, headers={})
    yield the_pool
    await the_pool.close()


LENGTH_RESPONSE = (b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Twice: a\r\nx-twice: b\r\n'
                   b'X-Spaced:   value  \r\nContent-Length: 11\r\n\r\n{"a": "ok"}')
LENGTH_HEADERS = {'content-type': 'application/json', 'x-twice': 'a, b', 'x-spaced': 'value',
                  'content-length': '11'}

CHUNKED_RESPONSE = (b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n'
                    b'5;ext=1\r\nhello\r\n1\r\n,\r\nA\r\n wide worl\r\n1\r\nd\r\n0\r\nX-Trailer: t\r\n\r\n')


async def test_length_response_cut_anywhere_on_one_connection(raw: RawServer, pool: ConnectionPool) -> None:
    cuts = [*splits(LENGTH_RESPONSE), bytewise(LENGTH_RESPONSE)]
    raw.script = answering(cuts)
    for _ in cuts:
        response = await pool.request('GET', '/')
        assert (response.status, response.headers, response.body) == (200, LENGTH_HEADERS, b'{"a": "ok"}')
    assert raw.connections == 1
    assert pool.idle == 1


async def test_chunked_response_cut_anywhere_on_one_connection(raw: RawServer, pool: ConnectionPool) -> None:
    cuts = [*splits(CHUNKED_RESPONSE), bytewise(CHUNKED_RESPONSE)]
    raw.script = answering(cuts)
    for _ in cuts:
        response = await pool.request('GET', '/')
        assert response.body == b'hello, wide world'
        assert response.headers == {'transfer-encoding': 'chunked'}  # the trailers are not the headers
    assert raw.connections == 1


async def test_body_until_close_cut_anywhere(raw: RawServer, pool: ConnectionPool) -> None:
    response_bytes = b'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it, until the close'
    for pieces in splits(response_bytes):
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         pieces: list[bytes] = pieces) -> None:
            await reader.readuntil(b'\r\n\r\n')
            await write_in_pieces(writer, pieces)
        raw.script = script
        response = await pool.request('GET', '/')
        assert response.body == b'all of it, until the close'
    assert pool.idle == 0


async def test_responses_of_all_framings_back_to_back_on_one_connection(
        raw: RawServer, pool: ConnectionPool) -> None:
    responses = [
        b'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n' + LENGTH_RESPONSE,  # skipped 1xx
        b'HTTP/1.1 204 No Content\r\nContent-Type: text/plain\r\n\r\n',
        # The answers to HEADs: no body whatever their heads say.
        b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n',
        b'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n',
        CHUNKED_RESPONSE,
        b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n',
        b'HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}',
        LENGTH_RESPONSE,
    ]
    raw.script = answering([[response] for response in responses])
    assert (await pool.request('GET', '/')).body == b'{"a": "ok"}'
    assert (await pool.request('DELETE', '/')).status == 204
    assert (await pool.request('HEAD', '/')).headers == {'content-length': '1000'}
    assert (await pool.request('HEAD', '/')).body == b''
    assert (await pool.request('GET', '/')).body == b'hello, wide world'
    assert (await pool.request('GET', '/')).status == 304
    assert (await pool.request('GET', '/')).body == b'{}'
    assert (await pool.request('GET', '/')).body == b'{"a": "ok"}'
    assert raw.connections == 1


async def test_head_response_followed_by_extra_bytes_is_not_reused(
        raw: RawServer, pool: ConnectionPool) -> None:
    raw.script = answering([[b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello']])  # a body to a HEAD
    assert (await pool.request('HEAD', '/')).body == b''
    assert pool.idle == 0


WATCH_EVENTS = [{'type': 'ADDED', 'object': {'metadata': {'name': f'obj{i}'}, 'spec': {'text': 'x' * i}}}
                for i in range(5)]


def watch_stream_bytes() -> bytes:
    """The events as JSON lines, re-chunked so that the chunks cut the lines (and the lines the chunks)."""
    lines = b''.join(json.dumps(event).encode() + b'\n' for event in WATCH_EVENTS)
    sizes = [7, 50, 1, 90, 3, 200]
    chunks, position = [], 0
    while position < len(lines):
        size = sizes[len(chunks) % len(sizes)]
        chunk = lines[position:position + size]
        chunks.append(b'%x\r\n%s\r\n' % (len(chunk), chunk))
        position += size
    head = (b'HTTP/1.1 200 OK\r\nContent-Type: application/json;stream=watch\r\n'
            b'Transfer-Encoding: chunked\r\n\r\n')
    return head + b''.join(chunks) + b'0\r\n\r\n'


async def read_events(pool: ConnectionPool) -> list[object]:
    response = await pool.stream('GET', '/watch')
    try:
        assert response.status == 200
        data = await response.read()
    finally:
        response.close()
    return [json.loads(line) for line in data.split(b'\n') if line]


async def test_watch_stream_cut_anywhere(raw: RawServer, pool: ConnectionPool) -> None:
    stream = watch_stream_bytes()
    cuts = [*splits(stream), bytewise(stream)]
    for pieces in cuts:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         pieces: list[bytes] = pieces) -> None:
            await reader.readuntil(b'\r\n\r\n')
            await write_in_pieces(writer, pieces)
            await reader.read()
        raw.script = script
        assert await read_events(pool) == WATCH_EVENTS
    assert raw.connections == len(cuts)  # a stream's connection is its own, never reused


async def test_huge_chunk_is_streamed_before_its_end(raw: RawServer, pool: ConnectionPool) -> None:
    proceed = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b'\r\n\r\n')
        await write_in_pieces(writer, [b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n',
                                       b'%x\r\n' % (10 * 1024 * 1024), b'{"first": 1}\n'])
        await proceed.wait()
        writer.write(b'x' * (10 * 1024 * 1024 - 13) + b'\r\n0\r\n\r\n')
        await writer.drain()
        await reader.read()
    raw.script = script
    response = await pool.stream('GET', '/watch')
    try:
        assert await response.readany() == b'{"first": 1}\n'  # not held back until the chunk's end
        proceed.set()
        rest = await response.read()
    finally:
        response.close()
    assert len(rest) == 10 * 1024 * 1024 - 13


@pytest.mark.parametrize('garbage, reason', [
    pytest.param(b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nhello',
                 "Transfer-Encoding can't be present with Content-Length", id='length-and-chunked'),
    pytest.param(b'HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}',
                 'Duplicate Content-Length', id='two-lengths'),
    pytest.param(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello!\r\n0\r\n\r\n',
                 'Expected LF after chunk data', id='chunk-longer-than-its-size'),
    pytest.param(b'HTTP/1.1 200 OK\nContent-Length: 0\n\n', 'Missing expected CR', id='bare-lf'),
    pytest.param(b'HTTP/1.1 2x0 OK\r\n\r\n', 'Invalid status code', id='bad-status'),
    pytest.param(b'HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n', 'Invalid header token', id='space-in-name'),
    pytest.param(b'HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n',
                 'unexpected switch of the protocol', id='upgrade'),
])
async def test_malformed_responses_fail_with_the_reason(
        raw: RawServer, pool: ConnectionPool, garbage: bytes, reason: str) -> None:
    raw.script = answering([splits(garbage)[len(garbage) // 2]])  # the head cut in the middle too
    with pytest.raises(MalformedResponse) as err:
        await pool.request('GET', '/')
    assert str(err.value).startswith('Malformed HTTP response: ')
    assert reason in str(err.value)
    assert pool.idle == 0


async def test_malformed_chunk_in_a_stream_fails_the_reading(raw: RawServer, pool: ConnectionPool) -> None:
    raw.script = answering([[b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nline1\n\r\n',
                             b'zz\r\nline2\n\r\n']])
    response = await pool.stream('GET', '/watch')
    try:
        assert await response.readany() == b'line1\n'
        with pytest.raises(MalformedResponse, match='Malformed HTTP response: Invalid character in chunk'):
            await response.readany()
    finally:
        response.close()
