"""
The HTTP/1.1 parsing of the framework's own HTTP: the API client's responses, the webhook server's requests.

Both sides parse incrementally, as the bytes come, with llhttp (Node.js's HTTP/1.1 parser, in C) via
``httptools`` (the parser under uvicorn): the de-facto grammar of HTTP/1.1 as browsers and servers
speak it, with the chunked encoding (sizes, extensions, trailers), the framing's corner cases
(``Content-Length`` vs ``Transfer-Encoding``, duplicates, 1xx and bodiless responses, keep-alive
by version and ``Connection``), and the request-smuggling defences, maintained against the RFCs.
It also costs less CPU than the hand-written parsers it replaces (see ``benchmarks/README.md``):
the framing is done in C, and only the head's fields and the body's pieces come up to Python.

The parsers only parse: the connections, the timeouts, the answers are their users' business
(:mod:`kopf._clients.connections` and :mod:`kopf._webhooks.http`). They are driven by ``feed()``
(which raises :class:`MalformedMessage` for what is not HTTP/1.x or exceeds the limits), and their
results are read from their attributes after it: no callbacks into the users' code.
"""
import collections

import httptools

__all__ = ['MalformedMessage', 'ParsedRequest', 'RequestParser', 'ResponseParser']


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
                 'body', 'complete', 'extra', 'head', 'headers', 'keep_alive', 'status', 'until_close')

    def __init__(self) -> None:
        super().__init__()
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
        self.body: list[bytes] = []
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
        self.body = []
        return pieces[0] if len(pieces) == 1 else b''.join(pieces)

    # The callbacks of llhttp (via httptools).

    def on_message_begin(self) -> None:
        if self.complete:
            raise _Stop()  # the next response has begun with no request: out of sync
        self._fields = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        # llhttp strips the leading spaces of the value, not the trailing ones.
        key = name.decode('latin-1').lower()
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

    def on_body(self, data: bytes) -> None:
        self.body.append(data)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
        else:
            self.complete = True


# A request as parsed: the method, the target (path & query), the header fields (names as sent),
# the body, and whether the connection stays open after the answer.
ParsedRequest = tuple[str, str, list[tuple[str, str]], bytes, bool]


class RequestParser:
    """
    The requests of one server connection: pipelined ones too, kept in order until taken.

    After a :meth:`feed`, ``requests`` holds the complete requests not taken yet. ``started`` says
    whether a request is coming in (its first byte has come, not its end); ``awaiting_body`` that its
    head has come, not all of its body (the client may wait for a ``100 Continue`` if ``continuing``).
    What is refused (:class:`MalformedMessage` with the status to answer): malformed requests (400),
    chunked bodies (411), bodies above ``max_body_size`` (413), heads above ``max_head_size`` (431).
    After a refusal, the connection must be closed: the parser does not resynchronise.
    """

    __slots__ = ('_body', '_fields', '_head_size', '_keep_alive', '_max_body_size', '_max_head_size',
                 '_method', '_parser', '_target', 'awaiting_body', 'continuing', 'requests', 'started')

    def __init__(self, *, max_body_size: int, max_head_size: int) -> None:
        super().__init__()
        self._parser = httptools.HttpRequestParser(self)
        self._max_body_size = max_body_size
        self._max_head_size = max_head_size
        self.requests: collections.deque[ParsedRequest] = collections.deque()
        self.started = False
        self.awaiting_body = False
        self.continuing = False
        self._head_size = 0
        self._target = b''
        self._method = ''
        self._keep_alive = True
        self._fields: list[tuple[str, str]] = []
        self._body: list[bytes] = []

    def feed(self, data: bytes) -> None:
        rest = data
        while rest:
            try:
                self._parser.feed_data(rest)
            except httptools.HttpParserUpgrade as e:
                # A request asking for another protocol (its body, if any, is taken as that protocol's by
                # llhttp): served as a plain one; what follows it is taken as HTTP/1.1 still.
                rest = rest[e.args[0]:]
            except httptools.HttpParserError as e:
                if isinstance(e.__context__, MalformedMessage):
                    raise e.__context__ from None
                raise MalformedMessage(f'Malformed HTTP request: {e}.') from None
            else:
                break
        if self.started and not self.awaiting_body:  # a head is still coming: it must not grow forever
            self._head_size += len(data)
            if self._head_size > self._max_head_size:
                raise MalformedMessage('The request headers are too large.', status=431)

    # The callbacks of llhttp (via httptools).

    def on_message_begin(self) -> None:
        self.started = True
        self._head_size = 0
        self._target = b''
        self._fields = []
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields.append((name.decode('latin-1'), value.decode('latin-1').rstrip(' \t')))

    def on_headers_complete(self) -> None:
        length = 0
        self.continuing = False
        for name, value in self._fields:
            lowered = name.lower()
            if lowered == 'content-length':
                length = int(value)  # validated by llhttp already: digits only, one value
            elif lowered == 'transfer-encoding' and 'chunked' in value.lower():
                raise MalformedMessage('Chunked request bodies are not supported: send the Content-Length.',
                                       status=411)
            elif lowered == 'expect' and value.lower() == '100-continue':
                self.continuing = True
        if length > self._max_body_size:
            raise MalformedMessage(f'The request body is above the limit of {self._max_body_size} bytes.',
                                   status=413)
        self._method = self._parser.get_method().decode('ascii')
        self._keep_alive = self._parser.should_keep_alive()
        self.awaiting_body = True

    def on_body(self, data: bytes) -> None:
        self._body.append(data)

    def on_message_complete(self) -> None:
        pieces = self._body
        body = b'' if not pieces else pieces[0] if len(pieces) == 1 else b''.join(pieces)
        self.requests.append((self._method, self._target.decode('latin-1'), self._fields, body,
                              self._keep_alive))
        self.started = False
        self.awaiting_body = False
        self.continuing = False
