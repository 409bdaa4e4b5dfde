"""
The metrics endpoint: the framework's Prometheus metrics (``--metrics=URL``, ``settings.metrics``).

The instruments are :mod:`kopf._cogs.helpers.metering`'s (they measure only once enabled). Served
at the URL's path in the text format of ``prometheus-client``, by a minimal aiohttp server of its own,
or by the liveness endpoint's server when the host and the port are the same (a single port to expose).
The users' own metrics join them on the same registry: ``settings.metrics.registry`` (the global
``prometheus_client.REGISTRY`` by default), e.g. ``Counter(..., registry=settings.metrics.registry)``.
"""
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kopf._cogs.helpers import metering
from kopf._core.engines import probing
from kopf._core.intents.configuration import OperatorSettings

if TYPE_CHECKING:
    from aiohttp import web

logger = logging.getLogger(__name__)

EXPECTED_FORM = 'http://HOST:PORT/PATH, e.g. http://0.0.0.0:9090/metrics'

Handler = Callable[['web.Request'], Awaitable['web.StreamResponse']]


class MetricsEndpointError(ValueError):
    """The metrics endpoint cannot be served: the message says why and what to do."""


def parse_metrics_endpoint(url: str) -> probing.LivenessEndpoint:
    """Parse the endpoint's URL (``http://HOST:PORT/PATH``) or fail with a one-line error."""
    try:
        return probing.parse_liveness_endpoint(url)
    except probing.LivenessEndpointError as e:
        raise MetricsEndpointError(f'The metrics endpoint {url!r} is invalid: {e.problem}. '
                                   f'Expected: {EXPECTED_FORM}.') from None


def check_installed() -> None:
    """Fail with what to install if prometheus-client is not there."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise MetricsEndpointError(f'The metrics need prometheus-client, which is not installed: '
                                   f'{metering.INSTALL_HINT}.') from None


def make_handler(registry: Any) -> Handler:
    """
    The request handler that renders the registry's metrics in Prometheus' text format.

    Only the named metrics if asked so (``?name[]=kopf_objects&name[]=...``, as ``prometheus-client``'s own
    exposition does): e.g. for a frequent probe of a few gauges, without rendering all the histograms.
    """
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def handle(request: 'web.Request') -> 'web.StreamResponse':
        names = request.query.getall('name[]', [])
        source = registry.restricted_registry(names) if names else registry
        return web.Response(body=generate_latest(source), headers={'Content-Type': CONTENT_TYPE_LATEST})

    return handle


class MetricsServer:
    """
    The metrics endpoint of one operator: on its own server, or on the liveness endpoint's one.

    :meth:`start` enables the metrics and starts serving; :meth:`stop` stops both.
    """

    def __init__(self, settings: OperatorSettings, *, reporter: probing.HealthReporter | None = None) -> None:
        super().__init__()
        url = settings.metrics.endpoint
        if url is None:
            raise MetricsEndpointError('No metrics endpoint is configured (settings.metrics.endpoint).')
        self.endpoint = parse_metrics_endpoint(url)
        self.url: str | None = None  # the actually served URL, once started (e.g. for port 0)
        self._settings = settings
        self._reporter = reporter
        self._server: probing.HealthReporter | None = None
        self._meters: metering.Meters | None = None

    async def start(self) -> None:
        check_installed()
        self._meters = metering.enable(self._settings.metrics.registry)
        handler = make_handler(self._meters.registry)
        reporter = self._reporter
        here = (self.endpoint.host, self.endpoint.port)
        if reporter is not None and self.endpoint.port != 0 and (reporter.endpoint.host,
                                                                 reporter.endpoint.port) == here:
            if self.endpoint.path == reporter.endpoint.path:
                raise MetricsEndpointError(f'The metrics and the liveness endpoints have the same path '
                                           f'{self.endpoint.path!r}: give them different paths.')
            reporter.add_route(self.endpoint.path, handler)
            base = reporter.url or ''
            self.url = base[:len(base) - len(reporter.endpoint.path)] + self.endpoint.path
        else:
            server = probing.HealthReporter(self.endpoint, routes={self.endpoint.path: handler},
                                            what='metrics endpoint')
            await server.start()
            self._server = server
            self.url = server.url
        logger.info(f'Serving the metrics at {self.url}')

    async def stop(self) -> None:
        """Stop serving (releasing the port) and measuring. Safe to call several times."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop()
        if self._meters is not None and metering.meters is self._meters:
            metering.disable()
        self._meters = None
