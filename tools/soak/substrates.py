"""
The API servers the soak runs on (``--api``), and the driver's connection to them by a kubeconfig.

- ``emulator`` (the default): :class:`kopf.testing.KubernetesEmulator`, served in the soak's own
  event loop; the soak injects API faults through its hooks and restarts it (state kept).
- ``control-plane``: :class:`kopf.testing.KubernetesControlPlane`, a real etcd and kube-apiserver
  (the binaries of ``$KUBEBUILDER_ASSETS``, or the build cache), over HTTPS with the admin's token.
  What the emulator's hooks do cannot be done to a real server, and there is no
  kube-controller-manager: each difference is a :attr:`Substrate.limitations` line (printed at
  the start) and the invariants it makes meaningless are :attr:`Substrate.not_applicable`.

The driver talks to either only through the kubeconfig that the operator gets (its server, its
CA and its credentials): :class:`Connection`.
"""

import asyncio
import base64
import pathlib
import secrets
import ssl
import types
from collections.abc import Mapping
from typing import Any

import yaml

from kopf.testing.apiserver import KubernetesControlPlane
from kopf.testing.emulator import KubernetesEmulator

API_CHOICES = ('emulator', 'control-plane')

# The invariants that a substrate can make meaningless (their names as printed by the checks).
NAMESPACE_INVARIANTS = ('objects in deleted namespaces handled and released', 'deleted namespaces fully gone')


class Substrate:
    """An API server under the soak: started & stopped, restarted, and what it cannot do."""

    name: str
    restarted: str  # what its restarts restart, for the printouts: 'emulator', 'kube-apiserver'
    injects_faults: bool  # the emulator's fault hooks (500/503, dropped watches, 410, 429, latency)
    deletes_namespaces: bool  # whether a deleted namespace goes (with its objects) without our help
    limitations: tuple[str, ...] = ()  # what is replaced or left out, one line each
    operator_backoffs: str | None = None  # the operator's error_backoffs (comma-separated), if not its own
    not_applicable: Mapping[str, str] = types.MappingProxyType({})  # invariant name -> why

    def __init__(self, workdir: pathlib.Path) -> None:
        self.workdir = workdir
        self.token = ''  # the operator's bearer token: it must never appear in the logs or events

    async def __aenter__(self) -> 'Substrate':
        raise NotImplementedError

    async def __aexit__(self, *exc_info: object) -> None:
        raise NotImplementedError

    @property
    def description(self) -> str:
        raise NotImplementedError

    def operator_kubeconfig(self) -> dict[str, Any]:
        """The kubeconfig of the operator (and of the driver): the server, its CA, a bearer token."""
        raise NotImplementedError

    async def restart(self, downtime: float) -> None:
        raise NotImplementedError


class EmulatorSubstrate(Substrate):
    name = 'emulator'
    restarted = 'emulator'
    injects_faults = True
    deletes_namespaces = True

    def __init__(self, workdir: pathlib.Path, *, namespaces: tuple[str, ...]) -> None:
        super().__init__(workdir)
        self.token = f'soak-token-{secrets.token_hex(16)}'  # the emulator accepts any
        self.emulator = KubernetesEmulator(namespaces=('default', 'kube-system', *namespaces),
                                           kubeconfig_path=workdir / 'emulator.kubeconfig')

    async def __aenter__(self) -> 'EmulatorSubstrate':
        await self.emulator.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.emulator.stop()

    @property
    def description(self) -> str:
        return f'the emulator at {self.emulator.url}'

    def operator_kubeconfig(self) -> dict[str, Any]:
        config: dict[str, Any] = yaml.safe_load(self.emulator.kubeconfig_path.read_text())
        for user in config['users']:
            user['user'] = {'token': self.token}
        return config

    async def restart(self, downtime: float) -> None:
        await self.emulator.restart(downtime=downtime)


# The writes of the soak's objects (their bodies both ways), nothing else (the reads and watches are many).
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: RequestResponse
  verbs: [create, update, patch, delete, deletecollection]
  resources: [{group: soak.kopf.dev, resources: [soakobjects, soakobjects/status]}]
- level: None
"""


class ControlPlaneSubstrate(Substrate):
    name = 'control-plane'
    restarted = 'kube-apiserver'
    injects_faults = False
    deletes_namespaces = False
    limitations = (
        'no injected API faults (500/503, dropped or aborted watch streams, 410 Gone after a compaction, '
        '429 with Retry-After, latency spikes): a real server has no hooks for them; replaced by more '
        'restarts of kube-apiserver (stopped and started on the same port with the same etcd: the '
        'connections and watches break, the requests are refused meanwhile, the state stays); the '
        'concurrent status writer (409 conflicts) and the SIGKILL/SIGTERM/SIGINT of the operator stay',
        'no namespace churn: there is no kube-controller-manager, so a deleted namespace stays '
        'Terminating forever (nothing deletes its objects nor finalizes it); the short-lived '
        'namespaces are not made, and their invariants are not applicable',
        'longer request retries of the operator (0.2 ... 13 s, 34 s in all, instead of 4.7 s): a restart '
        'of kube-apiserver refuses the connections for 3-10 s (its graceful stop, the downtime, its '
        'start; longer on a busy machine), the emulator\'s for 0.2-1.5 s',
    )
    operator_backoffs = '0.2,0.5,1,1,2,3,5,8,13'
    not_applicable = types.MappingProxyType(dict.fromkeys(
        NAMESPACE_INVARIANTS,
        'no namespace churn here (no namespace controller: deleted namespaces stay Terminating)',
    ))

    def __init__(self, workdir: pathlib.Path) -> None:
        super().__init__(workdir)
        # The writes to the soak's objects are audited with their bodies (``audit.jsonl`` in the workdir):
        # the server's own order of the operator's and the status writer's requests, when an invariant fails.
        audit_policy = workdir / 'audit-policy.yaml'
        audit_policy.write_text(AUDIT_POLICY)
        # On SIGTERM, kube-apiserver stops listening at once, but waits for the open watches to end
        # (by default, as long as their request timeout): it would be SIGKILLed after the stop timeout
        # (5 s) on every restart. Here, it closes them after 1 s and exits, as in a rolling restart.
        self.control_plane = KubernetesControlPlane(
            work_dir=workdir / 'control-plane',
            apiserver_args={'shutdown-watch-termination-grace-period': '1s',
                            'audit-policy-file': str(audit_policy),
                            'audit-log-path': str(workdir / 'audit.jsonl'),
                            'audit-log-format': 'json',
                            'audit-log-mode': 'batch'},
        )

    async def __aenter__(self) -> 'ControlPlaneSubstrate':
        await self.control_plane.__aenter__()
        if self.control_plane.token is None:
            await self.control_plane.__aexit__(None, None, None)
            raise RuntimeError(f'This kube-apiserver ({self.control_plane.version}) has no static tokens: '
                               f'the soak needs a bearer token to check that it never leaks.')
        self.token = self.control_plane.token
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.control_plane.__aexit__(None, None, None)

    @property
    def description(self) -> str:
        cp = self.control_plane
        return (f'a real control plane: kube-apiserver {cp.version} at {cp.url} (started in '
                f'{cp.startup_duration or 0:.1f} s; binaries of {cp.assets.source}; '
                f'logs in {cp.work_dir})')

    def operator_kubeconfig(self) -> dict[str, Any]:
        """The control plane's kubeconfig with only its token's context: no client certificate."""
        config: dict[str, Any] = yaml.safe_load(self.control_plane.kubeconfig_path.read_text())
        token_users = [user for user in config['users'] if user['user'].get('token') == self.token]
        names = {user['name'] for user in token_users}
        config['users'] = token_users
        config['contexts'] = [ctx for ctx in config['contexts'] if ctx['context']['user'] in names]
        config['current-context'] = config['contexts'][0]['name']
        return config

    async def restart(self, downtime: float) -> None:
        await asyncio.to_thread(self.control_plane.restart_apiserver, downtime)


def make_substrate(api: str, workdir: pathlib.Path, *, namespaces: tuple[str, ...]) -> Substrate:
    if api == 'emulator':
        return EmulatorSubstrate(workdir, namespaces=namespaces)
    if api == 'control-plane':
        return ControlPlaneSubstrate(workdir)
    raise ValueError(f'Unknown API server {api!r}: one of {", ".join(API_CHOICES)}.')


class Connection:
    """The server, its trust and the credentials of a kubeconfig's current context, for aiohttp."""

    def __init__(self, kubeconfig: Mapping[str, Any], *, workdir: pathlib.Path) -> None:
        contexts = {context['name']: context['context'] for context in kubeconfig.get('contexts', [])}
        clusters = {cluster['name']: cluster['cluster'] for cluster in kubeconfig.get('clusters', [])}
        users = {user['name']: user.get('user') or {} for user in kubeconfig.get('users', [])}
        context = contexts[kubeconfig['current-context']]
        cluster, user = clusters[context['cluster']], users.get(context.get('user', ''), {})
        self.url: str = cluster['server'].rstrip('/')
        self.headers: dict[str, str] = {}
        if user.get('token'):
            self.headers['Authorization'] = f'Bearer {user["token"]}'
        self.ssl: ssl.SSLContext | bool = True
        if self.url.startswith('https://'):
            if cluster.get('insecure-skip-tls-verify'):
                context_ = ssl.create_default_context()
                context_.check_hostname = False
                context_.verify_mode = ssl.CERT_NONE
            elif cluster.get('certificate-authority-data'):
                ca = base64.b64decode(cluster['certificate-authority-data']).decode()
                context_ = ssl.create_default_context(cadata=ca)
            else:
                context_ = ssl.create_default_context(cafile=cluster.get('certificate-authority'))
            cert, key = user.get('client-certificate-data'), user.get('client-key-data')
            if cert and key:  # ssl loads them from files only: private files in the work directory
                cert_path, key_path = workdir / 'driver-client.crt', workdir / 'driver-client.key'
                for path, data in [(cert_path, cert), (key_path, key)]:
                    path.touch(mode=0o600)
                    path.write_bytes(base64.b64decode(data))
                context_.load_cert_chain(cert_path, key_path)
            elif user.get('client-certificate') and user.get('client-key'):
                context_.load_cert_chain(user['client-certificate'], user['client-key'])
            self.ssl = context_
