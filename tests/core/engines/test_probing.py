"""
The liveness endpoint: the probes' report over HTTP, its caching, readiness, and the server's life.

The reporter's own behaviour is tested on a real server (port 0) with a real HTTP client in the same
event loop; the caching in the virtual time of looptime (the probes there are async: a thread of
a sync probe would let looptime run the time forward). The operator-level tests run the whole
operator against the emulator in real time, waiting for the outcomes with timeouts.
"""
import asyncio
import json
import logging
import re
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import aiohttp
import pytest

from kopf._cogs.structs.credentials import ConnectionInfo
from kopf._core.actions.errors import PermanentError, TemporaryError
from kopf._core.engines.probing import (
    PROBES_CACHE_PERIOD,
    HealthReporter,
    LivenessEndpoint,
    LivenessEndpointError,
    parse_liveness_endpoint,
)
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import Activity, ActivityHandler, ErrorsMode, HandlerId
from kopf._core.intents.memos import Memo
from kopf._core.intents.registries import OperatorRegistry
from kopf._core.reactor.running import operator, spawn_tasks
from kopf.testing.emulator import KubernetesEmulator

LOCALHOST = 'http://127.0.0.1:0/healthz'
SERVING_PATTERN = re.compile(r'^Serving the liveness endpoint at (http://\S+)$')


def add_probe(registry: OperatorRegistry, fn: Callable[..., Any], **kwargs: Any) -> None:
    registry.activities.append(ActivityHandler(fn=fn, id=HandlerId(kwargs.pop('id', fn.__name__)),
                                               activity=Activity.PROBE, **kwargs))


def add_activity(registry: OperatorRegistry, activity: Activity, fn: Callable[..., Any]) -> None:
    registry.activities.append(ActivityHandler(fn=fn, id=HandlerId(fn.__name__), activity=activity))


async def fetch(session: aiohttp.ClientSession, url: str, method: str = 'GET') -> tuple[int, Any]:
    async with session.request(method, url) as response:
        text = await response.text()
        is_json = response.content_type == 'application/json'
        return response.status, json.loads(text) if is_json and text else text


def is_port_free(port: int) -> bool:
    """Whether a new server can listen on the port (as servers do: the closed connections do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(('127.0.0.1', port))
            sock.listen()
        except OSError:
            return False
        return True


@pytest.fixture
def registry() -> OperatorRegistry:
    return OperatorRegistry()


@pytest.fixture
def settings() -> OperatorSettings:
    return OperatorSettings()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


@pytest.fixture
async def reporter(registry: OperatorRegistry, settings: OperatorSettings) -> AsyncIterator[HealthReporter]:
    """A started and ready reporter (the tests of the readiness un-ready it on their own)."""
    reporter = HealthReporter(LOCALHOST, registry=registry, settings=settings, memo=Memo(),
                              indices={'my_idx': {'key': ['value']}})
    await reporter.start()
    reporter.mark_ready()
    try:
        yield reporter
    finally:
        await reporter.stop()


#
# Parsing the endpoint.
#

@pytest.mark.parametrize('url, expected', [
    ('http://0.0.0.0:8080/healthz', LivenessEndpoint('0.0.0.0', 8080, '/healthz')),
    ('http://0.0.0.0:1234/', LivenessEndpoint('0.0.0.0', 1234, '/')),
    ('http://localhost:1234', LivenessEndpoint('localhost', 1234, '/')),
    ('http://[::1]:80/a/b', LivenessEndpoint('::1', 80, '/a/b')),
    ('http://127.0.0.1:0/healthz', LivenessEndpoint('127.0.0.1', 0, '/healthz')),
])
def test_valid_endpoints_are_parsed(url: str, expected: LivenessEndpoint) -> None:
    assert parse_liveness_endpoint(url) == expected


@pytest.mark.parametrize('url, problem', [
    ('8080', 'the scheme is missing (only http:// is supported)'),
    ('0.0.0.0:8080/healthz', 'the scheme is missing (only http:// is supported)'),
    ('https://0.0.0.0:8080/healthz', 'https:// is not supported (only http:// is supported)'),
    ('tcp://0.0.0.0:8080', 'tcp:// is not supported (only http:// is supported)'),
    ('http://0.0.0.0/healthz', 'the port is missing'),
    ('http://:8080/healthz', 'the host is missing (use 0.0.0.0 for all interfaces)'),
    ('http://0.0.0.0:http/healthz', 'the port is invalid'),
    ('http://0.0.0.0:70000/healthz', 'the port is invalid'),
    ('http://user:pass@0.0.0.0:8080/healthz', 'the credentials are not supported'),
    ('http://0.0.0.0:8080/healthz?verbose=1', 'the query and the fragment are not supported'),
])
def test_invalid_endpoints_are_explained(url: str, problem: str) -> None:
    with pytest.raises(LivenessEndpointError) as excinfo:
        parse_liveness_endpoint(url)
    message = str(excinfo.value)
    assert excinfo.value.problem.startswith(problem)
    assert message.startswith(f'liveness_endpoint={url!r} is invalid: {problem}')
    assert message.endswith('Expected: http://HOST:PORT/PATH, e.g. http://0.0.0.0:8080/healthz.')
    assert '\n' not in message


#
# The reports.
#

async def test_probes_results_are_reported_as_json(
        registry: OperatorRegistry, settings: OperatorSettings, reporter: HealthReporter,
        session: aiohttp.ClientSession,
) -> None:
    received: dict[str, Any] = {}

    def sync_probe(**kwargs: Any) -> int:
        received.update(kwargs)
        return 765846

    async def async_probe(**_: Any) -> str:
        return '2019-11-07T18:03:52.513803+00:00'

    add_probe(registry, sync_probe, id='random', param='the-param')
    add_probe(registry, async_probe, id='now')
    assert reporter.url is not None and reporter.url.startswith('http://127.0.0.1:')
    assert not reporter.url.startswith('http://127.0.0.1:0/')  # the actual port, not the requested one.

    async with session.get(reporter.url) as response:
        assert response.status == 200
        assert response.content_type == 'application/json'
        assert await response.json() == {'random': 765846, 'now': '2019-11-07T18:03:52.513803+00:00'}

    assert received['activity'] == Activity.PROBE
    assert received['settings'] is settings
    assert isinstance(received['memo'], Memo)
    assert received['logger'].name == 'kopf.activities.probe'
    assert received['param'] == 'the-param'
    assert received['my_idx'] == {'key': ['value']}
    assert received['retry'] == 0
    assert {'started', 'runtime'} <= set(received)


async def test_no_probes_report_an_empty_object(reporter: HealthReporter,
                                                session: aiohttp.ClientSession) -> None:
    assert reporter.url is not None
    assert await fetch(session, reporter.url) == (200, {})


async def test_values_unknown_to_json_are_reported_as_strings(
        registry: OperatorRegistry, reporter: HealthReporter, session: aiohttp.ClientSession,
) -> None:
    add_probe(registry, lambda **_: frozenset({'x'}), id='weird')
    assert reporter.url is not None
    assert await fetch(session, reporter.url) == (200, {'weird': "frozenset({'x'})"})


@pytest.mark.parametrize('error, expected', [
    (ValueError('boom'), 'ValueError: boom'),
    (TemporaryError('later', delay=60), 'TemporaryError: later'),
    (PermanentError('never'), 'PermanentError: never'),
])
async def test_failing_probe_fails_the_report_and_is_logged(
        registry: OperatorRegistry, reporter: HealthReporter, session: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture, error: Exception, expected: str,
) -> None:
    def broken(**_: Any) -> None:
        raise error

    add_probe(registry, lambda **_: 'fine', id='good')
    add_probe(registry, broken)
    assert reporter.url is not None
    status, body = await asyncio.wait_for(fetch(session, reporter.url), timeout=5)  # no retries, no back-off
    assert status == 500
    assert body == {'error': "Some probes have failed: 'broken'.",
                    'failures': {'broken': expected}, 'results': {'good': 'fine'}}
    failure_records = [record for record in caplog.records
                       if record.name == 'kopf.activities.probe' and record.levelno == logging.ERROR]
    assert [record.getMessage() for record in failure_records] in [
        ["Activity 'broken' failed with an exception and will stop now: boom"],
        ["Activity 'broken' failed temporarily: later"],
        ["Activity 'broken' failed permanently: never"],
    ]


async def test_probes_with_ignored_errors_do_not_fail_the_report(
        registry: OperatorRegistry, reporter: HealthReporter, session: aiohttp.ClientSession,
) -> None:
    def flaky(**_: Any) -> None:
        raise ValueError('whatever')

    add_probe(registry, flaky, errors=ErrorsMode.IGNORED)
    assert reporter.url is not None
    assert await fetch(session, reporter.url) == (200, {'flaky': None})


@pytest.mark.looptime
async def test_async_probes_are_limited_by_their_timeouts(
        registry: OperatorRegistry, reporter: HealthReporter, session: aiohttp.ClientSession,
        looptime: float,
) -> None:
    async def slow(**_: Any) -> None:
        await asyncio.sleep(100)

    add_probe(registry, slow, timeout=1.5)
    assert reporter.url is not None
    status, body = await fetch(session, reporter.url)
    assert status == 500
    assert body['failures']['slow'].startswith("HandlerTimeoutError: Activity 'slow' has timed out")
    assert 1 < looptime <= 1.5  # not the 100 seconds of the probe (the timeout counts in wall-clock time)


async def test_other_paths_are_not_found(reporter: HealthReporter, session: aiohttp.ClientSession) -> None:
    assert reporter.url is not None
    base = reporter.url.removesuffix('/healthz')
    assert (await fetch(session, f'{base}/'))[0] == 404
    assert (await fetch(session, f'{base}/other'))[0] == 404
    assert (await fetch(session, f'{base}/healthz/more'))[0] == 404
    assert (await fetch(session, reporter.url, method='POST'))[0] == 405
    assert (await fetch(session, reporter.url, method='HEAD'))[0] == 200


async def test_nothing_is_probed_until_ready(
        registry: OperatorRegistry, settings: OperatorSettings, session: aiohttp.ClientSession,
) -> None:
    calls: list[str] = []
    add_probe(registry, lambda **_: calls.append('probed'), id='probe')
    reporter = HealthReporter(LOCALHOST, registry=registry, settings=settings)
    await reporter.start()
    try:
        assert reporter.url is not None
        status, body = await fetch(session, reporter.url)
        assert status == 503
        assert body == {'error': 'The operator is not ready yet: the startup or the initial watching '
                                 'is in progress.'}
        assert calls == []

        reporter.mark_ready()
        assert (await fetch(session, reporter.url))[0] == 200
        assert calls == ['probed']
    finally:
        await reporter.stop()


#
# Caching.
#

@pytest.mark.looptime
@pytest.mark.parametrize('fails', [False, True], ids=['success', 'failure'])
async def test_reports_are_cached_for_a_period(
        registry: OperatorRegistry, reporter: HealthReporter, session: aiohttp.ClientSession,
        fails: bool, looptime: float,
) -> None:
    calls: list[float] = []

    async def counted(**_: Any) -> int:
        calls.append(looptime)
        if fails:
            raise PermanentError(f'failure #{len(calls)}')
        return len(calls)

    add_probe(registry, counted)
    assert reporter.url is not None
    assert PROBES_CACHE_PERIOD == 10

    first = await fetch(session, reporter.url)
    await asyncio.sleep(9.9)
    second = await fetch(session, reporter.url)
    assert len(calls) == 1
    assert second == first

    await asyncio.sleep(0.1)
    third = await fetch(session, reporter.url)
    assert len(calls) == 2
    assert third != first
    expected_status = 500 if fails else 200
    assert first[0] == second[0] == third[0] == expected_status


async def test_concurrent_requests_share_one_probing(
        registry: OperatorRegistry, reporter: HealthReporter, session: aiohttp.ClientSession,
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    calls: list[str] = []

    async def slow(**_: Any) -> str:
        calls.append('probed')
        started.set()
        await release.wait()
        return 'done'

    add_probe(registry, slow)
    assert reporter.url is not None
    requests = [asyncio.create_task(fetch(session, reporter.url)) for _ in range(3)]
    await asyncio.wait_for(started.wait(), timeout=5)
    release.set()
    results = await asyncio.wait_for(asyncio.gather(*requests), timeout=5)
    assert results == [(200, {'slow': 'done'})] * 3
    assert calls == ['probed']


async def test_injected_clock_expires_the_cache(
        registry: OperatorRegistry, settings: OperatorSettings, session: aiohttp.ClientSession,
) -> None:
    now = [1000.0]
    calls: list[str] = []

    def counted(**_: Any) -> int:
        calls.append('probed')
        return len(calls)

    add_probe(registry, counted)
    reporter = HealthReporter(LOCALHOST, registry=registry, settings=settings, cache_period=3,
                              clock=lambda: now[0])
    await reporter.start()
    reporter.mark_ready()
    try:
        assert reporter.url is not None
        assert await fetch(session, reporter.url) == (200, {'counted': 1})
        now[0] += 2.9
        assert await fetch(session, reporter.url) == (200, {'counted': 1})
        now[0] += 0.1
        assert await fetch(session, reporter.url) == (200, {'counted': 2})
    finally:
        await reporter.stop()


#
# The server's life.
#

async def test_stopping_releases_the_port(reporter: HealthReporter, session: aiohttp.ClientSession) -> None:
    assert reporter.url is not None
    port = int(reporter.url.split(':')[2].split('/')[0])
    assert (await fetch(session, reporter.url))[0] == 200
    assert not is_port_free(port)

    await reporter.stop()
    await reporter.stop()  # repeatedly: nothing breaks.
    assert is_port_free(port)
    with pytest.raises(aiohttp.ClientConnectionError):
        await fetch(session, reporter.url)


async def test_busy_port_fails_to_start(registry: OperatorRegistry, settings: OperatorSettings) -> None:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        sock.listen()
        port = sock.getsockname()[1]
        reporter = HealthReporter(f'http://127.0.0.1:{port}/healthz', registry=registry, settings=settings)
        with pytest.raises(OSError, match=rf'Cannot serve the liveness endpoint at 127.0.0.1:{port}: '):
            await reporter.start()
        assert reporter.url is None


#
# The operator's liveness endpoint (against the emulator).
#

Operator = Callable[..., Coroutine[Any, Any, None]]


@pytest.fixture
def op_registry(k8s_emulator: KubernetesEmulator) -> OperatorRegistry:
    """A registry with a login handler for the emulator (faster than the default login functions)."""
    registry = OperatorRegistry()

    def login_to_emulator(**_: Any) -> ConnectionInfo:
        return ConnectionInfo(server=k8s_emulator.url)

    registry.activities.append(ActivityHandler(fn=login_to_emulator, id=HandlerId('login_to_emulator'),
                                               activity=Activity.AUTHENTICATION))
    return registry


async def wait_for_url(caplog: pytest.LogCaptureFixture, within: float = 5.0) -> str:
    """The URL of the liveness endpoint, as the operator reports it once it listens."""
    deadline = time.monotonic() + within
    while True:
        for message in caplog.messages:
            if match := SERVING_PATTERN.match(message):
                return match.group(1)
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.01)
    raise AssertionError(f'The liveness endpoint has not been served in {within}s.')


async def test_operator_serves_the_probes_only_when_ready_and_stops_with_them(
        op_registry: OperatorRegistry, settings: OperatorSettings, session: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    startup_entered = asyncio.Event()
    startup_release = asyncio.Event()

    async def slow_startup(memo: Any, **_: Any) -> None:
        memo.greeting = 'hello'
        startup_entered.set()
        await startup_release.wait()

    def greeting(memo: Any, **_: Any) -> str:
        return str(memo.greeting)

    add_activity(op_registry, Activity.STARTUP, slow_startup)
    add_probe(op_registry, greeting)
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(operator(registry=op_registry, settings=settings, clusterwide=True,
                                        liveness_endpoint=LOCALHOST, ready_flag=ready, stop_flag=stop))
    try:
        url = await wait_for_url(caplog)
        await asyncio.wait_for(startup_entered.wait(), timeout=5)
        assert (await fetch(session, url))[0] == 503  # during the startup

        startup_release.set()
        await asyncio.wait_for(ready.wait(), timeout=5)
        assert await fetch(session, url) == (200, {'greeting': 'hello'})
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)

    with pytest.raises(aiohttp.ClientConnectionError):
        await fetch(session, url)
    port = int(url.split(':')[2].split('/')[0])
    assert is_port_free(port)


async def test_operator_releases_the_port_when_the_startup_fails(
        op_registry: OperatorRegistry, settings: OperatorSettings, session: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)

    def broken(**_: Any) -> None:
        raise PermanentError('nope')

    add_activity(op_registry, Activity.STARTUP, broken)
    with pytest.raises(Exception, match='One or more handlers failed'):
        await asyncio.wait_for(operator(registry=op_registry, settings=settings, clusterwide=True,
                                        liveness_endpoint=LOCALHOST), timeout=10)
    url = await wait_for_url(caplog, within=0)
    port = int(url.split(':')[2].split('/')[0])
    assert is_port_free(port)


async def test_operator_fails_on_a_busy_port_before_the_startup(
        op_registry: OperatorRegistry, settings: OperatorSettings, k8s_emulator: KubernetesEmulator,
) -> None:
    startups: list[str] = []
    add_activity(op_registry, Activity.STARTUP, lambda **_: startups.append('started'))
    k8s_emulator.requests.reset()
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(OSError, match='Cannot serve the liveness endpoint'):
            await asyncio.wait_for(operator(registry=op_registry, settings=settings, clusterwide=True,
                                            liveness_endpoint=f'http://127.0.0.1:{port}/'), timeout=10)
    assert startups == []
    assert k8s_emulator.requests.total == 0


@pytest.mark.parametrize('url', ['https://0.0.0.0:8080/healthz', 'http://0.0.0.0/healthz', '8080'])
async def test_operator_refuses_a_bad_endpoint_before_anything_starts(
        registry: OperatorRegistry, settings: OperatorSettings, url: str,
) -> None:
    tasks_before = asyncio.all_tasks()
    with pytest.raises(LivenessEndpointError, match=r"^liveness_endpoint=.* is invalid: .* Expected: http://HOST"):
        await spawn_tasks(registry=registry, settings=settings, clusterwide=True, liveness_endpoint=url)
    assert asyncio.all_tasks() == tasks_before
