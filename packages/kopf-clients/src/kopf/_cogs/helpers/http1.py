"""
The HTTP/1.1 parsing of the framework's own HTTP: the API client's responses, the webhook server's requests.

Both sides parse incrementally, as the bytes come, and only parse: the connections, the timeouts,
the answers are their users' business (:mod:`kopf._clients.connections` and :mod:`kopf._webhooks.http`).
The responses are fed to their parser as they come, the requests are taken out of the bytes that came;
what is not HTTP/1.x or exceeds the limits raises :class:`MalformedMessage`; no callbacks into the users.

The responses (:class:`ResponseParser`) are parsed by llhttp (Node.js's HTTP/1.1 parser, in C) via
``httptools`` (the parser under uvicorn): the de-facto grammar of HTTP/1.1 as servers speak it, with
the chunked encoding (sizes, extensions, trailers, a chunk streamed before its end), the framing's
corner cases (``Content-Length`` vs ``Transfer-Encoding``, duplicates, 1xx and bodiless responses,
keep-alive by version and ``Connection``) and the smuggling defences, maintained against the RFCs.
It also costs less than a parser in Python: the framing is done in C, and only the head's fields and
the body's pieces come up to Python (per request, and more so per watch-event: ``benchmarks/README.md``).

The requests (:class:`RequestParser`) are parsed here, in Python: the webhook server takes only what
the admission reviews need (``Content-Length`` bodies, no chunks, no upgrades), which a few string
operations per head do for less CPU than llhttp's callbacks per header field via httptools (measured
in ``benchmarks/README.md``: ``http_gauge.py``).
"""
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import httptools

__all__ = ['Fields', 'MalformedMessage', 'RequestParser', 'ResponseParser']


class MalformedMessage(ValueError):
    """Not valid HTTP/1.x, or beyond a limit; ``status`` is what a server answers to such a request."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class _Stop(Exception):
    """Raised in a callback to stop the C parser in the middle of the data (it is then replaced)."""


class ResponseParser:
    """
    The responses of one client connection, one after another (keep-alive; no pipelining).

    Before each request, :meth:`expect` resets it; then the bytes are fed as they come. After a
    :meth:`feed`, ``head`` says whether the (final) head has come: the informational (1xx) responses
    are skipped. Then ``status``, ``headers`` (names in lower case; repeated ones joined by ", "),
    and ``keep_alive`` are set. ``body`` holds the body's pieces that came and were not taken yet
    (:meth:`take_body`), so that a streamed body can be handed over as it comes. ``complete`` is set
    at the body's end; ``extra``, if more bytes came after it (the connection is out of sync).
    A body read until the connection closes ends with :meth:`eof`.
    """

    __slots__ = ('_fed', '_fields', '_heads', '_informational', '_no_body', '_parser', '_stopped',
                 'body', 'complete', 'extra', 'head', 'headers', 'keep_alive', 'on_body', 'status',
                 'until_close')

    def __init__(self) -> None:
        super().__init__()
        self.body: list[bytes] = []
        self.on_body = self.body.append  # a callback of llhttp's with no frame of Python (a watch-event each)
        self._parser = httptools.HttpResponseParser(self)
        self._stopped = False
        self.expect()

    def expect(self, *, no_body: bool = False) -> None:
        """Get ready for the next response; ``no_body`` if it has none whatever it says (for a ``HEAD``)."""
        if self._stopped:
            self._parser = httptools.HttpResponseParser(self)
            self._stopped = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = False
        self.until_close = False
        self.head = False
        self.complete = False
        self.extra = False
        self.body.clear()
        self._fields: dict[str, str] = {}
        self._informational = False
        self._no_body = no_body
        self._fed = bytearray() if no_body else None  # to find where its head ends: llhttp does not say
        self._heads = 0

    def feed(self, data: bytes) -> None:
        if self.complete or self._stopped:
            self.extra = True
            return
        if self._fed is not None:
            self._fed += data
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # never asked for; treated as an error, not as a new protocol
            self._stopped = True
            raise MalformedMessage('an unexpected switch of the protocol (101 or Upgrade)') from None
        except httptools.HttpParserError as e:
            self._stopped = True  # the C parser is in its error state: it is replaced for the next response
            self._after_stop(e)

    def _after_stop(self, error: httptools.HttpParserError) -> None:
        """The parser has stopped: by an error in the response, or by us after the response."""
        if not self.complete:
            raise MalformedMessage(str(error)) from None
        if self._fed is not None:  # stopped after a bodiless head: did anything come after it?
            end = 0
            for _ in range(self._heads):
                end = self._fed.find(b'\r\n\r\n', end) + 4
            self.extra = len(self._fed) > end
            self._fed = None
        else:  # the next response has begun, or bytes came after a "Connection: close"
            self.extra = True

    def eof(self) -> bool:
        """The connection has closed: is the response complete by this? (A body until the close.)"""
        if self.head and self.until_close and not self.complete:
            self.complete = True
        return self.complete

    def take_body(self) -> bytes:
        """The body's pieces that came since the last taking, as one piece."""
        pieces = self.body
        if not pieces:
            return b''
        data = pieces[0] if len(pieces) == 1 else b''.join(pieces)
        pieces.clear()
        return data

    # The callbacks of llhttp (via httptools).

    def on_message_begin(self) -> None:
        if self.complete:
            raise _Stop()  # the next response has begun with no request: out of sync
        self._fields = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        # The names are tokens (ASCII: llhttp refuses others); llhttp strips the values' leading spaces only.
        key = name.decode().lower()
        text = value.decode('latin-1').rstrip(' \t')
        fields = self._fields
        fields[key] = f'{fields[key]}, {text}' if key in fields else text

    def on_headers_complete(self) -> None:
        self._heads += 1
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            self._informational = True  # its (empty) message completes next: skipped; the real one follows
            return
        self._informational = False
        self.status = status
        self.headers = headers = self._fields
        self._fields = {}  # the trailers, if any, go there and are not used
        self.head = True
        if self._no_body:
            connection = headers.get('connection', '').lower()
            if self._parser.get_http_version() == '1.1':
                self.keep_alive = 'close' not in connection
            else:
                self.keep_alive = 'keep-alive' in connection
            self.complete = True
            raise _Stop()  # llhttp would wait for the body that the head announces
        self.keep_alive = self._parser.should_keep_alive()
        self.until_close = (status != 204 and status != 304 and 'content-length' not in headers
                            and 'chunked' not in headers.get('transfer-encoding', '').lower())

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
        else:
            self.complete = True


class Fields(Protocol):
    """Where a request's header fields go, e.g. multidict's ``CIMultiDict`` (a lookup ignores the case)."""

    def add(self, key: str, value: str, /) -> None: ...

    def get(self, key: str, default: str, /) -> str: ...


FieldsT = TypeVar('FieldsT', bound=Fields)


class RequestParser(Generic[FieldsT]):
    """
    The requests of one server connection, taken one by one from the bytes that came (pipelined ones too).

    :meth:`take` parses the next request out of its caller's buffer when it is there in full, or leaves
    the buffer as it is until more comes (the head is parsed again then: the requests that come in pieces
    are few, and so the common one costs only its parsing). What is refused (:class:`MalformedMessage`
    with the status to answer): malformed requests (400), chunked bodies (411), bodies above
    ``max_body_size`` (413), heads above ``max_head_size`` (431). After a refusal, the connection must
    be closed: the parser does not resynchronise.
    """

    __slots__ = ('_fields', '_max_body_size', '_max_head_size', 'continuing')

    def __init__(self, *, fields: Callable[[], FieldsT], max_body_size: int, max_head_size: int) -> None:
        super().__init__()
        self._fields = fields
        self._max_body_size = max_body_size
        self._max_head_size = max_head_size
        self.continuing = False

    def take(self, buffer: bytearray) -> tuple[str, str, FieldsT, bytes, bool] | None:
        """
        The next request: its method, target (path & query), header fields, body, and keep-alive.

        None if it has not come in full; then ``continuing`` says whether its head has come with
        ``Expect: 100-continue`` (so its client waits for a ``100 Continue`` before sending the body).
        """
        end = buffer.find(b'\r\n\r\n')
        if end < 0:
            if len(buffer) > self._max_head_size:
                raise MalformedMessage('The request headers are too large.', status=431)
            self.continuing = False
            return None
        lines = buffer[:end].decode('latin-1').split('\r\n')
        try:
            method, target, version = lines[0].split(' ')
        except ValueError:
            raise MalformedMessage('Malformed HTTP request line.') from None
        fields = self._fields()
        for line in lines[1:]:
            name, colon, value = line.partition(':')
            if not colon:
                raise MalformedMessage('Malformed HTTP header line.')
            fields.add(name.strip(), value.strip())
        if 'chunked' in fields.get('Transfer-Encoding', '').lower():
            raise MalformedMessage('Chunked request bodies are not supported: send the Content-Length.',
                                   status=411)
        try:
            length = int(fields.get('Content-Length', '0'))
        except ValueError:
            raise MalformedMessage('Malformed Content-Length.') from None
        if length < 0 or length > self._max_body_size:
            raise MalformedMessage(f'The request body is above the limit of {self._max_body_size} bytes.',
                                   status=413)
        total = end + 4 + length
        if len(buffer) < total:
            self.continuing = fields.get('Expect', '').lower() == '100-continue'
            return None
        body = bytes(buffer[end + 4:total])
        del buffer[:total]
        connection = fields.get('Connection', '').lower()
        keep_alive = connection != 'close' if version == 'HTTP/1.1' else connection == 'keep-alive'
        return method, target, fields, body, keep_alive
