"""
The whole operator against the emulator: its life from the startup to the cleanup, stopping, embedding.
"""
import asyncio
import concurrent.futures
import gc
import logging
import os
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

import kopf
from kopf._clients import logins
from kopf._clients.vault import Vault
from kopf._cogs.aiokits.aioflags import wait_flag
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError
from kopf._cogs.structs.references import Selector
from kopf._core.actions.errors import PermanentError
from kopf._core.engines.activities import ActivityError
from kopf._core.engines.peering import PeeringError
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import Activity, ActivityHandler, ErrorsMode, HandlerId, WatchingHandler
from kopf._core.intents.registries import OperatorRegistry
from kopf._core.reactor.observation import Insights
from kopf._core.reactor.running import operator, run, run_tasks, spawn_tasks
from kopf._core.reactor.tuning import tuned_gc
from kopf.testing.emulator import KubernetesEmulator

Kube = Any  # the conftest's raw client
Eventually = Callable[..., Coroutine[Any, Any, None]]


def add_activity(registry: OperatorRegistry, activity: Activity, fn: Callable[..., Any]) -> None:
    registry.activities.append(ActivityHandler(fn=fn, id=HandlerId(fn.__name__), activity=activity))


def add_event_handler(registry: OperatorRegistry, name: str, fn: Callable[..., Any]) -> None:
    registry.watching.append(WatchingHandler(fn=fn, id=HandlerId(fn.__name__), selector=Selector(name),
                                             errors=ErrorsMode.IGNORED))


def make_flag(kind: str) -> Any:
    return {
        'asyncio.Event': asyncio.Event,
        'asyncio.Future': lambda: asyncio.get_running_loop().create_future(),
        'concurrent.Future': concurrent.futures.Future,
        'threading.Event': threading.Event,
    }[kind]()


def raise_flag(flag: Any) -> None:
    if isinstance(flag, (asyncio.Future, concurrent.futures.Future)):
        flag.set_result('stop')
    else:
        flag.set()


FLAG_KINDS = ['asyncio.Event', 'asyncio.Future', 'concurrent.Future', 'threading.Event']


@pytest.mark.parametrize('flag_kind', FLAG_KINDS)
async def test_startup_ready_stop_cleanup(
        flag_kind: str, registry: OperatorRegistry, settings: OperatorSettings, kex_crd: None,
        emulator: KubernetesEmulator, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    steps: list[str] = []

    def startup1(**kwargs: Any) -> None:
        steps.append('startup1')
        assert emulator.requests.total == 0  # nothing talks to the API before the startup is over
        assert set(kwargs) >= {'activity', 'settings', 'memo', 'logger', 'param',
                               'retry', 'started', 'runtime'}
        assert kwargs['activity'] == Activity.STARTUP
        assert kwargs['settings'] is settings
        assert kwargs['logger'].name == 'kopf.activities.startup'
        kwargs['memo'].seen = True

    async def startup2(memo: Any, **_: Any) -> None:
        steps.append(f'startup2 memo.seen={memo.seen}')

    def cleanup(**_: Any) -> None:
        steps.append('cleanup')

    add_activity(registry, Activity.STARTUP, startup1)
    add_activity(registry, Activity.STARTUP, startup2)
    add_activity(registry, Activity.CLEANUP, cleanup)
    ready_flag = make_flag(flag_kind)
    stop_flag = make_flag(flag_kind)
    emulator.requests.reset()  # forget the arrangements of the fixtures
    task = asyncio.create_task(operator(registry=registry, settings=settings, clusterwide=True,
                                        ready_flag=ready_flag, stop_flag=stop_flag))

    await asyncio.wait_for(wait_flag(ready_flag), timeout=5)
    assert steps == ['startup1', 'startup2 memo.seen=True']
    assert emulator.requests.count('list', 'customresourcedefinitions') == 1  # observed after the startup

    raise_flag(stop_flag)
    await asyncio.wait_for(task, timeout=5)
    assert steps == ['startup1', 'startup2 memo.seen=True', 'cleanup']
    expected_value = 'stop' if 'Future' in flag_kind else True
    assert f'Stop-flag is set to {expected_value!r}. Operator is stopping.' in caplog.messages
    assert "Activity 'startup1' succeeded." in caplog.messages
    assert 'Initial authentication has been initiated.' in caplog.messages
    assert 'Initial authentication has finished.' in caplog.messages


async def test_settings_changed_in_startup_take_effect(
        registry: OperatorRegistry, settings: OperatorSettings, emulator: KubernetesEmulator,
) -> None:
    def configure(settings: OperatorSettings, **_: Any) -> None:
        settings.scanning.disabled = True

    add_activity(registry, Activity.STARTUP, configure)
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(operator(registry=registry, settings=settings, namespaces=['ns-*'],
                                        ready_flag=ready, stop_flag=stop))
    await asyncio.wait_for(ready.wait(), timeout=5)
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert emulator.requests.count(resource='customresourcedefinitions') == 0
    assert emulator.requests.count(resource='namespaces') == 0


async def test_startup_failure_fails_the_operator_before_any_api_calls(
        registry: OperatorRegistry, settings: OperatorSettings, emulator: KubernetesEmulator,
        caplog: pytest.LogCaptureFixture,
) -> None:
    cleanups: list[str] = []

    def broken(**_: Any) -> None:
        raise PermanentError('nope')

    add_activity(registry, Activity.STARTUP, broken)
    add_activity(registry, Activity.CLEANUP, lambda **_: cleanups.append('cleanup'))
    with pytest.raises(ActivityError) as excinfo:
        await asyncio.wait_for(operator(registry=registry, settings=settings, clusterwide=True), timeout=5)
    assert isinstance(excinfo.value.__cause__, PermanentError)
    assert "Activity 'broken' failed permanently: nope" in caplog.messages
    assert emulator.requests.total == 0
    assert cleanups == []


async def test_no_credentials_fail_the_operator(
        settings: OperatorSettings, emulator: KubernetesEmulator, caplog: pytest.LogCaptureFixture,
) -> None:
    registry = OperatorRegistry()
    add_activity(registry, Activity.AUTHENTICATION, lambda **_: None)
    with pytest.raises(LoginError, match='Ran out of valid credentials'):
        await asyncio.wait_for(operator(registry=registry, settings=settings, clusterwide=True), timeout=5)
    assert 'Initial authentication has failed: no credentials were retrieved from the login handlers.' \
        in caplog.messages
    assert emulator.requests.total == 0


async def test_default_login_functions_use_the_kubeconfig(
        settings: OperatorSettings, emulator: KubernetesEmulator, kube: Kube, kex_crd: None,
        caplog: pytest.LogCaptureFixture, eventually: Eventually,
) -> None:
    caplog.set_level(logging.DEBUG)
    registry = OperatorRegistry()  # no login handlers: the default login functions are used
    seen: list[str] = []
    add_event_handler(registry, 'kopfexamples', lambda body, **_: seen.append(body['metadata']['name']))
    await kube.create_kex('kex1')
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(operator(registry=registry, settings=settings, namespace='default',
                                        ready_flag=ready, stop_flag=stop))
    try:
        await asyncio.wait_for(ready.wait(), timeout=10)
        await eventually(lambda: seen == ['kex1'])
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)
    for fn in logins.default_login_fns():
        assert f'Activity {fn.__name__!r} is invoked.' in caplog.messages


async def test_runtime_crds_and_namespaces_are_served(
        registry: OperatorRegistry, settings: OperatorSettings, kube: Kube, eventually: Eventually,
        caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, 'kopf._core.reactor.queueing')
    seen: list[tuple[str, str | None]] = []
    add_event_handler(registry, 'kopfexamples', lambda body, type, **_: seen.append(
        (f"{body['metadata']['namespace']}/{body['metadata']['name']}", type)))
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(operator(registry=registry, settings=settings, namespaces=['ns-*'],
                                        ready_flag=ready, stop_flag=stop))
    try:
        await asyncio.wait_for(ready.wait(), timeout=5)
        await kube.create_crd()
        await kube.create_namespace('ns-a')
        await kube.create_kex('kex1', namespace='default')  # not served
        await eventually(lambda: "Starting the watch-stream for kopfexamples.v1.kopf.dev in 'ns-a'."
                         in caplog.messages)
        await kube.create_kex('kex1', namespace='ns-a')
        await eventually(lambda: ('ns-a/kex1', 'ADDED') in seen or ('ns-a/kex1', None) in seen)

        await kube.delete_namespace('ns-a')
        await eventually(lambda: "Stopping the watch-stream for kopfexamples.v1.kopf.dev in 'ns-a'."
                         in caplog.messages)
        await kube.create_namespace('ns-b')
        await eventually(lambda: "Starting the watch-stream for kopfexamples.v1.kopf.dev in 'ns-b'."
                         in caplog.messages)
        await kube.delete_crd('kopfexamples.kopf.dev')
        await eventually(lambda: "Stopping the watch-stream for kopfexamples.v1.kopf.dev in 'ns-b'."
                         in caplog.messages)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)
    assert all(not name.startswith('default/') for name, _ in seen)


async def _wait_until_seen(seen: list[str], expected: list[str]) -> None:
    for _ in range(500):
        if seen == expected:
            break
        await asyncio.sleep(0.01)
    assert seen == expected


async def test_running_in_a_non_main_thread(
        registry: OperatorRegistry, settings: OperatorSettings, kube: Kube, kex_crd: None,
) -> None:
    ready, stop = threading.Event(), threading.Event()
    seen: list[str] = []
    add_event_handler(registry, 'kopfexamples', lambda body, **_: seen.append(body['metadata']['name']))
    await kube.create_kex('kex1')

    def main() -> None:
        asyncio.run(operator(registry=registry, settings=settings, clusterwide=True,
                             ready_flag=ready, stop_flag=stop))

    thread = threading.Thread(target=main)
    thread.start()
    try:
        assert await asyncio.to_thread(ready.wait, 5)
        # kex1 first (listed), then kex2 (watched): created only after kex1 is seen, so that the two are not
        # handled at once (then their sync calls could finish in either order, in two threads).
        await _wait_until_seen(seen, ['kex1'])
        await kube.create_kex('kex2')
        await _wait_until_seen(seen, ['kex1', 'kex2'])
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 5)
    assert not thread.is_alive()


async def test_kopf_run_in_a_thread_with_its_own_loop(
        registry: OperatorRegistry, settings: OperatorSettings,
) -> None:
    ready, stop = threading.Event(), concurrent.futures.Future[Any]()
    errors: list[BaseException] = []

    def main() -> None:
        try:
            run(registry=registry, settings=settings, clusterwide=True, ready_flag=ready, stop_flag=stop)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=main)
    thread.start()
    assert await asyncio.to_thread(ready.wait, 5)
    stop.set_result(None)
    await asyncio.to_thread(thread.join, 5)
    assert not thread.is_alive()
    assert errors == []


async def test_two_operators_in_one_process(
        emulator: KubernetesEmulator, settings: OperatorSettings, kube: Kube, kex_crd: None,
) -> None:
    await kube.create_kex('kex1')
    seen: dict[str, list[str]] = {'first': [], 'second': []}
    logins: dict[str, int] = {'first': 0, 'second': 0}
    stops = {'first': threading.Event(), 'second': threading.Event()}
    readies = {'first': threading.Event(), 'second': threading.Event()}
    vaults: dict[str, Vault] = {}

    def main(name: str) -> None:
        registry = OperatorRegistry()

        def login(**_: Any) -> ConnectionInfo:
            logins[name] += 1
            return ConnectionInfo(server=emulator.url)

        add_activity(registry, Activity.AUTHENTICATION, login)
        add_event_handler(registry, 'kopfexamples',
                          lambda body, **_: seen[name].append(body['metadata']['name']))
        vaults[name] = Vault()
        asyncio.run(operator(registry=registry, settings=OperatorSettings(), clusterwide=True,
                             vault=vaults[name], ready_flag=readies[name], stop_flag=stops[name]))

    threads = [threading.Thread(target=main, args=(name,)) for name in ['first', 'second']]
    for thread in threads:
        thread.start()
    try:
        assert await asyncio.to_thread(readies['first'].wait, 5)
        assert await asyncio.to_thread(readies['second'].wait, 5)
        for _ in range(500):
            if seen == {'first': ['kex1'], 'second': ['kex1']}:
                break
            await asyncio.sleep(0.01)
        assert seen == {'first': ['kex1'], 'second': ['kex1']}
        assert logins == {'first': 1, 'second': 1}
        assert vaults['first'] is not vaults['second']
    finally:
        for stop in stops.values():
            stop.set()
        for thread in threads:
            await asyncio.to_thread(thread.join, 5)
    assert not any(thread.is_alive() for thread in threads)


async def test_signal_stops_the_operator_in_the_main_thread(
        registry: OperatorRegistry, settings: OperatorSettings, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    assert threading.current_thread() is threading.main_thread()
    handler_before = signal.getsignal(signal.SIGTERM)
    cleanups: list[str] = []
    add_activity(registry, Activity.CLEANUP, lambda **_: cleanups.append('cleanup'))
    ready = asyncio.Event()
    task = asyncio.create_task(operator(registry=registry, settings=settings, clusterwide=True,
                                        ready_flag=ready))
    await asyncio.wait_for(ready.wait(), timeout=5)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(task, timeout=5)
    assert 'Signal SIGTERM is received. Operator is stopping.' in caplog.messages
    assert cleanups == ['cleanup']
    assert signal.getsignal(signal.SIGTERM) == handler_before


async def test_cancelling_the_operator_runs_the_cleanup(
        registry: OperatorRegistry, settings: OperatorSettings,
) -> None:
    cleanups: list[str] = []
    add_activity(registry, Activity.CLEANUP, lambda **_: cleanups.append('cleanup'))
    ready = asyncio.Event()
    task = asyncio.create_task(operator(registry=registry, settings=settings, clusterwide=True,
                                        ready_flag=ready))
    await asyncio.wait_for(ready.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=5)
    assert cleanups == ['cleanup']


async def test_tasks_left_by_the_handlers_are_cancelled_at_exit(
        registry: OperatorRegistry, settings: OperatorSettings,
) -> None:
    leftovers: list[asyncio.Task[None]] = []

    async def sleep_forever() -> None:
        await asyncio.Event().wait()

    async def startup(**_: Any) -> None:
        leftovers.append(asyncio.create_task(sleep_forever()))

    add_activity(registry, Activity.STARTUP, startup)
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(operator(registry=registry, settings=settings, clusterwide=True,
                                        ready_flag=ready, stop_flag=stop))
    await asyncio.wait_for(ready.wait(), timeout=5)
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert leftovers[0].cancelled()


async def test_ultimate_exiting_timeout_cuts_the_long_cleanup(
        registry: OperatorRegistry, settings: OperatorSettings, caplog: pytest.LogCaptureFixture,
) -> None:
    settings.process.ultimate_exiting_timeout = 0.2

    async def endless_cleanup(**_: Any) -> None:
        await asyncio.Event().wait()

    add_activity(registry, Activity.CLEANUP, endless_cleanup)
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(operator(registry=registry, settings=settings, clusterwide=True,
                                        ready_flag=ready, stop_flag=stop))
    await asyncio.wait_for(ready.wait(), timeout=5)
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert 'The operator has not exited in 0.2 seconds; cancelling it forcefully.' in caplog.messages


async def test_manual_orchestration_with_spawn_and_run_tasks(
        registry: OperatorRegistry, settings: OperatorSettings,
) -> None:
    insights = Insights()
    stop = asyncio.Event()
    existing_tasks = asyncio.all_tasks()  # otherwise, they are "hung" tasks, and are cancelled at exit
    tasks = await spawn_tasks(registry=registry, settings=settings, clusterwide=True, stop_flag=stop,
                              insights=insights)
    await asyncio.wait_for(insights.watching.wait(), timeout=5)
    assert insights.namespaces == {None}
    stop.set()
    await run_tasks(tasks, ignored=existing_tasks)
    assert all(task.done() for task in tasks)


async def test_failing_core_task_fails_the_operator(
        settings: OperatorSettings, emulator: KubernetesEmulator, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    registry = OperatorRegistry()
    calls: list[int] = []

    def login(**_: Any) -> ConnectionInfo | None:
        calls.append(1)
        return ConnectionInfo(server=emulator.url, token='only-once') if len(calls) == 1 else None

    add_activity(registry, Activity.AUTHENTICATION, login)
    emulator.fail_requests(1, status=401)  # the only credentials are rejected: a re-login brings nothing
    with pytest.raises(LoginError):
        await asyncio.wait_for(operator(registry=registry, settings=settings, clusterwide=True), timeout=5)
    assert len(calls) == 2
    assert 'Re-authentication has been initiated.' in caplog.messages


def test_namespaces_and_clusterwide_are_mutually_exclusive() -> None:
    with pytest.raises(TypeError, match='not both'):
        asyncio.run(spawn_tasks(registry=OperatorRegistry(), clusterwide=True, namespaces=['ns1']))


async def test_neither_namespaces_nor_clusterwide_warns_and_serves_the_cluster(
        registry: OperatorRegistry, settings: OperatorSettings,
) -> None:
    insights = Insights()
    stop = asyncio.Event()
    existing_tasks = asyncio.all_tasks()
    with pytest.warns(FutureWarning, match='serving the whole cluster'):
        tasks = await spawn_tasks(registry=registry, settings=settings, stop_flag=stop, insights=insights)
    await asyncio.wait_for(insights.watching.wait(), timeout=5)
    assert insights.namespaces == {None}
    assert settings.peering.clusterwide
    stop.set()
    await run_tasks(tasks, ignored=existing_tasks)


async def test_peering_options_go_to_the_settings_and_a_missing_mandatory_peering_fails(
        registry: OperatorRegistry, settings: OperatorSettings,
) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(operator(registry=registry, settings=settings, namespaces=['ns1'],
                                        peering_name='example', priority=100, stop_flag=stop))
    with pytest.raises(PeeringError, match="The mandatory peering 'example' cannot be used"):
        await asyncio.wait_for(task, timeout=5)
    assert settings.peering.name == 'example'
    assert settings.peering.mandatory
    assert settings.peering.priority == 100
    assert not settings.peering.clusterwide


async def test_admission_handlers_without_a_webhook_server_fail_the_start(
        registry: OperatorRegistry, settings: OperatorSettings,
) -> None:
    @kopf.on.validate('kopfexamples', id='check', registry=registry)
    def check(**_: Any) -> None:
        pass

    expected = r"Admission handlers exist \('check'\), but no webhook server/tunnel"
    with pytest.raises(RuntimeError, match=expected):
        await asyncio.wait_for(operator(registry=registry, settings=settings, namespaces=['ns1']), timeout=5)


@pytest.fixture
def default_gc_thresholds() -> Iterator[tuple[int, int, int]]:
    """CPython's default thresholds during the test, whatever the test session has; restored after."""
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield gc.get_threshold()
    finally:
        gc.set_threshold(*saved)


async def run_and_peek_at_gc(registry: OperatorRegistry, settings: OperatorSettings) -> tuple[int, int, int]:
    """Run the operator until it is ready; return the GC thresholds while it runs."""
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(operator(registry=registry, settings=settings, namespaces=['ns'],
                                        ready_flag=ready, stop_flag=stop))
    try:
        await asyncio.wait_for(ready.wait(), timeout=5)
        return gc.get_threshold()
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)


async def test_gc_threshold_is_raised_while_running_and_restored_after(
        registry: OperatorRegistry, settings: OperatorSettings, emulator: KubernetesEmulator,
        default_gc_thresholds: tuple[int, int, int],
) -> None:
    assert settings.process.gc_threshold == 10_000
    thresholds = await run_and_peek_at_gc(registry, settings)
    assert thresholds == (10_000, 10, 10)
    assert gc.get_threshold() == default_gc_thresholds


async def test_gc_threshold_from_the_startup_settings_or_none_for_untouched(
        registry: OperatorRegistry, settings: OperatorSettings, emulator: KubernetesEmulator,
        default_gc_thresholds: tuple[int, int, int],
) -> None:
    values = iter([None, 5000])

    def configure(settings: OperatorSettings, **_: Any) -> None:
        settings.process.gc_threshold = next(values)

    add_activity(registry, Activity.STARTUP, configure)
    assert await run_and_peek_at_gc(registry, settings) == default_gc_thresholds
    assert await run_and_peek_at_gc(registry, settings) == (5000, 10, 10)
    assert gc.get_threshold() == default_gc_thresholds


async def test_gc_threshold_higher_than_ours_is_kept(
        registry: OperatorRegistry, settings: OperatorSettings, emulator: KubernetesEmulator,
        default_gc_thresholds: tuple[int, int, int],
) -> None:
    gc.set_threshold(50_000, 20, 20)
    assert await run_and_peek_at_gc(registry, settings) == (50_000, 20, 20)
    assert gc.get_threshold() == (50_000, 20, 20)


def test_gc_tuning_of_overlapping_operators_ends_with_the_last_one(
        default_gc_thresholds: tuple[int, int, int]) -> None:
    first, second = tuned_gc(10_000), tuned_gc(20_000)
    first.__enter__()
    second.__enter__()
    assert gc.get_threshold() == (20_000, 10, 10)
    first.__exit__(None, None, None)
    assert gc.get_threshold() == (20_000, 10, 10)  # the second one still runs
    second.__exit__(None, None, None)
    assert gc.get_threshold() == default_gc_thresholds


def test_gc_thresholds_changed_by_the_process_meanwhile_are_not_overwritten(
        default_gc_thresholds: tuple[int, int, int]) -> None:
    with tuned_gc(10_000):
        assert gc.get_threshold() == (10_000, 10, 10)
        gc.set_threshold(3000, 5, 5)  # e.g. by the application that embeds the operator
    assert gc.get_threshold() == (3000, 5, 5)
