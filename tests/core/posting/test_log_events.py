"""
The per-object log messages posted as events: which ones, and how they look.
"""
import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from kopf._core.actions.loggers import LocalObjectLogger, LogFormat, ObjectLogger, configure
from kopf._core.engines.posting import event_queue_var, poster

if TYPE_CHECKING:
    from kopf.testing.emulator import KubernetesEmulator

Operator = Any  # the conftest's operator fixture: settings, event_queue, settle()


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    objects_level = logging.getLogger('kopf.objects').level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.getLogger('kopf.objects').setLevel(objects_level)


@pytest.fixture(autouse=True)
def _log_all_levels() -> None:
    logging.getLogger('kopf.objects').setLevel(logging.DEBUG)


def _summary(emulator: 'KubernetesEmulator') -> list[tuple[str, str, str]]:
    return sorted((e['type'], e['reason'], e['message']) for e in emulator.list_objects('events'))


async def test_messages_at_and_above_the_level(k8s_emulator: 'KubernetesEmulator', operator: Operator,
                                               body: dict[str, Any]) -> None:
    operator.settings.posting.loggers = True
    configure(log_format=LogFormat.FULL, log_prefix=True, debug=True)  # the prefix is not posted
    logger = ObjectLogger(body=body, settings=operator.settings)
    logger.debug('Debug %s.', 'message')
    logger.info('Info %s.', 'message')
    logger.warning('Warning message.')
    logger.error('Error message.')
    logger.critical('Critical message.')
    await operator.settle()
    assert _summary(k8s_emulator) == [
        ('Error', 'Logging', 'Critical message.'),
        ('Error', 'Logging', 'Error message.'),
        ('Normal', 'Logging', 'Info message.'),
        ('Warning', 'Logging', 'Warning message.'),
    ]
    [posted, *_] = k8s_emulator.list_objects('events')
    assert posted['involvedObject'] == {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'name': 'kex1',
                                        'uid': 'uid1', 'namespace': 'default'}


async def test_custom_level(
        k8s_emulator: 'KubernetesEmulator', operator: Operator, body: dict[str, Any],
) -> None:
    operator.settings.posting.loggers = True
    operator.settings.posting.level = logging.ERROR
    logger = ObjectLogger(body=body, settings=operator.settings)
    logger.info('Info message.')
    logger.warning('Warning message.')
    logger.error('Error message.')
    await operator.settle()
    assert _summary(k8s_emulator) == [('Error', 'Logging', 'Error message.')]


async def test_no_log_messages_unless_enabled_for_loggers(
        k8s_emulator: 'KubernetesEmulator', operator: Operator, body: dict[str, Any],
) -> None:
    assert operator.settings.posting.loggers is False  # the default
    ObjectLogger(body=body, settings=operator.settings).error('Error message.')
    assert len(operator.event_queue) == 0


async def test_no_log_messages_when_posting_is_disabled(
        k8s_emulator: 'KubernetesEmulator', operator: Operator, body: dict[str, Any],
) -> None:
    operator.settings.posting.loggers = True
    operator.settings.posting.enabled = False
    ObjectLogger(body=body, settings=operator.settings).error('Error message.')
    assert len(operator.event_queue) == 0


async def test_no_local_nor_objectless_messages(
        k8s_emulator: 'KubernetesEmulator', operator: Operator, body: dict[str, Any],
) -> None:
    operator.settings.posting.loggers = True
    LocalObjectLogger(body=body, settings=operator.settings).error('Local message.')
    logging.getLogger('kopf.objects').error('Objectless message.')
    ObjectLogger(body=body, settings=operator.settings).error('Posted message.')
    await operator.settle()
    assert _summary(k8s_emulator) == [('Error', 'Logging', 'Posted message.')]


async def test_no_log_messages_about_events(
        k8s_emulator: 'KubernetesEmulator', operator: Operator, body: dict[str, Any],
) -> None:
    operator.settings.posting.loggers = True
    an_event = {'apiVersion': 'v1', 'kind': 'Event', 'metadata': {'name': 'ev1', 'namespace': 'default'}}
    ObjectLogger(body=an_event, settings=operator.settings).error('About an event.')
    ObjectLogger(body=body, settings=operator.settings).error('About an object.')
    await operator.settle()
    assert _summary(k8s_emulator) == [('Error', 'Logging', 'About an object.')]


async def test_filtered_out_by_the_logging_levels(
        k8s_emulator: 'KubernetesEmulator', operator: Operator, body: dict[str, Any],
) -> None:
    operator.settings.posting.loggers = True
    operator.settings.posting.level = logging.DEBUG
    logging.getLogger('kopf.objects').setLevel(logging.WARNING)  # e.g. as with --quiet
    logger = ObjectLogger(body=body, settings=operator.settings)
    logger.info('Info message.')
    logger.warning('Warning message.')
    await operator.settle()
    assert _summary(k8s_emulator) == [('Warning', 'Logging', 'Warning message.')]


async def test_messages_before_the_poster_starts_are_kept(
        k8s_emulator: 'KubernetesEmulator', make_operator: Any, settings: Any, body: dict[str, Any],
) -> None:
    settings.posting.loggers = True
    operator = make_operator(settings, started=False)
    event_queue_var.set(operator.event_queue)
    ObjectLogger(body=body, settings=settings).info('Early message.')
    assert len(operator.event_queue) == 1

    operator.task = asyncio.create_task(poster(event_queue=operator.event_queue, vault=operator.vault))
    await operator.settle()
    assert _summary(k8s_emulator) == [('Normal', 'Logging', 'Early message.')]
