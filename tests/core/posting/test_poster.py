"""
The poster engine: retries with back-offs, parallelism, idle workers, and never blocking the callers.

The API server here is kmock in the test's loop, so that the requests can be counted precisely
and the time is the loop's fake time (looptime): the back-offs are seen exactly as configured.
"""
import asyncio
import logging
import threading
from typing import Any

import kmock
import pytest

from kopf._core.actions.loggers import ObjectLogger
from kopf._core.engines.posting import (
    EventQueue,
    event,
    event_queue_var,
    find_event_queue,
    info,
    poster,
    warn,
)
from kopf._core.intents.configuration import OperatorSettings

pytestmark = pytest.mark.looptime

Operator = Any  # the conftest's operator fixture: settings, event_queue, task, settle()
EVENTS_URL = 'post /api/v1/namespaces/default/events'
FAILURE = {'kind': 'Status', 'apiVersion': 'v1', 'status': 'Failure', 'message': 'Injected.'}


@pytest.fixture()
def kmock_options(kmock_options: dict[str, object]) -> dict[str, object]:
    # A plain HTTP mock: unexpected requests fail the test instead of being served by the mock's defaults.
    return dict(kmock_options, cls=kmock.RawHandler, strict=True)


@pytest.fixture()
def server_url(kmock: kmock.RawHandler) -> str:
    return str(kmock.url).rstrip('/')


@pytest.fixture()
def settings() -> OperatorSettings:
    settings = OperatorSettings()
    settings.posting.default_backoffs = [2, 3]
    settings.posting.logging_backoffs = [7]
    settings.networking.error_backoffs = [100, 100]  # must not be used for posting events
    return settings


async def test_request_contract(kmock: kmock.RawHandler, operator: Operator, body: dict[str, Any]) -> None:
    kmock[EVENTS_URL] << {}
    warn(body, reason='Reason', message='Message.')
    await operator.settle()
    assert len(kmock) == 1
    data = kmock[0].data
    assert kmock[0].headers['Content-Type'] == 'application/json'
    assert data['metadata'] == {'namespace': 'default', 'generateName': 'kopf-event-'}
    assert (data['type'], data['reason'], data['message']) == ('Warning', 'Reason', 'Message.')
    assert data['involvedObject'] == {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'name': 'kex1',
                                      'uid': 'uid1', 'namespace': 'default'}


async def test_failures_are_retried_with_default_backoffs(
        kmock: kmock.RawHandler, operator: Operator, body: dict[str, Any], looptime: float,
) -> None:
    kmock[EVENTS_URL][:2] << 403 << FAILURE
    kmock[EVENTS_URL][2:] << {}
    info(body, reason='Reason', message='Message.')
    await operator.settle()
    assert len(kmock) == 3
    assert looptime == 5  # 2 + 3


async def test_server_errors_are_retried_with_the_events_backoffs_only(
        kmock: kmock.RawHandler, operator: Operator, body: dict[str, Any], looptime: float,
) -> None:
    kmock[EVENTS_URL][:1] << 503 << FAILURE
    kmock[EVENTS_URL][1:] << {}
    info(body, reason='Reason', message='Message.')
    await operator.settle()
    assert len(kmock) == 2
    assert looptime == 2  # not 100 from settings.networking.error_backoffs


async def test_failures_are_given_up_after_the_last_backoff(
        kmock: kmock.RawHandler, operator: Operator, body: dict[str, Any], looptime: float,
        caplog: pytest.LogCaptureFixture,
) -> None:
    kmock[EVENTS_URL] << 500 << FAILURE
    info(body, reason='Reason', message='Message.')
    await operator.settle()
    assert len(kmock) == 3
    assert looptime == 5
    # The retried attempts are warnings too (one line each); the given-up post is what counts here.
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and 'will retry' not in r.getMessage()]
    assert len(warnings) == 1
    assert 'Failed to post an event' in warnings[0]
    assert "Normal Reason: 'Message.'" in warnings[0]


async def test_explicit_backoffs(
        kmock: kmock.RawHandler, operator: Operator, body: dict[str, Any], looptime: float,
) -> None:
    kmock[EVENTS_URL][:1] << 500 << FAILURE
    kmock[EVENTS_URL][1:] << {}
    event(body, type='Normal', reason='Reason', message='Message.', backoffs=10)
    await operator.settle()
    assert len(kmock) == 2
    assert looptime == 10


async def test_log_messages_are_retried_with_logging_backoffs(
        kmock: kmock.RawHandler, operator: Operator, body: dict[str, Any], looptime: float,
) -> None:
    operator.settings.posting.loggers = True
    kmock[EVENTS_URL] << 500 << FAILURE
    ObjectLogger(body=body, settings=operator.settings).warning('Message.')
    await operator.settle()
    assert len(kmock) == 2
    assert looptime == 7


async def test_throttling_is_respected(
        kmock: kmock.RawHandler, operator: Operator, body: dict[str, Any], looptime: float,
) -> None:
    kmock[EVENTS_URL][:1] << 429 << {'Retry-After': '30'} << FAILURE
    kmock[EVENTS_URL][1:] << {}
    info(body, reason='Reason', message='Message.')
    await operator.settle()
    assert len(kmock) == 2
    assert looptime == 30


async def test_absent_namespaces_are_not_retried(
        kmock: kmock.RawHandler, operator: Operator, body: dict[str, Any], looptime: float,
        caplog: pytest.LogCaptureFixture,
) -> None:
    kmock[EVENTS_URL] << 404 << FAILURE
    info(body, reason='Reason', message='Message.')
    await operator.settle()
    assert len(kmock) == 1
    assert looptime == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_callers_are_not_blocked_by_slow_posting(
        kmock: kmock.RawHandler, operator: Operator, body: dict[str, Any], looptime: float,
) -> None:
    kmock[EVENTS_URL] << (lambda: asyncio.sleep(10), {})
    for _ in range(3):
        info(body, reason='Reason', message='Message.')
    assert looptime == 0
    await operator.settle()
    assert len(kmock) == 3
    assert looptime == 10  # in parallel, not one after another


@pytest.mark.parametrize('worker_limit, duration', [(1, 50), (2, 30), (5, 10), (None, 10)])
async def test_worker_limit(
        kmock: kmock.RawHandler, operator: Operator, body: dict[str, Any], looptime: float,
        worker_limit: int | None, duration: float,
) -> None:
    operator.settings.posting.worker_limit = worker_limit
    kmock[EVENTS_URL] << (lambda: asyncio.sleep(10), {})
    for _ in range(5):
        info(body, reason='Reason', message='Message.')
    await operator.settle()
    assert len(kmock) == 5
    assert looptime == duration


async def test_idle_workers_exit(
        kmock: kmock.RawHandler, operator: Operator, body: dict[str, Any], looptime: float,
) -> None:
    def count_workers() -> int:
        return len([task for task in asyncio.all_tasks() if task.get_name() == 'poster of events: worker'])

    operator.settings.posting.idle_timeout = 5
    kmock[EVENTS_URL] << {}
    info(body, reason='Reason', message='Message.')
    await operator.settle()
    assert count_workers() == 1
    await asyncio.sleep(4.9)
    assert count_workers() == 1
    await asyncio.sleep(0.2)
    assert count_workers() == 0

    info(body, reason='Reason', message='Message.')  # new workers are started as needed
    await operator.settle()
    assert len(kmock) == 2


async def test_full_queue_drops_events_without_blocking(
        kmock: kmock.RawHandler, make_operator: Any, settings: OperatorSettings, body: dict[str, Any],
        looptime: float, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger='kopf._core.engines.posting')
    settings.posting.loggers = True
    operator = make_operator(settings, started=False, maxsize=3)
    event_queue_var.set(operator.event_queue)

    for _ in range(3):
        info(body, reason='Reason', message='Message.')
    warn(body, reason='Reason', message='Message.')
    ObjectLogger(body=body, settings=settings).error('Message.')
    await asyncio.to_thread(info, body, reason='Reason', message='From a thread.')
    assert looptime == 0
    assert len(operator.event_queue) == 3
    assert caplog.text.count('Too many events are waiting to be posted; dropping the event') == 3

    kmock[EVENTS_URL] << {}
    operator.task = asyncio.create_task(poster(event_queue=operator.event_queue, vault=operator.vault))
    await operator.settle()
    assert len(kmock) == 3


async def test_closed_loops_do_not_break_the_callers(body: dict[str, Any]) -> None:
    async def create_queue() -> EventQueue:
        return EventQueue(settings=OperatorSettings())

    # An operator that has exited, in another thread with its own (now closed) loop.
    queue = await asyncio.to_thread(asyncio.run, create_queue())
    event_queue_var.set(queue)
    info(body, reason='Reason', message='Message.')  # must not fail
    assert len(queue) == 0


async def test_stopped_posters_are_not_used_by_threads(kmock: kmock.RawHandler, operator: Operator) -> None:
    async def find_in_a_bare_thread() -> object:
        found: list[object] = []
        thread = threading.Thread(target=lambda: found.append(find_event_queue()))  # no context copied
        thread.start()
        await asyncio.to_thread(thread.join)
        return found[0]

    assert await find_in_a_bare_thread() is operator.event_queue
    await operator.stop()
    assert await find_in_a_bare_thread() is None
    assert await asyncio.to_thread(find_event_queue) is operator.event_queue  # the context is copied
