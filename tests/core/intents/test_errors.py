import pytest

from kopf._core.actions.errors import (
    AdmissionError,
    ErrorsMode,
    HandlerChildrenRetry,
    HandlerRetriesError,
    HandlerTimeoutError,
    PermanentError,
    TemporaryError,
)
from kopf._core.intents import handlers


@pytest.mark.parametrize('cls, base', [
    (PermanentError, Exception),
    (TemporaryError, Exception),
    (HandlerTimeoutError, PermanentError),
    (HandlerRetriesError, PermanentError),
    (AdmissionError, PermanentError),
    (HandlerChildrenRetry, TemporaryError),
])
def test_hierarchy(cls, base):
    assert issubclass(cls, base)


def test_temporary_and_permanent_errors_are_unrelated():
    assert not issubclass(TemporaryError, PermanentError)
    assert not issubclass(PermanentError, TemporaryError)


@pytest.mark.parametrize('args, kwargs, message, delay', [
    ((), {}, '', 60),
    (('not ready',), {}, 'not ready', 60),
    (('not ready',), {'delay': 10}, 'not ready', 10),
    ((), {'delay': 5}, '', 5),
    (('now',), {'delay': None}, 'now', None),
])
def test_temporary_error_message_and_delay(args, kwargs, message, delay):
    error = TemporaryError(*args, **kwargs)
    assert str(error) == message
    assert error.delay == delay


def test_temporary_error_message_is_positional_only():
    with pytest.raises(TypeError):
        TemporaryError(message='x')  # type: ignore[call-arg]


@pytest.mark.parametrize('args, kwargs, message, code', [
    ((), {}, '', 500),
    (('bad',), {}, 'bad', 500),
    (('bad',), {'code': 499}, 'bad', 499),
])
def test_admission_error(args, kwargs, message, code):
    error = AdmissionError(*args, **kwargs)
    assert str(error) == message
    assert error.message == message
    assert error.code == code


def test_errors_mode_members_and_its_reexport():
    assert [mode.name for mode in ErrorsMode] == ['IGNORED', 'TEMPORARY', 'PERMANENT']
    assert ErrorsMode is handlers.ErrorsMode
