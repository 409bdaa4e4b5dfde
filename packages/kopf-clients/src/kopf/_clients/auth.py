"""
Turning credentials (:class:`ConnectionInfo`) into ready-to-use HTTP transports.

One :class:`APIContext` exists per credential in the vault (see ``Vault.extended``): it holds
an HTTP transport configured for that credential — the TLS context with the server's CA
and the client's certificate, the ``Authorization`` header, the proxy — and is reused by all
requests made with that credential. It is closed when the credential is dropped.

Secrets given as data (client certificates & private keys) must be loaded from files by the TLS
library; they are written to a private temporary directory only for the time of loading,
and deleted right after.
"""
import asyncio
import base64
import collections
import contextlib
import os
import ssl
import tempfile
from collections.abc import Iterator

from kopf._clients.connections import ConnectionPool, HTTPTransport
from kopf._cogs.configs.networking import MAX_CONCURRENT_REQUESTS
from kopf._cogs.helpers import metering, tls
from kopf._cogs.structs.credentials import AiohttpSession, ConnectionInfo, KubeContext

DEFAULT_USER_AGENT = 'kopf'


@contextlib.contextmanager
def _materialized(
        path: str | None,
        data: bytes | None,
        *,
        name: str,
        tmpdir: list[str],
) -> Iterator[str | None]:
    """Provide a file path for a secret, writing its data to a private temporary file if needed."""
    if path is not None:
        yield os.path.expanduser(path)
    elif data is not None:
        if not tmpdir:
            tmpdir.append(tempfile.mkdtemp(prefix='kopf-credentials-'))  # mode 0700: readable by us only.
        filepath = os.path.join(tmpdir[0], name)
        fd = os.open(filepath, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, 'wb') as f:
                f.write(data)
            yield filepath
        finally:
            with contextlib.suppress(OSError):
                os.unlink(filepath)
    else:
        yield None


def make_ssl_context(info: ConnectionInfo) -> ssl.SSLContext:
    """
    Build a TLS context for the credentials: the trusted CA, the client certificate, the insecure flag.

    Without a CA, the system's default trust store is used.
    """
    cadata: str | bytes | None = None
    if info.ca_data is not None:
        # PEM is text; anything else is presumably DER, which the TLS library accepts as bytes.
        stripped = info.ca_data.lstrip()
        cadata = stripped.decode('ascii') if stripped.startswith(b'-----') else info.ca_data
    cafile = os.path.expanduser(info.ca_path) if info.ca_path is not None else None
    context = tls.verify_as_kubernetes(ssl.create_default_context(cafile=cafile, cadata=cadata))

    if info.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE

    tmpdir: list[str] = []
    try:
        with (
            _materialized(info.certificate_path, info.certificate_data, name='client.crt', tmpdir=tmpdir)
            as certfile,
            _materialized(info.private_key_path, info.private_key_data, name='client.key', tmpdir=tmpdir)
            as keyfile,
        ):
            if certfile is not None:
                context.load_cert_chain(certfile=certfile, keyfile=keyfile)
    finally:
        if tmpdir:
            with contextlib.suppress(OSError):
                os.rmdir(tmpdir[0])
    return context


def make_headers(info: ConnectionInfo, *, user_agent: str = DEFAULT_USER_AGENT) -> dict[str, str]:
    """The default headers of all requests with these credentials: authorization & identification."""
    headers = {'User-Agent': user_agent}
    if info.token is not None:
        headers['Authorization'] = f'{info.scheme or "Bearer"} {info.token}'
    elif info.username is not None or info.password is not None:
        userpass = f'{info.username or ""}:{info.password or ""}'.encode()
        headers['Authorization'] = f'Basic {base64.b64encode(userpass).decode("ascii")}'
    elif info.scheme is not None:
        headers['Authorization'] = info.scheme  # a scheme with no params, as RFC 7235 allows.
    return headers


class RequestSlots:
    """
    A semaphore for the regular requests, cheaper than :class:`asyncio.Semaphore` when not saturated.

    Every request takes a slot, so this is on the path of every request: a free slot is taken with
    no awaiting at all (:meth:`take_nowait`); only when all are taken, :meth:`take` waits in line
    (first come, first served), and a released slot is handed over to the first waiter directly.
    """

    __slots__ = ('__weakref__', '_count', '_free', '_waiters')

    def __init__(self, count: int) -> None:
        super().__init__()
        self._count = count
        self._free = count
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        metering.track_request_slots(self)  # for the gauges of the requests in flight, if they are ever on

    @property
    def free(self) -> int:
        return self._free

    @property
    def taken(self) -> int:
        """How many requests hold a slot now (in flight, or being sent)."""
        return self._count - self._free

    @property
    def waiting(self) -> int:
        """How many requests wait for a slot now."""
        return len(self._waiters)

    def take_nowait(self) -> bool:
        """Take a free slot if there is one and nobody waits in line; True if taken."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        """Take a slot, waiting in line until one is free."""
        if self.take_nowait():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed over to us, but we are leaving: to the next one
            elif waiter in self._waiters:  # not if a release has already skipped & dropped it
                self._waiters.remove(waiter)
            raise

    def give(self) -> None:
        """Release a slot: to the first waiter in line, if any."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class APIContext:
    """
    Everything needed to make requests with one credential: the server URL and an HTTP transport.

    The transport is the lean client's pool of keep-alive connections (:mod:`.connections`), or an
    aiohttp session (:mod:`.fallback`, imported only then) when a proxy is involved: explicitly in
    the credentials, or from the environment (``trust_env``). It is shared by all requests with
    the same credential; the regular requests take a place in ``slots`` (``max_concurrent_requests``)
    for the time of the request, so they reuse the pooled connections instead of opening new ones
    in bursts. Timeouts are given per request.
    """

    server: str
    default_namespace: str | None
    proxy_url: str | None
    transport: HTTPTransport
    slots: RequestSlots

    def __init__(
            self,
            info: KubeContext,
            *,
            trust_env: bool = False,
            user_agent: str = DEFAULT_USER_AGENT,
            max_concurrent_requests: int = MAX_CONCURRENT_REQUESTS,
    ) -> None:
        super().__init__()
        self.server = info.server.rstrip('/')
        self.default_namespace = info.default_namespace
        self.slots = RequestSlots(max_concurrent_requests)
        if isinstance(info, AiohttpSession):  # a custom aiohttp session: used as it is
            from kopf._clients import fallback  # aiohttp: only when needed (memory & start-up)
            self.proxy_url = None
            self.transport = fallback.FallbackSession(self.server, session=info.aiohttp_session)
            return
        if not isinstance(info, ConnectionInfo):
            raise TypeError(f'Credentials must be ConnectionInfo or AiohttpSession: {type(info).__name__}.')
        self.proxy_url = info.proxy_url

        ssl_context: ssl.SSLContext | None = None
        if self.server.startswith('https:'):
            ssl_context = make_ssl_context(info)
        headers = make_headers(info, user_agent=user_agent)
        trusting_env = bool(trust_env or info.trust_env)

        transport: HTTPTransport | None = None
        if self.proxy_url is None and not trusting_env:
            with contextlib.suppress(ValueError):  # e.g. not a plain http(s) URL: aiohttp will tell
                transport = ConnectionPool(self.server, ssl_context=ssl_context, headers=headers)
        if transport is None:
            from kopf._clients import fallback  # aiohttp: only when needed (memory & start-up)
            transport = fallback.FallbackSession(self.server, ssl_context=ssl_context, headers=headers,
                                                 trust_env=trusting_env, proxy_url=self.proxy_url)
        self.transport = transport

    def __repr__(self) -> str:
        return f'<{type(self).__name__} server={self.server!r}>'

    async def close(self) -> None:
        """Close the HTTP transport and its connections."""
        await self.transport.close()
