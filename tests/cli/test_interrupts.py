"""
Ctrl+C (SIGINT) of ``python -m kopf run`` in a subprocess while a sync handler runs in its thread.

The threads cannot be interrupted. Before, the first SIGINT was followed by silence for as long as
the handler ran (the interpreter waited for the thread at exit), the second one printed "Aborted!"
and waited further, the third one dumped a traceback of the threading module. Now, the first SIGINT
says what the exit waits for (the handler, the object, for how long it runs, with no time limit)
and how to skip the waiting; the second one exits at once with the code 130, abandoning the thread.
"""
import json
import os
import signal
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kopf.testing.emulator import KubernetesEmulator

TIMEOUT = 20.0

# The handler blocks its thread until the test creates the release file (or for a minute at most).
OPERATOR = '''
    import os, time, kopf

    @kopf.on.startup()
    def speedup(settings, **_):
        settings.queueing.exit_timeout = float(os.environ['EXIT_TIMEOUT'])

    @kopf.on.create('configmaps')
    def slow_fn(logger, **_):
        logger.info('The handler has started.')
        deadline = time.monotonic() + 60
        while not os.path.exists(os.environ['RELEASE_FILE']) and time.monotonic() < deadline:
            time.sleep(0.05)
        return 'released'
'''

Operator = Any  # the conftest's KopfProcess (the kopf_process fixture)


@pytest.fixture(params=[0.1])
def exit_timeout(request: pytest.FixtureRequest) -> float:
    """How long the workers get to finish at the graceful exit (settings.queueing.exit_timeout)."""
    return float(request.param)


@pytest.fixture()
def operator(k8s_emulator: KubernetesEmulator, tmp_path: Any, exit_timeout: float, kopf_process: Any,
             ) -> Iterator[tuple[Operator, str]]:
    source = tmp_path / 'sleepy_operator.py'
    source.write_text(textwrap.dedent(OPERATOR))
    release_file = str(tmp_path / 'release')
    env = {**os.environ, 'KUBECONFIG': str(k8s_emulator.kubeconfig_path), 'RELEASE_FILE': release_file,
           'EXIT_TIMEOUT': str(exit_timeout)}
    args = [sys.executable, '-m', 'kopf', 'run', '--standalone', '--verbose', '-n', 'default', str(source)]
    process = kopf_process(args, env, timeout=TIMEOUT)
    try:
        process.wait_for('Initial authentication has finished.')
        create_configmap(k8s_emulator.url, 'cm1')
        process.wait_for(r"\[default/cm1\] The handler has started\.")
        yield process, release_file
    finally:
        if process.popen.poll() is None:
            process.popen.kill()
            process.wait()


def create_configmap(url: str, name: str) -> None:
    body = json.dumps({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name}}).encode()
    request = urllib.request.Request(f'{url}/api/v1/namespaces/default/configmaps', data=body, method='POST',
                                     headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(request, timeout=TIMEOUT):
        pass


WAITING = (r"Waiting for 1 sync handler to return: Handler 'slow_fn' of default/cm1 \(running for \d+ s\)\. "
           r"Threads cannot be interrupted: the exit waits for them with no time limit\. "
           r"Press Ctrl\+C again to exit now without waiting\.")


def test_first_sigint_says_what_it_waits_for_and_exits_when_the_handler_returns(
        operator: tuple[Operator, str]) -> None:
    process, release_file = operator
    os.kill(process.popen.pid, signal.SIGINT)
    process.wait_for(WAITING)
    process.wait_for('Signal SIGINT is received. Operator is stopping.')
    open(release_file, 'w').close()
    assert process.wait() == 0
    assert not any('Traceback' in line or 'Aborted' in line for line in process.lines), process.lines


def test_first_sigterm_names_the_signal_to_repeat_and_exits_when_the_handler_returns(
        operator: tuple[Operator, str]) -> None:
    # SIGTERM comes from process managers (e.g. Kubernetes stopping a pod): Ctrl+C is not the only way.
    process, release_file = operator
    os.kill(process.popen.pid, signal.SIGTERM)
    process.wait_for(WAITING.replace(r'Press Ctrl\+C again', r'Send SIGTERM again \(or press Ctrl\+C\)'))
    process.wait_for('Signal SIGTERM is received. Operator is stopping.')
    open(release_file, 'w').close()
    assert process.wait() == 0
    assert not any('Traceback' in line or 'Aborted' in line for line in process.lines), process.lines


# The operator's loop is over: only the handler's thread keeps the process (before, silently).
OPERATOR_IS_OVER = r'Hung tasks (are stopped|stopping is skipped: no tasks given)\.'


@pytest.mark.parametrize('exit_timeout, over', [
    # The operator is still stopping its tasks (its worker waits for the handler for 10 s): cancelled now.
    pytest.param(10.0, False, id='while-exiting'),
    # The operator is over; the process waits for the handler's thread.
    pytest.param(0.1, True, id='after-exiting'),
], indirect=['exit_timeout'])
def test_second_sigint_exits_at_once_abandoning_the_thread(
        operator: tuple[Operator, str], over: bool) -> None:
    process, _ = operator
    os.kill(process.popen.pid, signal.SIGINT)
    process.wait_for(WAITING)
    if over:
        process.wait_for(OPERATOR_IS_OVER)
    sent = time.monotonic()
    os.kill(process.popen.pid, signal.SIGINT)
    assert process.wait() == 130
    assert time.monotonic() - sent < 5  # not waiting for the handler (60 s) or for the worker (10 s)
    abandoned = (r"abandoning the sync handlers: Handler 'slow_fn' of default/cm1 \(running for \d+ s\)\.")
    if over:
        process.wait_for(f'Exiting now, {abandoned}')
    else:
        process.wait_for(f'Signal SIGINT is received again. Operator is exiting now: '
                         f'cancelling what is running; {abandoned}')
    assert sum('abandoning' in message for message in process.messages) == 1
    assert not any('Traceback' in line or 'Aborted' in line for line in process.lines), process.lines
