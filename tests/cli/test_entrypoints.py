"""
The real command in subprocesses: the ``kopf`` script, ``python -m kopf``, exit codes, signals.
"""
import os
import pathlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kopf.testing import KubernetesEmulator

TIMEOUT = 30.0
KOPF_SCRIPT = shutil.which('kopf', path=os.path.dirname(sys.executable))

STARTUP_OPERATOR = '''
    import kopf

    @kopf.on.startup()
    def announce(logger, settings, **_):
        settings.networking.error_backoffs = ()  # fail at once if unreachable, do not retry for a minute
        logger.info('The operator has started.')

    @kopf.on.cleanup()
    def farewell(logger, **_):
        logger.info('The operator has cleaned up.')
'''


@pytest.fixture(params=['script', 'module'])
def kopf_command(request: pytest.FixtureRequest) -> list[str]:
    """Both ways to run the command: the console script and ``python -m kopf``."""
    if request.param == 'script':
        if KOPF_SCRIPT is None:
            pytest.skip('the kopf console script is not installed next to the Python interpreter')
        return [KOPF_SCRIPT]
    return [sys.executable, '-m', 'kopf']


PYTHON_M_KOPF = [sys.executable, '-m', 'kopf']  # for the tests that need only one of the ways


def run_kopf(
        command: list[str], *args: str, env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=TIMEOUT, env=env)


Process = Any  # the conftest's KopfProcess (the kopf_process fixture)


@pytest.fixture()
def started_processes() -> Iterator[list[Process]]:
    processes: list[Process] = []
    yield processes
    for process in processes:  # only if a test has failed midway: do not leave them running
        if process.popen.poll() is None:
            process.popen.kill()
            process.wait()


def test_version(kopf_command: list[str]) -> None:
    result = run_kopf(kopf_command, '--version')
    assert result.returncode == 0
    assert result.stderr == ''
    lines = result.stdout.splitlines()
    assert any(line.startswith('kopf-cli ') for line in lines)
    assert any(line.startswith('kopf-core ') for line in lines)


def test_python_m_kopf_is_the_same_as_the_script() -> None:
    if KOPF_SCRIPT is None:
        pytest.skip('the kopf console script is not installed next to the Python interpreter')
    for args in (['--version'], ['run', '--help']):
        from_script = run_kopf([KOPF_SCRIPT], *args)
        from_module = run_kopf([sys.executable, '-m', 'kopf'], *args)
        assert from_script.returncode == from_module.returncode == 0
        assert from_script.stdout == from_module.stdout
        assert 'Usage: kopf ' in from_script.stdout or args == ['--version']


def test_help_lists_the_commands() -> None:
    result = run_kopf(PYTHON_M_KOPF, '--help')
    assert result.returncode == 0
    for command in ('run', 'freeze', 'resume'):
        assert f'  {command} ' in result.stdout


def test_run_stops_on_signals(
        kopf_command: list[str], kopf_env: dict[str, str], started_processes: list[Process],
        write_source: Callable[..., pathlib.Path], kopf_process: Any,
) -> None:
    path = write_source('signalled_operator.py', STARTUP_OPERATOR)
    for signum in (signal.SIGINT, signal.SIGTERM):
        args = [*kopf_command, 'run', '-A', '--standalone', '--log-format=plain', str(path)]
        process = kopf_process(args, kopf_env, timeout=TIMEOUT)
        started_processes.append(process)
        process.wait_for_line('The operator has started.')
        process.popen.send_signal(signum)
        assert process.wait() == 0
        assert 'The operator has cleaned up.' in process.lines
        assert not any('Traceback' in line for line in process.lines)


def test_a_process_not_exiting_in_time_fails_with_its_last_lines(
        kopf_process: Any, started_processes: list[Process]) -> None:
    # The helper of these tests: a hang shows what the process has said, not only a TimeoutExpired.
    code = 'import sys, time; print("The last words.", file=sys.stderr, flush=True); time.sleep(60)'
    process = kopf_process([sys.executable, '-c', code], dict(os.environ), timeout=TIMEOUT)
    started_processes.append(process)
    process.wait_for_line('The last words.')
    process.timeout = 0.1
    with pytest.raises(pytest.fail.Exception, match=r'has not exited in 0\.1 seconds; its last lines:\n'
                                                    r'The last words\.$'):
        process.wait()
    process.timeout = TIMEOUT  # for the cleanup's wait after the kill


def test_failing_source_exits_with_1_and_no_framework_traceback(
        write_source: Callable[..., pathlib.Path]) -> None:
    path = write_source('failing_subprocess_operator.py', 'raise ValueError("the operator is broken")\n')
    result = run_kopf(PYTHON_M_KOPF, 'run', '-A', str(path))
    assert result.returncode == 1
    assert result.stdout == ''
    assert result.stderr.startswith(f"Error: Cannot load '{path}':\nTraceback (most recent call last):\n")
    assert result.stderr.endswith('ValueError: the operator is broken\n')
    assert result.stderr.count('  File ') == 1  # the user's file only


def test_failing_source_with_debug_shows_the_full_traceback(
        write_source: Callable[..., pathlib.Path]) -> None:
    path = write_source('failing_subprocess_operator.py', 'raise ValueError("the operator is broken")\n')
    result = run_kopf(PYTHON_M_KOPF, 'run', '-A', '--debug', str(path))
    assert result.returncode == 1
    assert not any(line.startswith('Error:') for line in result.stderr.splitlines())
    assert result.stderr.endswith('ValueError: the operator is broken\n')
    assert 'kopf/_cli/' in result.stderr  # the framework's frames are not hidden
    assert result.stderr.count('  File ') > 1


@pytest.mark.usefixtures('unreachable_cluster')
def test_unreachable_cluster_exits_with_1_and_one_message(
        write_source: Callable[..., pathlib.Path]) -> None:
    path = write_source('unreachable_operator.py', STARTUP_OPERATOR)
    result = run_kopf(PYTHON_M_KOPF, 'run', '-A', '--standalone', str(path), env=dict(os.environ))
    assert result.returncode == 1
    last_line = result.stderr.splitlines()[-1]
    assert last_line.startswith('Error: Cannot reach the Kubernetes API: ')
    assert sum(line.startswith('Error:') for line in result.stderr.splitlines()) == 1


@pytest.mark.usefixtures('unreachable_cluster')
def test_unreachable_cluster_with_debug_shows_the_traceback(
        write_source: Callable[..., pathlib.Path]) -> None:
    path = write_source('unreachable_operator.py', STARTUP_OPERATOR)
    result = run_kopf(PYTHON_M_KOPF, 'run', '-A', '--standalone', '--debug', str(path), env=dict(os.environ))
    assert result.returncode == 1
    assert not any(line.startswith('Error:') for line in result.stderr.splitlines())
    assert result.stderr.splitlines()[-1].startswith('kopf._clients.connections.CannotConnect: ')
    assert 'kopf/_cli/commands.py' in result.stderr  # propagated through the command, not reported by it


def test_usage_error_exits_with_2() -> None:
    result = run_kopf(PYTHON_M_KOPF, 'run', '-A', '-n', 'default')
    assert result.returncode == 2
    assert result.stderr.startswith('Usage: kopf run [OPTIONS] [PATHS]...\n')
    assert 'Traceback' not in result.stderr


def test_freeze_of_a_missing_peering_exits_with_1(k8s_emulator: KubernetesEmulator) -> None:
    result = run_kopf(PYTHON_M_KOPF, 'freeze', '-P', 'example', '-p', '100', '-t', '60',
                      env={**os.environ, 'KUBECONFIG': str(k8s_emulator.kubeconfig_path)})
    assert result.returncode == 1
    assert "The mandatory peering 'example' cannot be used" in result.stderr
    assert 'Traceback' not in result.stderr
