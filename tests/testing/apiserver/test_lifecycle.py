"""
Starting, serving and stopping, with a fake kube-apiserver that gets ready (HTTPS, client certificates).
"""
import asyncio
import base64
import os
import pathlib
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

import kopf.testing
from kopf.testing.apiserver import KubernetesControlPlane, ProcessExitedError, StartTimeoutError

Assets = Callable[..., pathlib.Path]
Pids = Callable[[], dict[str, int]]
Alive = Callable[[int], bool]


def test_exported_from_kopf_testing() -> None:
    assert kopf.testing.KubernetesControlPlane is KubernetesControlPlane
    assert 'KubernetesControlPlane' in kopf.testing.__all__
    assert 'ControlPlaneError' in kopf.testing.__all__


def test_start_and_stop(make_assets: Assets, fake_args: Callable[[str], list[str]],
                        fake_pids: Pids, is_alive: Alive,
                        is_port_free: Alive) -> None:
    with KubernetesControlPlane(make_assets()) as control_plane:
        assert control_plane.running
        assert control_plane.version == 'v1.99.0-fake'
        assert control_plane.url == f'https://127.0.0.1:{control_plane.port}'
        assert control_plane.etcd_url == f'http://127.0.0.1:{control_plane.etcd_port}'
        assert control_plane.startup_duration is not None and control_plane.startup_duration > 0
        assert not is_port_free(control_plane.port)
        work_dir = control_plane.work_dir
        assert control_plane.kubeconfig_path == work_dir / 'kubeconfig'
        assert stat.S_IMODE(control_plane.kubeconfig_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(work_dir.stat().st_mode) == 0o700
        assert control_plane.apiserver_log_path.read_text().startswith('fake kube-apiserver serves\n')
        pids = fake_pids()
        assert all(is_alive(pid) for pid in pids.values())
    assert not control_plane.running
    assert not work_dir.exists()
    assert is_port_free(control_plane.port)
    assert not any(is_alive(pid) for pid in pids.values())


def test_the_kubeconfig(make_assets: Assets) -> None:
    with KubernetesControlPlane(make_assets()) as control_plane:
        kubeconfig = yaml.safe_load(control_plane.kubeconfig_path.read_text())
        assert kubeconfig == control_plane.kubeconfig
        assert kubeconfig['current-context'] == 'kopf-control-plane'
        [cluster] = kubeconfig['clusters']
        assert cluster['cluster']['server'] == control_plane.url
        ca_data = cluster['cluster']['certificate-authority-data']
        assert base64.b64decode(ca_data) == control_plane.ca_path.read_bytes()
        users = {user['name']: user['user'] for user in kubeconfig['users']}
        assert users.keys() == {'kopf-control-plane', 'kopf-control-plane-token'}
        admin = users['kopf-control-plane']
        cert_path, key_path = control_plane.client_cert_path, control_plane.client_key_path
        assert base64.b64decode(admin['client-certificate-data']) == cert_path.read_bytes()
        assert base64.b64decode(admin['client-key-data']) == key_path.read_bytes()
        assert users['kopf-control-plane-token'] == {'token': control_plane.token}
        assert control_plane.token is not None
        certificate = x509.load_pem_x509_certificate(control_plane.client_cert_path.read_bytes())
        assert certificate.subject.rfc4514_string() == 'CN=kopf-admin,O=system:masters'
        certificate.verify_directly_issued_by(
            x509.load_pem_x509_certificate(control_plane.client_ca_path.read_bytes()))


def test_a_kubeconfig_path_of_its_own_is_kept(make_assets: Assets,
                                              tmp_path: pathlib.Path) -> None:
    path = tmp_path / 'config' / 'kubeconfig'
    with KubernetesControlPlane(make_assets(), kubeconfig_path=path) as control_plane:
        assert control_plane.kubeconfig_path == path
        url = control_plane.url
    assert yaml.safe_load(path.read_text())['clusters'][0]['cluster']['server'] == url


def test_a_work_dir_of_its_own_is_kept(make_assets: Assets, tmp_path: pathlib.Path) -> None:
    with KubernetesControlPlane(make_assets(), work_dir=tmp_path / 'work') as control_plane:
        assert control_plane.work_dir == tmp_path / 'work'
    assert (tmp_path / 'work' / 'kube-apiserver.log').exists()
    assert (tmp_path / 'work' / 'kubeconfig').exists()


def test_the_flags(make_assets: Assets, fake_args: Callable[[str], list[str]]) -> None:
    with KubernetesControlPlane(make_assets()) as control_plane:
        pki = control_plane.work_dir / 'pki'
        apiserver_args = fake_args('kube-apiserver')
        etcd_args = fake_args('etcd')
        etcd_port, port = control_plane.etcd_port, control_plane.port
    assert apiserver_args == [
        '--advertise-address=127.0.0.1',
        '--bind-address=127.0.0.1',
        f'--secure-port={port}',
        f'--etcd-servers=http://127.0.0.1:{etcd_port}',
        f'--cert-dir={pki}',
        f'--tls-cert-file={pki}/serving.crt',
        f'--tls-private-key-file={pki}/serving.key',
        f'--client-ca-file={pki}/client-ca.crt',
        f'--token-auth-file={pki}/tokens.csv',
        '--service-account-issuer=https://kubernetes.default.svc.cluster.local',
        f'--service-account-key-file={pki}/service-account.pub',
        f'--service-account-signing-key-file={pki}/service-account.key',
        '--service-cluster-ip-range=10.0.0.0/24',
        '--authorization-mode=RBAC',
        '--allow-privileged=true',
        '--endpoint-reconciler-type=none',
        '--disable-admission-plugins=ServiceAccount',
    ]
    urls = [arg for arg in etcd_args if '-urls=' in arg or arg.startswith('--initial-cluster=')]
    assert urls and all('//127.0.0.1:' in arg for arg in urls)
    assert f'--listen-client-urls=http://127.0.0.1:{etcd_port}' in etcd_args
    assert '--unsafe-no-fsync=true' in etcd_args


def test_extra_flags_and_feature_gates(make_assets: Assets,
                                       fake_args: Callable[[str], list[str]]) -> None:
    with KubernetesControlPlane(
        make_assets(),
        authorization_mode='AlwaysAllow',
        feature_gates={'ShardedListAndWatch': True, 'SomethingElse': False},
        apiserver_args={'--allow-privileged': None, 'v': '2', 'service-cluster-ip-range': '10.1.0.0/24'},
        etcd_args=['--log-level=warn'],
        token_auth=False,
    ) as control_plane:
        assert control_plane.token is None
        assert [user['name'] for user in control_plane.kubeconfig['users']] == ['kopf-control-plane']
        apiserver_args = fake_args('kube-apiserver')
        etcd_args = fake_args('etcd')
    assert '--authorization-mode=AlwaysAllow' in apiserver_args
    assert '--feature-gates=ShardedListAndWatch=true,SomethingElse=false' in apiserver_args
    assert '--service-cluster-ip-range=10.1.0.0/24' in apiserver_args
    assert apiserver_args[-1] == '--v=2'
    assert not any(arg.startswith(('--allow-privileged', '--token-auth-file')) for arg in apiserver_args)
    assert etcd_args[-1] == '--log-level=warn'


def test_properties_before_start() -> None:
    control_plane = KubernetesControlPlane()
    assert not control_plane.running
    with pytest.raises(RuntimeError, match='not started'):
        _ = control_plane.url
    with pytest.raises(RuntimeError, match='not started'):
        _ = control_plane.kubeconfig_path
    control_plane.stop()  # nothing to stop: no error


def test_no_double_start_but_a_restart(make_assets: Assets) -> None:
    control_plane = KubernetesControlPlane(make_assets())
    with control_plane:
        with pytest.raises(RuntimeError, match='already running'):
            control_plane.start()
        first_dir = control_plane.work_dir
    with control_plane:
        assert control_plane.running
        assert control_plane.work_dir != first_dir
    control_plane.stop()  # again: no error


def test_restart_apiserver_on_the_same_port_with_the_same_etcd(
        make_assets: Assets, fake_pids: Pids, fake_args: Callable[[str], list[str]], is_alive: Alive,
) -> None:
    with KubernetesControlPlane(make_assets()) as control_plane:
        before = fake_pids()
        port, kubeconfig, args = control_plane.port, control_plane.kubeconfig, fake_args('kube-apiserver')
        control_plane.restart_apiserver(downtime=0.1)
        after = fake_pids()
        assert control_plane.running
        assert not is_alive(before['kube-apiserver'])
        assert is_alive(after['kube-apiserver']) and after['kube-apiserver'] != before['kube-apiserver']
        assert is_alive(after['etcd']) and after['etcd'] == before['etcd']
        assert fake_args('kube-apiserver') == args  # the same flags: the same port, etcd, certificates
        assert control_plane.port == port and control_plane.kubeconfig == kubeconfig
        log = control_plane.apiserver_log_path.read_text()
        assert log.count('fake kube-apiserver serves') == 2
        assert '--- kube-apiserver restarted by KubernetesControlPlane.restart_apiserver() ---\n' in log
    assert not any(is_alive(pid) for pid in after.values())


def test_restart_apiserver_fails_if_it_does_not_start_again(
        make_assets: Assets, fake_apiserver: str, fake_pids: Pids, is_alive: Alive, tmp_path: pathlib.Path,
) -> None:
    real = tmp_path / 'once' / 'kube-apiserver'  # the same name: it records its pid and args as such
    real.parent.mkdir()
    real.write_text(fake_apiserver)
    real.chmod(0o755)
    once = f'''#!/bin/sh
if [ -e "$FAKE_PIDS_DIR/started-once" ]; then echo "cannot start again"; exit 3; fi
touch "$FAKE_PIDS_DIR/started-once"
exec {real} "$@"
'''
    with KubernetesControlPlane(make_assets(apiserver=once)) as control_plane:
        with pytest.raises(ProcessExitedError) as err:
            control_plane.restart_apiserver()
        assert str(err.value) == (f'kube-apiserver exited at start with code 3; its last lines '
                                  f'({control_plane.apiserver_log_path}):\n    cannot start again')
        assert control_plane.running  # etcd is still there: stop() stops it
        etcd = fake_pids()['etcd']
        assert is_alive(etcd)
    assert not is_alive(etcd)


def test_restart_apiserver_before_start() -> None:
    with pytest.raises(RuntimeError, match='not started'):
        KubernetesControlPlane().restart_apiserver()


def test_add_user(make_assets: Assets) -> None:
    with KubernetesControlPlane(make_assets()) as control_plane:
        path = control_plane.add_user('alice', ['team-a'])
        assert path == control_plane.work_dir / 'users' / 'alice.kubeconfig'
        kubeconfig = yaml.safe_load(path.read_text())
        assert kubeconfig['current-context'] == 'alice'
        assert kubeconfig['clusters'] == control_plane.kubeconfig['clusters']
        [user] = kubeconfig['users']
        cert_pem = base64.b64decode(user['user']['client-certificate-data'])
        certificate = x509.load_pem_x509_certificate(cert_pem)
        assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == 'alice'
        assert certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == 'team-a'
        certificate.verify_directly_issued_by(
            x509.load_pem_x509_certificate(control_plane.client_ca_path.read_bytes()))


def test_check_alive(make_assets: Assets, fake_pids: Pids,
                     wait_for: Callable[..., Any]) -> None:
    with KubernetesControlPlane(make_assets()) as control_plane:
        control_plane.check_alive()
        os.kill(fake_pids()['kube-apiserver'], signal.SIGKILL)

        def died() -> ProcessExitedError:
            try:
                control_plane.check_alive()
            except ProcessExitedError as e:
                return e
            raise AssertionError('The control plane is still alive.')

        error = wait_for(died)
        assert str(error).startswith('kube-apiserver exited unexpectedly with signal 9; its last lines (')


def test_kubectl_runs_with_the_kubeconfig(make_assets: Assets) -> None:
    kubectl = '#!/bin/sh\necho "kubectl $*"\n'
    with KubernetesControlPlane(make_assets(kubectl=kubectl)) as control_plane:
        result = control_plane.kubectl('get', 'ns')
    assert result.stdout == f'kubectl --kubeconfig={control_plane.kubeconfig_path} get ns\n'


def test_kubectl_missing(make_assets: Assets) -> None:
    pattern = r'^No kubectl in the directory .*; give kubectl_path='
    with (KubernetesControlPlane(make_assets()) as control_plane,
          pytest.raises(kopf.testing.ControlPlaneError, match=pattern)):
        control_plane.kubectl('version')


async def test_async_start_and_stop(make_assets: Assets,
                                    is_port_free: Alive) -> None:
    async with KubernetesControlPlane(make_assets()) as control_plane:
        assert control_plane.running
        assert control_plane.version == 'v1.99.0-fake'
        work_dir = control_plane.work_dir
    assert not control_plane.running
    assert not work_dir.exists()
    assert is_port_free(control_plane.port)


async def test_async_start_cancelled(make_assets: Assets, sleeper: str, fake_pids: Pids, is_alive: Alive,
                                     wait_for: Callable[..., Any]) -> None:
    control_plane = KubernetesControlPlane(make_assets(apiserver=sleeper))

    async def start() -> None:
        async with control_plane:
            raise AssertionError('never ready')

    task = asyncio.create_task(start())
    await asyncio.to_thread(wait_for, lambda: len(fake_pids()) == 2)  # both processes started
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=10)
    assert not control_plane.running
    assert not any(is_alive(pid) for pid in fake_pids().values())

    # The abort is over: the next start runs until its own timeout (not aborted at once).
    control_plane.start_timeout = 0.2
    with pytest.raises(StartTimeoutError):
        await control_plane.__aenter__()


def _our_reapers() -> list[int]:
    """The PIDs of the control planes' reapers started by this process (its children) and still running."""
    found = []
    for proc in pathlib.Path('/proc').iterdir():
        try:
            stat_fields = (proc / 'stat').read_text().rsplit(')', 1)[1].split()
            command = (proc / 'cmdline').read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if stat_fields[0] != 'Z' and int(stat_fields[1]) == os.getpid() and b'_reaper.py' in command:
            found.append(int(proc.name))
    return found


def test_the_reaper_exits_with_the_control_plane(make_assets: Assets) -> None:
    others = set(_our_reapers())  # e.g. of a session's control plane, if this process has one
    with KubernetesControlPlane(make_assets()):
        assert len(set(_our_reapers()) - others) == 1
    assert set(_our_reapers()) == others  # waited for on stop: no need to wait here


OWNER = '''
import os, sys
from kopf.testing.apiserver import KubernetesControlPlane
control_plane = KubernetesControlPlane(sys.argv[1])
control_plane.start()
print(control_plane.work_dir, flush=True)
sys.stdin.readline()  # until the test kills it, or tells it to exit with no cleanup
os._exit(3)
'''


@pytest.mark.parametrize('ending', ['SIGKILL', 'os._exit'])
def test_nothing_outlives_a_killed_owner(
        make_assets: Assets, fake_pids: Pids, is_alive: Alive, wait_for: Callable[..., Any], ending: str,
) -> None:
    # Its owner killed with no chance to stop it (e.g. by a CI's timeout), or exited with no cleanup: the
    # processes are in sessions of their own, so only the reaper stops them, and removes the keys then.
    owner = subprocess.Popen([sys.executable, '-c', OWNER, str(make_assets())],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert owner.stdin is not None and owner.stdout is not None
        work_dir = pathlib.Path(owner.stdout.readline().decode().strip())
        pids = fake_pids()
        assert set(pids) == {'etcd', 'kube-apiserver'} and all(is_alive(pid) for pid in pids.values())
        assert (work_dir / 'pki' / 'admin.key').exists()
        if ending == 'SIGKILL':
            owner.kill()
        else:
            owner.stdin.write(b'exit\n')
            owner.stdin.flush()
        assert owner.wait(timeout=10) == (-signal.SIGKILL if ending == 'SIGKILL' else 3)
        wait_for(lambda: not any(is_alive(pid) for pid in pids.values()))
        wait_for(lambda: not work_dir.exists())
    finally:
        owner.kill()
        owner.wait()
