"""
KopfRunner: the operator in a background thread, its results, re-raising, timeouts, the emulator.
"""
import asyncio
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

import kopf
import kopf.testing
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import KopfRunner, KubernetesEmulator
from kopf.testing.runner import OperatorStuckError

WAIT = 10.0
RUN = ['run', '-A', '--standalone']


def test_exported_from_kopf_testing() -> None:
    assert kopf.testing.KopfRunner is KopfRunner
    assert 'KopfRunner' in kopf.testing.__all__


def test_results_of_a_successful_run(k8s_emulator: KubernetesEmulator, registry: OperatorRegistry) -> None:
    @kopf.on.startup(registry=registry)
    def greet(logger: kopf.Logger, **_: Any) -> None:
        print('printed by the handler')
        logger.info('logged by the handler')

    with KopfRunner([*RUN, '--log-format=plain'], registry=registry) as runner:
        assert not runner.finished
    assert runner.finished
    assert runner.exit_code == 0
    assert runner.exception is None
    assert runner.exc_info is None
    assert 'printed by the handler\n' in runner.stdout
    assert 'logged by the handler\n' in runner.stderr
    assert 'logged by the handler\n' not in runner.stdout
    assert 'printed by the handler\n' in runner.output
    assert 'logged by the handler\n' in runner.output
    assert runner.result.exit_code == 0


def test_the_block_starts_once_the_operator_is_ready(k8s_emulator: KubernetesEmulator,
                                                    registry: OperatorRegistry) -> None:
    started = threading.Event()

    @kopf.on.startup(registry=registry)
    async def slow_startup(**_: Any) -> None:
        await asyncio.sleep(0.2)
        started.set()

    with KopfRunner(RUN, registry=registry):
        assert started.is_set()
        assert k8s_emulator.open_watches > 0  # watching, too


def test_results_are_unavailable_while_running(k8s_emulator: KubernetesEmulator,
                                               registry: OperatorRegistry) -> None:
    with KopfRunner(RUN, registry=registry) as runner:
        with pytest.raises(RuntimeError, match='still running'):
            _ = runner.exit_code
        with pytest.raises(RuntimeError, match='still running'):
            _ = runner.output


def test_stops_via_the_stop_flag_with_cleanup(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry) -> None:
    cleaned_up = threading.Event()

    @kopf.on.cleanup(registry=registry)
    def cleanup(**_: Any) -> None:
        cleaned_up.set()

    with KopfRunner([*RUN, '--log-format=plain'], registry=registry) as runner:
        assert not cleaned_up.is_set()
    assert cleaned_up.is_set()
    assert 'Stop-flag is set to True. Operator is stopping.' in runner.output.splitlines()


def test_repeated_start_and_stop_never_hangs(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry) -> None:
    starts: list[int] = []
    cleanups: list[int] = []

    @kopf.on.startup(registry=registry)
    def count_starts(**_: Any) -> None:
        starts.append(1)

    @kopf.on.cleanup(registry=registry)
    def count_cleanups(**_: Any) -> None:
        cleanups.append(1)

    for attempt in range(20):
        started_at = time.monotonic()
        with KopfRunner(RUN, registry=registry, timeout=5) as runner:
            assert len(starts) == attempt + 1
        assert runner.exit_code == 0, runner.output
        assert len(cleanups) == attempt + 1
        assert time.monotonic() - started_at < 5  # each one: far below the timeout, not just within it
    assert not [thread for thread in threading.enumerate() if thread.name == 'KopfRunner']


def test_settings_are_passed_to_the_operator(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry) -> None:
    settings = kopf.OperatorSettings()
    settings.posting.level = 42
    seen: list[Any] = []

    @kopf.on.startup(registry=registry)
    def remember(settings: kopf.OperatorSettings, **_: Any) -> None:
        seen.append(settings)

    with KopfRunner(RUN, registry=registry, settings=settings):
        pass
    assert seen == [settings]
    assert seen[0].posting.level == 42


def test_files_register_into_the_given_registry(k8s_emulator: KubernetesEmulator, registry: OperatorRegistry,
                                                write_source: Callable[..., pathlib.Path]) -> None:
    path = write_source('runner_operator.py', '''
        import kopf

        @kopf.on.startup()
        def from_file(logger, **_):
            logger.info('The file handler has started.')
    ''')
    default_before = kopf.get_default_registry().activities.get_all_handlers()
    with KopfRunner([*RUN, '--log-format=plain', str(path)], registry=registry) as runner:
        pass
    assert 'The file handler has started.' in runner.output.splitlines()
    assert [handler.id for handler in registry.activities.get_all_handlers()] == ['from_file']
    assert kopf.get_default_registry().activities.get_all_handlers() == default_before


def test_click_arguments_are_passed_through(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry) -> None:
    seen: list[Any] = []

    @kopf.on.startup(registry=registry)
    def remember(settings: kopf.OperatorSettings, **_: Any) -> None:
        seen.append(settings.peering.priority)

    with KopfRunner(['run', '-A'], registry=registry, env={'KOPF_RUN_PRIORITY': '77'}) as runner:
        pass
    assert seen == [77]
    assert runner.exit_code == 0


def test_obj_is_reserved() -> None:
    with pytest.raises(TypeError, match='"obj" cannot be passed'):
        KopfRunner(RUN, obj=object())


def test_cannot_be_entered_twice(k8s_emulator: KubernetesEmulator, registry: OperatorRegistry) -> None:
    runner = KopfRunner(['--version'])
    with runner:
        pass
    with pytest.raises(RuntimeError, match='can be entered only once'), runner:
        pass


def test_commands_that_exit_at_once(registry: OperatorRegistry) -> None:
    with KopfRunner(['--version']) as runner:
        pass
    assert runner.exit_code == 0
    assert 'kopf-testing ' in runner.stdout


#
# Failures & re-raising.
#

def test_failing_source_is_reraised_as_the_original_error_when_entering(
        write_source: Callable[..., pathlib.Path], registry: OperatorRegistry) -> None:
    path = write_source('broken_runner_operator.py', 'raise ValueError("the operator is broken")\n')
    body_has_run = False
    with (pytest.raises(ValueError, match='the operator is broken'),
          KopfRunner([*RUN, str(path)], registry=registry)):
        body_has_run = True
    assert not body_has_run


def test_failing_source_without_reraising(write_source: Callable[..., pathlib.Path],
                                          registry: OperatorRegistry) -> None:
    path = write_source('broken_runner_operator.py', 'raise ValueError("the operator is broken")\n')
    with KopfRunner([*RUN, str(path)], registry=registry, reraise=False) as runner:
        pass
    assert runner.exit_code == 1
    assert isinstance(runner.exception, ValueError)
    assert runner.exc_info is not None
    assert runner.exc_info[0] is ValueError
    assert runner.exc_info[1] is runner.exception
    assert runner.exc_info[2] is not None
    assert runner.stderr.startswith("Error: Cannot load '")


def test_errors_escaping_the_command_are_kept(write_source: Callable[..., pathlib.Path],
                                             registry: OperatorRegistry) -> None:
    path = write_source('broken_runner_operator.py', 'raise ValueError("the operator is broken")\n')
    args = [*RUN, '--debug', str(path)]  # --debug: the error is not reported by the command, but raised
    with KopfRunner(args, registry=registry, reraise=False, catch_exceptions=False) as runner:
        pass
    assert runner.exit_code == 1
    assert isinstance(runner.exception, ValueError)
    assert runner.output == ''
    with pytest.raises(RuntimeError, match='crashed outside of the command'):
        _ = runner.result


def test_usage_errors_are_reraised_as_system_exit(registry: OperatorRegistry) -> None:
    with pytest.raises(SystemExit) as error, KopfRunner(['run', '-A', '-n', 'default'], registry=registry):
        pass
    assert error.value.code == 2


def test_usage_errors_without_reraising(registry: OperatorRegistry) -> None:
    with KopfRunner(['run', '-A', '-n', 'default'], registry=registry, reraise=False) as runner:
        pass
    assert runner.exit_code == 2
    assert isinstance(runner.exception, SystemExit)
    assert 'exclude each other' in runner.stderr


def test_operator_failure_while_running_is_reraised_when_exiting(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry, wait_for: Callable[..., Any]) -> None:
    @kopf.on.startup(registry=registry)
    def no_retries(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.networking.error_backoffs = ()

    with pytest.raises(kopf.LoginError), KopfRunner(RUN, registry=registry) as runner:
        k8s_emulator.fail_requests(None, status=401)  # all of them, from now on
        k8s_emulator.drop_watches()  # so that the operator makes new requests
        wait_for(lambda: runner.finished)
    assert runner.exit_code == 1
    assert isinstance(runner.exception, kopf.LoginError)


def test_the_blocks_own_error_is_not_replaced(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry) -> None:
    with pytest.raises(KeyError, match='from the block'), KopfRunner(RUN, registry=registry) as runner:
        raise KeyError('from the block')
    assert runner.finished
    assert runner.exit_code == 0


#
# Timeouts: never hanging the test run.
#

def test_stuck_at_exit_is_cancelled_and_reported(k8s_emulator: KubernetesEmulator,
                                                 registry: OperatorRegistry) -> None:
    @kopf.on.cleanup(registry=registry)
    async def cleanup_that_never_ends(**_: Any) -> None:
        await asyncio.Event().wait()

    started_at = time.monotonic()
    with (pytest.raises(OperatorStuckError) as error,
          KopfRunner(RUN, registry=registry, timeout=0.5) as runner):
        pass
    assert time.monotonic() - started_at < WAIT
    assert runner.finished
    message = str(error.value)
    assert message.startswith('The operator did not stop within 0.5 seconds. '
                              'Its tasks were cancelled, and it has exited.\n')
    assert 'in cleanup_that_never_ends' in message  # where exactly it was stuck


def test_stuck_beyond_cancellation_is_abandoned_and_reported(k8s_emulator: KubernetesEmulator,
                                                             registry: OperatorRegistry) -> None:
    release = threading.Event()

    @kopf.on.cleanup(registry=registry)
    async def cleanup_that_blocks_the_loop(**_: Any) -> None:
        release.wait(WAIT)  # deliberately blocking: no cancellation can interrupt it

    stdout, stderr = sys.stdout, sys.stderr
    try:
        with (pytest.raises(OperatorStuckError) as error,
              KopfRunner(RUN, registry=registry, timeout=0.5) as runner):
            pass
        assert not runner.finished
        assert sys.stdout is stdout and sys.stderr is stderr  # restored, though the thread still runs
        message = str(error.value)
        assert 'the thread is abandoned and keeps running' in message
        assert 'in cleanup_that_blocks_the_loop' in message
        assert 'release.wait(WAIT)' in message
    finally:
        release.set()


def test_not_ready_in_time_is_stopped_and_reported(k8s_emulator: KubernetesEmulator,
                                                   registry: OperatorRegistry) -> None:
    @kopf.on.startup(registry=registry)
    async def startup_that_never_ends(**_: Any) -> None:
        await asyncio.Event().wait()

    body_has_run = False
    with pytest.raises(OperatorStuckError) as error, KopfRunner(RUN, registry=registry, timeout=0.5):
        body_has_run = True
    assert not body_has_run
    message = str(error.value)
    assert message.startswith('The operator did not get ready within 0.5 seconds, and was stopped.\n')
    assert 'in startup_that_never_ends' in message


def test_not_ready_in_time_says_first_what_the_operator_was_failing_at(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry) -> None:
    @kopf.on.startup(registry=registry)
    def startup_that_keeps_failing(**_: Any) -> None:
        raise kopf.TemporaryError('the database is not there', delay=60)

    with pytest.raises(OperatorStuckError) as error, KopfRunner(RUN, registry=registry, timeout=0.5):
        pass
    first_line = str(error.value).splitlines()[0]
    assert first_line == ("The operator did not get ready within 0.5 seconds, and was stopped; "
                          "its last error: Activity 'startup_that_keeps_failing' failed temporarily: "
                          "the database is not there")


def test_kubernetes_imported_before_the_runner_finds_the_emulator(tmp_path: pathlib.Path) -> None:
    # The `kubernetes` client reads $KUBECONFIG when imported: at the test module's top, that is before
    # the runner points it at its emulator. An operator's own load_kube_config() must find the emulator.
    (tmp_path / 'my_operator.py').write_text(textwrap.dedent("""
        import kopf, kubernetes

        @kopf.on.startup()
        def start(**_):
            kubernetes.config.load_kube_config()
            names = [ns.metadata.name for ns in kubernetes.client.CoreV1Api().list_namespace().items]
            print('NAMESPACES:', names)
    """))
    (tmp_path / 'test_operator.py').write_text(textwrap.dedent("""
        import kubernetes  # before the runner: it reads $KUBECONFIG now
        from kopf.testing import KopfRunner

        def test_operator():
            args = ['run', '-A', '--standalone', 'my_operator.py']
            with KopfRunner(args, emulator=True, timeout=10) as runner:
                pass
            assert runner.exit_code == 0, runner.output
            assert "NAMESPACES: ['default'" in runner.output
            assert kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION == '~/.kube/config'  # restored
    """))
    env = {key: value for key, value in os.environ.items() if key != 'KUBECONFIG'}
    env['HOME'] = str(tmp_path)  # no ~/.kube/config of the developer's
    command = [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'test_operator.py']
    result = subprocess.run(command,
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert '1 passed' in result.stdout


def test_default_timeout_is_finite() -> None:
    assert 0 < KopfRunner(RUN).timeout < float('inf')


#
# The emulator.
#

def test_with_its_own_emulator(registry: OperatorRegistry, create_configmap: Callable[..., None]) -> None:
    seen = threading.Event()

    @kopf.on.event('configmaps', registry=registry)
    def see(name: str, **_: Any) -> None:
        if name == 'cm1':
            seen.set()

    kubeconfig_before = os.environ.get('KUBECONFIG')
    with KopfRunner(RUN, registry=registry, emulator=True) as runner:
        emulator = runner.emulator
        assert os.environ['KUBECONFIG'] == str(emulator.kubeconfig_path)  # for the test's own clients too
        create_configmap(emulator, 'cm1')
        assert seen.wait(WAIT)
    assert runner.exit_code == 0
    assert os.environ.get('KUBECONFIG') == kubeconfig_before
    with pytest.raises(urllib.error.URLError):  # stopped together with the operator
        urllib.request.urlopen(f'{emulator.url}/api', timeout=WAIT)


def test_with_a_given_emulator(registry: OperatorRegistry, create_configmap: Callable[..., None]) -> None:
    seen = threading.Event()

    @kopf.on.event('configmaps', registry=registry)
    def see(name: str, **_: Any) -> None:
        if name == 'cm2':
            seen.set()

    with KubernetesEmulator() as emulator:
        create_configmap(emulator, 'cm2')
        with KopfRunner(RUN, registry=registry, emulator=emulator) as runner:
            assert runner.emulator is emulator
            assert seen.wait(WAIT)
        with urllib.request.urlopen(f'{emulator.url}/api', timeout=WAIT) as response:  # still serving
            assert response.status == 200
        assert emulator.requests.count('watch', 'configmaps') >= 1


def test_without_an_emulator_there_is_none(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry) -> None:
    with KopfRunner(RUN, registry=registry) as runner, pytest.raises(RuntimeError, match='no emulator'):
        _ = runner.emulator
