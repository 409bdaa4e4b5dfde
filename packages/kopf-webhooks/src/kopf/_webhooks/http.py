"""
A lean HTTP/1.1 server for the admission reviews: a request with a body in, one response out.

The admission reviews sit in the path of every API request of the cluster, so the server's own cost
per request matters: here, a protocol takes only what the webhooks need (the request line, the headers,
a ``Content-Length`` body; parsed by :mod:`kopf._cogs.helpers.http1`, the framework's one HTTP/1.1 parsing),
and answers with ``Content-Length`` over keep-alive connections; the sockets
(plain or TLS) are served directly by the event loop's readiness callbacks, so that the encryption
happens in the SSL module's C code. A general-purpose web framework on asyncio's TLS transport costs
several times more per request.

What it supports: HTTP/1.1 and HTTP/1.0, keep-alive and ``Connection: close``, pipelined requests
(answered one by one, in order), ``Expect: 100-continue`` (e.g. curl's for bigger bodies), TLS via
the server's SSL context with the client certificates available to the handler. What it refuses,
with a clear answer and the connection closed: malformed requests (400), chunked bodies (411),
bodies above the limit (413), oversized headers (431).

What it does not let a client do: hold a socket forever (a slowloris-style exhaustion of the sockets).
A TLS handshake must finish in time, a request must arrive in full in time since its first byte
(else 408 and the close), and an idle keep-alive connection is closed quietly after a while. The
deadlines are checked by one sweeper per server, waking up about once a second while there are
connections: no timer handles per connection or per request on the path of every review.

What is worth an operator's attention is a warning, but at most one per minute of each kind (the rest
are debug lines, counted in the next warning), so that a noisy or hostile client cannot flood the logs:
a body above the limit (a review that the API server will never get answered), a TLS client refused
for its certificate or for none (the API server without the client certificate that the server requires),
and a plain-HTTP request to the HTTPS server (an ``http://`` URL somewhere).
"""
import asyncio
import contextlib
import errno
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from kopf._cogs.helpers import http1

__all__ = ['HTTPResponse', 'Handler', 'Listener', 'Request', 'start_server', 'stop_server']

logger = logging.getLogger(__name__)

MAX_HEAD_SIZE = 64 * 1024

# The API server's webhook client (client-go's transport) gives up on a TLS handshake after 10 s:
# a handshake unfinished by then has nobody waiting for it.
HANDSHAKE_TIMEOUT = 10.0

# A review's own timeout in the API server is at most 30 s (``timeoutSeconds``: 1..30, 10 by default),
# so a request whose head or body is still incomplete 30 s after its first byte is abandoned anyway.
# A new connection gets the same time for its request's first byte: clients connect to send something.
REQUEST_TIMEOUT = 30.0

# Longer than the API server's own idle pooling: client-go's transports keep an idle connection for
# 90 s (Go's default ``IdleConnTimeout``), so normally the client is the one who closes it. Had we
# closed it first, a review sent at that moment would meet a closed connection, and Go does not
# resend a failed POST: the review would fail (or be ignored by the failure policy). 120 s leaves
# a margin above the 90 s and still frees the sockets of the clients that never close them.
IDLE_TIMEOUT = 120.0

# How often a kind of warning can be logged as a warning (the others are debug lines meanwhile).
WARNING_INTERVAL = 60.0

# How often the sweeper checks the deadlines (or more often if the timeouts are shorter, e.g. in tests).
SWEEP_INTERVAL = 1.0

CLOSING = 'Connection: close\r\n'
REASONS = {
    100: 'Continue', 200: 'OK', 400: 'Bad Request', 404: 'Not Found', 405: 'Method Not Allowed',
    408: 'Request Timeout', 411: 'Length Required', 413: 'Content Too Large',
    431: 'Request Header Fields Too Large',
    500: 'Internal Server Error',
}

# The header fields of a request: looked up by any case, repeated ones kept (as aiohttp's requests have them).
_new_fields: Callable[[], CIMultiDict[str]] = CIMultiDict

# status, content type, body, extra headers (already formatted lines, each ending with CRLF).
HTTPResponse = tuple[int, str, bytes, str]


class _Warnings:
    """The warnings of one server, at most one per kind per interval; the others are debug lines."""

    def __init__(self, interval: float = WARNING_INTERVAL) -> None:
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._interval = interval
        self._last: dict[str, float] = {}
        self._muted: dict[str, int] = {}

    def warn(self, kind: str, message: str) -> None:
        now = self._loop.time()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval:
            self._muted[kind] = self._muted.get(kind, 0) + 1
            logger.debug(message)
            return
        muted = self._muted.pop(kind, 0)
        self._last[kind] = now
        logger.warning(message + (f' ({muted} more like this since the last warning.)' if muted else ''))


def _peer(sock: socket.socket) -> str:
    try:
        address = sock.getpeername()
    except OSError:
        return 'a client'
    return f'{address[0]}:{address[1]}' if isinstance(address, tuple) else 'a local client'


class Request:
    """What a handler gets: the method, the target (path & query), the headers, the body, the connection."""

    __slots__ = ('body', 'headers', 'method', 'target', 'transport')

    def __init__(self, method: str, target: str, headers: CIMultiDictProxy[str], body: bytes,
                 transport: asyncio.Transport) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.transport = transport

    @property
    def path(self) -> str:
        return self.target.split('?', 1)[0]

    @property
    def peercert(self) -> Any:
        """The client's certificate as the SSL layer parsed it (None if none or not verified)."""
        return self.transport.get_extra_info('peercert')


Handler = Callable[[Request], Awaitable[HTTPResponse]]


class _HTTPProtocol(asyncio.Protocol):
    """
    One connection's HTTP: parses the requests, serves them one by one, answers in order.

    ``deadline`` (the loop's time, or None while a request is being served) is when the connection
    is closed by the server's sweeper if nothing changes: set when a request's first byte comes
    (for the rest of it), and when an answer is sent (for the next request to begin).
    """

    def __init__(self, handler: Handler, max_body_size: int, *,
                 request_timeout: float, idle_timeout: float, warnings: _Warnings) -> None:
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._warnings = warnings
        self._handler = handler
        self._max_body_size = max_body_size
        self._parser = http1.RequestParser(fields=_new_fields, max_body_size=max_body_size,
                                           max_head_size=MAX_HEAD_SIZE)
        self._request_timeout = request_timeout
        self._idle_timeout = idle_timeout
        self.deadline: float | None = None
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._continued = False
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self.deadline = self._loop.time() + self._request_timeout  # for the first request to begin

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._task is not None:
            self._task.cancel()  # nobody will read the answer

    def data_received(self, data: bytes) -> None:
        if self._task is None and not self._buffer:  # a new request begins: it must arrive in time
            self.deadline = self._loop.time() + self._request_timeout
        self._buffer += data
        if self._task is None:
            self._next()
        elif len(self._buffer) > self._max_body_size + MAX_HEAD_SIZE and self._transport is not None:
            self._transport.pause_reading()  # pipelined far ahead: wait until the current one is answered
            self._paused = True

    def _next(self) -> None:
        """Start serving the next complete request in the buffer, if there is one."""
        transport = self._transport
        if transport is None:
            return
        if self._paused:
            transport.resume_reading()
            self._paused = False
        try:
            parsed = self._parser.take(self._buffer)
        except http1.MalformedMessage as e:
            if e.status == 413:
                sock = transport.get_extra_info('socket')
                hint = 'If the reviews are this big, raise WebhookServer(max_body_size=...).'
                self._warnings.warn('413', f'Refused a webhook request from {_peer(sock)}: {e} {hint}')
            self._refuse(e.status, str(e))
            return
        if parsed is None:
            if self._parser.continuing and not self._continued:
                transport.write(b'HTTP/1.1 100 Continue\r\n\r\n')
                self._continued = True
            return
        method, target, fields, body, keep_alive = parsed
        self._continued = False
        request = Request(method, target, CIMultiDictProxy(fields), body, transport)
        self.deadline = None  # the handler's time is not limited here (the API server limits it)
        self._task = self._loop.create_task(self._serve(request, keep_alive))

    async def _serve(self, request: Request, keep_alive: bool) -> None:
        try:
            status, content_type, payload, extra = await self._handler(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception('The webhook server has failed to serve a request.')
            status, content_type, payload, extra = 500, 'text/plain', b'The webhook has failed.\n', ''
        self._task = None
        transport = self._transport
        if transport is None:
            return
        head = (f'HTTP/1.1 {status} {REASONS.get(status, "Unknown")}\r\n'
                f'Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n{extra}'
                f'{"" if keep_alive else CLOSING}\r\n')
        transport.write(head.encode('latin-1') + payload)
        if not keep_alive:
            self.deadline = self._loop.time() + self._idle_timeout  # if the client never reads the answer
            transport.close()
        elif self._buffer:  # a pipelined request: its time starts now, when its turn comes
            self.deadline = self._loop.time() + self._request_timeout
            self._next()
        else:
            self.deadline = self._loop.time() + self._idle_timeout

    def expire(self) -> None:
        """Close the connection at its deadline: with a 408 if a request has begun, else quietly."""
        self.deadline = None
        transport = self._transport
        if transport is None:
            return
        if self._buffer:
            logger.debug('Closing a connection: its request has not arrived in full in time.')
            self._refuse(408, 'The request has not arrived in full in time.')
        else:
            logger.debug('Closing an idle connection.')
        # Not waiting for a client that does not read: the 408 goes out only if the socket takes it now.
        transport.abort()

    def _refuse(self, status: int, message: str) -> None:
        if self._transport is not None:
            payload = f'{message}\n'.encode()
            self._transport.write(
                f'HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: text/plain\r\n'
                f'Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n'.encode() + payload)
            self._transport.close()
        self._buffer.clear()


# The reasons of OpenSSL's handshake failures when a client certificate is required but not given.
_NO_CLIENT_CERTIFICATE = frozenset({'PEER_DID_NOT_RETURN_A_CERTIFICATE', 'NO_CERTIFICATE_RETURNED'})


class _SocketTransport(asyncio.Transport):
    """
    A connection's transport over a non-blocking socket (plain or TLS), driven by the loop's readiness.

    For TLS, the socket is an :class:`ssl.SSLSocket`: the encryption is done by the SSL module in C
    on every ``recv``/``send``. (asyncio's own TLS transport passes every byte through Python code
    of its memory buffers, which costs more than the rest of a small request's serving.)
    """

    def __init__(self, sock: socket.socket, protocol: _HTTPProtocol, *,
                 handshaking: bool, handshake_timeout: float, warnings: _Warnings) -> None:
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._warnings = warnings
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._handshaking = handshaking
        self._handshake_deadline = self._loop.time() + handshake_timeout if handshaking else 0.0
        self._outgoing = bytearray()
        self._reading = True
        self._closed = False
        self._loop.add_reader(self._fd, self._on_readable)
        if not handshaking:
            protocol.connection_made(self)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == 'peercert':
            return self._sock.getpeercert() if isinstance(self._sock, ssl.SSLSocket) else default
        if name == 'socket':
            return self._sock
        if name == 'peername':
            try:
                return self._sock.getpeername()
            except OSError:
                return default
        return default

    def is_closing(self) -> bool:
        return self._closed

    def expire_if_due(self, now: float) -> None:
        """Close the connection if its handshake or its protocol's current deadline has passed."""
        if self._handshaking:
            if now >= self._handshake_deadline:
                logger.debug('Closing a connection: its TLS handshake has not finished in time.')
                self._close(None, notify=False)
        elif self._protocol.deadline is not None and now >= self._protocol.deadline:
            self._protocol.expire()

    def pause_reading(self) -> None:
        if self._reading and not self._closed:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._reading and not self._closed:
            self._reading = True
            self._loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        if self._handshaking:
            self._handshake()
            return
        sock = self._sock
        try:
            while True:
                data = sock.recv(65536)
                if not data:  # EOF
                    self._close(None)
                    return
                self._protocol.data_received(data)
                if self._closed or not self._reading:
                    return
                if not (isinstance(sock, ssl.SSLSocket) and sock.pending()) and len(data) < 65536:
                    return
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except (OSError, ssl.SSLError) as e:
            self._close(e)

    def _handshake(self) -> None:
        sock = self._sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            return
        except ssl.SSLWantWriteError:
            self._loop.add_writer(self._fd, self._on_writable)
            return
        except (OSError, ssl.SSLError) as e:
            reason = getattr(e, 'reason', None)
            if isinstance(e, ssl.SSLCertVerificationError):
                self._warnings.warn('client-cert', (
                    f'Refused a TLS client {_peer(sock)}: its certificate is not trusted '
                    f'({e.verify_message}). If it is the API server, give it a client certificate '
                    f'signed by the CA of verify_cafile=/verify_cadata=.'))
            elif reason in _NO_CLIENT_CERTIFICATE:
                self._warnings.warn('no-client-cert', (
                    f'Refused a TLS client {_peer(sock)}: it has presented no certificate, but '
                    f'verify_mode=CERT_REQUIRED. If it is the API server, give it a client certificate '
                    f'(see the README of kopf-webhooks).'))
            elif reason == 'HTTP_REQUEST':
                self._warnings.warn('plain-http', (
                    f'Refused a plain-HTTP request from {_peer(sock)}: the webhook server serves only HTTPS; '
                    f'use https:// URLs.'))
            else:
                logger.debug(f'A TLS handshake has failed: {e}')
            self._close(e, notify=False)
            return
        self._handshaking = False
        self._loop.remove_writer(self._fd)
        self._protocol.connection_made(self)
        self._on_readable()  # the data that came with the handshake's end (e.g. the request itself)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            return
        if self._outgoing:
            self._outgoing += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            sent = 0
        except (OSError, ssl.SSLError) as e:
            self._close(e)
            return
        if sent < len(data):
            self._outgoing += memoryview(data)[sent:]
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        if self._handshaking:
            self._handshake()
            return
        try:
            while self._outgoing:
                sent = self._sock.send(self._outgoing)
                del self._outgoing[:sent]
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except (OSError, ssl.SSLError) as e:
            self._close(e)
            return
        self._loop.remove_writer(self._fd)
        if self._closing_after_write:
            self._close(None)

    _closing_after_write = False

    def close(self) -> None:
        if self._outgoing and not self._closed:
            self._closing_after_write = True  # the last answer goes out first
            self.pause_reading()
        else:
            self._close(None)

    def abort(self) -> None:
        self._close(None)

    def _close(self, exc: BaseException | None, *, notify: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        with contextlib.suppress(OSError):
            self._sock.close()
        if notify and not self._handshaking:
            self._protocol.connection_lost(exc if isinstance(exc, Exception) else None)


class Listener:
    """The listening sockets of a server: accepts the connections and gives them to new protocols."""

    def __init__(self, sockets: list[socket.socket], factory: Callable[[], _HTTPProtocol],
                 ssl_context: ssl.SSLContext | None, *,
                 handshake_timeout: float, sweep_interval: float, warnings: _Warnings) -> None:
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._warnings = warnings
        self.sockets = sockets
        self._factory = factory
        self._ssl_context = ssl_context
        self._handshake_timeout = handshake_timeout
        self._sweep_interval = sweep_interval
        self._sweeper: asyncio.TimerHandle | None = None
        self.transports: set[_SocketTransport] = set()
        for sock in sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    @property
    def port(self) -> int:
        return int(self.sockets[0].getsockname()[1])

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(100):  # a backlog of connections, but not forever
            try:
                conn, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. out of file descriptors: the others are served meanwhile
                logger.warning(f'Failed to accept a connection: {e}')
                return
            conn.setblocking(False)
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock: socket.socket = conn
            if self._ssl_context is not None:
                sock = self._ssl_context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            transport = _SocketTransport(sock, self._factory(), handshaking=self._ssl_context is not None,
                                         handshake_timeout=self._handshake_timeout, warnings=self._warnings)
            self.transports.add(transport)
            if self._sweeper is None:
                self._sweeper = self._loop.call_later(self._sweep_interval, self._sweep)
            if transport._handshaking:
                transport._handshake()

    def _sweep(self) -> None:
        """Close the connections past their deadlines; forget the closed ones; repeat while any remain."""
        now = self._loop.time()
        alive: set[_SocketTransport] = set()
        for transport in self.transports:
            if not transport.is_closing():
                transport.expire_if_due(now)
            if not transport.is_closing():
                alive.add(transport)
        self.transports = alive
        self._sweeper = self._loop.call_later(self._sweep_interval, self._sweep) if alive else None

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for sock in self.sockets:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        for transport in list(self.transports):
            transport.abort()
        self.transports.clear()


def _bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for all the addresses of the host, all on the same port (0: a free one)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    errors: list[OSError] = []
    try:
        for family, kind, proto, _, address in infos:
            if any(sock.family == family and sock.getsockname()[0] == address[0] for sock in sockets):
                continue  # the same address twice (e.g. from /etc/hosts)
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if port == 0 and sockets:  # the same port as the first one
                    address = (address[0], sockets[0].getsockname()[1], *address[2:])
                sock.bind(address)
                sock.listen(128)
                sock.setblocking(False)
            except OSError as e:
                sock.close()
                # E.g. ::1 of "localhost" where IPv6 is disabled: the other addresses will do.
                # But a busy port is an error: another process would get a part of the requests.
                if e.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                    raise
                errors.append(e)
            else:
                sockets.append(sock)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise errors[0] if errors else OSError(f'Cannot listen on {host!r}: no addresses found.')
    return sockets


async def start_server(
        handler: Handler,
        *,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        max_body_size: int,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        request_timeout: float = REQUEST_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
) -> Listener:
    """
    Listen on the host (all its addresses) and the port (0: a free one, the same for all addresses).

    The timeouts (in seconds) limit how long a connection can be held by a client: for the TLS
    handshake, for a request to arrive in full since its first byte, and for the idle keep-alive.
    """
    timeouts = {'handshake_timeout': handshake_timeout, 'request_timeout': request_timeout,
                'idle_timeout': idle_timeout}
    for name, value in timeouts.items():
        if not value > 0:
            raise ValueError(f'The webhook server\'s {name} must be a positive number of seconds, '
                             f'not {value!r}.')

    warnings = _Warnings()

    def factory() -> _HTTPProtocol:
        return _HTTPProtocol(handler, max_body_size, request_timeout=request_timeout,
                             idle_timeout=idle_timeout, warnings=warnings)

    # The deadlines are checked with a precision of the interval: a fraction of the shortest timeout.
    sweep_interval = min(SWEEP_INTERVAL, min(timeouts.values()) / 4)
    return Listener(_bind(host, port), factory, ssl_context,
                    handshake_timeout=handshake_timeout, sweep_interval=sweep_interval, warnings=warnings)


async def stop_server(listener: Listener) -> None:
    listener.close()
