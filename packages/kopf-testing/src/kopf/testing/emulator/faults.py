"""
Request accounting and fault injection: what tests use to observe and to disturb an operator.

Both are safe to use from any thread: the emulator may serve in its own thread while a test
configures faults or reads the counters from another.
"""

import collections
import dataclasses
import re
import threading
import time
from typing import NamedTuple


class RequestKey(NamedTuple):
    """What a request did, as counted: the verb and the object (or collection) it addressed."""

    verb: str  # get, list, watch, create, update, patch, delete, deletecollection; "discovery" otherwise
    group: str
    resource: str  # the plural name; empty for non-resource requests
    subresource: str  # e.g. "status"; empty if none
    namespace: str  # empty for cluster-scoped objects and cluster-wide requests
    name: str  # empty for collections


class RequestCounter:
    """
    Counts the API requests by verb and by the addressed object.

    ``count()`` sums the requests matching all given criteria, e.g.
    ``count('patch', 'kopfexamples', name='kex1')``: the PATCH requests to one object.

    ``first_at()`` and ``last_at()`` tell when (in ``time.monotonic()`` terms) the first and the
    last counted request of a verb (or of any verb) arrived: e.g. a benchmark's handling window
    without polling for it.
    """

    def __init__(self) -> None:
        self._counts: collections.Counter[RequestKey] = collections.Counter()
        self._first_at: dict[str, float] = {}
        self._last_at: dict[str, float] = {}

    def record(self, key: RequestKey) -> None:
        now = time.monotonic()
        self._counts[key] += 1
        self._first_at.setdefault(key.verb, now)
        self._first_at.setdefault('', now)
        self._last_at[key.verb] = self._last_at[''] = now

    def reset(self) -> None:
        self._counts.clear()
        self._first_at.clear()
        self._last_at.clear()

    def first_at(self, verb: str | None = None) -> float | None:
        """When the first request of this verb (of any verb if ``None``) arrived; ``None`` if none."""
        return self._first_at.get(verb or '')

    def last_at(self, verb: str | None = None) -> float | None:
        """When the latest request of this verb (of any verb if ``None``) arrived; ``None`` if none."""
        return self._last_at.get(verb or '')

    def snapshot(self) -> dict[RequestKey, int]:
        return dict(self._counts)  # copying is atomic in CPython, unlike iterating

    @property
    def total(self) -> int:
        return sum(self.snapshot().values())

    def by_verb(self) -> dict[str, int]:
        result: collections.Counter[str] = collections.Counter()
        for key, count in self.snapshot().items():
            result[key.verb] += count
        return dict(result)

    def count(
        self,
        verb: str | None = None,
        resource: str | None = None,
        *,
        group: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> int:
        """
        The number of requests that match all the given criteria (``None`` matches anything).

        ``resource`` is a plural name, optionally with the group: ``kopfexamples.kopf.dev``.
        """
        if resource is not None and group is None and '.' in resource:
            resource, group = resource.split('.', 1)
        return sum(
            count
            for key, count in self.snapshot().items()
            if (verb is None or key.verb == verb)
            and (resource is None or key.resource == resource)
            and (group is None or key.group == group)
            and (namespace is None or key.namespace == namespace)
            and (name is None or key.name == name)
            and (subresource is None or key.subresource == subresource)
        )


@dataclasses.dataclass
class _Filter:
    method: str | None
    verb: str | None
    path: re.Pattern[str] | None

    def matches(self, method: str, verb: str, path: str) -> bool:
        return (
            (self.method is None or self.method == method)
            and (self.verb is None or self.verb == verb)
            and (self.path is None or self.path.search(path) is not None)
        )


@dataclasses.dataclass
class InjectedFailure:
    """A planned failure of the requests matching a filter, for a number of times or until cleared."""

    filter: _Filter
    remaining: int | None
    status: int
    retry_after: float | None
    message: str
    raw_body: bytes | None = None  # served as is (e.g. an HTML page of a proxy) instead of a Status


@dataclasses.dataclass
class InjectedLatency:
    filter: _Filter
    remaining: int | None
    seconds: float
    after_applying: bool = False  # the request is served at once, its response is delayed


class FaultInjector:
    """Planned failures and latencies, consumed by the requests that match them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: list[InjectedFailure] = []
        self._latencies: list[InjectedLatency] = []
        # The bearer tokens accepted (others get 401), as after a rotation; None: any credentials.
        self.accepted_tokens: frozenset[str] | None = None

    def rejects(self, authorization: str | None) -> bool:
        """Whether a request with this ``Authorization`` header must be rejected with 401."""
        if self.accepted_tokens is None:
            return False
        scheme, _, token = (authorization or '').partition(' ')
        return scheme.lower() != 'bearer' or token.strip() not in self.accepted_tokens

    @property
    def armed(self) -> bool:
        """A fast check for the request path: whether there is anything to inject at all."""
        return bool(self._failures or self._latencies)

    def add_failure(
        self,
        *,
        count: int | None,
        status: int,
        method: str | None,
        verb: str | None,
        path: str | None,
        retry_after: float | None,
        message: str | None,
        raw_body: bytes | None = None,
    ) -> None:
        message = message or f'the emulator injected a failure with HTTP {status}'
        failure = InjectedFailure(
            _make_filter(method, verb, path), count, status, retry_after, message, raw_body
        )
        with self._lock:
            self._failures.append(failure)

    def add_latency(
        self,
        *,
        seconds: float,
        count: int | None,
        method: str | None,
        verb: str | None,
        path: str | None,
        after_applying: bool = False,
    ) -> None:
        latency = InjectedLatency(_make_filter(method, verb, path), count, seconds, after_applying)
        with self._lock:
            self._latencies.append(latency)

    def clear(self) -> None:
        with self._lock:
            self._failures.clear()
            self._latencies.clear()

    def take_latency(self, method: str, verb: str, path: str) -> tuple[float, float]:
        """The delays of the request (before serving it) and of its response (after applying it)."""
        before = after = 0.0
        with self._lock:
            for latency in list(self._latencies):
                if latency.filter.matches(method, verb, path):
                    if latency.after_applying:
                        after += latency.seconds
                    else:
                        before += latency.seconds
                    if latency.remaining is not None:
                        latency.remaining -= 1
                        if latency.remaining <= 0:
                            self._latencies.remove(latency)
        return before, after

    def take_failure(self, method: str, verb: str, path: str) -> InjectedFailure | None:
        with self._lock:
            for failure in self._failures:
                if failure.filter.matches(method, verb, path):
                    if failure.remaining is not None:
                        failure.remaining -= 1
                        if failure.remaining <= 0:
                            self._failures.remove(failure)
                    return failure
        return None


def _make_filter(method: str | None, verb: str | None, path: str | None) -> _Filter:
    return _Filter(method.upper() if method else None, verb, re.compile(path) if path is not None else None)
