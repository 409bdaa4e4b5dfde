"""
Sharding: the replicas of one operator split the objects among themselves through Leases (beyond Kopf).

Turned on by ``settings.sharding.name`` (``kopf run --shards [NAMESPACE/]NAME``); it replaces the single
leader of the Lease election (:mod:`.leadership`). The rules:

* An object's place: the 64-bit FNV-1a hash of its ``metadata.uid`` (the UTF-8 bytes of the string);
  shard ``i`` of ``count`` (``settings.sharding.count``, 32 by default: as many replicas at most) covers
  the hashes in ``[i * 2**64 / count, (i + 1) * 2**64 / count)``. The objects without uids are everyone's.
* Every live replica announces itself with a member Lease of its own (``NAME-member-…``, its identity as
  the holder), renewed every retry period. A member whose lease has not changed for its duration on our own
  clock is dead (its lease is then deleted, guarded by its ``resourceVersion``); a replica that exits
  gracefully deletes its own.
* Every shard is guarded by its own Lease (``NAME-shard-i``) with the election's semantics
  (:class:`~.leadership.LeaseLock`): the expiry by the follower's own clock, a renew deadline shorter
  than the duration (a holder that cannot renew in time stops handling the shard before the others
  could take it), the release on exit. A take in flight at the exit is not abandoned: the exit waits for
  its answer (as long as for a release), then releases what it has got.
* A replica's fair share: the shards split evenly among the live members sorted by their identities
  (the first ``count % members`` get one shard more). A replica takes the free (released, expired, never
  created) shards up to its share and gives up those above it: it stops handling them at once, lets their
  objects' processing finish and their daemons & timers exit (bounded: see :class:`Handover`), and
  then releases their leases, so that the next holder takes them at its next attempt, not at the expiry.
* A replica handles an object only while it holds the lease of the object's shard: the queueing drops
  the events of the other objects as the first thing (:class:`ShardFilter`, a cached hash per uid).
* It also asks the API server only for the objects of its shards: the lists & watches carry the
  ``shardSelector`` of the held shards' ranges of the hashes (KEP-5866, Kubernetes 1.36+ with the feature gate
  ``ShardedListAndWatch``; the adjacent shards merged into one range). The servers without it ignore it
  silently: the filter above does it all then. It is kept with the servers that filter, too: the held shards
  change while a watch-stream runs with the selector of its start (until its restart), the servers do not
  confirm the filtering of custom resources (no ``shardInfo`` in their lists, as of 1.37), and it costs
  a dict lookup per event that reaches the replica (few then).
  When shards are gained, the watch-streams start anew, so that the gained objects are listed and
  processed as if new (nothing done before is redone: the progress is stored on the objects).
  When shards are lost, the objects' memories are forgotten (their daemons & timers stopped).

All the sharding's leases are labelled ``kopf.dev/sharding=NAME``: one listing per round sees them all,
and ``kubectl get leases -l kopf.dev/sharding=NAME`` shows who holds what. A replica reports its part
in its metrics (``kopf_shards_held``, ``kopf_shard_members``, ``kopf_shard_handovers_total``) and in its
liveness endpoint's JSON (under ``kopf.sharding``: see :meth:`Sharding.status`).
"""
import asyncio
import dataclasses
import logging
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from types import EllipsisType
from typing import Any, Protocol

from kopf._clients import coordination, deleting, errors
from kopf._clients.vault import Vault
from kopf._cogs.aiokits import aiotasks
from kopf._cogs.helpers import metering
from kopf._core.engines.gating import GateBlocker
from kopf._core.engines.leadership import LEASE_RESOURCE, RELEASE_TIMEOUT, TRANSIENT_ERRORS, LeaseLock
from kopf._core.intents.configuration import OperatorSettings, ShardingSettings

logger = logging.getLogger(__name__)

__all__ = ['Handover', 'ShardFilter', 'Sharding', 'fair_share', 'fnv1a_64', 'shard_of', 'shard_of_hash',
           'shard_ranges', 'shard_selector', 'shard_start']

SHARDING_LABEL = 'kopf.dev/sharding'  # the sharding's name, on all its leases
ROLE_LABEL = 'kopf.dev/sharding-role'  # "member" or "shard"
COUNT_LABEL = 'kopf.dev/sharding-count'  # on the members' leases: the count of shards they use

_FNV_OFFSET = 0xcbf29ce484222325
_FNV_PRIME = 0x100000001b3
_MASK = (1 << 64) - 1

# The uids whose shards are remembered (then forgotten all at once): most events of foreign objects
# cost a dict lookup, not a hash of 36 bytes in Python (~3 µs).
FILTER_CACHE_SIZE = 100_000

# More ranges than this make a too long URL (~70 characters each): then, the server is asked for everything.
# With the default 32 shards, there are at most 16 ranges (every other shard held).
MAX_SELECTOR_RANGES = 64


def fnv1a_64(text: str) -> int:
    """The 64-bit FNV-1a hash of the text's UTF-8 bytes."""
    value = _FNV_OFFSET
    for byte in text.encode('utf-8'):
        value = ((value ^ byte) * _FNV_PRIME) & _MASK
    return value


def shard_of(uid: str, count: int) -> int:
    """The shard of the object with this uid, of ``count`` shards."""
    return shard_of_hash(fnv1a_64(uid), count)


def shard_of_hash(value: int, count: int) -> int:
    """The shard ``i`` of ``count`` whose ``[i * 2**64 / count, (i+1) * 2**64 / count)`` has the hash."""
    return (value * count) >> 64


def shard_start(shard: int, count: int) -> int:
    """The least hash of the shard ``shard`` of ``count`` (a shard ends where the next one starts)."""
    return -((-shard << 64) // count)  # the ceiling: the least value whose shard_of_hash() is this shard


def shard_ranges(shards: Iterable[int], count: int) -> list[tuple[int, int]]:
    """The ranges ``[start, end)`` of the hashes of these shards, the adjacent shards merged into one."""
    ranges: list[tuple[int, int]] = []
    for shard in sorted(set(shards)):
        start, end = shard_start(shard, count), shard_start(shard + 1, count)
        if ranges and ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((start, end))
    return ranges


def shard_selector(shards: Collection[int], count: int) -> str | None:
    """
    The ``shardSelector`` of the lists & watches for these shards (KEP-5866); None for no server-side one.

    None for all the shards (nothing to filter), or for too many ranges (see ``MAX_SELECTOR_RANGES``).
    No shards: a range of one hash value (``[0, 1)``; an empty range is invalid): the filter drops the rest.
    """
    ranges = shard_ranges(shards, count) if shards else [(0, 1)]
    if ranges == [(0, 1 << 64)] or len(ranges) > MAX_SELECTOR_RANGES:
        return None
    return ' || '.join(f"shardRange(object.metadata.uid, '0x{start:016x}', '0x{end:016x}')"
                       for start, end in ranges)


def fair_share(identity: str, members: Iterable[str], count: int) -> int:
    """How many shards this member should hold: an even split by the sorted identities (itself included)."""
    ordered = sorted({*members, identity})
    base, extra = divmod(count, len(ordered))
    return base + (1 if ordered.index(identity) < extra else 0)


def member_lease_name(prefix: str, identity: str) -> str:
    """The member's lease: the identity made a DNS name (lowercase, dashes), with its hash for uniqueness."""
    slug = re.sub(r'[^a-z0-9]+', '-', identity.lower()).strip('-')[:40].strip('-')
    return f'{prefix}-member-{slug}-{fnv1a_64(identity) & 0xffffffff:08x}' if slug else \
        f'{prefix}-member-{fnv1a_64(identity) & 0xffffffff:08x}'


class ShardFilter:
    """Which objects this replica handles now: those of the shards it holds (see the module's description)."""

    __slots__ = ('_cache', '_cache_size', '_modes', '_selector', 'count', 'owned')

    def __init__(self, count: int, *, cache_size: int = FILTER_CACHE_SIZE) -> None:
        super().__init__()
        self.count = count
        self.owned: frozenset[int] = frozenset()
        self._cache: dict[str, int] = {}
        self._cache_size = cache_size
        self._selector: tuple[frozenset[int], str | None] | None = None  # for the owned shards as of then
        self._modes: dict[str, bool] = {}  # by resource: whether the server is known to filter (as logged)

    def __repr__(self) -> str:
        return f'<ShardFilter {sorted(self.owned)} of {self.count}>'

    def shard(self, uid: str) -> int:
        shard = self._cache.get(uid)
        if shard is None:
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            shard = self._cache[uid] = shard_of(uid, self.count)
        return shard

    def owns(self, uid: str) -> bool:
        """Whether the object with this uid is ours to handle now. Called for every watch-event: cheap."""
        shard = self._cache.get(uid)
        if shard is None:
            shard = self.shard(uid)
        return shard in self.owned

    def selector(self) -> str | None:
        """The server-side selector of the shards held now (see :func:`shard_selector`)."""
        owned = self.owned
        if self._selector is None or self._selector[0] is not owned:
            self._selector = (owned, shard_selector(owned, self.count))
        return self._selector[1]

    def applied(self, what: str, echo: str | None) -> None:
        """
        How the server has answered a listing with the selector: logged once per resource (and on changes).

        ``echo`` is the selector that the server says it has applied (None if it says nothing).
        """
        confirmed = echo is not None
        if self._modes.get(what) is confirmed:
            return
        self._modes[what] = confirmed
        if confirmed:
            logger.info(f'The API server filters the objects of {what} by the shards (shardSelector): '
                        f'the other replicas\' objects do not reach this one.')
        else:
            logger.info(f'The API server does not confirm that it filters the objects of {what} by the '
                        f'shards (no shardInfo in the listing; it might, without saying it, e.g. for custom '
                        f'resources): the other replicas\' objects are filtered here.')


class Handover(Protocol):
    """What the reactor does when the shards held by this replica change (see the reactor's coordination)."""

    async def rewatch(self) -> None:
        """
        Start the watch-streams anew (their new listings see the objects of the gained shards as new ones).

        It returns once the previous watch-streams are stopped: their objects' processing has finished
        (or was cancelled after ``settings.queueing.exit_timeout``).
        """

    async def forget(self, disowned: Callable[[str], bool]) -> None:
        """Stop the daemons & timers of the objects not ours anymore (by uid), wait for them, forget them."""


@dataclasses.dataclass
class _Held:
    lock: LeaseLock
    renewed_at: float  # the start of the latest successful acquiring/renewing (the loop's time)


def _format_shards(shards: Collection[int]) -> str:
    return ', '.join(str(shard) for shard in sorted(shards))


class Sharding:
    """One replica's part in the sharding (see the module's description)."""

    def __init__(self, *, settings: OperatorSettings, vault: Vault, identity: str,
                 blocker: GateBlocker, handover: Handover) -> None:
        super().__init__()
        self.settings = settings
        self.vault = vault
        self.identity = identity
        self.blocker = blocker
        self.handover = handover
        check_settings(settings)
        self.prefix: str = self._sharding.name or ''
        self.namespace = self._sharding.namespace or 'default'
        self.count = self._sharding.count
        self.filter = ShardFilter(self.count)
        self.held: dict[int, _Held] = {}  # the shards whose leases we hold, also those being given up
        self._in_doubt: set[int] = set()  # being taken, or failed to: the server may have given them to us
        self.giving_up: set[int] = set()  # held, but not handled anymore: released once their objects are
        self.share: int | None = None  # as of the latest round
        self.members: frozenset[str] = frozenset()  # the live ones as of the latest round (us included)
        self._locks: dict[int, LeaseLock] = {}  # for every shard seen: its record's observation
        self._member_locks: dict[str, LeaseLock] = {}  # by lease name: the other members' observation
        self._member = LeaseLock(settings=settings, vault=vault, namespace=self.namespace,
                                 name=member_lease_name(self.prefix, identity), identity=identity,
                                 lease_duration=self._sharding.lease_duration,
                                 labels={**self._labels('member'), COUNT_LABEL: str(self.count)})
        self._miscounted: set[str] = set()  # the members with other counts of shards, as warned about
        self._started = False  # the first round is over: the watch-streams start with its shards
        self._tasks: set[asyncio.Task[None]] = set()  # the handovers in progress
        self._taking: set[asyncio.Task[bool]] = set()  # the takes in flight (left to finish by the exit)

    @property
    def _sharding(self) -> ShardingSettings:
        return self.settings.sharding

    def __str__(self) -> str:
        return f'{self.namespace}/{self.prefix}'

    @property
    def handled(self) -> frozenset[int]:
        return self.filter.owned

    def _labels(self, role: str) -> dict[str, str]:
        return {SHARDING_LABEL: self.prefix, ROLE_LABEL: role}

    def _lock(self, shard: int) -> LeaseLock:
        lock = self._locks.get(shard)
        if lock is None:
            lock = self._locks[shard] = LeaseLock(
                settings=self.settings, vault=self.vault, namespace=self.namespace,
                name=f'{self.prefix}-shard-{shard}', identity=self.identity,
                lease_duration=self._sharding.lease_duration, labels=self._labels('shard'))
        return lock

    async def run(self) -> None:
        """Take, keep, and give up the shards until cancelled; then release them and leave."""
        loop = asyncio.get_running_loop()
        meters = metering.meters  # the shards held & the members seen as gauges, read when scraped
        unmeter = meters.add_gauges(self._gauges) if meters is not None else None
        try:
            while True:
                started = loop.time()
                await self._round()
                await asyncio.sleep(max(0.0, started + self._sharding.retry_period - loop.time()))
        finally:
            if unmeter is not None:
                unmeter()
            # Cancelled after the watchers & the daemons are stopped: nothing is handled anymore.
            for task in self._tasks:
                task.cancel()
            self.filter.owned = frozenset()
            await aiotasks.finish_uninterrupted(self._leave())

    def _gauges(self) -> Iterator[tuple[str, dict[str, str], float]]:
        yield 'kopf_shards_held', {'name': str(self)}, len(self.filter.owned)
        yield 'kopf_shard_members', {'name': str(self)}, len(self.members)

    def _count_handovers(self, direction: str, shards: Collection[int]) -> None:
        meters = metering.meters
        if meters is not None and shards:
            meters.child(meters.shard_handovers, str(self), direction).inc(len(shards))

    def status(self) -> dict[str, Any]:
        """This replica's part now, as the liveness endpoint reports it (JSON-serialisable)."""
        return {'name': str(self), 'identity': self.identity, 'count': self.count,
                'shards': sorted(self.filter.owned), 'giving_up': sorted(self.giving_up),
                'members': len(self.members), 'share': self.share}

    async def _leave(self) -> None:
        """Release the shards (others take them at once) and delete the member lease (others rebalance)."""
        if self._tasks:
            await asyncio.wait(self._tasks)
        # The takes answered meanwhile are held (released below); the others stay in doubt (checked below).
        if self._taking:
            _, unanswered = await asyncio.wait(self._taking, timeout=RELEASE_TIMEOUT)
            for task in unanswered:
                task.cancel()
        shards = list(self.held)
        locks = [self.held.pop(shard).lock for shard in shards]
        # A take timed out (or unanswered at the exit) may have been done by the server all the same: those
        # leases are released too if they are ours (the release reads the holder first), not left to expire.
        doubtful = sorted(self._in_doubt - set(shards))
        self._in_doubt.clear()
        failures: list[str] = []
        releases = [lock.release_in_time(failures=failures) for lock in locks]
        # Quietly: most doubtful ones are another's, or do not exist (the take never reached the server).
        checks = [self._lock(shard).release_in_time(failures=[]) for shard in doubtful]
        results = await asyncio.gather(*checks, *releases, self._delete_member())
        _report_release_failures(failures, len(locks))
        checked = results[:len(doubtful)]
        shards += [shard for shard, released in zip(doubtful, checked, strict=True) if released]
        if shards:
            logger.info(f'Released the shards {_format_shards(shards)} of the sharding {self}: exiting.')

    async def _delete_member(self) -> None:
        try:
            async with asyncio.timeout(3.0):
                await deleting.delete_obj(settings=self.settings, vault=self.vault, resource=LEASE_RESOURCE,
                                          namespace=self.namespace, name=self._member.name, logger=logger)
        except (errors.APIError, *TRANSIENT_ERRORS) as e:
            logger.warning(f'Failed to delete the member lease {self._member}: {errors.describe_error(e)}')

    async def _round(self) -> None:
        """One round: see the members & the shards, renew ours, give up the excess, take the free ones."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        try:
            leases = await coordination.list_labelled(
                settings=self.settings, vault=self.vault, resource=LEASE_RESOURCE, namespace=self.namespace,
                labels={SHARDING_LABEL: self.prefix}, backoffs=(), logger=logger)
        except TRANSIENT_ERRORS as e:
            logger.debug(f'Failed to list the leases of the sharding {self}: {errors.describe_error(e)}')
            leases = None

        shards: dict[int, Mapping[str, Any]] = {}
        members: dict[str, Mapping[str, Any]] = {}
        lease: Mapping[str, Any]
        for lease in leases or []:
            name = (lease.get('metadata') or {}).get('name') or ''
            if name.startswith(f'{self.prefix}-member-'):
                members[name] = lease
            elif name.startswith(f'{self.prefix}-shard-'):
                index = name.removeprefix(f'{self.prefix}-shard-')
                if index.isdigit() and int(index) < self.count:
                    shards[int(index)] = lease

        for shard, lease in shards.items():  # on our clock: the expiries count from when seen changing
            if shard not in self.held:
                self._lock(shard).observe(lease, now)
        await self._renew_member(now, members.get(self._member.name) if leases is not None else ...)
        if leases is not None:
            self.members = frozenset(await self._see_members(now, members))
            share = fair_share(self.identity, self.members, self.count)
            if share != self.share:
                logger.debug(f'The fair share in the sharding {self} is {share} of {self.count} shards '
                             f'for {len(self.members)} live replicas.')
            self.share = share

        await self._renew(now, shards if leases is not None else None)
        if self.share is None:
            return  # never listed yet: neither the members nor the free shards are known

        handled = set(self.held) - self.giving_up
        if len(handled) > self.share:
            self._give_up(self._order(handled)[self.share:])
        elif len(handled) < self.share and leases is not None:
            await self._take(now, shards, self.share - len(handled))

        if not self._started and leases is not None:
            self._started = True
            self.blocker.discard()  # the watch-streams start now, with the shards taken so far

    async def _renew_member(self, now: float, lease: Mapping[str, Any] | EllipsisType | None) -> None:
        try:
            async with asyncio.timeout(self._sharding.renew_deadline):
                if not await self._member.try_acquire_or_renew(now, lease) and self._member.holder:
                    logger.warning(f'The member lease {self._member} is held by {self._member.holder!r}; '
                                   f'two replicas have the same identity: give them different ones.')
        except TRANSIENT_ERRORS as e:
            logger.debug(f'Failed to renew the member lease {self._member}: {errors.describe_error(e)}')

    async def _see_members(self, now: float, leases: Mapping[str, Mapping[str, Any]]) -> set[str]:
        """The identities of the live members (us included); the leases of the dead ones are deleted."""
        alive = {self.identity}
        for name in list(self._member_locks):
            if name not in leases:
                del self._member_locks[name]
        for name, lease in leases.items():
            if name == self._member.name:
                continue
            lock = self._member_locks.get(name)
            if lock is None:
                lock = self._member_locks[name] = LeaseLock(
                    settings=self.settings, vault=self.vault, namespace=self.namespace, name=name,
                    identity=self.identity, lease_duration=self._sharding.lease_duration)
            if not lock.observe(lease, now):
                alive.add(lock.holder or '')
                self._check_count(lock.holder or '', lease)
            else:
                await self._delete_dead_member(lease)
        alive.discard('')
        return alive

    def _check_count(self, identity: str, lease: Mapping[str, Any]) -> None:
        labels = (lease.get('metadata') or {}).get('labels') or {}
        count = labels.get(COUNT_LABEL)
        if count is not None and count != str(self.count) and identity not in self._miscounted:
            self._miscounted.add(identity)
            logger.warning(f'The replica {identity!r} of the sharding {self} splits the objects into {count} '
                           f'shards, this one into {self.count}: some objects are handled twice, some never; '
                           f'set the same settings.sharding.count in all the replicas.')

    async def _delete_dead_member(self, lease: Mapping[str, Any]) -> None:
        metadata = lease.get('metadata') or {}
        holder = (lease.get('spec') or {}).get('holderIdentity')
        options = {'preconditions': {'resourceVersion': metadata.get('resourceVersion')}}
        try:
            await deleting.delete_obj(settings=self.settings, vault=self.vault, resource=LEASE_RESOURCE,
                                      namespace=self.namespace, name=metadata.get('name') or '',
                                      options=options, logger=logger)
        except (errors.APIError, *TRANSIENT_ERRORS) as e:
            logger.debug(f'Failed to delete the expired member lease {metadata.get("name")!r}: '
                         f'{errors.describe_error(e)}')
        else:
            logger.info(f'The replica {holder!r} of the sharding {self} is gone: its lease has expired.')

    async def _renew(self, now: float, leases: Mapping[int, Mapping[str, Any]] | None) -> None:
        """Renew the held shards (all at once); stop handling those lost to others or not renewed in time."""
        records = list(self.held.items())
        results = await asyncio.gather(*(
            self._renew_one(held, now, leases.get(shard) if leases is not None else ...)
            for shard, held in records))
        # Only those still held as they were: e.g. not released by their handover meanwhile.
        current = [(shard, held, result) for (shard, held), result in zip(records, results, strict=True)
                   if self.held.get(shard) is held]
        lost = {shard for shard, _, result in current if result is False}
        if lost:
            self._lose(lost, 'taken by another replica')
        loop = asyncio.get_running_loop()
        deadline = self._sharding.renew_deadline
        overdue = {shard for shard, held, result in current
                   if result is None and loop.time() >= held.renewed_at + deadline}
        if overdue:
            self._lose(overdue, f'their leases could not be renewed for {deadline}s')

    async def _renew_one(
            self, held: _Held, now: float, lease: Mapping[str, Any] | EllipsisType | None,
    ) -> bool | None:
        """True if renewed, False if lost to another replica, None if not renewed now (errors)."""
        try:
            # Never beyond the deadline: the shard must be given up before the others could take it.
            async with asyncio.timeout_at(held.renewed_at + self._sharding.renew_deadline):
                renewed = await held.lock.try_acquire_or_renew(now, lease)
        except TRANSIENT_ERRORS as e:
            logger.debug(f'Failed to renew the lease {held.lock}: {errors.describe_error(e)}')
            return None
        if renewed:
            held.renewed_at = now
        return renewed

    async def _take(self, now: float, leases: Mapping[int, Mapping[str, Any]], wanted: int) -> None:
        """Try to take as many free shards as wanted (at once); those won by others are tried again later."""
        free = [shard for shard in range(self.count) if shard not in self.held and
                (shard not in leases or self._lock(shard).observe(leases[shard], now))]  # seen just now
        candidates = self._order(free)[:wanted]
        if not candidates:
            return
        results = await asyncio.gather(*(self._take_one(shard, now, leases.get(shard))
                                         for shard in candidates))
        taken = {shard for shard, result in zip(candidates, results, strict=True) if result}
        if taken:
            self.filter.owned = self.filter.owned | taken
            self._count_handovers('taken', taken)
            logger.info(f'Took the shards {_format_shards(taken)} of the sharding {self}: '
                        f'handling {len(self.filter.owned)} of {self.count} shards now.')
            if self._started:
                self._spawn(self.handover.rewatch(), 'rewatch for the gained shards')

    async def _take_one(self, shard: int, now: float, lease: Mapping[str, Any] | None) -> bool:
        # Not cancelled midway by the exit: the server could apply the request after the exit has read the
        # lease to release it (seen with 3 replicas exiting at once), so it would stay held until it expires.
        # Its own task goes on; the exit waits for its answer and releases the lease if taken (see _leave).
        name = f'taking the shard {shard} of {self}'
        task = asyncio.create_task(self._try_take(shard, now, lease), name=name)
        self._taking.add(task)
        task.add_done_callback(self._taken)
        return await asyncio.shield(task)

    def _taken(self, task: asyncio.Task[bool]) -> None:
        self._taking.discard(task)
        if not task.cancelled():
            task.exception()  # raised to the round if it still awaits it; otherwise, the round is over (exit)

    async def _try_take(self, shard: int, now: float, lease: Mapping[str, Any] | None) -> bool:
        lock = self._lock(shard)
        # Until answered, the server may have given it to us (e.g. if timed out after the request was
        # applied): then, the next rounds take it as ours, or the exit releases it to be sure.
        self._in_doubt.add(shard)
        try:
            async with asyncio.timeout(self._sharding.renew_deadline):
                taken = await lock.try_acquire_or_renew(now, lease)
        except TRANSIENT_ERRORS as e:
            logger.debug(f'Failed to take the lease {lock}: {errors.describe_error(e)}')
            return False
        self._in_doubt.discard(shard)
        if taken:
            self.held[shard] = _Held(lock=lock, renewed_at=now)
        return taken

    def _order(self, shards: Iterable[int]) -> list[int]:
        """The shards in this replica's order of preference: from its own offset, to take different ones."""
        offset = fnv1a_64(self.identity) % self.count
        return sorted(shards, key=lambda shard: (shard - offset) % self.count)

    def _give_up(self, shards: Collection[int]) -> None:
        """Stop handling the shards at once; release them once their objects are not processed anymore."""
        shards = set(shards)
        self.giving_up |= shards
        self.filter.owned = self.filter.owned - shards
        self._count_handovers('given', shards)
        logger.info(f'Giving up the shards {_format_shards(shards)} of the sharding {self} '
                    f'(the fair share is {self.share} of {self.count} for {len(self.members)} replicas): '
                    f'handling {len(self.filter.owned)} of {self.count} shards now.')
        self._spawn(self._hand_over(shards), 'handover of the shards')

    def _lose(self, shards: Collection[int], reason: str) -> None:
        """Stop handling the shards at once: they are not ours anymore (nothing to release)."""
        shards = set(shards)
        for shard in shards:
            self.held.pop(shard, None)
        handled = shards - self.giving_up
        self.giving_up -= shards
        self.filter.owned = self.filter.owned - shards
        self._count_handovers('lost', handled)
        if handled:
            logger.warning(f'Lost the shards {_format_shards(handled)} of the sharding {self}: {reason}; '
                           f'handling {len(self.filter.owned)} of {self.count} shards now.')
            self._spawn(self._forget(handled), 'forgetting of the lost shards')

    async def _hand_over(self, shards: set[int]) -> None:
        await self._forget(shards)
        locks = [self.held.pop(shard).lock for shard in sorted(shards) if shard in self.held]
        self.giving_up -= shards
        failures: list[str] = []
        released = await asyncio.gather(*(lock.release_in_time(failures=failures) for lock in locks))
        _report_release_failures(failures, len(locks))
        logger.debug(f'Released {sum(released)} of {len(locks)} leases of the shards given up: '
                     f'{_format_shards(shards)}.')

    async def _forget(self, shards: set[int]) -> None:
        """Let the objects' processing finish, stop their daemons & timers (bounded), forget them."""
        def disowned(uid: str) -> bool:
            return self.filter.shard(uid) in shards and self.filter.shard(uid) not in self.filter.owned

        if self._started:
            await self.handover.rewatch()
        try:
            async with asyncio.timeout(self._sharding.handover_timeout):
                await self.handover.forget(disowned)
        except TimeoutError:
            logger.warning(f'The daemons of the shards {_format_shards(shards)} have not exited '
                           f'in {self._sharding.handover_timeout}s; handing the shards over anyway.')

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=f'{name} of the sharding {self}')
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        error = task.exception() if not task.cancelled() else None
        if error is not None:
            logger.error(f'{task.get_name()} has failed: {errors.describe_error(error)}')


def check_settings(settings: OperatorSettings) -> None:
    """Fail with a one-line error if the sharding's settings are not usable (at the operator's start)."""
    sharding = settings.sharding
    if not sharding.name:
        raise ValueError('The sharding needs a name: settings.sharding.name (kopf run --shards NAME).')
    if settings.election.lease_name:
        raise ValueError('The sharding and the leader election exclude each other: '
                         'set either settings.sharding.name (--shards) or settings.election.lease_name '
                         '(--lease), not both.')
    if len(sharding.name) > 63 or not re.fullmatch(r'[a-z0-9]([-a-z0-9.]*[a-z0-9])?', sharding.name):
        raise ValueError(f'settings.sharding.name must be a DNS name (lowercase letters, digits, "-", ".") '
                         f'of at most 63 characters, got {sharding.name!r}.')
    if sharding.renew_deadline >= sharding.lease_duration:
        raise ValueError(f'settings.sharding.renew_deadline ({sharding.renew_deadline}) must be less than '
                         f'settings.sharding.lease_duration ({sharding.lease_duration}).')


def _report_release_failures(failures: list[str], total: int) -> None:
    """One line for the shards' leases not released (e.g. all of them for a missing RBAC permission)."""
    if len(failures) == 1:
        logger.warning(failures[0])
    elif failures:
        logger.warning(f'{failures[0]} (and {len(failures) - 1} more of {total} leases of the shards; '
                       f'the other replicas take them over when they expire)')
