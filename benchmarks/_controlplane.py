"""
The benchmarks on a real control plane: etcd + kube-apiserver, what the emulator's hooks tell otherwise.

``--api control-plane`` runs each measurement on a fresh :class:`kopf.testing.KubernetesControlPlane`
(the binaries from ``$KUBEBUILDER_ASSETS``, or the newest build in ``~/.cache/kopf/kube-assets/``).
The operators log in as its admin with the kubeconfig (HTTPS, a client certificate); the benchmark
is another user (``benchmark``, also in ``system:masters``), so that its own requests are not
counted as the operator's. Without the emulator's request hooks and store:

* the operator's requests (their verbs, and when its first request and its LIST of the objects came)
  are read from kube-apiserver's audit log: a policy at the ``Metadata`` level for the admin only,
  one entry per request when it is received (``RequestReceived``; the later stages are omitted);
* what the objects look like (handled, ticked, gone) is seen by the benchmark's own LIST+WATCH of
  them (:class:`Observer`, a thread of its own), timed when each event arrives.
"""
import asyncio
import contextlib
import copy
import datetime
import pathlib
import shutil
import tempfile
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
from _harness import CRD, example_bodies
from floor_client import login

from kopf.testing.apiserver import KubernetesControlPlane
from kopf.testing.apiserver.controlplane import ADMIN_USER

try:
    import orjson

    loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover
    import json

    loads = json.loads

BENCHMARK_USER = 'benchmark'
CREATE_CONCURRENCY = 32  # parallel POSTs of the objects before the operator starts
AUDIT_POLICY = f"""\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [ResponseStarted, ResponseComplete]
rules:
- level: Metadata
  users: [{ADMIN_USER}]
- level: None
"""


class AuditLog:
    """
    The operator's requests as kube-apiserver's audit log has them: read incrementally.

    Times are in ``time.monotonic()`` terms (the log has the wall clock, in microseconds), like those
    of the emulator's request counter; the verbs are the emulator's too (``discovery`` for the
    non-resource requests).
    """

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.position = 0
        # Per request: when it was received, its verb, resource, subresource, namespace.
        self.entries: list[tuple[float, str, str, str, str]] = []
        self.offset = time.time() - time.monotonic()

    def skip(self) -> None:
        """Forget what is logged so far (e.g. the benchmark's preparations)."""
        self.read()
        self.entries.clear()

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open('rb') as file:
            file.seek(self.position)
            data = file.read()
        end = data.rfind(b'\n') + 1  # only complete lines: the rest on the next read
        self.position += end
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            event = loads(line)
            received = datetime.datetime.fromisoformat(event['requestReceivedTimestamp'])
            ref = event.get('objectRef')
            verb = event['verb'] if ref else 'discovery'
            ref = ref or {}
            self.entries.append((received.timestamp() - self.offset, verb, ref.get('resource', ''),
                                 ref.get('subresource', ''), ref.get('namespace', '')))

    def first_at(self, verb: str | None = None, resource: str | None = None) -> float | None:
        self.read()
        for at, verb_, resource_, _, _ in self.entries:
            if (verb is None or verb == verb_) and (resource is None or resource == resource_):
                return at
        return None

    def last_at(self, verb: str | None = None, resource: str | None = None) -> float | None:
        self.read()
        for at, verb_, resource_, _, _ in reversed(self.entries):
            if (verb is None or verb == verb_) and (resource is None or resource == resource_):
                return at
        return None

    def by_verb(self) -> dict[str, int]:
        self.read()
        counts: dict[str, int] = {}
        for _, verb, _, _, _ in self.entries:
            counts[verb] = counts.get(verb, 0) + 1
        return counts

    def count(self, verb: str, resource: str) -> int:
        self.read()
        return sum(1 for _, verb_, resource_, _, _ in self.entries if verb_ == verb and resource_ == resource)


class ControlPlaneRun:
    """
    A fresh control plane with the audit log, and the benchmark's own user; a context manager.

    ``url`` and ``kubeconfig_path`` (the admin's) are for the operators, as the emulator's are.
    """

    def __init__(self) -> None:
        self.directory = pathlib.Path(tempfile.mkdtemp(prefix='bench-control-plane-'))
        policy = self.directory / 'audit-policy.yaml'
        policy.write_text(AUDIT_POLICY)
        self.audit = AuditLog(self.directory / 'audit.log')
        self.control_plane = KubernetesControlPlane(
            work_dir=self.directory / 'work',
            apiserver_args={'audit-policy-file': str(policy), 'audit-log-path': str(self.audit.path)},
        )
        self.benchmark_kubeconfig: pathlib.Path | None = None

    def __enter__(self) -> 'ControlPlaneRun':
        try:
            self.control_plane.start()
            self.benchmark_kubeconfig = self.control_plane.add_user(BENCHMARK_USER, ['system:masters'])
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: types.TracebackType | None) -> None:
        try:
            self.control_plane.stop()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def url(self) -> str:
        return self.control_plane.url

    @property
    def kubeconfig_path(self) -> pathlib.Path:
        return self.control_plane.kubeconfig_path

    def session(self) -> aiohttp.ClientSession:
        """An HTTPS session of the benchmark's user (not the operator's)."""
        if self.benchmark_kubeconfig is None:
            raise RuntimeError('The control plane is not started.')
        server, tls, headers = login(str(self.benchmark_kubeconfig))
        connector = aiohttp.TCPConnector(limit=0, ssl=tls if tls is not None else True)
        return aiohttp.ClientSession(base_url=server, connector=connector, headers=headers)

    def populate(self, count: int, *, status_subresource: bool = True,
                 crds: Sequence[Mapping[str, Any]] = (), extra: Sequence[tuple[str, Mapping[str, Any]]] = ()
                 ) -> None:
        """
        The standard CRD and ``count`` objects of it (``kex-0``, ...), created 32 at a time.

        ``crds`` are more CRDs to create (and wait for) first; ``extra`` are more objects: (plural, body).
        """
        crd = copy.deepcopy(CRD)
        if not status_subresource:
            del crd['spec']['versions'][0]['subresources']
        asyncio.run(self._populate([crd, *crds], count, extra))

    async def _populate(self, crds: Sequence[Mapping[str, Any]], count: int,
                        extra: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        async with self.session() as session:
            for crd in crds:
                async with session.post('/apis/apiextensions.k8s.io/v1/customresourcedefinitions',
                                        json=crd) as response:
                    response.raise_for_status()
            for crd in crds:
                await wait_established(session, crd['metadata']['name'])
            semaphore = asyncio.Semaphore(CREATE_CONCURRENCY)

            async def create(plural: str, body: Mapping[str, Any]) -> None:
                url = f'/apis/kopf.dev/v1/namespaces/default/{plural}'
                async with semaphore:
                    for attempt in range(50):  # a CRD just established may be served a moment later
                        async with session.post(url, json=body) as response:
                            if response.status != 404 or attempt == 49:
                                response.raise_for_status()
                                return
                        await asyncio.sleep(0.1)

            await asyncio.gather(*(create('kopfexamples', body) for body in example_bodies(count)),
                                 *(create(plural, body) for plural, body in extra))

    def delete_all(self, plural: str = 'kopfexamples') -> None:
        """All objects by one DELETE of the collection (as on the emulator)."""
        async def delete() -> None:
            async with self.session() as session, \
                    session.delete(f'/apis/kopf.dev/v1/namespaces/default/{plural}') as response:
                response.raise_for_status()
                await response.read()
        asyncio.run(delete())


async def wait_established(session: aiohttp.ClientSession, name: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        async with session.get(f'/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}') as response:
            response.raise_for_status()
            conditions = (await response.json()).get('status', {}).get('conditions') or []
        if any(c.get('type') == 'Established' and c.get('status') == 'True' for c in conditions):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f'The CRD {name} is not established in {seconds:.0f}s.')
        await asyncio.sleep(0.05)


def is_handled(body: Mapping[str, Any]) -> bool:
    """Handled: the create handler's result is in the status, the diff-base is stored, no progress is left."""
    annotations = body.get('metadata', {}).get('annotations') or {}
    return (
        'create_fn' in (body.get('status') or {})
        and 'kopf.zalando.org/last-handled-configuration' in annotations
        and 'kopf.zalando.org/create_fn' not in annotations
    )


class Observer:
    """
    The benchmark's own LIST+WATCH of one resource's objects, in a thread; a context manager.

    It keeps what the benchmarks wait for, each with the time (``time.monotonic()``) when its latest
    change arrived: the objects that exist, that are handled (:func:`is_handled`), their tick counters
    (``status.tick``); ``get(name)`` gives an object's latest body. Reading the sets' sizes and the
    times from another thread is safe (single operations under the GIL).
    """

    def __init__(self, run: ControlPlaneRun, plural: str = 'kopfexamples') -> None:
        self.run = run
        self.collection = f'/apis/kopf.dev/v1/namespaces/default/{plural}'
        self.alive: set[str] = set()
        self.handled: set[str] = set()
        self.ticks: dict[str, int] = {}
        self.bodies: dict[str, Mapping[str, Any]] = {}
        self.handled_at: float | None = None  # when the latest object became handled
        self.gone_at: float | None = None  # when the latest object was gone
        self.first_ticked_at: float | None = None  # when the first object ticked for the first time
        self.ticked_at: float | None = None  # when the latest object ticked for the first time
        self.error: BaseException | None = None
        self.synced = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[None] | None = None
        self.thread = threading.Thread(target=self._thread, name='observer', daemon=True)

    def __enter__(self) -> 'Observer':
        self.thread.start()
        if not self.synced.wait(60) or self.error is not None:
            self.__exit__(None, None, None)
            raise RuntimeError(f'The benchmark could not list & watch {self.collection}: {self.error!r}')
        return self

    def __exit__(self, *_: object) -> None:
        if self.loop is not None and self.task is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(30)

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f'The benchmark\'s watch of {self.collection} failed: {self.error!r}')

    def get(self, name: str) -> Mapping[str, Any] | None:
        return self.bodies.get(name)

    def _thread(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self.task = asyncio.current_task()
            try:
                await self._observe()
            except asyncio.CancelledError:
                pass
            except BaseException as e:
                self.error = e
                self.synced.set()
        asyncio.run(main())

    async def _observe(self) -> None:
        async with self.run.session() as session:
            async with session.get(self.collection) as response:
                response.raise_for_status()
                listing = loads(await response.read())
            now = time.monotonic()
            for body in listing['items']:
                self._accept('ADDED', body, now)
            version = listing['metadata']['resourceVersion']
            self.synced.set()
            while True:  # the stream may end (the server's timeout): resume from the last version
                version = await self._watch(session, version)

    async def _watch(self, session: aiohttp.ClientSession, version: str) -> str:
        params = {'watch': 'true', 'allowWatchBookmarks': 'true', 'resourceVersion': version}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with session.get(self.collection, params=params, timeout=timeout) as response:
            response.raise_for_status()
            pending = b''
            async for chunk in response.content.iter_any():
                *lines, pending = (pending + chunk).split(b'\n')
                now = time.monotonic()
                for line in lines:
                    if not line.strip():
                        continue
                    event = loads(line)
                    if event['type'] == 'ERROR':
                        raise RuntimeError(f'The watch failed: {event["object"]}')
                    version = event['object']['metadata']['resourceVersion']
                    if event['type'] != 'BOOKMARK':
                        self._accept(event['type'], event['object'], now)
        return version

    def _accept(self, event_type: str, body: Mapping[str, Any], now: float) -> None:
        name = body['metadata']['name']
        if event_type == 'DELETED':
            self.alive.discard(name)
            self.bodies.pop(name, None)
            self.gone_at = now
            return
        self.alive.add(name)
        self.bodies[name] = body
        if name not in self.handled and is_handled(body):
            self.handled.add(name)
            self.handled_at = now
        tick = (body.get('status') or {}).get('tick')
        if isinstance(tick, int):
            if name not in self.ticks:
                self.ticked_at = now
                if self.first_ticked_at is None:
                    self.first_ticked_at = now
            self.ticks[name] = tick
