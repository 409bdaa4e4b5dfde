"""
Leader election with a Lease: several operators (threads, or killed subprocesses), only the leader handles.

The timings are shortened (a lease of 2 s, renewed every 0.2 s); the waits are for the outcomes.
"""
import asyncio
import collections
import contextlib
import datetime
import os
import pathlib
import signal
import textwrap
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import kopf

Handled = collections.Counter[tuple[str, str]]  # (operator, object name) -> how many times
LEASES = '/apis/coordination.k8s.io/v1/namespaces/default/leases'


def lease(cluster: Any, name: str = 'my-operator') -> dict[str, Any]:
    return cluster.emulator.get_object('leases.coordination.k8s.io', name, namespace='default') or {}


def holder(cluster: Any, name: str = 'my-operator') -> str | None:
    return lease(cluster, name).get('spec', {}).get('holderIdentity')


@pytest.fixture
def handled() -> Handled:
    return collections.Counter()


def shorten(settings: kopf.OperatorSettings, *, lease_name: str = 'my-operator') -> None:
    settings.election.lease_name = lease_name
    settings.election.lease_duration = 2
    settings.election.renew_deadline = 1.2
    settings.election.retry_period = 0.2


@pytest.fixture
def make_operator(make_registry: Callable[[], kopf.OperatorRegistry],
                  settings_factory: Callable[[], kopf.OperatorSettings],
                  handled: Handled, threaded_operator: Any) -> Callable[..., Any]:
    lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def make(name: str, **kwargs: Any) -> AsyncIterator[Any]:
        registry = make_registry()
        settings = settings_factory()
        settings.posting.enabled = False
        shorten(settings)

        @kopf.on.create('kopfexamples', registry=registry)
        def created(name: str, **_: Any) -> None:
            with lock:
                handled[(operator_name, name)] += 1

        operator_name = name
        operator = threaded_operator(registry=registry, settings=settings, namespaces=['default'],
                                    identity=name, **kwargs)
        operator.thread.start()
        try:
            yield operator
        finally:
            operator.stop_flag.set()
            await asyncio.to_thread(operator.thread.join, 10)

    return make


async def test_only_the_leader_handles(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, quiet: Any,
        caplog: pytest.LogCaptureFixture,
) -> None:
    async with make_operator('first'):
        await eventually(lambda: holder(cluster) == 'first')
        async with make_operator('second'), make_operator('third'):
            for index in range(5):
                await cluster.create(f'kex{index}')
            await eventually(lambda: len(handled) == 5)
            await quiet()
            assert holder(cluster) == 'first'
            spec = lease(cluster)['spec']
            assert spec['leaseDurationSeconds'] == 2
            for field in ('acquireTime', 'renewTime'):  # MicroTime: RFC 3339 with microseconds, in UTC
                assert datetime.datetime.strptime(spec[field], '%Y-%m-%dT%H:%M:%S.%fZ')
    assert {operator for operator, _ in handled} == {'first'}
    assert set(handled.values()) == {1}
    assert holder(cluster) == ''  # released on exit
    waiting = [m for m in caplog.messages if m.startswith('Waiting for the lease default/my-operator')]
    assert waiting == ["Waiting for the lease default/my-operator: it is held by 'first'; "
                       "handling nothing until it is released or expires."] * 2  # once per follower


async def test_graceful_exit_releases_the_lease_and_a_follower_takes_over_at_once(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, quiet: Any,
        caplog: pytest.LogCaptureFixture,
) -> None:
    async with make_operator('follower'):
        async with make_operator('leader') as leader:
            await eventually(lambda: holder(cluster) in {'leader', 'follower'})
            first = holder(cluster)
            await cluster.create('kex1')
            await eventually(lambda: len(handled) == 1)
            await leader.stop()
            if first == 'leader':
                assert 'Released the lease default/my-operator.' in caplog.messages
        # Released: taken over within a retry period or two, not after the lease duration.
        await eventually(lambda: holder(cluster) == 'follower', within=1.0)
        await cluster.create('kex2')
        await eventually(lambda: len(handled) == 2)
        await quiet()
    assert set(handled.values()) == {1}
    assert {name for _, name in handled} == {'kex1', 'kex2'}


async def test_faults_on_the_lease_writes_do_not_break_the_election(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, quiet: Any,
) -> None:
    cluster.emulator.fail_requests(3, status=503, path='/leases')
    cluster.emulator.fail_requests(2, status=409, method='PUT', path='/leases')
    async with make_operator('one'), make_operator('two'):
        await eventually(lambda: holder(cluster) in {'one', 'two'})
        for index in range(3):
            await cluster.create(f'kex{index}')
        await eventually(lambda: len(handled) == 3)
        await quiet()
    assert len({operator for operator, _ in handled}) == 1
    assert set(handled.values()) == {1}


async def test_a_leader_that_cannot_renew_stops_handling_before_the_lease_expires(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, quiet: Any,
        caplog: pytest.LogCaptureFixture,
) -> None:
    async with make_operator('only'):
        await eventually(lambda: holder(cluster) == 'only')
        cluster.emulator.fail_requests(None, status=503, path='/leases')
        await eventually(lambda: any('Stopped leading the lease default/my-operator: the lease could not be '
                                     'renewed for 1.2s' in m for m in caplog.messages), within=3)
        await cluster.create('kex1')
        await quiet(period=0.5)
        assert not handled  # not a leader: nothing is handled
        cluster.emulator.clear_faults()
        await eventually(lambda: handled[('only', 'kex1')] == 1, within=5)


OPERATOR_SOURCE = '''
import kopf

@kopf.on.startup()
def configure(settings, **_):
    settings.election.lease_duration = 2
    settings.election.renew_deadline = 1.2
    settings.election.retry_period = 0.2
    settings.posting.enabled = False

@kopf.on.create('kopfexamples')
def created(name, **_):
    print(f'HANDLED {name}', flush=True)
'''


async def test_a_killed_leader_is_replaced_after_the_lease_duration(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, quiet: Any,
        tmp_path: pathlib.Path, start_kopf_process: Any,
) -> None:
    source = tmp_path / 'operator.py'
    source.write_text(textwrap.dedent(OPERATOR_SOURCE))
    output = tmp_path / 'output.txt'
    env = dict(os.environ, KUBECONFIG=str(cluster.emulator.kubeconfig_path))
    args = ['-n', 'default', '--lease', 'default/my-operator', str(source)]
    process = start_kopf_process(args, env, output)
    try:
        await eventually(lambda: holder(cluster) is not None, within=15)
        async with make_operator('follower'):
            await cluster.create('kex1')
            await eventually(lambda: 'HANDLED kex1' in output.read_text(), within=10)
            # Killed only once the outcome is stored: otherwise, handling it again would be right.
            await eventually(lambda: cluster.diffbase('kex1') is not None
                             and not cluster.progress_annotations('kex1'))
            process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(process.wait, 5)
            await cluster.create('kex2')
            await eventually(lambda: holder(cluster) == 'follower', within=5)
            await eventually(lambda: handled[('follower', 'kex2')] == 1, within=5)
            await quiet()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    assert handled == {('follower', 'kex2'): 1}
    assert output.read_text().count('HANDLED') == 1


async def test_a_forced_exit_still_releases_the_lease(
        cluster: Any, eventually: Any, tmp_path: pathlib.Path, start_kopf_process: Any,
) -> None:
    # A second Ctrl+C while the graceful exit releases the lease (slowly here): the release is finished
    # all the same (bounded in time), so that a follower does not wait for the lease's expiry.
    source = tmp_path / 'operator.py'
    source.write_text(textwrap.dedent(OPERATOR_SOURCE))
    output = tmp_path / 'output.txt'
    env = dict(os.environ, KUBECONFIG=str(cluster.emulator.kubeconfig_path))
    args = ['-n', 'default', '--lease', 'default/my-operator', str(source)]
    process = start_kopf_process(args, env, output)
    try:
        await eventually(lambda: bool(holder(cluster)), within=15)
        cluster.emulator.add_latency(1.0, method='PUT', path='/leases')  # the renewals and the release
        process.send_signal(signal.SIGINT)
        await eventually(lambda: 'Stopped leading the lease' in output.read_text(), within=5)
        process.send_signal(signal.SIGINT)
        await eventually(lambda: 'Operator is exiting now' in output.read_text(), within=5)
        await asyncio.to_thread(process.wait, 10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    text = output.read_text()
    assert 'Released the lease default/my-operator.' in text, text
    assert holder(cluster) == '', text
