"""
The lean HTTP/1.1 client of the regular requests (``kopf._clients.connections``), against raw servers.

Each test scripts the server's bytes exactly (a raw asyncio server), so that the framings,
the keep-alive decisions, and the failures are what the test says, not what a server library does.
"""
import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from kopf._clients import api, auth
from kopf._clients.connections import (
    CannotConnect,
    ConnectionPool,
    Disconnected,
    MalformedResponse,
    NetworkError,
    Timeouts,
)
from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import StandaloneClientSettings
from kopf._cogs.structs.credentials import ConnectionInfo

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A TCP server that runs a script per connection, and remembers the requests' heads it has read."""

    def __init__(self) -> None:
        self.script: Script | None = None
        self.connections = 0
        self.heads: list[bytes] = []
        self.url = ''
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, '127.0.0.1', 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f'http://127.0.0.1:{port}'

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

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        """Read one request (its head and a Content-Length body); return the head."""
        head = await reader.readuntil(b'\r\n\r\n')
        self.heads.append(head)
        for line in head.split(b'\r\n'):
            if line.lower().startswith(b'content-length:'):
                await reader.readexactly(int(line.split(b':')[1]))
        return head


@pytest.fixture
async def server() -> AsyncIterator[RawServer]:
    raw = RawServer()
    await raw.start()
    yield raw
    await raw.stop()


def serving(server: RawServer, *responses: bytes, then_close: bool = False) -> Script:
    """A script: answer each request on the connection with the next response (and maybe close)."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for response in responses:
            await server.read_request(reader)
            writer.write(response)
            await writer.drain()
        if not then_close:
            await reader.read()  # until the client closes
    return script


@pytest.fixture
async def pool(server: RawServer) -> AsyncIterator[ConnectionPool]:
    the_pool = ConnectionPool(server.url, ssl_context=None, headers={'User-Agent': 'kopf', 'X-Token': 'T'})
    yield the_pool
    await the_pool.close()


OK_JSON = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"a": "ok"}'


async def test_sequential_requests_reuse_one_connection(server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, OK_JSON, OK_JSON, OK_JSON)
    for _ in range(3):
        response = await pool.request('GET', '/api')
        assert response.status == 200
        assert response.body == b'{"a": "ok"}'
        assert response.headers['content-type'] == 'application/json'
    assert server.connections == 1
    assert pool.idle == 1


async def test_request_head_has_the_target_the_common_and_own_headers(
        server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, OK_JSON)
    await pool.request('PATCH', '/apis/x/v1/objs/n%20m', data=b'{"b":1}',
                       params={'labelSelector': 'a in (b,c)'},
                       headers={'Content-Type': 'application/merge-patch+json'})
    head = server.heads[0].decode()
    assert head.startswith('PATCH /apis/x/v1/objs/n%20m?labelSelector=a+in+%28b%2Cc%29 HTTP/1.1\r\n')
    port = server.url.rsplit(':', 1)[1]
    assert f'\r\nHost: 127.0.0.1:{port}\r\n' in head
    assert '\r\nX-Token: T\r\n' in head
    assert '\r\nContent-Type: application/merge-patch+json\r\n' in head
    assert '\r\nContent-Length: 7\r\n' in head


async def test_server_path_prefix_is_kept(server: RawServer) -> None:
    server.script = serving(server, OK_JSON)
    pool = ConnectionPool(server.url + '/k8s/clusters/c-1/', ssl_context=None, headers={})
    try:
        response = await pool.request('GET', '/api')
    finally:
        await pool.close()
    assert server.heads[0].startswith(b'GET /k8s/clusters/c-1/api HTTP/1.1\r\n')
    assert response.url == server.url + '/k8s/clusters/c-1/api'


async def test_chunked_response_in_pieces(server: RawServer, pool: ConnectionPool) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        pieces = [b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n', b'\r\n5\r\nhel', b'lo\r\n',
                  b'6;ext=1\r\n world\r\n0\r\n', b'Trailer: x\r\n', b'\r\n']
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0)  # let the client read every piece separately (not a timing)
        await server.read_request(reader)  # the connection is reused: a second request comes
        writer.write(OK_JSON)
        await reader.read()
    server.script = script
    response = await pool.request('GET', '/')
    assert response.body == b'hello world'
    response = await pool.request('GET', '/')
    assert response.body == b'{"a": "ok"}'
    assert server.connections == 1


async def test_large_chunked_response(server: RawServer, pool: ConnectionPool) -> None:
    chunk = b'x' * 100_000
    body = b''.join(b'%x\r\n%s\r\n' % (len(chunk), chunk) for _ in range(30))
    head = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n'
    server.script = serving(server, head + body + b'0\r\n\r\n')
    response = await pool.request('GET', '/')
    assert response.body == chunk * 30


async def test_response_until_close(server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, b'HTTP/1.1 200 OK\r\n\r\nall of it', then_close=True)
    response = await pool.request('GET', '/')
    assert response.body == b'all of it'
    assert pool.idle == 0


async def test_connection_close_header_is_obeyed(server: RawServer, pool: ConnectionPool) -> None:
    closing = b'HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}'
    server.script = serving(server, closing)
    await pool.request('GET', '/')
    await pool.request('GET', '/')
    assert server.connections == 2
    assert pool.idle == 0


async def test_http10_without_keepalive_is_not_reused(server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, b'HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}')
    await pool.request('GET', '/')
    assert pool.idle == 0


async def test_informational_response_is_skipped(server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, b'HTTP/1.1 100 Continue\r\n\r\n' + OK_JSON)
    response = await pool.request('POST', '/', data=b'{}')
    assert response.status == 200
    assert response.body == b'{"a": "ok"}'


async def test_no_body_for_204_and_head(server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, b'HTTP/1.1 204 No Content\r\n\r\n',
                            b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n', OK_JSON)
    assert (await pool.request('DELETE', '/')).body == b''
    assert (await pool.request('HEAD', '/')).body == b''
    assert (await pool.request('GET', '/')).body == b'{"a": "ok"}'  # still in sync
    assert server.connections == 1


async def test_idle_connection_closed_by_server_is_replaced(server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, OK_JSON, then_close=True)  # one request per connection, then closed
    await pool.request('GET', '/')
    response = await pool.request('GET', '/')  # over the closed idle one first, then anew
    assert response.status == 200
    assert server.connections == 2
    assert len(server.heads) == 2  # the request reached the server once, not twice


async def test_stale_connection_that_reads_and_closes_is_retried_once(
        server: RawServer, pool: ConnectionPool) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if server.connections == 1:
            await server.read_request(reader)
            writer.write(OK_JSON)
            await server.read_request(reader)  # the 2nd request: dropped unanswered, as by an expiry
            writer.transport.abort()
        else:
            await serving(server, OK_JSON)(reader, writer)
    server.script = script
    await pool.request('GET', '/')
    response = await pool.request('GET', '/')
    assert response.status == 200
    assert server.connections == 2


async def test_new_connection_closed_before_response_fails(server: RawServer, pool: ConnectionPool) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.transport.abort()
    server.script = script
    with pytest.raises(Disconnected):
        await pool.request('GET', '/')
    assert server.connections == 1  # not retried: a fresh connection is not stale


async def test_connection_closed_mid_response_fails(server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial', then_close=True)
    with pytest.raises(Disconnected):
        await pool.request('GET', '/')
    assert server.connections == 1
    assert pool.idle == 0


@pytest.mark.parametrize('garbage', [
    pytest.param(b'SPDY/3 200 OK\r\n\r\n', id='not-http'),
    pytest.param(b'HTTP/1.1 200 OK\r\nno colon here\r\n\r\n', id='bad-header'),
    pytest.param(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n', id='bad-chunk-size'),
    pytest.param(b'HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n', id='negative-length'),
])
async def test_malformed_response_fails_clearly(
        server: RawServer, pool: ConnectionPool, garbage: bytes) -> None:
    server.script = serving(server, garbage)
    with pytest.raises(MalformedResponse, match=r'Malformed HTTP response'):
        await pool.request('GET', '/')
    assert pool.idle == 0


async def test_extra_bytes_after_response_make_connection_unusable(
        server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, OK_JSON + b'HTTP/1.1 200 OK\r\n', OK_JSON)
    assert (await pool.request('GET', '/')).status == 200
    assert pool.idle == 0
    assert (await pool.request('GET', '/')).status == 200
    assert server.connections == 2


async def test_total_timeout_aborts_the_connection(server: RawServer, pool: ConnectionPool) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        await reader.read()  # never answers
    server.script = script
    with pytest.raises(asyncio.TimeoutError):
        await pool.request('GET', '/', timeouts=Timeouts(total=0.05))
    assert pool.idle == 0


def answering_all_but_hanging(server: RawServer) -> Script:
    """Answer every request at once, except those to ``/hang``, which get no answer at all."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await server.read_request(reader)
            if head.startswith(b'GET /hang '):
                await reader.read()
                return
            writer.write(OK_JSON)
            await writer.drain()
    return script


async def test_shorter_timeout_after_longer_one_expires_first(
        server: RawServer, pool: ConnectionPool) -> None:
    # The timeouts of all requests share one timer: an earlier deadline must re-arm it.
    server.script = answering_all_but_hanging(server)
    loop = asyncio.get_running_loop()
    longer = asyncio.create_task(pool.request('GET', '/hang', timeouts=Timeouts(total=5)))
    await asyncio.sleep(0.01)
    started = loop.time()
    with pytest.raises(TimeoutError):
        await pool.request('GET', '/hang', timeouts=Timeouts(total=0.05))
    assert loop.time() - started < 1
    assert not longer.done()
    longer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await longer


async def test_timeouts_of_finished_requests_do_not_fire(server: RawServer, pool: ConnectionPool) -> None:
    server.script = answering_all_but_hanging(server)
    for _ in range(300):  # many more than the heap keeps before its clean-up
        assert (await pool.request('GET', '/', timeouts=Timeouts(total=0.05))).status == 200
    await asyncio.sleep(0.1)  # all their deadlines are over now: nothing is cancelled by them
    assert (await pool.request('GET', '/', timeouts=Timeouts(total=0.05))).status == 200
    with pytest.raises(TimeoutError):
        await pool.request('GET', '/hang', timeouts=Timeouts(total=0.05))


async def test_outer_cancellation_is_not_a_timeout(server: RawServer, pool: ConnectionPool) -> None:
    server.script = answering_all_but_hanging(server)
    task = asyncio.create_task(pool.request('GET', '/hang', timeouts=Timeouts(total=5)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_outer_timeout_is_the_outer_ones(server: RawServer, pool: ConnectionPool) -> None:
    server.script = answering_all_but_hanging(server)
    outer = asyncio.timeout(0.05)
    with pytest.raises(TimeoutError):
        async with outer:
            await pool.request('GET', '/hang', timeouts=Timeouts(total=5))
    assert outer.expired()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_cancelled_request_is_not_reused(server: RawServer, pool: ConnectionPool) -> None:
    answered = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        answered.set()
        await reader.read()
    server.script = script
    task = asyncio.create_task(pool.request('GET', '/'))
    await answered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.idle == 0


async def test_refused_connection_says_where_and_why() -> None:
    probe = await asyncio.start_server(lambda r, w: None, '127.0.0.1', 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    pool = ConnectionPool(f'http://127.0.0.1:{port}', ssl_context=None, headers={})
    with pytest.raises(CannotConnect) as err:
        await pool.request('GET', '/')
    assert err.value.address == f'http://127.0.0.1:{port}'
    assert isinstance(err.value.os_error, ConnectionRefusedError)


async def test_closed_pool_refuses_new_requests(server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, OK_JSON)
    await pool.close()
    with pytest.raises(NetworkError, match='closed'):
        await pool.request('GET', '/')


@pytest.mark.parametrize('url', ['ftp://example.com', 'http://'])
def test_unsupported_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match='Unsupported server URL'):
        ConnectionPool(url, ssl_context=None, headers={})


@pytest.mark.parametrize('info_kwargs, lean', [
    pytest.param({}, True, id='plain'),
    pytest.param({'proxy_url': 'http://proxy:3128'}, False, id='proxy'),
    pytest.param({'trust_env': True}, False, id='trust-env'),
])
async def test_lean_client_only_without_proxies(info_kwargs: dict[str, object], lean: bool) -> None:
    context = auth.APIContext(ConnectionInfo(server='http://127.0.0.1:1', **info_kwargs))  # type: ignore[arg-type]
    try:
        assert isinstance(context.transport, ConnectionPool) == lean
    finally:
        await context.close()


async def test_api_errors_from_the_lean_client(server: RawServer) -> None:
    status = b'{"kind": "Status", "code": 429, "reason": "TooManyRequests", "message": "slow down"}'
    head = b'HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: %d\r\n\r\n' % len(status)
    server.script = serving(server, head + status)
    settings = StandaloneClientSettings()
    settings.networking.error_backoffs = []
    async with Vault({'main': ConnectionInfo(server=server.url)}) as vault:
        with pytest.raises(api.errors.APITooManyRequestsError) as err:
            await api.request('GET', '/api/v1/pods', settings=settings, vault=vault)
    assert err.value.retry_after == 7
    assert err.value.message == 'slow down'
    assert err.value.url == server.url + '/api/v1/pods'
    assert err.value.method == 'GET'


async def test_stream_is_read_as_it_comes(server: RawServer, pool: ConnectionPool) -> None:
    proceed = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nline1\n\r\n')
        await writer.drain()
        await proceed.wait()
        writer.write(b'6\r\nline2\n\r\n0\r\n\r\n')
        await writer.drain()
        await reader.read()
    server.script = script
    response = await pool.stream('GET', '/watch', params={'watch': 'true'})
    try:
        assert response.status == 200
        assert await response.readany() == b'line1\n'  # before the rest is even sent
        proceed.set()
        assert await response.read() == b'line2\n'
        assert await response.readany() == b''  # the end, and stays so
    finally:
        response.close()
    assert server.heads[0].startswith(b'GET /watch?watch=true HTTP/1.1\r\n')


async def test_stream_until_close(server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, b'HTTP/1.1 200 OK\r\n\r\nall of it', then_close=True)
    response = await pool.stream('GET', '/')
    try:
        assert await response.read() == b'all of it'
    finally:
        response.close()


async def test_stream_broken_midway_fails_the_reading(server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n',
                            then_close=True)
    response = await pool.stream('GET', '/')
    try:
        assert await response.readany() == b'abc'
        with pytest.raises(Disconnected):
            await response.readany()
    finally:
        response.close()


async def test_stream_pauses_the_socket_while_the_consumer_lags(
        server: RawServer, pool: ConnectionPool) -> None:
    sent = asyncio.Event()
    total = 8 * 1024 * 1024

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n' % total)
        for _ in range(total // 65536):
            writer.write(b'x' * 65536)
            await writer.drain()  # blocks when the client stops reading (the kernel buffers fill up)
        sent.set()
        await reader.read()
    server.script = script
    response = await pool.stream('GET', '/')
    try:
        first = await response.readany()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await sent.wait()  # not all is sent while we do not read: the back-pressure works
        received = len(first)
        while chunk := await response.readany():
            received += len(chunk)
        assert received == total
    finally:
        response.close()


async def test_stream_total_timeout_limits_the_reading(server: RawServer, pool: ConnectionPool) -> None:
    server.script = serving(server, b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n')
    response = await pool.stream('GET', '/', timeouts=Timeouts(total=0.1))
    try:
        with pytest.raises(TimeoutError):
            await response.readany()
    finally:
        response.close()


async def test_stream_error_status_is_an_api_error(server: RawServer) -> None:
    status = b'{"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}'
    head = b'HTTP/1.1 410 Gone\r\nContent-Length: %d\r\n\r\n' % len(status)
    server.script = serving(server, head + status)
    settings = StandaloneClientSettings()
    settings.networking.error_backoffs = []
    async with Vault({'main': ConnectionInfo(server=server.url)}) as vault:
        with pytest.raises(api.errors.APIGoneError, match='too old'):
            async with api.stream('GET', '/api/v1/pods', params={'watch': 'true'}, settings=settings,
                                  vault=vault):
                pass


class _Proxy:
    """A transport of another loop's own classes (as uvloop's are): not a subclass of asyncio's transports."""

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


class _Relay(asyncio.Protocol):
    def __init__(self, protocol: asyncio.Protocol) -> None:
        self.protocol = protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.protocol.connection_made(_Proxy(transport))  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self.protocol.data_received(data)

    def eof_received(self) -> bool | None:
        return self.protocol.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.connection_lost(exc)


class _LoopOfForeignTransports(asyncio.SelectorEventLoop):
    async def create_connection(self, protocol_factory: Any, *args: Any, **kwargs: Any) -> Any:
        def relayed() -> _Relay:
            return _Relay(protocol_factory())

        transport, relay = await super().create_connection(relayed, *args, **kwargs)
        return transport, relay.protocol


def test_transports_of_other_loops_are_accepted() -> None:
    async def scenario() -> None:
        server = RawServer()
        await server.start()
        server.script = serving(server, OK_JSON, OK_JSON)
        pool = ConnectionPool(server.url, ssl_context=None, headers={})
        try:
            for _ in range(2):
                response = await pool.request('GET', '/api')
                assert (response.status, response.body) == (200, b'{"a": "ok"}')
            assert server.connections == 1
        finally:
            await pool.close()
            await server.stop()

    loop = _LoopOfForeignTransports()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
