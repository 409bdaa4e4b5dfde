"""
A real Kubernetes control plane for tests: etcd and kube-apiserver on loopback ports, envtest-style.

Unlike :mod:`kopf.testing.emulator` (a test double of the API in this process), this runs the
real binaries, so the API behaves exactly as in a cluster (validation, defaulting, CRD schemas,
RBAC, server-side apply, watch semantics), minus everything but the API: no controllers, no
scheduler, no nodes. See :class:`KubernetesControlPlane`; ``python -m kopf.testing.apiserver``
serves one until interrupted.
"""

from kopf.testing.apiserver.assets import (
    ASSETS_ENV_VAR,
    BUILD_COMMAND,
    CACHE_ENV_VAR,
    KubeAssets,
    default_cache_dir,
    find_assets,
)
from kopf.testing.apiserver.controlplane import KubernetesControlPlane
from kopf.testing.apiserver.errors import (
    BinariesNotFoundError,
    ControlPlaneError,
    PortInUseError,
    ProcessExitedError,
    StartTimeoutError,
)

__all__ = [
    'ASSETS_ENV_VAR',
    'BUILD_COMMAND',
    'CACHE_ENV_VAR',
    'BinariesNotFoundError',
    'ControlPlaneError',
    'KubeAssets',
    'KubernetesControlPlane',
    'PortInUseError',
    'ProcessExitedError',
    'StartTimeoutError',
    'default_cache_dir',
    'find_assets',
]
