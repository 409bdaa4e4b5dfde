"""
A Kubernetes API emulator: an in-process HTTP test double of the API server, for tests without a cluster.

See :class:`KubernetesEmulator`. From the command line::

    python -m kopf.testing.emulator --port 0 --kubeconfig /tmp/emulator.kubeconfig
"""
from kopf.testing.emulator.errors import ApiError
from kopf.testing.emulator.faults import RequestCounter, RequestKey
from kopf.testing.emulator.resources import ResourceInfo
from kopf.testing.emulator.server import KubernetesEmulator

__all__ = [
    'ApiError',
    'KubernetesEmulator',
    'RequestCounter',
    'RequestKey',
    'ResourceInfo',
]
