"""
The coordination's logic on a fake clock (looptime): the peering's verdicts, the handling gate,
the Lease election's timings (against a plain HTTP mock, kmock: the lease stays as the mock says).
"""
import asyncio
import datetime
from collections.abc import AsyncIterator

import kmock
import pytest

from kopf._clients.vault import Vault
from kopf._cogs.structs.credentials import ConnectionInfo, VaultKey
from kopf._core.engines.gating import HandlingGate
from kopf._core.engines.leadership import LeaseElection, LeaseLock, parse_lease_reference
from kopf._core.engines.peering import Identity, Peer, detect_own_id, judge, keepalive_interval, parse_peers
from kopf._core.intents.configuration import OperatorSettings

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
LEASE = '/apis/coordination.k8s.io/v1/namespaces/default/leases/op'


def peer(id: str, priority: int, *, seen_ago: float = 0, lifetime: float = 60) -> Peer:
    return Peer(id=Identity(id), priority=priority, lifetime=lifetime,
                lastseen=NOW - datetime.timedelta(seconds=seen_ago))


#
# Peering: the verdicts (a pure function of the peers and the clock).
#

def test_no_other_peers_means_handling() -> None:
    verdict = judge([peer('me', 0)], own_id='me', own_priority=0, now=NOW)
    assert not verdict.paused and verdict.next_expiry is None


def test_a_higher_live_peer_pauses_us_until_its_expiry() -> None:
    verdict = judge([peer('me', 0), peer('boss', 10, seen_ago=50)], own_id='me', own_priority=0, now=NOW)
    assert verdict.paused and [p.id for p in verdict.higher] == ['boss'] and not verdict.same
    assert verdict.next_expiry == NOW + datetime.timedelta(seconds=10)


def test_a_lower_peer_does_not_pause_us() -> None:
    verdict = judge([peer('me', 10), peer('minion', 0)], own_id='me', own_priority=10, now=NOW)
    assert not verdict.paused


def test_a_same_priority_peer_pauses_everyone() -> None:
    verdict = judge([peer('me', 5), peer('twin', 5)], own_id='me', own_priority=5, now=NOW)
    assert verdict.paused and [p.id for p in verdict.same] == ['twin']


def test_expired_peers_are_ignored_and_to_be_removed() -> None:
    verdict = judge([peer('me', 0), peer('ghost', 99, seen_ago=61)], own_id='me', own_priority=0, now=NOW)
    assert not verdict.paused and [p.id for p in verdict.dead] == ['ghost']


def test_records_are_parsed_as_kopf_writes_them_and_the_invalid_ones_are_ignored() -> None:
    body = {'status': {
        'a@h/1/x': {'priority': 10, 'lifetime': 60, 'lastseen': '2026-01-01T12:00:00.123456+00:00'},
        'old@h': {'priority': 1, 'lifetime': 60, 'lastseen': '2026-01-01T12:00:00'},  # naive: UTC
        'bad1': 'not a mapping', 'bad2': {'priority': 'high', 'lifetime': 60, 'lastseen': 'x'},
        'bad3': {'priority': 1, 'lifetime': 60, 'lastseen': 'yesterday'},
    }}
    peers = {p.id: p for p in parse_peers(body)}
    assert set(peers) == {'a@h/1/x', 'old@h'}
    assert peers['old@h'].lastseen == NOW
    assert peers['a@h/1/x'].as_record() == body['status']['a@h/1/x']  # type: ignore[index]
    assert repr(peers['a@h/1/x']) == \
        "<Peer a@h/1/x: priority=10, lifetime=60, lastseen='2026-01-01T12:00:00.123456+00:00'>"


def test_identities() -> None:
    manual, automatic = detect_own_id(manual=True), detect_own_id(manual=False)
    assert '@' in manual and '/' not in manual
    user_host, timestamp, suffix = automatic.split('/')
    assert user_host == manual and len(timestamp) == 14 and len(suffix) == 3


@pytest.mark.parametrize('lifetime, interval', [(60, 50), (3, 2), (1.5, 1)])
def test_keepalives_come_well_before_the_expiry(lifetime: float, interval: float) -> None:
    assert keepalive_interval(lifetime) == interval


#
# The gate.
#

@pytest.mark.looptime
async def test_the_gate_is_open_only_while_no_blocker_blocks(looptime: float) -> None:
    gate = HandlingGate()
    assert gate.is_open
    peering, lease = gate.blocker('peering'), gate.blocker('lease', blocking=False)
    assert not gate.is_open and gate.blocked_by == ['peering']
    lease.block()
    peering.unblock()
    assert gate.blocked_by == ['lease']
    waiter = asyncio.create_task(gate.wait_open())
    await asyncio.sleep(1)
    assert not waiter.done()
    lease.discard()
    await asyncio.wait_for(waiter, timeout=1)
    assert gate.is_open and looptime == 1


def test_lease_references() -> None:
    assert parse_lease_reference('op') == (None, 'op')
    assert parse_lease_reference('ns/op') == ('ns', 'op')
    with pytest.raises(ValueError, match='expected NAME or NAMESPACE/NAME'):
        parse_lease_reference('a/b/c')


#
# The Lease election on a fake clock.
#

@pytest.fixture
def kmock_options(kmock_options: dict[str, object]) -> dict[str, object]:
    return dict(kmock_options, cls=kmock.RawHandler, strict=True)


@pytest.fixture
async def vault(kmock: kmock.RawHandler) -> AsyncIterator[Vault]:
    vault = Vault({VaultKey('main'): ConnectionInfo(server=str(kmock.url).rstrip('/'))})
    yield vault
    await vault.close()


@pytest.fixture
def settings() -> OperatorSettings:
    settings = OperatorSettings()
    settings.networking.error_backoffs = []
    settings.election.lease_name = 'op'
    return settings


def held_by(holder: str) -> dict[str, object]:
    # The holder's timestamps are deliberately ancient: the followers never compare them with their clocks.
    return {'apiVersion': 'coordination.k8s.io/v1', 'kind': 'Lease',
            'metadata': {'name': 'op', 'namespace': 'default', 'resourceVersion': '7'},
            'spec': {'holderIdentity': holder, 'leaseDurationSeconds': 15, 'leaseTransitions': 3,
                     'acquireTime': '2000-01-01T00:00:00.000000Z',
                     'renewTime': '2000-01-01T00:00:00.000000Z'}}


@pytest.mark.looptime
async def test_a_follower_takes_over_a_stale_lease_after_its_duration_on_its_own_clock(
        kmock: kmock.RawHandler, vault: Vault, settings: OperatorSettings, looptime: float,
) -> None:
    kmock[f'get {LEASE}'] << held_by('other')
    kmock[f'put {LEASE}'] << held_by('me')
    blocker = HandlingGate().blocker('lease')
    election = LeaseElection(settings=settings, vault=vault, identity='me', blocker=blocker)
    task = asyncio.create_task(election.run())

    await asyncio.sleep(14.9)  # the record has not changed for less than 15 s: still someone's lease
    assert blocker.blocking and not [req for req in kmock if req.method == 'PUT']

    await asyncio.sleep(1.2)  # the attempt at 16 s (every 2 s) sees it expired
    assert not blocker.blocking and election.leading
    [put] = [req for req in kmock if req.method == 'PUT']
    assert put.data['metadata']['resourceVersion'] == '7'  # guarded: only one follower can win
    assert put.data['spec']['holderIdentity'] == 'me'
    assert put.data['spec']['leaseTransitions'] == 4
    task.cancel()
    await asyncio.wait([task])


@pytest.mark.looptime
async def test_a_leader_that_cannot_renew_stops_before_the_others_could_take_over(
        kmock: kmock.RawHandler, vault: Vault, settings: OperatorSettings, looptime: float,
) -> None:
    kmock[f'get {LEASE}'][:1] << 404 << {'kind': 'Status', 'code': 404}
    kmock['post /apis/coordination.k8s.io/v1/namespaces/default/leases'] << held_by('me')
    kmock[f'get {LEASE}'] << 503 << {'kind': 'Status', 'code': 503}
    gate = HandlingGate()
    blocker = gate.blocker('lease')
    election = LeaseElection(settings=settings, vault=vault, identity='me', blocker=blocker)
    task = asyncio.create_task(election.run())

    await asyncio.sleep(0.5)
    assert gate.is_open  # created the lease: the leader
    await gate.wait_closed()
    assert looptime == 10  # the renew deadline since the last success: before the 15 s of the others
    task.cancel()
    await asyncio.wait([task])


@pytest.mark.looptime
async def test_a_release_is_retried_when_the_lease_has_changed_meanwhile(
        kmock: kmock.RawHandler, vault: Vault, settings: OperatorSettings, looptime: float,
) -> None:
    # E.g. renewed by ourselves between the release's read and its write (the sharding renews in parallel).
    kmock[f'get {LEASE}'] << held_by('me')
    kmock[f'put {LEASE}'][:1] << 409 << {'kind': 'Status', 'code': 409, 'reason': 'Conflict'}
    kmock[f'put {LEASE}'] << held_by('')
    lock = LeaseLock(settings=settings, vault=vault, namespace='default', name='op', identity='me',
                     lease_duration=15)
    assert await lock.release()
    puts = [req for req in kmock if req.method == 'PUT']
    assert len(puts) == 2
    assert puts[-1].data['spec']['holderIdentity'] == ''
    assert puts[-1].data['metadata']['resourceVersion'] == '7'  # as read again: guarded


@pytest.mark.looptime
async def test_a_lease_lock_keeps_the_labels_of_the_lease(
        kmock: kmock.RawHandler, vault: Vault, settings: OperatorSettings, looptime: float,
) -> None:
    body = held_by('me')
    body['metadata'] = {**body['metadata'], 'labels': {'kopf.dev/sharding': 'op'}}  # type: ignore[dict-item]
    kmock[f'put {LEASE}'] << body
    lock = LeaseLock(settings=settings, vault=vault, namespace='default', name='op', identity='me',
                     lease_duration=15, labels={'kopf.dev/sharding': 'op'})
    assert await lock.try_acquire_or_renew(0.0, body)
    [put] = [req for req in kmock if req.method == 'PUT']
    assert put.data['metadata']['labels'] == {'kopf.dev/sharding': 'op'}  # a PUT replaces the whole lease
    assert put.data['spec']['acquireTime'] == '2000-01-01T00:00:00.000000Z'  # renewed: not re-acquired
