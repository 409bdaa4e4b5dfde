"""
The framework's own metrics: nothing until enabled, then ``prometheus-client``'s, on one registry.

The places that measure ask ``metering.meters`` (a module global, ``None`` while the metrics are off,
so that an operator without them pays one global lookup per place, and imports nothing); once
:func:`enable` is called (by the operator for ``--metrics`` / ``settings.metrics``), it holds the
instruments. prometheus-client is an optional extra: ``pip install kopf-clients[metrics]``.

The names and labels follow controller-runtime's where the idea is the same (``workqueue_*``,
``rest_client_*``, ``leader_election_master_status``), with the ``kopf_`` prefix. No label holds an
object's name or uid; the paths of API requests are reduced to their resources. Label values that
come from the code (handler ids, webhook names) are capped per metric (:data:`MAX_LABEL_VALUES`):
the values beyond it are counted as ``other``, so a sub-handler id made of data cannot grow the series
without bound.
"""
import bisect
import math
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, overload

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = ['INSTALL_HINT', 'MAX_LABEL_VALUES', 'GaugeSource', 'Meters', 'disable', 'enable', 'meters',
           'resource_of_path', 'track_request_slots']

INSTALL_HINT = 'pip install "kopf[metrics]" (or prometheus-client)'
MAX_LABEL_VALUES = 500  # distinct values of a free-form label per metric; the rest are "other"

# The latency buckets: from a cached answer (~1 ms) to a slow handler or a long request (~1 min).
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

meters: 'Meters | None' = None

# What reports gauges when scraped: (name, labels, value) for each sample.
GaugeSource = Callable[[], Iterable[tuple[str, dict[str, str], float]]]


class RequestSlots(Protocol):
    """The API client's slots of one credential's regular requests (``kopf._clients.auth.RequestSlots``)."""

    @property
    def taken(self) -> int: ...

    @property
    def waiting(self) -> int: ...


# The request slots of all credentials in the process, tracked even while the metrics are off (they are made
# once per credential, and the metrics can be enabled later); their gauges are per process, as the counters.
_request_slots: 'weakref.WeakSet[RequestSlots]' = weakref.WeakSet()
_request_slots_lock = threading.Lock()  # the operators in other threads add theirs while a scrape reads them


def track_request_slots(slots: RequestSlots) -> None:
    """Report the slots' requests in flight and waiting as gauges, for as long as the slots exist."""
    with _request_slots_lock:
        _request_slots.add(slots)


def _request_gauges() -> Iterator[tuple[str, dict[str, str], float]]:
    with _request_slots_lock:
        slots = list(_request_slots)
    yield 'kopf_rest_client_requests_in_flight', {}, float(sum(item.taken for item in slots))
    yield 'kopf_rest_client_requests_waiting', {}, float(sum(item.waiting for item in slots))


class _CounterChild:
    __slots__ = ('value',)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class _HistogramChild:
    __slots__ = ('bounds', 'counts', 'sum')

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last one is +Inf
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.sum += amount
        self.counts[bisect.bisect_left(self.bounds, amount)] += 1  # the first bound >= amount ("le")


class _Instrument:
    """
    A metric of the framework: counted in plain numbers, made prometheus-client's families when scraped.

    prometheus-client's own ``Counter`` and ``Histogram`` take a lock per increment and check the label
    values per call, which costs more than the framework's step measured; the framework's measurements are
    made in the event loop's thread, so the numbers are plain attributes. The exposition (the registry,
    the text format, the endpoint) is prometheus-client's.
    """

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *,
                 registry: 'CollectorRegistry') -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self._children: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()
        if not self.labelnames:
            self._children[()] = self._make_child()  # shown from the start, as zero
        registry.register(self)

    def _make_child(self) -> Any:
        raise NotImplementedError

    def labels(self, *values: str) -> Any:
        if len(values) != len(self.labelnames):
            raise ValueError(f'{self.name} takes {len(self.labelnames)} label values, got {values!r}.')
        try:
            return self._children[values]
        except KeyError:
            with self._lock:
                return self._children.setdefault(values, self._make_child())

    def _family(self) -> 'Metric':
        raise NotImplementedError

    def describe(self) -> list['Metric']:
        return [self._family()]

    def collect(self) -> list['Metric']:
        family = self._family()
        for values, child in list(self._children.items()):
            self._add(family, list(values), child)
        return [family]

    def _add(self, family: Any, values: list[str], child: Any) -> None:
        raise NotImplementedError


class Counter(_Instrument):
    def _make_child(self) -> _CounterChild:
        return _CounterChild()

    def labels(self, *values: str) -> _CounterChild:
        return super().labels(*values)  # type: ignore[no-any-return]

    def inc(self, amount: float = 1) -> None:
        """For the metrics with no labels."""
        self.labels().inc(amount)

    def _family(self) -> 'Metric':
        from prometheus_client.core import CounterMetricFamily
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Any, values: list[str], child: _CounterChild) -> None:
        family.add_metric(values, child.value)


class Histogram(_Instrument):
    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *,
                 buckets: tuple[float, ...], registry: 'CollectorRegistry') -> None:
        self.buckets = tuple(sorted(buckets))
        super().__init__(name, documentation, labelnames, registry=registry)

    def _make_child(self) -> _HistogramChild:
        return _HistogramChild(self.buckets)

    def labels(self, *values: str) -> _HistogramChild:
        return super().labels(*values)  # type: ignore[no-any-return]

    def _family(self) -> 'Metric':
        from prometheus_client.core import HistogramMetricFamily
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Any, values: list[str], child: _HistogramChild) -> None:
        cumulative = 0
        buckets = []
        for bound, count in zip([*child.bounds, math.inf], list(child.counts), strict=True):
            cumulative += count
            buckets.append(('+Inf' if bound == math.inf else repr(float(bound)), cumulative))
        family.add_metric(values, buckets, child.sum)


class Meters:
    """The instruments of the framework's metrics, on one registry (see the module's description)."""

    def __init__(self, registry: 'CollectorRegistry') -> None:
        self.registry = registry
        self._capped: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        self._gauge_sources: list[GaugeSource] = [_request_gauges]
        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}

        # Handlers.
        self.handler_calls = Counter(
            'kopf_handler_calls', 'Handler calls by resource, handler id and outcome '
            '(success, temporary, permanent, timeout).',
            ['resource', 'handler', 'outcome'], registry=registry)
        self.handler_duration = Histogram(
            'kopf_handler_duration_seconds', 'The duration of the handlers\' calls.',
            ['resource', 'handler'], buckets=_BUCKETS, registry=registry)
        self.handler_retries = Counter(
            'kopf_handler_retries', 'Handler calls that are retries of earlier failed ones.',
            ['resource', 'handler'], registry=registry)
        self.changes_handled = Counter(
            'kopf_changes_handled', 'Handling cycles finished (not attempts): by resource and reason.',
            ['resource', 'reason'], registry=registry)

        # The queue: the events, their wait, the objects.
        self.events = Counter(
            'kopf_workqueue_adds', 'The watch-events processed, by resource (the latest of each batch).',
            ['resource'], registry=registry)
        self.queue_duration = Histogram(
            'kopf_workqueue_queue_duration_seconds', 'How long an event waits until its processing starts.',
            ['resource'], buckets=_BUCKETS, registry=registry)
        self.work_duration = Histogram(
            'kopf_workqueue_work_duration_seconds', 'How long the processing of an event takes.',
            ['resource'], buckets=_BUCKETS, registry=registry)

        # The API client.
        self.requests = Counter(
            'kopf_rest_client_requests', 'API requests by verb, resource and HTTP status code.',
            ['verb', 'resource', 'code'], registry=registry)
        self.request_duration = Histogram(
            'kopf_rest_client_request_duration_seconds', 'API requests\' latency, by verb and resource.',
            ['verb', 'resource'], buckets=_BUCKETS, registry=registry)
        self.throttled = Counter(
            'kopf_rest_client_throttled', 'API requests throttled by the server (HTTP 429).',
            ['verb', 'resource'], registry=registry)
        self.relogins = Counter(
            'kopf_relogins', 'Credentials rejected by the server (HTTP 401) and so re-logged in.',
            registry=registry)
        self.watch_restarts = Counter(
            'kopf_watch_restarts', 'Watch-streams re-established, by resource and reason '
            '(reconnect, gone: HTTP 410, error).',
            ['resource', 'reason'], registry=registry)

        # The admission webhooks.
        self.admission_reviews = Counter(
            'kopf_admission_reviews', 'Admission reviews by webhook and outcome (allowed, denied, error).',
            ['webhook', 'outcome'], registry=registry)
        self.admission_duration = Histogram(
            'kopf_admission_review_duration_seconds', 'How long an admission review takes.',
            ['webhook'], buckets=_BUCKETS, registry=registry)

        # The daemons & timers.
        self.timer_ticks = Counter(
            'kopf_timer_ticks', 'Timers\' calls, by resource and handler id.',
            ['resource', 'handler'], registry=registry)
        self.timer_missed_ticks = Counter(
            'kopf_timer_missed_ticks',
            'Timers\' ticks missed: the whole intervals of a late start or of a sharp timer\'s long call.',
            ['resource', 'handler'], registry=registry)
        self.timer_lateness = Histogram(
            'kopf_timer_lateness_seconds', 'How late the timers\' calls start after they are due.',
            ['resource'], buckets=_BUCKETS, registry=registry)

        # The sharding (--shards): the shards taken, given up, and lost (to others or by failed renewals).
        self.shard_handovers = Counter(
            'kopf_shard_handovers', 'Shards changing hands in this replica, by the sharding\'s name and '
            'direction (taken, given: released to others, lost: taken by others or not renewed in time).',
            ['name', 'direction'], registry=registry)

        # The gauges of the current state, read when scraped (nothing to do per event).
        self._gauges = _GaugeCollector(self._gauge_sources)
        registry.register(self._gauges)

    def unregister(self) -> None:
        """Take all the instruments off the registry."""
        for collector in [*vars(self).values()]:
            if hasattr(collector, 'collect') and collector is not self.registry:
                self.registry.unregister(collector)

    @overload
    def child(self, metric: 'Counter', *labels: str) -> '_CounterChild': ...
    @overload
    def child(self, metric: 'Histogram', *labels: str) -> '_HistogramChild': ...

    def child(self, metric: 'Counter | Histogram', *labels: str) -> '_CounterChild | _HistogramChild':
        """The metric's child of these label values (``metric.labels(*labels)``), looked up once."""
        key = (metric, labels)
        try:
            child: _CounterChild | _HistogramChild = self._children[key]
        except KeyError:
            child = self._children[key] = metric.labels(*labels)
        return child

    def capped(self, metric: str, value: str) -> str:
        """The label value, or ``other`` if the metric has seen too many distinct values already."""
        seen = self._capped.get(metric)
        if seen is None:
            seen = self._capped.setdefault(metric, set())
        if value in seen:
            return value
        with self._lock:
            if len(seen) >= MAX_LABEL_VALUES:
                return 'other'
            seen.add(value)
        return value

    def add_gauges(self, source: 'GaugeSource') -> Callable[[], None]:
        """
        Report the gauges that the source yields when scraped: ``(name, labels, value)``; returns a remover.

        E.g. the watch-streams report their known, active and waiting objects this way.
        """
        self._gauge_sources.append(source)

        def remove() -> None:
            if source in self._gauge_sources:
                self._gauge_sources.remove(source)

        return remove


class _GaugeCollector:
    """Collects the gauges of the current state from their sources, at every scrape."""

    # The gauges' help texts, by name (the sources yield the names; unknown names get a generic help).
    HELP = {
        'kopf_objects': 'Objects per resource: known (as of the latest events), active (with a worker now).',
        'kopf_workqueue_depth': 'Objects waiting for their processing (for a seat or for their worker).',
        'kopf_daemons_running': 'Daemons running now, by resource.',
        'kopf_timers': 'The objects\' timers by resource: scheduled (waiting for their deadline) or running.',
        'kopf_leader_election_master_status': '1 if this replica holds the Lease, 0 if it waits for it.',
        'kopf_shards_held': 'The shards whose objects this replica handles now (--shards), by sharding.',
        'kopf_shard_members': 'The live replicas of the sharding as of the latest round (this one included).',
        'kopf_handling_paused': '1 if the handling is paused (by peering, a freeze, a Lease of another).',
        'kopf_processing_seats': 'The processing\'s seats (settings.queueing.processing_seats): taken by the '
                                 'objects in the framework\'s own steps, or free.',
        'kopf_processing_reserve_used': 'Objects let in beyond the processing\'s seats while the seated ones '
                                        'wait for a request slot (a busy API server; up to 9 per seat).',
        'kopf_rest_client_requests_in_flight': 'API requests holding one of the client\'s slots now (sent or '
                                               'being sent; the watch-streams take none).',
        'kopf_rest_client_requests_waiting': 'API requests waiting for a slot now (all are taken).',
    }

    def __init__(self, sources: list['GaugeSource']) -> None:
        self._sources = sources

    def describe(self) -> list['Metric']:
        # The known names, so that a scrape restricted by names (``?name[]=``) finds them; the sources may
        # yield others (then, they are in the full scrapes only).
        from prometheus_client.core import GaugeMetricFamily
        return [GaugeMetricFamily(name, help) for name, help in self.HELP.items()]

    def collect(self) -> Iterator['Metric']:
        from prometheus_client.core import GaugeMetricFamily

        families: dict[str, tuple[list[str], list[tuple[list[str], float]]]] = {}
        for source in list(self._sources):
            for name, labels, value in source():
                keys, samples = families.setdefault(name, (sorted(labels), []))
                samples.append(([str(labels.get(key, '')) for key in keys], value))
        for name, (keys, samples) in families.items():
            family = GaugeMetricFamily(name, self.HELP.get(name, name), labels=keys)
            totals: dict[tuple[str, ...], float] = {}
            for values, value in samples:  # the same labels from several sources are summed
                totals[tuple(values)] = totals.get(tuple(values), 0.0) + value
            for values_tuple, value in totals.items():
                family.add_metric(list(values_tuple), value)
            yield family


def enable(registry: 'CollectorRegistry | None' = None) -> Meters:
    """
    Turn the framework's metrics on (once per process; again: the same instruments).

    Raises ``ImportError`` with what to install if prometheus-client is not there.
    """
    global meters
    if meters is not None and (registry is None or meters.registry is registry):
        return meters
    try:
        import prometheus_client
    except ImportError:
        raise ImportError(f'The metrics need prometheus-client: {INSTALL_HINT}.') from None
    meters = Meters(registry if registry is not None else prometheus_client.REGISTRY)
    return meters


def disable() -> None:
    """Turn the framework's metrics off and take them off their registry (e.g. between tests)."""
    global meters
    old, meters = meters, None
    if old is not None:
        old.unregister()


def resource_of_path(path: str) -> str:
    """
    The resource of an API path, without namespaces and names: ``configmaps``, ``kopfexamples.kopf.dev``.

    The subresources follow a slash (``kopfexamples.kopf.dev/status``); the discovery and other
    non-resource paths are ``discovery`` and ``other``.
    """
    parts = path.split('?', 1)[0].split('/')  # ['', 'api', 'v1', ...] or ['', 'apis', GROUP, VERSION, ...]
    if len(parts) >= 3 and parts[0] == '' and parts[1] == 'api' and parts[2] == 'v1':
        group, rest = '', parts[3:]
    elif len(parts) >= 4 and parts[0] == '' and parts[1] == 'apis' and parts[2] and parts[3]:
        group, rest = parts[2], parts[4:]
    else:
        return 'other'
    if '' in rest:
        rest = [part for part in rest if part]  # double or trailing slashes
    if len(rest) >= 3 and rest[0] == 'namespaces':
        rest = rest[2:]  # a namespaced resource: /namespaces/NS/PLURAL[/NAME[/SUB]]
    if not rest:
        return 'discovery'
    name = f'{rest[0]}.{group}' if group else rest[0]
    return f'{name}/{rest[2]}' if len(rest) >= 3 else name
