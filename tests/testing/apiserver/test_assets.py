"""
Finding the binaries: explicit paths, a directory, KUBEBUILDER_ASSETS, the build cache; the one-liners.
"""
import pathlib

import pytest

from kopf.testing.apiserver import (
    BinariesNotFoundError,
    ControlPlaneError,
    KubernetesControlPlane,
    find_assets,
)

BINARIES = ('etcd', 'kube-apiserver', 'kubectl')


@pytest.fixture(autouse=True)
def _no_configured_assets(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> pathlib.Path:
    """No KUBEBUILDER_ASSETS from the developer's shell, and an empty build cache of the test's own."""
    cache = tmp_path / 'cache'
    cache.mkdir()
    monkeypatch.delenv('KUBEBUILDER_ASSETS', raising=False)
    monkeypatch.setenv('KOPF_KUBE_ASSETS_CACHE', str(cache))
    return cache


def make_dir(path: pathlib.Path, names: tuple[str, ...] = BINARIES, *, mode: int = 0o755) -> pathlib.Path:
    path.mkdir(parents=True)
    for name in names:
        (path / name).write_text('#!/bin/sh\n')
        (path / name).chmod(mode)
    return path


def test_from_a_directory(tmp_path: pathlib.Path) -> None:
    directory = make_dir(tmp_path / 'bin')
    assets = find_assets(directory)
    assert assets.etcd == directory / 'etcd'
    assert assets.kube_apiserver == directory / 'kube-apiserver'
    assert assets.kubectl == directory / 'kubectl'
    assert str(directory) in assets.source


def test_from_kubebuilder_assets(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = make_dir(tmp_path / 'bin')
    monkeypatch.setenv('KUBEBUILDER_ASSETS', str(directory))
    assets = find_assets()
    assert assets.kube_apiserver == directory / 'kube-apiserver'
    assert assets.source == f'KUBEBUILDER_ASSETS={directory}'


def test_kubectl_is_optional(tmp_path: pathlib.Path) -> None:
    directory = make_dir(tmp_path / 'bin', ('etcd', 'kube-apiserver'))
    assert find_assets(directory).kubectl is None


def test_explicit_paths_win_over_the_directory(tmp_path: pathlib.Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    directory = make_dir(tmp_path / 'bin')
    other = make_dir(tmp_path / 'other', ('etcd',))
    monkeypatch.setenv('KUBEBUILDER_ASSETS', str(directory))
    assets = find_assets(etcd=other / 'etcd')
    assert assets.etcd == other / 'etcd'
    assert assets.kube_apiserver == directory / 'kube-apiserver'


def test_explicit_paths_alone_need_no_directory(tmp_path: pathlib.Path) -> None:
    directory = make_dir(tmp_path / 'bin', ('etcd', 'kube-apiserver'))
    assets = find_assets(etcd=directory / 'etcd', kube_apiserver=directory / 'kube-apiserver')
    assert assets.kubectl is None
    assert assets.source == 'the explicit paths'


def test_a_missing_explicit_path(tmp_path: pathlib.Path) -> None:
    with pytest.raises(BinariesNotFoundError) as err:
        find_assets(make_dir(tmp_path / 'bin'), kubectl=tmp_path / 'nowhere' / 'kubectl')
    assert str(err.value) == (
        f"The kubectl binary '{tmp_path}/nowhere/kubectl' does not exist or is not executable."
    )


def test_the_newest_complete_build_of_the_cache(_no_configured_assets: pathlib.Path) -> None:
    cache = _no_configured_assets
    make_dir(cache / 'k8s-v1.9.9')
    make_dir(cache / 'k8s-v1.30.0-rc.1')
    newest = make_dir(cache / 'k8s-v1.30.0')
    make_dir(cache / 'k8s-v1.31.0', ('etcd',))  # a build in progress: no kube-apiserver yet
    make_dir(cache / 'k8s-v1.32.0', mode=0o644)  # not executable
    make_dir(cache / 'something-else')
    (cache / 'k8s-v1.99.0').write_text('a file, not a directory')
    assets = find_assets()
    assert assets.kube_apiserver == newest / 'kube-apiserver'
    assert assets.source == f'the build cache {newest}'


def test_kubebuilder_assets_wins_over_the_cache(_no_configured_assets: pathlib.Path, tmp_path: pathlib.Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    make_dir(_no_configured_assets / 'k8s-v1.30.0')
    empty = tmp_path / 'empty'
    empty.mkdir()
    monkeypatch.setenv('KUBEBUILDER_ASSETS', str(empty))
    with pytest.raises(BinariesNotFoundError) as err:
        find_assets()
    assert str(err.value) == (
        f'No etcd and no kube-apiserver (executable) in KUBEBUILDER_ASSETS={empty}: it must be a directory '
        f'with etcd, kube-apiserver, kubectl (KUBEBUILDER_ASSETS layout); '
        f'build them with tools/kube-assets/build.sh.'
    )


def test_nothing_anywhere(_no_configured_assets: pathlib.Path) -> None:
    with pytest.raises(BinariesNotFoundError) as err:
        find_assets()
    assert str(err.value) == (
        f'No Kubernetes control plane binaries: KUBEBUILDER_ASSETS is not set '
        f'and {_no_configured_assets} has no k8s-v*/ with etcd and kube-apiserver; '
        f'build them with tools/kube-assets/build.sh, or set KUBEBUILDER_ASSETS to '
        f'a directory with etcd, kube-apiserver, kubectl.'
    )
    assert '\n' not in str(err.value)


def test_the_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.delenv('KOPF_KUBE_ASSETS_CACHE')
    monkeypatch.setenv('HOME', str(tmp_path))
    with pytest.raises(BinariesNotFoundError, match=r'and .*/\.cache/kopf/kube-assets has no k8s-v\*/'):
        find_assets()


def test_start_with_a_missing_directory(tmp_path: pathlib.Path) -> None:
    control_plane = KubernetesControlPlane(tmp_path / 'nowhere')
    with pytest.raises(ControlPlaneError) as err:
        control_plane.start()
    assert isinstance(err.value, BinariesNotFoundError)
    assert str(err.value) == (
        f'No etcd and no kube-apiserver (executable) in the directory {tmp_path}/nowhere: '
        f'it must be a directory with etcd, kube-apiserver, kubectl (KUBEBUILDER_ASSETS layout); '
        f'build them with tools/kube-assets/build.sh.'
    )
    assert not control_plane.running
