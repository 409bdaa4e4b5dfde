"""
The real etcd + kube-apiserver: kubectl, the kubernetes client, kopf's own client, an operator, RBAC.

Skipped with the reason when the binaries are not found (KUBEBUILDER_ASSETS, or the build cache of
tools/kube-assets/build.sh); failed instead if KOPF_TESTING_REQUIRE_CONTROL_PLANE=1.
"""
import contextlib
import http.client
import json
import os
import pathlib
import socket
import ssl
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest

import kopf
from kopf._clients import creating, fetching
from kopf._clients.logins.kubeconfig import connection_info_from_kubeconfig, load_kubeconfig
from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import StandaloneClientSettings
from kopf._cogs.structs.credentials import VaultKey
from kopf._cogs.structs.references import Resource
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import KopfRunner, KubernetesControlPlane
from kopf.testing.apiserver import KubeAssets

from ..._waiting import wait_until

pytestmark = pytest.mark.real_apiserver

GROUP = 'kopf.dev'
WAIT = 30.0
CRDS = Resource('apiextensions.k8s.io', 'v1', 'customresourcedefinitions', namespaced=False)
NAMESPACES = Resource('', 'v1', 'namespaces', namespaced=False)


def unique(prefix: str) -> str:
    return f'{prefix}-{uuid.uuid4().hex[:8]}'


def crd_body(plural: str) -> dict[str, Any]:
    return {
        'apiVersion': 'apiextensions.k8s.io/v1',
        'kind': 'CustomResourceDefinition',
        'metadata': {'name': f'{plural}.{GROUP}'},
        'spec': {
            'group': GROUP,
            'scope': 'Namespaced',
            'names': {'plural': plural, 'singular': plural[:-1], 'kind': plural[:-1].capitalize()},
            'versions': [{
                'name': 'v1', 'served': True, 'storage': True,
                'subresources': {'status': {}},
                'schema': {'openAPIV3Schema': {
                    'type': 'object',
                    'properties': {
                        'spec': {'type': 'object', 'properties': {'size': {'type': 'integer'}}},
                        'status': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
                    },
                }},
            }],
        },
    }


@pytest.fixture()
def kubectl(k8s_control_plane: KubernetesControlPlane) -> Callable[..., str]:
    def run(*args: str, input: str | None = None) -> str:
        return k8s_control_plane.kubectl(*args, input=input).stdout
    return run


@pytest.fixture()
def namespace(kubectl: Callable[..., str]) -> str:
    name = unique('test')
    kubectl('create', 'namespace', name)
    return name


@pytest.fixture()
def crd(kubectl: Callable[..., str]) -> str:
    """A CRD of the test's own (the session's control plane is shared), established."""
    plural = f'{unique("things").replace("-", "")}s'
    kubectl('apply', '-f', '-', input=json.dumps(crd_body(plural)))
    kubectl('wait', '--for=condition=Established', f'crd/{plural}.{GROUP}', f'--timeout={WAIT:g}s')
    return plural


def test_kubectl_get_namespaces(kubectl: Callable[..., str]) -> None:
    names = kubectl('get', 'namespaces', '-o', 'name').split()
    assert {'namespace/default', 'namespace/kube-system', 'namespace/kube-public'} <= set(names)


def test_kubectl_as_the_admin_by_certificate_and_by_token(k8s_control_plane: KubernetesControlPlane,
                                                          kubectl: Callable[..., str]) -> None:
    whoami = json.loads(kubectl('auth', 'whoami', '-o', 'json'))
    assert whoami['status']['userInfo']['username'] == 'kopf-admin'
    assert 'system:masters' in whoami['status']['userInfo']['groups']
    whoami = json.loads(kubectl('auth', 'whoami', '-o', 'json', '--context', 'kopf-control-plane-token'))
    assert whoami['status']['userInfo']['username'] == 'kopf-admin'
    assert 'system:masters' in whoami['status']['userInfo']['groups']


def test_crd_and_object_via_the_kubernetes_client(k8s_control_plane: KubernetesControlPlane,
                                                  namespace: str, wait_for: Callable[..., Any]) -> None:
    plural = f'{unique("kthings").replace("-", "")}s'
    with kubernetes.config.new_client_from_config(config_file=str(k8s_control_plane.kubeconfig_path)) as api:
        kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(crd_body(plural))

        def established() -> bool:
            extensions = kubernetes.client.ApiextensionsV1Api(api)
            crd = extensions.read_custom_resource_definition(f'{plural}.{GROUP}')
            return any(c.type == 'Established' and c.status == 'True' for c in crd.status.conditions or [])

        wait_for(established, within=WAIT)
        objects = kubernetes.client.CustomObjectsApi(api)
        body = {'apiVersion': f'{GROUP}/v1', 'kind': plural[:-1].capitalize(),
                'metadata': {'name': 'obj1'}, 'spec': {'size': 3}}
        objects.create_namespaced_custom_object(GROUP, 'v1', namespace, plural, body)
        read = objects.get_namespaced_custom_object(GROUP, 'v1', namespace, plural, 'obj1')
        assert read['spec'] == {'size': 3}
        assert read['metadata']['uid']

        # The real API server validates by the schema: the emulator's double does not need to.
        body = dict(body, metadata={'name': 'obj2'}, spec={'size': 'three'})
        with pytest.raises(kubernetes.client.ApiException) as err:
            objects.create_namespaced_custom_object(GROUP, 'v1', namespace, plural, body)
        assert err.value.status == 422


async def test_crd_and_object_via_kopf_client(k8s_control_plane: KubernetesControlPlane, crd: str,
                                              namespace: str) -> None:
    settings = StandaloneClientSettings()
    for context_name in ['kopf-control-plane', 'kopf-control-plane-token']:  # certificate, token
        info = connection_info_from_kubeconfig(load_kubeconfig([k8s_control_plane.kubeconfig_path]),
                                               context_name=context_name)
        vault = Vault({VaultKey('main'): info})
        try:
            resource = Resource(GROUP, 'v1', crd, namespaced=True, subresources=frozenset({'status'}))
            name = unique('obj')
            body = {'apiVersion': f'{GROUP}/v1', 'kind': crd[:-1].capitalize(),
                    'metadata': {'name': name, 'namespace': namespace}, 'spec': {'size': 1}}
            await creating.create_obj(settings=settings, vault=vault, resource=resource,
                                      namespace=namespace, body=body)
            read = await fetching.read_obj(settings=settings, vault=vault, resource=resource,
                                           namespace=namespace, name=name)
            assert read['spec'] == {'size': 1}
            crds = await fetching.read_obj(settings=settings, vault=vault, resource=CRDS,
                                           namespace=None, name=f'{crd}.{GROUP}')
            assert crds['spec']['group'] == GROUP
        finally:
            await vault.close()


def test_an_operator_handles_an_object(k8s_control_plane_kubeconfig: pathlib.Path,
                                       kubectl: Callable[..., str], crd: str, namespace: str,
                                       registry: OperatorRegistry, wait_for: Callable[..., Any]) -> None:
    @kopf.on.create(GROUP, 'v1', crd, registry=registry)
    def created(spec: kopf.Spec, **_: Any) -> dict[str, Any]:
        return {'doubled': spec['size'] * 2}

    with KopfRunner(['run', '--standalone', '-n', namespace], registry=registry) as runner:
        body = {'apiVersion': f'{GROUP}/v1', 'kind': crd[:-1].capitalize(),
                'metadata': {'name': 'obj1', 'namespace': namespace}, 'spec': {'size': 21}}
        kubectl('create', '-f', '-', input=json.dumps(body))

        def handled() -> dict[str, Any]:
            obj = json.loads(kubectl('get', '-n', namespace, f'{crd}/obj1', '-o', 'json'))
            created = obj.get('status', {}).get('created')
            assert created is not None, 'The object is not handled yet.'
            return created  # type: ignore[no-any-return]

        assert wait_for(handled, within=WAIT) == {'doubled': 42}
    assert runner.exception is None
    assert runner.exit_code == 0


def test_a_user_without_permissions_until_rbac_grants_them(
        k8s_control_plane: KubernetesControlPlane, kubectl: Callable[..., str], namespace: str,
) -> None:
    name = unique('alice')
    alice = k8s_control_plane.add_user(name, ['team-a'])
    as_alice = ['--kubeconfig', str(alice)]
    assert k8s_control_plane.assets.kubectl is not None

    def run_as_alice(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(k8s_control_plane.assets.kubectl), *as_alice, *args],
                              capture_output=True, text=True, timeout=WAIT)

    result = run_as_alice('get', 'configmaps', '-n', namespace)
    assert result.returncode != 0
    assert f'User "{name}" cannot list resource "configmaps"' in result.stderr

    kubectl('create', 'role', 'reader', '-n', namespace, '--verb=get,list', '--resource=configmaps')
    kubectl('create', 'rolebinding', 'reader', '-n', namespace, '--role=reader', '--group=team-a')
    result = run_as_alice('get', 'configmaps', '-n', namespace, '-o', 'name')
    assert result.returncode == 0, result.stderr
    result = run_as_alice('get', 'configmaps', '-n', 'default')
    assert result.returncode != 0


def test_a_control_plane_of_its_own_with_feature_gates(k8s_control_plane_assets: KubeAssets,
                                                       tmp_path: pathlib.Path) -> None:
    assets = k8s_control_plane_assets
    with KubernetesControlPlane(
        etcd_path=assets.etcd, kube_apiserver_path=assets.kube_apiserver, kubectl_path=assets.kubectl,
        feature_gates={'ShardedListAndWatch': True}, authorization_mode='AlwaysAllow',
        kubeconfig_path=tmp_path / 'kubeconfig',
    ) as control_plane:
        print(f'Ready in {control_plane.startup_duration:.2f} s.')
        metrics = control_plane.kubectl('get', '--raw', '/metrics').stdout
        assert 'kubernetes_feature_enabled{name="ShardedListAndWatch",stage="ALPHA"} 1' in metrics
        alice = control_plane.add_user('alice')  # AlwaysAllow: anyone may do anything
        result = control_plane.kubectl('--kubeconfig', str(alice), 'get', 'secrets', '-A')
        assert result.returncode == 0
        ports = [control_plane.port, control_plane.etcd_port]
        work_dir = control_plane.work_dir
    assert not work_dir.exists()
    for port in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(('127.0.0.1', port))  # freed


async def test_a_control_plane_of_its_own_async(k8s_control_plane_assets: KubeAssets) -> None:
    assets = k8s_control_plane_assets
    async with KubernetesControlPlane(
        etcd_path=assets.etcd, kube_apiserver_path=assets.kube_apiserver, kubectl_path=assets.kubectl,
    ) as control_plane:
        info = connection_info_from_kubeconfig(load_kubeconfig([control_plane.kubeconfig_path]))
        vault = Vault({VaultKey('main'): info})
        try:
            body = await fetching.read_obj(settings=StandaloneClientSettings(), vault=vault,
                                           resource=NAMESPACES, namespace=None, name='default')
            assert body['metadata']['name'] == 'default'
        finally:
            await vault.close()
        ports = [control_plane.port, control_plane.etcd_port]
        work_dir = control_plane.work_dir
    assert not work_dir.exists()
    for port in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(('127.0.0.1', port))


def test_restart_apiserver_keeps_the_objects_and_their_history(k8s_control_plane_assets: KubeAssets) -> None:
    assets = k8s_control_plane_assets
    with KubernetesControlPlane(
        etcd_path=assets.etcd, kube_apiserver_path=assets.kube_apiserver, kubectl_path=assets.kubectl,
        stop_timeout=2,  # kube-apiserver waits for the open watches to end (by default, for a minute)
    ) as control_plane:
        def get(path: str) -> Any:
            return json.loads(control_plane.kubectl('get', '--raw', path).stdout)

        configmaps = '/api/v1/namespaces/default/configmaps'
        listed_at = get(configmaps)['metadata']['resourceVersion']
        control_plane.kubectl('create', 'configmap', 'before', '--from-literal=a=1')
        before = get(f'{configmaps}/before')

        context = ssl.create_default_context(cafile=str(control_plane.ca_path))
        context.load_cert_chain(control_plane.client_cert_path, control_plane.client_key_path)
        connection = http.client.HTTPSConnection(control_plane.host, control_plane.port, context=context,
                                                 timeout=WAIT)
        try:
            connection.request('GET', f'{configmaps}?watch=true&resourceVersion={listed_at}')
            watch = connection.getresponse()
            assert watch.status == 200
            assert b'"ADDED"' in watch.read1(64 * 1024)  # the event of the configmap: the stream works
            port, url = control_plane.port, control_plane.url

            control_plane.restart_apiserver(downtime=0.1)

            # The open watch ends with the old process (cleanly or not), not waiting for its timeout.
            with contextlib.suppress(http.client.IncompleteRead, ConnectionError):
                watch.read()
        finally:
            connection.close()

        # The same address, the same kubeconfig, the same etcd: the objects and their versions stay.
        assert (control_plane.port, control_plane.url) == (port, url)
        assert get(f'{configmaps}/before') == before
        control_plane.kubectl('create', 'configmap', 'after')
        after = get(f'{configmaps}/after')
        assert int(after['metadata']['resourceVersion']) > int(before['metadata']['resourceVersion'])

        # But not the watch history: the new process's watch cache starts at the current version, so a watch
        # resumed from a version before the restart gets 410 Gone (the clients relist), as after a compaction.
        # (The emulator's restart keeps its history: the watches resume from any version.)
        def watch_since(version: str) -> list[tuple[str, Any]]:
            path = f'{configmaps}?watch=true&resourceVersion={version}&timeoutSeconds=1'
            output = control_plane.kubectl('get', '--raw', path).stdout
            events = [json.loads(line) for line in output.splitlines()]
            return [(e['type'], e['object'].get('code') or e['object']['metadata']['name']) for e in events]

        assert watch_since(listed_at) == [('ERROR', 410)]
        assert watch_since(before['metadata']['resourceVersion']) == [('ERROR', 410)]
        assert watch_since(after['metadata']['resourceVersion']) == []


KILLED_OWNER = '''
import json, sys
from kopf.testing.apiserver import KubernetesControlPlane
control_plane = KubernetesControlPlane(etcd_path=sys.argv[1], kube_apiserver_path=sys.argv[2])
control_plane.start()
ports = [control_plane.port, control_plane.etcd_port]
print(json.dumps({'work_dir': str(control_plane.work_dir), 'ports': ports}), flush=True)
sys.stdin.read()  # until killed
'''


def test_nothing_outlives_a_killed_owner(
        k8s_control_plane_assets: KubeAssets,
        is_alive: Callable[[int], bool],
        is_port_free: Callable[[int], bool],
) -> None:
    # Killed by a CI's timeout, the owner cannot stop etcd and kube-apiserver (in sessions of their own):
    # the reaper does, and removes the keys; the ports are free again.
    assets = k8s_control_plane_assets
    command = [sys.executable, '-c', KILLED_OWNER, str(assets.etcd), str(assets.kube_apiserver)]
    owner = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert owner.stdout is not None
        started = json.loads(owner.stdout.readline())
        work_dir = pathlib.Path(started['work_dir'])
        pids = _pids_listening_on(started['ports'])
        assert len(pids) == 2  # etcd and kube-apiserver
        owner.kill()
        owner.wait()
        wait_until(lambda: not any(is_alive(pid) for pid in pids))
        wait_until(lambda: not work_dir.exists())
        wait_until(lambda: all(is_port_free(port) for port in started['ports']))  # the kernel frees them soon
    finally:
        owner.kill()
        owner.wait()


def _pids_listening_on(ports: list[int]) -> set[int]:
    """The processes with a socket listening on these ports of 127.0.0.1 (from /proc: no tools needed)."""
    inodes = set()
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == '0A' and int(fields[1].rsplit(':', 1)[1], 16) in ports:  # 0A: LISTEN
                    inodes.add(fields[9])
    pids = set()
    for proc in pathlib.Path('/proc').iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                for fd in (proc / 'fd').iterdir():
                    link = os.readlink(fd)
                    if link.startswith('socket:[') and link[8:-1] in inodes:
                        pids.add(int(proc.name))
                        break
    return pids
