"""
The shapes of the log lines in the plain, full, and JSON formats, with and without the object prefix.

The lines are produced by ``configure()`` into stderr (captured), as operators see them.
"""
import datetime
import json
import logging
import re
from typing import Any

import pytest

from kopf._core.actions.loggers import LogFormat, ObjectLogger, configure
from kopf._core.intents.configuration import OperatorSettings

FULL_LINE = re.compile(r'\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] '
                       r'(?P<name>.{20}) \[(?P<level>.{8})\] (?P<msg>.*)')


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_log_format_members_and_values() -> None:
    assert [member.name for member in LogFormat] == ['PLAIN', 'FULL', 'JSON']
    assert LogFormat.FULL.value == '[%(asctime)s] %(name)-20.20s [%(levelname)-8.8s] %(message)s'
    assert LogFormat.PLAIN.value == '%(message)s'


@pytest.mark.parametrize('log_prefix', [True, None])
def test_plain_with_prefix(capsys: pytest.CaptureFixture[str], settings: OperatorSettings,
                           namespaced_body: dict[str, Any], cluster_body: dict[str, Any],
                           log_prefix: bool | None) -> None:
    configure(log_format=LogFormat.PLAIN, log_prefix=log_prefix)
    ObjectLogger(body=namespaced_body, settings=settings).info('Hello %s.', 'world')
    ObjectLogger(body=cluster_body, settings=settings).warning('Cluster-wide.')
    logging.getLogger('kopf.something').info('Not about objects.')
    assert _lines(capsys) == ['[ns1/kex1] Hello world.', '[node1] Cluster-wide.', 'Not about objects.']


def test_plain_without_prefix(capsys: pytest.CaptureFixture[str], settings: OperatorSettings,
                              namespaced_body: dict[str, Any]) -> None:
    configure(log_format=LogFormat.PLAIN, log_prefix=False)
    ObjectLogger(body=namespaced_body, settings=settings).info('Hello.')
    assert _lines(capsys) == ['Hello.']


def test_full_is_the_default_format_and_unprefixed_by_default(
        capsys: pytest.CaptureFixture[str], settings: OperatorSettings, namespaced_body: dict[str, Any],
) -> None:
    configure()
    ObjectLogger(body=namespaced_body, settings=settings).info('Hello.')
    logging.getLogger('kopf._core.reactor.running').warning('Stopping.')
    lines = _lines(capsys)
    assert len(lines) == 2
    first, second = FULL_LINE.fullmatch(lines[0]), FULL_LINE.fullmatch(lines[1])
    assert first is not None and second is not None
    assert first.group('name', 'level', 'msg') == ('kopf.objects        ', 'INFO    ', 'Hello.')
    assert second.group('name', 'level', 'msg') == ('kopf._core.reactor.r', 'WARNING ', 'Stopping.')


def test_full_with_prefix(capsys: pytest.CaptureFixture[str], settings: OperatorSettings,
                          namespaced_body: dict[str, Any]) -> None:
    configure(log_format=LogFormat.FULL, log_prefix=None)
    ObjectLogger(body=namespaced_body, settings=settings).error('Failed.')
    match = FULL_LINE.fullmatch(_lines(capsys)[0])
    assert match is not None
    assert match.group('level', 'msg') == ('ERROR   ', '[ns1/kex1] Failed.')


def test_exceptions_follow_the_text_lines(capsys: pytest.CaptureFixture[str], settings: OperatorSettings,
                                          namespaced_body: dict[str, Any]) -> None:
    configure(log_format=LogFormat.PLAIN, log_prefix=True)
    try:
        raise ValueError('boom')
    except ValueError:
        ObjectLogger(body=namespaced_body, settings=settings).exception('Oops.')
    lines = _lines(capsys)
    assert lines[0] == '[ns1/kex1] Oops.'
    assert lines[1] == 'Traceback (most recent call last):'
    assert lines[-1] == 'ValueError: boom'


def test_json_lines(capsys: pytest.CaptureFixture[str], settings: OperatorSettings,
                    namespaced_body: dict[str, Any], cluster_body: dict[str, Any]) -> None:
    configure(log_format=LogFormat.JSON, verbose=True)
    ObjectLogger(body=namespaced_body, settings=settings).debug('About an object.')
    ObjectLogger(body=cluster_body, settings=settings).info('About a cluster object.')
    logging.getLogger('kopf.something').info('Not about objects.')

    records = [json.loads(line) for line in _lines(capsys)]
    assert [list(record) for record in records] == [
        ['message', 'timestamp', 'object', 'severity'],
        ['message', 'timestamp', 'object', 'severity'],
        ['message', 'timestamp', 'severity'],
    ]
    assert records[0]['message'] == 'About an object.'  # not prefixed by default
    assert records[0]['severity'] == 'debug'
    assert records[0]['object'] == {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'name': 'kex1',
                                    'uid': 'uid1', 'namespace': 'ns1'}
    assert records[1]['object'] == {'apiVersion': 'v1', 'kind': 'Node', 'name': 'node1',
                                    'uid': 'uid2', 'namespace': None}
    assert records[2] == {'message': 'Not about objects.', 'severity': 'info',
                          'timestamp': records[2]['timestamp']}
    timestamp = datetime.datetime.fromisoformat(records[0]['timestamp'])
    assert timestamp.utcoffset() == datetime.timedelta(0)
    assert abs(datetime.datetime.now(datetime.UTC) - timestamp) < datetime.timedelta(minutes=1)


def test_json_with_refkey_and_prefix(capsys: pytest.CaptureFixture[str], settings: OperatorSettings,
                                     namespaced_body: dict[str, Any]) -> None:
    configure(log_format=LogFormat.JSON, log_prefix=True, log_refkey='k8s-obj')
    ObjectLogger(body=namespaced_body, settings=settings).info('Hello.')
    record = json.loads(_lines(capsys)[0])
    assert list(record) == ['message', 'timestamp', 'k8s-obj', 'severity']
    assert record['message'] == '[ns1/kex1] Hello.'
    assert record['k8s-obj']['name'] == 'kex1'


def test_json_keeps_extras_and_exceptions_but_not_internals(
        capsys: pytest.CaptureFixture[str], settings: OperatorSettings, namespaced_body: dict[str, Any],
) -> None:
    configure(log_format=LogFormat.JSON)
    logger = ObjectLogger(body=namespaced_body, settings=settings)
    logger.info('With extras.', extra={'custom': 'value'})
    try:
        raise ValueError('boom')
    except ValueError:
        logger.exception('Oops.')
    with_extras, with_exception = (json.loads(line) for line in _lines(capsys))
    assert list(with_extras) == ['message', 'custom', 'timestamp', 'object', 'severity']
    assert with_extras['custom'] == 'value'
    assert list(with_exception) == ['message', 'exc_info', 'timestamp', 'object', 'severity']
    assert with_exception['exc_info'].startswith('Traceback (most recent call last):')
    assert with_exception['exc_info'].endswith('ValueError: boom')
    assert with_exception['severity'] == 'error'


@pytest.mark.parametrize('level, severity', [
    (logging.DEBUG, 'debug'),
    (logging.DEBUG + 1, 'info'),
    (logging.INFO, 'info'),
    (logging.INFO + 5, 'warn'),
    (logging.WARNING, 'warn'),
    (logging.WARNING + 1, 'error'),
    (logging.ERROR, 'error'),
    (logging.ERROR + 1, 'fatal'),
    (logging.CRITICAL, 'fatal'),
])
def test_json_severities(capsys: pytest.CaptureFixture[str], level: int, severity: str) -> None:
    configure(log_format=LogFormat.JSON, debug=True)
    logging.getLogger('kopf.something').log(level, 'Message.')
    assert json.loads(_lines(capsys)[0])['severity'] == severity


def test_prefix_is_not_seen_by_other_handlers(
        capsys: pytest.CaptureFixture[str], settings: OperatorSettings, namespaced_body: dict[str, Any],
) -> None:
    messages: list[str] = []

    class Collector(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(self.format(record))

    configure(log_format=LogFormat.PLAIN, log_prefix=True)
    logging.getLogger().addHandler(Collector())
    ObjectLogger(body=namespaced_body, settings=settings).info('Hello.')
    assert _lines(capsys) == ['[ns1/kex1] Hello.']
    assert messages == ['Hello.']


def test_format_names_are_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    configure(log_format='json')  # type: ignore[arg-type]
    logging.getLogger('kopf.something').warning('Hello.')
    record = json.loads(_lines(capsys)[0])
    assert (record['message'], record['severity']) == ('Hello.', 'warn')
