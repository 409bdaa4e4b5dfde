"""
The pytest plugin of kopf-testing: fixtures for operator tests (registered via an entry point).

``k8s_emulator``: a running :class:`kopf.testing.KubernetesEmulator` (served in its own thread,
so it works for sync and async tests alike, with any event loop scope), with ``KUBECONFIG``
pointing to it for the duration of the test. Any Kubernetes client that reads ``KUBECONFIG``,
Kopf included, talks to the emulator without further configuration.

This module is imported by pytest in every test session: it imports nothing heavy at the top.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from kopf.testing import _kubeconfigs

if TYPE_CHECKING:
    from kopf.testing.emulator import KubernetesEmulator


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
        # The client libraries imported before the test (e.g. at its module's top) read the old $KUBECONFIG.
        restore = _kubeconfigs.point_client_libraries(emulator.kubeconfig_path)
        try:
            yield emulator
        finally:
            restore()
