"""
Bad input: one clear message on stderr and the exit code (2 for the command line, 1 for the rest),
no tracebacks of the framework; the user's own failing code is shown by its traceback.
"""
import pathlib
from collections.abc import Callable

import click.testing
import pytest

from kopf._cli.commands import main
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import KopfRunner, KubernetesEmulator


def invoke(*args: str, env: dict[str, str] | None = None) -> click.testing.Result:
    return click.testing.CliRunner().invoke(main, list(args), env=env)


def test_missing_file_is_a_usage_error(tmp_path: pathlib.Path) -> None:
    result = invoke('run', '-A', str(tmp_path / 'absent.py'))
    assert result.exit_code == 2
    assert "'absent.py' does not exist" in result.stderr.replace(str(tmp_path) + '/', '')
    assert 'Traceback' not in result.output


def test_directory_instead_of_file_is_a_usage_error(tmp_path: pathlib.Path) -> None:
    result = invoke('run', '-A', str(tmp_path))
    assert result.exit_code == 2
    assert 'is a directory' in result.stderr


def test_missing_module(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke('run', '-A', '-m', 'kopf_test_absent_module')
    assert result.exit_code == 1
    assert result.stderr == "Error: Cannot import the module 'kopf_test_absent_module': " \
                            "No module named 'kopf_test_absent_module'.\n"
    assert isinstance(result.exception, SystemExit)


def test_file_given_as_module_gets_a_hint(write_source: Callable[..., pathlib.Path],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_source('hinted_operator.py', 'x = 1\n')
    monkeypatch.chdir(path.parent)
    result = invoke('run', '-A', '-m', 'hinted_operator.py')
    assert result.exit_code == 1
    assert 'to load a file, pass it without -m: kopf run hinted_operator.py' in result.stderr


@pytest.mark.parametrize('how', ['file', 'module'])
def test_failing_source_shows_only_the_users_traceback(
        how: str, write_source: Callable[..., pathlib.Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_source('failing_helper_for_cli.py', '''
        def explode():
            raise ValueError('the operator is broken')
    ''')
    path = write_source('failing_operator_for_cli.py', '''
        import failing_helper_for_cli
        failing_helper_for_cli.explode()
    ''')
    monkeypatch.chdir(path.parent)
    args = ['-m', 'failing_operator_for_cli'] if how == 'module' else [str(path)]
    result = invoke('run', '-A', *args)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith('Error: Cannot ')
    assert lines[1] == 'Traceback (most recent call last):'
    assert lines[-1] == 'ValueError: the operator is broken'
    assert 'failing_operator_for_cli.py", line 3, in <module>' in result.stderr
    assert 'failing_helper_for_cli.py", line 3, in explode' in result.stderr
    assert 'importlib' not in result.stderr
    assert 'kopf/_cli' not in result.stderr
    assert 'click' not in result.stderr


def test_syntax_error_shows_the_location(write_source: Callable[..., pathlib.Path]) -> None:
    path = write_source('broken_syntax.py', 'def fn(:\n    pass\n')
    result = invoke('run', '-A', str(path))
    assert result.exit_code == 1
    assert 'Traceback' not in result.stderr
    assert f'File "{path}", line 1' in result.stderr
    assert 'SyntaxError' in result.stderr


def test_misused_decorator_shows_the_users_line(write_source: Callable[..., pathlib.Path]) -> None:
    path = write_source('misused_decorator.py', '''
        import kopf

        @kopf.on.event('configmaps', no_such_kwarg=1)
        def fn(**_):
            pass
    ''')
    result = invoke('run', '-A', str(path))
    assert result.exit_code == 1
    assert f'File "{path}", line 4, in <module>' in result.stderr
    assert "unexpected keyword argument 'no_such_kwarg'" in result.stderr
    assert 'kopf/on.py' not in result.stderr


def test_debug_shows_the_full_traceback(write_source: Callable[..., pathlib.Path]) -> None:
    path = write_source('failing_in_debug.py', 'raise ValueError("boom")\n')
    result = invoke('run', '-A', '--debug', str(path))
    assert result.exit_code == 1
    assert isinstance(result.exception, ValueError)  # propagated as is: Python shows the traceback


@pytest.mark.parametrize('args', [
    ['-A', '-n', 'default'],
    ['--all-namespaces', '--namespace', 'default', '--namespace', 'kube-system'],
])
def test_all_namespaces_with_namespaces_is_a_usage_error(args: list[str]) -> None:
    result = invoke('run', *args)
    assert result.exit_code == 2
    assert 'Error: --namespace and --all-namespaces exclude each other' in result.stderr


def test_lease_with_shards_is_a_usage_error() -> None:
    result = invoke('run', '-A', '--lease', 'op', '--shards', 'op')
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        'Error: --lease and --shards exclude each other: the sharding replaces the single leader '
        'of the election; use only one of them.')


def test_conflict_via_environment_variables_is_a_usage_error() -> None:
    result = invoke('run', '-A', env={'KOPF_RUN_NAMESPACE': 'default'})
    assert result.exit_code == 2
    assert '--namespace and --all-namespaces exclude each other' in result.stderr


@pytest.mark.parametrize('args, message', [
    (['--log-format', 'xml'], "Invalid value for '--log-format'"),
    (['--priority', 'high'], "Invalid value for '-p' / '--priority'"),
    (['--liveness', 'https://0.0.0.0:8080/healthz'],
     "Invalid value for '-L' / '--liveness': 'https://0.0.0.0:8080/healthz': "
     "https:// is not supported (only http:// is supported). "
     "Expected: http://HOST:PORT/PATH, e.g. http://0.0.0.0:8080/healthz."),
    (['--liveness', '8080'], "'8080': the scheme is missing (only http:// is supported). Expected: http://"),
    (['--liveness', 'http://0.0.0.0/healthz'], "'http://0.0.0.0/healthz': the port is missing. Expected: http://"),
    (['--liveness', 'http://0.0.0.0:http/'], "'http://0.0.0.0:http/': the port is invalid"),
    (['-L', 'http://:8080/'], "'http://:8080/': the host is missing"),
    (['--no-such-option'], 'No such option'),
    (['--shards', 'a/b/c'], "Invalid value for '--shards': 'a/b/c': expected NAME or NAMESPACE/NAME "
                            "of the sharding's Leases."),
])
def test_invalid_options_are_usage_errors(args: list[str], message: str) -> None:
    result = invoke('run', '-A', *args)
    assert result.exit_code == 2
    assert message in result.stderr


@pytest.mark.parametrize('args', [
    ['freeze', '--peering', 'example', '--priority', '100', '--lifetime', '60', '-A'],
    ['freeze', '-P', 'example', '-p', '100', '-t', '60', '-m', 'why', '-i', 'me', '-n', 'ns1', '--dev'],
    ['resume', '--peering', 'example', '-n', 'ns1'],
    ['resume', '-P', 'example', '-A', '-i', 'me'],
])
def test_freeze_and_resume_of_a_peering_without_its_crds_say_to_install_them(
        args: list[str], k8s_emulator: KubernetesEmulator) -> None:
    result = invoke(*args, env={'KUBECONFIG': str(k8s_emulator.kubeconfig_path)})
    assert result.exit_code == 1
    assert "Error: The mandatory peering 'example' cannot be used: the cluster does not serve " \
        in result.stderr
    assert 'install the peering CRDs' in result.stderr
    assert 'Traceback' not in result.output


@pytest.mark.parametrize('args, missing', [
    (['freeze', '-p', '100', '-t', '60'], "Missing option '-P' / '--peering'"),
    (['freeze', '-P', 'example', '-p', '100'], "Missing option '-t' / '--lifetime'"),
    (['resume'], "Missing option '-P' / '--peering'"),
])
def test_freeze_and_resume_require_their_options(args: list[str], missing: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert missing in result.stderr


def test_no_handlers_is_warned_about_but_runs(write_source: Callable[..., pathlib.Path],
                                              registry: OperatorRegistry) -> None:
    path = write_source('no_handlers.py', 'x = 1\n')
    with KopfRunner(['run', '-A', '--standalone', str(path)], registry=registry, emulator=True) as runner:
        pass
    assert runner.exit_code == 0
    assert 'No handlers are registered by the given files and modules' in runner.output


def test_no_credentials_is_one_clear_error(no_cluster: None, registry: OperatorRegistry) -> None:
    with KopfRunner(['run', '-A', '--standalone'], registry=registry, reraise=False) as runner:
        pass
    assert runner.exit_code == 1
    assert type(runner.exception).__name__ == 'LoginError'
    error_lines = [line for line in runner.stderr.splitlines() if line.startswith('Error:')]
    assert error_lines == [f'Error: Cannot log in to the Kubernetes cluster: {runner.exception}']
    assert runner.stderr.splitlines()[-1] == error_lines[0]


def test_unreachable_cluster_is_one_clear_error(unreachable_cluster: None,
                                                registry: OperatorRegistry) -> None:
    import kopf

    @kopf.on.startup(registry=registry)
    def no_retries(settings: kopf.OperatorSettings, **_: object) -> None:
        settings.networking.error_backoffs = ()  # fail at once instead of retrying for a minute

    with KopfRunner(['run', '-A', '--standalone'], registry=registry, reraise=False) as runner:
        pass
    assert runner.exit_code == 1
    assert runner.exception is not None
    assert runner.stderr.splitlines()[-1].startswith('Error: Cannot reach the Kubernetes API: ')
    assert sum(line.startswith('Error:') for line in runner.stderr.splitlines()) == 1


def test_a_failing_operator_is_reported_without_a_traceback(k8s_emulator: KubernetesEmulator,
                                                            registry: OperatorRegistry) -> None:
    import kopf

    @kopf.on.startup(registry=registry, errors=kopf.ErrorsMode.PERMANENT)
    def broken_startup(**_: object) -> None:
        raise kopf.PermanentError('cannot start')

    with KopfRunner(['run', '-A', '--standalone'], registry=registry, reraise=False) as runner:
        pass
    assert runner.exit_code == 1
    last_line = runner.stderr.splitlines()[-1]
    assert last_line.startswith(f'Error: The operator has failed: {type(runner.exception).__name__}: ')
    assert last_line.endswith('(Run with --debug to see the traceback.)')
