"""
The pytest plugin of kopf-testing: fixtures for operator tests (registered via an entry point).

``k8s_emulator``: a running :class:`kopf.testing.KubernetesEmulator` (served in its own thread,
so it works for sync and async tests alike, with any event loop scope), with ``KUBECONFIG``
pointing to it for the duration of the test. Any Kubernetes client that reads ``KUBECONFIG``,
Kopf included, talks to the emulator without further configuration.

``k8s_control_plane``: a real :class:`kopf.testing.KubernetesControlPlane` (etcd + kube-apiserver),
one per test session (it takes seconds to start), shared by the tests that use it: each test
should make its own namespaces and objects. ``k8s_control_plane_kubeconfig`` also points
``KUBECONFIG`` to it for the duration of a test. When the binaries are not found
(``$KUBEBUILDER_ASSETS``, or the build cache of ``tools/kube-assets/build.sh``), the tests that use
them are skipped with the reason, or fail if ``KOPF_TESTING_REQUIRE_CONTROL_PLANE=1`` (for CI).
``k8s_control_plane_assets`` gives the binaries (or skips likewise) to the tests that start
control planes of their own, e.g. with other flags.

This module is imported by pytest in every test session: it imports nothing heavy at the top.
"""

import os
import pathlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kopf.testing.apiserver import KubeAssets, KubernetesControlPlane
    from kopf.testing.emulator import KubernetesEmulator

REQUIRE_CONTROL_PLANE_ENV_VAR = 'KOPF_TESTING_REQUIRE_CONTROL_PLANE'


@pytest.fixture
def k8s_emulator(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator['KubernetesEmulator']:
    """A running Kubernetes API emulator with ``KUBECONFIG`` set to its kubeconfig file."""
    from kopf.testing.emulator import KubernetesEmulator

    kubeconfig_path = tmp_path_factory.mktemp('k8s-emulator') / 'kubeconfig'
    with KubernetesEmulator(kubeconfig_path=kubeconfig_path) as emulator:
        monkeypatch.setenv('KUBECONFIG', str(emulator.kubeconfig_path))
        yield emulator


@pytest.fixture(scope='session')
def k8s_control_plane_assets() -> 'KubeAssets':
    """The binaries of the control plane; the test is skipped if there are none (or fails if required)."""
    from kopf.testing.apiserver import BinariesNotFoundError, find_assets

    try:
        return find_assets()
    except BinariesNotFoundError as e:
        if os.environ.get(REQUIRE_CONTROL_PLANE_ENV_VAR, '').lower() not in ('', '0', 'false', 'no'):
            pytest.fail(f'{e} ({REQUIRE_CONTROL_PLANE_ENV_VAR} is set)', pytrace=False)
        pytest.skip(str(e))


@pytest.fixture(scope='session')
def k8s_control_plane(k8s_control_plane_assets: 'KubeAssets') -> Iterator['KubernetesControlPlane']:
    """A real Kubernetes control plane for the session; the admin's kubeconfig is ``.kubeconfig_path``."""
    from kopf.testing.apiserver import KubernetesControlPlane

    assets = k8s_control_plane_assets
    with KubernetesControlPlane(
        etcd_path=assets.etcd, kube_apiserver_path=assets.kube_apiserver, kubectl_path=assets.kubectl,
    ) as control_plane:
        yield control_plane


@pytest.fixture
def k8s_control_plane_kubeconfig(
        k8s_control_plane: 'KubernetesControlPlane',
        monkeypatch: pytest.MonkeyPatch,
) -> pathlib.Path:
    """The session's control plane's kubeconfig, with ``KUBECONFIG`` pointing to it during the test."""
    monkeypatch.setenv('KUBECONFIG', str(k8s_control_plane.kubeconfig_path))
    return k8s_control_plane.kubeconfig_path
