"""
Where the control plane's binaries are: ``etcd``, ``kube-apiserver``, ``kubectl``.

The conventions of controller-runtime's envtest: ``KUBEBUILDER_ASSETS`` names a directory with
the three binaries. Explicit paths (per binary or a directory) take precedence over it. Without
either, the project's own build cache is used as a fallback: the newest complete
``~/.cache/kopf/kube-assets/k8s-v*/`` (its base directory overridden by ``KOPF_KUBE_ASSETS_CACHE``),
which ``tools/kube-assets/build.sh`` fills.
"""

import dataclasses
import os
import pathlib
import re

from kopf.testing.apiserver.errors import BinariesNotFoundError

__all__ = [
    'ASSETS_ENV_VAR',
    'BUILD_COMMAND',
    'CACHE_ENV_VAR',
    'KubeAssets',
    'default_cache_dir',
    'find_assets',
]

ASSETS_ENV_VAR = 'KUBEBUILDER_ASSETS'
CACHE_ENV_VAR = 'KOPF_KUBE_ASSETS_CACHE'
BUILD_COMMAND = 'tools/kube-assets/build.sh'
REQUIRED = ('etcd', 'kube-apiserver')

_VERSION_DIR = re.compile(r'^k8s-v(\d+)\.(\d+)\.(\d+)(.*)$')


@dataclasses.dataclass(frozen=True)
class KubeAssets:
    """The binaries of one control plane, and where they were found (for messages)."""
    etcd: pathlib.Path
    kube_apiserver: pathlib.Path
    kubectl: pathlib.Path | None
    source: str


def default_cache_dir() -> pathlib.Path:
    """The base directory of the project's build cache (``$KOPF_KUBE_ASSETS_CACHE`` or the default)."""
    configured = os.environ.get(CACHE_ENV_VAR)
    if configured:
        return pathlib.Path(configured).expanduser()
    return pathlib.Path.home() / '.cache' / 'kopf' / 'kube-assets'


def find_assets(
        assets_dir: str | os.PathLike[str] | None = None,
        *,
        etcd: str | os.PathLike[str] | None = None,
        kube_apiserver: str | os.PathLike[str] | None = None,
        kubectl: str | os.PathLike[str] | None = None,
) -> KubeAssets:
    """
    Find the binaries: explicit paths, else ``assets_dir``, else ``$KUBEBUILDER_ASSETS``, else the cache.

    ``kubectl`` is optional (the control plane runs without it); ``etcd`` and ``kube-apiserver``
    are required: :class:`BinariesNotFoundError` (a one-line message) if they are missing.
    """
    explicit = {'etcd': etcd, 'kube-apiserver': kube_apiserver}
    for name, path in [*explicit.items(), ('kubectl', kubectl)]:
        if path is not None and not _is_executable(pathlib.Path(path)):
            raise BinariesNotFoundError(
                f'The {name} binary {os.fspath(path)!r} does not exist or is not executable.'
            )

    directory: pathlib.Path | None
    if all(path is not None for path in explicit.values()):
        directory, source = None, 'the explicit paths'
    elif assets_dir is not None:
        directory, source = pathlib.Path(assets_dir), f'the directory {os.fspath(assets_dir)}'
    elif os.environ.get(ASSETS_ENV_VAR):
        directory = pathlib.Path(os.environ[ASSETS_ENV_VAR])
        source = f'{ASSETS_ENV_VAR}={directory}'
    else:
        cache_dir = default_cache_dir()
        directory = newest_cached_assets(cache_dir)
        if directory is None:
            raise BinariesNotFoundError(
                f'No Kubernetes control plane binaries: {ASSETS_ENV_VAR} is not set and {cache_dir} has '
                f'no k8s-v*/ with etcd and kube-apiserver; build them with {BUILD_COMMAND}, or set '
                f'{ASSETS_ENV_VAR} to a directory with etcd, kube-apiserver, kubectl.'
            )
        source = f'the build cache {directory}'

    def resolve(name: str, given: str | os.PathLike[str] | None) -> pathlib.Path | None:
        if given is not None:
            return pathlib.Path(given)
        if directory is not None and _is_executable(directory / name):
            return directory / name
        return None

    etcd_path = resolve('etcd', etcd)
    apiserver_path = resolve('kube-apiserver', kube_apiserver)
    found = {'etcd': etcd_path, 'kube-apiserver': apiserver_path}
    missing = [name for name, path in found.items() if path is None]
    if etcd_path is None or apiserver_path is None:
        raise BinariesNotFoundError(
            f'No {" and no ".join(missing)} (executable) in {source}: it must be a directory with etcd, '
            f'kube-apiserver, kubectl ({ASSETS_ENV_VAR} layout); build them with {BUILD_COMMAND}.'
        )
    kubectl_path = resolve('kubectl', kubectl)
    return KubeAssets(etcd=etcd_path, kube_apiserver=apiserver_path, kubectl=kubectl_path, source=source)


def newest_cached_assets(cache_dir: pathlib.Path) -> pathlib.Path | None:
    """The newest ``k8s-vX.Y.Z*`` directory of the cache with both required binaries (by version)."""
    try:
        entries = list(cache_dir.iterdir())
    except OSError:
        return None
    candidates: list[tuple[tuple[int, int, int, int, str], pathlib.Path]] = []
    for entry in entries:
        match = _VERSION_DIR.match(entry.name)
        if match is None or not all(_is_executable(entry / name) for name in REQUIRED):
            continue  # e.g. a build in progress: its binaries are not all there yet
        major, minor, patch, suffix = match.groups()
        # A release sorts after its pre-releases (v1.30.0-rc.1 < v1.30.0).
        key = (int(major), int(minor), int(patch), 0 if suffix else 1, suffix)
        candidates.append((key, entry))
    return max(candidates)[1] if candidates else None


def _is_executable(path: pathlib.Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
