"""
The admission webhook tunnels: a local server made reachable from remote clusters via an external service.

``kopf.WebhookNgrokTunnel`` runs a local plain-HTTP server and exposes it via ngrok (through ``pyngrok``,
an optional extra: ``pip install kopf-webhooks[ngrok]``); the apiservers get ngrok's public HTTPS URL,
trusted by the default trust chain. ``kopf.WebhookAutoTunnel`` uses a local cluster's special host name
if the cluster is recognised (no tunnel needed), and ngrok otherwise.
"""
import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

from kopf._cogs.structs.reviews import WebhookClientConfig, WebhookFn
from kopf._webhooks.servers import ClusterDetector, WebhookContextManager, WebhookServer

__all__ = ['WebhookAutoTunnel', 'WebhookNgrokTunnel']

logger = logging.getLogger(__name__)


class WebhookNgrokTunnel(WebhookContextManager):
    """
    A local HTTP server (``addr``, ``port``, ``path`` as in ``kopf.WebhookServer``) tunnelled via ngrok.

    ``token``: ngrok's auth token (paid plans lift the free plan's limits); ``region``: ngrok's region;
    ``binary``: the path of the ``ngrok`` executable (otherwise, pyngrok finds or downloads one).
    The public URL is not protected: anyone who knows it can send reviews to the operator.
    """

    addr: str | None
    port: int | None
    path: str | None
    token: str | None
    region: str | None
    binary: str | None

    def __init__(
            self,
            *,
            addr: str | None = None,
            port: int | None = None,
            path: str | None = None,
            token: str | None = None,
            region: str | None = None,
            binary: str | None = None,
    ) -> None:
        super().__init__()
        self.addr = addr
        self.port = port
        self.path = path
        self.token = token
        self.region = region
        self.binary = binary

    def __repr__(self) -> str:
        return f'{type(self).__name__}(addr={self.addr!r}, port={self.port!r}, path={self.path!r})'

    def __call__(self, fn: WebhookFn) -> AsyncIterator[WebhookClientConfig]:
        return self._remember(self._serve(fn))

    async def _serve(self, fn: WebhookFn) -> AsyncIterator[WebhookClientConfig]:
        try:
            from pyngrok import conf, ngrok
        except ImportError:
            raise ImportError(
                'kopf.WebhookNgrokTunnel needs pyngrok, which is not installed. '
                'Install it with: pip install kopf-webhooks[ngrok]  (or: pip install pyngrok).'
            ) from None

        options: dict[str, Any] = {}
        if self.binary is not None:
            options['ngrok_path'] = self.binary
        if self.token is not None:
            options['auth_token'] = self.token
        if self.region is not None:
            options['region'] = self.region
        pyngrok_config = conf.PyngrokConfig(**options)
        loop = asyncio.get_running_loop()

        # The tunnel's path is added to the public URL, not to the local server's: ngrok forwards as is.
        server = WebhookServer(addr=self.addr, port=self.port, path=self.path, insecure=True)
        public_url: str | None = None
        try:
            async for local_config in server(fn):
                local_url = str(local_config.get('url') or '')
                local_addr = local_url.split('://', 1)[-1].split('/', 1)[0]  # host:port of the local server
                if public_url is not None:
                    await loop.run_in_executor(
                        None, functools.partial(ngrok.disconnect, public_url, pyngrok_config))
                tunnel = await loop.run_in_executor(None, functools.partial(
                    ngrok.connect, local_addr, 'http', pyngrok_config=pyngrok_config))
                public_url = str(tunnel.public_url)
                if public_url.startswith('http://'):  # Kubernetes accepts only HTTPS webhooks.
                    public_url = 'https://' + public_url[len('http://'):]
                root = '/' + (self.path or '').strip('/')
                url = public_url.rstrip('/') + (root if root != '/' else '')
                logger.debug(f'The webhooks are tunnelled via ngrok: {url} -> {local_url}')
                yield WebhookClientConfig(url=url)
        finally:
            if public_url is not None:
                try:
                    await asyncio.shield(loop.run_in_executor(
                        None, functools.partial(ngrok.disconnect, public_url, pyngrok_config)))
                except Exception as e:  # the exit goes on: the tunnel dies with the ngrok process anyway.
                    logger.warning(f'Failed to close the ngrok tunnel {public_url}: {e}')


class WebhookAutoTunnel(ClusterDetector, WebhookContextManager):
    """
    A local server for the recognised local clusters (K3d, Minikube, Docker Desktop), else an ngrok tunnel.

    Only the options common to all of them are accepted: where to listen (``addr``, ``port``, ``path``).
    """

    addr: str | None
    port: int | None
    path: str | None

    def __init__(
            self,
            *,
            addr: str | None = None,
            port: int | None = None,
            path: str | None = None,
    ) -> None:
        super().__init__()
        self.addr = addr
        self.port = port
        self.path = path

    def __repr__(self) -> str:
        return f'{type(self).__name__}(addr={self.addr!r}, port={self.port!r}, path={self.path!r})'

    def __call__(self, fn: WebhookFn) -> AsyncIterator[WebhookClientConfig]:
        return self._remember(self._serve(fn))

    def _choose(self) -> WebhookServer | WebhookNgrokTunnel:
        server_class = self.guess_server_class()
        if server_class is not None:
            return server_class(addr=self.addr, port=self.port, path=self.path)
        return WebhookNgrokTunnel(addr=self.addr, port=self.port, path=self.path)

    async def _serve(self, fn: WebhookFn) -> AsyncIterator[WebhookClientConfig]:
        chosen = self._choose()
        logger.debug(f'Auto-detected the webhook server/tunnel: {chosen!r}')
        async with chosen:
            async for config in chosen(fn):
                yield config
