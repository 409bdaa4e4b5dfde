"""Starting and stopping the emulator: in a loop, in a thread, from the command line, as a fixture."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request

import aiohttp
import pytest
import yaml

from kopf.testing import KubernetesEmulator


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


async def test_async_context_manager_listens_and_writes_kubeconfig() -> None:
    async with KubernetesEmulator() as emulator:
        assert emulator.port > 0
        assert emulator.url == f'http://127.0.0.1:{emulator.port}'
        config = yaml.safe_load(emulator.kubeconfig_path.read_text())
        assert config['clusters'][0]['cluster']['server'] == emulator.url
        assert config['current-context'] == config['contexts'][0]['name']
        async with aiohttp.ClientSession() as session, session.get(f'{emulator.url}/version') as response:
            assert response.status == 200
            assert (await response.json())['major'] == '1'
        temporary_kubeconfig = emulator.kubeconfig_path
    assert not temporary_kubeconfig.exists()  # a temporary kubeconfig is removed on exit


async def test_stopped_emulator_refuses_connections() -> None:
    async with KubernetesEmulator() as emulator:
        url = emulator.url
    async with aiohttp.ClientSession() as session:
        try:
            async with session.get(f'{url}/version') as response:
                status = response.status
        except aiohttp.ClientConnectionError:
            status = None
    assert status is None


async def test_restart_keeps_the_port_the_kubeconfig_the_objects_and_the_history() -> None:
    async with KubernetesEmulator() as emulator, aiohttp.ClientSession() as session:
        port, kubeconfig = emulator.port, emulator.kubeconfig_path
        body = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'kept'}, 'data': {'a': '1'}}
        collection_url = f'{emulator.url}/api/v1/namespaces/default/configmaps'
        async with session.post(collection_url, json=body) as response:
            created = await response.json()
        watch_url = f'{emulator.url}/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0'
        async with session.get(watch_url) as watch:
            first = json.loads(await watch.content.readline())
            await emulator.restart(downtime=0.1)
            try:  # the stream breaks, as with a real server's restart: cleanly or mid-stream
                assert await watch.content.readline() == b''
            except aiohttp.ClientPayloadError:
                pass
        assert first['object']['metadata']['name'] == 'kept'
        assert emulator.port == port
        assert emulator.kubeconfig_path == kubeconfig and kubeconfig.exists()
        async with session.get(f'{emulator.url}/api/v1/namespaces/default/configmaps/kept') as response:
            assert response.status == 200
            kept = await response.json()
        assert kept['metadata']['resourceVersion'] == created['metadata']['resourceVersion']
        # A watch from the last known version continues with no 410 Gone: the history is kept too.
        since = created['metadata']['resourceVersion']
        async with session.post(f'{emulator.url}/api/v1/namespaces/default/configmaps',
                                json={**body, 'metadata': {'name': 'new'}}):
            pass
        watch_url = f'{emulator.url}/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={since}'
        async with session.get(watch_url) as watch:
            event = json.loads(await watch.content.readline())
        assert (event['type'], event['object']['metadata']['name']) == ('ADDED', 'new')


async def test_restart_of_a_stopped_emulator_is_refused() -> None:
    with pytest.raises(RuntimeError, match='The emulator is not started, so it cannot be restarted'):
        await KubernetesEmulator().restart()


def test_sync_context_manager_serves_from_a_thread(tmp_path: pathlib.Path) -> None:
    kubeconfig = tmp_path / 'config'
    with KubernetesEmulator(kubeconfig_path=kubeconfig) as emulator:
        assert emulator.kubeconfig_path == kubeconfig
        assert kubeconfig.exists()
        namespaces = _get_json(f'{emulator.url}/api/v1/namespaces')
        assert isinstance(namespaces, dict)
        assert {item['metadata']['name'] for item in namespaces['items']} == {'default', 'kube-system'}
        # Inspection and faults are usable from this (foreign) thread.
        assert emulator.get_object('namespaces', 'default') is not None
        assert emulator.drop_watches() == 0
    assert kubeconfig.exists()  # a kubeconfig at a given path is kept


def test_thread_start_failure_is_reported_to_the_caller() -> None:
    with KubernetesEmulator() as first:
        second = KubernetesEmulator(port=first.port)
        try:
            second.start_in_thread()
        except OSError:
            pass
        else:  # pragma: no cover
            second.stop_thread()
            raise AssertionError('Two emulators listened on the same port.')


def test_command_line_serves_until_sigterm(tmp_path: pathlib.Path) -> None:
    kubeconfig = tmp_path / 'kubeconfig'
    process = subprocess.Popen(
        [sys.executable, '-m', 'kopf.testing.emulator', '--port', '0', '--kubeconfig', str(kubeconfig)],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not kubeconfig.exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else ''
            assert time.monotonic() < deadline, 'the kubeconfig was not written in time'
            time.sleep(0.05)
        server = yaml.safe_load(kubeconfig.read_text())['clusters'][0]['cluster']['server']
        assert not server.endswith(':0')
        assert isinstance(_get_json(f'{server}/api/v1/namespaces/default'), dict)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_pytest_fixture_sets_kubeconfig(k8s_emulator: KubernetesEmulator) -> None:
    assert os.environ['KUBECONFIG'] == str(k8s_emulator.kubeconfig_path)
    version = _get_json(f'{k8s_emulator.url}/version')
    assert isinstance(version, dict) and version['gitVersion'].startswith('v1.')
    assert k8s_emulator.requests.count('discovery') == 1


async def test_pytest_fixture_works_in_async_tests(k8s_emulator: KubernetesEmulator) -> None:
    url = f'{k8s_emulator.url}/api/v1/namespaces/default/configmaps'
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
    assert k8s_emulator.requests.count('list', 'configmaps') == 1
