"""
Peering: the operators (replicas) that serve the same objects see each other and yield to the higher priority.

Compatible with Kopf on the cluster: the peering objects are ``KopfPeering`` (namespaced, for
the operators restricted to namespaces: one object per served namespace) and ``ClusterKopfPeering``
(for the cluster-wide operators) of ``kopf.dev/v1`` (or the older ``kopf.zalando.org/v1``).
Every operator keeps its own record in the object's ``status``, keyed by its identity::

    status:
      root@host/20260101120000/x7k: {priority: 100, lifetime: 60, lastseen: '2026-01-01T12:00:00.1+00:00'}

and renews its ``lastseen`` before the ``lifetime`` expires (keep-alives). Every operator watches
the object and decides (see :func:`judge`):

* if another live peer has a higher priority, this operator pauses ("in favour of" that peer);
* if another live peer has the same priority, all of them pause (with a warning): nobody knows who wins;
* otherwise, it handles the objects (resumes if paused).

A peer is alive until its ``lastseen`` plus its ``lifetime``; the expired records are removed by whoever
notices them first (garbage collection). An operator removes its own record when it exits gracefully,
so that the others resume at once. ``kopf freeze`` adds a record with a priority and a lifetime of
its own (an operator that handles nothing), ``kopf resume`` removes it.

Which peering is used (:func:`detect_peering`): none in the standalone mode; the one named in
``settings.peering.name`` (``--peering``) if it is mandatory (an operator waits until it exists,
``kopf freeze`` fails);
otherwise the one named ``default`` if it exists, else none (the standalone mode).

The decisions are made on the local clock against the peers' ``lastseen`` timestamps (as Kopf does),
so the replicas' clocks should be roughly in sync (NTP).
"""
import asyncio
import dataclasses
import datetime
import getpass
import logging
import random
import socket
import string
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NewType

from kopf._clients import coordination, errors, fetching, watching
from kopf._clients.vault import Vault
from kopf._clients.watching import Bookmark
from kopf._cogs.aiokits.backoffs import iter_backoffs
from kopf._cogs.structs.references import Resource
from kopf._core.engines.gating import GateBlocker
from kopf._core.intents.configuration import OperatorSettings

logger = logging.getLogger(__name__)

__all__ = [
    'CLUSTER_PEERING_RESOURCES', 'NAMESPACED_PEERING_RESOURCES', 'Identity', 'Peer', 'PeeringError',
    'PeeringTarget', 'Verdict', 'detect_own_id', 'detect_peering', 'judge', 'keep_peering', 'touch',
]

# A peer's identity in the peering objects: e.g. ``user@host/20260101120000/x7k``.
Identity = NewType('Identity', str)

# The current API group first; the former one (before Kopf 1.29) is still used if only it is served.
CLUSTER_PEERING_RESOURCES = (
    Resource('kopf.dev', 'v1', 'clusterkopfpeerings', kind='ClusterKopfPeering', namespaced=False),
    Resource('kopf.zalando.org', 'v1', 'clusterkopfpeerings', kind='ClusterKopfPeering', namespaced=False),
)
NAMESPACED_PEERING_RESOURCES = (
    Resource('kopf.dev', 'v1', 'kopfpeerings', kind='KopfPeering', namespaced=True),
    Resource('kopf.zalando.org', 'v1', 'kopfpeerings', kind='KopfPeering', namespaced=True),
)

PEERING_CRDS_HINT = 'the peering CRDs ("kubectl apply -f peering.yaml", the file in the repository\'s root)'


class PeeringError(Exception):
    """The peering cannot be used as configured (e.g. the mandatory peering object does not exist)."""


def detect_own_id(*, manual: bool) -> Identity:
    """
    The identity of this process in the peerings: ``user@host`` for the humans' commands (``kopf freeze``),
    ``user@host/<start time>/<random suffix>`` for the operators (unique even for the replicas on one host).
    """
    try:
        user = getpass.getuser()
    except Exception:  # e.g. no such uid in the container's /etc/passwd
        user = 'unknown'
    host = socket.gethostname()
    if manual:
        return Identity(f'{user}@{host}')
    now = datetime.datetime.now(datetime.UTC)
    suffix = ''.join(random.choices(string.ascii_lowercase + string.digits, k=3))
    return Identity(f'{user}@{host}/{now:%Y%m%d%H%M%S}/{suffix}')


@dataclasses.dataclass(frozen=True)
class Peer:
    """One record of a peering object: an operator (or a ``kopf freeze``) with its priority & lifetime."""

    id: Identity
    priority: int
    lifetime: float
    lastseen: datetime.datetime  # always timezone-aware (UTC)

    def __repr__(self) -> str:
        # As Kopf shows the peers in its logs (the other replicas' logs look the same).
        lifetime = int(self.lifetime) if self.lifetime == int(self.lifetime) else self.lifetime
        return (f'<Peer {self.id}: priority={self.priority}, lifetime={lifetime}, '
                f'lastseen={self.lastseen.isoformat()!r}>')

    @property
    def deadline(self) -> datetime.datetime:
        return self.lastseen + datetime.timedelta(seconds=self.lifetime)

    def is_dead(self, now: datetime.datetime) -> bool:
        return now >= self.deadline

    def as_record(self) -> dict[str, Any]:
        """The peer's record as stored in the peering object (as Kopf writes it)."""
        lifetime = int(self.lifetime) if self.lifetime == int(self.lifetime) else self.lifetime
        return {'priority': self.priority, 'lifetime': lifetime, 'lastseen': self.lastseen.isoformat()}

    @classmethod
    def from_record(cls, id: str, record: Any) -> 'Peer | None':
        """Parse a record of the peering object; None if it is not a valid one (then it is ignored)."""
        if not isinstance(record, Mapping):
            return None
        priority = record.get('priority', 0)
        lifetime, lastseen = record.get('lifetime'), record.get('lastseen')
        if isinstance(priority, bool) or not isinstance(priority, int):
            return None
        if isinstance(lifetime, bool) or not isinstance(lifetime, (int, float)):
            return None
        if not isinstance(lastseen, str):
            return None
        try:
            parsed = datetime.datetime.fromisoformat(lastseen.replace('Z', '+00:00'))
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.UTC)  # as written by the older Kopf versions
        return cls(id=Identity(id), priority=priority, lifetime=float(lifetime), lastseen=parsed)


def parse_peers(body: Mapping[str, Any]) -> list[Peer]:
    """All valid records of a peering object (the invalid ones are ignored)."""
    status = body.get('status')
    if not isinstance(status, Mapping):
        return []
    peers = [Peer.from_record(str(id), record) for id, record in status.items()]
    return [peer for peer in peers if peer is not None]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What an operator should do given the peers it sees (see :func:`judge`)."""

    paused: bool
    higher: tuple[Peer, ...]  # the live peers with higher priorities than ours
    same: tuple[Peer, ...]  # the live peers with the same priority as ours (conflicting)
    dead: tuple[Peer, ...]  # the expired records of others (to be removed)
    next_expiry: datetime.datetime | None  # when the earliest live peer of the others expires


def judge(peers: Iterable[Peer], *, own_id: str, own_priority: int, now: datetime.datetime) -> Verdict:
    """Decide on pausing: pure logic, the clock is given (see the module's description)."""
    others = [peer for peer in peers if peer.id != own_id]
    alive = [peer for peer in others if not peer.is_dead(now)]
    dead = [peer for peer in others if peer.is_dead(now)]
    higher = tuple(peer for peer in alive if peer.priority > own_priority)
    same = tuple(peer for peer in alive if peer.priority == own_priority)
    next_expiry = min((peer.deadline for peer in alive), default=None)
    return Verdict(paused=bool(higher or same), higher=higher, same=same, dead=tuple(dead),
                   next_expiry=next_expiry)


@dataclasses.dataclass(frozen=True)
class PeeringTarget:
    """Where the peering object of an operator is: a resource, a namespace (None if cluster-wide), a name."""

    resource: Resource
    namespace: str | None
    name: str

    def __str__(self) -> str:
        scope = f'in {self.namespace!r}' if self.namespace is not None else 'cluster-wide'
        return f'{self.name!r} {scope}'


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _creation_hint(resource: Resource, namespace: str | None, name: str) -> str:
    metadata = [f'name: {name}'] + ([f'namespace: {namespace}'] if namespace is not None else [])
    lines = [f'apiVersion: {resource.api_version}', f'kind: {resource.kind}', 'metadata:',
             *(f'  {line}' for line in metadata)]
    yaml = ''.join(f'\n    {line}' for line in lines)
    return (f'create it (the peering CRDs must exist too) with "kubectl apply -f FILE" of:{yaml}\n'
            f'or run the operator with --standalone (settings.peering.standalone = True)')


# How often an operator re-checks a mandatory peering that does not exist yet, and says that it waits.
MISSING_PEERING_CHECKS: tuple[float, ...] = (1, 2, 3, 5)  # then every 5 seconds
MISSING_PEERING_REMINDER = 60.0


async def detect_peering(
        *,
        settings: OperatorSettings,
        vault: Vault,
        namespace: str | None,
        wait: bool = False,
) -> PeeringTarget | None:
    """
    Which peering object to use in a served namespace (None: cluster-wide); None for the standalone mode.

    A mandatory peering (``--peering`` or ``settings.peering.mandatory``) that does not exist is
    an error that says how to create it, or, with ``wait`` (the operators, as Kopf's docs say: "the
    operator will pause at the start"), is waited for with a reminder of how to create it now and then;
    an absent optional one means the standalone mode.
    """
    if settings.peering.standalone:
        return None
    name = settings.peering.name
    mandatory = settings.peering.mandatory
    candidates = CLUSTER_PEERING_RESOURCES if settings.peering.clusterwide else NAMESPACED_PEERING_RESOURCES
    namespace = None if settings.peering.clusterwide else namespace
    preferred = candidates[0]
    scope = f' in the namespace {namespace!r}' if namespace is not None else ''
    loop = asyncio.get_running_loop()
    reminded_at: float | None = None
    delays = iter_backoffs(MISSING_PEERING_CHECKS)
    while True:
        target, served = await _find_peering(settings=settings, vault=vault, candidates=candidates,
                                             namespace=namespace, name=name, mandatory=mandatory)
        if target is not None:
            if reminded_at is not None:
                logger.info(f'The mandatory peering {target.resource.kind} {name!r}{scope} exists now.')
            return target
        if served is None:
            return None
        if mandatory and not served:
            raise PeeringError(f'The mandatory peering {name!r} cannot be used: the cluster does not serve '
                               f'{preferred.kind} ({preferred.name}); install {PEERING_CRDS_HINT}, '
                               f'or run the operator with --standalone (settings.peering.standalone = True).')
        if mandatory and not wait:
            raise PeeringError(f'The mandatory peering {preferred.kind} {name!r} does not exist{scope}; '
                               f'{_creation_hint(preferred, namespace, name)}.')
        if not mandatory:
            what = 'The default peering' if name == 'default' else f'The peering {name!r}'
            logger.info(f'{what} is not found{scope}; running in the standalone mode.')
            return None
        if reminded_at is None or loop.time() - reminded_at >= MISSING_PEERING_REMINDER:
            again = 'Still waiting' if reminded_at is not None else 'Waiting'
            logger.warning(f'{again} for the mandatory peering {preferred.kind} {name!r}{scope} '
                           f'(the operator handles nothing until it exists); '
                           f'{_creation_hint(preferred, namespace, name)}.')
            reminded_at = loop.time()
        await asyncio.sleep(next(delays, MISSING_PEERING_CHECKS[-1]))


async def _find_peering(
        *,
        settings: OperatorSettings,
        vault: Vault,
        candidates: Iterable[Resource],
        namespace: str | None,
        name: str,
        mandatory: bool,
) -> tuple[PeeringTarget | None, bool | None]:
    """
    The existing peering object of the first of its resources that has it; and if any is served
    (None: an optional peering that cannot be detected, the standalone mode, already logged).
    """
    served = False
    for resource in candidates:
        try:
            if not await coordination.is_served(settings=settings, vault=vault, resource=resource,
                                                namespace=namespace, logger=logger):
                continue
            served = True
            await fetching.read_obj(settings=settings, vault=vault, resource=resource,
                                    namespace=namespace, name=name, logger=logger)
        except errors.APINotFoundError:
            continue
        except errors.APIForbiddenError as e:
            # E.g. an operator without the RBAC permissions for the peering: not an error unless required.
            if mandatory:
                raise PeeringError(f'The mandatory peering {name!r} cannot be used: {e}; grant the operator '
                                   f'"get, list, watch, patch" on {resource.name} in its RBAC.') from e
            logger.warning(f'The peering cannot be detected (running in the standalone mode): {e}')
            return None, None
        return PeeringTarget(resource=resource, namespace=namespace, name=name), served
    return None, served


async def touch(
        *,
        settings: OperatorSettings,
        vault: Vault,
        target: PeeringTarget,
        id: str,
        peer: Peer | None,
) -> None:
    """Write (or remove if None) one peer's record in the peering object."""
    record = peer.as_record() if peer is not None else None
    await coordination.merge_patch(settings=settings, vault=vault, resource=target.resource,
                                   namespace=target.namespace, name=target.name,
                                   patch={'status': {id: record}}, logger=logger)


def keepalive_interval(lifetime: float) -> float:
    """How often to renew the own record: well before the lifetime expires (but not too often)."""
    return max(lifetime - min(10.0, lifetime / 3), 0.1)


class _PeeringState:
    """The operator's knowledge of one peering: the peers seen, the verdict, the logging of transitions."""

    def __init__(self, *, settings: OperatorSettings, target: PeeringTarget, own_id: Identity,
                 blocker: GateBlocker) -> None:
        super().__init__()
        self.settings = settings
        self.target = target
        self.own_id = own_id
        self.blocker = blocker
        self.peers: list[Peer] = []
        self.seen = False  # whether the object's state is known at all (until then: blocking)
        self.verdict: Verdict | None = None
        self.changed = asyncio.Event()

    def update(self, peers: list[Peer]) -> None:
        self.peers = peers
        self.seen = True
        self.changed.set()

    def evaluate(self, now: datetime.datetime) -> Verdict:
        verdict = judge(self.peers, own_id=self.own_id, own_priority=self.settings.peering.priority, now=now)
        previous, self.verdict = self.verdict, verdict
        if verdict.same and (previous is None or _ids(previous.same) != _ids(verdict.same)):
            logger.warning(f'Possibly conflicting operators with the same priority: {list(verdict.same)}.')
        if verdict.paused and (previous is None or not previous.paused or
                               _ids(previous.higher + previous.same) != _ids(verdict.higher + verdict.same)):
            if verdict.same:
                everyone = sorted((peer for peer in self.peers if not peer.is_dead(now)), key=lambda p: p.id)
                logger.warning(f'Pausing all operators, including self: {everyone}')
            else:
                logger.info(f'Pausing operations in favour of {list(verdict.higher)}.')
        elif not verdict.paused and previous is not None and previous.paused:
            logger.info('Resuming operations after the pause. '
                        'Conflicting operators with the same priority are gone.')
        if verdict.paused:
            self.blocker.block()
        else:
            self.blocker.unblock()
        return verdict


def _ids(peers: Iterable[Peer]) -> set[str]:
    return {peer.id for peer in peers}


async def keep_peering(
        *,
        settings: OperatorSettings,
        vault: Vault,
        target: PeeringTarget,
        own_id: Identity,
        blocker: GateBlocker,
        now: Callable[[], datetime.datetime] = _utcnow,
) -> None:
    """
    Take part in one peering until cancelled: keep-alives, watching the peers, pausing & resuming.

    The blocker blocks until the peering object is seen for the first time (nothing is handled before
    it is known whether others have higher priorities). On exit, the own record is removed.
    """
    state = _PeeringState(settings=settings, target=target, own_id=own_id, blocker=blocker)
    tasks = [
        asyncio.create_task(_keepalives(settings=settings, vault=vault, state=state, now=now),
                            name=f'peering keep-alives for {target}'),
        asyncio.create_task(_watch_peers(settings=settings, vault=vault, state=state),
                            name=f'peering watcher for {target}'),
        asyncio.create_task(_judge_peers(settings=settings, vault=vault, state=state, now=now),
                            name=f'peering judge for {target}'),
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()  # re-raise the failure (they never end otherwise)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        # Leave the peering, so that the others resume at once rather than after our lifetime expires.
        try:
            await asyncio.shield(touch(settings=settings, vault=vault, target=target, id=own_id, peer=None))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logger.warning(f'Failed to remove the own record from the peering {target}: {e}')


async def _keepalives(*, settings: OperatorSettings, vault: Vault, state: _PeeringState,
                      now: Callable[[], datetime.datetime]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        lifetime = settings.peering.lifetime
        peer = Peer(id=state.own_id, priority=settings.peering.priority, lifetime=lifetime, lastseen=now())
        started = loop.time()
        try:
            await touch(settings=settings, vault=vault, target=state.target, id=state.own_id, peer=peer)
        except errors.APINotFoundError:
            logger.warning(f'Keep-alive in {state.target} has failed: the peering object is gone.')
        except errors.APIError as e:
            logger.warning(f'Keep-alive in {state.target} has failed: {e}')
        else:
            if not settings.peering.stealth:
                logger.debug(f'Keep-alive in {state.target}: ok.')
        interval = keepalive_interval(lifetime)
        await asyncio.sleep(max(0.0, started + interval - loop.time()))


async def _watch_peers(*, settings: OperatorSettings, vault: Vault, state: _PeeringState) -> None:
    """Follow the peering object: every change of the peers goes to the judge."""
    target = state.target
    delays = iter_backoffs(settings.queueing.error_delays)
    last_delay = 1.0
    while True:
        source = watching.infinite_watch(settings=settings, vault=vault, resource=target.resource,
                                         namespace=target.namespace, logger=logger)
        try:
            async for item in source:
                if isinstance(item, Bookmark):
                    continue
                body = item['object']
                if body.get('metadata', {}).get('name') != target.name:
                    continue
                state.update([] if item['type'] == 'DELETED' else parse_peers(body))
        except errors.APIError as e:
            last_delay = next(delays, last_delay)
            logger.warning(f'Watching the peering {target} has failed: {e}; retrying in {last_delay}s.')
            await asyncio.sleep(last_delay)
        finally:
            await source.aclose()


async def _judge_peers(*, settings: OperatorSettings, vault: Vault, state: _PeeringState,
                       now: Callable[[], datetime.datetime]) -> None:
    """Re-evaluate on every change of the peers and on every expiry of a peer; collect the garbage."""
    while True:
        state.changed.clear()
        timeout: float | None = None
        if state.seen:
            verdict = state.evaluate(now())
            for peer in verdict.dead:
                logger.debug(f'Removing an expired peer from the peering {state.target}: {peer!r}.')
                try:
                    await touch(settings=settings, vault=vault, target=state.target, id=peer.id, peer=None)
                except errors.APIError as e:
                    logger.warning(f'Failed to remove an expired peer {peer.id!r} from {state.target}: {e}')
            if verdict.next_expiry is not None:
                timeout = max(0.0, (verdict.next_expiry - now()).total_seconds()) + 0.01
        try:
            async with asyncio.timeout(timeout):
                await state.changed.wait()
        except TimeoutError:
            pass
