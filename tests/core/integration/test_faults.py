"""
Faults of the API during the handling: dropped & silent watch-streams, 5xx & 429 errors, 410 Gone.

Every change must be handled exactly once regardless of the faults: not lost, not duplicated.
"""
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]  # the conftest's factory of running operators (async context managers)
Eventually = Callable[..., Any]
Quiet = Callable[..., Any]


def track_changes(registry: kopf.OperatorRegistry) -> list[tuple[str, str, Any]]:
    """Register the creation & update handlers that remember what they have handled."""
    handled: list[tuple[str, str, Any]] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(name: str, spec: Any, **_: Any) -> None:
        handled.append(('create', name, spec.get('field')))

    @kopf.on.update('kopfexamples', registry=registry)
    def update_fn(name: str, spec: Any, **_: Any) -> None:
        handled.append(('update', name, spec.get('field')))

    return handled


@pytest.mark.parametrize('abort', [False, True], ids=['closed', 'aborted'])
async def test_dropped_watch_streams_lose_and_duplicate_nothing(
        abort: bool, registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    handled = track_changes(registry)
    expected: list[tuple[str, str, Any]] = []

    async def drop_the_stream() -> None:
        # Once re-established (maybe not yet), the objects' stream is dropped; the others are left alone.
        await eventually(lambda: cluster.emulator.drop_watches(path='kopfexamples', abort=abort) == 1)

    async with operator(registry, settings):
        for name in ['kex1', 'kex2', 'kex3']:
            await cluster.create(name, {'field': 'v0'})
            await drop_the_stream()  # maybe before, maybe after the event is delivered
            expected.append(('create', name, 'v0'))
            await eventually(lambda: len(handled) == len(expected))
            for value in ['v1', 'v2']:
                await cluster.patch(name, {'spec': {'field': value}})
                await drop_the_stream()
                expected.append(('update', name, value))
                await eventually(lambda: len(handled) == len(expected))
        await quiet()

    assert handled == expected
    assert cluster.count('watch', namespace='default') >= 10  # the initial one and after the 9 drops


async def test_server_errors_on_patching_are_retried_and_handled_once(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    calls: list[str] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(name: str, **_: Any) -> Any:
        calls.append(name)
        return 'created'

    async with operator(registry, settings):
        cluster.emulator.fail_requests(3, status=503, verb='patch')
        await cluster.create('kex1')
        await eventually(lambda: bool((cluster.get() or {}).get('status')))
        await quiet()

    assert calls == ['kex1']
    assert cluster.get()['status'] == {'create_fn': 'created'}
    assert cluster.diffbase() == {'spec': {'field': 'value'}}
    assert cluster.count('patch', 'kex1', subresource='') == 1 + 3  # the diff-base, after 3 failures
    assert cluster.count('patch', 'kex1', subresource='status') == 1  # the result


async def test_throttling_on_patching_obeys_the_retry_after(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    calls: list[float] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(**_: Any) -> Any:
        calls.append(time.monotonic())
        return 'created'

    async with operator(registry, settings):
        cluster.emulator.fail_requests(1, status=429, verb='patch', retry_after=1)
        await cluster.create('kex1')
        await eventually(lambda: cluster.diffbase() is not None)
        patched = time.monotonic()
        await eventually(lambda: bool((cluster.get() or {}).get('status')))
        await quiet()

    assert len(calls) == 1
    assert patched - calls[0] >= 0.9  # not earlier than the server says, though our backoffs are short
    assert cluster.get()['status'] == {'create_fn': 'created'}
    assert cluster.count('patch', 'kex1', subresource='') == 2
    assert cluster.count('patch', 'kex1', subresource='status') == 1


async def test_gone_history_causes_a_relisting_without_double_handling(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    handled = track_changes(registry)

    async with operator(registry, settings):
        await cluster.create('kex1', {'field': 'a'})
        await cluster.create('kex2', {'field': 'a'})
        await eventually(lambda: len(handled) == 2)
        await quiet()
        lists_before = cluster.count('list', namespace='default')

        # The stream is closed while the operator is not looking; the history is compacted meanwhile.
        cluster.emulator.add_latency(0.3, verb='watch', path='kopfexamples', count=1)
        cluster.emulator.drop_watches()
        await cluster.patch('kex1', {'spec': {'field': 'b'}})
        cluster.emulator.forget_history()
        await eventually(lambda: cluster.count('list', namespace='default') > lists_before)
        await eventually(lambda: len(handled) == 3)
        await cluster.create('kex3', {'field': 'a'})  # the new stream works
        await eventually(lambda: len(handled) == 4)
        await quiet()

    assert sorted(handled) == [('create', 'kex1', 'a'), ('create', 'kex2', 'a'), ('create', 'kex3', 'a'),
                               ('update', 'kex1', 'b')]


async def test_silent_watch_streams_are_reconnected_after_the_inactivity_timeout(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    handled = track_changes(registry)
    settings.watching.inactivity_timeout = 0.5

    async with operator(registry, settings):
        await cluster.create('kex1', {'field': 'a'})
        await eventually(lambda: len(handled) == 1)
        watches_before = cluster.count('watch', namespace='default')

        # The next stream stalls: it responds nothing at all (not even the headers) for a long time.
        cluster.emulator.add_latency(30, verb='watch', path='kopfexamples', count=1)
        cluster.emulator.drop_watches()
        await eventually(lambda: cluster.count('watch', namespace='default') > watches_before)
        await cluster.patch('kex1', {'spec': {'field': 'b'}})
        await eventually(lambda: len(handled) == 2, within=2)  # Kopf 1.45.2: in ~0.5s
        await quiet()

    assert handled == [('create', 'kex1', 'a'), ('update', 'kex1', 'b')]


async def test_our_patch_late_by_an_interrupted_watch_stream_is_waited_for_and_nothing_reruns(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet, caplog: pytest.LogCaptureFixture,
) -> None:
    # Found by the soak on a real kube-apiserver, restarting for longer than the consistency timeout: an
    # event older than our patch came, the echo of the patch did not (the stream was down), and the older
    # state was handled after the timeout: the handler whose success the patch had stored ran again.
    caplog.set_level(logging.DEBUG, 'kopf.objects')
    settings.persistence.consistency_timeout = 0.3
    calls: list[str] = []

    @kopf.on.create('kopfexamples', registry=registry)
    async def create_fn(name: str, **_: Any) -> None:
        calls.append(name)
        if len(calls) == 1:
            # Another writer's change: its event arrives during the handling, older than our patch to come.
            await cluster.patch(name, {'status': {'writer': 'other'}}, subresource='status')
            # The emulator writes the event into the stream a few turns of its event loop after the change:
            # so many round trips to its loop (in its thread) make sure it is written before the stream ends.
            for _ in range(10):
                assert cluster.emulator.open_watches
            # The stream ends (the events written so far are read first) and is re-established only in 1.5 s.
            cluster.emulator.add_latency(1.5, verb='watch', path='kopfexamples', count=1)
            assert cluster.emulator.drop_watches(path='kopfexamples') == 1

    def waited() -> list[str]:
        return [message for message in caplog.messages if 'Our own patch' in message]

    async with operator(registry, settings):
        watching = cluster.emulator.open_watches
        await cluster.create('kex1')
        await eventually(waited)  # the older event waits for our patch's echo: it does not come in time
        await eventually(lambda: cluster.emulator.open_watches == watching, within=5)  # re-established
        await quiet()

    assert calls == ['kex1']
    [message] = waited()
    assert re.fullmatch(r'Our own patch \(version \d+\) is late: the watch-stream was held back or '
                        r'interrupted\. The object waits for it\.', message), message


@pytest.mark.parametrize('latency', [0, 0.5], ids=['prompt', 'echoes-first'])
async def test_echoes_ahead_of_our_slow_responses_are_handled_once(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet, latency: float,
) -> None:
    # A loaded API server (or a slow network): our patches are applied and their echoes arrive through
    # the watch-stream long before their responses. The same requests & handling as with prompt responses.
    handled = track_changes(registry)
    deleted: list[str] = []

    @kopf.on.delete('kopfexamples', registry=registry)
    def delete_fn(name: str, **_: Any) -> None:
        deleted.append(name)

    if latency:
        cluster.emulator.add_latency(latency, verb='patch', after_applying=True)
    async with operator(registry, settings):
        await cluster.create('kex1', {'field': 'v0'})
        await eventually(lambda: len(handled) == 1)
        await quiet(period=1)
        await cluster.patch('kex1', {'spec': {'field': 'v1'}})
        await eventually(lambda: len(handled) == 2)
        await quiet(period=1)
        assert cluster.diffbase() == {'spec': {'field': 'v1'}}
        await cluster.delete('kex1')
        await eventually(lambda: cluster.get() is None)
        await quiet(period=1)

    assert handled == [('create', 'kex1', 'v0'), ('update', 'kex1', 'v1')]
    assert deleted == ['kex1']
    # The same requests in both cases (the handlers return nothing: no status patches).
    assert cluster.count('patch', 'kex1', subresource='') == 5
    assert cluster.count('patch', 'kex1', subresource='status') == 0
