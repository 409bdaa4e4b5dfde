"""
Serve a real Kubernetes control plane until SIGINT/SIGTERM.

    python -m kopf.testing.apiserver --kubeconfig PATH
"""

import argparse
import signal
import sys
import time
import types
from typing import NoReturn

from kopf.testing._featuregates import parse_feature_gates
from kopf.testing.apiserver.controlplane import KubernetesControlPlane
from kopf.testing.apiserver.errors import ControlPlaneError


class _Stopped(Exception):
    """A stop was asked for by a signal."""


def _parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog='python -m kopf.testing.apiserver',
        description='Serve a real Kubernetes control plane (etcd + kube-apiserver on 127.0.0.1) '
                    'until interrupted. The binaries come from $KUBEBUILDER_ASSETS, --assets, or '
                    'the build cache of tools/kube-assets/build.sh.',
    )
    parser.add_argument('--kubeconfig', default=None,
                        help='where to write the admin kubeconfig once ready (default: in the work dir)')
    parser.add_argument('--port', type=int, default=0, help="kube-apiserver's port; 0 picks a free one")
    parser.add_argument('--etcd-port', type=int, default=0, help="etcd's client port; 0 picks a free one")
    parser.add_argument('--assets', default=None, help='a directory with etcd, kube-apiserver, kubectl')
    parser.add_argument('--work-dir', default=None,
                        help='the directory for the keys, data and logs (kept); default: a temporary one')
    parser.add_argument('--authorization-mode', default='RBAC', help='default: %(default)s')
    parser.add_argument('--feature-gates', default='', metavar='NAME=BOOL,...',
                        help="kube-apiserver's feature gates, e.g. ShardedListAndWatch=true")
    parser.add_argument('--apiserver-arg', action='append', default=[], metavar='--FLAG=VALUE',
                        help='an extra flag of kube-apiserver (repeatable)')
    parser.add_argument('--timeout', type=float, default=60.0,
                        help='seconds to wait for the readiness (default: %(default)s)')
    return parser.parse_args(argv)


CHECK_INTERVAL = 1.0  # seconds between the checks that etcd and kube-apiserver are alive


def _stop_by_signal(signum: int, frame: types.FrameType | None) -> NoReturn:
    raise _Stopped(signal.Signals(signum).name)


def _ignore(signum: int, frame: types.FrameType | None) -> None:
    pass  # only to interrupt the sleep when a child exits


def main(argv: list[str] | None = None) -> None:
    arguments = _parse_arguments(argv)
    control_plane = KubernetesControlPlane(
        arguments.assets,
        kubeconfig_path=arguments.kubeconfig,
        work_dir=arguments.work_dir,
        port=arguments.port,
        etcd_port=arguments.etcd_port,
        authorization_mode=arguments.authorization_mode,
        feature_gates=parse_feature_gates(arguments.feature_gates),
        apiserver_args=arguments.apiserver_arg,
        start_timeout=arguments.timeout,
    )
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)
    previous = {signum: signal.getsignal(signum) for signum in signals}
    signal.signal(signal.SIGINT, _stop_by_signal)
    signal.signal(signal.SIGTERM, _stop_by_signal)
    signal.signal(signal.SIGCHLD, _ignore)
    try:
        control_plane.start()
        try:
            print(
                f'The Kubernetes control plane ({control_plane.version}) serves at {control_plane.url}, '
                f'ready in {control_plane.startup_duration or 0:.2f} s; '
                f'kubeconfig: {control_plane.kubeconfig_path}',
                file=sys.stderr, flush=True,
            )
            print(f'Use it: export KUBECONFIG={control_plane.kubeconfig_path}  (Ctrl+C to stop)',
                  file=sys.stderr, flush=True)
            while True:
                # Checked every interval (a stop signal interrupts the sleep at once: its handler raises);
                # signal.pause() missed a child's exit between the check and the pause forever (seen in CI).
                time.sleep(CHECK_INTERVAL)
                control_plane.check_alive()
        finally:
            control_plane.stop()
    except _Stopped:
        print('The Kubernetes control plane is stopped.', file=sys.stderr, flush=True)
    except ControlPlaneError as e:
        print(f'Error: {e}', file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == '__main__':
    main()
