"""
The short profile of the chaos soak (``tools/soak``) on a real control plane (etcd & kube-apiserver):
about a minute of churn, kube-apiserver restarts, operator kills & restarts, with a fixed seed.

The soak starts a control plane of its own (it restarts its kube-apiserver, which the session's shared
one must not suffer), from the binaries that the session finds (``$KUBEBUILDER_ASSETS`` or the build
cache: the test is skipped without them, or fails if they are required). What cannot be done on a real
server (the emulator's injected faults, the namespace churn without a namespace controller) is left out
there and printed as such; every other invariant must hold. See ``tools/soak/README.md``.
"""
import pathlib
import subprocess
import sys

import pytest

from kopf.testing.apiserver import KubeAssets

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = 16

pytestmark = [pytest.mark.soak, pytest.mark.real_apiserver]


@pytest.mark.timeout(300)
def test_short_soak_on_a_real_control_plane_keeps_all_invariants(
        k8s_control_plane_assets: KubeAssets, tmp_path: pathlib.Path) -> None:
    args = [sys.executable, '-m', 'tools.soak', '--profile', 'short', '--seed', str(SEED),
            '--api', 'control-plane', '--workdir', str(tmp_path)]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=270)
    output = result.stdout + result.stderr
    assert 'api=control-plane' in output, output
    assert 'Invariants (seed 16):' in output, output
    assert result.returncode == 0, output
    assert '  N/A  deleted namespaces fully gone: not applicable on control-plane' in output, output
