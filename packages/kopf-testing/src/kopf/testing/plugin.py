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
control planes of their own, e.g. with other flags. ``k8s_emulator_options`` and ``k8s_control_plane_options``
(session-scoped) give more keyword arguments to both servers (e.g. ``feature_gates``): override them in a
``conftest.py``.

``k8s_api``: one switch for the tests that only need *an* API server (they talk to it via ``KUBECONFIG``):
the emulator (the default), the real control plane, or an existing cluster of the ``KUBECONFIG`` of
the session (e.g. kind or k3d), chosen by ``pytest --kube-api=emulator|control-plane|kubeconfig`` or by
``$KOPF_TESTING_API``. It gives a :class:`KubeAPI` (the choice, the kubeconfig, the server object).

This module is imported by pytest in every test session: it imports nothing heavy at the top.
"""

import dataclasses
import os
import pathlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from kopf.testing import _kubeconfigs

if TYPE_CHECKING:
    from kopf.testing.apiserver import KubeAssets, KubernetesControlPlane
    from kopf.testing.emulator import KubernetesEmulator

REQUIRE_CONTROL_PLANE_ENV_VAR = 'KOPF_TESTING_REQUIRE_CONTROL_PLANE'
API_ENV_VAR = 'KOPF_TESTING_API'
API_CHOICES = ('emulator', 'control-plane', 'kubeconfig')


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        '--kube-api', choices=API_CHOICES, default=None,
        help=f'The API server of the k8s_api fixture: the emulator (default), a real control plane '
             f'(etcd + kube-apiserver from $KUBEBUILDER_ASSETS), or the cluster of $KUBECONFIG '
             f'(also: ${API_ENV_VAR}).')


@dataclasses.dataclass(frozen=True)
class KubeAPI:
    """The API server of a test: which kind, its kubeconfig, and the server object (none for a cluster)."""

    kind: str  # one of API_CHOICES
    kubeconfig_path: pathlib.Path
    server: Any  # KubernetesEmulator, KubernetesControlPlane, or None for an existing cluster

    @property
    def is_real(self) -> bool:
        """Whether it is a real Kubernetes (the control plane or a cluster), not the emulator."""
        return self.kind != 'emulator'

    @property
    def collects_garbage(self) -> bool:
        """Whether dependents go with their owners: not on the control plane (no kube-controller-manager)."""
        return self.kind != 'control-plane'


@pytest.fixture
def k8s_api(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeAPI]:
    """An API server as chosen for the session (see the module's description), with KUBECONFIG to it."""
    kind = request.config.getoption('--kube-api') or os.environ.get(API_ENV_VAR) or 'emulator'
    if kind not in API_CHOICES:
        raise pytest.UsageError(f'${API_ENV_VAR}={kind!r} is none of: {", ".join(API_CHOICES)}.')
    server: Any
    if kind == 'emulator':
        server = request.getfixturevalue('k8s_emulator')
        path = pathlib.Path(server.kubeconfig_path)
    elif kind == 'control-plane':
        server = request.getfixturevalue('k8s_control_plane')
        path = pathlib.Path(server.kubeconfig_path)
    else:
        value = os.environ.get('KUBECONFIG')
        if not value:
            raise pytest.UsageError('--kube-api=kubeconfig needs $KUBECONFIG pointing to a cluster.')
        server, path = None, pathlib.Path(value.split(os.pathsep)[0])
    monkeypatch.setenv('KUBECONFIG', str(path))
    restore = _kubeconfigs.point_client_libraries(path)
    try:
        yield KubeAPI(kind=kind, kubeconfig_path=path, server=server)
    finally:
        restore()


@pytest.fixture
def k8s_emulator_options() -> dict[str, Any]:
    """More keyword arguments of the ``k8s_emulator``, e.g. ``feature_gates``: override it to change them."""
    return {}


@pytest.fixture
def k8s_emulator(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
    k8s_emulator_options: dict[str, Any],
) -> Iterator['KubernetesEmulator']:
    """A running Kubernetes API emulator with ``KUBECONFIG`` set to its kubeconfig file."""
    from kopf.testing.emulator import KubernetesEmulator

    kubeconfig_path = tmp_path_factory.mktemp('k8s-emulator') / 'kubeconfig'
    with KubernetesEmulator(kubeconfig_path=kubeconfig_path, **k8s_emulator_options) as emulator:
        monkeypatch.setenv('KUBECONFIG', str(emulator.kubeconfig_path))
        # The client libraries imported before the test (e.g. at its module's top) read the old $KUBECONFIG.
        restore = _kubeconfigs.point_client_libraries(emulator.kubeconfig_path)
        try:
            yield emulator
        finally:
            restore()


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
def k8s_control_plane_options() -> dict[str, Any]:
    """
    More keyword arguments of the session's ``k8s_control_plane``: override it (session-scoped) to change
    them,
    e.g. ``{'feature_gates': {'ShardedListAndWatch': True}}`` (an unknown gate fails kube-apiserver's start).
    """
    return {}


@pytest.fixture(scope='session')
def k8s_control_plane(
        k8s_control_plane_assets: 'KubeAssets',
        k8s_control_plane_options: dict[str, Any],
) -> Iterator['KubernetesControlPlane']:
    """A real Kubernetes control plane for the session; the admin's kubeconfig is ``.kubeconfig_path``."""
    from kopf.testing.apiserver import KubernetesControlPlane

    assets = k8s_control_plane_assets
    with KubernetesControlPlane(
        etcd_path=assets.etcd, kube_apiserver_path=assets.kube_apiserver, kubectl_path=assets.kubectl,
        **k8s_control_plane_options,
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
