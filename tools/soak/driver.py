"""
The soak's driver: the API server, the operator's incarnations, the churn, the faults, the schedule.

Everything random comes from one ``random.Random(seed)``: the same seed gives the same plan of
objects, changes and faults (the timings of the operator and of the OS still vary from run to run).
The API server (``--api``: the emulator, serving in this process's event loop, or a real control
plane of etcd & kube-apiserver: ``tools/soak/substrates.py``) is reached by the operator and by the
driver alike through one kubeconfig; the operator runs as ``python -m kopf run`` in a
subprocess, one per incarnation, each logging to its own file in the work directory.
"""

import argparse
import asyncio
import collections
import dataclasses
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp
import yaml
from tools.soak import checks, sampling
from tools.soak.substrates import API_CHOICES, Connection, EmulatorSubstrate, Substrate, make_substrate

from kopf.testing.emulator import KubernetesEmulator

NAMESPACE = 'soak'
# The short-lived namespaces: some objects are created there, then the whole namespace is deleted.
TMP_NAMESPACE_PREFIX = 'soak-tmp-'
TMP_NAMESPACE_PATTERN = f'{TMP_NAMESPACE_PREFIX}*'
GROUP, VERSION, PLURAL = 'soak.kopf.dev', 'v1', 'soakobjects'
OPERATOR_PATH = pathlib.Path(__file__).with_name('operator.py')
EXIT_TIMEOUT = 5.0  # settings.queueing.exit_timeout of the operator
GRACE_PERIOD = 15.0  # how long a SIGTERM may take (as a pod's terminationGracePeriodSeconds would)
CRD = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': f'{PLURAL}.{GROUP}'},
    'spec': {
        'scope': 'Namespaced',
        'group': GROUP,
        'names': {'kind': 'SoakObject', 'plural': PLURAL, 'singular': 'soakobject'},
        'versions': [{
            'name': VERSION, 'served': True, 'storage': True,
            'subresources': {'status': {}},
            'schema': {'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}},
        }],
    },
}


@dataclasses.dataclass(frozen=True)
class Profile:
    duration: float  # seconds of churn and faults
    objects: int  # objects created over the run
    settle: float  # at most this long for the operator to catch up after the churn
    warmup: float  # how long the last incarnation runs before its memory is taken as the baseline
    tmp_namespaces: int  # short-lived namespaces opened over the run (each deleted with its objects)
    # The lifecycle events, as fractions of the duration: (when, what).
    events: tuple[tuple[float, str], ...]
    # More restarts of the API server where its faults cannot be injected (a real kube-apiserver).
    extra_restarts: tuple[float, ...] = ()
    known_failures: frozenset[str] = frozenset()


def _periodic_events(duration: float, *, restart_period: float = 420) -> tuple[tuple[float, str], ...]:
    """The long runs' events: SIGKILL every 3 min, SIGTERM every 5, SIGINT every 11, API restart every 7."""
    events: list[tuple[float, str]] = []
    periods = [(180, 'sigkill'), (300, 'sigterm'), (660, 'sigint'), (restart_period, 'api-restart')]
    for period, what in periods:
        moment = period * 0.5
        while moment < duration * 0.7:
            events.append((moment / duration, what))
            moment += period
    events.append((0.72, 'sigkill'))  # the last incarnation: the one whose memory is measured
    return tuple(sorted(events))


PROFILES: dict[str, Profile] = {
    'short': Profile(
        duration=45, objects=60, settle=40, warmup=8, tmp_namespaces=3,
        events=((0.25, 'sigkill'), (0.40, 'sigterm'), (0.47, 'sigint'), (0.55, 'api-restart'),
                (0.62, 'sigkill')),
        extra_restarts=(0.15,),
    ),
    'long': Profile(duration=1800, objects=1000, settle=180, warmup=60, tmp_namespaces=20, events=()),
}


@dataclasses.dataclass
class Incarnation:
    """One run of the operator's process."""

    number: int
    popen: subprocess.Popen[bytes]
    log_path: pathlib.Path
    debug: bool
    started_at: float
    ended_by: str = ''  # sigkill, sigterm, or '' while running
    signal_sent_at: float | None = None
    exited_at: float | None = None
    exit_code: int | None = None


@dataclasses.dataclass
class World:
    """What the driver did, as the truth to compare the operator's journal with."""

    created: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # name -> its spec
    deleted: set[str] = dataclasses.field(default_factory=set)
    stubborn: set[str] = dataclasses.field(default_factory=set)  # never succeed the creation
    namespace_of: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> its namespace
    # The short-lived namespaces: name -> the objects created there; and those deleted (with their objects).
    tmp_namespaces: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    deleted_namespaces: set[str] = dataclasses.field(default_factory=set)
    deleted_with_namespace: set[str] = dataclasses.field(default_factory=set)  # objects, by the cascade
    # Just created or deleted: the operator is about to write their finalizers (guarded by resourceVersion).
    recent: collections.deque[str] = dataclasses.field(default_factory=lambda: collections.deque(maxlen=4))
    updates: int = 0
    writes_by_writer: int = 0
    conflicts_seen_by_writer: int = 0
    kills: list[tuple[float, int]] = dataclasses.field(default_factory=list)  # (when, pid)
    faults: dict[str, int] = dataclasses.field(default_factory=dict)
    api_restarts: int = 0

    def count_fault(self, kind: str, amount: int = 1) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + amount


class Journal:
    """Reads the operator's journal file incrementally."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []  # the calls of the change handlers
        self.activities: list[dict[str, Any]] = []  # the calls of the timers & daemons (many more)
        self._offset = 0
        self._partial = b''
        self.created_ok: set[str] = set()
        self.create_attempted: set[str] = set()

    def refresh(self) -> None:
        if not self.path.exists():
            return
        with self.path.open('rb') as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b'\n')
        for line in lines:
            record = json.loads(line)
            if record['handler'] in ('timer_fn', 'daemon_fn'):
                self.activities.append(record)
                continue
            self.records.append(record)
            if record['handler'] == 'create_fn':
                self.create_attempted.add(record['object'])
                if record['outcome'] == 'ok':
                    self.created_ok.add(record['object'])


class Soak:
    def __init__(self, *, profile: Profile, duration: float, objects: int, seed: int,
                 workdir: pathlib.Path, api: str = 'emulator', sample_interval: float = 10.0) -> None:
        self.profile = profile
        self.duration = duration
        self.objects = objects
        self.seed = seed
        self.rng = random.Random(seed)
        self.errors_rng = random.Random(seed + 1)  # used at its own pace, so the main plan stays the same
        self.workdir = workdir
        self.journal = Journal(workdir / 'journal.jsonl')
        self.world = World()
        self.incarnations: list[Incarnation] = []
        self.substrate: Substrate = make_substrate(api, workdir, namespaces=(NAMESPACE,))
        # The short-lived namespaces need a namespace controller to delete their objects and finalize them.
        self.tmp_namespace_count = profile.tmp_namespaces if self.substrate.deletes_namespaces else 0
        self.kubeconfig_path = workdir / 'kubeconfig'
        self.connection: Connection | None = None
        self.session: aiohttp.ClientSession | None = None
        self.started_at = 0.0
        self.churn_over = asyncio.Event()
        self.rss_after_warmup: int | None = None
        self.rss_after_run: int | None = None
        self.sample_interval = sample_interval  # 0 for no samples
        self.samples_path = workdir / 'samples.jsonl'
        self.warmed_up_at: float | None = None  # the wall-clock time of the last incarnation's warm-up end

    @property
    def token(self) -> str:
        """The operator's bearer token: it must never appear in the logs or events."""
        return self.substrate.token

    @property
    def emulator(self) -> KubernetesEmulator:
        """The emulator, for its fault hooks (only on the emulator)."""
        assert isinstance(self.substrate, EmulatorSubstrate)
        return self.substrate.emulator

    # ------------------------------------------------------------------------------------------
    # The API, as a user with retries: the faults hit the driver's requests too.

    async def request(self, method: str, path: str, body: Any = None, *,
                      content_type: str = 'application/merge-patch+json',
                      ok_statuses: tuple[int, ...] = ()) -> tuple[int, Any]:
        """A request by the kubeconfig of the operator (its server, CA and token), retried on 429 & 5xx."""
        assert self.session is not None and self.connection is not None
        deadline = time.monotonic() + 60
        while True:
            try:
                data = json.dumps(body).encode() if body is not None else None
                headers = {'Content-Type': content_type if method == 'PATCH' else 'application/json',
                           **self.connection.headers}
                async with self.session.request(method, f'{self.connection.url}{path}', data=data,
                                                headers=headers, ssl=self.connection.ssl) as response:
                    payload = await response.json(content_type=None)
                    if response.status < 400 or response.status in ok_statuses:
                        return response.status, payload
                    if response.status not in (429, 500, 502, 503, 504) or time.monotonic() > deadline:
                        raise RuntimeError(f'{method} {path} failed: {response.status} {payload}')
            except (TimeoutError, aiohttp.ClientError):
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)

    async def list_objects(self, path: str) -> list[dict[str, Any]]:
        """All objects of a collection (e.g. cluster-wide), as the API lists them."""
        _, payload = await self.request('GET', path)
        return list(payload.get('items') or [])

    async def list_final_state(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The soak's objects in all namespaces, and the namespaces."""
        return (await self.list_objects(f'/apis/{GROUP}/{VERSION}/{PLURAL}'),
                await self.list_objects('/api/v1/namespaces'))

    async def create_crd(self) -> None:
        """The CRD, served once established (a real server takes a moment); the soak's namespace."""
        crd_path = f'/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{GROUP}'
        await self.request('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', CRD)
        deadline = time.monotonic() + 30
        while True:
            _, crd = await self.request('GET', crd_path)
            conditions = (crd.get('status') or {}).get('conditions') or []
            if any(c['type'] == 'Established' and c['status'] == 'True' for c in conditions):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f'The CRD {PLURAL}.{GROUP} is not established in 30 s: {conditions}')
            await asyncio.sleep(0.1)
        await self.request('POST', '/api/v1/namespaces', {'apiVersion': 'v1', 'kind': 'Namespace',
                                                          'metadata': {'name': NAMESPACE}},
                           ok_statuses=(409,))  # 409: the emulator has it from the start

    def object_path(self, name: str, namespace: str | None = None) -> str:
        namespace = namespace or self.world.namespace_of.get(name, NAMESPACE)
        return f'/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}'

    def collection_path(self, namespace: str) -> str:
        return f'/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}'

    # ------------------------------------------------------------------------------------------
    # The operator's incarnations.

    def start_operator(self, *, debug: bool = False) -> Incarnation:
        number = len(self.incarnations) + 1
        log_path = self.workdir / f'operator-{number}.log'
        args = [sys.executable, '-m', 'kopf', 'run', '--standalone',
                '-n', NAMESPACE, '-n', TMP_NAMESPACE_PATTERN,
                '--debug' if debug else '--verbose', str(OPERATOR_PATH)]
        env = {**os.environ, 'KUBECONFIG': str(self.kubeconfig_path),
               'SOAK_JOURNAL': str(self.journal.path), 'SOAK_EXIT_TIMEOUT': str(EXIT_TIMEOUT)}
        if self.sample_interval > 0:
            env['SOAK_TASKS'] = str(self.tasks_path(number))
            env['SOAK_TASKS_INTERVAL'] = str(max(1.0, self.sample_interval / 2))
        if self.substrate.operator_backoffs is not None:
            env['SOAK_ERROR_BACKOFFS'] = self.substrate.operator_backoffs
        with log_path.open('wb') as log:
            popen = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        incarnation = Incarnation(number, popen, log_path, debug, time.monotonic())
        self.incarnations.append(incarnation)
        flags = ', --debug' if debug else ''
        print(f'[{self.elapsed:6.1f}s] operator #{number} started (pid {popen.pid}{flags})', flush=True)
        return incarnation

    def tasks_path(self, number: int) -> pathlib.Path:
        return self.workdir / f'tasks-{number}.txt'

    def write_sample(self) -> None:
        """A JSON line of the running incarnation's RSS, fds, threads and asyncio tasks (if it runs)."""
        incarnation = self.current
        sample = sampling.sample_process(incarnation.popen.pid, self.tasks_path(incarnation.number))
        if sample is not None and incarnation.popen.poll() is None:
            with self.samples_path.open('a') as out:
                out.write(json.dumps({'time': time.time(), 'elapsed': round(self.elapsed, 1),
                                      'incarnation': incarnation.number, 'pid': incarnation.popen.pid,
                                      **sample}) + '\n')

    async def sample_periodically(self) -> None:
        while True:
            self.write_sample()
            await asyncio.sleep(self.sample_interval)

    @property
    def current(self) -> Incarnation:
        return self.incarnations[-1]

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    async def kill_operator(self) -> None:
        incarnation = self.current
        incarnation.ended_by = 'sigkill'
        incarnation.signal_sent_at = time.monotonic()
        self.world.kills.append((time.time(), incarnation.popen.pid))
        incarnation.popen.send_signal(signal.SIGKILL)
        await self._wait_exit(incarnation, within=10)
        print(f'[{self.elapsed:6.1f}s] operator #{incarnation.number} killed (SIGKILL)', flush=True)

    async def terminate_operator(self, signum: signal.Signals = signal.SIGTERM) -> None:
        """Stop the operator gracefully (as Kubernetes stops a pod, or Ctrl+C), as a process manager does."""
        incarnation = self.current
        # A signal before the operator has installed its handlers gets Python's default reaction;
        # that is not what is checked here. The operator is up once it has logged in.
        await self._wait_for_log(incarnation, 'Initial authentication has finished.', within=30)
        incarnation.ended_by = signum.name.lower()
        incarnation.signal_sent_at = time.monotonic()
        incarnation.popen.send_signal(signum)
        await self._wait_exit(incarnation, within=GRACE_PERIOD * 2)
        if incarnation.exit_code is None:  # not honoured: do not leave it behind
            incarnation.popen.kill()
            await self._wait_exit(incarnation, within=10)
            incarnation.exit_code = None
        took = (incarnation.exited_at or time.monotonic()) - incarnation.signal_sent_at
        print(f'[{self.elapsed:6.1f}s] operator #{incarnation.number} stopped by {signum.name} '
              f'in {took:.1f}s (exit code {incarnation.exit_code})', flush=True)

    async def _wait_for_log(self, incarnation: Incarnation, text: str, within: float) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and incarnation.popen.poll() is None:
            if text in incarnation.log_path.read_text(errors='replace'):
                return
            await asyncio.sleep(0.1)

    async def _wait_exit(self, incarnation: Incarnation, within: float) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            code = incarnation.popen.poll()
            if code is not None:
                incarnation.exited_at = time.monotonic()
                incarnation.exit_code = code
                return
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------------------------------
    # The run.

    async def run(self) -> int:
        async with self.substrate, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            self.started_at = time.monotonic()  # the schedule's fractions count from here (the server is up)
            self.session = session
            self.write_kubeconfig()
            print(f'API server: {self.substrate.description}', flush=True)
            for limitation in self.substrate.limitations:
                print(f'  on this API server: {limitation}', flush=True)
            await self.create_crd()
            self.start_operator()
            tasks = [asyncio.create_task(coro) for coro in [self.churn(), self.write_concurrently()]]
            faults = asyncio.create_task(self.inject_faults())
            samples = [asyncio.create_task(self.sample_periodically())] if self.sample_interval > 0 else []
            try:
                await self.run_schedule()
                await asyncio.gather(*tasks)
                faults.cancel()
                await asyncio.gather(faults, return_exceptions=True)
                if self.substrate.injects_faults:
                    self.emulator.clear_faults()
                await self.settle()
                self.rss_after_run = checks.rss_of(self.current.popen.pid)
                for task in samples:  # the samples end with the run, not with the final stop
                    task.cancel()
                if self.sample_interval > 0:
                    self.write_sample()
                final_state, final_namespaces = await self.list_final_state()
                events = await self.list_objects('/api/v1/events')
                await self.terminate_operator()
            finally:
                for task in [*tasks, faults, *samples]:
                    task.cancel()
                for incarnation in self.incarnations:
                    if incarnation.popen.poll() is None:
                        incarnation.popen.kill()
                        incarnation.popen.wait()
        self.journal.refresh()
        results = checks.check_all(self, final_state, final_namespaces, events)
        return checks.report(results, self.profile.known_failures, self.seed)

    def write_kubeconfig(self) -> None:
        """
        The kubeconfig of the operator and of the driver: the server's, with a bearer token (that of
        the soak on the emulator, which accepts any; the admin's static token on a real server).
        """
        config = self.substrate.operator_kubeconfig()
        self.kubeconfig_path.touch(mode=0o600)
        self.kubeconfig_path.write_text(yaml.safe_dump(config))
        self.connection = Connection(yaml.safe_load(self.kubeconfig_path.read_text()), workdir=self.workdir)

    def schedule(self) -> tuple[tuple[float, str], ...]:
        """The lifecycle events; with more restarts of the API server where no faults can be injected."""
        if self.profile.events:
            extra = () if self.substrate.injects_faults else self.profile.extra_restarts
            return tuple(sorted([*self.profile.events, *((when, 'api-restart') for when in extra)]))
        return _periodic_events(self.duration, restart_period=420 if self.substrate.injects_faults else 210)

    async def run_schedule(self) -> None:
        for fraction, what in self.schedule():
            await asyncio.sleep(max(0.0, fraction * self.duration - self.elapsed))
            if what == 'sigkill':
                await self.kill_operator()
                self.start_operator()
            elif what == 'sigterm':
                await self.terminate_operator(signal.SIGTERM)
                self.start_operator(debug=True)  # the credentials check covers the debug logs too
            elif what == 'sigint':
                await self.terminate_operator(signal.SIGINT)
                self.start_operator()
            elif what == 'api-restart':
                restarted = self.substrate.restarted
                print(f'[{self.elapsed:6.1f}s] {restarted} restarting (same port, state kept)', flush=True)
                began = time.monotonic()
                await self.substrate.restart(downtime=self.rng.uniform(0.2, 1.5))
                self.world.api_restarts += 1
                print(f'[{self.elapsed:6.1f}s] {restarted} restarted in {time.monotonic() - began:.1f}s',
                      flush=True)
        # The last incarnation warms up (its initial listing and the backlog), then its memory is taken.
        await asyncio.sleep(max(0.0, min(self.profile.warmup, self.duration - self.elapsed)))
        self.rss_after_warmup = checks.rss_of(self.current.popen.pid)
        if self.sample_interval > 0:
            self.write_sample()  # the warm-up's last sample, whatever the interval
        self.warmed_up_at = time.time()
        print(f'[{self.elapsed:6.1f}s] RSS after the warm-up: {self.rss_after_warmup} kB', flush=True)
        await asyncio.sleep(max(0.0, self.duration - self.elapsed))

    async def churn(self) -> None:
        """Create, update (spec & labels) and delete objects at random, spread over the run."""
        created_count = 0
        tick = 0.1
        churn_until = self.duration * 0.95
        creations_per_tick = self.objects / (self.duration * 0.6 / tick)
        credit = 0.0
        while self.elapsed < churn_until:
            await asyncio.sleep(tick)
            self.journal.refresh()
            await self.churn_namespaces()
            credit += creations_per_tick
            while credit >= 1 and created_count < self.objects:
                credit -= 1
                created_count += 1
                await self.create_object(f'obj-{created_count:05d}', self.choose_namespace())
            live = [name for name in self.world.created if name not in self.world.deleted]
            handled = [name for name in live if name in self.journal.created_ok]
            if live and self.rng.random() < 0.5:
                await self.update_object(self.rng.choice(live))
            # Deletions only of objects the operator has seen (else, Kopf could never know of them).
            if handled and self.rng.random() < 0.4 * creations_per_tick:
                await self.delete_object(self.rng.choice(handled))
            for name in sorted(self.world.stubborn - self.world.deleted):
                # Those in the short-lived namespaces are left for their namespaces' deletion.
                in_tmp_namespace = self.world.namespace_of[name] != NAMESPACE
                if not in_tmp_namespace and name in self.journal.create_attempted and self.rng.random() < 0.2:
                    await self.delete_object(name)  # while its creation is being retried
        # The stubborn ones never finish their creation: they all go, once the operator has tried them;
        # so do the short-lived namespaces still there, with their objects.
        deadline = time.monotonic() + self.profile.settle
        while time.monotonic() < deadline:
            self.journal.refresh()
            for name in sorted(self.world.stubborn - self.world.deleted):
                if self.world.namespace_of[name] == NAMESPACE and name in self.journal.create_attempted:
                    await self.delete_object(name)
            await self.churn_namespaces(closing_all=True)
            if not (self.world.stubborn - self.world.deleted
                    or set(self.world.tmp_namespaces) - self.world.deleted_namespaces):
                break
            await asyncio.sleep(0.2)
        self.churn_over.set()

    # The short-lived namespaces: the n-th is created at a fixed fraction of the creation phase (the
    # first 60% of the run), receives some of the objects created while it is open, and is deleted
    # a while later with everything in it (once the operator has seen all of its objects).

    def _tmp_namespace_schedule(self, index: int) -> tuple[float, float]:
        """When the short-lived namespace number ``index`` opens and when it is to be deleted (seconds)."""
        count = self.tmp_namespace_count
        opens_at = self.duration * (0.03 + 0.55 * index / count)
        lifetime = max(5.0, self.duration * min(0.2, 0.55 / count * 1.5))
        return opens_at, opens_at + lifetime

    def open_tmp_namespaces(self) -> list[str]:
        """The short-lived namespaces that exist and are not being deleted: new objects may go there."""
        return [namespace for index, namespace in enumerate(self.world.tmp_namespaces)
                if namespace not in self.world.deleted_namespaces
                and self.elapsed < self._tmp_namespace_schedule(index)[1]]

    def choose_namespace(self) -> str:
        open_namespaces = self.open_tmp_namespaces()
        if open_namespaces and self.rng.random() < 0.3:
            return self.rng.choice(open_namespaces)
        return NAMESPACE

    async def churn_namespaces(self, *, closing_all: bool = False) -> None:
        """Open the short-lived namespaces on schedule, and delete those whose time has come."""
        index = len(self.world.tmp_namespaces)
        due = index < self.tmp_namespace_count and self.elapsed >= self._tmp_namespace_schedule(index)[0]
        if due and not closing_all:
            namespace = f'{TMP_NAMESPACE_PREFIX}{index + 1}'
            await self.request('POST', '/api/v1/namespaces', {'apiVersion': 'v1', 'kind': 'Namespace',
                                                              'metadata': {'name': namespace}},
                               ok_statuses=(409,))  # 409: a retried success
            self.world.tmp_namespaces[namespace] = []
            print(f'[{self.elapsed:6.1f}s] namespace {namespace} created', flush=True)
        for index, (namespace, names) in enumerate(list(self.world.tmp_namespaces.items())):
            if namespace in self.world.deleted_namespaces:
                continue
            if not closing_all and self.elapsed < self._tmp_namespace_schedule(index)[1]:
                continue
            # Only once the operator has seen (and so put its finalizer on) every object there:
            # the deletion of an object that no operator has ever seen cannot be handled by anyone.
            unseen = [name for name in names
                      if name not in self.world.deleted and name not in self.journal.create_attempted]
            if not unseen:
                await self.delete_namespace(namespace)

    async def delete_namespace(self, namespace: str) -> None:
        live = [name for name in self.world.tmp_namespaces[namespace] if name not in self.world.deleted]
        self.world.deleted_namespaces.add(namespace)
        self.world.deleted.update(live)
        self.world.deleted_with_namespace.update(live)
        await self.request('DELETE', f'/api/v1/namespaces/{namespace}', ok_statuses=(404,))
        print(f'[{self.elapsed:6.1f}s] namespace {namespace} deleted with {len(live)} objects', flush=True)

    async def create_object(self, name: str, namespace: str = NAMESPACE) -> None:
        roll = self.rng.random()
        # In the short-lived namespaces, more objects are still retrying their creation when the
        # namespace goes: a deletion by the namespace in the middle of the handling.
        stubborn, retrying = (0.07, 0.2) if namespace == NAMESPACE else (0.25, 0.45)
        failures = 1000 if roll < stubborn else 2 if roll < retrying else 0
        spec = {'version': 1, 'field': 'f0', 'failures': failures}
        labels = {'color': self.rng.choice(['red', 'green', 'blue'])}
        body = {'apiVersion': f'{GROUP}/{VERSION}', 'kind': 'SoakObject',
                'metadata': {'name': name, 'labels': labels}, 'spec': spec}
        # 409: a retried success.
        await self.request('POST', self.collection_path(namespace), body, ok_statuses=(409,))
        self.world.created[name] = spec
        self.world.namespace_of[name] = namespace
        if namespace != NAMESPACE:
            self.world.tmp_namespaces[namespace].append(name)
        self.world.recent.append(name)
        if failures == 1000:
            self.world.stubborn.add(name)

    async def update_object(self, name: str) -> None:
        spec = self.world.created[name]
        spec['version'] += 1
        patch: dict[str, Any] = {'spec': {'version': spec['version']}}
        if self.rng.random() < 0.5:
            spec['field'] = patch['spec']['field'] = f'f{spec["version"]}'
        if self.rng.random() < 0.5:
            patch['metadata'] = {'labels': {'color': self.rng.choice(['red', 'green', 'blue', 'black'])}}
        status, _ = await self.request('PATCH', self.object_path(name), patch, ok_statuses=(404,))
        if status != 404:
            self.world.updates += 1

    async def delete_object(self, name: str) -> None:
        self.world.deleted.add(name)
        await self.request('DELETE', self.object_path(name), ok_statuses=(404,))
        self.world.recent.append(name)

    async def write_concurrently(self) -> None:
        """Another writer of the same objects: status updates with its resourceVersion, as controllers do."""
        while self.elapsed < self.duration * 0.95:
            await asyncio.sleep(0.1)
            live = [name for name in self.world.created if name not in self.world.deleted]
            # Mostly the objects whose finalizers the operator is adding or removing right now.
            candidates = list(self.world.recent) if self.rng.random() < 0.6 else live
            if not candidates:
                continue
            name = self.rng.choice(candidates)
            status, body = await self.request('GET', self.object_path(name), ok_statuses=(404,))
            if status == 404:
                continue
            await asyncio.sleep(self.rng.uniform(0, 0.1))  # the operator may write in between
            body.setdefault('status', {})['writer'] = self.world.writes_by_writer
            status, _ = await self.request('PUT', self.object_path(name) + '/status', body,
                                           ok_statuses=(404, 409))
            self.world.writes_by_writer += 1
            if status == 409:
                self.world.conflicts_seen_by_writer += 1

    async def inject_faults(self) -> None:
        """Random faults, once a second, from the warm-up to 90% of the run (where they can be injected)."""
        if not self.substrate.injects_faults:
            return
        await asyncio.sleep(3)
        errors = asyncio.create_task(self.fail_some_requests())
        try:
            while self.elapsed < self.duration * 0.9:
                await asyncio.sleep(1)
                self.inject_a_random_fault()
        finally:
            errors.cancel()

    async def fail_some_requests(self) -> None:
        """~5% of the requests fail with 500/503: armed one at a time, so that the retries mostly pass."""
        last_total = self.emulator.requests.total
        credit = 0.0
        while True:
            await asyncio.sleep(0.1)
            total = self.emulator.requests.total
            credit += (total - last_total) * 0.05
            last_total = total
            if credit >= 1:
                credit -= 1
                self.emulator.fail_requests(1, status=self.errors_rng.choice([500, 503]))
                self.world.count_fault('500/503')

    def inject_a_random_fault(self) -> None:
        """One of the faults, at random: watch streams dropped, 410 Gone, 429, a latency spike, or none."""
        roll = self.rng.random()
        if roll < 0.10:
            abort = self.rng.random() < 0.5
            dropped = self.emulator.drop_watches(abort=abort)
            self.world.count_fault('watch streams aborted' if abort else 'watch streams dropped', dropped)
        elif roll < 0.15:
            self.emulator.forget_history()  # the next watch from a past version gets 410 Gone
            self.emulator.drop_watches()
            self.world.count_fault('410 Gone (history compacted)')
        elif roll < 0.22:
            # The driver never lists nor watches: these 429s are for the operator alone.
            self.emulator.fail_requests(1, status=429, retry_after=1, verb='watch')
            self.emulator.drop_watches()
            self.world.count_fault('429 with Retry-After')
        elif roll < 0.30:
            self.emulator.add_latency(self.rng.uniform(0.3, 1.5), count=10)
            self.world.count_fault('latency spikes')

    async def settle(self) -> None:
        """Wait until the operator has caught up with the final state, or the settling time is over."""
        await self.churn_over.wait()
        deadline = time.monotonic() + self.profile.settle
        while time.monotonic() < deadline:
            self.journal.refresh()
            final_state, final_namespaces = await self.list_final_state()
            if not checks.pending(self, final_state, final_namespaces):
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)  # the last outcomes' writes
        print(f'[{self.elapsed:6.1f}s] settled', flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m tools.soak', description=__doc__)
    parser.add_argument('--profile', choices=sorted(PROFILES), default='short')
    parser.add_argument('--duration', type=float, default=None, help='seconds of churn (the profile sets it)')
    parser.add_argument('--objects', type=int, default=None, help='objects created (the profile sets it)')
    parser.add_argument('--seed', type=int, default=16)
    parser.add_argument('--api', choices=API_CHOICES, default='emulator',
                        help='the API server: the emulator in this process (with injected faults), or a '
                             'real control plane of etcd & kube-apiserver ($KUBEBUILDER_ASSETS; see the '
                             'README for what is left out there)')
    parser.add_argument('--workdir', type=pathlib.Path, default=None,
                        help='where the journal and the logs go (a new temporary directory by default)')
    parser.add_argument('--sample-interval', type=float, default=10.0,
                        help="seconds between the samples of the operator's RSS, fds, threads and asyncio "
                             'tasks (WORKDIR/samples.jsonl; 0 for none)')
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    duration = args.duration if args.duration is not None else profile.duration
    objects = args.objects if args.objects is not None else profile.objects
    if duration < 20:
        parser.error(f'--duration={duration} is too short for the kills and restarts: use 20 or more.')
    if args.sample_interval < 0:
        parser.error(f'--sample-interval={args.sample_interval} must be 0 (no samples) or positive.')
    if objects < 1:
        parser.error(f'--objects={objects} must be positive.')
    workdir = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix='kopf-soak-'))
    workdir.mkdir(parents=True, exist_ok=True)
    if (workdir / 'journal.jsonl').exists():
        # Two runs in one directory would mix their journals, logs and kubeconfigs (and so their operators).
        parser.error(f'--workdir={workdir} has the journal of another run: give a new or an empty directory.')
    print(f'Soak: profile={args.profile} api={args.api} duration={duration}s objects={objects} '
          f'seed={args.seed} workdir={workdir}', flush=True)
    soak = Soak(profile=profile, duration=duration, objects=objects, seed=args.seed, workdir=workdir,
                api=args.api, sample_interval=args.sample_interval)
    return asyncio.run(soak.run())
