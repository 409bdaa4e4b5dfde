"""
The admission webhook servers: local HTTPS endpoints that pass the reviews to the framework.

A server is used as ``settings.admission.server``: the operator calls it with the framework's
:class:`kopf.WebhookFn` and iterates over the client configs it yields (how the apiservers reach it).
The server listens, yields its config once it is listening, and serves until the operator exits.
A request to ``{path}/{handler_id}`` is a review addressed to that handler; ``{path}`` alone
is a review for all the handlers of the resource.

The HTTP layer is a lean HTTP/1.1 server of its own (see :mod:`kopf._webhooks.http`): the reviews are
on the path of every API request of the cluster. The answers: 200 with the review's response; 400 for
what cannot be a review for this operator (not JSON, not an ``AdmissionReview``, no ``request.uid``,
an unknown resource or webhook id); 404 for the paths outside of the server's root path.
The handlers' failures are not HTTP errors: they are denials in the response (see the admission engine).
"""
import asyncio
import base64
import contextlib
import ipaddress
import json
import logging
import os
import pathlib
import ssl
import tempfile
import urllib.parse
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any, ClassVar

import yaml

from kopf._cogs.helpers import tls
from kopf._cogs.structs.reviews import WebhookClientConfig, WebhookFn
from kopf._core.engines.admission import AdmissionReviewError
from kopf._webhooks import certificates, http

__all__ = [
    'ClusterDetector',
    'WebhookAutoServer',
    'WebhookContextManager',
    'WebhookDockerDesktopServer',
    'WebhookK3dServer',
    'WebhookMinikubeServer',
    'WebhookServer',
]

logger = logging.getLogger(__name__)

MAX_REVIEW_SIZE = 16 * 1024 * 1024  # far more than any object of the Kubernetes API (etcd's limit: 1.5 MiB)


class WebhookContextManager:
    """
    The optional async context manager of the servers & tunnels: cleans up what they have started.

    The servers & tunnels are async generators when called; exiting the context closes those
    of them that are still running (as their garbage collection would, but now and for sure).
    """

    def __init__(self) -> None:
        super().__init__()
        self._generators: set[AsyncIterator[WebhookClientConfig]] = set()

    async def __aenter__(self) -> 'WebhookContextManager':
        return self

    async def __aexit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        generators, self._generators = self._generators, set()
        for generator in generators:
            aclose = getattr(generator, 'aclose', None)
            if aclose is not None:
                await aclose()

    def _remember(self, generator: AsyncIterator[WebhookClientConfig]) -> AsyncIterator[WebhookClientConfig]:
        if not hasattr(self, '_generators'):  # subclasses that do not call super().__init__()
            self._generators = set()
        self._generators.add(generator)
        return generator


class WebhookServer(WebhookContextManager):
    """
    A local HTTPS (or, if ``insecure``, HTTP) endpoint for the admission reviews.

    ``addr``/``port``: where to listen (``localhost``, ``9443`` by default; port 0 picks a free one).
    ``path``: the root path of the webhooks. ``host``: the host name in the URLs (``addr`` if not set).
    ``certfile``/``pkeyfile``/``password``: the server's certificate; if not given, a self-signed one
    is made for ``host``, ``addr`` and ``extra_sans``, and it becomes the CA of the clients.
    ``cadata``/``cafile``: the CA bundle that the clients (apiservers) must trust, if not the default
    trust chain; ``cadump``: a file to save the clients' CA bundle to (e.g. for ``curl --cacert``).
    ``context``: a ready SSL context instead of all the above.
    ``verify_mode``/``verify_cafile``/``verify_capath``/``verify_cadata``: for the client certificates
    (the handlers see them as ``sslpeer``). Only these CAs are trusted for the client certificates
    (or ``cafile``/``cadata`` if none of them is given), never the system's public ones.
    ``verify_mode=ssl.CERT_REQUIRED`` makes a client certificate signed by them a must: the handshakes
    without one or with another one fail before any request is read (for kube-apiserver, that needs
    a kubeconfig for its webhook client: see the README of kopf-webhooks). Without ``verify_mode``,
    the client certificates are verified if presented, but not required.

    Beyond Kopf's options (keyword-only, as all of them): ``max_body_size`` (bytes; 413 above it),
    ``handshake_timeout``, ``request_timeout`` and ``idle_timeout`` (seconds; see :mod:`kopf._webhooks.http`)
    limit what one client can take. TLS is 1.2 or newer, also in a given ``context``.
    """

    DEFAULT_HOST: ClassVar[str | None] = None
    DEFAULT_ADDR: ClassVar[str] = 'localhost'
    DEFAULT_PORT: ClassVar[int] = 9443

    addr: str | None
    port: int | None
    path: str | None
    host: str | None
    cadata: bytes | None
    cafile: str | os.PathLike[str] | None
    cadump: str | os.PathLike[str] | None
    context: ssl.SSLContext | None
    insecure: bool
    certfile: str | os.PathLike[str] | None
    pkeyfile: str | os.PathLike[str] | None
    password: str | None
    extra_sans: Collection[str]
    verify_mode: ssl.VerifyMode | None
    verify_cafile: str | os.PathLike[str] | None
    verify_capath: str | os.PathLike[str] | None
    verify_cadata: str | bytes | None
    max_body_size: int
    handshake_timeout: float
    request_timeout: float
    idle_timeout: float

    def __init__(
            self,
            *,
            addr: str | None = None,
            port: int | None = None,
            path: str | None = None,
            host: str | None = None,
            cadata: bytes | None = None,
            cafile: str | os.PathLike[str] | None = None,
            cadump: str | os.PathLike[str] | None = None,
            context: ssl.SSLContext | None = None,
            insecure: bool = False,
            certfile: str | os.PathLike[str] | None = None,
            pkeyfile: str | os.PathLike[str] | None = None,
            password: str | None = None,
            extra_sans: Collection[str] = (),
            verify_mode: ssl.VerifyMode | None = None,
            verify_cafile: str | os.PathLike[str] | None = None,
            verify_capath: str | os.PathLike[str] | None = None,
            verify_cadata: str | bytes | None = None,
            max_body_size: int = MAX_REVIEW_SIZE,
            handshake_timeout: float = http.HANDSHAKE_TIMEOUT,
            request_timeout: float = http.REQUEST_TIMEOUT,
            idle_timeout: float = http.IDLE_TIMEOUT,
    ) -> None:
        super().__init__()
        if (certfile is None) != (pkeyfile is None):
            raise ValueError('The certificate and its private key go together: '
                             'give both certfile= and pkeyfile=, or neither (for a self-signed certificate).')
        if insecure and (certfile is not None or context is not None):
            raise ValueError('insecure=True serves plain HTTP: '
                             'certfile=/pkeyfile=/context= cannot be used with it.')
        if port is not None and (not isinstance(port, int) or not 0 <= port <= 65535):
            raise ValueError(f'port= must be an integer in 0..65535 (0 for any free port), got {port!r}.')
        verifying = [name for name, value in [
            ('verify_mode', verify_mode), ('verify_cafile', verify_cafile),
            ('verify_capath', verify_capath), ('verify_cadata', verify_cadata),
        ] if value is not None]
        if insecure and verifying:
            raise ValueError(f'insecure=True serves plain HTTP, where no client certificates are verified: '
                             f'drop {"=/".join(verifying)}= or insecure=True.')
        no_cas = all(ca is None for ca in [verify_cafile, verify_capath, verify_cadata, cafile, cadata])
        if verify_mode in (ssl.CERT_REQUIRED, ssl.CERT_OPTIONAL) and context is None and no_cas:
            raise ValueError(f'verify_mode={verify_mode!r} verifies the client certificates, but no CA '
                             f'is given to verify them with: add verify_cafile=, verify_capath= or '
                             f'verify_cadata=.')
        if not isinstance(max_body_size, int) or max_body_size <= 0:
            raise ValueError(f'max_body_size= must be a positive number of bytes, got {max_body_size!r}.')
        for name, value in [('handshake_timeout', handshake_timeout), ('request_timeout', request_timeout),
                            ('idle_timeout', idle_timeout)]:
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f'{name}= must be a positive number of seconds, got {value!r}.')
        if isinstance(extra_sans, str):
            raise TypeError(f'extra_sans= must be a collection of host names/addresses, '
                            f'not a string: {extra_sans!r}.')
        self.addr = addr
        self.port = port
        self.path = path
        self.host = host
        self.cadata = cadata
        self.cafile = cafile
        self.cadump = cadump
        self.context = context
        self.insecure = insecure
        self.certfile = certfile
        self.pkeyfile = pkeyfile
        self.password = password
        self.extra_sans = extra_sans
        self.verify_mode = verify_mode
        self.verify_cafile = verify_cafile
        self.verify_capath = verify_capath
        self.verify_cadata = verify_cadata
        self.max_body_size = max_body_size
        self.handshake_timeout = handshake_timeout
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(addr={self.addr!r}, port={self.port!r}, '
                f'path={self.path!r}, host={self.host!r})')

    def __call__(self, fn: WebhookFn) -> AsyncIterator[WebhookClientConfig]:
        return self._remember(self._serve(fn))

    @staticmethod
    def build_certificate(hostnames: Collection[str], password: str | None = None) -> tuple[bytes, bytes]:
        """A self-signed certificate with the host names & addresses as SANs, and its key (both PEM)."""
        return certificates.build_certificate(hostnames, password=password)

    def _guess_host(self) -> str | None:
        """The host name for the URLs if ``host`` is not given (the cluster-specific servers know it)."""
        return self.DEFAULT_HOST

    async def _serve(self, fn: WebhookFn) -> AsyncIterator[WebhookClientConfig]:
        addr = self.addr if self.addr is not None else self.DEFAULT_ADDR
        port = self.port if self.port is not None else self.DEFAULT_PORT
        root = '/' + (self.path or '').strip('/')
        host = self.host if self.host is not None else self._guess_host()
        url_host = host if host is not None else addr

        context, cadata = self._prepare_ssl(hostnames=[url_host, addr, *self.extra_sans])

        handler = _RequestHandler(fn, root=root)
        listener = await http.start_server(
            handler.handle, host=addr, port=port, ssl_context=context, max_body_size=self.max_body_size,
            handshake_timeout=self.handshake_timeout, request_timeout=self.request_timeout,
            idle_timeout=self.idle_timeout)
        port = listener.port
        try:
            scheme = 'http' if context is None else 'https'
            url = f'{scheme}://{_url_host(url_host)}:{port}{root if root != "/" else ""}'
            logger.debug(f'Listening for webhooks at {url}')
            if context is None and not _is_loopback(addr):
                logger.warning(f'The webhook server serves plain HTTP (insecure=True) on {addr}: '
                               f'anyone who can reach it can send reviews; listen on localhost (addr=) '
                               f'unless this is meant.')
            config = WebhookClientConfig(url=url)
            if cadata is not None:
                config['caBundle'] = base64.b64encode(cadata).decode('ascii')
            yield config
            await asyncio.Event().wait()
        finally:
            await http.stop_server(listener)

    def _prepare_ssl(self, *, hostnames: Collection[str]) -> tuple[ssl.SSLContext | None, bytes | None]:
        """The server's SSL context (None if insecure) and the CA bundle for the clients (None if default)."""
        cadata: bytes | None = self.cadata
        if cadata is None and self.cafile is not None:
            cadata = pathlib.Path(self.cafile).read_bytes()
        context: ssl.SSLContext | None = None
        if not self.insecure:
            context = self.context
            if context is None:
                context, selfsigned = self._build_context(hostnames=hostnames)
                cadata = cadata if cadata is not None else selfsigned
            _require_modern_tls(context)
            self._load_verification(context)
        if self.cadump is not None and cadata is not None:
            pathlib.Path(self.cadump).write_bytes(cadata)
        return context, cadata

    def _build_context(self, *, hostnames: Collection[str]) -> tuple[ssl.SSLContext, bytes | None]:
        """The server's SSL context: with the given certificate, or a new self-signed one (also returned)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # without the system's CAs (CERT_NONE)
        tls.verify_as_kubernetes(context)  # the client certificates, if verified: as Kubernetes does
        if self.certfile is not None and self.pkeyfile is not None:
            context.load_cert_chain(self.certfile, self.pkeyfile, password=self.password)
            return context, None
        cert_pem, pkey_pem = self.build_certificate(hostnames, password=self.password)
        # The SSL module loads the certificates only from files: they exist only while loaded.
        with tempfile.TemporaryDirectory(prefix='kopf-webhook-') as tmpdir:
            certfile, pkeyfile = pathlib.Path(tmpdir, 'cert.pem'), pathlib.Path(tmpdir, 'pkey.pem')
            certfile.write_bytes(cert_pem)
            pkeyfile.touch(mode=0o600)
            pkeyfile.write_bytes(pkey_pem)
            context.load_cert_chain(certfile, pkeyfile, password=self.password)
        return context, cert_pem

    def _load_verification(self, context: ssl.SSLContext) -> None:
        """
        The CAs to verify the client certificates with (for ``sslpeer``), if any are given.

        ``verify_cafile``/``verify_capath``/``verify_cadata`` are for that. Without them, the clients'
        CA bundle (``cafile``/``cadata``) is used, as in the docs' example of the authentication
        (a self-signed client certificate as the CA). The clients without certificates are served too,
        unless ``verify_mode`` is ``ssl.CERT_REQUIRED``.
        """
        sources = (self.verify_cafile, self.verify_capath, self.verify_cadata)
        verifying = any(source is not None for source in sources)
        if verifying:
            _load_cas(context, 'verify_cafile=/verify_capath=/verify_cadata=',
                      cafile=self.verify_cafile, capath=self.verify_capath, cadata=self.verify_cadata)
        elif self.cafile is not None or self.cadata is not None:
            _load_cas(context, 'cafile=/cadata=', cafile=self.cafile, cadata=self.cadata)
            verifying = True
        if self.verify_mode is not None:
            context.verify_mode = self.verify_mode
        elif verifying:
            context.verify_mode = ssl.CERT_OPTIONAL  # the client certificates are welcome but not required


def _load_cas(context: ssl.SSLContext, names: str, *, cafile: str | os.PathLike[str] | None = None,
              capath: str | os.PathLike[str] | None = None, cadata: str | bytes | None = None) -> None:
    """The CAs of the client certificates, with a clear error if they are not there or not PEM."""
    try:
        context.load_verify_locations(cafile=cafile, capath=capath,
                                      cadata=cadata.decode('ascii') if isinstance(cadata, bytes) else cadata)
    except (OSError, ValueError) as e:  # incl. ssl.SSLError & UnicodeDecodeError
        raise ValueError(f'The CA certificates of {names} cannot be loaded ({e}): give PEM files or data '
                         f'with the CA that signs the client certificates.') from e


def _require_modern_tls(context: ssl.SSLContext) -> None:
    """TLS 1.2 or newer only: also in the users' contexts, which might allow the older versions."""
    if context.maximum_version not in (ssl.TLSVersion.MAXIMUM_SUPPORTED, ssl.TLSVersion.TLSv1_2,
                                       ssl.TLSVersion.TLSv1_3):
        raise ValueError(f'The webhook server\'s SSL context allows only {context.maximum_version!r}: '
                         f'TLS 1.2 or newer is required; set context.maximum_version to TLSv1_2 or above.')
    if context.minimum_version not in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        if context.minimum_version != ssl.TLSVersion.MINIMUM_SUPPORTED:
            logger.debug(f'Raising the SSL context\'s minimum_version from {context.minimum_version!r} '
                         f'to TLS 1.2.')
        context.minimum_version = ssl.TLSVersion.TLSv1_2


class _RequestHandler:
    """The HTTP side of one server: a request in, the framework's function called, the review out."""

    def __init__(self, fn: WebhookFn, *, root: str) -> None:
        super().__init__()
        self._fn = fn
        self._root = root.rstrip('/')

    async def handle(self, request: http.Request) -> http.HTTPResponse:
        path = request.path
        if path != self._root and not path.startswith(self._root + '/') and self._root:
            return _text(404, f'Not found: {path}. The webhooks are served under {self._root}.')
        if request.method != 'POST':
            return _text(405, 'Only POST requests with admission reviews are served.',
                         extra='Allow: POST\r\n')
        webhook = urllib.parse.unquote(path[len(self._root):].strip('/')) or None
        try:
            payload = json.loads(request.body.decode('utf-8'))
        except ValueError as e:  # incl. UnicodeDecodeError
            return _text(400, f'The request is not a JSON admission review: {e}')
        try:
            response = await self._fn(payload, webhook=webhook, headers=request.headers,
                                      sslpeer=request.peercert)
        except AdmissionReviewError as e:
            logger.debug(f'Rejected a malformed admission review: {e}')
            return _text(400, str(e))
        return 200, 'application/json', json.dumps(response, separators=(',', ':')).encode(), ''


def _text(status: int, message: str, *, extra: str = '') -> http.HTTPResponse:
    return status, 'text/plain; charset=utf-8', f'{message}\n'.encode(), extra


def _is_loopback(addr: str) -> bool:
    if addr == 'localhost':
        return True
    try:
        return ipaddress.ip_address(addr.strip('[]')).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    try:
        address = ipaddress.ip_address(host.strip('[]'))
    except ValueError:
        return host
    return f'[{address}]' if address.version == 6 else str(address)


#
# The cluster-specific servers: the cluster reaches the host by its special host name.
#

class WebhookK3dServer(WebhookServer):
    """A server for K3d/K3s clusters (even in VMs): they reach the host as ``host.k3d.internal``."""

    DEFAULT_HOST = 'host.k3d.internal'
    DEFAULT_ADDR = '0.0.0.0'  # the cluster's nodes connect from outside of the host's loopback


class WebhookMinikubeServer(WebhookServer):
    """A server for Minikube clusters (even in VMs): they reach the host as ``host.minikube.internal``."""

    DEFAULT_HOST = 'host.minikube.internal'
    DEFAULT_ADDR = '0.0.0.0'


class WebhookDockerDesktopServer(WebhookServer):
    """A server for Docker Desktop's Kubernetes: it reaches the host as ``host.docker.internal``."""

    DEFAULT_HOST = 'host.docker.internal'
    DEFAULT_ADDR = '0.0.0.0'


class ClusterDetector:
    """
    Guesses the type of the local cluster from the current context of the kubeconfig.

    The names that the local clusters' tools give to their contexts & clusters are recognised:
    ``k3d-*`` (K3d), ``minikube`` (Minikube), ``docker-desktop``/``docker-for-desktop`` (Docker Desktop).
    Nothing is guessed in-cluster or without a kubeconfig.
    """

    @staticmethod
    def guess_server_class() -> type[WebhookServer] | None:
        context = _current_kube_context()
        if context is None:
            return None
        names = {name.lower() for name in context if name}
        if any(name.startswith('k3d-') or name == 'k3s-default' for name in names):
            return WebhookK3dServer
        if 'minikube' in names:
            return WebhookMinikubeServer
        if names & {'docker-desktop', 'docker-for-desktop'}:
            return WebhookDockerDesktopServer
        return None

    @classmethod
    def guess_host(cls) -> str | None:
        server_class = cls.guess_server_class()
        return server_class.DEFAULT_HOST if server_class is not None else None


def _current_kube_context() -> tuple[str, str] | None:
    """The current context's name and its cluster's name, from the kubeconfig (None if unknown)."""
    paths = os.environ.get('KUBECONFIG') or os.path.expanduser('~/.kube/config')
    for path in paths.split(os.pathsep):
        with contextlib.suppress(OSError, yaml.YAMLError):
            config = yaml.safe_load(pathlib.Path(path).read_text())
            if not isinstance(config, Mapping) or not config.get('current-context'):
                continue
            current = str(config['current-context'])
            for item in config.get('contexts') or []:
                if isinstance(item, Mapping) and item.get('name') == current:
                    cluster = (item.get('context') or {}).get('cluster')
                    return current, str(cluster or '')
            return current, ''
    return None


class WebhookAutoServer(ClusterDetector, WebhookServer):
    """
    A local server that guesses the host name by which the cluster reaches it (K3d, Minikube, Docker Desktop).

    For other clusters, it is a plain local server; it never tunnels (see ``kopf.WebhookAutoTunnel``).
    """

    def _guess_host(self) -> str | None:
        return self.guess_host()

    async def _serve(self, fn: WebhookFn) -> AsyncIterator[WebhookClientConfig]:
        # The cluster-specific hosts are reachable only when listening on all interfaces.
        if self.addr is None and self.host is None and self.guess_host() is not None:
            self.addr = '0.0.0.0'
        async for config in super()._serve(fn):
            yield config

