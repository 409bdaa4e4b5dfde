"""
Sharding with Leases: several operators (threads, or a killed subprocess) split the objects among themselves.

The timings are shortened (leases of 2 s, renewed every 0.2 s); the waits are for the outcomes.
"""
import asyncio
import collections
import contextlib
import logging
import os
import pathlib
import re
import signal
import textwrap
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import aiohttp
import pytest

import kopf
from kopf._core.engines.sharding import fair_share, shard_of, shard_selector

COUNT = 8  # the shards: enough to split among 3 replicas unevenly, few enough to be quick
NAME = 'op'

Handled = collections.Counter[tuple[str, str]]  # (operator, object name) -> how many times


def leases(cluster: Any) -> dict[str, dict[str, Any]]:
    items = cluster.emulator.list_objects('leases.coordination.k8s.io', namespace='default')
    return {item['metadata']['name']: item for item in items}


def holders(cluster: Any) -> dict[int, str]:
    """The shards by their holders as the leases say now (the released ones have none)."""
    result: dict[int, str] = {}
    for name, lease in leases(cluster).items():
        if name.startswith(f'{NAME}-shard-'):
            holder = lease.get('spec', {}).get('holderIdentity')
            if holder:
                result[int(name.removeprefix(f'{NAME}-shard-'))] = holder
    return result


def members(cluster: Any) -> set[str]:
    return {lease.get('spec', {}).get('holderIdentity') for name, lease in leases(cluster).items()
            if name.startswith(f'{NAME}-member-')}


def settled(cluster: Any, names: set[str]) -> dict[int, str] | Literal[False]:
    """
    The holders if all shards are held by these replicas only, each holding its fair share; else False.

    One reading for all the checks: the leases change meanwhile (the emulator serves from its thread).
    Exactly the fair shares, not "within one of each other": e.g. 3-2-3 of 3 replicas looks even while
    a replica with 3 gives one up to a replica with 2 (its lease still held until released).
    """
    shards = holders(cluster)
    counts = collections.Counter(shards.values())
    fair = {name: fair_share(name, names, COUNT) for name in names}
    return shards if len(shards) == COUNT and counts == fair else False


def is_balanced(cluster: Any, names: set[str]) -> bool:
    return settled(cluster, names) is not False


def lease_listings(cluster: Any) -> int:
    return int(cluster.emulator.requests.count('list', 'leases', group='coordination.k8s.io'))


def shorten(settings: kopf.OperatorSettings) -> None:
    settings.sharding.name = NAME
    settings.sharding.count = COUNT
    settings.sharding.lease_duration = 2
    settings.sharding.renew_deadline = 1.2
    settings.sharding.retry_period = 0.2
    settings.sharding.handover_timeout = 2


@pytest.fixture
def handled() -> Handled:
    return collections.Counter()


@pytest.fixture
def make_operator(make_registry: Callable[[], kopf.OperatorRegistry],
                  settings_factory: Callable[[], kopf.OperatorSettings],
                  handled: Handled, threaded_operator: Any) -> Callable[..., Any]:
    lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def make(name: str, *, slow: bool = False, steady: bool = False, count: int = COUNT,
                   **kwargs: Any) -> AsyncIterator[Any]:
        registry = make_registry()
        settings = settings_factory()
        settings.posting.enabled = False
        shorten(settings)
        settings.sharding.count = count
        if steady:  # nothing must move: not even when a loaded machine delays a renewal beyond 1.2 s
            settings.sharding.lease_duration = 15
            settings.sharding.renew_deadline = 10

        @kopf.on.create('kopfexamples', registry=registry)
        def created(name: str, **_: Any) -> dict[str, str]:
            with lock:
                handled[(operator_name, name)] += 1
            if slow:  # in flight for a while: e.g. when its shard is given up
                time.sleep(0.05)
            return {'replica': operator_name}

        operator_name = name
        operator = threaded_operator(registry=registry, settings=settings, namespaces=['default'],
                                    identity=name, **kwargs)
        operator.thread.start()
        try:
            yield operator
        finally:
            operator.stop_flag.set()
            await asyncio.to_thread(operator.thread.join, 10)
            assert not operator.thread.is_alive()
            assert operator.errors == []

    return make


async def create_many(cluster: Any, names: list[str]) -> None:
    for start in range(0, len(names), 20):  # in batches: not hundreds of connections at once
        await asyncio.gather(*(cluster.create(name) for name in names[start:start + 20]))


def assert_handled_once_by_their_shards(cluster: Any, handled: Handled, names: list[str],
                                        owners: dict[int, str] | None = None) -> None:
    assert sorted(name for _, name in handled) == sorted(names)  # every one, once
    assert set(handled.values()) == {1}
    if owners is not None:  # by the holders of their shards
        for operator, name in handled:
            uid = cluster.get(name)['metadata']['uid']
            assert owners[shard_of(uid, COUNT)] == operator, name


GATE = 'ShardedListAndWatch'
logger = logging.getLogger(__name__)  # the test's own steps among the operators' logs (with the time)
OBSERVER = 'timeoutSeconds=3333'  # the test's own watch of all the objects, as the emulator sees it


def watch_selectors(cluster: Any) -> list[str | None]:
    """The shard selectors of the objects' watch-streams open now (those of the replicas)."""
    queries = [urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
               for path in cluster.emulator.open_watch_paths
               if '/kopfexamples' in path and OBSERVER not in path]
    return sorted((query.get('shardSelector') or [None])[0] or '' for query in queries)


@pytest.mark.parametrize('k8s_emulator_options', [
    pytest.param({'feature_gates': {GATE: True}}, id='the-server-filters'),
    pytest.param({'feature_gates': {GATE: False}}, id='the-server-ignores-the-selector'),
])
async def test_replicas_ask_the_server_only_for_the_objects_of_their_shards(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, quiet: Any,
        k8s_emulator_options: dict[str, Any], caplog: pytest.LogCaptureFixture,
) -> None:
    names = {'r0', 'r1'}
    objects = [f'kex{index}' for index in range(200)]
    filtering = k8s_emulator_options['feature_gates'][GATE]
    async with make_operator('r0', steady=True), make_operator('r1', steady=True), \
            aiohttp.ClientSession() as session:
        owners: dict[int, str] = await eventually(lambda: settled(cluster, names), within=10)
        expected = sorted(shard_selector({shard for shard, holder in owners.items() if holder == name}, COUNT)
                          or '' for name in names)
        await eventually(lambda: watch_selectors(cluster) == expected, within=10)  # rewatched with the shards
        logger.info(f'Balanced: {owners}; watched by {watch_selectors(cluster)}; leases: {leases(cluster)}')

        # Every event of the objects goes to one replica only (both if the server ignores the selectors).
        url = f'{cluster.emulator.url}/apis/kopf.dev/v1/namespaces/default/kopfexamples'
        async with session.get(url, params={'watch': 'true', 'timeoutSeconds': '3333'}) as response:
            sent_before = cluster.emulator.watch_events(path='/kopfexamples.*shardSelector')
            await create_many(cluster, objects)
            await eventually(lambda: len(handled) == len(objects), within=20)
            await quiet()

            def every_event_goes_to_one_replica() -> bool:
                observed = cluster.emulator.watch_events(path=OBSERVER)
                sent = cluster.emulator.watch_events(path='/kopfexamples.*shardSelector') - sent_before
                return observed >= len(objects) and sent == observed * (1 if filtering else 2)

            await eventually(every_event_goes_to_one_replica)
            response.close()
        assert holders(cluster) == owners  # nothing has moved meanwhile (no rewatching)
        assert watch_selectors(cluster) == expected
    assert_handled_once_by_their_shards(cluster, handled, objects, owners)
    assert {operator for operator, _ in handled} == names
    not_confirmed = [m for m in caplog.messages
                     if m.startswith('The API server does not confirm that it filters the objects of '
                                     'kopfexamples')]
    assert len(not_confirmed) == 2  # once per replica: custom resources are filtered with no echo


@pytest.mark.parametrize('replicas', [2, 3])
async def test_replicas_split_the_shards_and_handle_every_object_exactly_once(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, quiet: Any, replicas: int,
        caplog: pytest.LogCaptureFixture,
) -> None:
    names = {f'r{index}' for index in range(replicas)}
    objects = [f'kex{index}' for index in range(200)]
    async with contextlib.AsyncExitStack() as stack:
        for name in sorted(names):
            await stack.enter_async_context(make_operator(name, steady=True))
        owners: dict[int, str] = await eventually(
            lambda: members(cluster) == names and settled(cluster, names), within=10)
        await create_many(cluster, objects)
        await eventually(lambda: len(handled) == len(objects), within=20)
        await quiet()
        assert holders(cluster) == owners  # nothing has moved meanwhile
        assert_handled_once_by_their_shards(cluster, handled, objects, owners)
        assert {operator for operator, _ in handled} == names  # every replica has its part
        for obj in objects:  # and the outcome is stored by the handler's replica
            replica = cluster.status(obj)['created']['replica']
            assert (replica, obj) in handled

    assert holders(cluster) == {}  # all released on exit
    assert members(cluster) == set()  # and the members' leases are deleted
    took = [m for m in caplog.messages if m.startswith('Took the shards ')]
    assert took and all(m.endswith('shards now.') for m in took)


async def test_a_graceful_exit_hands_the_shards_over_at_once(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, quiet: Any,
        caplog: pytest.LogCaptureFixture,
) -> None:
    first = [f'kex{index}' for index in range(100)]
    second = [f'kex{index}' for index in range(100, 200)]
    async with make_operator('stays'):
        async with make_operator('leaves'):
            await eventually(lambda: is_balanced(cluster, {'stays', 'leaves'}), within=10)
            await create_many(cluster, first)
            await eventually(lambda: len(handled) == len(first), within=20)
            await quiet()

        # Released on exit: taken over within a few retry periods, not after the lease duration (2 s).
        await eventually(lambda: is_balanced(cluster, {'stays'}), within=1.5)
        await create_many(cluster, second)
        await eventually(lambda: len(handled) == len(first) + len(second), within=20)
        await quiet()

    assert_handled_once_by_their_shards(cluster, handled, first + second)
    assert {name for operator, name in handled if operator == 'leaves'} <= set(first)
    assert {operator for operator, name in handled if name in second} == {'stays'}
    assert any(m.startswith('Released the shards ') and m.endswith(': exiting.') for m in caplog.messages)


async def test_the_shards_being_taken_at_the_exit_are_released_once_taken(
        cluster: Any, make_operator: Any, eventually: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    # The takes reach the server and wait there for 2 s; the exit comes in between. Abandoned, a take can be
    # applied after the exit's release has read its lease (a real server can apply a request whose client
    # has gone; seen in CI with 3 replicas exiting at once), leaving it held until it expires; the emulator
    # drops such requests, so here the leases would never appear. The exit waits for the takes' answers,
    # then releases them.
    cluster.emulator.add_latency(2.0, method='POST', path='/leases')  # the new leases (the member's too)
    async with make_operator('leaving', steady=True):  # renewals in 10 s at most: the takes are not timed out
        await eventually(lambda: cluster.emulator.requests.count('create', 'leases') == 1 + COUNT, within=10)
    await eventually(lambda: sum(name.startswith(f'{NAME}-shard-') for name in leases(cluster)) == COUNT)
    assert holders(cluster) == {}  # all released on exit: none left to expire
    assert any(m.startswith('Released the shards 0, 1, 2, 3, 4, 5, 6, 7 of ') for m in caplog.messages)


async def test_a_new_replica_gets_its_share_from_the_others(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, quiet: Any,
        caplog: pytest.LogCaptureFixture,
) -> None:
    first = [f'kex{index}' for index in range(100)]
    second = [f'kex{index}' for index in range(100, 200)]
    async with make_operator('old'):
        await eventually(lambda: is_balanced(cluster, {'old'}), within=5)
        await create_many(cluster, first)
        await eventually(lambda: len(handled) == len(first), within=20)
        await quiet()
        async with make_operator('new'):
            # Given up gracefully (released): taken within a few retry periods, not the lease duration.
            owners: dict[int, str] = await eventually(lambda: settled(cluster, {'old', 'new'}), within=1.5)
            await create_many(cluster, second)
            await eventually(lambda: len(handled) == len(first) + len(second), within=20)
            await quiet()
            assert holders(cluster) == owners

    # Nothing handled before is handled again by the new holders of its shard (e.g. in their listings).
    assert_handled_once_by_their_shards(cluster, handled, first + second)
    assert {operator for operator, name in handled if name in first} == {'old'}
    assert {operator for operator, name in handled if name in second} == {'old', 'new'}
    giving_up = [m for m in caplog.messages if m.startswith('Giving up the shards ')]
    assert len(giving_up) == 1  # once: 4 of 8 shards at once, one line
    assert 'handling 4 of 8 shards now.' in giving_up[0]


async def test_objects_created_while_the_replicas_come_and_go_are_handled_exactly_once(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, quiet: Any,
) -> None:
    objects: list[str] = []
    stop = asyncio.Event()

    async def create_until_stopped() -> None:
        # Paced by the handling (a batch at a time), so that the handovers do not wait for a huge backlog.
        while not stop.is_set():
            batch = [f'kex{index}' for index in range(len(objects), len(objects) + 10)]
            await create_many(cluster, batch)
            objects.extend(batch)
            await eventually(lambda: {name for _, name in handled} >= set(objects), within=20)

    def handled_by(operator: str) -> int:
        return sum(1 for name, _ in handled if name == operator)

    async with make_operator('first', slow=True), make_operator('second', slow=True):
        await eventually(lambda: is_balanced(cluster, {'first', 'second'}), within=10)
        creating = asyncio.create_task(create_until_stopped())
        try:
            await eventually(lambda: len(handled) >= 50, within=10)
            async with make_operator('third', slow=True):  # joins while the objects come
                await eventually(lambda: is_balanced(cluster, {'first', 'second', 'third'}), within=10)
                await eventually(lambda: handled_by('third') >= 20, within=20)
            # ... and leaves while they still come.
            handled_before = len(handled)
            await eventually(lambda: len(handled) >= handled_before + 50, within=20)
        finally:
            stop.set()
            await creating
        await eventually(lambda: len(handled) == len(objects), within=20)
        await quiet()
        assert is_balanced(cluster, {'first', 'second'})
    assert_handled_once_by_their_shards(cluster, handled, objects)
    assert {operator for operator, _ in handled} == {'first', 'second', 'third'}
    assert len(objects) >= 100


async def test_the_shards_are_released_only_once_their_objects_in_flight_are_handled(
        cluster: Any, make_registry: Callable[[], kopf.OperatorRegistry],
        settings_factory: Callable[[], kopf.OperatorSettings], threaded_operator: Any,
        eventually: Any, quiet: Any, gates: list[threading.Event], caplog: pytest.LogCaptureFixture,
) -> None:
    lock = threading.Lock()
    handled: Handled = collections.Counter()
    gate = threading.Event()
    gates.append(gate)  # set at the end of the test in any case: no thread is left hanging

    def start(identity: str) -> Any:
        registry = make_registry()
        settings = settings_factory()
        settings.posting.enabled = False
        settings.execution.max_workers = 100  # all the objects' handlers in flight at once
        settings.queueing.exit_timeout = 10  # the handovers wait for them (not cancelled meanwhile)
        shorten(settings)

        @kopf.on.create('kopfexamples', registry=registry)
        def created(name: str, **_: Any) -> None:
            with lock:
                handled[(identity, name)] += 1
            gate.wait()

        operator = threaded_operator(registry=registry, settings=settings, namespaces=['default'],
                                    identity=identity)
        operator.thread.start()
        return operator

    objects = [f'kex{index}' for index in range(40)]
    operators = [start('first'), start('second')]
    try:
        await eventually(lambda: is_balanced(cluster, {'first', 'second'}), within=10)
        before = holders(cluster)
        await create_many(cluster, objects)
        await eventually(lambda: len(handled) == len(objects), within=10)  # all in flight, held by the gate
        def giving_up() -> int:
            return len([m for m in caplog.messages if m.startswith('Giving up the shards')])

        given_up = giving_up()
        operators.append(start('third'))
        await eventually(lambda: giving_up() == given_up + 2)  # one shard by each of the two
        listings = lease_listings(cluster)
        await eventually(lambda: lease_listings(cluster) >= listings + 9)  # 3 rounds of each: nothing moves
        assert holders(cluster) == before  # kept while their objects are in flight
        gate.set()
        await eventually(lambda: is_balanced(cluster, {'first', 'second', 'third'}), within=10)
        await quiet()
    finally:
        gate.set()
        for operator in operators:
            await operator.stop()
    assert sorted(name for _, name in handled) == sorted(objects)
    assert set(handled.values()) == {1}
    assert 'third' not in {operator for operator, _ in handled}


async def test_the_daemons_move_with_their_shards(
        cluster: Any, make_registry: Callable[[], kopf.OperatorRegistry],
        settings_factory: Callable[[], kopf.OperatorSettings], threaded_operator: Any,
        eventually: Any,
) -> None:
    lock = threading.Lock()
    running: dict[str, set[str]] = collections.defaultdict(set)  # by object: the replicas running its daemon
    reasons: list[tuple[str, Any]] = []

    def start(identity: str) -> Any:
        registry = make_registry()
        settings = settings_factory()
        settings.posting.enabled = False
        shorten(settings)

        @kopf.daemon('kopfexamples', registry=registry)
        async def monitor(name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
            with lock:
                running[name].add(identity)
            await stopped.wait()
            with lock:
                running[name].discard(identity)
                reasons.append((identity, stopped.reason))

        operator = threaded_operator(registry=registry, settings=settings, namespaces=['default'],
                                    identity=identity)
        operator.thread.start()
        return operator

    def daemons_by_their_shards_holders(names: list[str]) -> None:
        owners = holders(cluster)
        for name in names:
            uid = cluster.get(name)['metadata']['uid']
            assert running[name] == {owners[shard_of(uid, COUNT)]}, name

    names = [f'kex{index}' for index in range(40)]
    old = start('old')
    try:
        await eventually(lambda: is_balanced(cluster, {'old'}))
        await create_many(cluster, names)
        await eventually(lambda: all(running[name] == {'old'} for name in names), within=10)
        new = start('new')
        try:
            await eventually(lambda: is_balanced(cluster, {'old', 'new'}))
            await eventually(lambda: daemons_by_their_shards_holders(names), within=10)
            moved = [name for name in names if running[name] == {'new'}]
            assert moved and len(moved) < len(names)
            assert {reason for identity, reason in reasons} == {kopf.DaemonStoppingReason.OPERATOR_PAUSING}
            assert len(reasons) == len(moved)  # those kept were not restarted
        finally:
            await new.stop()
        await eventually(lambda: all(running[name] == {'old'} for name in names), within=10)
    finally:
        await old.stop()


async def test_a_replica_that_cannot_renew_stops_handling_before_its_leases_expire(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, quiet: Any,
        caplog: pytest.LogCaptureFixture,
) -> None:
    async with make_operator('only'):
        await eventually(lambda: is_balanced(cluster, {'only'}))
        cluster.emulator.fail_requests(None, status=503, path='/leases')
        await eventually(lambda: any(m.startswith('Lost the shards 0, 1, 2, 3, 4, 5, 6, 7 of the sharding '
                                                  'default/op: their leases could not be renewed for 1.2s')
                                     for m in caplog.messages), within=3)
        await cluster.create('kex1')
        await quiet(period=0.5)
        assert not handled  # no shards: nothing is handled
        cluster.emulator.clear_faults()
        await eventually(lambda: handled[('only', 'kex1')] == 1, within=5)


async def test_replicas_with_different_counts_of_shards_are_warned_about(
        cluster: Any, make_operator: Any, eventually: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    def warning(other: str, theirs: int, ours: int) -> str:
        return (f"The replica {other!r} of the sharding default/op splits the objects into {theirs} shards, "
                f"this one into {ours}: some objects are handled twice, some never; "
                f"set the same settings.sharding.count in all the replicas.")

    async with make_operator('eight'), make_operator('four', count=4):
        await eventually(lambda: warning('four', 4, 8) in caplog.messages)
        await eventually(lambda: warning('eight', 8, 4) in caplog.messages)
    assert len([m for m in caplog.messages if 'splits the objects into' in m]) == 2  # once per replica


OPERATOR_SOURCE = f'''
import kopf

@kopf.on.startup()
def configure(settings, **_):
    settings.sharding.count = {COUNT}
    settings.sharding.lease_duration = 2
    settings.sharding.renew_deadline = 1.2
    settings.sharding.retry_period = 0.2
    settings.posting.enabled = False

@kopf.on.create('kopfexamples')
def created(name, **_):
    print(f'HANDLED {{name}}', flush=True)
'''


async def test_the_shards_of_a_killed_replica_are_taken_after_their_expiry(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, quiet: Any,
        tmp_path: pathlib.Path, start_kopf_process: Any,
) -> None:
    source = tmp_path / 'operator.py'
    source.write_text(textwrap.dedent(OPERATOR_SOURCE))
    output = tmp_path / 'output.txt'
    env = dict(os.environ, KUBECONFIG=str(cluster.emulator.kubeconfig_path))
    args = ['-n', 'default', '--shards', f'default/{NAME}', str(source)]
    process = start_kopf_process(args, env, output)
    try:
        await eventually(lambda: len(holders(cluster)) == COUNT, within=15)
        [killed] = set(holders(cluster).values())
        async with make_operator('survivor'):
            await eventually(lambda: is_balanced(cluster, {killed, 'survivor'}), within=5)
            objects = [f'kex{index}' for index in range(100)]
            await create_many(cluster, objects)
            await eventually(lambda: len(handled) + output.read_text().count('HANDLED') == 100, within=20)
            await quiet()
            # Killed only once the outcomes are stored: otherwise, handling them again would be right.
            process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(process.wait, 5)
            killed_at = asyncio.get_running_loop().time()
            await eventually(lambda: is_balanced(cluster, {'survivor'}), within=5)
            taken_in = asyncio.get_running_loop().time() - killed_at
            await eventually(lambda: members(cluster) == {'survivor'})  # the dead one's lease is deleted
            await quiet()
            more = [f'kex{index}' for index in range(100, 150)]
            await create_many(cluster, more)
            await eventually(lambda: sum(handled.values()) + output.read_text().count('HANDLED') == 150,
                             within=20)
            await quiet()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    assert taken_in >= 1.5  # not before the expiry of the leases (2 s, as seen by the survivor's clock)
    text = output.read_text()
    by_killed = set(re.findall(r'HANDLED (kex\d+)', text))  # its logs can interleave with the prints
    by_survivor = {name for _, name in handled}
    assert set(handled.values()) == {1}
    assert len(by_killed) == text.count('HANDLED')
    assert not by_killed & by_survivor  # nothing twice
    assert by_killed | by_survivor == {f'kex{index}' for index in range(150)}
    assert by_killed and by_killed <= set(objects)
