"""
``python -m kopf.testing.apiserver``: serves until SIGINT/SIGTERM, then stops cleanly (with fake binaries).
"""
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest
import yaml

TIMEOUT = 30


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_serves_until_a_signal(make_assets: Callable[..., pathlib.Path], tmp_path: pathlib.Path,
                               fake_pids: Callable[[], dict[str, int]], is_alive: Callable[[int], bool],
                               signum: signal.Signals) -> None:
    kubeconfig_path = tmp_path / 'kubeconfig'
    process = subprocess.Popen(
        [sys.executable, '-m', 'kopf.testing.apiserver', '--assets', str(make_assets()),
         '--kubeconfig', str(kubeconfig_path), '--feature-gates', 'ShardedListAndWatch=true'],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stderr is not None
        first_line = process.stderr.readline()
        second_line = process.stderr.readline()
        assert first_line.startswith('The Kubernetes control plane (v1.99.0-fake) serves at https://127.0.0.1:')
        assert first_line.endswith(f' s; kubeconfig: {kubeconfig_path}\n')
        assert second_line == f'Use it: export KUBECONFIG={kubeconfig_path}  (Ctrl+C to stop)\n'
        server = yaml.safe_load(kubeconfig_path.read_text())['clusters'][0]['cluster']['server']
        assert f'serves at {server},' in first_line
        pids = fake_pids()
        assert all(is_alive(pid) for pid in pids.values())

        process.send_signal(signum)
        _, stderr = process.communicate(timeout=TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert stderr == 'The Kubernetes control plane is stopped.\n'
    assert not any(is_alive(pid) for pid in pids.values())


def test_fails_with_one_line_when_no_binaries(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [sys.executable, '-m', 'kopf.testing.apiserver', '--assets', str(tmp_path / 'nowhere')],
        capture_output=True, text=True, timeout=TIMEOUT, env=dict(os.environ, KUBEBUILDER_ASSETS=''),
    )
    assert result.returncode == 1
    assert result.stderr == (
        f'Error: No etcd and no kube-apiserver (executable) in the directory {tmp_path}/nowhere: '
        f'it must be a directory with etcd, kube-apiserver, kubectl (KUBEBUILDER_ASSETS layout); '
        f'build them with tools/kube-assets/build.sh.\n'
    )


def test_exits_when_the_apiserver_dies(make_assets: Callable[..., pathlib.Path],
                                       fake_pids: Callable[[], dict[str, int]],
                                       is_alive: Callable[[int], bool]) -> None:
    process = subprocess.Popen(
        [sys.executable, '-m', 'kopf.testing.apiserver', '--assets', str(make_assets())],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stderr is not None
        assert 'serves at' in process.stderr.readline()
        os.kill(fake_pids()['kube-apiserver'], signal.SIGKILL)
        _, stderr = process.communicate(timeout=TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1
    assert 'Error: kube-apiserver exited unexpectedly with signal 9; its last lines (' in stderr
    assert not is_alive(fake_pids()['etcd'])


def test_bad_feature_gates() -> None:
    result = subprocess.run(
        [sys.executable, '-m', 'kopf.testing.apiserver', '--feature-gates', 'Foo=maybe'],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 1
    assert result.stderr == "Error: a feature gate must be NAME=true or NAME=false, not 'Foo=maybe'.\n"
