"""
The per-object loggers: what they carry to the records and how they are detached from the bodies.
"""
import json
import logging
from typing import Any

import pytest

from kopf._cogs.structs.bodies import Body
from kopf._core.actions.loggers import (
    LocalObjectLogger,
    LogFormat,
    ObjectLogger,
    build_object_prefix,
    build_object_ref,
    configure,
)
from kopf._core.intents.configuration import OperatorSettings


def _json_lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


def test_object_loggers_are_adapters_of_the_objects_logger(
        settings: OperatorSettings, namespaced_body: dict[str, Any],
) -> None:
    logger = ObjectLogger(body=namespaced_body, settings=settings)
    local = LocalObjectLogger(body=namespaced_body, settings=settings)
    assert isinstance(logger, logging.LoggerAdapter)
    assert isinstance(local, ObjectLogger)
    assert logger.logger is local.logger is logging.getLogger('kopf.objects')


def test_reference_is_detached_from_the_body(
        capsys: pytest.CaptureFixture[str], settings: OperatorSettings, namespaced_body: dict[str, Any],
) -> None:
    # The identity is copied at the first record (most adapters never log), and only then detached.
    configure(log_format=LogFormat.JSON, log_prefix=True)
    body = Body(namespaced_body)
    logger = ObjectLogger(body=body, settings=settings)
    logger.info('Hello.')
    namespaced_body['metadata']['name'] = 'renamed'
    body._replace_with({'metadata': {'name': 'replaced'}})
    logger.info('Again.')
    first, second = _json_lines(capsys)
    assert first['message'] == '[ns1/kex1] Hello.'
    assert second['message'] == '[ns1/kex1] Again.'
    assert first['object']['name'] == second['object']['name'] == 'kex1'


def test_twins_share_the_identity_but_not_the_locality(
        capsys: pytest.CaptureFixture[str], settings: OperatorSettings, namespaced_body: dict[str, Any],
) -> None:
    configure(log_format=LogFormat.JSON, log_prefix=True)
    logger = ObjectLogger(body=namespaced_body, settings=settings)
    early_twin = logger._twin(LocalObjectLogger)  # before the identity is copied
    logger.info('Hello.')
    late_twin = logger._twin(LocalObjectLogger)  # after it is copied
    early_twin.info('Early.')
    late_twin.info('Late.')
    records = _json_lines(capsys)
    assert [record['message'] for record in records] == ['[ns1/kex1] Hello.', '[ns1/kex1] Early.',
                                                         '[ns1/kex1] Late.']
    assert not logger.local and early_twin.local and late_twin.local


def test_callers_extras_are_kept_but_cannot_replace_the_reference(
        capsys: pytest.CaptureFixture[str], settings: OperatorSettings, namespaced_body: dict[str, Any],
) -> None:
    configure(log_format=LogFormat.JSON)
    logger = ObjectLogger(body=namespaced_body, settings=settings)
    logger.info('Hello.', extra={'custom': 123, 'kopf_object_ref': {'name': 'fake'}})
    [record] = _json_lines(capsys)
    assert record['custom'] == 123
    assert record['object']['name'] == 'kex1'


@pytest.mark.parametrize('via_helper', [False, True], ids=['direct', 'helper'])
@pytest.mark.parametrize('level', ['debug', 'info', 'warning', 'error'])
def test_records_name_the_callers_not_the_loggers(
        caplog: pytest.LogCaptureFixture, settings: OperatorSettings, namespaced_body: dict[str, Any],
        level: str, via_helper: bool,
) -> None:
    # %(filename)s, %(funcName)s, %(lineno)d in the operators' log formats point to where they log;
    # a helper that logs for its callers (``stacklevel=2``) names them, as with the standard loggers.
    def log_for_the_caller(logger: ObjectLogger) -> None:
        getattr(logger, level)('hello', stacklevel=2)

    caplog.set_level(logging.DEBUG, logger='kopf.objects')
    logger = ObjectLogger(body=namespaced_body, settings=settings)
    if via_helper:
        log_for_the_caller(logger)
    else:
        getattr(logger, level)('hello')
    (record,) = [r for r in caplog.records if r.name == 'kopf.objects']
    assert record.filename == 'test_object_loggers.py'
    assert record.funcName == 'test_records_name_the_callers_not_the_loggers'


def test_disabled_levels_make_no_records(
        caplog: pytest.LogCaptureFixture, settings: OperatorSettings, namespaced_body: dict[str, Any],
) -> None:
    caplog.set_level(logging.WARNING, logger='kopf.objects')
    logger = ObjectLogger(body=namespaced_body, settings=settings)
    logger.debug('hello')
    logger.info('hello')
    assert not [r for r in caplog.records if r.name == 'kopf.objects']


def test_local_loggers_log_the_same_way(
        capsys: pytest.CaptureFixture[str], settings: OperatorSettings, namespaced_body: dict[str, Any],
) -> None:
    configure(log_format=LogFormat.PLAIN, log_prefix=True)
    LocalObjectLogger(body=namespaced_body, settings=settings).info('Hello.')
    assert capsys.readouterr().err == '[ns1/kex1] Hello.\n'


def test_references_of_various_bodies() -> None:
    assert build_object_ref({'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {
        'name': 'pod1', 'namespace': 'ns1', 'uid': 'uid1', 'labels': {'x': 'y'}}}) == {
        'apiVersion': 'v1', 'kind': 'Pod', 'name': 'pod1', 'uid': 'uid1', 'namespace': 'ns1'}
    assert build_object_ref({}) == {
        'apiVersion': None, 'kind': None, 'name': None, 'uid': None, 'namespace': None}
    # The official client's models as dicts (obj.to_dict()) have the snake-cased names.
    ref = build_object_ref({'api_version': 'v1', 'kind': 'Pod', 'metadata': {'name': 'pod1'}})
    assert ref['apiVersion'] == 'v1'


@pytest.mark.parametrize('ref, prefix', [
    ({'name': 'kex1', 'namespace': 'ns1'}, '[ns1/kex1]'),
    ({'name': 'node1', 'namespace': None}, '[node1]'),
    ({'name': 'node1'}, '[node1]'),
])
def test_prefixes(ref: dict[str, Any], prefix: str) -> None:
    assert build_object_prefix(ref) == prefix


@pytest.mark.parametrize('level', ['debug', 'info'])
def test_the_plain_messages_fast_path_makes_the_same_records_as_the_general_one(
        caplog: pytest.LogCaptureFixture, settings: OperatorSettings, namespaced_body: dict[str, Any],
        level: str,
) -> None:
    # A plain message takes the fast path; with an (empty) extra, the logging's general path.
    caplog.set_level(logging.DEBUG, logger='kopf.objects')
    logger = ObjectLogger(body=namespaced_body, settings=settings)
    getattr(logger, level)('hello %s', 'world'); getattr(logger, level)('hello %s', 'world', extra={})  # noqa: E702
    fast, general = [r for r in caplog.records if r.name == 'kopf.objects']
    ignored = {'created', 'msecs', 'relativeCreated', 'lineno'}  # lineno: the same line, see above
    assert {k: v for k, v in vars(fast).items() if k not in ignored} == \
           {k: v for k, v in vars(general).items() if k not in ignored}
    assert fast.lineno == general.lineno
    assert fast.getMessage() == 'hello world'


def test_the_text_formats_time_is_as_the_standard_one(settings: OperatorSettings) -> None:
    from kopf._core.actions.loggers import make_formatter
    formatter = make_formatter(LogFormat.FULL)
    standard = logging.Formatter(LogFormat.FULL.value)
    for created in [1_700_000_000.001, 1_700_000_000.999, 1_700_000_001.5, 1_700_000_000.25]:
        record = logging.LogRecord('kopf', logging.INFO, __file__, 1, 'message', (), None)
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert formatter.formatTime(record) == standard.formatTime(record)
        assert formatter.formatTime(record, '%H') == standard.formatTime(record, '%H')
