"""
Every option of ``kopf run`` reaches the operator: observed by the effects, not by mocks.

The logging options by the format & content of the logs; the scope options by the API requests
that the emulator receives; the peering options by the settings that the startup handlers see.
"""
import json
import pathlib
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

import kopf
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import KopfRunner, KubernetesEmulator

WAIT = 10.0


@pytest.fixture()
def peering_seen(registry: OperatorRegistry) -> dict[str, Any]:
    """What the startup handler sees in the settings (the options are applied before the startup)."""
    seen: dict[str, Any] = {}

    @kopf.on.startup(registry=registry)
    def remember_peering(settings: kopf.OperatorSettings, **_: Any) -> None:
        seen.update(
            standalone=settings.peering.standalone,
            priority=settings.peering.priority,
            name=settings.peering.name,
            mandatory=settings.peering.mandatory,
            clusterwide=settings.peering.clusterwide,
        )

    return seen


@pytest.fixture()
def seen_configmap(
        registry: OperatorRegistry,
        k8s_emulator: KubernetesEmulator,
        create_configmap: Callable[..., None],
) -> threading.Event:
    """An object in the emulator and an event handler for it that logs a message about it."""
    create_configmap(k8s_emulator, 'cm1')
    seen = threading.Event()

    @kopf.on.event('configmaps', registry=registry)
    def log_about_configmap(logger: kopf.Logger, **_: Any) -> None:
        logger.info('The configmap is seen.')
        seen.set()

    return seen


@pytest.fixture()
def levels_logged(registry: OperatorRegistry) -> None:
    @kopf.on.startup(registry=registry)
    def log_at_all_levels(logger: kopf.Logger, **_: Any) -> None:
        logger.debug('DEBUG-MARK')
        logger.info('INFO-MARK')
        logger.warning('WARNING-MARK')


#
# Logging.
#

def test_log_format_full_is_the_default(k8s_emulator: KubernetesEmulator, registry: OperatorRegistry,
                                        seen_configmap: threading.Event) -> None:
    with KopfRunner(['run', '-n', 'default', '--standalone'], registry=registry) as runner:
        assert seen_configmap.wait(WAIT)
    pattern = r'^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] kopf\.objects +\[INFO    \] ' \
              r'\[default/cm1\] The configmap is seen\.$'
    assert re.search(pattern, runner.output, re.MULTILINE)


@pytest.mark.parametrize('args, expected_line', [
    (['--log-format=plain'], '[default/cm1] The configmap is seen.'),
    (['--log-format=plain', '--log-prefix'], '[default/cm1] The configmap is seen.'),
    (['--log-format=plain', '--no-log-prefix'], 'The configmap is seen.'),
    (['--log-format', 'full', '--no-log-prefix'], 'kopf.objects         [INFO    ] The configmap is seen.'),
])
def test_text_formats_and_prefixes(
        args: list[str], expected_line: str,
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry, seen_configmap: threading.Event,
) -> None:
    with KopfRunner(['run', '-n', 'default', '--standalone', *args], registry=registry) as runner:
        assert seen_configmap.wait(WAIT)
    lines = [line for line in runner.output.splitlines() if 'The configmap is seen.' in line]
    assert len(lines) == 1
    assert lines[0].endswith(expected_line)
    if 'plain' in args[0]:
        assert lines[0] == expected_line


@pytest.mark.parametrize('args, refkey, message', [
    (['--log-format=json'], 'object', 'The configmap is seen.'),
    (['--log-format=json', '--log-refkey=k8s-obj'], 'k8s-obj', 'The configmap is seen.'),
    (['--log-format=json', '--log-prefix'], 'object', '[default/cm1] The configmap is seen.'),
])
def test_json_format_refkey_and_prefix(
        args: list[str], refkey: str, message: str,
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry, seen_configmap: threading.Event,
) -> None:
    with KopfRunner(['run', '-n', 'default', '--standalone', *args], registry=registry) as runner:
        assert seen_configmap.wait(WAIT)
    records = [json.loads(line) for line in runner.stderr.splitlines() if line.startswith('{')]
    assert records and all('severity' in record for record in records)
    [record] = [record for record in records if 'configmap is seen' in record['message']]
    assert record['message'] == message
    assert record[refkey]['name'] == 'cm1'
    assert record[refkey]['namespace'] == 'default'


@pytest.mark.parametrize('args, shown, hidden', [
    ([], ['INFO-MARK', 'WARNING-MARK'], ['DEBUG-MARK']),
    (['--verbose'], ['DEBUG-MARK', 'INFO-MARK', 'WARNING-MARK'], []),
    (['-v'], ['DEBUG-MARK', 'INFO-MARK', 'WARNING-MARK'], []),
    (['--debug'], ['DEBUG-MARK', 'INFO-MARK', 'WARNING-MARK'], []),
    (['-d'], ['DEBUG-MARK', 'INFO-MARK', 'WARNING-MARK'], []),
    (['--quiet'], ['WARNING-MARK'], ['DEBUG-MARK', 'INFO-MARK']),
    (['-q'], ['WARNING-MARK'], ['DEBUG-MARK', 'INFO-MARK']),
])
def test_verbosity(args: list[str], shown: list[str], hidden: list[str],
                   k8s_emulator: KubernetesEmulator, registry: OperatorRegistry, levels_logged: None) -> None:
    with KopfRunner(['run', '-A', '--standalone', '--log-format=plain', *args], registry=registry) as runner:
        pass
    lines = runner.output.splitlines()
    for mark in shown:
        assert mark in lines
    for mark in hidden:
        assert mark not in lines


def test_verbose_shows_the_frameworks_own_debug_logs(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry, levels_logged: None) -> None:
    with KopfRunner(['run', '-A', '--standalone', '--log-format=plain'], registry=registry) as quiet:
        pass
    with KopfRunner(['run', '-A', '--standalone', '--log-format=plain', '-v'], registry=registry) as verbose:
        pass
    assert "Activity 'log_at_all_levels' is invoked." not in quiet.output.splitlines()
    assert "Activity 'log_at_all_levels' is invoked." in verbose.output.splitlines()


#
# Scopes: which namespaces are watched, as the emulator sees the requests.
#

def _watched_namespaces(emulator: KubernetesEmulator) -> set[str]:
    return {key.namespace for key in emulator.requests.snapshot()
            if key.verb == 'watch' and key.resource == 'configmaps'}


@pytest.mark.parametrize('args, namespaces', [
    (['-A'], {''}),
    (['--all-namespaces'], {''}),
    (['-n', 'default'], {'default'}),
    (['--namespace', 'kube-system'], {'kube-system'}),
    (['-n', 'default', '-n', 'kube-system'], {'default', 'kube-system'}),
    (['-n', 'kube-*'], {'kube-system'}),
    (['-n', '!kube-*'], {'default'}),
    (['-n', '*,!kube-*'], {'default'}),
    (['-n', 'kube-*', '-n', 'default'], {'default', 'kube-system'}),
])
def test_namespaces(args: list[str], namespaces: set[str], wait_for: Callable[..., Any],
                    k8s_emulator: KubernetesEmulator, registry: OperatorRegistry,
                    seen_configmap: threading.Event) -> None:
    with KopfRunner(['run', '--standalone', *args], registry=registry):
        wait_for(lambda: _watched_namespaces(k8s_emulator) == namespaces)


def test_namespace_via_environment_variable(
        wait_for: Callable[..., Any], k8s_emulator: KubernetesEmulator,
        registry: OperatorRegistry, seen_configmap: threading.Event,
) -> None:
    with KopfRunner(['run', '--standalone'], registry=registry, env={'KOPF_RUN_NAMESPACE': 'kube-system'}):
        wait_for(lambda: _watched_namespaces(k8s_emulator) == {'kube-system'})


def test_no_scope_serves_the_cluster_with_a_warning(
        wait_for: Callable[..., Any], k8s_emulator: KubernetesEmulator,
        registry: OperatorRegistry, seen_configmap: threading.Event,
) -> None:
    with pytest.warns(FutureWarning), KopfRunner(['run', '--standalone'], registry=registry):
        wait_for(lambda: _watched_namespaces(k8s_emulator) == {''})


#
# Peering & priorities: as the startup handlers see them in the settings.
#

@pytest.mark.parametrize('args, expected', [
    ([], {'standalone': False, 'priority': 0, 'name': 'default', 'mandatory': False, 'clusterwide': True}),
    (['--standalone'], {'standalone': True, 'priority': 0, 'name': 'default', 'mandatory': False}),
    (['--priority', '100'], {'standalone': False, 'priority': 100}),
    (['-p', '-5'], {'priority': -5}),
    (['--dev'], {'standalone': False, 'priority': 666}),
    (['--dev', '-p', '5'], {'priority': 666}),
    (['-P', 'example', '--standalone'], {'name': 'example', 'mandatory': True, 'standalone': True}),
])
def test_peering_options(args: list[str], expected: dict[str, Any], k8s_emulator: KubernetesEmulator,
                         registry: OperatorRegistry, peering_seen: dict[str, Any]) -> None:
    with KopfRunner(['run', '-A', *args], registry=registry):
        pass
    assert {key: peering_seen[key] for key in expected} == expected


def test_mandatory_peering_that_cannot_be_used_exits_with_what_to_do(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry, peering_seen: dict[str, Any]) -> None:
    with KopfRunner(['run', '-A', '--peering', 'example'], registry=registry, reraise=False) as runner:
        pass
    assert runner.exit_code == 1
    assert {key: peering_seen[key] for key in ['name', 'mandatory', 'standalone']} == \
        {'name': 'example', 'mandatory': True, 'standalone': False}
    assert "The mandatory peering 'example' cannot be used" in runner.output
    assert '--standalone' in runner.output


def test_lease_option_goes_to_the_election_settings(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry) -> None:
    seen: dict[str, Any] = {}

    @kopf.on.startup(registry=registry)
    def remember(settings: kopf.OperatorSettings, **_: Any) -> None:
        seen.update(name=settings.election.lease_name, namespace=settings.election.lease_namespace)

    with KopfRunner(['run', '-A', '--standalone', '--lease', 'default/my-op'], registry=registry) as runner:
        pass
    assert runner.exit_code == 0, runner.output
    assert seen == {'name': 'my-op', 'namespace': 'default'}


def test_shards_option_goes_to_the_sharding_settings(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry) -> None:
    seen: dict[str, Any] = {}

    @kopf.on.startup(registry=registry)
    def remember(settings: kopf.OperatorSettings, **_: Any) -> None:
        seen.update(name=settings.sharding.name, namespace=settings.sharding.namespace)

    with KopfRunner(['run', '-A', '--standalone', '--shards', 'default/my-op'], registry=registry) as runner:
        pass
    assert runner.exit_code == 0, runner.output
    assert seen == {'name': 'my-op', 'namespace': 'default'}


def test_the_sharding_and_the_election_set_at_startup_fail_the_operator_with_one_line(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry) -> None:
    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.election.lease_name = 'my-op'

    with KopfRunner(['run', '-A', '--standalone', '--shards', 'my-op'], registry=registry,
                    reraise=False) as runner:
        pass
    assert runner.exit_code == 1
    assert ('The sharding and the leader election exclude each other: set either settings.sharding.name '
            '(--shards) or settings.election.lease_name (--lease), not both.') in runner.output
    assert 'Traceback' not in runner.output


def test_namespaced_peering_scope(k8s_emulator: KubernetesEmulator,
                                  registry: OperatorRegistry, peering_seen: dict[str, Any]) -> None:
    with KopfRunner(['run', '-n', 'default', '--standalone'], registry=registry):
        pass
    assert peering_seen['clusterwide'] is False


def test_peering_options_do_not_override_the_given_settings(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry, peering_seen: dict[str, Any]) -> None:
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.peering.priority = 123
    with KopfRunner(['run', '-A'], registry=registry, settings=settings):
        pass
    assert peering_seen['standalone'] is True
    assert peering_seen['priority'] == 123


#
# Probing.
#

def test_liveness_endpoint_is_served(k8s_emulator: KubernetesEmulator, registry: OperatorRegistry,
                                     write_source: Callable[..., pathlib.Path]) -> None:
    path = write_source('probed_operator.py', """
        import kopf

        @kopf.on.startup()
        def remember(memo, **_):
            memo.answer = 42

        @kopf.on.probe(id='answer')
        def report_the_answer(memo, **_):
            return memo.answer

        @kopf.on.probe(id='broken', errors=kopf.ErrorsMode.IGNORED)
        async def report_nothing(**_):
            raise ValueError('ignored')
    """)
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    url = f'http://127.0.0.1:{port}/healthz'
    args = ['run', '-A', '--standalone', f'--liveness={url}', str(path)]
    with KopfRunner(args, registry=registry) as runner:
        with urllib.request.urlopen(url, timeout=WAIT) as response:
            assert response.status == 200
            assert json.loads(response.read()) == {'answer': 42, 'broken': None}
        with pytest.raises(urllib.error.HTTPError) as excinfo:
            urllib.request.urlopen(f'http://127.0.0.1:{port}/other', timeout=WAIT)
        assert excinfo.value.code == 404
        excinfo.value.close()
    assert runner.exit_code == 0
    assert f'Serving the liveness endpoint at {url}' in runner.output
    with pytest.raises(urllib.error.URLError):  # the port is released when the operator exits
        urllib.request.urlopen(url, timeout=WAIT)


def test_help_says_what_the_environment_can_set_and_what_is_not_implemented() -> None:
    import click.testing

    from kopf._cli.commands import main
    result = click.testing.CliRunner().invoke(main, ['run', '--help'], terminal_width=200)
    assert result.exit_code == 0
    text = ' '.join(result.output.split())  # the wrapping does not matter
    assert 'environment variable named KOPF_RUN_ and the option\'s long name in capitals' in text
    assert 'KOPF_RUN_NAMESPACE=default' in text
    for option in ['--dev', '--peering NAME', '--priority INTEGER', '--lease [NAMESPACE/]NAME',
                   '--shards [NAMESPACE/]NAME', '--liveness']:
        line = text[text.index(option):][:150]
        assert 'not implemented' not in line.lower(), option


def test_options_come_from_the_environment(k8s_emulator: KubernetesEmulator, registry: OperatorRegistry,
                                           tmp_path: pathlib.Path) -> None:
    # The documented KOPF_RUN_... variables are click's automatic ones: e.g. the scope and the verbosity.
    source = tmp_path / 'op.py'
    source.write_text('import kopf\n\n@kopf.on.startup()\ndef fn(**_):\n    pass\n')
    env = {'KOPF_RUN_ALL_NAMESPACES': '1', 'KOPF_RUN_VERBOSE': '1'}
    with KopfRunner(['run', str(source)], registry=registry, emulator=k8s_emulator, env=env) as runner:
        pass
    assert runner.exit_code == 0, runner.output
    assert "Activity 'fn' is invoked." in runner.output  # a debug message: the verbose mode is on
