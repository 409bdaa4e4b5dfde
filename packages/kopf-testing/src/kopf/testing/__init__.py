"""
Tools for testing operators: ``KopfRunner``, an in-process Kubernetes API emulator, a real
Kubernetes control plane (etcd + kube-apiserver as subprocesses, envtest-style), and a test's
user of any of them (``Cluster``, ``AsyncCluster``, ``eventually``).

The names are resolved on first access, so that importing ``kopf.testing`` (as the pytest
plugin does in every test session) stays cheap.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kopf.testing.apiserver import ControlPlaneError as ControlPlaneError
    from kopf.testing.apiserver import KubernetesControlPlane as KubernetesControlPlane
    from kopf.testing.cluster import Answer as Answer
    from kopf.testing.cluster import ApiError as ApiError
    from kopf.testing.cluster import AsyncCluster as AsyncCluster
    from kopf.testing.cluster import Cluster as Cluster
    from kopf.testing.cluster import eventually as eventually
    from kopf.testing.cluster import eventually_async as eventually_async
    from kopf.testing.emulator import KubernetesEmulator as KubernetesEmulator
    from kopf.testing.emulator import RequestCounter as RequestCounter
    from kopf.testing.emulator import RequestKey as RequestKey
    from kopf.testing.runner import KopfRunner as KopfRunner

# Public name -> the module that defines it.
_LAZY_NAMES: dict[str, str] = {
    'Answer': 'kopf.testing.cluster',
    'ApiError': 'kopf.testing.cluster',
    'AsyncCluster': 'kopf.testing.cluster',
    'Cluster': 'kopf.testing.cluster',
    'eventually': 'kopf.testing.cluster',
    'eventually_async': 'kopf.testing.cluster',
    'ControlPlaneError': 'kopf.testing.apiserver',
    'KopfRunner': 'kopf.testing.runner',
    'KubernetesControlPlane': 'kopf.testing.apiserver',
    'KubernetesEmulator': 'kopf.testing.emulator',
    'RequestCounter': 'kopf.testing.emulator',
    'RequestKey': 'kopf.testing.emulator',
}

__all__ = [
    'Answer',
    'ApiError',
    'AsyncCluster',
    'Cluster',
    'ControlPlaneError',
    'KopfRunner',
    'KubernetesControlPlane',
    'KubernetesEmulator',
    'RequestCounter',
    'RequestKey',
    'eventually',
    'eventually_async',
]


def __getattr__(name: str) -> Any:
    try:
        module_name = _LAZY_NAMES[name]
    except KeyError:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}') from None
    return getattr(importlib.import_module(module_name), name)
