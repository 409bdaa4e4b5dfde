"""
The floor: a minimal hand-written operator on bare aiohttp, the least an operator must do.

It makes the same API requests per object as the framework's benchmark operators
(``operators/create_only.py`` and ``operators/create_delete.py``) and leaves the same things on
the cluster, but with no framework at all: no registries, causes, loggers, settings, or retries.
So its throughput, CPU and memory are what the substrate (Python, aiohttp, JSON, the API server)
allows, and the framework's numbers are compared against it in ``core_handling.py``.

What it does, for one resource in one namespace:

* one LIST, then one WATCH from the list's resourceVersion, read in chunks (resumed from the last seen
  resourceVersion if the stream ends);
* for each object, reacting to its latest known state (the events of an object that is being
  processed wait, and only the newest of them is processed next, as in the framework):

  - alive, with ``--delete-handler``, without the finalizer: a merge-patch adding the finalizer,
    with the resourceVersion for the optimistic concurrency (the handling itself waits for the
    event of the patched object, as the framework does: it never handles an object whose
    finalizer is not stored yet);
  - alive, not handled yet (no diff-base annotation): the "handler" (which returns
    ``{'message': 'hello'}``), then a merge-patch of the diff-base annotation
    (``kopf.zalando.org/last-handled-configuration``) and a merge-patch of the result into the
    status subresource; both in one merge-patch with ``--no-status-subresource``;
  - deleted (``deletionTimestamp`` is set) and with the finalizer: the "delete handler" (nothing),
    then a merge-patch removing the finalizer (with the resourceVersion).

* at most ``--concurrency`` objects are processed at once (a fixed pool of workers).

With ``--timer INTERVAL`` (for the engines' timer scenarios, as ``operators/timer.py``), every alive
object gets the finalizer as above (the framework's timers need it to be stopped on deletion), and
a timer: its first tick ``--initial-delay`` seconds after the object is seen (listed), then every
``INTERVAL`` seconds after the end of the previous one; a tick is a merge-patch of a per-object counter
into the status (``status.tick``: 1, 2, 3, ...). The ticks are due in a heap (one loop wake-up at a time),
and at most ``--concurrency`` of them are in flight at once (a second fixed pool of workers).

**The scale scenario** (``--scenario scale``, for ``scale.py``): as an operator with only an update handler
over objects that were handled before. The listing is paginated (``--page-size``, 500: ``limit`` +
``continue``), every object is parsed and looked at by a worker (its diff-base annotation compared with
its essence: equal, so nothing is done); once all objects of the listing are looked at, it prints
``SEEN <count> <time.monotonic()>`` (the benchmark reads it from its log), then watches. An object whose
essence differs from its diff-base gets the "update handler": a merge-patch of the new diff-base
annotation and a merge-patch of the result into the status (``status.update_fn``), as the framework does.

Usage: ``python floor_client.py --server http://127.0.0.1:PORT [--delete-handler]`` (or with ``--timer 60
--initial-delay 5`` instead of ``--delete-handler``); it runs until interrupted (SIGINT or SIGTERM).
On a real API server, ``--kubeconfig PATH`` instead of ``--server``: the current context's server, its CA,
and the user's client certificate or bearer token (a file or embedded data, as kubectl reads them).
Only aiohttp is needed (and PyYAML with ``--kubeconfig``); it never imports the framework.

**The lean floor** (``--client lean``): the same operator over the project's own HTTP client
(``kopf._clients.connections.ConnectionPool``: keep-alive connections, the one HTTP/1.1 layer) and its JSON
(``kopf._cogs.helpers.jsons``: orjson when installed), with nothing of the framework above the client (no
vault, no retries, no settings, no reactor). The distance from the framework to it is what the framework
itself costs per object and per tick; the distance from it to the aiohttp floor is what the client saves.
"""
import argparse
import asyncio
import base64
import heapq
import json
import os
import pathlib
import signal
import ssl
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'
LAST_HANDLED = 'kopf.zalando.org/last-handled-configuration'
MERGE_PATCH = {'Content-Type': 'application/merge-patch+json'}


def essence(body: dict[str, Any]) -> str:
    """The diff-base: the object without its status and system fields, as stored by the framework."""
    result: dict[str, Any] = {key: value for key, value in body.items()
                              if key not in ('apiVersion', 'kind', 'metadata', 'status')}
    metadata = body.get('metadata', {})
    labels = metadata.get('labels')
    annotations = {key: value for key, value in metadata.get('annotations', {}).items()
                   if not key.startswith('kopf.zalando.org/')
                   and key != 'kubectl.kubernetes.io/last-applied-configuration'}
    if labels or annotations:
        result['metadata'] = {**({'labels': labels} if labels else {}),
                              **({'annotations': annotations} if annotations else {})}
    return json.dumps(result, separators=(',', ':')) + '\n'


class AiohttpClient:
    """The requests of the floor over aiohttp, with the standard library's JSON."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def patch(self, url: str, patch: dict[str, Any]) -> int:
        async with self.session.patch(url, data=json.dumps(patch), headers=MERGE_PATCH) as response:
            if response.status != 409:
                response.raise_for_status()
            await response.read()
            return response.status

    async def get(self, url: str) -> Any:
        async with self.session.get(url) as response:
            response.raise_for_status()
            return json.loads(await response.read())

    async def watch(self, url: str, params: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.session.get(url, params=params, timeout=timeout) as response:
            response.raise_for_status()
            pending = b''  # an incomplete line at the end of the last chunk
            async for chunk in response.content.iter_any():  # cheaper than a readline() per event
                *lines, pending = (pending + chunk).split(b'\n')
                for line in lines:
                    if line.strip():
                        yield json.loads(line)


class LeanClient:
    """The requests of the floor over the project's own HTTP client and JSON (see the module's docs)."""

    def __init__(self, server: str, tls: ssl.SSLContext | None, headers: dict[str, str]) -> None:
        from kopf._clients.connections import ConnectionPool
        from kopf._cogs.helpers import jsons
        self.jsons = jsons
        self.pool = ConnectionPool(server, ssl_context=tls, headers={**headers, 'Accept': 'application/json'})

    async def patch(self, url: str, patch: dict[str, Any]) -> int:
        response = await self.pool.request('PATCH', url, data=self.jsons.dumps(patch), headers=MERGE_PATCH)
        if response.status >= 400 and response.status != 409:
            raise RuntimeError(f'PATCH {url} failed: {response.status} {response.body[:200]!r}')
        return response.status

    async def get(self, url: str) -> Any:
        response = await self.pool.request('GET', url)
        if response.status >= 400:
            raise RuntimeError(f'GET {url} failed: {response.status} {response.body[:200]!r}')
        return self.jsons.loads(response.body)

    async def watch(self, url: str, params: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        response = await self.pool.stream('GET', url, params=params)
        try:
            if response.status >= 400:
                raise RuntimeError(f'WATCH {url} failed: {response.status} {await response.read()!r}')
            pending = b''
            while chunk := await response.readany():
                *lines, pending = (pending + chunk).split(b'\n')
                for line in lines:
                    if line.strip():
                        yield self.jsons.loads(line)
        finally:
            response.close()

    async def close(self) -> None:
        await self.pool.close()


class Floor:
    """The per-object reactions, the pool of workers, and the list+watch of one resource."""

    def __init__(self, client: AiohttpClient | LeanClient, collection: str, *,
                 delete_handler: bool, status_subresource: bool, concurrency: int,
                 timer: float | None = None, initial_delay: float = 0.0,
                 scale: bool = False, page_size: int = 500) -> None:
        self.client = client
        self.scale = scale  # the scale scenario: an update handler only, a paginated listing
        self.page_size = page_size
        self.unseen: int | None = None  # in the scale scenario: the listed objects not looked at yet
        self.listed = 0
        self.collection = collection  # e.g. /apis/kopf.dev/v1/namespaces/default/kopfexamples
        self.delete_handler = delete_handler or timer is not None
        self.status_subresource = status_subresource
        self.concurrency = concurrency
        self.latest: dict[str, dict[str, Any]] = {}  # the newest unprocessed body of each object
        self.scheduled: set[str] = set()  # the objects in the queue or in a worker's hands
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        # The timers (with --timer): the first tick's due time of the objects seen but not ticking yet,
        # the due ticks in a heap, the ticks' counters, and the ticks ready to go (for the tick workers).
        self.timer = timer
        self.initial_delay = initial_delay
        self.first_due: dict[str, float] = {}
        self.ticking: set[str] = set()
        self.ticks: dict[str, int] = {}
        self.due: list[tuple[float, str]] = []
        self.wakeup: asyncio.TimerHandle | None = None
        self.ready: asyncio.Queue[str] = asyncio.Queue()

    def accept(self, event_type: str, body: dict[str, Any]) -> None:
        """Remember an object's newest state and schedule it, unless it is scheduled already."""
        name = body['metadata']['name']
        if event_type == 'DELETED':
            self.latest.pop(name, None)
            self.ticking.discard(name)
            return
        self.latest[name] = body
        if self.timer is not None and name not in self.first_due:
            self.first_due[name] = asyncio.get_running_loop().time() + self.initial_delay
        if name not in self.scheduled:
            self.scheduled.add(name)
            self.queue.put_nowait(name)

    async def work(self) -> None:
        while True:
            name = await self.queue.get()
            body = self.latest.pop(name, None)
            try:
                if body is not None:
                    await (self.react_to_update(body) if self.scale else self.react(body))
            except Exception as e:  # no retries: the benchmark fails and shows this in the log's tail
                print(f'The floor failed to process {name}: {e!r}', file=sys.stderr, flush=True)
            finally:
                if name in self.latest:  # a newer event came while it was processed
                    self.queue.put_nowait(name)
                else:
                    self.scheduled.discard(name)

    async def react(self, body: dict[str, Any]) -> None:
        metadata = body['metadata']
        url = f'{self.collection}/{metadata["name"]}'
        finalizers: list[str] = metadata.get('finalizers') or []
        if metadata.get('deletionTimestamp'):
            if FINALIZER in finalizers:
                remaining = [f for f in finalizers if f != FINALIZER]
                await self.patch(url, {'metadata': {'finalizers': remaining or None,
                                                    'resourceVersion': metadata['resourceVersion']}})
        elif self.delete_handler and FINALIZER not in finalizers:
            await self.patch(url, {'metadata': {'finalizers': [*finalizers, FINALIZER],
                                                'resourceVersion': metadata['resourceVersion']}})
        elif self.timer is not None:
            name = metadata['name']
            if name not in self.ticking:  # the finalizer is stored: the timer starts (once)
                self.ticking.add(name)
                self.schedule(name, self.first_due[name])
        elif LAST_HANDLED not in metadata.get('annotations', {}):
            result = {'message': 'hello'}  # the create handler's return value
            annotations = {'annotations': {LAST_HANDLED: essence(body)}}
            if self.status_subresource:
                await self.patch(url, {'metadata': annotations})
                await self.patch(f'{url}/status', {'status': {'create_fn': result}})
            else:
                await self.patch(url, {'metadata': annotations, 'status': {'create_fn': result}})

    async def react_to_update(self, body: dict[str, Any]) -> None:
        metadata = body['metadata']
        if self.unseen is not None:
            self.unseen -= 1
            if self.unseen == 0:
                print(f'SEEN {self.listed} {time.monotonic():.6f}', flush=True)
        if metadata.get('deletionTimestamp'):
            return
        new_essence = essence(body)
        if metadata.get('annotations', {}).get(LAST_HANDLED) != new_essence:
            url = f'{self.collection}/{metadata["name"]}'
            await self.patch(url, {'metadata': {'annotations': {LAST_HANDLED: new_essence}}})
            await self.patch(f'{url}/status', {'status': {'update_fn': {'message': 'updated'}}})

    async def list_pages(self) -> str:
        """List page by page (``limit`` + ``continue``), accept every object; the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            query = f'?limit={self.page_size}' + (f'&continue={urllib.parse.quote(token)}' if token else '')
            page = await self.client.get(self.collection + query)
            items.extend(page['items'])
            token = page['metadata'].get('continue')
            if not token:
                break
        self.unseen = self.listed = len(items)
        if not items:
            print(f'SEEN 0 {time.monotonic():.6f}', flush=True)
        for item in items:
            self.accept('ADDED', item)
        return str(page['metadata']['resourceVersion'])

    async def patch(self, url: str, patch: dict[str, Any]) -> None:
        await self.client.patch(url, patch)  # a 409 (changed meanwhile): its newer event will come

    def schedule(self, name: str, due: float) -> None:
        heapq.heappush(self.due, (due, name))
        if self.wakeup is None or self.wakeup.when() > self.due[0][0]:
            if self.wakeup is not None:
                self.wakeup.cancel()
            self.wakeup = asyncio.get_running_loop().call_at(self.due[0][0], self.wake_up)

    def wake_up(self) -> None:
        self.wakeup = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self.due and self.due[0][0] <= now:
            self.ready.put_nowait(heapq.heappop(self.due)[1])
        if self.due:
            self.wakeup = loop.call_at(self.due[0][0], self.wake_up)

    async def tick(self) -> None:
        assert self.timer is not None
        loop = asyncio.get_running_loop()
        while True:
            name = await self.ready.get()
            if name not in self.ticking:
                continue
            count = self.ticks[name] = self.ticks.get(name, 0) + 1
            try:
                await self.patch(f'{self.collection}/{name}/status', {'status': {'tick': count}})
            except Exception as e:  # no retries: the benchmark fails and shows this in the log's tail
                print(f'The floor failed to tick {name}: {e!r}', file=sys.stderr, flush=True)
            self.schedule(name, loop.time() + self.timer)

    async def run(self) -> None:
        workers = [asyncio.create_task(self.work()) for _ in range(self.concurrency)]
        if self.timer is not None:
            workers += [asyncio.create_task(self.tick()) for _ in range(self.concurrency)]
        try:
            if self.scale:
                version = await self.list_pages()
            else:
                listing = await self.client.get(self.collection)
                for item in listing['items']:
                    self.accept('ADDED', item)
                version = listing['metadata']['resourceVersion']
            while True:  # the stream may end (a server's timeout): resume from the last version
                version = await self.watch(version)
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def watch(self, version: str) -> str:
        params = {'watch': 'true', 'allowWatchBookmarks': 'true', 'resourceVersion': version}
        async for event in self.client.watch(self.collection, params):
            if event['type'] == 'ERROR':
                raise RuntimeError(f'The watch failed: {event["object"]}')
            body = event['object']
            version = body['metadata']['resourceVersion']
            if event['type'] != 'BOOKMARK':
                self.accept(event['type'], body)
        return version


def login(kubeconfig: str) -> tuple[str, ssl.SSLContext | None, dict[str, str]]:
    """
    The server, the TLS context, and the headers from a kubeconfig's current context.

    The CA and the client certificate & key come from files (relative to the kubeconfig) or are
    embedded (``*-data``, base64); the bearer token is given or in a file. Nothing else (no exec
    plugins, no auth providers): what a test server's kubeconfig has.
    """
    import yaml  # only here: the floor needs no PyYAML on the emulator (``--server``)

    path = pathlib.Path(kubeconfig)
    config = yaml.safe_load(path.read_text())

    def entry(kind: str, name: str | None) -> dict[str, Any]:
        found = [item for item in config.get(kind) or [] if item.get('name') == name]
        if not found:
            raise ValueError(f'No {kind[:-1]} named {name!r} in {kubeconfig}.')
        return dict(found[0].get(kind[:-1]) or {})

    current = entry('contexts', config.get('current-context'))
    cluster = entry('clusters', current.get('cluster'))
    user = entry('users', current.get('user')) if current.get('user') else {}

    def pem(data_key: str, file_key: str, fields: dict[str, Any]) -> bytes | None:
        if fields.get(data_key):
            return base64.b64decode(fields[data_key])
        if fields.get(file_key):
            return (path.parent / str(fields[file_key])).read_bytes()
        return None

    headers: dict[str, str] = {}
    token = user.get('token') or (
        (path.parent / user['tokenFile']).read_text().strip() if user.get('tokenFile') else None)
    if token:
        headers['Authorization'] = f'Bearer {token}'
    server: str = cluster['server']
    if not server.startswith('https:'):
        return server, None, headers
    ca = pem('certificate-authority-data', 'certificate-authority', cluster)
    tls = ssl.create_default_context(cadata=ca.decode() if ca is not None else None)
    if cluster.get('insecure-skip-tls-verify'):
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    certificate = pem('client-certificate-data', 'client-certificate', user)
    key = pem('client-key-data', 'client-key', user)
    if certificate is not None and key is not None:
        with tempfile.TemporaryDirectory() as directory:  # ssl loads a chain from files only
            for name, content in [('tls.crt', certificate), ('tls.key', key)]:
                descriptor = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT, 0o600)
                with os.fdopen(descriptor, 'wb') as file:
                    file.write(content)
            tls.load_cert_chain(os.path.join(directory, 'tls.crt'), os.path.join(directory, 'tls.key'))
    return server, tls, headers


async def main(args: argparse.Namespace) -> None:
    collection = f'/apis/{args.group}/{args.version}/namespaces/{args.namespace}/{args.plural}'
    server, tls, headers = login(args.kubeconfig) if args.kubeconfig else (args.server, None, {})
    if args.client == 'lean':
        lean = LeanClient(args.server or server, tls, headers)
        try:
            await serve(lean, collection, args)
        finally:
            await lean.close()
        return
    connector = aiohttp.TCPConnector(limit=0, ssl=tls or True)  # the pool of workers is the limit
    async with aiohttp.ClientSession(base_url=args.server or server, connector=connector,
                                     headers=headers) as session:
        await serve(AiohttpClient(session), collection, args)


async def serve(client: AiohttpClient | LeanClient, collection: str, args: argparse.Namespace) -> None:
    floor = Floor(client, collection, delete_handler=args.delete_handler,
                  status_subresource=not args.no_status_subresource, concurrency=args.concurrency,
                  timer=args.timer, initial_delay=args.initial_delay,
                  scale=args.scenario == 'scale', page_size=args.page_size)
    task = asyncio.create_task(floor.run())
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        pass


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--server', help='the API server URL, e.g. http://127.0.0.1:8080 (no credentials)')
    parser.add_argument('--kubeconfig', help="a kubeconfig: its current context's server, CA and credentials")
    parser.add_argument('--group', default='kopf.dev')
    parser.add_argument('--version', default='v1')
    parser.add_argument('--plural', default='kopfexamples')
    parser.add_argument('--namespace', default='default')
    parser.add_argument('--delete-handler', action='store_true',
                        help='as with a delete handler: add the finalizer, remove it on deletion')
    parser.add_argument('--no-status-subresource', action='store_true',
                        help='the CRD has no status subresource: the result and the diff-base in one patch')
    parser.add_argument('--concurrency', type=int, default=100, help='objects processed at once (100)')
    parser.add_argument('--uvloop', action='store_true', help="run on uvloop's event loop")
    parser.add_argument('--client', choices=['aiohttp', 'lean'], default='aiohttp',
                        help="aiohttp (the floor), or the project's own HTTP client & JSON (the lean floor)")
    parser.add_argument('--timer', type=float, default=None, metavar='INTERVAL',
                        help='a timer per object (with the finalizer) that patches a counter into the status')
    parser.add_argument('--initial-delay', type=float, default=0.0,
                        help="with --timer: the first tick's delay after the object is seen (0)")
    parser.add_argument('--scenario', choices=['handling', 'scale'], default='handling',
                        help='handling (create/delete/timer, as above), or scale (an update handler only, '
                             'a paginated listing, SEEN printed: see the module docs)')
    parser.add_argument('--page-size', type=int, default=500, help='--scenario scale: the limit per page')
    args = parser.parse_args()
    if not args.server and not args.kubeconfig:
        parser.error('Either --server or --kubeconfig is needed.')
    if args.concurrency < 1:
        parser.error(f'--concurrency must be at least 1, got {args.concurrency}.')
    if args.timer is not None and args.timer <= 0:
        parser.error(f'--timer must be a positive interval in seconds, got {args.timer}.')
    return args


if __name__ == '__main__':
    arguments = parse_arguments()
    if arguments.uvloop:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(main(arguments))
