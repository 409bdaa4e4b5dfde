"""
A lean HTTP/1.1 server for the admission reviews: a request with a body in, one response out.

The admission reviews sit in the path of every API request of the cluster, so the server's own cost
per request matters: here, it is an :class:`asyncio.Protocol` that parses only what the webhooks need
(the request line, the headers, a ``Content-Length`` body), and answers with ``Content-Length`` over
keep-alive connections; a general-purpose web framework costs several times more per request.

What it supports: HTTP/1.1 and HTTP/1.0, keep-alive and ``Connection: close``, pipelined requests
(answered one by one, in order), ``Expect: 100-continue`` (e.g. curl's for bigger bodies), TLS via
the server's SSL context with the client certificates available to the handler. What it refuses,
with a clear answer and the connection closed: malformed requests (400), chunked bodies (411),
bodies above the limit (413), oversized headers (431).
"""
import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

__all__ = ['HTTPResponse', 'Handler', 'start_server', 'stop_server']

logger = logging.getLogger('kopf.webhooks')

MAX_HEAD_SIZE = 64 * 1024
CLOSING = 'Connection: close\r\n'
REASONS = {
    100: 'Continue', 200: 'OK', 400: 'Bad Request', 404: 'Not Found', 405: 'Method Not Allowed',
    411: 'Length Required', 413: 'Content Too Large', 431: 'Request Header Fields Too Large',
    500: 'Internal Server Error',
}

# status, content type, body, extra headers (already formatted lines, each ending with CRLF).
HTTPResponse = tuple[int, str, bytes, str]


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


class _Connections:
    """The open connections of a server: closed all at once when the server stops."""

    def __init__(self) -> None:
        super().__init__()
        self.protocols: set[_HTTPProtocol] = set()


class _HTTPProtocol(asyncio.Protocol):
    def __init__(self, handler: Handler, connections: _Connections, max_body_size: int) -> None:
        super().__init__()
        self._handler = handler
        self._connections = connections
        self._max_body_size = max_body_size
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._continued = False
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._connections.protocols.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._connections.protocols.discard(self)
        if self._task is not None:
            self._task.cancel()  # nobody will read the answer

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
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
        buffer = self._buffer
        end = buffer.find(b'\r\n\r\n')
        if end < 0:
            if len(buffer) > MAX_HEAD_SIZE:
                self._refuse(431, 'The request headers are too large.')
            return
        lines = buffer[:end].decode('latin-1').split('\r\n')
        try:
            method, target, version = lines[0].split(' ')
        except ValueError:
            self._refuse(400, 'Malformed HTTP request line.')
            return
        headers: CIMultiDict[str] = CIMultiDict()
        for line in lines[1:]:
            name, colon, value = line.partition(':')
            if not colon:
                self._refuse(400, 'Malformed HTTP header line.')
                return
            headers.add(name.strip(), value.strip())
        if 'chunked' in headers.get('Transfer-Encoding', '').lower():
            self._refuse(411, 'Chunked request bodies are not supported: send the Content-Length.')
            return
        try:
            length = int(headers.get('Content-Length', '0'))
        except ValueError:
            self._refuse(400, 'Malformed Content-Length.')
            return
        if length < 0 or length > self._max_body_size:
            self._refuse(413, f'The request body is above the limit of {self._max_body_size} bytes.')
            return
        total = end + 4 + length
        if len(buffer) < total:
            if not self._continued and headers.get('Expect', '').lower() == '100-continue':
                transport.write(b'HTTP/1.1 100 Continue\r\n\r\n')
                self._continued = True
            return
        body = bytes(buffer[end + 4:total])
        del buffer[:total]
        self._continued = False
        connection = headers.get('Connection', '').lower()
        keep_alive = connection != 'close' if version == 'HTTP/1.1' else connection == 'keep-alive'
        request = Request(method, target, CIMultiDictProxy(headers), body, transport)
        self._task = asyncio.get_running_loop().create_task(self._serve(request, keep_alive))

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
            transport.close()
        elif self._buffer:
            self._next()

    def _refuse(self, status: int, message: str) -> None:
        if self._transport is not None:
            payload = f'{message}\n'.encode()
            self._transport.write(
                f'HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: text/plain\r\n'
                f'Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n'.encode() + payload)
            self._transport.close()
        self._buffer.clear()


async def start_server(
        handler: Handler,
        *,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        max_body_size: int,
) -> tuple[asyncio.Server, _Connections, int]:
    """Listen on the host (all its addresses) and the port (0: a free one, the same for all addresses)."""
    loop = asyncio.get_running_loop()
    connections = _Connections()

    def factory() -> _HTTPProtocol:
        return _HTTPProtocol(handler, connections, max_body_size)

    server = await loop.create_server(factory, host=host, port=port, ssl=ssl_context, reuse_address=True)
    ports = {int(sock.getsockname()[1]) for sock in server.sockets}
    if port == 0 and len(ports) > 1:  # e.g. "localhost" as both ::1 and 127.0.0.1: one port for all
        chosen = int(server.sockets[0].getsockname()[1])
        server.close()
        await server.wait_closed()
        server = await loop.create_server(factory, host=host, port=chosen, ssl=ssl_context,
                                          reuse_address=True)
    actual_port = int(server.sockets[0].getsockname()[1])
    return server, connections, actual_port


async def stop_server(server: asyncio.Server, connections: _Connections) -> None:
    server.close()
    for protocol in list(connections.protocols):
        protocol.close()
    await server.wait_closed()
