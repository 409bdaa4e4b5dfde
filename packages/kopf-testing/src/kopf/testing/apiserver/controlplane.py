"""
:class:`KubernetesControlPlane`: a real etcd and kube-apiserver on loopback ports, envtest-style.
"""

import asyncio
import contextlib
import http.client
import json
import logging
import os
import pathlib
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import types
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from kopf.testing.apiserver import pki
from kopf.testing.apiserver.assets import KubeAssets, find_assets
from kopf.testing.apiserver.errors import (
    BinariesNotFoundError,
    ControlPlaneError,
    PortInUseError,
    ProcessExitedError,
    StartTimeoutError,
)
from kopf.testing.apiserver.processes import ManagedProcess, Reaper

__all__ = ['KubernetesControlPlane']

logger = logging.getLogger('kopf.testing.apiserver')

HOST = '127.0.0.1'
NAME = 'kopf-control-plane'
ADMIN_USER = 'kopf-admin'
ADMIN_GROUPS = ('system:masters',)
TOKEN_CONTEXT = f'{NAME}-token'
SERVICE_CLUSTER_IP_RANGE = '10.0.0.0/24'
SERVICE_ACCOUNT_ISSUER = 'https://kubernetes.default.svc.cluster.local'
PORT_ATTEMPTS = 3  # how often to pick new free ports when another process takes one meanwhile
PROBE_INTERVAL = 0.05
_ADDRESS_IN_USE = 'address already in use'
_UNKNOWN_TOKEN_FLAG = 'unknown flag: --token-auth-file'

Args = Mapping[str, str | None] | Sequence[str]
_T = TypeVar('_T')


class KubernetesControlPlane:
    """
    A real Kubernetes control plane for tests: etcd and kube-apiserver as subprocesses on ``127.0.0.1``.

    It follows the conventions of controller-runtime's envtest: the binaries come from
    ``$KUBEBUILDER_ASSETS`` (a directory with ``etcd``, ``kube-apiserver``, ``kubectl``), or from
    explicit paths, or from the newest build of ``tools/kube-assets/build.sh`` in
    ``~/.cache/kopf/kube-assets/k8s-v*/`` (``$KOPF_KUBE_ASSETS_CACHE`` overrides that directory).
    There are no controllers, no scheduler, no nodes: objects are stored and validated, CRDs
    are served, RBAC is enforced, nothing reconciles them. The admission of service accounts is
    off (no controller creates the default service accounts), as in envtest.

    On start, it makes a temporary directory with the certificates and keys (a serving CA, a client
    CA, the admin's client certificate with ``O=system:masters``, the service-account signing key,
    a static token of the admin), etcd's data, the processes' logs, and the kubeconfig (the CA and
    the credentials embedded). It returns once ``/readyz`` says ``ok`` (as the admin) and the
    ``default`` namespace exists; :attr:`startup_duration` says how long that took. On stop, both
    processes get SIGTERM (SIGKILL after ``stop_timeout``), and the temporary directory is removed.
    If this process dies without stopping it (SIGKILL, ``os._exit()``), a watchdog process (the reaper,
    started with it) kills both and removes the temporary directory.

    Use it as a context manager (``with`` or ``async with``) or with :meth:`start`/:meth:`stop`::

        with KubernetesControlPlane() as control_plane:
            os.environ['KUBECONFIG'] = str(control_plane.kubeconfig_path)
            ...

    The failures raise :class:`ControlPlaneError` subclasses with a one-line message (plus the
    last lines of the failed process's log where they explain it); the admin's token and keys are
    never in messages or logs.
    """

    def __init__(
            self,
            assets_dir: str | os.PathLike[str] | None = None,
            *,
            etcd_path: str | os.PathLike[str] | None = None,
            kube_apiserver_path: str | os.PathLike[str] | None = None,
            kubectl_path: str | os.PathLike[str] | None = None,
            kubeconfig_path: str | os.PathLike[str] | None = None,
            work_dir: str | os.PathLike[str] | None = None,
            port: int = 0,
            etcd_port: int = 0,
            authorization_mode: str = 'RBAC',
            feature_gates: Mapping[str, bool] | None = None,
            apiserver_args: Args = (),
            etcd_args: Args = (),
            token_auth: bool = True,
            start_timeout: float = 60.0,
            stop_timeout: float = 5.0,
    ) -> None:
        """
        :param assets_dir: a directory with the binaries (else ``$KUBEBUILDER_ASSETS``, else the cache).
        :param etcd_path: the ``etcd`` binary, if not in the assets directory.
        :param kube_apiserver_path: the ``kube-apiserver`` binary, if not in the assets directory.
        :param kubectl_path: the ``kubectl`` binary (optional; only for :meth:`kubectl`).
        :param kubeconfig_path: where to write the kubeconfig (kept after stop); else in the work dir.
        :param work_dir: the directory for the keys, etcd's data and the logs; kept after stop
            (etcd's data is fresh on every start). A temporary one (removed on stop) if not given.
        :param port: kube-apiserver's secure port on ``127.0.0.1``; 0 picks a free one.
        :param etcd_port: etcd's client port on ``127.0.0.1``; 0 picks a free one.
        :param authorization_mode: kube-apiserver's ``--authorization-mode`` (e.g. ``AlwaysAllow``).
        :param feature_gates: kube-apiserver's feature gates, e.g. ``{'ShardedListAndWatch': True}``.
        :param apiserver_args: more flags of kube-apiserver: a mapping of names (without ``--``)
            to values overrides the defaults (``None`` removes a default flag); a sequence of
            ``--flag=value`` strings is appended to the command line.
        :param etcd_args: more flags of etcd, in the same forms.
        :param token_auth: also authenticate the admin by a static token (``--token-auth-file``)
            if this kube-apiserver supports it: :attr:`token` and the context ``kopf-control-plane-token``.
        :param start_timeout: seconds until the start fails with :class:`StartTimeoutError`.
        :param stop_timeout: seconds between SIGTERM and SIGKILL of each process on stop.
        """
        self._assets_dir = assets_dir
        self._binaries = {'etcd': etcd_path, 'kube_apiserver': kube_apiserver_path, 'kubectl': kubectl_path}
        self._requested_kubeconfig_path = None if kubeconfig_path is None else pathlib.Path(kubeconfig_path)
        self._requested_work_dir = pathlib.Path(work_dir) if work_dir is not None else None
        self._requested_port = port
        self._requested_etcd_port = etcd_port
        self.authorization_mode = authorization_mode
        self.feature_gates = dict(feature_gates or {})
        self._apiserver_args = apiserver_args
        self._etcd_args = etcd_args
        self._token_auth = token_auth
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout

        self._abort = threading.Event()  # set to abort a start in progress (a cancelled `async with`)
        self._resources: _Resources | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._assets: KubeAssets | None = None
        self._work_dir: pathlib.Path | None = None
        self._kubeconfig_path: pathlib.Path | None = None
        self._kubeconfig: dict[str, Any] | None = None
        self._client_ca: pki.CertificateAuthority | None = None
        self._admin: pki.KeyPair | None = None
        self._token: str | None = None
        self._port: int | None = None
        self._etcd_port: int | None = None
        self._version: str | None = None
        self.startup_duration: float | None = None
        """Seconds from :meth:`start` until ready (``None`` until started)."""

    # ----------------------------------------------------------------------------------------
    # What the tests use.

    @property
    def running(self) -> bool:
        return self._resources is not None

    @property
    def assets(self) -> KubeAssets:
        """The binaries in use (found on start)."""
        return self._started(self._assets)

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        """kube-apiserver's secure port."""
        return self._started(self._port)

    @property
    def url(self) -> str:
        """kube-apiserver's URL: ``https://127.0.0.1:PORT``."""
        return f'https://{HOST}:{self.port}'

    @property
    def etcd_port(self) -> int:
        return self._started(self._etcd_port)

    @property
    def etcd_url(self) -> str:
        return f'http://{HOST}:{self.etcd_port}'

    @property
    def work_dir(self) -> pathlib.Path:
        """The directory of the keys, etcd's data, and the logs."""
        return self._started(self._work_dir)

    @property
    def kubeconfig_path(self) -> pathlib.Path:
        """The kubeconfig of the admin (the CA and the credentials embedded), written on start."""
        return self._started(self._kubeconfig_path)

    @property
    def kubeconfig(self) -> dict[str, Any]:
        """The content of the kubeconfig, as a dict."""
        return self._started(self._kubeconfig)

    @property
    def ca_path(self) -> pathlib.Path:
        """The CA of the serving certificate (PEM): what clients must trust."""
        return self.work_dir / 'pki' / 'ca.crt'

    @property
    def client_ca_path(self) -> pathlib.Path:
        """The CA of the client certificates (kube-apiserver's ``--client-ca-file``)."""
        return self.work_dir / 'pki' / 'client-ca.crt'

    @property
    def client_cert_path(self) -> pathlib.Path:
        """The admin's client certificate (PEM; ``O=system:masters``)."""
        return self.work_dir / 'pki' / 'admin.crt'

    @property
    def client_key_path(self) -> pathlib.Path:
        """The admin's private key (PEM)."""
        return self.work_dir / 'pki' / 'admin.key'

    @property
    def token(self) -> str | None:
        """The admin's bearer token (``system:masters``), or ``None`` if static tokens are off."""
        self._started(self._kubeconfig)
        return self._token

    @property
    def apiserver_log_path(self) -> pathlib.Path:
        return self.work_dir / 'kube-apiserver.log'

    @property
    def etcd_log_path(self) -> pathlib.Path:
        return self.work_dir / 'etcd.log'

    @property
    def version(self) -> str:
        """kube-apiserver's version, as its ``/version`` says (e.g. ``v1.37.2``)."""
        return self._started(self._version)

    def add_user(
            self,
            name: str,
            groups: Sequence[str] = (),
            *,
            kubeconfig_path: str | os.PathLike[str] | None = None,
    ) -> pathlib.Path:
        """
        Issue a client certificate of a user in groups; return the path of a kubeconfig for them.

        The user has no permissions until RBAC grants them some (unless in ``system:masters``).
        The kubeconfig is written to ``kubeconfig_path`` or to ``users/NAME.kubeconfig`` in the work dir.
        """
        client_ca = self._started(self._client_ca)
        pair = client_ca.issue_client_certificate(name, groups)
        kubeconfig = pki.build_kubeconfig(
            url=self.url, ca_pem=self.ca_path.read_bytes(), name=NAME,
            users={name: pki.user_with_certificate(pair)}, current_user=name,
        )
        path = (pathlib.Path(kubeconfig_path) if kubeconfig_path is not None
                else self.work_dir / 'users' / f'{_safe_file_name(name)}.kubeconfig')
        pki.write_private_file(path, pki.dump_kubeconfig(kubeconfig))
        return path

    def kubectl(
            self,
            *args: str,
            check: bool = True,
            input: str | None = None,
            timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl --kubeconfig=... ARGS`` as the admin; its output is captured (text)."""
        kubectl = self.assets.kubectl
        if kubectl is None:
            raise BinariesNotFoundError(
                f'No kubectl in {self.assets.source}; '
                f'give kubectl_path=, or put kubectl next to kube-apiserver.'
            )
        return subprocess.run(
            [str(kubectl), f'--kubeconfig={self.kubeconfig_path}', *args],
            check=check, input=input, capture_output=True, text=True, timeout=timeout,
        )

    def check_alive(self) -> None:
        """Raise :class:`ProcessExitedError` if etcd or kube-apiserver exited since the start."""
        resources = self._started(self._resources)
        redact = [self._token] if self._token else []
        for process in resources.processes:
            exit_code = process.exit_code
            if exit_code is not None:
                tail = process.tail(redact=redact)
                raise ProcessExitedError(
                    f'{process.name} exited unexpectedly with {_describe_exit(exit_code)}; '
                    f'its last lines ({process.log_path}):{_indented(tail)}',
                    process_name=process.name, exit_code=exit_code, log_path=process.log_path,
                    log_tail=tail,
                )

    # ----------------------------------------------------------------------------------------
    # Starting & stopping.

    def start(self) -> None:
        """Start etcd and kube-apiserver; return once ready (or raise :class:`ControlPlaneError`)."""
        if self._resources is not None:
            raise RuntimeError('The control plane is already running.')
        started_at = time.monotonic()
        assets = find_assets(
            self._assets_dir,
            etcd=self._binaries['etcd'],
            kube_apiserver=self._binaries['kube_apiserver'],
            kubectl=self._binaries['kubectl'],
        )
        for port, name in [(self._requested_port, 'kube-apiserver'), (self._requested_etcd_port, 'etcd')]:
            if port and not _is_port_free(port):
                raise PortInUseError(
                    f'The port {HOST}:{port} for {name} is taken by another process.', port=port,
                )

        if self._requested_work_dir is not None:
            work_dir = self._requested_work_dir
            work_dir.mkdir(parents=True, exist_ok=True)
            temporary = False
        else:
            work_dir = pathlib.Path(tempfile.mkdtemp(prefix='kopf-control-plane-'))
            temporary = True
        resources = _Resources(work_dir if temporary else None)
        finalizer = weakref.finalize(self, resources.close, 0.0)  # the last resort at the interpreter's exit
        try:
            self._assets, self._work_dir = assets, work_dir
            self._prepare_credentials(work_dir)
            self._run_processes(assets, work_dir, resources, deadline=started_at + self.start_timeout)
            self._write_kubeconfig(work_dir)
        except BaseException:
            finalizer()
            self._forget()
            raise
        self._resources, self._finalizer = resources, finalizer
        self.startup_duration = time.monotonic() - started_at
        logger.info(
            'The Kubernetes control plane (%s) is ready at %s in %.2f s; kubeconfig: %s',
            self._version, self.url, self.startup_duration, self._kubeconfig_path,
        )

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd (SIGTERM, then SIGKILL); remove the temporary directory."""
        resources, finalizer = self._resources, self._finalizer
        if resources is None or finalizer is None:
            return
        try:
            if finalizer.detach() is not None:
                resources.close(self.stop_timeout)
        finally:
            self._forget()

    def restart_apiserver(self, downtime: float = 0.0) -> None:
        """
        Stop kube-apiserver and start it again on the same port with the same etcd; return once ready.

        As a rolling restart or an upgrade of a cluster's API server: the connections and the watch
        streams break, the requests are refused meanwhile (for ``downtime`` seconds after the
        exit, plus the start-up, ~2 s), and the clients reconnect to the same URL with the same
        kubeconfig and credentials; etcd keeps running, so the objects, their resourceVersions and
        the watch history stay. kube-apiserver gets SIGTERM (and SIGKILL after ``stop_timeout``);
        its log goes on in the same file. The failures are as in :meth:`start`
        (:class:`ProcessExitedError`, :class:`StartTimeoutError`, :class:`PortInUseError` if
        another process has taken the port meanwhile); the control plane stays running (etcd)
        until :meth:`stop`. Blocking: ``await asyncio.to_thread(control_plane.restart_apiserver)``
        in async code.
        """
        resources = self._started(self._resources)
        apiserver, etcd = resources.processes  # in the order of stopping
        resources.stop_process(apiserver, self.stop_timeout)
        time.sleep(downtime)
        restarted = ManagedProcess(
            apiserver.name, apiserver.command, log_path=apiserver.log_path, cwd=self.work_dir,
            env=_environment(),
        )
        resources.processes[0] = restarted
        with restarted.log_path.open('ab') as log:  # what follows is the new process's
            log.write(b'--- kube-apiserver restarted by KubernetesControlPlane.restart_apiserver() ---\n')
        resources.start_process(restarted)
        try:
            self._wait_until_ready(etcd, restarted, deadline=time.monotonic() + self.start_timeout)
        except _PortTaken as e:
            resources.stop_process(restarted, self.stop_timeout)
            raise PortInUseError(
                f'kube-apiserver could not listen again on {HOST}:{self.port}: the port was taken by '
                f'another process meanwhile; its last lines ({e.process.log_path}):{_indented(e.tail)}',
                port=self.port,
            ) from None
        logger.info('kube-apiserver restarted at %s (etcd kept).', self.url)

    def __enter__(self) -> 'KubernetesControlPlane':
        self.start()
        return self

    def __exit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            traceback: types.TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> 'KubernetesControlPlane':
        self._abort.clear()
        starting = asyncio.ensure_future(asyncio.to_thread(self.start))
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            # The thread cannot be interrupted, but it notices the abort within one probe interval.
            self._abort.set()
            await asyncio.wait([starting])
            self._abort.clear()  # for the next start
            if not starting.cancelled() and starting.exception() is None:  # ready just before the abort
                await asyncio.to_thread(self.stop)
            raise
        return self

    async def __aexit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            traceback: types.TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    # ----------------------------------------------------------------------------------------
    # The insides of starting.

    @staticmethod
    def _started(value: _T | None) -> _T:
        if value is None:
            raise RuntimeError('The control plane is not started.')
        return value

    def _forget(self) -> None:
        # The addresses, paths and the kubeconfig stay for the looks after stop; the CA's key goes.
        self._resources = self._finalizer = None
        self._client_ca = self._admin = None

    def _prepare_credentials(self, work_dir: pathlib.Path) -> None:
        pki_dir = work_dir / 'pki'
        serving_ca = pki.CertificateAuthority.generate(f'{NAME}-ca')
        client_ca = pki.CertificateAuthority.generate(f'{NAME}-client-ca')
        serving = serving_ca.issue_serving_certificate(
            'kube-apiserver',
            dns_names=['localhost', 'kubernetes', 'kubernetes.default', 'kubernetes.default.svc',
                       'kubernetes.default.svc.cluster.local'],
            ip_addresses=[HOST, '10.0.0.1'],  # the address of the `kubernetes` service, too
        )
        admin = client_ca.issue_client_certificate(ADMIN_USER, ADMIN_GROUPS)
        service_accounts = pki.make_service_account_keys()
        files: dict[str, bytes] = {
            'ca.crt': serving_ca.cert_pem,
            'serving.crt': serving.cert_pem + serving_ca.cert_pem,
            'serving.key': serving.key_pem,
            'client-ca.crt': client_ca.cert_pem,
            'admin.crt': admin.cert_pem,
            'admin.key': admin.key_pem,
            'service-account.key': service_accounts.private_pem,
            'service-account.pub': service_accounts.public_pem,
        }
        self._token = pki.make_token() if self._token_auth else None
        if self._token is not None:
            entries = [(self._token, ADMIN_USER, ADMIN_USER, ADMIN_GROUPS)]
            files['tokens.csv'] = pki.format_token_file(entries).encode()
        for name, content in files.items():
            pki.write_private_file(pki_dir / name, content)
        self._client_ca = client_ca
        self._admin = admin

    def _write_kubeconfig(self, work_dir: pathlib.Path) -> None:
        users = {NAME: pki.user_with_certificate(self._started(self._admin))}
        if self._token is not None:
            users[TOKEN_CONTEXT] = {'token': self._token}
        self._kubeconfig = pki.build_kubeconfig(
            url=self.url, ca_pem=self.ca_path.read_bytes(), name=NAME, users=users, current_user=NAME,
        )
        path = self._requested_kubeconfig_path or work_dir / 'kubeconfig'
        pki.write_private_file(path, pki.dump_kubeconfig(self._kubeconfig))
        self._kubeconfig_path = path

    def _run_processes(
            self, assets: KubeAssets, work_dir: pathlib.Path, resources: '_Resources', *, deadline: float,
    ) -> None:
        attempt = 1
        while True:
            etcd_port, peer_port, port = _pick_ports(self._requested_etcd_port, self._requested_port)
            self._etcd_port, self._port = etcd_port, port
            etcd_dir = work_dir / 'etcd'
            shutil.rmtree(etcd_dir, ignore_errors=True)  # fresh data on every start
            etcd = ManagedProcess(
                'etcd', [str(assets.etcd), *self._etcd_command(etcd_dir, etcd_port, peer_port)],
                log_path=work_dir / 'etcd.log', cwd=work_dir, env=_environment(),
            )
            apiserver = ManagedProcess(
                'kube-apiserver', [str(assets.kube_apiserver), *self._apiserver_command(work_dir)],
                log_path=work_dir / 'kube-apiserver.log', cwd=work_dir, env=_environment(),
            )
            resources.processes[:] = [apiserver, etcd]  # in the order of stopping
            for process in (etcd, apiserver):
                process.log_path.write_bytes(b'')  # a fresh log per attempt: its tail is about this start
                resources.start_process(process)
            try:
                self._wait_until_ready(etcd, apiserver, deadline=deadline)
                return
            except _PortTaken as e:
                resources.stop_processes(self.stop_timeout)
                given = {'etcd': self._requested_etcd_port, 'kube-apiserver': self._requested_port}
                if given.get(e.process.name) or attempt >= PORT_ATTEMPTS:
                    raise PortInUseError(
                        f'{e.process.name} could not listen: a port is taken by another process '
                        f'(kube-apiserver {HOST}:{port}, etcd {HOST}:{etcd_port}, '
                        f'etcd peers {HOST}:{peer_port});'
                        f' its last lines ({e.process.log_path}):{_indented(e.tail)}',
                        port=port if e.process.name == 'kube-apiserver' else etcd_port,
                    ) from None
                logger.debug('A port of %s was taken meanwhile; picking new ports.', e.process.name)
                attempt += 1
            except _UnknownTokenFlag:
                # A release without static tokens: the admin's client certificate is enough.
                resources.stop_processes(self.stop_timeout)
                self._token = None
                (work_dir / 'pki' / 'tokens.csv').unlink(missing_ok=True)

    def _etcd_command(self, data_dir: pathlib.Path, port: int, peer_port: int) -> list[str]:
        client_url, peer_url = f'http://{HOST}:{port}', f'http://{HOST}:{peer_port}'
        defaults: dict[str, str | None] = {
            'name': 'default',
            'data-dir': str(data_dir),
            'listen-client-urls': client_url,
            'advertise-client-urls': client_url,
            'listen-peer-urls': peer_url,
            'initial-advertise-peer-urls': peer_url,
            'initial-cluster': f'default={peer_url}',
            'unsafe-no-fsync': 'true',  # test data: durability costs start-up time and nothing else
        }
        return _flags(defaults, self._etcd_args)

    def _apiserver_command(self, work_dir: pathlib.Path) -> list[str]:
        pki_dir = work_dir / 'pki'
        defaults: dict[str, str | None] = {
            'advertise-address': HOST,
            'bind-address': HOST,
            'secure-port': str(self._port),
            'etcd-servers': f'http://{HOST}:{self._etcd_port}',
            'cert-dir': str(pki_dir),
            'tls-cert-file': str(pki_dir / 'serving.crt'),
            'tls-private-key-file': str(pki_dir / 'serving.key'),
            'client-ca-file': str(pki_dir / 'client-ca.crt'),
            'token-auth-file': str(pki_dir / 'tokens.csv') if self._token is not None else None,
            'service-account-issuer': SERVICE_ACCOUNT_ISSUER,
            'service-account-key-file': str(pki_dir / 'service-account.pub'),
            'service-account-signing-key-file': str(pki_dir / 'service-account.key'),
            'service-cluster-ip-range': SERVICE_CLUSTER_IP_RANGE,
            'authorization-mode': self.authorization_mode,
            'allow-privileged': 'true',
            # A loopback address cannot be the `kubernetes` service's endpoint; nothing needs it here.
            'endpoint-reconciler-type': 'none',
            'disable-admission-plugins': 'ServiceAccount',  # no controller makes the default accounts
        }
        if self.feature_gates:
            defaults['feature-gates'] = ','.join(
                f'{name}={str(bool(enabled)).lower()}' for name, enabled in self.feature_gates.items()
            )
        return _flags(defaults, self._apiserver_args)

    def _wait_until_ready(self, etcd: ManagedProcess, apiserver: ManagedProcess, *, deadline: float) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_path))
        context.load_cert_chain(str(self.client_cert_path), str(self.client_key_path))
        problem = 'kube-apiserver does not listen yet'
        redact = [self._token] if self._token else []
        while True:
            for process in (etcd, apiserver):
                exit_code = process.exit_code
                if exit_code is not None:
                    tail = process.tail(redact=redact)
                    if any(_ADDRESS_IN_USE in line for line in tail):
                        raise _PortTaken(process, tail)
                    if process is apiserver and any(_UNKNOWN_TOKEN_FLAG in line for line in tail):
                        raise _UnknownTokenFlag()
                    raise ProcessExitedError(
                        f'{process.name} exited at start with {_describe_exit(exit_code)}; '
                        f'its last lines ({process.log_path}):{_indented(tail)}',
                        process_name=process.name, exit_code=exit_code, log_path=process.log_path,
                        log_tail=tail,
                    )
            remaining = deadline - time.monotonic()
            if remaining > 0:
                ready, problem = self._check_readiness(context, timeout=min(remaining, 5.0))
                if ready:
                    return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                tail = apiserver.tail(redact=redact)
                raise StartTimeoutError(
                    f'The Kubernetes control plane was not ready in {self.start_timeout:g} s ({problem}); '
                    f'kube-apiserver\'s last lines ({apiserver.log_path}):{_indented(tail)}',
                    timeout=self.start_timeout, log_tail=tail,
                )
            if self._abort.wait(min(PROBE_INTERVAL, remaining)):
                raise ControlPlaneError('The start of the Kubernetes control plane was aborted.')

    def _check_readiness(self, context: ssl.SSLContext, *, timeout: float) -> tuple[bool, str]:
        """Ready or not, and why not: ``/readyz`` is ok, the ``default`` namespace exists."""
        status, body = _get(context, self._port or 0, '/readyz?verbose', timeout=timeout)
        if status is None:
            return False, f'/readyz: {body}'
        if status != 200:
            failed = [line.strip() for line in body.splitlines() if line.startswith('[-]')]
            return False, f'/readyz: HTTP {status}: {", ".join(failed) or body.strip()[:200]}'
        # The system namespaces are made by a controller soon after ready: the tests need `default`.
        status, body = _get(context, self._port or 0, '/api/v1/namespaces/default', timeout=timeout)
        if status != 200:
            return False, f'the default namespace: {f"HTTP {status}" if status else body}'
        status, body = _get(context, self._port or 0, '/version', timeout=timeout)
        if status != 200:
            return False, f'/version: {f"HTTP {status}" if status else body}'
        try:
            self._version = str(json.loads(body)['gitVersion'])
        except (ValueError, KeyError, TypeError):
            self._version = 'unknown'
        return True, 'ready'


class _Resources:
    """
    What a running control plane holds: stopped by :meth:`KubernetesControlPlane.stop` or at exit.

    If this process dies without either (SIGKILL, a crash), its reaper stops the processes and removes
    the temporary directory.
    """

    def __init__(self, temporary_dir: pathlib.Path | None) -> None:
        self.temporary_dir = temporary_dir
        self.processes: list[ManagedProcess] = []
        self.reaper = Reaper(temporary_dir)
        self.reaper.start()

    def start_process(self, process: ManagedProcess) -> None:
        process.start()
        self.reaper.watch(process)

    def stop_process(self, process: ManagedProcess, timeout: float) -> None:
        try:
            if timeout > 0:
                process.stop(timeout)  # SIGKILLed even if interrupted while waiting
            else:
                process.kill()
        finally:
            self.reaper.unwatch(process)  # its group id may belong to another process from now on

    def stop_processes(self, timeout: float) -> None:
        try:
            for process in self.processes:  # kube-apiserver first: it needs etcd while it stops
                self.stop_process(process, timeout)
        finally:
            for process in self.processes:
                self.stop_process(process, 0)  # if interrupted meanwhile; a no-op for the stopped ones

    def close(self, timeout: float) -> None:
        try:
            self.stop_processes(timeout)
        finally:
            try:
                if self.temporary_dir is not None:
                    shutil.rmtree(self.temporary_dir, ignore_errors=True)
            finally:
                self.reaper.close()


class _PortTaken(Exception):
    def __init__(self, process: ManagedProcess, tail: list[str]) -> None:
        super().__init__(process.name)
        self.process = process
        self.tail = tail


class _UnknownTokenFlag(Exception):
    pass


def _flags(defaults: Mapping[str, str | None], extra: Args) -> list[str]:
    if isinstance(extra, Mapping):
        merged = {**defaults, **{name.removeprefix('--'): value for name, value in extra.items()}}
        appended: list[str] = []
    elif isinstance(extra, str):
        raise TypeError(f'The extra arguments must be a mapping or a sequence of strings, not {extra!r}.')
    else:
        merged, appended = dict(defaults), list(extra)
    return [f'--{name}={value}' for name, value in merged.items() if value is not None] + appended


def _pick_ports(etcd_port: int, apiserver_port: int) -> tuple[int, int, int]:
    """Free ports for etcd's clients & peers and for kube-apiserver (distinct: all held while picking)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for given in (etcd_port, 0, apiserver_port):
            if given:
                ports.append(given)
                continue
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            ports.append(sock.getsockname()[1])
    return ports[0], ports[1], ports[2]


def _is_port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's listeners do
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _get(context: ssl.SSLContext, port: int, path: str, *, timeout: float) -> tuple[int | None, str]:
    """A GET as the admin: the status and the body, or ``None`` and what went wrong."""
    connection = http.client.HTTPSConnection(HOST, port, context=context, timeout=timeout)
    try:
        connection.request('GET', path)
        response = connection.getresponse()
        return response.status, response.read(64 * 1024).decode('utf-8', errors='replace')
    except ConnectionRefusedError:
        return None, 'connection refused'
    except (OSError, http.client.HTTPException) as e:
        return None, f'{type(e).__name__}: {e}'
    finally:
        connection.close()


def _environment() -> dict[str, str]:
    # etcd refuses to start if its ETCD_* variables conflict with the flags given here.
    return {name: value for name, value in os.environ.items() if not name.startswith('ETCD_')}


def _describe_exit(exit_code: int) -> str:
    return f'signal {-exit_code}' if exit_code < 0 else f'code {exit_code}'


def _indented(lines: Sequence[str]) -> str:
    return ''.join(f'\n    {line}' for line in lines) if lines else ' (none)'


def _safe_file_name(name: str) -> str:
    return ''.join(char if char.isalnum() or char in '-_.' else '_' for char in name)

