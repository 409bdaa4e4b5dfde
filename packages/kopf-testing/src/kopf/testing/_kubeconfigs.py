"""
Pointing the Kubernetes client libraries at a test's API server, whenever they were imported.

The ``kubernetes`` and ``kubernetes_asyncio`` clients read ``$KUBECONFIG`` once, when imported, into
their default location (``kube_config.KUBE_CONFIG_DEFAULT_LOCATION``); ``load_kube_config()`` without
arguments reads that default later. A test module that imports them at its top (before a runner or a
fixture sets ``$KUBECONFIG``) would make an operator's own ``load_kube_config()`` miss the emulator.
While a test's API server is in use, their defaults follow ``$KUBECONFIG``; afterwards, they are restored.
"""
import os
import sys
from collections.abc import Callable

# The modules that keep the default location, and the name of the attribute in them.
_LIBRARIES = ('kubernetes.config.kube_config', 'kubernetes_asyncio.config.kube_config')
_ATTRIBUTE = 'KUBE_CONFIG_DEFAULT_LOCATION'


def point_client_libraries(kubeconfig: str | os.PathLike[str]) -> Callable[[], None]:
    """Make the imported client libraries default to this kubeconfig; return how to undo it."""
    saved: list[tuple[object, object]] = []
    for name in _LIBRARIES:
        module = sys.modules.get(name)  # not imported: it will read $KUBECONFIG itself when imported
        if module is not None and hasattr(module, _ATTRIBUTE):
            saved.append((module, getattr(module, _ATTRIBUTE)))
            setattr(module, _ATTRIBUTE, os.fspath(kubeconfig))

    def restore() -> None:
        for module, value in saved:
            setattr(module, _ATTRIBUTE, value)
        saved.clear()

    return restore
