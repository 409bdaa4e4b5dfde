"""
Leader election with a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does it.

Beyond Kopf: no CRDs are needed (Leases are built into Kubernetes), and a dead leader blocks the others
only for one lease duration (15 s by default) rather than for a peering lifetime (60 s by default).
Only the leader handles the objects; the followers wait, trying to acquire the lease every retry period.

The rules (``settings.election``):

* The lease's ``spec`` has the holder's identity, the lease duration, the times of acquiring & renewing,
  the number of transitions. A leader renews it every ``retry_period`` seconds.
* A follower considers the lease expired if its record has not changed for ``lease_duration`` seconds
  **as measured by the follower's own clock** since it saw the record change (the holder's timestamps
  are never compared with the local clock: the clocks of the nodes may differ). An expired or released
  lease (no holder) is taken over with an update guarded by ``resourceVersion``: of several followers,
  only one wins (the others get HTTP 409 and keep following).
* A leader that cannot renew for ``renew_deadline`` seconds since its last successful renewal stops
  handling (the gate is closed) before its lease can expire for the others (``renew_deadline`` is less
  than ``lease_duration``), so no two leaders ever handle the objects at once.
* On a graceful exit, the leader releases the lease (the holder becomes empty) after it has stopped
  handling, so that a follower takes over at its next attempt, without waiting for the expiry.

One lease's part of these rules (observing the record on the local clock, acquiring, renewing, releasing)
is :class:`LeaseLock`: the election holds one, the sharding (:mod:`.sharding`) one per shard & member.
"""
import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Iterator, Mapping
from types import EllipsisType
from typing import Any

from kopf._clients import coordination, creating, errors, fetching
from kopf._clients.vault import Vault
from kopf._cogs.aiokits import aiotasks
from kopf._cogs.aiokits.backoffs import BackoffsSpec
from kopf._cogs.helpers import metering
from kopf._cogs.structs.bodies import RawBody
from kopf._cogs.structs.references import Resource
from kopf._core.engines.gating import GateBlocker
from kopf._core.intents.configuration import ElectionSettings, OperatorSettings

logger = logging.getLogger(__name__)

__all__ = ['LEASE_RESOURCE', 'TRANSIENT_ERRORS', 'LeaseElection', 'LeaseLock', 'parse_lease_reference']

LEASE_RESOURCE = Resource('coordination.k8s.io', 'v1', 'leases', kind='Lease', namespaced=True)

# How long the exit may take to release the lease (even a forced exit waits for it).
RELEASE_TIMEOUT = 3.0

# How many times the release is tried when the record changes meanwhile (HTTP 409), e.g. by our own renewal.
RELEASE_ATTEMPTS = 3

# The errors after which the attempt is repeated later (not a reason for the operator to fail).
TRANSIENT_ERRORS = (errors.APIServerError, errors.APIConflictError, errors.APITooManyRequestsError,
                     asyncio.TimeoutError, ConnectionError)  # incl. the client's network errors


def parse_lease_reference(value: str) -> tuple[str | None, str]:
    """``NAME`` or ``NAMESPACE/NAME`` (as given to ``kopf run --lease``) → (namespace or None, name)."""
    namespace, _, name = value.rpartition('/')
    if not name or '/' in namespace:
        raise ValueError(f'{value!r} is not a lease reference: expected NAME or NAMESPACE/NAME.')
    return namespace or None, name


def format_micro_time(value: datetime.datetime) -> str:
    # The MicroTime of Kubernetes: RFC 3339 with exactly 6 fractional digits, in UTC.
    return value.astimezone(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')


@dataclasses.dataclass
class _Observation:
    """The latest lease record seen, and when it was seen changing (on the local monotonic clock)."""

    record: tuple[Any, ...]
    observed_at: float


class LeaseLock:
    """
    One Lease as one identity's lock: its record observed on the local clock, acquired, renewed, released.

    It holds no state of the holding beyond the last observation: whether & since when the caller holds
    the lease (and the renewal deadline) is the caller's business. ``labels`` go to the created leases
    (e.g. to list the sharding's leases by a selector).
    """

    def __init__(self, *, settings: OperatorSettings, vault: Vault, namespace: str, name: str,
                 identity: str, lease_duration: float, labels: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.vault = vault
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.labels = dict(labels or {})
        self.holder: str | None = None  # another holder of the lease as last seen (None: none or us)
        self._observation: _Observation | None = None

    def __str__(self) -> str:
        return f'{self.namespace}/{self.name}'

    def observe(self, lease: Mapping[str, Any], now_monotonic: float) -> bool:
        """
        Remember the lease's record as seen at that moment; whether it is ours to take or keep now.

        It is ours if we hold it, if it has no holder (released), or if its record has not changed for
        its duration **on our own clock** since we saw it change (expired); otherwise, it is another's.
        """
        spec: Mapping[str, Any] = lease.get('spec') or {}
        holder = spec.get('holderIdentity') or ''
        duration = spec.get('leaseDurationSeconds') or self.lease_duration
        record = (holder, spec.get('renewTime'), spec.get('acquireTime'), spec.get('leaseTransitions'),
                  spec.get('leaseDurationSeconds'))
        if self._observation is None or self._observation.record != record:
            self._observation = _Observation(record=record, observed_at=now_monotonic)
        held_by_other = bool(holder) and holder != self.identity
        self.holder = holder if held_by_other else None
        return not held_by_other or now_monotonic >= self._observation.observed_at + float(duration)

    async def read(self) -> RawBody | None:
        """The lease as it is now; None if it does not exist. The errors escalate (no retries)."""
        try:
            return await fetching.read_obj(settings=self.settings, vault=self.vault, resource=LEASE_RESOURCE,
                                           namespace=self.namespace, name=self.name, backoffs=(),
                                           logger=logger)
        except errors.APINotFoundError:
            return None

    async def try_acquire_or_renew(
            self, now_monotonic: float, lease: Mapping[str, Any] | EllipsisType | None = ...,
    ) -> bool:
        """
        True if we hold the lease now; False if another holder does; errors escalate.

        ``lease`` is its body as just seen (e.g. in a listing; None if it does not exist), or else it is read.
        """
        if lease is ...:
            lease = await self.read()
        if lease is None:
            now = datetime.datetime.now(datetime.UTC)
            metadata: dict[str, Any] = {'name': self.name, 'namespace': self.namespace}
            if self.labels:
                metadata['labels'] = self.labels
            body = {'apiVersion': 'coordination.k8s.io/v1', 'kind': 'Lease', 'metadata': metadata,
                    'spec': self._make_spec(now, acquired_at=now, transitions=0)}
            try:
                await creating.create_obj(settings=self.settings, vault=self.vault, resource=LEASE_RESOURCE,
                                          namespace=self.namespace, body=body, backoffs=(), logger=logger)
            except errors.APIConflictError:
                self.holder = None  # created by another one meanwhile: who it is is seen next time
                return False
            return True

        if not self.observe(lease, now_monotonic):
            return False

        spec: Mapping[str, Any] = lease.get('spec') or {}
        holder = spec.get('holderIdentity') or ''
        now = datetime.datetime.now(datetime.UTC)
        transitions = int(spec.get('leaseTransitions') or 0)
        if holder == self.identity and spec.get('acquireTime'):
            new_spec = {**self._make_spec(now, acquired_at=None, transitions=transitions),
                        'acquireTime': spec['acquireTime']}
        else:
            new_spec = self._make_spec(now, acquired_at=now, transitions=transitions + 1)
        try:
            await self._replace(lease, new_spec, backoffs=())
        except errors.APIConflictError:
            return False  # changed by another one meanwhile: it probably holds the lease now
        return True

    def _make_spec(self, now: datetime.datetime, *, acquired_at: datetime.datetime | None,
                   transitions: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            'holderIdentity': self.identity,
            'leaseDurationSeconds': max(1, round(self.lease_duration)),
            'renewTime': format_micro_time(now),
            'leaseTransitions': transitions,
        }
        if acquired_at is not None:
            spec['acquireTime'] = format_micro_time(acquired_at)
        return spec

    async def _replace(self, lease: Mapping[str, Any], spec: Mapping[str, Any], *,
                       backoffs: BackoffsSpec | None = None) -> None:
        old_metadata: Mapping[str, Any] = lease.get('metadata') or {}
        metadata: dict[str, Any] = {'name': self.name, 'namespace': self.namespace,
                                    'resourceVersion': old_metadata.get('resourceVersion')}
        labels = old_metadata.get('labels') or self.labels
        if labels:
            metadata['labels'] = labels
        body = {'apiVersion': 'coordination.k8s.io/v1', 'kind': 'Lease', 'metadata': metadata, 'spec': spec}
        await coordination.replace(settings=self.settings, vault=self.vault, resource=LEASE_RESOURCE,
                                   namespace=self.namespace, name=self.name, body=body, backoffs=backoffs,
                                   logger=logger)

    async def release_in_time(self, *, failures: list[str] | None = None) -> bool:
        """
        Release the lease in :data:`RELEASE_TIMEOUT` (or give up: it expires then); whether released.

        The failure is logged, or (with ``failures``) added there, for the caller to say them all in one line.
        """
        try:
            return await asyncio.wait_for(self.release(failures=failures), timeout=RELEASE_TIMEOUT)
        except TimeoutError:
            _fail(failures, f'Failed to release the lease {self} in {RELEASE_TIMEOUT}s; '
                            f'the followers take it over when it expires.')
            return False

    async def release(self, *, failures: list[str] | None = None) -> bool:
        """Give the lease away (no holder), so that another one takes it over at once; whether released."""
        for attempt in range(RELEASE_ATTEMPTS):
            try:
                lease = await fetching.read_obj(settings=self.settings, vault=self.vault,
                                                resource=LEASE_RESOURCE, namespace=self.namespace,
                                                name=self.name, logger=logger)
                spec = dict(lease.get('spec') or {})
                if spec.get('holderIdentity') != self.identity:
                    return False  # taken over already: nothing to release
                now = format_micro_time(datetime.datetime.now(datetime.UTC))
                spec.update(holderIdentity='', leaseDurationSeconds=1, renewTime=now, acquireTime=now)
                await self._replace(lease, spec)
            except errors.APIConflictError as e:
                if attempt + 1 < RELEASE_ATTEMPTS:
                    continue  # e.g. renewed by us meanwhile: read the new record
                _fail(failures, f'Failed to release the lease {self}: {errors.describe_error(e)}')
            except (errors.APIError, *TRANSIENT_ERRORS) as e:
                _fail(failures, f'Failed to release the lease {self}: {errors.describe_error(e)}')
            else:
                return True
            break
        return False


class LeaseElection:
    """One operator's participation in one lease's election (see the module's description)."""

    def __init__(self, *, settings: OperatorSettings, vault: Vault, identity: str,
                 blocker: GateBlocker) -> None:
        super().__init__()
        self.settings = settings
        self.vault = vault
        self.identity = identity
        self.blocker = blocker
        self.leading = False
        self._lock: LeaseLock | None = None
        self._renewed_at: float | None = None  # the start of the latest successful acquiring/renewing
        self._followed: str | None = None  # the holder that this follower has said it waits for

    @property
    def _election(self) -> ElectionSettings:
        return self.settings.election

    @property
    def namespace(self) -> str:
        return self._election.lease_namespace or 'default'

    @property
    def name(self) -> str:
        name = self._election.lease_name
        if not name:
            raise ValueError('The lease election needs a lease name: settings.election.lease_name.')
        return name

    @property
    def lock(self) -> LeaseLock:
        """The lease as a lock (made on first use: the settings can change until the operator starts)."""
        if self._lock is None or (self._lock.namespace, self._lock.name) != (self.namespace, self.name):
            self._lock = LeaseLock(settings=self.settings, vault=self.vault, namespace=self.namespace,
                                   name=self.name, identity=self.identity,
                                   lease_duration=self._election.lease_duration)
        self._lock.lease_duration = self._election.lease_duration
        return self._lock

    def __str__(self) -> str:
        return f'{self.namespace}/{self.name}'

    async def run(self) -> None:
        """Elect or follow until cancelled; release the lease if leading at the exit."""
        loop = asyncio.get_running_loop()
        meters = metering.meters  # the lease's status as a gauge, read when scraped
        unmeter = meters.add_gauges(self._gauges) if meters is not None else None
        try:
            while True:
                started = loop.time()
                await self._attempt()
                await asyncio.sleep(max(0.0, started + self._election.retry_period - loop.time()))
        finally:
            if unmeter is not None:
                unmeter()
            if self.leading:
                self._stop_leading('the operator is exiting')
                # Even in a forced exit (a second Ctrl+C): a follower takes over at once, not at the expiry.
                await aiotasks.finish_uninterrupted(self._release_in_time())

    async def _release_in_time(self) -> None:
        if await self.lock.release_in_time():
            logger.info(f'Released the lease {self}.')

    def _gauges(self) -> Iterator[tuple[str, dict[str, str], float]]:
        yield 'kopf_leader_election_master_status', {'name': str(self)}, 1.0 if self.leading else 0.0

    async def _attempt(self) -> None:
        """One round: acquire or renew; stop leading if the renewal deadline is over."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        # A leader's attempt never lasts beyond its deadline: it must stop handling before the others start.
        leading_since = self._renewed_at if self.leading else None
        deadline = leading_since + self._election.renew_deadline if leading_since is not None else None
        try:
            async with asyncio.timeout_at(deadline):
                acquired = await self.lock.try_acquire_or_renew(started)
        except TRANSIENT_ERRORS as e:
            acquired = None
            if self.leading:
                logger.warning(f'Failed to renew the lease {self}: {errors.describe_error(e)}')
            else:
                logger.debug(f'Failed to acquire the lease {self}: {errors.describe_error(e)}')

        if acquired:
            self._renewed_at = started
            self._followed = None
            if not self.leading:
                self.leading = True
                logger.info(f'Became the leader of the lease {self}: handling the objects.')
                self.blocker.unblock()
        elif acquired is not None and self.leading:
            self._stop_leading('the lease is taken by another operator')
        elif self.leading and self._renewed_at is not None and \
                loop.time() >= self._renewed_at + self._election.renew_deadline:
            self._stop_leading(f'the lease could not be renewed for {self._election.renew_deadline}s')
        elif not self.leading:
            self.blocker.block()  # a follower: decided (for the operator's readiness), nothing changes
            holder = self.lock.holder
            if acquired is not None and holder and holder != self._followed:
                self._followed = holder
                logger.info(f'Waiting for the lease {self}: it is held by {holder!r}; '
                            f'handling nothing until it is released or expires.')

    def _stop_leading(self, reason: str) -> None:
        self.leading = False
        self._renewed_at = None
        self.blocker.block()
        logger.warning(f'Stopped leading the lease {self}: {reason}.')


def _fail(failures: list[str] | None, message: str) -> None:
    if failures is None:
        logger.warning(message)
    else:
        failures.append(message)
