"""
The verbosity of ``configure()``: debug, verbose, quiet, the default; the noisy third-party loggers;
and the repeated calls (which must replace the previous setup, not add to it).
"""
import logging
import sys
import threading

import pytest

from kopf._core.actions.loggers import LogFormat, configure


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def _log_everything() -> None:
    for name in ['kopf.x', 'asyncio', 'aiohttp.client', 'aiohttp.access', 'other']:
        logger = logging.getLogger(name)
        logger.debug(f'{name} debug')
        logger.info(f'{name} info')
        logger.warning(f'{name} warning')


@pytest.mark.parametrize('kwargs, level', [
    ({}, logging.INFO),
    ({'quiet': True}, logging.WARNING),
    ({'verbose': True}, logging.DEBUG),
    ({'debug': True}, logging.DEBUG),
    ({'verbose': True, 'quiet': True}, logging.DEBUG),
    ({'debug': True, 'quiet': True}, logging.DEBUG),
])
def test_root_levels(kwargs: dict[str, bool], level: int) -> None:
    configure(**kwargs)
    assert logging.getLogger().level == level


def test_default_shows_info_but_not_asyncio(capsys: pytest.CaptureFixture[str]) -> None:
    configure(log_format=LogFormat.PLAIN)
    _log_everything()
    assert _lines(capsys) == [
        'kopf.x info', 'kopf.x warning',
        'aiohttp.client info', 'aiohttp.client warning',
        'aiohttp.access info', 'aiohttp.access warning',
        'other info', 'other warning',
    ]


def test_quiet_shows_only_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    configure(log_format=LogFormat.PLAIN, quiet=True)
    _log_everything()
    assert _lines(capsys) == ['kopf.x warning', 'aiohttp.client warning', 'aiohttp.access warning',
                              'other warning']


def test_verbose_shows_debug_but_hides_asyncio_and_aiohttp_internals(
        capsys: pytest.CaptureFixture[str],
) -> None:
    configure(log_format=LogFormat.PLAIN, verbose=True)
    _log_everything()
    assert _lines(capsys) == [
        'kopf.x debug', 'kopf.x info', 'kopf.x warning',
        'aiohttp.client info', 'aiohttp.client warning',
        'aiohttp.access info', 'aiohttp.access warning',
        'other debug', 'other info', 'other warning',
    ]


def test_debug_shows_everything(capsys: pytest.CaptureFixture[str]) -> None:
    configure(log_format=LogFormat.PLAIN, debug=True)
    _log_everything()
    assert len(_lines(capsys)) == 15


def test_switching_from_verbose_to_debug_and_back(capsys: pytest.CaptureFixture[str]) -> None:
    configure(log_format=LogFormat.PLAIN, verbose=True)
    configure(log_format=LogFormat.PLAIN, debug=True)
    logging.getLogger('asyncio').debug('asyncio debug')
    logging.getLogger('aiohttp.client').debug('aiohttp debug')
    configure(log_format=LogFormat.PLAIN)
    logging.getLogger('asyncio').warning('asyncio warning')
    logging.getLogger('aiohttp.client').debug('aiohttp debug, hidden by the root level')
    assert _lines(capsys) == ['asyncio debug', 'aiohttp debug']
    assert logging.getLogger('aiohttp').level == logging.NOTSET


def test_own_levels_of_third_party_loggers_are_restored() -> None:
    logging.getLogger('aiohttp').setLevel(logging.ERROR)
    configure(verbose=True)
    assert logging.getLogger('aiohttp').level == logging.INFO
    configure(debug=True)
    assert logging.getLogger('aiohttp').level == logging.ERROR


def test_repeated_calls_replace_the_setup_and_keep_others_handlers(
        capsys: pytest.CaptureFixture[str],
) -> None:
    foreign = logging.NullHandler()
    logging.getLogger().addHandler(foreign)
    handlers_before = set(logging.getLogger().handlers)

    configure(log_format=LogFormat.FULL)
    configure(log_format=LogFormat.JSON, debug=True)
    configure(log_format=LogFormat.PLAIN, verbose=True)
    logging.getLogger('kopf.x').info('Once.')

    added = set(logging.getLogger().handlers) - handlers_before
    assert len(added) == 1
    assert foreign in logging.getLogger().handlers
    assert _lines(capsys) == ['Once.']


def test_concurrent_calls_leave_one_handler(capsys: pytest.CaptureFixture[str]) -> None:
    # Operators started in threads at once (e.g. two replicas of KopfRunner in one test): found as
    # every log line doubled in the next operator's output. Frequent thread switches expose the race.
    handlers_before = set(logging.getLogger().handlers)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            barrier = threading.Barrier(8)
            def call(barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                configure(log_format=LogFormat.PLAIN)
            threads = [threading.Thread(target=call) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        sys.setswitchinterval(interval)
    logging.getLogger('kopf.x').warning('Once.')

    added = set(logging.getLogger().handlers) - handlers_before
    assert len(added) == 1
    assert _lines(capsys) == ['Once.']


def test_a_restored_older_setup_is_replaced_too(capsys: pytest.CaptureFixture[str]) -> None:
    # A test's fixture puts back the root's handlers of before an operator's run (its older setup).
    root = logging.getLogger()
    configure(log_format=LogFormat.PLAIN)
    saved = list(root.handlers)
    configure(log_format=LogFormat.PLAIN)
    root.handlers[:] = saved
    configure(log_format=LogFormat.PLAIN)
    logging.getLogger('kopf.x').warning('Once.')
    assert _lines(capsys) == ['Once.']
