"""
The operators as a whole: settings from the startup handlers, several operators, threads, graceful exits.
"""
import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]  # the conftest's factory of running operators (async context managers)
Eventually = Callable[..., Any]
Quiet = Callable[..., Any]

FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'


class ThreadedOperator:
    """``kopf.run()`` in a thread of its own (with its own event loop), stopped via a threading event."""

    def __init__(self, **kwargs: Any) -> None:
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._main, kwargs=kwargs, daemon=True)

    def _main(self, **kwargs: Any) -> None:
        try:
            kopf.run(standalone=True, stop_flag=self.stop_flag, ready_flag=self.ready_flag, **kwargs)
        except BaseException as e:
            self.errors.append(e)

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), 'The operator in a thread has not exited.'
        assert self.errors == []


@pytest.fixture
def threaded() -> Iterator[Callable[..., ThreadedOperator]]:
    operators: list[ThreadedOperator] = []

    def start(**kwargs: Any) -> ThreadedOperator:
        operator = ThreadedOperator(**kwargs)
        operators.append(operator)
        operator.thread.start()
        return operator

    yield start
    for operator in operators:
        operator.stop_flag.set()
    for operator in operators:
        operator.thread.join(timeout=10)


async def test_settings_changed_in_a_startup_handler_take_effect(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    deleted: list[str] = []

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = 'example.com/my-finalizer'
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix='my-op.example.com')
        settings.posting.enabled = False
        settings.posting.loggers = True  # would post everything, if the posting were enabled

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(body: Any, **_: Any) -> Any:
        kopf.info(body, reason='Explicit', message='Not to be posted.')
        return 'created'

    @kopf.on.delete('kopfexamples', registry=registry)
    def delete_fn(name: str, **_: Any) -> None:
        deleted.append(name)

    async with operator(registry, settings):
        await cluster.create('kex1')
        await eventually(lambda: bool((cluster.get() or {}).get('status')))
        await quiet()
        metadata = cluster.get()['metadata']
        assert metadata['finalizers'] == ['example.com/my-finalizer']
        assert 'my-op.example.com/last-handled-configuration' in metadata['annotations']
        assert 'kopf.zalando.org/last-handled-configuration' not in metadata['annotations']

        await cluster.delete('kex1')
        await eventually(lambda: cluster.get() is None)
        await quiet()

    assert deleted == ['kex1']
    assert cluster.emulator.requests.count('create', 'events') == 0


async def test_two_operators_in_threads_with_separate_registries_settings_and_namespaces(
        make_registry: Callable[[], kopf.OperatorRegistry],
        settings_factory: Callable[[], kopf.OperatorSettings],
        cluster: Cluster, eventually: Eventually, quiet: Quiet,
        threaded: Callable[..., ThreadedOperator],
) -> None:
    await cluster.create_namespace('ns-a')
    await cluster.create_namespace('ns-b')
    calls: list[tuple[str, str]] = []

    def make_operator(title: str) -> tuple[kopf.OperatorRegistry, kopf.OperatorSettings]:
        registry = make_registry()
        settings = settings_factory()
        settings.persistence.finalizer = f'{title}.example.com/finalizer'

        @kopf.on.create('kopfexamples', registry=registry)
        def create_fn(namespace: str, **_: Any) -> Any:
            calls.append((title, namespace))
            return title

        @kopf.on.delete('kopfexamples', registry=registry)
        def delete_fn(**_: Any) -> None:
            pass

        return registry, settings

    registry_a, settings_a = make_operator('a')
    registry_b, settings_b = make_operator('b')
    operator_a = threaded(registry=registry_a, settings=settings_a, namespaces=['ns-a'])
    operator_b = threaded(registry=registry_b, settings=settings_b, namespaces=['ns-b'])
    await eventually(lambda: operator_a.ready_flag.is_set() and operator_b.ready_flag.is_set())
    await eventually(lambda: cluster.emulator.open_watches >= 2 + 2)  # the CRDs and the objects of each

    await cluster.create('kex1', namespace='ns-a')
    await cluster.create('kex1', namespace='ns-b')
    await eventually(lambda: bool((cluster.get('kex1', namespace='ns-a') or {}).get('status')))
    await eventually(lambda: bool((cluster.get('kex1', namespace='ns-b') or {}).get('status')))
    await quiet()
    operator_a.stop()
    operator_b.stop()

    assert sorted(calls) == [('a', 'ns-a'), ('b', 'ns-b')]
    object_a = cluster.get('kex1', namespace='ns-a')
    object_b = cluster.get('kex1', namespace='ns-b')
    assert object_a['status'] == {'create_fn': 'a'}
    assert object_b['status'] == {'create_fn': 'b'}
    assert object_a['metadata']['finalizers'] == ['a.example.com/finalizer']
    assert object_b['metadata']['finalizers'] == ['b.example.com/finalizer']


async def test_kopf_run_in_a_non_main_thread_with_a_threading_stop_flag(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        eventually: Eventually, quiet: Quiet, threaded: Callable[..., ThreadedOperator],
) -> None:
    threads: list[str] = []

    @kopf.on.create('kopfexamples', registry=registry)
    async def create_fn(**_: Any) -> Any:
        threads.append(threading.current_thread().name)
        return 'created'

    operator = threaded(registry=registry, settings=settings, namespaces=['default'])
    await eventually(operator.ready_flag.is_set)
    await cluster.create('kex1')
    await eventually(lambda: bool((cluster.get() or {}).get('status')))
    await quiet()
    operator.stop()

    assert threads == [operator.thread.name]
    assert cluster.get()['status'] == {'create_fn': 'created'}


async def test_graceful_exit_lets_the_running_handlers_finish_within_the_exit_timeout(
        caplog: pytest.LogCaptureFixture, make_registry: Callable[[], kopf.OperatorRegistry],
        settings_factory: Callable[[], kopf.OperatorSettings],
        cluster: Cluster, operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    started: dict[str, asyncio.Event] = {'kex1': asyncio.Event(), 'kex2': asyncio.Event()}
    release: dict[str, asyncio.Event] = {'kex1': asyncio.Event(), 'kex2': asyncio.Event()}
    outcomes: list[tuple[str, str]] = []

    registry = make_registry()

    @kopf.on.create('kopfexamples', registry=registry)
    async def create_fn(name: str, **_: Any) -> Any:
        started[name].set()
        try:
            await release[name].wait()
        except asyncio.CancelledError:
            outcomes.append((name, 'cancelled'))
            raise
        outcomes.append((name, 'finished'))
        return 'done'

    settings = settings_factory()
    settings.queueing.exit_timeout = 1.0
    async with operator(registry, settings) as running:
        await cluster.create('kex1')
        await cluster.create('kex2')
        await eventually(lambda: started['kex1'].is_set() and started['kex2'].is_set())
        running.stop_flag.set()
        await eventually(lambda: any('Operator is stopping' in message for message in caplog.messages))
        assert not running.task.done()
        release['kex1'].set()  # within the exit timeout; kex2 is never released
        await asyncio.wait_for(running.task, timeout=5)

    assert sorted(outcomes) == [('kex1', 'finished'), ('kex2', 'cancelled')]
    assert cluster.get('kex1')['status'] == {'create_fn': 'done'}
    assert cluster.diffbase('kex1') is not None
    assert 'status' not in cluster.get('kex2')
    assert cluster.diffbase('kex2') is None

    # The next operator has no record of kex2 being handled, so it handles it; kex1 is done.
    calls: list[str] = []
    registry = make_registry()

    @kopf.on.create('kopfexamples', registry=registry)
    def create_again(name: str, **_: Any) -> Any:
        calls.append(name)
        return 'again'

    async with operator(registry, settings_factory()):
        await eventually(lambda: cluster.diffbase('kex2') is not None)
        await quiet()

    assert calls == ['kex2']
