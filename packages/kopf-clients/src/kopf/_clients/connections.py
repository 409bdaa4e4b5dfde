"""
A lean HTTP/1.1 client for all API requests: keep-alive connections per server, and the streams.

Every change of every object costs the operator a few regular requests (the finalizer, the results,
the diff-base), so the client's own cost per request is on the hottest path of the framework.
A general-purpose client (aiohttp) spends several times more CPU per small request in its machinery
(request & response objects, tracing hooks, cookie jars, header multidicts, stream readers);
this one does only what a request to the Kubernetes API needs, on asyncio's own transports,
with the TLS done by the ssl module's C code (the figures: benchmarks/README.md).

What it supports: ``http`` and ``https`` servers (with a path prefix), keep-alive connections
(one request at a time each, no pipelining), responses framed by ``Content-Length``, by chunks,
or by closing the connection (parsed by llhttp in C: :mod:`kopf._cogs.helpers.http1`, the framework's
one HTTP/1.1 parsing); the total and connect timeouts; streamed responses (watch-streams)
on connections of their own, read as the bytes come, with back-pressure (the socket's reading
pauses while more than :data:`_STREAM_HIGH_WATER` bytes wait for the consumer). What it leaves to
aiohttp (:mod:`.fallback`, imported only then): the proxies, explicit or from the environment.

A connection that the server has closed while it was idle in the pool is noticed when it fails
before any byte of the response has come; the request is then sent once more over a new connection
(it has not reached the server's handling; this is what every keep-alive client must do anyway).
Other failures escalate as :class:`NetworkError` (or ``TimeoutError``): the callers retry them.
"""
import asyncio
import collections
import contextlib
import heapq
import itertools
import socket
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import NamedTuple, Protocol, cast

from kopf._cogs.helpers import http1, tls

__all__ = ['CannotConnect', 'ConnectionPool', 'Disconnected', 'HTTPTransport', 'MalformedResponse',
           'NetworkError', 'Response', 'StreamResponse', 'StreamedResponse', 'Timeouts']

# How many bytes of a streamed body can wait for the consumer before the reading from the socket pauses.
_STREAM_HIGH_WATER = 128 * 1024


class Timeouts(NamedTuple):
    """The timeouts of a request: of the whole exchange, and of establishing a connection (None: none)."""
    total: float | None = None
    connect: float | None = None


class _Deadline:
    """The total timeout of one request in flight: its task is cancelled when the time is over."""

    __slots__ = ('cancelling', 'done', 'expired', 'task', 'when')

    def __init__(self, when: float, task: 'asyncio.Task[object]') -> None:
        self.when = when
        self.task = task
        self.cancelling = task.cancelling()  # the cancellations requested by others before this one
        self.done = False
        self.expired = False


class _Deadlines:
    """
    The total timeouts of a pool's requests in flight: one loop timer for all of them, not one per request.

    ``asyncio.timeout()`` costs more than the exchange of a small request itself (a context manager,
    a timer in the loop's heap and its cancellation, for every request). Here, a request only puts its
    deadline into a heap and marks it done when over. The loop's timer is armed at the earliest deadline
    and fires rarely: the requests usually end long before their deadlines, and as they all have the same
    timeout, the later requests' deadlines do not need the timer re-armed. The expired requests' tasks
    are cancelled, and their cancellation turns into ``TimeoutError`` --- as with ``asyncio.timeout()``.
    The heap is cleaned of the finished requests whenever they outnumber the ones in flight.
    """

    def __init__(self) -> None:
        # By the deadline, then by the order of entering (compared in C: no comparison methods of ours).
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = 0.0
        self._live = 0

    def enter(self, timeout: float) -> _Deadline:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)  # with the loop: not looked up again (a system call in Python 3.11)
        if task is None:
            raise RuntimeError('A request with a timeout must run in a task.')
        deadline = _Deadline(loop.time() + timeout, task)
        heapq.heappush(self._heap, (deadline.when, next(self._order), deadline))
        self._live += 1
        if self._timer is None or deadline.when < self._armed_at:
            self._arm(loop, deadline.when)
        return deadline

    def leave(self, deadline: _Deadline) -> None:
        deadline.done = True
        self._live -= 1
        heap = self._heap
        if len(heap) > 2 * self._live + 64:
            heap[:] = [entry for entry in heap if not entry[2].done]
            heapq.heapify(heap)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._expire)
        self._armed_at = when

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        heap, now = self._heap, loop.time()
        while heap and (heap[0][2].done or heap[0][0] <= now):
            _, _, deadline = heapq.heappop(heap)
            if not deadline.done:
                deadline.expired = True
                deadline.task.cancel()
        if heap:
            self._arm(loop, heap[0][0])


class HTTPTransport(Protocol):
    """What the API calls need of an HTTP client: the lean one here, or aiohttp for the proxies."""

    async def request(self, method: str, path: str, *, data: bytes | None, headers: Mapping[str, str] | None,
                      params: Mapping[str, str] | None, timeouts: Timeouts | None) -> 'Response': ...

    async def stream(self, method: str, path: str, *, headers: Mapping[str, str] | None,
                     params: Mapping[str, str] | None, timeouts: Timeouts | None) -> 'StreamedResponse': ...

    async def close(self) -> None: ...


class StreamedResponse(Protocol):
    """A response whose body is read as it comes; see :class:`StreamResponse`."""

    status: int
    headers: Mapping[str, str]
    method: str
    url: str

    async def readany(self) -> bytes: ...

    async def read(self) -> bytes: ...

    def close(self) -> None: ...


class NetworkError(ConnectionError):
    """A failure of the network or of the HTTP exchange (not an HTTP error status): worth retrying."""


class CannotConnect(NetworkError):
    """A connection cannot be established: refused, the host unresolved, the TLS handshake failed, etc."""

    def __init__(self, address: str, os_error: OSError) -> None:
        super().__init__(f'Cannot connect to {address}: {os_error}')
        self.address = address  # e.g. https://127.0.0.1:6443
        self.os_error = os_error


class Disconnected(NetworkError):
    """The server has closed the connection in the middle of a response (or before it)."""

    def __init__(self, message: str = 'The server has closed the connection unexpectedly.') -> None:
        super().__init__(message)


class MalformedResponse(NetworkError):
    """The server's response is not valid HTTP/1.x (the connection is dropped)."""


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
        self._parser = http1.ResponseParser()
        self._received = False  # any byte of the current response?
        # The streamed body (e.g. a watch-stream): handed over as it comes, with back-pressure.
        self._streaming = False
        self._pieces: collections.deque[bytes] = collections.deque()
        self._pieces_size = 0
        self._stream_ended = False
        self._stream_error: Exception | None = None
        self._reader: asyncio.Future[None] | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not checked by isinstance(): other loops' transports (e.g. uvloop's) are not asyncio's classes.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        parser = self._parser
        waiter = self._waiter
        ended = parser.eof()  # a body until the close is complete now
        if waiter is not None and not waiter.done():
            if ended and not self._streaming:
                waiter.set_result((parser.status, parser.headers, parser.take_body(), False))
            elif not self._received:
                waiter.set_exception(_Stale())
            else:
                waiter.set_exception(Disconnected())
        if self._streaming and not self._stream_ended:
            if ended:
                self._deliver(parser.take_body())
            self._end_stream(None if ended else Disconnected())

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost() finishes or fails the response

    def send(self, head: bytes, body: bytes | None, *, no_body: bool,
             streaming: bool = False) -> asyncio.Future[_Outcome]:
        """Send a request; the future gets the whole response, or only its head if ``streaming``."""
        assert self.transport is not None
        waiter = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self._streaming = streaming
        self._received = False
        self._parser.expect(no_body=no_body)
        self.transport.write(head + body if body else head)
        return waiter

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or (waiter.done() and not self._streaming):
            self.abort()  # nothing was asked: the connection is out of sync, never to be reused
            return
        self._received = True
        parser = self._parser
        try:
            parser.feed(data)
        except http1.MalformedMessage as e:
            error = MalformedResponse(f'Malformed HTTP response: {e}')
            if not waiter.done():
                waiter.set_exception(error)
            elif self._streaming and not self._stream_ended:
                self._end_stream(error)
            self.abort()
            return
        if self._streaming:
            if parser.head and not waiter.done():
                waiter.set_result((parser.status, parser.headers, b'', False))
            if parser.body:
                self._deliver(parser.take_body())
            if parser.complete and not self._stream_ended:
                self._end_stream()
                self.abort()  # not reused: the streams are few, and their connections are their own
        elif parser.complete:
            reusable = parser.keep_alive and not parser.extra
            if not reusable:
                self.abort()
            if not waiter.done():
                waiter.set_result((parser.status, parser.headers, parser.take_body(), reusable))

    async def read_stream(self) -> bytes:
        """The streamed body's bytes that have come so far (waiting for some); empty at its end."""
        while True:
            if self._pieces:
                data = b''.join(self._pieces) if len(self._pieces) > 1 else self._pieces[0]
                self._pieces.clear()
                self._pieces_size = 0
                if self._paused and self.transport is not None and not self.closed:
                    self._paused = False
                    self.transport.resume_reading()
                return data
            if self._stream_error is not None:
                raise self._stream_error
            if self._stream_ended:
                return b''
            self._reader = asyncio.get_running_loop().create_future()
            try:
                await self._reader
            finally:
                self._reader = None

    def _deliver(self, data: bytes) -> None:
        if data:
            self._pieces.append(data)
            self._pieces_size += len(data)
            if self._pieces_size > _STREAM_HIGH_WATER and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()  # until the consumer takes what has come
            self._wake_reader()

    def _end_stream(self, error: Exception | None = None) -> None:
        self._stream_ended = True
        self._stream_error = error
        self._wake_reader()

    def _wake_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)


class StreamResponse:
    """A response whose body is read as it comes (see :meth:`ConnectionPool.stream`); close it when done."""

    __slots__ = ('_connection', '_deadline', '_pool', 'headers', 'method', 'status', 'url')

    def __init__(self, status: int, headers: Mapping[str, str], method: str, url: str, *,
                 connection: _Connection, pool: 'ConnectionPool', deadline: float | None) -> None:
        super().__init__()
        self.status = status
        self.headers = headers
        self.method = method
        self.url = url
        self._connection = connection
        self._pool = pool
        self._deadline = deadline

    async def readany(self) -> bytes:
        """The bytes that have come so far (waiting for some if none); empty at the end of the body."""
        if self._deadline is None:
            return await self._connection.read_stream()
        async with asyncio.timeout_at(self._deadline):
            return await self._connection.read_stream()

    async def read(self) -> bytes:
        """The rest of the body, until its end."""
        chunks = []
        while chunk := await self.readany():
            chunks.append(chunk)
        return b''.join(chunks)

    def close(self) -> None:
        self._pool._forget(self._connection)


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
            self._ssl_context = tls.verify_as_kubernetes(ssl.create_default_context())
        self._origin = f'{parsed.scheme}://{parsed.netloc}'
        host = f'[{self._host}]' if ':' in self._host else self._host
        self._address = f'{parsed.scheme}://{host}:{self._port}'
        host_header = f'[{self._host}]' if ':' in self._host else self._host
        if parsed.port is not None:
            host_header = f'{host_header}:{parsed.port}'
        lines = [f'Host: {host_header}'] + [f'{name}: {value}' for name, value in headers.items()]
        self._common_head = ('\r\n'.join(lines) + '\r\n').encode('latin-1')
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._closed = False
        self._deadlines = _Deadlines()

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
            timeouts: Timeouts | None = None,
    ) -> Response:
        """Send a request to a path on the server (already quoted) and read its response in full."""
        head, url = self._build_head(method, path, data=data, headers=headers, params=params)

        connect_timeout = timeouts.connect if timeouts is not None else None
        if timeouts is None or timeouts.total is None:
            return await self._exchange(method, url, head, data, connect_timeout=connect_timeout)
        deadline = self._deadlines.enter(timeouts.total)
        try:
            return await self._exchange(method, url, head, data, connect_timeout=connect_timeout)
        except asyncio.CancelledError:
            if deadline.expired and deadline.task.uncancel() <= deadline.cancelling:
                raise TimeoutError() from None
            raise
        finally:
            self._deadlines.leave(deadline)

    def _build_head(self, method: str, path: str, *, data: bytes | None,
                    headers: Mapping[str, str] | None, params: Mapping[str, str] | None) -> tuple[bytes, str]:
        target = self._prefix + path
        if params:
            target = f'{target}?{urllib.parse.urlencode(params)}'
        head_lines = [f'{method} {target} HTTP/1.1\r\n'.encode('latin-1'), self._common_head]
        if headers:  # a list, not a generator: fewer calls for a few headers
            extra_lines = ''.join([f'{name}: {value}\r\n' for name, value in headers.items()])
            head_lines.append(extra_lines.encode('latin-1'))
        if data is not None or method in ('POST', 'PUT', 'PATCH'):
            head_lines.append(b'Content-Length: %d\r\n' % (len(data) if data is not None else 0))
        head_lines.append(b'\r\n')
        return b''.join(head_lines), self._origin + target.partition('?')[0]

    async def stream(
            self,
            method: str,
            path: str,
            *,
            headers: Mapping[str, str] | None = None,
            params: Mapping[str, str] | None = None,
            timeouts: Timeouts | None = None,
    ) -> 'StreamResponse':
        """
        Send a request over a connection of its own and return as soon as the response's head is there.

        The body is read by the caller as it comes (:meth:`StreamResponse.readany`), e.g. a watch-stream.
        The total timeout (if any) limits the whole stream, the reading included; the caller must close it.
        """
        head, url = self._build_head(method, path, data=None, headers=headers, params=params)
        total = timeouts.total if timeouts is not None else None
        deadline = asyncio.get_running_loop().time() + total if total is not None else None
        connection: _Connection | None = None
        try:
            async with asyncio.timeout_at(deadline):
                connection = await self._connect(timeouts.connect if timeouts is not None else None)
                status, headers_, _, _ = await connection.send(head, None, no_body=method == 'HEAD',
                                                               streaming=True)
        except _Stale:
            if connection is not None:
                self._forget(connection)
            raise Disconnected() from None
        except BaseException:
            if connection is not None:
                self._forget(connection)
            raise
        return StreamResponse(status, headers_, method, url, connection=connection, pool=self,
                              deadline=deadline)

    def _forget(self, connection: '_Connection') -> None:
        connection.abort()
        self._all.discard(connection)

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
                    raise Disconnected() from None
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
            raise NetworkError('The connection pool is closed.')
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                _, connection = await loop.create_connection(
                    _Connection, self._host, self._port,
                    ssl=self._ssl_context,
                    server_hostname=self._host if self._ssl_context is not None else None,
                )
        except TimeoutError:
            raise TimeoutError(f'Connection timeout to {self._address}') from None
        except OSError as e:  # incl. socket.gaierror, ssl.SSLError & SSLCertVerificationError
            raise CannotConnect(self._address, e) from e
        sock = connection.transport.get_extra_info('socket') if connection.transport else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._all.add(connection)
        return connection

    async def close(self) -> None:
        """Close all connections, idle or not; new requests then fail."""
        self._closed = True
        self._deadlines.close()
        for connection in list(self._all):
            connection.abort()
        self._all.clear()
        self._idle.clear()
