"""
Kopf-compatible peering: several operators (in-process, and killed ones as subprocesses) in one peering.

Every operator records which objects its handlers have handled, so that "exactly once overall"
is checked across all the operators. The peering's lifetimes are short (seconds), the waits are
for the outcomes (with timeouts), never for fixed periods.
"""
import asyncio
import collections
import contextlib
import datetime
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import yaml

import kopf
from kopf._core.engines.peering import PeeringError

REPO = pathlib.Path(__file__).resolve().parents[3]
PEERING = '/apis/kopf.dev/v1/namespaces/default/kopfpeerings'
CLUSTER_PEERING = '/apis/kopf.dev/v1/clusterkopfpeerings'

Handled = collections.Counter[tuple[str, str]]  # (operator, object name) -> how many times


@pytest.fixture
async def peering_crds(cluster: Any) -> None:
    for doc in yaml.safe_load_all((REPO / 'peering.yaml').read_text()):
        if doc:
            await cluster.request('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', doc)


@pytest.fixture
async def default_peering(cluster: Any, peering_crds: None) -> None:
    await cluster.request('POST', PEERING, {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfPeering',
                                            'metadata': {'name': 'default', 'namespace': 'default'}})


def peers(cluster: Any, name: str = 'default', namespace: str | None = 'default') -> dict[str, Any]:
    plural = 'kopfpeerings.kopf.dev' if namespace else 'clusterkopfpeerings.kopf.dev'
    body = cluster.emulator.get_object(plural, name, namespace=namespace) or {}
    return dict(body.get('status') or {})


@pytest.fixture
def handled() -> Handled:
    return collections.Counter()


@pytest.fixture
def make_operator(make_registry: Callable[[], kopf.OperatorRegistry],
                  settings_factory: Callable[[], kopf.OperatorSettings],
                  handled: Handled, threaded_operator: Any) -> Callable[..., Any]:
    """Start an operator (not standalone) whose creation handler counts the objects it handles."""
    lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def make(name: str, *, priority: int = 0, lifetime: float = 3, namespaces: Any = ('default',),
                   **kwargs: Any) -> AsyncIterator[Any]:
        registry = make_registry()
        settings = settings_factory()
        settings.peering.lifetime = lifetime
        settings.posting.enabled = False

        @kopf.on.create('kopfexamples', registry=registry)
        def created(name: str, **_: Any) -> None:
            with lock:
                handled[(operator_name, name)] += 1

        operator_name = name
        operator = threaded_operator(registry=registry, settings=settings, priority=priority,
                                    namespaces=list(namespaces), **kwargs)
        operator.thread.start()
        try:
            yield operator
        finally:
            operator.stop_flag.set()
            await asyncio.to_thread(operator.thread.join, 10)

    return make


async def stop(operator: Any) -> None:
    await operator.stop()


def by_operator(handled: Handled) -> dict[str, set[str]]:
    result: dict[str, set[str]] = collections.defaultdict(set)
    for (operator, name) in handled:
        result[operator].add(name)
    return dict(result)


async def test_the_higher_priority_handles_and_the_lower_one_pauses(
        cluster: Any, default_peering: None, make_operator: Any, handled: Handled, eventually: Any,
        caplog: pytest.LogCaptureFixture,
) -> None:
    async with make_operator('low', priority=10), make_operator('high', priority=20):
        await eventually(lambda: len(peers(cluster)) == 2)
        await eventually(lambda: any('Pausing operations in favour of' in m for m in caplog.messages))
        for index in range(5):
            await cluster.create(f'kex{index}')
        await eventually(lambda: len(handled) == 5)
        await asyncio.sleep(0)  # nothing else is awaited: the check below is the outcome
        assert by_operator(handled) == {'high': {f'kex{i}' for i in range(5)}}
        assert set(handled.values()) == {1}

        # Kopf's own format of the records: priority, lifetime, lastseen (ISO with the timezone).
        records = sorted(peers(cluster).values(), key=lambda record: record['priority'])
        assert [(record['priority'], record['lifetime']) for record in records] == [(10, 3), (20, 3)]
        for record in records:
            assert datetime.datetime.fromisoformat(record['lastseen']).tzinfo is not None
    assert peers(cluster) == {}  # both have removed their records on exit


async def test_graceful_exit_of_the_higher_one_resumes_the_lower_one_at_once(
        cluster: Any, default_peering: None, make_operator: Any, handled: Handled, eventually: Any,
        quiet: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    async with make_operator('low', priority=10, lifetime=60):
        async with make_operator('high', priority=20, lifetime=60) as high:
            await eventually(lambda: len(peers(cluster)) == 2)
            # Both records are there, but the low one pauses only once it sees the high one's (a race in CI).
            await eventually(lambda: any('Pausing operations in favour of' in m for m in caplog.messages))
            await cluster.create('kex1')
            await eventually(lambda: handled[('high', 'kex1')] == 1)
            await stop(high)
        # The lifetime is 60 s: only the removal of the record can resume the low one within the timeout.
        await eventually(lambda: len(peers(cluster)) == 1)
        await cluster.create('kex2')
        await eventually(lambda: handled[('low', 'kex2')] == 1, within=5)
        await quiet()
    assert handled == {('high', 'kex1'): 1, ('low', 'kex2'): 1}  # kex1 is not handled again after resuming


async def test_same_priorities_pause_everyone_with_a_warning(
        cluster: Any, default_peering: None, make_operator: Any, handled: Handled, eventually: Any,
        caplog: pytest.LogCaptureFixture, quiet: Any,
) -> None:
    async with make_operator('one', priority=5):
        async with make_operator('two', priority=5) as two:
            await eventually(lambda: any('Possibly conflicting operators with the same priority' in m
                                         for m in caplog.messages))
            await eventually(lambda: sum('Pausing all operators, including self' in m
                                         for m in caplog.messages) == 2)
            await cluster.create('kex1')
            await quiet()
            assert not handled  # nobody handles while the conflict lasts
            await stop(two)
        await eventually(lambda: handled[('one', 'kex1')] == 1)
        assert 'Resuming operations after the pause. Conflicting operators with the same priority are gone.' \
            in caplog.messages


async def test_expired_peers_are_ignored_and_garbage_collected(
        cluster: Any, default_peering: None, make_operator: Any, handled: Handled, eventually: Any,
) -> None:
    dead = {'priority': 100, 'lifetime': 1, 'lastseen': '2020-01-01T00:00:00+00:00'}
    await cluster.request('PATCH', f'{PEERING}/default', {'status': {'dead@host/1': dead}},
                          content_type='application/merge-patch+json')
    async with make_operator('alive', priority=0):
        await eventually(lambda: 'dead@host/1' not in peers(cluster))
        await cluster.create('kex1')
        await eventually(lambda: handled[('alive', 'kex1')] == 1)


async def test_the_lower_one_resumes_when_the_higher_ones_lifetime_expires(
        cluster: Any, default_peering: None, make_operator: Any, handled: Handled, eventually: Any,
        quiet: Any,
) -> None:
    # As if the higher peer has been killed: its record stays, but is not renewed anymore.
    lastseen = datetime.datetime.now(datetime.UTC).isoformat()
    higher = {'priority': 100, 'lifetime': 2, 'lastseen': lastseen}
    await cluster.request('PATCH', f'{PEERING}/default', {'status': {'killed@host/1': higher}},
                          content_type='application/merge-patch+json')
    async with make_operator('low', priority=0):
        await cluster.create('kex1')
        await eventually(lambda: handled[('low', 'kex1')] == 1, within=6)
        assert 'killed@host/1' not in peers(cluster)


async def test_mandatory_peering_that_does_not_exist_is_waited_for_with_how_to_create_it(
        cluster: Any, peering_crds: None, make_operator: Any, handled: Handled, eventually: Any,
        caplog: pytest.LogCaptureFixture,
) -> None:
    # As Kopf's docs say: "If the peering object does not exist, the operator will pause at the start."
    async with make_operator('op', peering_name='missing') as operator:
        await cluster.create('kex1')
        await eventually(lambda: any('Waiting for the mandatory peering' in m for m in caplog.messages))
        message = next(m for m in caplog.messages if 'Waiting for the mandatory peering' in m)
        assert "Waiting for the mandatory peering KopfPeering 'missing' in the namespace 'default'" in message
        assert 'kind: KopfPeering' in message and 'name: missing' in message and '--standalone' in message
        assert not handled and not operator.errors

        await cluster.request('POST', PEERING, {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfPeering',
                                                'metadata': {'name': 'missing', 'namespace': 'default'}})
        await eventually(lambda: handled[('op', 'kex1')] == 1, within=10)
        assert any("The mandatory peering KopfPeering 'missing' in the namespace 'default' exists now." in m
                   for m in caplog.messages)
        assert len(peers(cluster, name='missing')) == 1  # it takes part in the peering now
    assert not operator.errors


async def test_mandatory_peering_without_the_crds_says_to_install_them(
        cluster: Any, make_operator: Any,
) -> None:
    async with make_operator('op', peering_name='example') as operator:
        await operator.wait(within=5)
    assert len(operator.errors) == 1 and isinstance(operator.errors[0], PeeringError)
    message = str(operator.errors[0])
    assert 'does not serve KopfPeering (kopfpeerings.kopf.dev); install the peering CRDs' in message


async def test_absent_default_peering_means_the_standalone_mode(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    async with make_operator('op'):
        await cluster.create('kex1')
        await eventually(lambda: handled[('op', 'kex1')] == 1)
    assert "The default peering is not found in the namespace 'default'; running in the standalone mode." \
        in caplog.messages


async def test_clusterwide_operators_use_the_cluster_peering(
        cluster: Any, peering_crds: None, make_registry: Any, settings_factory: Any, eventually: Any,
) -> None:
    await cluster.request('POST', CLUSTER_PEERING, {'apiVersion': 'kopf.dev/v1', 'kind': 'ClusterKopfPeering',
                                                    'metadata': {'name': 'example'}})
    stop_flag = asyncio.Event()
    task = asyncio.create_task(kopf.operator(registry=make_registry(), settings=settings_factory(),
                                             clusterwide=True, peering_name='example', priority=7,
                                             identity='me@here', stop_flag=stop_flag))
    try:
        await eventually(lambda: 'me@here' in peers(cluster, 'example', namespace=None))
        assert peers(cluster, 'example', namespace=None)['me@here']['priority'] == 7
    finally:
        stop_flag.set()
        await asyncio.wait_for(task, timeout=10)
    assert peers(cluster, 'example', namespace=None) == {}


async def test_server_errors_and_conflicts_on_keepalives_are_retried(
        cluster: Any, default_peering: None, make_operator: Any, handled: Handled, eventually: Any,
        quiet: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    cluster.emulator.fail_requests(2, status=503, verb='patch', path='kopfpeerings')
    cluster.emulator.fail_requests(1, status=409, verb='patch', path='kopfpeerings')
    async with (make_operator('low', priority=10, lifetime=1.5),
                make_operator('high', priority=20, lifetime=1.5)):
        await eventually(lambda: len(peers(cluster)) == 2, within=8)
        # Both records are stored, but the lower one pauses only once its watch-stream brings the higher one.
        await eventually(lambda: any('Pausing operations in favour of' in m for m in caplog.messages),
                         within=8)
        for index in range(3):
            await cluster.create(f'kex{index}')
        await eventually(lambda: len(handled) == 3)
        await quiet()
    assert by_operator(handled) == {'high': {'kex0', 'kex1', 'kex2'}}
    assert set(handled.values()) == {1}


OPERATOR_SOURCE = '''
import os
import kopf

@kopf.on.startup()
def configure(settings, **_):
    settings.peering.lifetime = float(os.environ['PEERING_LIFETIME'])
    settings.posting.enabled = False

@kopf.on.create('kopfexamples')
def created(name, **_):
    print(f'HANDLED {name}', flush=True)
'''


async def test_a_killed_higher_one_is_replaced_after_its_lifetime(
        cluster: Any, default_peering: None, make_operator: Any, handled: Handled, eventually: Any,
        tmp_path: pathlib.Path, quiet: Any, start_kopf_process: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    # The order is strict, so that no step depends on how fast the operators are (e.g. on a loaded CI):
    # * The low one starts only when the high one is in the peering: it pauses from the start (it never
    #   handles before it has seen the peers), rather than starting to handle and pausing moments later.
    # * kex1 is handled by the high one before the low one starts: if a keep-alive of the high one is late
    #   (its lifetime is short: only a third of it is the margin), the low one resumes for a moment, but
    #   finds kex1 handled. Only kex2 depends on the pausing & resuming, and it is created after the kill.
    source = tmp_path / 'operator.py'
    source.write_text(textwrap.dedent(OPERATOR_SOURCE))
    output = tmp_path / 'output.txt'
    env = dict(os.environ, KUBECONFIG=str(cluster.emulator.kubeconfig_path), PEERING_LIFETIME='2')
    process = start_kopf_process(['-n', 'default', '--priority', '100', str(source)], env, output)

    def high_ids() -> set[str]:
        return {id for id, record in peers(cluster).items() if record.get('priority') == 100}

    try:
        await eventually(lambda: bool(high_ids()), within=30)  # a new process: the imports take a while
        [high_id] = high_ids()
        await cluster.create('kex1')
        await eventually(lambda: 'HANDLED kex1' in output.read_text(), within=15)
        # The outcome is stored: otherwise, handling it again after the kill would be right.
        await eventually(lambda: cluster.diffbase('kex1') is not None
                         and not cluster.progress_annotations('kex1'), within=10)

        async with make_operator('low', priority=0):
            await eventually(lambda: any(m.startswith('Pausing operations in favour of [<Peer ' + high_id)
                                         for m in caplog.messages), within=10)
            await eventually(lambda: len(peers(cluster)) == 2, within=10)
            process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(process.wait, 10)
            await cluster.create('kex2')
            # The killed one cannot remove its record: it is removed by the low one once expired (2 s).
            await eventually(lambda: handled[('low', 'kex2')] == 1, within=15)
            await eventually(lambda: high_id not in peers(cluster), within=5)
            await quiet()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert handled == {('low', 'kex2'): 1}  # kex1 was handled by the killed one: not again
    assert output.read_text().count('HANDLED') == 1


def kopf_command(cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=str(cluster.emulator.kubeconfig_path))
    return subprocess.run([sys.executable, '-m', 'kopf', *args], env=env, capture_output=True, text=True,
                          timeout=30)


async def test_freeze_and_resume_commands_pause_and_resume_the_operators(
        cluster: Any, default_peering: None, make_operator: Any, handled: Handled, eventually: Any,
        quiet: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    async with make_operator('op', priority=10, lifetime=60):
        await eventually(lambda: len(peers(cluster)) == 1)
        result = await asyncio.to_thread(kopf_command, cluster, 'freeze', '-n', 'default', '-P', 'default',
                                         '-p', '100', '-t', '60', '-i', 'admin@console', '-m', 'maintenance')
        assert result.returncode == 0, result.stderr
        assert peers(cluster)['admin@console']['priority'] == 100
        assert peers(cluster)['admin@console']['lifetime'] == 60
        await eventually(lambda: any('Pausing operations in favour of [<Peer admin@console: priority=100, '
                                     'lifetime=60' in m for m in caplog.messages))
        await cluster.create('kex1')
        await quiet()
        assert not handled

        result = await asyncio.to_thread(kopf_command, cluster, 'resume', '-n', 'default', '-P', 'default',
                                         '-i', 'admin@console')
        assert result.returncode == 0, result.stderr
        assert 'admin@console' not in peers(cluster)
        await eventually(lambda: handled[('op', 'kex1')] == 1)
        await quiet()
    assert handled == {('op', 'kex1'): 1}


async def test_freeze_of_a_peering_that_does_not_exist_fails_clearly(
        cluster: Any, peering_crds: None,
) -> None:
    args = ['freeze', '-A', '-P', 'nope', '-p', '1', '-t', '9']
    result = await asyncio.to_thread(kopf_command, cluster, *args)
    assert result.returncode == 1
    assert "The mandatory peering ClusterKopfPeering 'nope' does not exist; create it" in result.stderr
    assert 'kind: ClusterKopfPeering' in result.stderr


async def test_freeze_by_default_uses_the_user_and_host_as_the_identity(
        cluster: Any, peering_crds: None,
) -> None:
    await cluster.request('POST', CLUSTER_PEERING, {'apiVersion': 'kopf.dev/v1', 'kind': 'ClusterKopfPeering',
                                                    'metadata': {'name': 'default'}})
    args = ['freeze', '-A', '-P', 'default', '--dev', '-p', '1', '-t', '9']
    result = await asyncio.to_thread(kopf_command, cluster, *args)
    assert result.returncode == 0, result.stderr
    [(identity, record)] = peers(cluster, namespace=None).items()
    assert '@' in identity and '/' not in identity
    assert record['priority'] == 666 and record['lifetime'] == 9


async def test_freeze_without_a_priority_freezes_with_100_as_in_kopf(
        cluster: Any, peering_crds: None,
) -> None:
    await cluster.request('POST', CLUSTER_PEERING, {'apiVersion': 'kopf.dev/v1', 'kind': 'ClusterKopfPeering',
                                                    'metadata': {'name': 'default'}})
    result = await asyncio.to_thread(kopf_command, cluster, 'freeze', '-A', '-P', 'default', '-t', '9',
                                     '-i', 'admin', '--log-format', 'JSON')
    assert result.returncode == 0, result.stderr
    assert peers(cluster, namespace=None)['admin']['priority'] == 100
    assert '"message": "Frozen the operators of the peering' in result.stderr + result.stdout


async def test_forbidden_peering_means_the_standalone_mode_with_a_warning(
        cluster: Any, default_peering: None, make_operator: Any, handled: Handled, eventually: Any,
        caplog: pytest.LogCaptureFixture,
) -> None:
    cluster.emulator.fail_requests(None, status=403, path='kopfpeerings')  # e.g. no RBAC for the peering
    async with make_operator('op'):
        await cluster.create('kex1')
        await eventually(lambda: handled[('op', 'kex1')] == 1)
    assert any(message.startswith('The peering cannot be detected (running in the standalone mode): HTTP 403')
               for message in caplog.messages)


async def test_pausing_stops_the_daemons_and_resuming_starts_them_as_for_new_objects(
        cluster: Any, default_peering: None, make_registry: Any, settings_factory: Any, eventually: Any,
        threaded_operator: Any,
) -> None:
    from kopf._core.engines.daemons import DaemonStoppingReason
    registry = make_registry()
    settings = settings_factory()
    settings.posting.enabled = False
    settings.process.ultimate_exiting_timeout = 20
    events: list[tuple[str, str, Any]] = []
    lock = threading.Lock()

    @kopf.daemon('kopfexamples', registry=registry)
    def monitor(name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
        with lock:
            events.append(('started', name, None))
        stopped.wait()
        with lock:
            events.append(('stopped', name, stopped.reason))

    await cluster.create('kex1')
    await cluster.create('kex2')
    operator = threaded_operator(registry=registry, settings=settings, priority=0, namespaces=['default'],
                                identity='me')
    operator.thread.start()
    try:
        await eventually(lambda: len(events) == 2)
        now = datetime.datetime.now(datetime.UTC).isoformat()
        freeze = {'status': {'admin': {'priority': 100, 'lifetime': 60, 'lastseen': now}}}
        await cluster.request('PATCH', f'{PEERING}/default', freeze,
                              content_type='application/merge-patch+json')  # as kopf freeze does
        await eventually(lambda: len(events) == 4)
        assert {(event, name) for event, name, _ in events[2:]} == {('stopped', 'kex1'), ('stopped', 'kex2')}
        assert all(reason is not None and reason & DaemonStoppingReason.OPERATOR_PAUSING
                   for _, _, reason in events[2:])

        await cluster.delete('kex2')  # while paused: it must not be revived
        await cluster.request('PATCH', f'{PEERING}/default', {'status': {'admin': None}},
                              content_type='application/merge-patch+json')
        await eventually(lambda: len(events) == 5)
        assert events[4][:2] == ('started', 'kex1')
    finally:
        await operator.stop()
    started = [name for event, name, _ in events if event == 'started']
    assert sorted(started[:2]) == ['kex1', 'kex2'] and started[2:] == ['kex1']  # kex2 is not revived


async def test_keepalives_are_logged_unless_stealth(
        cluster: Any, default_peering: None, make_operator: Any, eventually: Any,
        caplog: pytest.LogCaptureFixture, settings_factory: Any, make_registry: Any, threaded_operator: Any,
) -> None:
    async with make_operator('loud'):
        await eventually(lambda: "Keep-alive in 'default' in 'default': ok." in caplog.messages)
    caplog.clear()

    settings = settings_factory()
    settings.peering.stealth = True
    operator = threaded_operator(registry=make_registry(), settings=settings, namespaces=['default'],
                                identity='quiet')
    operator.thread.start()
    try:
        await eventually(lambda: 'quiet' in peers(cluster))  # the keep-alives are sent anyway
    finally:
        await operator.stop()
    assert not any(message.startswith('Keep-alive in') for message in caplog.messages)


async def test_the_former_api_group_is_used_if_only_it_is_served(
        cluster: Any, make_operator: Any, handled: Handled, eventually: Any,
) -> None:
    for doc in yaml.safe_load_all((REPO / 'peering.yaml').read_text()):
        if doc:
            doc['metadata']['name'] = doc['metadata']['name'].replace('kopf.dev', 'kopf.zalando.org')
            doc['spec']['group'] = 'kopf.zalando.org'
            await cluster.request('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', doc)
    await cluster.request('POST', '/apis/kopf.zalando.org/v1/namespaces/default/kopfpeerings',
                          {'apiVersion': 'kopf.zalando.org/v1', 'kind': 'KopfPeering',
                           'metadata': {'name': 'legacy', 'namespace': 'default'}})
    async with make_operator('op', peering_name='legacy'):
        await eventually(lambda: len((cluster.emulator.get_object('kopfpeerings.kopf.zalando.org', 'legacy',
                                                                  namespace='default') or {})
                                     .get('status') or {}) == 1)
        await cluster.create('kex1')
        await eventually(lambda: handled[('op', 'kex1')] == 1)


async def test_namespaced_operators_peer_in_every_served_namespace(
        cluster: Any, default_peering: None, make_operator: Any, handled: Handled, eventually: Any,
        quiet: Any,
) -> None:
    await cluster.create_namespace('other')
    await cluster.request('POST', '/apis/kopf.dev/v1/namespaces/other/kopfpeerings',
                          {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfPeering',
                           'metadata': {'name': 'default', 'namespace': 'other'}})
    async with make_operator('op', namespaces=['default', 'other']):
        await eventually(lambda: len(peers(cluster)) == 1 and len(peers(cluster, namespace='other')) == 1)
        # A higher priority in one of the namespaces pauses the whole operator (as in Kopf).
        now = datetime.datetime.now(datetime.UTC).isoformat()
        freeze = {'status': {'admin': {'priority': 100, 'lifetime': 60, 'lastseen': now}}}
        await cluster.request('PATCH', '/apis/kopf.dev/v1/namespaces/other/kopfpeerings/default', freeze,
                              content_type='application/merge-patch+json')
        await quiet()
        await cluster.create('kex1')
        await cluster.create('kex2', namespace='other')
        await quiet()
        assert not handled
        await cluster.request('PATCH', '/apis/kopf.dev/v1/namespaces/other/kopfpeerings/default',
                              {'status': {'admin': None}}, content_type='application/merge-patch+json')
        await eventually(lambda: handled == {('op', 'kex1'): 1, ('op', 'kex2'): 1})
