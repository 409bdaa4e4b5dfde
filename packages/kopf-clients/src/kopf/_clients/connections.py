"""
A lean HTTP/1.1 client for the regular (non-streaming) requests: keep-alive connections per server.

Every change of every object costs the operator a few regular requests (the finalizer, the results,
the diff-base), so the client's own cost per request is on the hottest path of the framework.
A general-purpose client (aiohttp) spends ~120 µs of CPU per small request in its machinery
(request & response objects, tracing hooks, cookie jars, header multidicts, stream readers);
this one does only what a request to the Kubernetes API needs, in ~40 µs, on asyncio's own
transports, with the TLS done by the ssl module's C code.

What it supports: ``http`` and ``https`` servers (with a path prefix), keep-alive connections
(one request at a time each, no pipelining), responses framed by ``Content-Length``, by chunks,
or by closing the connection; the total and connect timeouts. What it leaves to aiohttp (see
``auth.APIContext``): proxies, the environment's settings (``trust_env``), and the streams
(watch-requests), which live long and are few.

A connection that the server has closed while it was idle in the pool is noticed when it fails
before any byte of the response has come; the request is then sent once more over a new connection
(it has not reached the server's handling; this is what every keep-alive client must do anyway).
Other failures escalate as aiohttp's network errors, so the callers' retries treat them alike.
"""
import asyncio
import contextlib
import socket
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import NamedTuple

import aiohttp

__all__ = ['ConnectionPool', 'Response']

# A timeout of establishing a connection (a subclass of asyncio's TimeoutError, as aiohttp's own).
_CONNECTION_TIMEOUT_ERROR: type[aiohttp.ServerTimeoutError] = getattr(
    aiohttp, 'ConnectionTimeoutError', aiohttp.ServerTimeoutError)  # aiohttp>=3.10

# How much of the consumed response data may stay in the buffer before it is cut off (for chunks).
_COMPACTION_THRESHOLD = 1024 * 1024


class _ConnectionKey(NamedTuple):
    """What aiohttp's connection errors need to know of the connection (as its own connection key)."""
    host: str
    port: int
    is_ssl: bool
    ssl: ssl.SSLContext | bool


def _connection_error(key: _ConnectionKey, error: OSError) -> aiohttp.ClientConnectorError:
    """The same errors as aiohttp's own connector raises, so that the callers treat & describe them alike."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return aiohttp.ClientConnectorCertificateError(key, error)  # type: ignore[arg-type]
    if isinstance(error, ssl.SSLError):
        return aiohttp.ClientConnectorSSLError(key, error)
    dns_error_class = getattr(aiohttp, 'ClientConnectorDNSError', None)  # aiohttp>=3.10
    if isinstance(error, socket.gaierror) and dns_error_class is not None:
        return dns_error_class(key, error)  # type: ignore[no-any-return]
    return aiohttp.ClientConnectorError(key, error)  # type: ignore[arg-type]


class Response:
    """A response read in full: the status, the headers (names in lower case), and the body."""

    __slots__ = ('body', 'headers', 'method', 'status', 'url')

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes, method: str, url: str) -> None:
        super().__init__()
        self.status = status
        self.headers = headers
        self.body = body
        self.method = method
        self.url = url


# A response as parsed: the status, the headers, the body, whether the connection can be reused.
_Outcome = tuple[int, dict[str, str], bytes, bool]


class _Stale(Exception):
    """The connection was closed by the server before any byte of the response (e.g. idle expiry)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: sends a request, parses its response incrementally, as bytes come."""

    transport: asyncio.Transport | None

    def __init__(self) -> None:
        super().__init__()
        self.transport = None
        self.closed = False
        self._waiter: asyncio.Future[_Outcome] | None = None
        self._buffer = bytearray()
        self._no_body = False
        self._received = False  # any byte of the current response?
        self._reset_parser()

    def _reset_parser(self) -> None:
        self._status = 0
        self._headers: dict[str, str] = {}
        self._keep_alive = True
        self._framing = ''  # '' (headers pending), 'length', 'chunked', 'close'
        self._length = 0
        self._position = 0  # where the parsing continues in the buffer
        self._chunks: list[bytes] = []
        self._chunk_left = -1  # the unread bytes of the current chunk; -1: a size line is next

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._framing == 'close':
                body = bytes(self._buffer[self._position:])
                self._buffer.clear()
                waiter.set_result((self._status, self._headers, body, False))
            elif not self._received:
                waiter.set_exception(_Stale())
            else:
                waiter.set_exception(aiohttp.ServerDisconnectedError())

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost() finishes or fails the response

    def send(self, head: bytes, body: bytes | None, *, no_body: bool) -> asyncio.Future[_Outcome]:
        assert self.transport is not None
        waiter = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self._no_body = no_body
        self._received = False
        self._reset_parser()
        self.transport.write(head + body if body else head)
        return waiter

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            self.abort()  # nothing was asked: the connection is out of sync, never to be reused
            return
        self._received = True
        self._buffer += data
        try:
            self._parse()
        except ValueError as e:
            self.abort()
            if not waiter.done():
                waiter.set_exception(aiohttp.ClientPayloadError(f'Malformed HTTP response: {e}'))

    def _parse(self) -> None:
        buffer = self._buffer
        while True:
            if not self._framing:
                end = buffer.find(b'\r\n\r\n', self._position)
                if end < 0:
                    self._position = max(0, len(buffer) - 3)
                    return
                head = buffer[:end].decode('latin-1')
                del buffer[:end + 4]
                self._position = 0
                if not self._parse_head(head):
                    continue  # an informational response (1xx): the real one follows
            if self._framing == 'length':
                if len(buffer) < self._length:
                    return
                body = bytes(buffer[:self._length])
                extra = len(buffer) > self._length
                buffer.clear()
                self._finish(body, extra=extra)
                return
            elif self._framing == 'chunked':
                if not self._parse_chunks():
                    return
                extra = len(buffer) > self._position
                body = b''.join(self._chunks)
                buffer.clear()
                self._finish(body, extra=extra)
                return
            else:  # 'close': everything until the connection closes (see connection_lost)
                return

    def _parse_head(self, head: str) -> bool:
        status_line, *lines = head.split('\r\n')
        version, _, rest = status_line.partition(' ')
        if not version.startswith('HTTP/1.'):
            raise ValueError(f'not an HTTP/1.x status line: {status_line[:100]!r}')
        status = int(rest[:3])
        headers: dict[str, str] = {}
        for line in lines:
            name, sep, value = line.partition(':')
            if not sep:
                raise ValueError(f'a header line without a colon: {line[:100]!r}')
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f'{headers[key]}, {value}' if key in headers else value
        if 100 <= status < 200:
            return False
        self._status = status
        self._headers = headers
        connection = headers.get('connection', '').lower()
        if version == 'HTTP/1.1':
            self._keep_alive = 'close' not in connection
        else:
            self._keep_alive = 'keep-alive' in connection
        if self._no_body or status == 204 or status == 304:
            self._framing, self._length = 'length', 0
        elif 'chunked' in headers.get('transfer-encoding', '').lower():
            self._framing = 'chunked'
        elif 'content-length' in headers:
            self._framing, self._length = 'length', int(headers['content-length'])
            if self._length < 0:
                raise ValueError(f'a negative Content-Length: {self._length}')
        else:
            self._framing, self._keep_alive = 'close', False
        return True

    def _parse_chunks(self) -> bool:
        """Consume the complete chunks in the buffer; True when the last one (and the trailers) is read."""
        buffer = self._buffer
        position = self._position
        try:
            while True:
                if self._chunk_left == -1:
                    end = buffer.find(b'\r\n', position)
                    if end < 0:
                        return False
                    size_text = bytes(buffer[position:end]).split(b';', 1)[0].strip()
                    size = int(size_text, 16)  # ValueError if garbage: a malformed response
                    position = end + 2
                    if size == 0:
                        self._chunk_left = -2  # the trailers (usually none) and the final empty line
                    else:
                        self._chunk_left = size
                if self._chunk_left == -2:
                    end = buffer.find(b'\r\n', position)
                    if end < 0:
                        return False
                    trailer_is_empty = end == position
                    position = end + 2
                    if trailer_is_empty:
                        return True
                    continue
                if len(buffer) < position + self._chunk_left + 2:
                    return False
                self._chunks.append(bytes(buffer[position:position + self._chunk_left]))
                position += self._chunk_left + 2
                self._chunk_left = -1
        finally:
            self._position = position
            if position > _COMPACTION_THRESHOLD:
                del buffer[:position]
                self._position = 0

    def _finish(self, body: bytes, *, extra: bool) -> None:
        waiter = self._waiter
        reusable = self._keep_alive and not extra
        if not reusable:
            self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, self._headers, body, reusable))


class ConnectionPool:
    """
    Keep-alive connections to one server (per credential), and the regular requests over them.

    The pool is not limited by itself: the callers limit the concurrent requests (see
    ``auth.RequestSlots``), so there are never more connections than that limit.
    """

    def __init__(
            self,
            server: str,
            *,
            ssl_context: ssl.SSLContext | None,
            headers: Mapping[str, str],
    ) -> None:
        super().__init__()
        parsed = urllib.parse.urlsplit(server)
        if parsed.scheme not in ('http', 'https') or not parsed.hostname:
            raise ValueError(f'Unsupported server URL for the lean client: {server!r}')
        self._is_ssl = parsed.scheme == 'https'
        self._host = parsed.hostname
        self._port = parsed.port or (443 if self._is_ssl else 80)
        self._prefix = parsed.path.rstrip('/')
        self._ssl_context = ssl_context if self._is_ssl else None
        if self._is_ssl and self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        self._origin = f'{parsed.scheme}://{parsed.netloc}'
        self._address = f'{self._host}:{self._port}'
        self._key = _ConnectionKey(self._host, self._port, self._is_ssl, self._ssl_context or False)
        host_header = f'[{self._host}]' if ':' in self._host else self._host
        if parsed.port is not None:
            host_header = f'{host_header}:{parsed.port}'
        lines = [f'Host: {host_header}'] + [f'{name}: {value}' for name, value in headers.items()]
        self._common_head = ('\r\n'.join(lines) + '\r\n').encode('latin-1')
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._closed = False

    def __repr__(self) -> str:
        return f'<{type(self).__name__} {self._origin}{self._prefix}>'

    @property
    def idle(self) -> int:
        """How many keep-alive connections are idle in the pool now."""
        return sum(1 for connection in self._idle if not connection.closed)

    async def request(
            self,
            method: str,
            path: str,
            *,
            data: bytes | None = None,
            headers: Mapping[str, str] | None = None,
            params: Mapping[str, str] | None = None,
            timeouts: aiohttp.ClientTimeout | None = None,
    ) -> Response:
        """Send a request to a path on the server (already quoted) and read its response in full."""
        target = self._prefix + path
        if params:
            target = f'{target}?{urllib.parse.urlencode(params)}'
        head_lines = [f'{method} {target} HTTP/1.1\r\n'.encode('latin-1'), self._common_head]
        if headers:
            extra_lines = ''.join(f'{name}: {value}\r\n' for name, value in headers.items())
            head_lines.append(extra_lines.encode('latin-1'))
        if data is not None or method in ('POST', 'PUT', 'PATCH'):
            head_lines.append(b'Content-Length: %d\r\n' % (len(data) if data is not None else 0))
        head_lines.append(b'\r\n')
        head = b''.join(head_lines)
        url = self._origin + target.partition('?')[0]

        connect_timeout = timeouts.sock_connect if timeouts is not None else None
        if timeouts is None or timeouts.total is None:
            return await self._exchange(method, url, head, data, connect_timeout=connect_timeout)
        async with asyncio.timeout(timeouts.total):
            return await self._exchange(method, url, head, data, connect_timeout=connect_timeout)

    async def _exchange(self, method: str, url: str, head: bytes, data: bytes | None,
                        *, connect_timeout: float | None) -> Response:
        connection = self._take_idle()
        reused = connection is not None
        if connection is None:
            connection = await self._connect(connect_timeout)
        while True:
            try:
                status, headers, body, reusable = await connection.send(head, data, no_body=method == 'HEAD')
            except _Stale:
                self._all.discard(connection)
                if not reused:
                    raise aiohttp.ServerDisconnectedError() from None
                # Closed by the server while idle in the pool: the request has not been handled; anew.
                connection = await self._connect(connect_timeout)
                reused = False
                continue
            except BaseException:
                # Cancelled, timed out, or broken mid-response: the connection's state is unknown.
                connection.abort()
                self._all.discard(connection)
                raise
            if reusable and not self._closed:
                self._idle.append(connection)
            else:
                connection.abort()
                self._all.discard(connection)
            return Response(status, headers, body, method, url)

    def _take_idle(self) -> _Connection | None:
        idle = self._idle
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection
            self._all.discard(connection)
        return None

    async def _connect(self, connect_timeout: float | None) -> _Connection:
        if self._closed:
            raise aiohttp.ClientConnectionError('The connection pool is closed.')
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                _, connection = await loop.create_connection(
                    _Connection, self._host, self._port,
                    ssl=self._ssl_context,
                    server_hostname=self._host if self._ssl_context is not None else None,
                )
        except TimeoutError:
            raise _CONNECTION_TIMEOUT_ERROR(f'Connection timeout to {self._address}') from None
        except OSError as e:  # incl. socket.gaierror, ssl.SSLError & SSLCertVerificationError
            raise _connection_error(self._key, e) from e
        sock = connection.transport.get_extra_info('socket') if connection.transport else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._all.add(connection)
        return connection

    async def close(self) -> None:
        """Close all connections, idle or not; new requests then fail."""
        self._closed = True
        for connection in list(self._all):
            connection.abort()
        self._all.clear()
        self._idle.clear()
