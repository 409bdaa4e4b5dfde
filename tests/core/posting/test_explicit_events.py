"""
``kopf.event()``, ``kopf.info()``, ``kopf.warn()``, ``kopf.exception()``: what ends up in the cluster.
"""
import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from kopf._cogs.structs.bodies import Body
from kopf._core.engines.posting import event, event_queue_var, exception, find_event_queue, info, warn
from kopf._core.intents.configuration import OperatorSettings

if TYPE_CHECKING:
    from kopf.testing.emulator import KubernetesEmulator

Operator = Any  # the conftest's operator fixture: settings, event_queue, settle()
REF = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'name': 'kex1', 'uid': 'uid1',
       'namespace': 'default'}


def _events(emulator: 'KubernetesEmulator') -> list[dict[str, Any]]:
    return sorted(emulator.list_objects('events'), key=lambda e: (e['reason'], e['message']))


def _summary(emulator: 'KubernetesEmulator') -> list[tuple[str, str, str]]:
    return [(e['type'], e['reason'], e['message']) for e in _events(emulator)]


async def test_event_fields(
        k8s_emulator: 'KubernetesEmulator', operator: Operator, body: dict[str, Any],
) -> None:
    operator.settings.posting.reporting_component = 'my-operator'
    operator.settings.posting.reporting_instance = 'my-pod-1'
    operator.settings.posting.event_name_prefix = 'my-event-'

    event(Body(body), type='Warning', reason='SomeReason', message='Some message.')
    await operator.settle()

    [posted] = _events(k8s_emulator)
    assert posted['apiVersion'] == 'v1'
    assert posted['kind'] == 'Event'
    assert posted['metadata']['namespace'] == 'default'
    assert posted['metadata']['name'].startswith('my-event-')
    assert posted['type'] == 'Warning'
    assert posted['reason'] == 'SomeReason'
    assert posted['message'] == 'Some message.'
    assert posted['involvedObject'] == REF
    assert posted['source'] == {'component': 'my-operator'}
    assert posted['reportingComponent'] == 'my-operator'
    assert posted['reportingInstance'] == 'my-pod-1'


async def test_shortcuts(
        k8s_emulator: 'KubernetesEmulator', operator: Operator, body: dict[str, Any],
) -> None:
    info(body, reason='InfoReason', message='Info message.')
    warn(body, reason='WarnReason', message='Warn message.')
    event(body, type='SomeType', reason='SomeReason', message='Custom message.')
    await operator.settle()
    assert _summary(k8s_emulator) == [
        ('Normal', 'InfoReason', 'Info message.'),
        ('SomeType', 'SomeReason', 'Custom message.'),
        ('Warning', 'WarnReason', 'Warn message.'),
    ]


async def test_exceptions(
        k8s_emulator: 'KubernetesEmulator', operator: Operator, body: dict[str, Any],
) -> None:
    try:
        raise RuntimeError('Exception text.')
    except RuntimeError:
        exception(body, reason='Implicit', message='Some exception:')
        exception(body, message='No reason:')
    exception(body, reason='Explicit', message='Given:', exc=ValueError('boom'))
    exception(body, reason='NoMessage', exc=ValueError('boom'))
    exception(body, reason='NoException', message='Just a message.')
    await operator.settle()
    assert _summary(k8s_emulator) == [
        ('Error', 'Explicit', 'Given: boom'),
        ('Error', 'Implicit', 'Some exception: Exception text.'),
        ('Error', 'NoException', 'Just a message.'),
        ('Error', 'NoMessage', 'boom'),
        ('Error', 'RuntimeError', 'No reason: Exception text.'),
    ]


async def test_several_objects(
        k8s_emulator: 'KubernetesEmulator', operator: Operator, body: dict[str, Any],
) -> None:
    other = dict(body, metadata={'name': 'kex2', 'namespace': 'default', 'uid': 'uid2'})
    info([body, other], reason='Reason', message='Message.')
    await operator.settle()
    assert sorted(e['involvedObject']['name'] for e in _events(k8s_emulator)) == ['kex1', 'kex2']


async def test_cluster_scoped_objects(k8s_emulator: 'KubernetesEmulator', operator: Operator) -> None:
    info({'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': 'node1', 'uid': 'uid9'}},
         reason='Reason', message='Message.')
    await operator.settle()
    [posted] = _events(k8s_emulator)
    assert posted['metadata']['namespace'] == 'default'
    assert posted['involvedObject'] == {'apiVersion': 'v1', 'kind': 'Node', 'name': 'node1', 'uid': 'uid9'}


@pytest.mark.parametrize('api_version', ['v1', 'events.k8s.io/v1'])
async def test_no_events_for_events(k8s_emulator: 'KubernetesEmulator', operator: Operator,
                                    body: dict[str, Any], api_version: str) -> None:
    an_event = {'apiVersion': api_version, 'kind': 'Event',
                'metadata': {'name': 'ev1', 'namespace': 'default', 'uid': 'uid3'}}
    info([an_event, body], reason='Reason', message='Message.')
    warn(an_event, reason='Reason', message='Message.')
    await operator.settle()
    assert [e['involvedObject']['kind'] for e in _events(k8s_emulator)] == ['KopfExample']


async def test_long_messages_are_cut_in_the_middle(k8s_emulator: 'KubernetesEmulator', operator: Operator,
                                                   body: dict[str, Any]) -> None:
    info(body, reason='Reason', message='A' * 1000 + 'B' * 1000)
    await operator.settle()
    [posted] = _events(k8s_emulator)
    assert posted['message'] == 'A' * 511 + '...' + 'B' * 510


async def test_levels_apply_to_known_types(k8s_emulator: 'KubernetesEmulator', operator: Operator,
                                           body: dict[str, Any]) -> None:
    operator.settings.posting.level = logging.WARNING
    info(body, reason='Info', message='Skipped.')
    warn(body, reason='Warn', message='Posted.')
    exception(body, reason='Error', message='Posted.')
    event(body, type='Custom', reason='Custom', message='Posted.')
    await operator.settle()
    assert _summary(k8s_emulator) == [
        ('Custom', 'Custom', 'Posted.'),
        ('Error', 'Error', 'Posted.'),
        ('Warning', 'Warn', 'Posted.'),
    ]


async def test_disabled_posting(k8s_emulator: 'KubernetesEmulator', operator: Operator,
                                body: dict[str, Any]) -> None:
    operator.settings.posting.enabled = False
    info(body, reason='Info', message='Skipped.')
    warn(body, reason='Warn', message='Skipped.')
    event(body, type='Custom', reason='Custom', message='Skipped.')
    assert len(operator.event_queue) == 0
    operator.settings.posting.enabled = True
    info(body, reason='Info', message='Posted.')
    await operator.settle()
    assert _summary(k8s_emulator) == [('Normal', 'Info', 'Posted.')]


async def test_no_operator_no_events(caplog: pytest.LogCaptureFixture, body: dict[str, Any]) -> None:
    caplog.set_level(logging.DEBUG, logger='kopf._core.engines.posting')
    assert find_event_queue() is None
    info(body, reason='Reason', message='Message.')  # must not fail
    assert 'No operator in this context; dropping the event' in caplog.text


async def test_calls_from_threads_without_context_use_the_only_operator(
        k8s_emulator: 'KubernetesEmulator', operator: Operator, body: dict[str, Any],
) -> None:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, lambda: warn(body, reason='FromExecutor', message='Message.'))
    thread = threading.Thread(target=lambda: info(body, reason='FromThread', message='Message.'))
    thread.start()
    await asyncio.to_thread(thread.join)  # the thread's event is queued before this returns
    await operator.settle()
    assert _summary(k8s_emulator) == [('Warning', 'FromExecutor', 'Message.'),
                                      ('Normal', 'FromThread', 'Message.')]


async def test_operators_do_not_cross_post(
        k8s_emulator: 'KubernetesEmulator', make_operator: Callable[..., Operator], body: dict[str, Any],
) -> None:
    settings1, settings2 = OperatorSettings(), OperatorSettings()
    settings1.posting.reporting_component = 'operator1'
    settings2.posting.reporting_component = 'operator2'
    operator1, operator2 = make_operator(settings1), make_operator(settings2)
    context1, context2 = contextvars.copy_context(), contextvars.copy_context()
    context1.run(event_queue_var.set, operator1.event_queue)
    context2.run(event_queue_var.set, operator2.event_queue)

    async def handler(reason: str) -> None:  # e.g. an async handler in the operator's task
        info(body, reason=reason, message='Async.')
        await asyncio.to_thread(warn, body, reason=reason, message='Sync.')  # a sync handler in a thread

    await asyncio.create_task(handler('Reason1'), context=context1)
    await asyncio.create_task(handler('Reason2'), context=context2)

    # A thread without the context: it is unknown which of the two operators it belongs to.
    await asyncio.to_thread(contextvars.Context().run, info, body, reason='Unknown', message='Dropped.')
    await operator1.settle()
    await operator2.settle()

    assert sorted((e['reason'], e['message'], e['source']['component']) for e in _events(k8s_emulator)) == [
        ('Reason1', 'Async.', 'operator1'),
        ('Reason1', 'Sync.', 'operator1'),
        ('Reason2', 'Async.', 'operator2'),
        ('Reason2', 'Sync.', 'operator2'),
    ]
