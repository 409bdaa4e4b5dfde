"""
The actions' fast paths, pinned to the general ones: for random inputs, the same results.

* a local logger made as a twin of an object logger (no repeated parsing of the body, as for every event)
  vs. the local logger made from the body;
* the object loggers' own emission of the plain records (the caller's frame known) vs. the logging's
  general path (``log()``, which walks the stack): the same records;
* the text formatter's timestamps (remembered per second) vs. the logging's own formatting;
* the handler states' fast copies vs. ``dataclasses.replace()``.
"""
import dataclasses
import datetime
import logging
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kopf._cogs.structs.bodies import Body
from kopf._core.actions import loggers
from kopf._core.actions.progression import HandlerState
from kopf._core.intents.configuration import OperatorSettings

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OPERATOR_SETTINGS = OperatorSettings()

NAMES = st.none() | st.sampled_from(['kex', 'kex-1', 'a' * 63]) | st.integers(0, 3)
BODIES = st.fixed_dictionaries({}, optional={
    'apiVersion': st.sampled_from(['v1', 'kopf.dev/v1']),
    'api_version': st.sampled_from(['v1', 'apps/v1']),  # as the official client's models have it
    'kind': st.sampled_from(['KopfExample', 'Pod']) | st.none(),
    'metadata': st.fixed_dictionaries({}, optional={'name': NAMES, 'namespace': NAMES, 'uid': NAMES}),
})


@SETTINGS
@given(BODIES, st.booleans(), st.booleans())
def test_twins_of_the_loggers_are_the_loggers_made_from_the_bodies(
        raw: dict[str, Any], view: bool, used_before: bool,
) -> None:
    body = Body(raw) if view else raw
    logger = loggers.ObjectLogger(body=body, settings=OPERATOR_SETTINGS)
    if used_before:
        logger._own_extra()  # e.g. a message was logged: the identity is parsed already
    twin = logger._twin(loggers.LocalObjectLogger)
    made = loggers.LocalObjectLogger(body=body, settings=OPERATOR_SETTINGS)
    assert type(twin) is type(made)
    assert twin._own_extra() == made._own_extra()
    assert twin.logger is made.logger
    assert logger._own_extra()[loggers.LOCAL_ATTR] is False  # the original is not affected


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _log(logger: loggers.ObjectLogger, method: str, msg: str, args: tuple[Any, ...], general: bool) -> None:
    # One line for both paths: the records must name the same caller (file, line, function).
    getattr(logger, method)(msg, *args, **({'extra': {}} if general else {}))


RECORD_ATTRS = ['name', 'levelno', 'levelname', 'pathname', 'filename', 'module', 'lineno', 'funcName',
                'msg', 'args', 'exc_info', 'exc_text', 'stack_info',
                loggers.REF_ATTR, loggers.PREFIX_ATTR, loggers.LOCAL_ATTR, loggers.SETTINGS_ATTR]


@SETTINGS
@given(BODIES, st.sampled_from(['debug', 'info']), st.booleans(),
       st.sampled_from([('plain', ()), ('%s and %d', ('x', 1)), ('%r', ({'a': 1},)), ('%(a)s', ({'a': 1},))]))
def test_plain_records_are_made_as_the_logging_makes_them(
        raw: dict[str, Any], method: str, local: bool, msg_and_args: tuple[str, tuple[Any, ...]],
) -> None:
    msg, args = msg_and_args
    cls = loggers.LocalObjectLogger if local else loggers.ObjectLogger
    capture = _Capture()
    previous_level = loggers.object_logger.level
    loggers.object_logger.addHandler(capture)
    loggers.object_logger.setLevel(logging.DEBUG)
    try:
        _log(cls(body=raw, settings=OPERATOR_SETTINGS), method, msg, args, general=False)
        _log(cls(body=raw, settings=OPERATOR_SETTINGS), method, msg, args, general=True)
    finally:
        loggers.object_logger.removeHandler(capture)
        loggers.object_logger.setLevel(previous_level)
    fast, general = capture.records
    for attr in RECORD_ATTRS:
        assert getattr(fast, attr, None) == getattr(general, attr, None), attr
    assert fast.getMessage() == general.getMessage()


@SETTINGS
@given(st.floats(min_value=0, max_value=4e9, allow_nan=False),
       st.lists(st.floats(min_value=0, max_value=3, allow_nan=False), min_size=1, max_size=5))
def test_remembered_timestamps_are_formatted_as_the_logging_formats_them(
        base: float, offsets: list[float],
) -> None:
    formatter = loggers.ObjectTextFormatter()  # the same one: the second is remembered between records
    general = logging.Formatter()
    for created in [base + offset for offset in [*offsets, *offsets]]:  # within the same seconds & not
        record = logging.LogRecord('x', logging.INFO, __file__, 1, 'msg', (), None)
        record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
        assert formatter.formatTime(record) == general.formatTime(record)


TIMES = st.none() | st.datetimes(timezones=st.just(datetime.UTC))
STATES = st.builds(HandlerState, started=TIMES, stopped=TIMES, delayed=TIMES,
                   purpose=st.none() | st.sampled_from(['create', 'update']), retries=st.integers(0, 5),
                   success=st.booleans(), failure=st.booleans(), message=st.none() | st.text(max_size=5),
                   subrefs=st.lists(st.sampled_from(['a', 'b/c']), max_size=2).map(tuple),
                   stored=st.none() | st.just({'retries': 1}))
CHANGES = st.fixed_dictionaries({}, optional={
    'started': TIMES, 'delayed': TIMES, 'retries': st.integers(0, 5), 'success': st.booleans(),
    'message': st.none() | st.text(max_size=5), 'stored': st.none() | st.just({'retries': 2}),
})


@SETTINGS
@given(STATES, CHANGES)
def test_fast_copies_of_the_states_are_as_dataclasses_replace_makes_them(
        state: HandlerState, changes: dict[str, Any],
) -> None:
    fast = state._replace(**changes)
    general = dataclasses.replace(state, **changes)
    assert type(fast) is HandlerState
    assert fast == general
    assert fast.stored == general.stored  # not compared by the dataclass's equality
    assert vars(fast) == vars(general)
