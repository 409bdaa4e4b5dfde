"""
A test's user of any Kubernetes API server: the emulator, the test control plane, or a cluster.

:class:`Cluster` makes plain HTTP requests (blocking, from the standard library) with the credentials
of a kubeconfig, as ``kubectl`` would, so that a test arranges and inspects its objects the same way
on every kind of server, without a client library and without the emulator's internals.
:func:`eventually` and :func:`eventually_async` repeat a check until it passes, for the effects
that an operator makes in the background.
"""
import asyncio
import base64
import json
import os
import pathlib
import ssl
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kopf._clients.logins.kubeconfig import connection_info_from_kubeconfig, load_kubeconfig
from kopf._cogs.structs.credentials import ConnectionInfo

_T = TypeVar('_T')

DEFAULT_TIMEOUT = 10.0  # seconds: of one request, and of waiting in eventually()
CRDS = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions'
NAMESPACES = '/api/v1/namespaces'


class ApiError(Exception):
    """An API request answered with an HTTP error: its code, the ``Status`` (if any), its message."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        self.reason = body.get('reason', '') if isinstance(body, dict) else ''
        self.message = body.get('message', '') if isinstance(body, dict) else str(body or '')
        super().__init__(f'{method} {path} -> {status}: {self.message or self.reason or "(no message)"}')


class Cluster:
    """
    A user of an API server, with the credentials of a kubeconfig (its current context by default).

    The paths are those of the API (``/api/v1/namespaces/default/configmaps``); the bodies are
    decoded JSON. Errors raise :class:`ApiError`, except a missing object in :meth:`get` and
    :meth:`delete`, which is ``None``.
    """

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
        url = self.url + path + (f'?{urllib.parse.urlencode(params)}' if params else '')
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self._headers, 'Accept': 'application/json'}
        if data is not None:
            headers['Content-Type'] = content_type
        request = urllib.request.Request(url, method=method, headers=headers, data=data)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._ssl) as response:
                text = response.read()
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                error_body: Any = json.loads(text) if text else None
            except ValueError:
                error_body = text.decode(errors='replace')
            raise ApiError(method, path, e.code, error_body) from None
        return json.loads(text) if text else None

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
        return self.create(NAMESPACES, {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}})

    def apply_crd(self, body: Mapping[str, Any], *, within: float = 30.0) -> Any:
        """
        Create a CRD unless it exists (e.g. from another test of a shared server); wait until it serves.

        A real server marks a new CRD as established first, and then answers the lists of its objects
        with "429 storage is (re)initializing" for a moment; this waits for both (the emulator has none).
        """
        name = body['metadata']['name']
        spec = body['spec']
        version = next((v['name'] for v in spec['versions'] if v.get('storage')), spec['versions'][0]['name'])
        objects = f'/apis/{spec["group"]}/{version}/{spec["names"]["plural"]}'
        try:
            self.create(CRDS, body)
        except ApiError as e:
            if e.status != 409:
                raise

        def served() -> Any:
            crd = self.get(f'{CRDS}/{name}') or {}
            conditions = (crd.get('status') or {}).get('conditions') or []
            assert any(c.get('type') == 'Established' and c.get('status') == 'True' for c in conditions), \
                f'The CRD {name} is not established.'
            try:
                self.request('GET', objects, params={'limit': '1'})
            except ApiError as e:
                if e.status in (404, 429, 503):
                    raise AssertionError(f'The objects of the CRD {name} are not served yet: {e}') from None
                raise
            return crd

        return eventually(served, within=within)


def eventually(check: Callable[[], _T], *, within: float = DEFAULT_TIMEOUT, interval: float = 0.02) -> _T:
    """
    Repeat a check until it passes: return what it returns once it raises no ``AssertionError``.

    If it never passes in time, its last ``AssertionError`` is raised, so the test fails with
    what was still missing. Other exceptions are raised at once.
    """
    deadline = time.monotonic() + within
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(interval)


async def eventually_async(
        check: Callable[[], _T], *, within: float = DEFAULT_TIMEOUT, interval: float = 0.02,
) -> _T:
    """The same as :func:`eventually` in a thread, so that the event loop (e.g. an operator's) goes on."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await asyncio.to_thread(check)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(interval)


def _auth_headers(info: ConnectionInfo) -> dict[str, str]:
    if info.token:
        return {'Authorization': f'{info.scheme or "Bearer"} {info.token}'}
    if info.username is not None and info.password is not None:
        pair = base64.b64encode(f'{info.username}:{info.password}'.encode()).decode()
        return {'Authorization': f'Basic {pair}'}
    return {}


def _ssl_context(info: ConnectionInfo) -> ssl.SSLContext:
    context = ssl.create_default_context(
        cafile=info.ca_path,
        cadata=info.ca_data.decode() if info.ca_data else None,
    )
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
