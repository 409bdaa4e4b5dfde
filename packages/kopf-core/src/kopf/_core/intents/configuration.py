"""
The operator's settings: ``kopf.OperatorSettings`` with all its sections.

Every operator has its own settings object (several embedded operators in one process do not
share them). They are usually adjusted in the startup handlers; the defaults are sufficient
for most operators. The sections used by the API client (``networking``, ``watching``) come
from kopf-clients, so that ``OperatorSettings`` satisfies the client's ``ClientSettings`` protocol.
"""
import concurrent.futures
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from kopf._cogs.aiokits.backoffs import BackoffsSpec
from kopf._cogs.aiokits.capacity import DEFAULT_LENDING_DELAY
from kopf._cogs.configs.checks import CheckedFields, check_positive_integer
from kopf._cogs.configs.networking import NetworkingSettings, WatchingSettings
from kopf._core.persistence import diffbase, progress

__all__ = [
    'RESERVE_PER_SEAT',
    'AdmissionSettings',
    'BackgroundSettings',
    'BatchingSettings',
    'ElectionSettings',
    'ExecutionSettings',
    'NetworkingSettings',
    'OperatorSettings',
    'PeeringSettings',
    'PersistenceSettings',
    'PostingSettings',
    'ProcessSettings',
    'QueueingSettings',
    'ScanningSettings',
    'ShardingSettings',
    'WatchingSettings',
]


# The processing's reserve per seat when ``settings.queueing.processing_reserve`` is None (see the pacing).
RESERVE_PER_SEAT = 9


def _check_reserve(path: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f'{path} must be an integer, 0 or more, '
                         f'or None for {RESERVE_PER_SEAT} per seat; got {value!r}.')


def _check_delay(path: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:  # NaN too
        raise ValueError(f'{path} must be a number of seconds, 0 or more, got {value!r}.')


@dataclasses.dataclass
class ProcessSettings:
    ultimate_exiting_timeout: float = 10 * 60
    """How long the operator waits for its tasks to finish on exit (e.g. on SIGTERM), in seconds."""

    gc_threshold: int | None = 10_000
    """
    The threshold of the garbage collector's youngest generation while the operator runs (after
    the startup), as in ``gc.set_threshold()``; the previous thresholds are restored when it exits.

    CPython's default (700) makes an operator spend a noticeable share of its CPU time on the collections
    during bursts of events (benchmarks/README.md), though they find almost nothing: the objects' bodies
    and the framework's structures are freed as soon as they are not used, not kept in reference cycles.
    A higher threshold is never lowered (e.g. if the process has set its own). ``None``: leave the
    garbage collector as it is (e.g. when the operator is embedded into an application that tunes it).
    """


@dataclasses.dataclass
class PostingSettings:
    enabled: bool = True
    """Whether to post the object-related log messages and ``kopf.event()`` calls as Kubernetes events."""

    loggers: bool = False
    """Whether the messages logged by the handlers on their ``logger`` are posted as events too."""

    level: int = logging.INFO
    """The minimal level of the log messages to be posted as events."""

    default_backoffs: BackoffsSpec = (1, 1, 2, 3, 5, 8, 13, 21)
    """Delays between the retries of posting the explicit events (``kopf.event()`` & co)."""

    logging_backoffs: BackoffsSpec = (1, 1, 2, 3, 5)
    """Delays between the retries of posting the events from log messages (less important ones)."""

    worker_limit: int | None = None
    """How many events can be posted in parallel (None: unlimited)."""

    idle_timeout: float = 1.0
    """How long an idle posting worker waits for new events before exiting, in seconds."""

    reporting_component: str = 'kopf'
    """The ``reportingComponent`` (and ``source.component``) of the posted events."""

    reporting_instance: str = 'dev'
    """The ``reportingInstance`` (and ``source.host``) of the posted events."""

    event_name_prefix: str = 'kopf-event-'
    """The ``generateName`` of the posted events."""


@dataclasses.dataclass
class PeeringSettings:
    name: str = 'default'
    """The name of the peering object, where operators see each other."""

    stealth: bool = False
    """Whether to keep the keep-alives out of the logs (they are sent anyway)."""

    priority: int = 0
    """The operator's priority: operators with lower priorities pause while higher ones run."""

    lifetime: float = 60
    """For how long the operator's presence is valid without renewal, in seconds."""

    mandatory: bool = False
    """Whether the peering object must exist (otherwise, a missing one means the standalone mode)."""

    standalone: bool = False
    """Whether to run without peering at all."""

    clusterwide: bool = False
    """Whether the cluster-wide peering object is used (instead of a namespaced one)."""

    @property
    def namespaced(self) -> bool:
        """The opposite of ``clusterwide``, for convenience."""
        return not self.clusterwide

    @namespaced.setter
    def namespaced(self, value: bool) -> None:
        self.clusterwide = not value


@dataclasses.dataclass
class ElectionSettings:
    """
    The leader election with a ``coordination.k8s.io/v1`` Lease (beyond Kopf: no CRDs needed).

    Disabled unless ``lease_name`` is set (``kopf run --lease [NAMESPACE/]NAME``). Only the leader
    handles the objects. The timings are those of client-go's leader election.
    """

    lease_name: str | None = None
    """The name of the Lease to elect the leader with; None disables the election."""

    lease_namespace: str | None = None
    """The namespace of the Lease (None: ``default``)."""

    lease_duration: float = 15.0
    """How long the followers wait after the lease's last renewal before taking it over, in seconds."""

    renew_deadline: float = 10.0
    """How long a leader keeps handling while failing to renew the lease (less than the duration)."""

    retry_period: float = 2.0
    """How often the leader renews the lease, and the followers try to acquire it, in seconds."""


@dataclasses.dataclass
class ShardingSettings(CheckedFields):
    """
    The replicas split the objects among themselves through Leases (beyond Kopf; see the sharding engine).

    Disabled unless ``name`` is set (``kopf run --shards [NAMESPACE/]NAME``); it replaces the single-leader
    election (``settings.election``): only one of them can be used. An object belongs to one of ``count``
    virtual shards by the hash of its uid; every replica handles the objects of the shards it holds
    the Leases of (``NAME-shard-0`` …), and announces itself with a Lease of its own (``NAME-member-…``).
    The timings are as in ``settings.election``, per lease.
    """

    _section: ClassVar[str] = 'sharding'
    _checks: ClassVar[Mapping[str, Callable[[str, Any], None]]] = {
        'count': check_positive_integer,
        'lease_duration': _check_delay,
        'renew_deadline': _check_delay,
        'retry_period': _check_delay,
        'handover_timeout': _check_delay,
    }

    name: str | None = None
    """The prefix of the sharding's Leases (the members' & the shards'); None disables the sharding."""

    namespace: str | None = None
    """The namespace of the Leases (None: ``default``)."""

    count: int = 32
    """How many virtual shards the objects are split into (the same in all replicas; the most replicas)."""

    lease_duration: float = 15.0
    """How long the others wait after a lease's last renewal before taking it over, in seconds."""

    renew_deadline: float = 10.0
    """How long a replica keeps handling a shard while failing to renew its lease (less than the duration)."""

    retry_period: float = 2.0
    """How often a replica renews its leases and tries to take the free ones, in seconds."""

    handover_timeout: float = 10.0
    """How long a replica giving up shards waits for their objects' daemons to exit, in seconds
    (the objects' processing gets ``settings.queueing.exit_timeout``); then their leases are released."""


@dataclasses.dataclass
class MetricsSettings:
    """
    The framework's Prometheus metrics (beyond Kopf; needs the ``metrics`` extra: prometheus-client).

    Served if ``endpoint`` is set (``kopf run --metrics URL``), e.g. ``http://0.0.0.0:9090/metrics``;
    on the liveness endpoint's server if the host & port are the same. See the README's "Metrics".
    """

    endpoint: str | None = None
    """The URL to serve the metrics at (``http://HOST:PORT/PATH``); None: not served."""

    registry: Any = None
    """The ``prometheus_client.CollectorRegistry`` of the metrics (None: the global ``REGISTRY``),
    also for the operator's own metrics."""


@dataclasses.dataclass
class TracingSettings:
    """
    The framework's OpenTelemetry traces (beyond Kopf; needs the ``tracing`` extra: opentelemetry-api).

    What is recorded and where it goes is the application's SDK's business (the API's spans are no-ops
    without one). See the README's "Traces".
    """

    enabled: bool | None = None
    """Whether to make the spans: None (the default) means yes if the application has configured
    an OpenTelemetry SDK's tracer provider (or given one below) by the time the operator starts."""

    provider: Any = None
    """The ``TracerProvider`` to use (None: the global one, as set by the application's SDK)."""


@dataclasses.dataclass
class QueueingSettings(CheckedFields):
    _section: ClassVar[str] = 'queueing'
    _checks: ClassVar[Mapping[str, Callable[[str, Any], None]]] = {
        'processing_seats': check_positive_integer,
        'processing_reserve': _check_reserve,
    }

    worker_limit: int | None = None
    """How many objects can be processed in parallel (None: unlimited)."""

    idle_timeout: float = 5.0
    """How long an idle worker of a returning object waits for new events, in seconds (see the queueing)."""

    exit_timeout: float = 2.0
    """How long the workers are awaited on the operator's exit before being cancelled, in seconds."""

    error_delays: BackoffsSpec = (1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610)
    """Throttling of the framework's own errors per object: the delays after the 1st, 2nd, ... error."""

    _batch_window: float = 0.1

    # Beyond Kopf: after Kopf's fields, so that their positions are as in Kopf.
    processing_seats: int = 100
    """
    How many objects can be in the framework's own steps of their processing at once (beyond Kopf).

    The framework's own steps are parsing, detecting the causes, storing the progress, sending the API
    requests; the handlers, the sleeps and the waits for the API server are not: while they last (a handler
    or a request in flight for longer than ``settings.execution.lending_delay``, a sleep or a retry's backoff
    at once), the object lends its seat to another one. So this bounds the memory and the CPU's work of the
    bursts (e.g. the initial listing of thousands of objects), not the handlers' concurrency (that is
    ``worker_limit``) nor the API's (the client's request slots). Those returning go before the new ones.
    """

    processing_reserve: int | None = None
    """
    How many more objects may be let in beyond the seats while the seated ones wait for the API (beyond Kopf).

    When the API client's request slots are all taken (a busy API server), an object whose request waits for
    one lends its seat to a new object after ``settings.execution.lending_delay``, but only within this
    reserve: the objects let in are prepared and wait for the slots too, so the server always has the next
    request at hand. More objects in hand cost memory at the peak (their bodies, patches, causes). ``None``:
    9 per seat (900 with the default seats); ``0``: never more objects in hand than the seats (and those in
    flight); on a fast API server, the reserve is not used at all (``kopf_processing_reserve_used``).
    """

    @property
    def batch_window(self) -> float:
        """How long to wait for more events of an object after the first one (kept for compatibility)."""
        return self._batch_window

    @batch_window.setter
    def batch_window(self, value: float) -> None:
        self._batch_window = value


# The former name of the section, as some older docs still use it (``settings.batching``).
BatchingSettings = QueueingSettings


@dataclasses.dataclass
class ScanningSettings:
    disabled: bool = False
    """Whether to skip the runtime observation of namespaces and CRDs (serve only what is known at start)."""


@dataclasses.dataclass
class AdmissionSettings:
    server: Any = None
    """The webhook server or tunnel for the admission handlers (e.g. ``kopf.WebhookServer(...)``)."""

    managed: str | None = None
    """The name of the validating/mutating webhook configurations to maintain (None: not managed)."""


class ExecutionSettings:
    """
    How the synchronous handlers are executed: in a thread pool (the executor) of some size.

    The default executor is created on first use, so that merely creating the settings
    starts no threads. Setting ``max_workers`` replaces the executor with a new thread pool
    of that size; the handlers already running in the previous executor finish there.
    An executor created by the framework is then shut down (without waiting), an executor
    provided by the operator developer is left to them.
    """

    default_backoff: float
    """The delay between the retries of the handlers' arbitrary errors, unless the handler sets its own."""

    _executor: concurrent.futures.Executor | None
    _executor_is_own: bool
    _max_workers: int | None
    _lending_delay: float

    def __init__(
            self,
            *,
            default_backoff: float = 60,
            executor: concurrent.futures.Executor | None = None,
            max_workers: int | None = None,
            lending_delay: float = DEFAULT_LENDING_DELAY,
    ) -> None:
        super().__init__()
        self.default_backoff = default_backoff
        self._executor = executor
        self._executor_is_own = False
        self._max_workers = max_workers
        self.lending_delay = lending_delay

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(default_backoff={self.default_backoff!r}, '
                f'executor={self._executor!r}, max_workers={self._max_workers!r}, '
                f'lending_delay={self._lending_delay!r})')

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExecutionSettings):
            return NotImplemented
        return (
            self.default_backoff == other.default_backoff and
            self._max_workers == other._max_workers and
            self._lending_delay == other._lending_delay and
            self._executor is other._executor  # both not created yet, or the very same one
        )

    @property
    def lending_delay(self) -> float:
        """
        How long a handler or a timer's function keeps its seat before lending it to others, in seconds.

        The seats are those of ``settings.queueing.processing_seats`` (of the objects) and
        ``settings.background.timer_seats`` (of the timers' calls): the quick functions keep theirs and
        go on without waiting for a seat again; the slower ones let others into the framework's own steps
        meanwhile. 0 lends the seats at once (beyond Kopf).
        """
        return self._lending_delay

    @lending_delay.setter
    def lending_delay(self, value: float) -> None:
        _check_delay('settings.execution.lending_delay', value)
        self._lending_delay = value

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass sections are

    @property
    def executor(self) -> concurrent.futures.Executor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=self._max_workers)
            self._executor_is_own = True
        return self._executor

    @executor.setter
    def executor(self, executor: concurrent.futures.Executor) -> None:
        self._executor = executor
        self._executor_is_own = False

    @property
    def max_workers(self) -> int | None:
        """The size of the thread pool: as set, or None for Python's default (depends on the CPUs)."""
        return self._max_workers

    @max_workers.setter
    def max_workers(self, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f'max_workers must be a positive integer or None, got {value!r}.')
        previous, previous_is_own = self._executor, self._executor_is_own
        self._max_workers = value
        if previous is not None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=value)
            self._executor_is_own = True
            if previous_is_own:
                previous.shutdown(wait=False)


@dataclasses.dataclass
class BackgroundSettings(CheckedFields):
    _section: ClassVar[str] = 'background'
    _checks: ClassVar[Mapping[str, Callable[[str, Any], None]]] = {
        'timer_seats': check_positive_integer,
    }

    cancellation_polling: float = 60
    """How often to check if a non-cancellable daemon has exited, unless the daemon sets its own."""

    instant_exit_timeout: float | None = None
    """How long to wait for the daemons to exit on the operator's exit before proceeding (None: as usual)."""

    instant_exit_zero_time_cycles: int = 10
    """How many event-loop cycles to give the daemons to exit instantly on the operator's exit."""

    timer_seats: int = 400
    """
    How many timers' calls can be in the framework's own hands at once (beyond Kopf).

    A call is in the hands from its start until its function is called, and from the function's end until
    the call is over (its patch applied, but not during the retries' backoffs); also while its function
    runs, but only for as long as ``settings.execution.lending_delay``.
    The timers due beyond this wait in line (no tasks for them), so that e.g. 10,000 timers due at once do
    not make 10,000 calls waiting for the API. The slow functions are not limited: they leave the hands
    while they run.
    """


@dataclasses.dataclass
class PersistenceSettings:
    finalizer: str = 'kopf.zalando.org/KopfFinalizerMarker'
    """The finalizer that blocks the objects' deletion until the deletion handlers and daemons are done."""

    progress_storage: progress.ProgressStorage = dataclasses.field(
        default_factory=progress.SmartProgressStorage)
    """Where the handlers' progress (retries, successes, failures) is stored on the objects."""

    diffbase_storage: diffbase.DiffBaseStorage = dataclasses.field(
        default_factory=diffbase.AnnotationsDiffBaseStorage)
    """Where the last handled state of the objects (the base for the diffs) is stored."""

    consistency_timeout: float = 5.0
    """How long to wait for our own patches to arrive via the watch-stream before handling anyway."""


@dataclasses.dataclass
class OperatorSettings:
    """All the settings of one operator, by sections; see each section for its fields."""

    process: ProcessSettings = dataclasses.field(default_factory=ProcessSettings)
    posting: PostingSettings = dataclasses.field(default_factory=PostingSettings)
    peering: PeeringSettings = dataclasses.field(default_factory=PeeringSettings)
    watching: WatchingSettings = dataclasses.field(default_factory=WatchingSettings)
    queueing: QueueingSettings = dataclasses.field(default_factory=QueueingSettings)
    scanning: ScanningSettings = dataclasses.field(default_factory=ScanningSettings)
    admission: AdmissionSettings = dataclasses.field(default_factory=AdmissionSettings)
    execution: ExecutionSettings = dataclasses.field(default_factory=ExecutionSettings)
    background: BackgroundSettings = dataclasses.field(default_factory=BackgroundSettings)
    networking: NetworkingSettings = dataclasses.field(default_factory=NetworkingSettings)
    persistence: PersistenceSettings = dataclasses.field(default_factory=PersistenceSettings)
    election: ElectionSettings = dataclasses.field(default_factory=ElectionSettings)  # beyond Kopf: last
    metrics: MetricsSettings = dataclasses.field(default_factory=MetricsSettings)  # beyond Kopf
    tracing: TracingSettings = dataclasses.field(default_factory=TracingSettings)  # beyond Kopf
    sharding: ShardingSettings = dataclasses.field(default_factory=ShardingSettings)  # beyond Kopf

    @property
    def batching(self) -> QueueingSettings:
        """The former name of ``queueing``: the same section object."""
        return self.queueing

    @batching.setter
    def batching(self, value: QueueingSettings) -> None:
        self.queueing = value

