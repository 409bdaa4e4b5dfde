"""
aiohttp for what the lean client (:mod:`kopf._clients.connections`) does not do: the proxies.

A proxy comes either explicitly with the credentials (``proxy-url`` in a kubeconfig), or from the
environment (``settings.networking.trust_env`` or the credentials' ``trust_env``: the ``*_PROXY``
variables, ``.netrc``). Then all requests of those credentials go through an aiohttp session.
This module is imported only then: aiohttp costs megabytes of memory and a noticeable part of the start-up
(the figures: benchmarks/README.md).

Its results are the lean client's: :class:`~kopf._clients.connections.Response` for the regular
requests, a stream with the same reading methods, and the same exceptions (aiohttp's own are
translated at this boundary), so that nothing above the client knows which one has served.
"""
import ssl
from collections.abc import Mapping

import aiohttp
import yarl  # aiohttp's own URLs: given to it pre-parsed

from kopf._clients.connections import (
    CannotConnect,
    Disconnected,
    MalformedResponse,
    NetworkError,
    Response,
    Timeouts,
)

__all__ = ['FallbackSession', 'FallbackStream', 'translate']


def translate(error: BaseException) -> BaseException:
    """The lean client's exception for an aiohttp's one (others as they are)."""
    if isinstance(error, aiohttp.ClientConnectorError):
        key = getattr(error, '_conn_key', None)
        scheme = 'https' if getattr(key, 'is_ssl', False) else 'http'
        host = f'[{error.host}]' if ':' in error.host else error.host
        os_error = error.os_error
        if isinstance(error, aiohttp.ClientConnectorCertificateError):
            certificate_error = error.certificate_error
            os_error = certificate_error if isinstance(certificate_error, OSError) else os_error
        return CannotConnect(f'{scheme}://{host}:{error.port}', os_error)
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return Disconnected()
    if isinstance(error, aiohttp.ServerTimeoutError):  # a subclass of TimeoutError
        return TimeoutError(str(error))
    if isinstance(error, aiohttp.ClientPayloadError):
        return MalformedResponse(str(error))
    if isinstance(error, aiohttp.ClientError):
        return NetworkError(str(error) or repr(error))
    return error


def _timeout(timeouts: Timeouts | None) -> aiohttp.ClientTimeout:
    if timeouts is None:
        return aiohttp.ClientTimeout(total=None)
    return aiohttp.ClientTimeout(total=timeouts.total, sock_connect=timeouts.connect)


class FallbackStream:
    """A streamed aiohttp response with the lean client's reading methods and errors."""

    def __init__(self, response: aiohttp.ClientResponse, *, method: str, url: str) -> None:
        super().__init__()
        self._response = response
        self.status = response.status
        self.headers: Mapping[str, str] = {key.lower(): value for key, value in response.headers.items()}
        self.method = method
        self.url = url

    async def readany(self) -> bytes:
        try:
            return await self._response.content.readany()
        except aiohttp.ClientError as e:
            raise translate(e) from e

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except aiohttp.ClientError as e:
            raise translate(e) from e

    def close(self) -> None:
        self._response.close()


class FallbackSession:
    """An aiohttp session for one credential (see the module's description)."""

    def __init__(
            self,
            server: str,
            *,
            ssl_context: ssl.SSLContext | None = None,
            headers: Mapping[str, str] | None = None,
            trust_env: bool = False,
            proxy_url: str | None = None,
            session: aiohttp.ClientSession | None = None,
    ) -> None:
        """Make an own session for the credential, or use the given one (the caller's: not closed here)."""
        super().__init__()
        self._server = server
        self._encoded_server = str(yarl.URL(server))  # normalised & encoded once, not per request
        self._proxy_url = proxy_url
        self._owned = session is None
        if session is None:
            connector = aiohttp.TCPConnector(limit=0, ssl=ssl_context if ssl_context is not None else True)
            session = aiohttp.ClientSession(connector=connector, headers=headers, trust_env=trust_env,
                                            timeout=aiohttp.ClientTimeout(total=None))
        self._session = session

    def _url(self, path: str) -> yarl.URL | str:
        # The paths on the server are quoted already (see ``Resource.get_url``); other URLs are as given.
        if path.startswith('/'):
            return yarl.URL(self._encoded_server + path, encoded=True)
        return path

    async def request(self, method: str, path: str, *, data: bytes | None, headers: Mapping[str, str] | None,
                      params: Mapping[str, str] | None, timeouts: Timeouts | None) -> Response:
        url = self._url(path)
        try:
            async with self._session.request(method, url, data=data, headers=headers, params=params,
                                             timeout=_timeout(timeouts), proxy=self._proxy_url) as response:
                body = await response.read()
                headers_ = {key.lower(): value for key, value in response.headers.items()}
                return Response(response.status, headers_, body, method, str(response.url.with_query(None)))
        except aiohttp.ClientError as e:
            raise translate(e) from e

    async def stream(self, method: str, path: str, *, headers: Mapping[str, str] | None,
                     params: Mapping[str, str] | None, timeouts: Timeouts | None) -> FallbackStream:
        url = self._url(path)
        try:
            response = await self._session.request(method, url, headers=headers, params=params,
                                                   timeout=_timeout(timeouts), proxy=self._proxy_url)
        except aiohttp.ClientError as e:
            raise translate(e) from e
        return FallbackStream(response, method=method, url=str(response.url.with_query(None)))

    async def close(self) -> None:
        if self._owned:
            await self._session.close()
