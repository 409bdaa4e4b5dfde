"""
Settings sections used by the API client: ``settings.networking`` and ``settings.watching``.

They live here, at the bottom of the stack, so that the client can be used without the core;
``kopf.OperatorSettings`` in kopf-core composes them with its own sections.
"""
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Protocol

from kopf._cogs.aiokits.backoffs import BackoffsSpec
from kopf._cogs.configs.checks import CheckedFields, check_positive_integer

__all__ = [
    'MAX_CONCURRENT_REQUESTS',
    'BackoffsSpec',
    'ClientSettings',
    'NetworkingSettings',
    'SelectorMapping',
    'StandaloneClientSettings',
    'WatchingSettings',
    'get_selectors',
]


class SelectorMapping(dict[Any, Any]):
    """
    Server-side selectors per resource: keys are resource names (plural, ``plural.group``, kind,
    singular, short names) or :data:`kopf.EVERYTHING`; values are selector strings or mappings.
    The API client uses the first key that matches a resource when it lists and watches it.
    """


# The default of ``settings.networking.max_concurrent_requests`` (see there); also aiohttp's default limit of
# connections.
MAX_CONCURRENT_REQUESTS = 100


@dataclasses.dataclass
class NetworkingSettings(CheckedFields):
    _section: ClassVar[str] = 'networking'
    _checks: ClassVar[Mapping[str, Callable[[str, Any], None]]] = {
        'max_concurrent_requests': check_positive_integer,
    }

    request_timeout: float | None = 5 * 60
    """How long a regular (non-watching) request may take in total, in seconds."""

    connect_timeout: float | None = None
    """How long a TCP/TLS handshake of a regular request may take, in seconds."""

    error_backoffs: BackoffsSpec = (1, 1, 2, 3, 5, 8, 13, 21)
    """Delays between retries of network errors and HTTP 5xx/429; one more attempt than delays."""

    enforce_retry_after: bool = False
    """If true, 429's Retry-After is used as is; if false, the longer of it and our own backoff."""

    trust_env: bool = False
    """Whether the HTTP client respects proxy environment variables and ~/.netrc."""

    max_concurrent_requests: int = MAX_CONCURRENT_REQUESTS
    """
    How many regular requests can be in flight at once per credential (beyond Kopf); the rest wait in line.

    The watch-streams are not counted. A burst of requests (e.g. thousands of objects at the start) then
    reuses this many keep-alive connections at most instead of opening thousands of new ones (costly on both
    sides), and the API server gets them at a pace it can serve;
    a small or loaded server may serve fewer at once better. As many as the processing's seats by default
    (``settings.queueing.processing_seats``), so that a seated object does not also wait for a slot.
    """


@dataclasses.dataclass
class WatchingSettings:
    server_timeout: float | None = None
    """The ``timeoutSeconds`` sent to the server for watch requests (None: the server decides)."""

    client_timeout: float | None = None
    """The total client-side limit of one watch request (None: forever)."""

    connect_timeout: float | None = None
    """The handshake timeout of watch requests (None: ``networking.connect_timeout``)."""

    reconnect_backoff: float = 0.1
    """A pause between consecutive watch requests, so that errors do not flood the API."""

    inactivity_timeout: float = 70.0
    """How long a watch stream may stay silent (no events, no bookmarks) before it is reconnected."""

    chunk_size: int | None = None
    """
    The ``limit`` of list requests: objects are listed page by page (None: all at once).

    All at once, the whole response and all its parsed objects are in memory together at the start
    (the peak RSS of a big cluster); pages keep only one page's response and objects at a time: the
    operator handles each page's objects as it comes.
    """

    initial_streaming: bool = False
    """
    Use the streaming list (``sendInitialEvents=true``) instead of list-then-watch.

    The objects come as the watch-stream's first events, each parsed on its own: no big response at
    the start (the lowest peak RSS of a big cluster). Kubernetes serves it by default since 1.34 (the
    ``WatchList`` feature); where the server refuses it, the watcher falls back to list-then-watch
    with a warning.
    """

    label_selectors: SelectorMapping = dataclasses.field(default_factory=SelectorMapping)
    """Label selectors to send to the server when listing and watching specific resources."""

    field_selectors: SelectorMapping = dataclasses.field(default_factory=SelectorMapping)
    """Field selectors to send to the server when listing and watching specific resources."""

    shard_selectors: SelectorMapping = dataclasses.field(default_factory=SelectorMapping)
    """Extra label selectors to split the objects of a resource between several operators."""


class ClientSettings(Protocol):
    """What the API client needs from settings: ``kopf.OperatorSettings`` conforms to it."""

    @property
    def networking(self) -> NetworkingSettings: ...

    @property
    def watching(self) -> WatchingSettings: ...


@dataclasses.dataclass
class StandaloneClientSettings:
    """Settings for using the API client alone, without the core's ``kopf.OperatorSettings``."""

    networking: NetworkingSettings = dataclasses.field(default_factory=NetworkingSettings)
    watching: WatchingSettings = dataclasses.field(default_factory=WatchingSettings)


def get_selectors(mapping: Mapping[Any, Any], names: Iterable[str]) -> Any:
    """Find the first selector in a mapping whose key is one of the given names, or None."""
    for name in names:
        if name in mapping:
            return mapping[name]
    return None
