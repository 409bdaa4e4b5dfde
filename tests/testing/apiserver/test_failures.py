"""
The bad cases of starting, with fake binaries: each a ControlPlaneError with a clear first line.
"""
import pathlib
import socket
from collections.abc import Callable, Iterator

import pytest

from kopf.testing.apiserver import (
    ControlPlaneError,
    KubernetesControlPlane,
    PortInUseError,
    ProcessExitedError,
    StartTimeoutError,
)

FAILING = '''#!/bin/sh
{record}
for i in $(seq 1 15); do echo "log line $i"; done
echo "E0101 run.go:72] command failed: the fake refuses to start" >&2
exit 3
'''

IGNORES_SIGTERM = '''#!/bin/sh
{record}
trap '' TERM
exec sleep 600
'''

PORT_TAKEN = '''#!/bin/sh
{record}
echo attempt >> "$FAKE_ARGS_DIR/attempts"
echo 'E0101 run.go:72] "command failed" err="failed to create listener: '\
'listen tcp 127.0.0.1:1: bind: address already in use"'
exit 1
'''

TELLS_THE_TOKEN = '''#!/bin/sh
{record}
for arg in "$@"; do
  case "$arg" in --token-auth-file=*)
    cut -d, -f1 "${{arg#*=}}" > "$FAKE_ARGS_DIR/token"
    echo "token: $(cat "$FAKE_ARGS_DIR/token")";;
  esac
done
exit 1
'''

Assets = Callable[..., pathlib.Path]
Pids = Callable[[], dict[str, int]]
Alive = Callable[[int], bool]
Dirs = tuple[pathlib.Path, pathlib.Path]


@pytest.fixture()
def held_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_the_apiserver_exits_at_start(make_assets: Assets, record: str,
                                      is_alive: Alive, fake_pids: Pids,
                                      ) -> None:
    control_plane = KubernetesControlPlane(make_assets(apiserver=FAILING.format(record=record)))
    with pytest.raises(ProcessExitedError) as err:
        control_plane.start()
    message = str(err.value)
    lines = message.splitlines()
    log_path = err.value.log_path
    assert log_path is not None
    assert lines[0] == f'kube-apiserver exited at start with code 3; its last lines ({log_path}):'
    assert lines[1:] == [f'    log line {i}' for i in range(7, 16)] + [
        '    E0101 run.go:72] command failed: the fake refuses to start']
    assert err.value.process_name == 'kube-apiserver'
    assert err.value.exit_code == 3
    assert len(err.value.log_tail) == 10
    assert not log_path.parent.exists()  # the temporary directory is removed, the message tells all
    assert not is_alive(fake_pids()['etcd'])
    assert not control_plane.running


def test_etcd_exits_at_start(make_assets: Assets, record: str) -> None:
    control_plane = KubernetesControlPlane(make_assets(etcd=FAILING.format(record=record)))
    with pytest.raises(ProcessExitedError, match=r'^etcd exited at start with code 3; its last lines') as err:
        control_plane.start()
    assert err.value.process_name == 'etcd'


def test_never_ready(make_assets: Assets, sleeper: str,
                     fake_pids: Pids, is_alive: Alive) -> None:
    control_plane = KubernetesControlPlane(make_assets(apiserver=sleeper), start_timeout=0.5)
    with pytest.raises(StartTimeoutError) as err:
        control_plane.start()
    assert str(err.value).startswith(
        'The Kubernetes control plane was not ready in 0.5 s (/readyz: connection refused); '
        "kube-apiserver's last lines ("
    )
    assert str(err.value).endswith(' (none)')  # the sleeper says nothing
    assert isinstance(err.value, TimeoutError)
    assert err.value.timeout == 0.5
    assert fake_pids().keys() == {'etcd', 'kube-apiserver'}
    assert not any(is_alive(pid) for pid in fake_pids().values())


def test_sigkill_after_the_stop_timeout(make_assets: Assets, record: str,
                                        fake_pids: Pids, is_alive: Alive,
                                        ) -> None:
    control_plane = KubernetesControlPlane(make_assets(apiserver=IGNORES_SIGTERM.format(record=record)),
                                           start_timeout=0.2, stop_timeout=0.2)
    with pytest.raises(StartTimeoutError):
        control_plane.start()
    assert not is_alive(fake_pids()['kube-apiserver'])


def test_a_taken_apiserver_port(make_assets: Assets, held_port: int,
                                fake_pids: Pids) -> None:
    control_plane = KubernetesControlPlane(make_assets(), port=held_port)
    with pytest.raises(PortInUseError) as err:
        control_plane.start()
    assert str(err.value) == f'The port 127.0.0.1:{held_port} for kube-apiserver is taken by another process.'
    assert err.value.port == held_port
    assert not fake_pids()  # nothing started


def test_a_taken_etcd_port(make_assets: Assets, held_port: int) -> None:
    control_plane = KubernetesControlPlane(make_assets(), etcd_port=held_port)
    with pytest.raises(PortInUseError, match=rf'^The port 127.0.0.1:{held_port} for etcd is taken by'):
        control_plane.start()


def test_a_port_taken_meanwhile_is_retried_with_new_ports(make_assets: Assets, record: str,
                                                          fake_dirs: Dirs) -> None:
    control_plane = KubernetesControlPlane(make_assets(apiserver=PORT_TAKEN.format(record=record)))
    with pytest.raises(PortInUseError) as err:
        control_plane.start()
    assert (fake_dirs[1] / 'attempts').read_text() == 'attempt\n' * 3
    first_line, *tail = str(err.value).splitlines()
    assert first_line.startswith('kube-apiserver could not listen: a port is taken by another process ')
    assert tail == ['    E0101 run.go:72] "command failed" err="failed to create listener: '
                    'listen tcp 127.0.0.1:1: bind: address already in use"']


def test_a_given_port_taken_meanwhile_is_not_retried(make_assets: Assets, record: str,
                                                     fake_dirs: Dirs) -> None:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]  # free now: the fake says it is taken later
    control_plane = KubernetesControlPlane(make_assets(apiserver=PORT_TAKEN.format(record=record)), port=port)
    with pytest.raises(PortInUseError) as err:
        control_plane.start()
    assert (fake_dirs[1] / 'attempts').read_text() == 'attempt\n'
    assert err.value.port == port


def test_the_token_never_gets_into_messages(make_assets: Assets, record: str,
                                            fake_dirs: Dirs) -> None:
    control_plane = KubernetesControlPlane(make_assets(apiserver=TELLS_THE_TOKEN.format(record=record)))
    with pytest.raises(ProcessExitedError) as err:
        control_plane.start()
    token = (fake_dirs[1] / 'token').read_text().strip()
    assert len(token) > 40
    assert token not in str(err.value)
    assert err.value.log_tail == ['token: <redacted>']


def test_the_errors_are_control_plane_errors() -> None:
    for cls in (PortInUseError, ProcessExitedError, StartTimeoutError):
        assert issubclass(cls, ControlPlaneError)
