"""
A test's user of any Kubernetes API server: the emulator, the test control plane, or a cluster.

:class:`Cluster` makes plain HTTP requests (blocking, from the standard library) with the credentials
of a kubeconfig, as ``kubectl`` would, so that a test arranges and inspects its objects the same way
on every kind of server, without a client library and without the emulator's internals.
:class:`AsyncCluster` is its twin for async tests (over aiohttp), e.g. with an operator running
in the test's own event loop (``kopf.operator()``), which blocking requests would stall.
:func:`eventually` and :func:`eventually_async` repeat a check until it passes, for the effects
that an operator makes in the background.
"""
import asyncio
import base64
import inspect
import json
import os
import pathlib
import ssl
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, overload

from kopf._clients.logins.kubeconfig import connection_info_from_kubeconfig, load_kubeconfig
from kopf._cogs.helpers import tls
from kopf._cogs.structs.credentials import ConnectionInfo

if TYPE_CHECKING:
    import aiohttp

_T = TypeVar('_T')

DEFAULT_TIMEOUT = 10.0  # seconds: of one request, and of waiting in eventually()
CRDS = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions'
NAMESPACES = '/api/v1/namespaces'


class Answer:
    """What a user sees of an API request: the HTTP code, the decoded body, the ``Warning`` headers' texts."""

    def __init__(self, status: int, body: Any, warnings: list[str]) -> None:
        self.status = status
        self.body = body
        self.warnings = warnings

    def __repr__(self) -> str:
        return f'<Answer {self.status}: {self.body!r}>'

    @property
    def reason(self) -> str:
        return str(self.body.get('reason', '')) if isinstance(self.body, dict) else ''

    @property
    def message(self) -> str:
        """The message of a ``Status`` (e.g. of an error, or of an admission webhook's denial)."""
        return str(self.body.get('message', '')) if isinstance(self.body, dict) else str(self.body or '')


class ApiError(Exception):
    """An API request answered with an HTTP error: its code, the ``Status`` (if any), its message."""

    def __init__(
            self, method: str, path: str, status: int, body: Any, warnings: list[str] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.warnings = warnings or []
        self.reason = body.get('reason', '') if isinstance(body, dict) else ''
        self.message = body.get('message', '') if isinstance(body, dict) else str(body or '')
        super().__init__(f'{method} {path} -> {status}: {self.message or self.reason or "(no message)"}')


class _User:
    """What both users share: the server and the credentials of a kubeconfig, the requests' encoding."""

    def __init__(
            self,
            kubeconfig: str | os.PathLike[str],
            *,
            context: str | None = None,
            timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.kubeconfig_path = os.fspath(kubeconfig)
        self.timeout = timeout
        merged = load_kubeconfig([pathlib.Path(self.kubeconfig_path)])
        info = connection_info_from_kubeconfig(merged, context_name=context)
        self.url = info.server.rstrip('/')
        self._headers = _auth_headers(info)
        self._ssl = _ssl_context(info) if self.url.startswith('https:') else None

    @property
    def auth_headers(self) -> dict[str, str]:
        """The ``Authorization`` header of the kubeconfig's user, if any: for raw clients of the tests."""
        return dict(self._headers)

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context (the CA, the client certificate) for ``https://`` servers; ``None`` for ``http://``."""
        return self._ssl

    def _url(self, path: str, params: Mapping[str, str] | None) -> str:
        return self.url + path + (f'?{urllib.parse.urlencode(params)}' if params else '')

    def _encode(self, body: Any, content_type: str) -> tuple[bytes | None, dict[str, str]]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self._headers, 'Accept': 'application/json'}
        if data is not None:
            headers['Content-Type'] = content_type
        return data, headers


class Cluster(_User):
    """
    A user of an API server, with the credentials of a kubeconfig (its current context by default).

    The paths are those of the API (``/api/v1/namespaces/default/configmaps``); the bodies are
    decoded JSON. Errors raise :class:`ApiError`, except a missing object in :meth:`get` and
    :meth:`delete`, which is ``None``; :meth:`send` returns any answer as it is, errors included.
    """

    def send(
            self,
            method: str,
            path: str,
            body: Any = None,
            *,
            content_type: str = 'application/json',
            params: Mapping[str, str] | None = None,
    ) -> Answer:
        """Make one request; return its answer (the HTTP errors too, e.g. the admission's denials)."""
        data, headers = self._encode(body, content_type)
        request = urllib.request.Request(self._url(path, params), method=method, headers=headers, data=data)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._ssl) as response:
                return _answer(response.status, response.read(), response.headers.get_all('Warning') or [])
        except urllib.error.HTTPError as e:
            return _answer(e.code, e.read(), e.headers.get_all('Warning') or [])

    def request(
            self,
            method: str,
            path: str,
            body: Any = None,
            *,
            content_type: str = 'application/json',
            params: Mapping[str, str] | None = None,
    ) -> Any:
        """Make one request; return its decoded JSON body (``None`` if empty); raise on errors."""
        return _checked(method, path, self.send(method, path, body, content_type=content_type, params=params))

    def get(self, path: str) -> Any:
        """The object (or the list) at the path; ``None`` if there is none."""
        try:
            return self.request('GET', path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def items(self, path: str, **params: str) -> list[dict[str, Any]]:
        """The objects of a list (e.g. with ``labelSelector=...``), in the server's order."""
        return list((self.request('GET', path, params=params) or {}).get('items') or [])

    def create(self, path: str, body: Any) -> Any:
        return self.request('POST', path, body)

    def patch(self, path: str, patch: Any, *, content_type: str = 'application/merge-patch+json') -> Any:
        return self.request('PATCH', path, patch, content_type=content_type)

    def delete(self, path: str) -> Any:
        """Delete the object; ``None`` if there is none (already gone)."""
        try:
            return self.request('DELETE', path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def create_namespace(self, name: str) -> Any:
        return self.create(NAMESPACES, _namespace(name))

    def apply_crd(self, body: Mapping[str, Any], *, within: float = 30.0) -> Any:
        """
        Create a CRD unless it exists (e.g. from another test of a shared server); wait until it serves.

        A real server marks a new CRD as established first, and then answers the lists of its objects
        with "429 storage is (re)initializing" for a moment; this waits for both (the emulator has none).
        """
        try:
            self.create(CRDS, body)
        except ApiError as e:
            if e.status != 409:
                raise
        name, objects = _crd_paths(body)

        def served() -> Any:
            crd = self.get(f'{CRDS}/{name}') or {}
            _assert_established(name, crd)
            _assert_served(name, objects, self.send('GET', objects, params={'limit': '1'}))
            return crd

        return eventually(served, within=within)


class AsyncCluster(_User):
    """
    The async twin of :class:`Cluster`, over aiohttp: the same methods, to be awaited.

    Use it as an async context manager (or :meth:`close` it): its connections are kept open
    between the requests.
    """

    _session: 'aiohttp.ClientSession | None' = None

    async def __aenter__(self) -> 'AsyncCluster':
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(
            self,
            method: str,
            path: str,
            body: Any = None,
            *,
            content_type: str = 'application/json',
            params: Mapping[str, str] | None = None,
    ) -> Answer:
        """Make one request; return its answer (the HTTP errors too, e.g. the admission's denials)."""
        import aiohttp  # only for the async tests: the sync ones need not pay for importing it

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        data, headers = self._encode(body, content_type)
        async with self._session.request(method, self._url(path, params), data=data, headers=headers,
                                         ssl=self._ssl if self._ssl is not None else True) as response:
            return _answer(response.status, await response.read(), response.headers.getall('Warning', []))

    async def request(
            self,
            method: str,
            path: str,
            body: Any = None,
            *,
            content_type: str = 'application/json',
            params: Mapping[str, str] | None = None,
    ) -> Any:
        """Make one request; return its decoded JSON body (``None`` if empty); raise on errors."""
        answer = await self.send(method, path, body, content_type=content_type, params=params)
        return _checked(method, path, answer)

    async def get(self, path: str) -> Any:
        """The object (or the list) at the path; ``None`` if there is none."""
        try:
            return await self.request('GET', path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def items(self, path: str, **params: str) -> list[dict[str, Any]]:
        """The objects of a list (e.g. with ``labelSelector=...``), in the server's order."""
        return list((await self.request('GET', path, params=params) or {}).get('items') or [])

    async def create(self, path: str, body: Any) -> Any:
        return await self.request('POST', path, body)

    async def patch(
            self, path: str, patch: Any, *, content_type: str = 'application/merge-patch+json',
    ) -> Any:
        return await self.request('PATCH', path, patch, content_type=content_type)

    async def delete(self, path: str) -> Any:
        """Delete the object; ``None`` if there is none (already gone)."""
        try:
            return await self.request('DELETE', path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def create_namespace(self, name: str) -> Any:
        return await self.create(NAMESPACES, _namespace(name))

    async def apply_crd(self, body: Mapping[str, Any], *, within: float = 30.0) -> Any:
        """The same as :meth:`Cluster.apply_crd`: created unless it exists; waited for until it serves."""
        try:
            await self.create(CRDS, body)
        except ApiError as e:
            if e.status != 409:
                raise
        name, objects = _crd_paths(body)

        async def served() -> Any:
            crd = await self.get(f'{CRDS}/{name}') or {}
            _assert_established(name, crd)
            _assert_served(name, objects, await self.send('GET', objects, params={'limit': '1'}))
            return crd

        return await eventually_async(served, within=within)


def eventually(
        check: Callable[[], _T],
        *,
        within: float = DEFAULT_TIMEOUT,
        interval: float = 0.02,
        message: str = '',
) -> _T:
    """
    Repeat a check until it passes; return what it returns then.

    A check passes when it raises no ``AssertionError`` and returns anything but ``False``, so it can be
    an assertion (``assert ...``; it may return what it has found) or a condition (``lambda: x == y``).
    A condition must return a bool: ``None``, ``[]`` or ``0`` pass as the results of an assertion
    (say ``is not None``, ``bool(...)``, ``len(...) > 0``).

    If it never passes in time, its last ``AssertionError`` is raised (for a condition: one with the
    ``message``), so the test fails with what was still missing. Other exceptions are raised at once.
    """
    deadline = time.monotonic() + within
    while True:
        try:
            result = check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        else:
            if result is not False:
                return result
            if time.monotonic() > deadline:
                raise _unmet(within, message)
        time.sleep(interval)


@overload
async def eventually_async(
        check: Callable[[], Awaitable[_T]], *, within: float = ..., interval: float = ..., message: str = ...,
) -> _T: ...


@overload
async def eventually_async(
        check: Callable[[], _T], *, within: float = ..., interval: float = ..., message: str = ...,
) -> _T: ...


async def eventually_async(
        check: Callable[[], Any],
        *,
        within: float = DEFAULT_TIMEOUT,
        interval: float = 0.02,
        message: str = '',
) -> Any:
    """
    The same as :func:`eventually` for async tests: it waits without blocking the event loop.

    The check runs in the loop, and what it returns is awaited if it is awaitable: so it can be
    an async function too (e.g. with :class:`AsyncCluster`'s requests). A blocking check (e.g. with
    :class:`Cluster`'s requests) would stall the loop meanwhile: give it to a thread,
    ``lambda: asyncio.to_thread(check)``.
    """
    deadline = time.monotonic() + within
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        else:
            if result is not False:
                return result
            if time.monotonic() > deadline:
                raise _unmet(within, message)
        await asyncio.sleep(interval)


def _unmet(within: float, message: str) -> AssertionError:
    suffix = f' {message}' if message else ''
    return AssertionError(f'The condition has not been met in {within}s.{suffix}')


def _answer(status: int, text: bytes, warnings: list[str]) -> Answer:
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
        if status < 400:
            raise
        body = text.decode(errors='replace')
    # The Warning headers are "299 - \"text\"" (RFC 7234); the users see the texts.
    return Answer(status, body, [value.split(' ', 2)[-1].strip('"') for value in warnings])


def _checked(method: str, path: str, answer: Answer) -> Any:
    if answer.status >= 400:
        raise ApiError(method, path, answer.status, answer.body, answer.warnings)
    return answer.body


def _namespace(name: str) -> dict[str, Any]:
    return {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}}


def _crd_paths(body: Mapping[str, Any]) -> tuple[str, str]:
    """The CRD's name, and the path of its objects (of the storage version)."""
    spec = body['spec']
    version = next((v['name'] for v in spec['versions'] if v.get('storage')), spec['versions'][0]['name'])
    return body['metadata']['name'], f'/apis/{spec["group"]}/{version}/{spec["names"]["plural"]}'


def _assert_established(name: str, crd: Mapping[str, Any]) -> None:
    conditions = (crd.get('status') or {}).get('conditions') or []
    assert any(c.get('type') == 'Established' and c.get('status') == 'True' for c in conditions), \
        f'The CRD {name} is not established.'


def _assert_served(name: str, path: str, answer: Answer) -> None:
    if answer.status in (404, 429, 503):
        error = ApiError('GET', path, answer.status, answer.body)
        raise AssertionError(f'The objects of the CRD {name} are not served yet: {error}')
    _checked('GET', path, answer)


def _auth_headers(info: ConnectionInfo) -> dict[str, str]:
    if info.token:
        return {'Authorization': f'{info.scheme or "Bearer"} {info.token}'}
    if info.username is not None and info.password is not None:
        pair = base64.b64encode(f'{info.username}:{info.password}'.encode()).decode()
        return {'Authorization': f'Basic {pair}'}
    return {}


def _ssl_context(info: ConnectionInfo) -> ssl.SSLContext:
    context = tls.verify_as_kubernetes(ssl.create_default_context(
        cafile=info.ca_path,
        cadata=info.ca_data.decode() if info.ca_data else None,
    ))
    if info.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if info.certificate_path or info.certificate_data:
        with tempfile.TemporaryDirectory() as directory:  # the ssl module loads client keys from files only
            cert = info.certificate_path or _write(directory, 'cert.pem', info.certificate_data)
            key = info.private_key_path or _write(directory, 'key.pem', info.private_key_data)
            if cert is None:
                raise ValueError('The kubeconfig has a client key but no client certificate: add one.')
            context.load_cert_chain(cert, key)
    return context


def _write(directory: str, name: str, data: bytes | None) -> str | None:
    if data is None:
        return None
    path = os.path.join(directory, name)
    with open(path, 'wb') as f:
        os.chmod(path, 0o600)
        f.write(data)
    return path
