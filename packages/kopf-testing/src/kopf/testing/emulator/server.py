"""
:class:`KubernetesEmulator`: the emulator as an HTTP server with its kubeconfig, in a loop or a thread.
"""

import asyncio
import concurrent.futures
import json
import os
import pathlib
import re
import shutil
import socket
import tempfile
import threading
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import yaml
from aiohttp import web

from kopf.testing.emulator.admission import AdmissionController
from kopf.testing.emulator.faults import FaultInjector, RequestCounter
from kopf.testing.emulator.handlers import MAX_BODY_SIZE, ApiHandler, WatchSettings
from kopf.testing.emulator.operations import Operations, now_rfc3339
from kopf.testing.emulator.resources import NAMESPACES, ResourceRegistry
from kopf.testing.emulator.sharding import FEATURE_GATE
from kopf.testing.emulator.store import ObjectStore

_T = TypeVar('_T')
_CONTEXT_NAME = 'kopf-emulator'
KNOWN_FEATURE_GATES = frozenset({FEATURE_GATE})


class KubernetesEmulator:
    """
    An in-process test double of the Kubernetes API server, speaking HTTP on ``127.0.0.1``.

    It is not a cluster: nothing runs pods, no controllers reconcile anything. It stores objects
    and serves them by the conventions of the Kubernetes API (discovery, CRUD, patches, the
    status subresource, finalizers, watches with bookmarks and 410 Gone, admission webhooks),
    so that operators and API clients (the official ``kubernetes`` client, pykube-ng, kubectl)
    work against it unchanged. See :mod:`kopf.testing.emulator` for what differs from a real
    API server. Tests can also inject faults and count the requests.

    Run it in the current event loop (``async with KubernetesEmulator() as emulator:``) or in
    its own thread from synchronous code (``with KubernetesEmulator() as emulator:``). Once it
    listens, a kubeconfig pointing to it is written to :attr:`kubeconfig_path`; any client that
    reads kubeconfigs can use it. The request counters (:attr:`requests`), the fault injection
    and the inspection methods are safe to use from any thread.

    Example::

        async with KubernetesEmulator() as emulator:
            os.environ['KUBECONFIG'] = str(emulator.kubeconfig_path)
            emulator.fail_requests(2, status=503, verb='patch')
            emulator.add_latency(0.5, verb='patch', after_applying=True)  # the echoes before the responses
            ...  # run the operator, create objects, etc.
            assert emulator.requests.count('patch', 'kopfexamples', name='kex1') == 3
    """

    def __init__(
        self,
        *,
        host: str = '127.0.0.1',
        port: int = 0,
        kubeconfig_path: str | os.PathLike[str] | None = None,
        namespaces: Iterable[str] = ('default', 'kube-system'),
        bookmark_interval: float = 60.0,
        history_limit: int = 10_000,
        watch_timeout: float | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        watcher_capacity: int | None = 200,
    ) -> None:
        """
        :param port: the port to listen on; 0 picks a free one (see :attr:`port` once started).
        :param kubeconfig_path: where to write the kubeconfig; a temporary file if not given.
        :param namespaces: the namespaces that exist from the start.
        :param bookmark_interval: seconds between BOOKMARK events of watches that allow them.
        :param history_limit: how many past events of each resource are kept for watches that
            start from an old resourceVersion; older ones get 410 Gone.
        :param watch_timeout: the server-side limit of watches that do not set ``timeoutSeconds``.
        :param watcher_capacity: how many events can wait for a watch's client that does not read (beyond
            the sockets' buffers) for 0.1 s before its stream is ended, as kube-apiserver ends such watches
            (its watchers' channels of a custom resource, its dispatch budget); the client re-watches from
            the last version it has seen. ``None``: never (the events wait in the emulator's memory).
        :param feature_gates: the features of kube-apiserver that are off by default, as in
            :class:`~kopf.testing.KubernetesControlPlane`: only ``{'ShardedListAndWatch': True}`` (the
            ``shardSelector`` of lists & watches; see :mod:`kopf.testing.emulator.sharding`). They can
            also be changed later in :attr:`feature_gates` (for the new requests).
        """
        if watcher_capacity is not None and (type(watcher_capacity) is not int or watcher_capacity < 1):
            raise ValueError(f'The emulator\'s watcher_capacity must be a positive integer (events) or None '
                             f'(never end a watch), got {watcher_capacity!r}.')
        unknown = sorted(set(feature_gates or {}) - KNOWN_FEATURE_GATES)
        if unknown:
            raise ValueError(f'Unknown feature gates of the emulator: {", ".join(unknown)}; '
                             f'it knows only: {", ".join(sorted(KNOWN_FEATURE_GATES))}.')
        self.feature_gates: dict[str, bool] = {
            name: bool(value) for name, value in (feature_gates or {}).items()
        }
        self.host = host
        self._requested_port = port
        self._requested_kubeconfig_path = (
            pathlib.Path(kubeconfig_path) if kubeconfig_path is not None else None
        )
        self._initial_namespaces = tuple(namespaces)
        self.registry = ResourceRegistry()
        self.store = ObjectStore(history_limit=history_limit)
        self.admission = AdmissionController(self.store)
        self.operations = Operations(self.registry, self.store, self.admission)
        self.requests = RequestCounter()
        self.faults = FaultInjector()
        self.watch_settings = WatchSettings(
            bookmark_interval=bookmark_interval,
            default_timeout=watch_timeout,
            feature_gates=self.feature_gates,
            watcher_capacity=watcher_capacity,
        )
        self._handler = ApiHandler(
            registry=self.registry,
            store=self.store,
            operations=self.operations,
            counter=self.requests,
            faults=self.faults,
            watch_settings=self.watch_settings,
        )
        self._runner: web.ServerRunner | None = None
        self._restarting = False
        self._port: int | None = None
        self._kubeconfig_path: pathlib.Path | None = None
        self._temporary_directory: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id: int | None = None
        self._thread: threading.Thread | None = None
        self._thread_stop: asyncio.Event | None = None
        self._thread_started = threading.Event()
        self._thread_errors: list[BaseException] = []
        self._seed_namespaces()

    def _seed_namespaces(self) -> None:
        for name in self._initial_namespaces:
            body = {
                'apiVersion': 'v1',
                'kind': 'Namespace',
                'metadata': {
                    'name': name,
                    'uid': f'namespace-{name}',
                    'creationTimestamp': now_rfc3339(),
                    'labels': {'kubernetes.io/metadata.name': name},
                    'resourceVersion': str(self.store.next_resource_version()),
                },
                'spec': {'finalizers': ['kubernetes']},
                'status': {'phase': 'Active'},
            }
            self.store.put(NAMESPACES.storage_key, body, None)

    # ----------------------------------------------------------------------------------------
    # Where it is.

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError('The emulator is not started yet.')
        return self._port

    @property
    def url(self) -> str:
        """The base URL of the API, e.g. ``http://127.0.0.1:34567``."""
        return f'http://{self.host}:{self.port}'

    @property
    def kubeconfig_path(self) -> pathlib.Path:
        """The kubeconfig file pointing to the emulator, usable by any client (written on start)."""
        if self._kubeconfig_path is None:
            raise RuntimeError('The emulator is not started yet.')
        return self._kubeconfig_path

    @property
    def kubeconfig(self) -> dict[str, Any]:
        """The content of the kubeconfig, as a dict."""
        return {
            'apiVersion': 'v1',
            'kind': 'Config',
            'clusters': [{'name': _CONTEXT_NAME, 'cluster': {'server': self.url}}],
            'users': [{'name': _CONTEXT_NAME, 'user': {}}],
            'contexts': [
                {
                    'name': _CONTEXT_NAME,
                    'context': {'cluster': _CONTEXT_NAME, 'user': _CONTEXT_NAME, 'namespace': 'default'},
                }
            ],
            'current-context': _CONTEXT_NAME,
            'preferences': {},
        }

    # ----------------------------------------------------------------------------------------
    # Running in the current event loop.

    async def start(self) -> None:
        """Start listening and write the kubeconfig."""
        if self._runner is not None:
            raise RuntimeError('The emulator is already started.')
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        sock = socket.socket(socket.AF_INET6 if ':' in self.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self._requested_port))
            sock.setblocking(False)
            loop = self._loop

            def make_request(
                message: Any, payload: Any, protocol: Any, writer: Any, task: Any
            ) -> web.BaseRequest:
                return web.BaseRequest(
                    message, payload, protocol, writer, task, loop, client_max_size=MAX_BODY_SIZE
                )

            server = web.Server(
                self._handler, request_factory=make_request, handler_cancellation=True, access_log=None
            )
            runner = web.ServerRunner(server, shutdown_timeout=1.0)
            await runner.setup()
            site = web.SockSite(runner, sock, backlog=1024)
            await site.start()
        except BaseException:
            sock.close()
            raise
        self._runner = runner
        self._port = sock.getsockname()[1]
        self._handler.server_address = f'{self.host}:{self._port}'
        if not self._restarting:  # a restart keeps the kubeconfig (and its temporary directory)
            self._write_kubeconfig()

    async def restart(self, downtime: float = 0.0) -> None:
        """
        Stop serving and serve again on the same port, keeping the stored objects and the history.

        As an API server restarting does: the watch streams and the connections break, the
        requests during the ``downtime`` are refused, and the clients reconnect to the same URL
        with the same kubeconfig; the objects, the resourceVersions and the watch history stay.
        """
        if self._runner is None:
            raise RuntimeError('The emulator is not started, so it cannot be restarted.')
        port = self.port
        for watcher in self.store.watchers():
            watcher.close(abort=True)
        await self._runner.cleanup()
        self._runner = None
        await asyncio.sleep(downtime)
        requested_port, self._requested_port = self._requested_port, port
        self._restarting = True
        try:
            await self.start()
        finally:
            self._requested_port = requested_port
            self._restarting = False

    async def stop(self) -> None:
        """Close all watches, stop listening, and remove the kubeconfig if it was a temporary one."""
        for watcher in self.store.watchers():
            watcher.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.admission.close()
        if self._temporary_directory is not None:
            shutil.rmtree(self._temporary_directory, ignore_errors=True)
            self._temporary_directory = None

    async def __aenter__(self) -> 'KubernetesEmulator':
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        await self.stop()

    def _write_kubeconfig(self) -> None:
        path = self._requested_kubeconfig_path
        if path is None:
            self._temporary_directory = tempfile.mkdtemp(prefix='kopf-emulator-')
            path = pathlib.Path(self._temporary_directory) / 'kubeconfig'
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + '.tmp')
        temporary.write_text(yaml.safe_dump(self.kubeconfig, sort_keys=False))
        temporary.replace(path)  # atomically: whoever waits for the file never reads half of it
        self._kubeconfig_path = path

    # ----------------------------------------------------------------------------------------
    # Running in a thread, for synchronous code.

    def __enter__(self) -> 'KubernetesEmulator':
        self.start_in_thread()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        self.stop_thread()

    def start_in_thread(self, timeout: float = 30.0) -> None:
        """Serve in a new thread with its own event loop; return once it listens."""
        if self._thread is not None:
            raise RuntimeError('The emulator is already running in a thread.')
        self._thread_started.clear()
        self._thread_errors.clear()
        self._thread = threading.Thread(target=self._thread_main, name='kubernetes-emulator', daemon=True)
        self._thread.start()
        if not self._thread_started.wait(timeout):
            raise TimeoutError('The emulator did not start in time.')
        if self._thread_errors:
            self._thread.join()
            self._thread = None
            raise self._thread_errors[0]

    def stop_thread(self, timeout: float = 30.0) -> None:
        """Stop the server thread started by :meth:`start_in_thread` and wait for it to exit."""
        thread, loop, stop = self._thread, self._loop, self._thread_stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        self._thread = None

    def _thread_main(self) -> None:
        asyncio.run(self._serve_in_thread())

    async def _serve_in_thread(self) -> None:
        self._thread_stop = asyncio.Event()
        try:
            await self.start()
        except BaseException as e:
            self._thread_errors.append(e)
            self._thread_started.set()
            return
        self._thread_started.set()
        try:
            await self._thread_stop.wait()
        finally:
            await self.stop()

    def _in_loop(self, function: Callable[[], _T]) -> _T:
        """Run a function in the emulator's loop: directly if already there, else via a thread-safe call."""
        loop = self._loop
        if loop is None or self._loop_thread_id == threading.get_ident() or not loop.is_running():
            return function()
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def call() -> None:
            try:
                future.set_result(function())
            except BaseException as e:
                future.set_exception(e)

        loop.call_soon_threadsafe(call)
        return future.result(timeout=30)

    # ----------------------------------------------------------------------------------------
    # Fault injection.

    def fail_requests(
        self,
        count: int | None = 1,
        *,
        status: int = 503,
        method: str | None = None,
        verb: str | None = None,
        path: str | None = None,
        retry_after: float | None = None,
        message: str | None = None,
        raw_body: bytes | None = None,
    ) -> None:
        """
        Fail the next ``count`` matching requests (all of them if ``None``) with an error status.

        :param status: the HTTP code, e.g. 500, 503, or 429 (with ``retry_after`` seconds).
        :param method: only requests with this HTTP method (``PATCH``).
        :param verb: only requests with this API verb (``watch``, ``list``, ``patch``, ...).
        :param path: only requests whose URL path matches this regular expression (searched).
        :param raw_body: serve these bytes (as ``text/html``) instead of a ``kind: Status``, e.g. the
            page of a misbehaving proxy; with any status, even 200.
        """
        if status == 429 and retry_after is None:
            retry_after = 1
        self.faults.add_failure(
            count=count,
            status=status,
            method=method,
            verb=verb,
            path=path,
            retry_after=retry_after,
            message=message,
            raw_body=raw_body,
        )

    def add_latency(
        self,
        seconds: float,
        *,
        count: int | None = None,
        method: str | None = None,
        verb: str | None = None,
        path: str | None = None,
        after_applying: bool = False,
    ) -> None:
        """
        Delay the matching requests (the next ``count`` of them, or all until cleared).

        With ``after_applying``, a request is served at once (its change stored and sent to the watch-streams)
        and only its response is delayed: the watchers see the change before the client knows it is done, as
        with a slow network or a loaded API server.
        """
        self.faults.add_latency(seconds=seconds, count=count, method=method, verb=verb, path=path,
                                after_applying=after_applying)

    def accept_tokens(self, tokens: Iterable[str] | None) -> None:
        """
        Accept only these bearer tokens from now on (others get 401 Unauthorized); ``None``: any.

        E.g. a token's expiry or rotation: the clients must log in again and bring a new token.
        """
        self.faults.accepted_tokens = frozenset(tokens) if tokens is not None else None

    def clear_faults(self) -> None:
        """Forget all injected failures and latencies that are not consumed yet."""
        self.faults.clear()

    def drop_watches(self, *, path: str | None = None, abort: bool = False) -> int:
        """
        End the open watch streams (those whose URL matches ``path``, a regexp; all if ``None``).

        By default, the streams end cleanly, as when a real server closes them on its timeout;
        with ``abort=True``, the connections are broken mid-stream instead. Returns how many.
        """

        pattern = re.compile(path) if path is not None else None

        def drop() -> int:
            dropped = 0
            for watcher in self.store.watchers():
                if not watcher.closed and (pattern is None or pattern.search(watcher.path)):
                    watcher.close(abort=abort)
                    dropped += 1
            return dropped

        return self._in_loop(drop)

    def inject_watch_line(self, line: bytes, *, path: str | None = None) -> int:
        """
        Write a raw line (e.g. garbage) into the open watch streams (those whose URL matches ``path``).

        The line is written as is, with a newline added if missing; returns the number of streams.
        """
        pattern = re.compile(path) if path is not None else None
        raw = line if line.endswith(b'\n') else line + b'\n'

        def inject() -> int:
            injected = 0
            for watcher in self.store.watchers():
                if not watcher.closed and (pattern is None or pattern.search(watcher.path)):
                    watcher.push(raw)
                    injected += 1
            return injected

        return self._in_loop(inject)

    def forget_history(self) -> None:
        """Forget the watch history, as a compaction does: watching from any past version gets 410 Gone."""
        self._in_loop(self.store.forget_history)

    @property
    def open_watches(self) -> int:
        """How many watch streams are open now."""
        return self._in_loop(lambda: sum(1 for watcher in self.store.watchers() if not watcher.closed))

    @property
    def open_watch_paths(self) -> list[str]:
        """The URLs (with the query strings) of the watch streams open now."""
        return self._in_loop(lambda: [w.path for w in self.store.watchers() if not w.closed])

    @property
    def terminated_watches(self) -> list[str]:
        """The URLs of the watch streams ended since their clients did not read (see ``watcher_capacity``)."""
        return self._in_loop(lambda: list(self.store.terminated_watches))

    def watch_events(self, *, path: str | None = None) -> int:
        """
        How many events of objects (not bookmarks) the emulator has sent to the watches so far, open or ended.

        Only those of the watches whose URL (with the query string) matches ``path`` (a regexp), if given.
        """
        pattern = re.compile(path) if path is not None else None

        def count() -> int:
            watches = [*self.store.finished_watches, *((w.path, w.sent) for w in self.store.watchers())]
            return sum(sent for url, sent in watches if pattern is None or pattern.search(url))

        return self._in_loop(count)

    # ----------------------------------------------------------------------------------------
    # Inspection, without an API client.

    def get_object(
        self, plural: str, name: str, *, namespace: str | None = None, group: str = ''
    ) -> dict[str, Any] | None:
        """A copy of a stored object, or ``None`` if absent; ``plural`` may be ``plural.group``."""
        if not group and '.' in plural:
            plural, group = plural.split('.', 1)
        stored = self._in_loop(lambda: self.store.get((group, plural), namespace, name))
        return json.loads(stored.encoded) if stored is not None else None

    def list_objects(
        self, plural: str, *, namespace: str | None = None, group: str = ''
    ) -> list[dict[str, Any]]:
        """Copies of the stored objects of a resource (in a namespace, or everywhere if ``None``)."""
        if not group and '.' in plural:
            plural, group = plural.split('.', 1)
        encoded = self._in_loop(
            lambda: [stored.encoded for stored in self.store.objects((group, plural), namespace)]
        )
        return [json.loads(item) for item in encoded]
