"""
The liveness endpoint: a minimal HTTP server that reports the operator's health (``--liveness=URL``).

The server listens at the host & port of the URL (port 0 picks a free port: see ``HealthReporter.url``
for the actual one) and answers ``GET`` (and ``HEAD``) on the URL's path only; other paths get 404.

* Until the operator is ready (its startup activity is over and the watching has started),
  the answer is ``503`` with ``{"error": "..."}``: a liveness probe of a pod that starts up for too
  long fails, as the docs warn. The server is up before the startup, so the port is taken (and
  a busy port fails the operator) before any startup handler runs.
* Once ready, the probe handlers (``@kopf.on.probe``) are run and their results are the answer:
  ``200`` with ``{"handler_id": result, ...}`` (``{}`` if there are no probes). The results are
  serialised as JSON; the values that JSON does not know (e.g. datetimes) become their ``str()``.
* If any probe fails (see :func:`kopf._core.engines.activities.run_probes` for what it means),
  the answer is ``500`` with ``{"error": "...", "failures": {"id": "Error: message"}, "results": {...}}``.
  The failure itself is logged by the probe's logger (``kopf.activities.probe``) with its traceback.
* The framework's own state is added under the keys of :meth:`HealthReporter.add_status` (both in
  the successes and the failures): e.g. ``kopf.sharding`` with the shards held by this replica
  (``kopf run --shards``). The keys have a dot, so they do not clash with the probes' ids (function names).

The report (a success or a failure) is cached for :data:`PROBES_CACHE_PERIOD` seconds since it
was made, so that frequent or mass requests do not overload the operator with probing;
the concurrent requests for an outdated report share one probing run.

The server stops (and releases the port) when the operator exits, after the cleanup activity.
The access log of the requests goes to the ``aiohttp.access`` logger, as the docs describe.
"""
import asyncio
import contextvars
import dataclasses
import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from kopf._core.engines import activities
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.registries import OperatorRegistry

if TYPE_CHECKING:
    from aiohttp import web  # imported when served: most operators have no liveness endpoint

Handler = Callable[['web.Request'], Awaitable['web.StreamResponse']]

logger = logging.getLogger(__name__)

# How long a liveness report is reused (seconds). The docs only promise "a reasonable time";
# 10 seconds is the default period of Kubernetes' probes, so a usual prober triggers the probe
# handlers at most once per its period, while a burst of requests triggers them only once.
PROBES_CACHE_PERIOD = 10.0

# How long the in-flight requests may take to finish when the server stops.
SHUTDOWN_TIMEOUT = 1.0

EXPECTED_FORM = 'http://HOST:PORT/PATH, e.g. http://0.0.0.0:8080/healthz'

NOT_READY_MESSAGE = 'The operator is not ready yet: the startup or the initial watching is in progress.'


class LivenessEndpointError(ValueError):
    """The liveness endpoint's URL cannot be served: the message says why and what is expected."""

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(f'liveness_endpoint={url!r} is invalid: {problem}. Expected: {EXPECTED_FORM}.')
        self.url = url
        self.problem = problem


@dataclasses.dataclass(frozen=True)
class LivenessEndpoint:
    host: str
    port: int
    path: str


def parse_liveness_endpoint(url: str) -> LivenessEndpoint:
    """Parse the liveness endpoint's URL (``http://HOST:PORT/PATH``) or fail with a clear error."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:  # e.g. a non-numeric port or one out of range.
        raise LivenessEndpointError(url, f'the port is invalid ({e})') from None
    if '://' not in url:
        raise LivenessEndpointError(url, 'the scheme is missing (only http:// is supported)')
    if parts.scheme != 'http':
        raise LivenessEndpointError(url, f'{parts.scheme}:// is not supported (only http:// is supported)')
    if not parts.hostname:
        raise LivenessEndpointError(url, 'the host is missing (use 0.0.0.0 for all interfaces)')
    if port is None:
        raise LivenessEndpointError(url, 'the port is missing')
    if parts.username is not None or parts.password is not None:
        raise LivenessEndpointError(url, 'the credentials are not supported')
    if parts.query or parts.fragment:
        raise LivenessEndpointError(url, 'the query and the fragment are not supported')
    return LivenessEndpoint(host=parts.hostname, port=port, path=parts.path or '/')


@dataclasses.dataclass(frozen=True)
class LivenessReport:
    """One answer of the liveness endpoint: the HTTP status and the JSON text."""

    status: int
    text: str


class HealthReporter:
    """
    The server of the liveness endpoint for one operator: :meth:`start`, :meth:`mark_ready`, :meth:`stop`.

    The probes get the operator's memo, indices, and settings as all activities do. They run in
    the context of the reporter's creator (the operator's one), not of the server's connections.
    ``clock`` (for the cache's expiry) is the event loop's time unless given.
    """

    def __init__(
            self,
            endpoint: str | LivenessEndpoint,
            *,
            registry: OperatorRegistry | None = None,
            settings: OperatorSettings | None = None,
            memo: Any = None,
            indices: Mapping[str, Any] | None = None,
            cache_period: float = PROBES_CACHE_PERIOD,
            clock: Callable[[], float] | None = None,
            routes: Mapping[str, Handler] | None = None,
            what: str = 'liveness endpoint',
    ) -> None:
        super().__init__()
        if not isinstance(endpoint, LivenessEndpoint):
            endpoint = parse_liveness_endpoint(endpoint)
        self.endpoint = endpoint
        self.what = what
        # The paths served: the liveness report at the endpoint's path (if probing), and others (the metrics).
        self._routes: dict[str, Handler] = dict(routes or {})
        if registry is not None and settings is not None:
            self._routes.setdefault(endpoint.path, self._handle)
        self.url: str | None = None  # the actually served URL, known once started (e.g. for port 0).
        self.cache_period = cache_period
        self._registry = registry
        self._settings = settings
        self._memo = memo
        self._indices = indices
        self._clock = clock
        self._context = contextvars.copy_context()
        self._ready = False
        self._runner: web.AppRunner | None = None
        self._report: LivenessReport | None = None
        self._reported_at = 0.0
        self._probing: asyncio.Task[LivenessReport] | None = None
        self._statuses: dict[str, Callable[[], Any]] = {}

    @property
    def ready(self) -> bool:
        return self._ready

    def mark_ready(self) -> None:
        """The operator is ready: from now on, the probes are run and reported."""
        self._ready = True

    async def start(self) -> None:
        """Start listening (the errors, such as a busy port, are raised here)."""
        from aiohttp import web  # only when served (a notable import for the operators without it)
        app = web.Application()
        app.router.add_get('/{path:.*}', self._dispatch)  # the routes can be added later (see add_route)
        runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_TIMEOUT)
        await runner.setup()
        site = web.TCPSite(runner, self.endpoint.host, self.endpoint.port)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            raise OSError(e.errno, f'Cannot serve the {self.what} at '
                                   f'{self.endpoint.host}:{self.endpoint.port}: {e.strerror or e}') from e
        self._runner = runner
        host, port = runner.addresses[0][:2]
        netloc = f'[{host}]:{port}' if ':' in host else f'{host}:{port}'
        self.url = f'http://{netloc}{self.endpoint.path}'
        if self.what == 'liveness endpoint':
            logger.info(f'Serving the liveness endpoint at {self.url}')

    def add_status(self, key: str, source: Callable[[], Any]) -> None:
        """Add the framework's state (the source's JSON-serialisable value) under the key to every report."""
        self._statuses[key] = source

    def add_route(self, path: str, handler: Handler) -> None:
        """Serve another path on the same server (e.g. the metrics on the liveness endpoint's port)."""
        self._routes[path] = handler

    async def _dispatch(self, request: 'web.Request') -> 'web.StreamResponse':
        from aiohttp import web
        handler = self._routes.get(request.path)
        if handler is None:
            raise web.HTTPNotFound()
        return await handler(request)

    async def stop(self) -> None:
        """Stop the probing and the server; release the port. Safe to call several times."""
        probing, self._probing = self._probing, None
        if probing is not None and not probing.done():
            probing.cancel()
            await asyncio.wait([probing])
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
            logger.debug(f'The {self.what} is stopped.')

    async def _handle(self, request: 'web.Request') -> 'web.Response':
        from aiohttp import web
        report = await self.get_report()
        return web.Response(status=report.status, text=report.text, content_type='application/json')

    async def get_report(self) -> LivenessReport:
        """The current report: "not ready", or the cached one if still fresh, or a new one."""
        if not self._ready:
            return LivenessReport(503, json.dumps({'error': NOT_READY_MESSAGE}))
        if self._report is not None and self._now() - self._reported_at < self.cache_period:
            return self._report
        if self._probing is None or self._probing.done():
            # Not in the request's own task: a disconnected client must not cancel a shared probing.
            self._probing = asyncio.create_task(self._probe(), name='liveness probing', context=self._context)
        return await asyncio.shield(self._probing)

    async def _probe(self) -> LivenessReport:
        assert self._registry is not None and self._settings is not None  # only served with them
        try:
            try:
                results = await activities.run_probes(registry=self._registry, settings=self._settings,
                                                      memo=self._memo, indices=self._indices)
            except activities.ActivityError as e:
                failures = {handler_id: f'{type(outcome.exception).__name__}: {outcome.exception}'
                            for handler_id, outcome in e.outcomes.items() if outcome.exception is not None}
                succeeded = {handler_id: outcome.result
                             for handler_id, outcome in e.outcomes.items() if outcome.exception is None}
                names = ', '.join(repr(handler_id) for handler_id in failures)
                report = LivenessReport(500, _dumps({'error': f'Some probes have failed: {names}.',
                                                     'failures': failures, 'results': succeeded,
                                                     **self._status()}))
            else:
                report = LivenessReport(200, _dumps({**results, **self._status()}))
        except Exception as e:  # e.g. unserialisable results: not a reason to crash the server.
            logger.exception(f'The liveness probing has failed: {e}')
            report = LivenessReport(500, _dumps({'error': f'The liveness probing has failed: {e}'}))
        self._report = report
        self._reported_at = self._now()
        return report

    def _status(self) -> dict[str, Any]:
        return {key: source() for key, source in self._statuses.items()}

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()


def _dumps(data: Any) -> str:
    return json.dumps(data, default=str)
