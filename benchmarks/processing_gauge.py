"""
A deterministic gauge of the processing's cost: the CPU instructions per processed event, under callgrind.

The wall-clock benchmarks (``core_handling.py``) vary by ±15% from run to run on a shared VM, and the whole
operator under callgrind by ±3-5% (its batches and timers follow the wall clock, which valgrind slows
down 50x). A cut of 1-2% of the per-object work is invisible in both. This gauge sees it (±0.3%):

* one object's event at a time is given to ``process_resource_event()`` directly (no watch-stream, no
  queueing), with a create and a delete handler (async by default: no threads, whose timing varies);
* the requests go to a canned HTTP server in another process (not counted): every request gets
  the same 200 response with an object's JSON, so the client does its full work;
* the instructions of N events are the difference of two runs (``--events 300,1300``: 1,000 events),
  so that the start-up (imports, the first connection) cancels out;
* the seats are never lent out (``pacing.LENDING_DELAY``): under valgrind, a handler's call outlasts
  the 50 ms of the lending, which would add ~180 k instructions per event, by the wall clock.

The phases: ``delete`` (a MODIFIED event of an object marked for deletion with our finalizer: the handler,
then the finalizer's removal) and ``create`` (a listed object never handled: the finalizer, the handler,
the diff-base and the result); for the timers (#39's target 2), ``tick`` (one object's timer called again
and again with ``interval`` ~0: the scheduler's wake-up, the call's task, the handler's call, its status
patch) and ``echo`` (the watch-events of the timers' own patches, one per tick: an object with only a timer,
whose events need no worker, shown to the spawning engine by the queueing's ``Forgetter``; no requests).
Per processed event; for ``tick``, per tick.

Usage (valgrind must be installed; each Python must have this project installed, e.g. a venv copy)::

    python benchmarks/processing_gauge.py --python .venv/bin/python --python /tmp/other/bin/python
    python benchmarks/processing_gauge.py --phase create --sync
"""
import argparse
import asyncio
import json
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve()

ESSENCE = {'spec': {'field': 'value', 'items': ['item1', 'item2']},
           'metadata': {'labels': {'somelabel': 'somevalue'}}}


def make_body(index: int, *, deleted: bool) -> dict[str, Any]:
    """An object as stored after its creation was handled and it was deleted; if not ``deleted``, as new."""
    metadata: dict[str, Any] = {
        'name': f'kex-{index}', 'namespace': 'default', 'uid': f'c0ffee-{index}', 'resourceVersion': '12345',
        'generation': 1, 'creationTimestamp': '2026-11-27T00:00:00Z', 'labels': {'somelabel': 'somevalue'},
        'managedFields': [{'manager': 'x', 'operation': 'Update', 'apiVersion': 'kopf.dev/v1',
                           'time': '2026-11-27T00:00:00Z'}],
    }
    body: dict[str, Any] = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': metadata,
                            'spec': {'field': 'value', 'items': ['item1', 'item2']}}
    if deleted:
        metadata.update(deletionTimestamp='2026-11-27T00:01:00Z', deletionGracePeriodSeconds=0,
                        finalizers=['kopf.zalando.org/KopfFinalizerMarker'],
                        annotations={'kopf.zalando.org/last-handled-configuration':
                                     json.dumps(ESSENCE, separators=(',', ':')) + '\n'})
        body['status'] = {'create_fn': {'message': 'hello'}}
    return body


def make_ticking_body(index: int, version: int = 12345) -> dict[str, Any]:
    """An object of a resource with only a timer: as stored once the finalizer is added (and ticked)."""
    body = make_body(index, deleted=False)
    body['metadata'].update(finalizers=['kopf.zalando.org/KopfFinalizerMarker'], resourceVersion=str(version))
    body['status'] = {'tick': version}
    return body


def serve(port: int, phase: str) -> None:
    """The canned HTTP/1.1 server: the same 200 response with an object's JSON to every request."""
    body = make_ticking_body(0) if phase == 'tick' else make_body(0, deleted=True)
    if phase == 'create':  # a newer version than the listed objects', as the servers answer our patches
        body['metadata']['resourceVersion'] = '12346'
    # (The release of a deleted object is answered with the version that it had: the update is not stored.)
    payload = json.dumps(body, separators=(',', ':')).encode()  # compact, as the API servers send it
    response = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' % (
        len(payload), payload)

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            self.buffer = b''

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while (end := self.buffer.find(b'\r\n\r\n')) >= 0:
                head = self.buffer[:end].decode('latin-1').lower()
                match = re.search(r'\r\ncontent-length:\s*(\d+)', head)
                size = int(match.group(1)) if match else 0
                if len(self.buffer) < end + 4 + size:
                    return
                self.buffer = self.buffer[end + 4 + size:]
                self.transport.write(response)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Protocol, '127.0.0.1', port)
        await server.serve_forever()

    asyncio.run(main())


def drive_timers(port: int, count: int, phase: str, sync: bool) -> None:
    """
    ``tick``: one object's timer called ``count`` times in a row; ``echo``: ``count`` events of the object.

    For ``tick``, the timer's interval is ~0, so every next call is due as soon as the previous one ends: the
    calls go one after another through the scheduler as in an operator (its wake-up, the hands, the task),
    with nothing else in the loop. For ``echo``, the timer is never due (in the run).
    """
    import kopf
    from kopf._clients.vault import Vault
    from kopf._cogs.structs.credentials import ConnectionInfo, VaultKey
    from kopf._cogs.structs.references import Resource
    from kopf._core.engines.spawning import SpawningEngine
    from kopf._core.reactor import pacing, processing
    from kopf._core.reactor.contexts import Delivery, OperatorScope
    from kopf._core.reactor.inventory import ResourceMemories

    pacing.LENDING_DELAY = 1e6  # see the module's docs: no lending by the wall clock of valgrind
    registry = kopf.OperatorRegistry()
    resource = Resource('kopf.dev', 'v1', 'kopfexamples', namespaced=True, subresources=frozenset({'status'}))
    ticking = phase == 'tick'
    done: asyncio.Future[None] | None = None
    ticks = 0

    def tick(patch: kopf.Patch) -> None:  # in the loop's thread or in an executor's (sync)
        nonlocal ticks
        ticks += 1
        patch.status['tick'] = ticks
        if ticks == count and done is not None:
            done.get_loop().call_soon_threadsafe(done.set_result, None)

    options: dict[str, Any] = {'interval': 1e-9} if ticking else {'interval': 1e6, 'initial_delay': 1e6}
    fn: Any
    if sync:
        def fn(patch: kopf.Patch, **_: Any) -> None:
            tick(patch)
    else:
        async def fn(patch: kopf.Patch, **_: Any) -> None:
            tick(patch)
    kopf.timer('kopf.dev', 'v1', 'kopfexamples', registry=registry, **options)(fn)
    settings = kopf.OperatorSettings()

    async def main() -> None:
        nonlocal done
        done = asyncio.get_running_loop().create_future()
        vault = Vault({VaultKey('main'): ConnectionInfo(server=f'http://127.0.0.1:{port}', token='x')})
        spawner = SpawningEngine(registry=registry, settings=settings, vault=vault)
        scope = OperatorScope(registry=registry, settings=settings, memories=ResourceMemories(), vault=vault,
                              pacer=pacing.Pacer(), spawner=spawner)
        try:
            # The object as listed: its timer starts (no request: our finalizer is there already).
            await processing.process_event(Delivery({'type': None, 'object': make_ticking_body(0)}, resource),
                                           scope=scope)
            if ticking:
                await done
            else:
                for version in range(12346, 12346 + count):
                    event: Any = {'type': 'MODIFIED', 'object': make_ticking_body(0, version)}
                    if not processing.finish_unattended(raw_event=event, resource=resource, scope=scope):
                        raise RuntimeError('The echo was not finished with no worker: the gauge is wrong.')
        finally:
            await spawner.shutdown()
            await vault.close()

    asyncio.run(main())


def drive(port: int, count: int, phase: str, sync: bool, metrics: bool = False) -> None:
    """Process the events of ``count`` objects one by one, against the canned server (run under callgrind)."""
    if phase in ('tick', 'echo'):
        drive_timers(port, count, phase, sync)
        return
    import kopf
    from kopf._cogs.structs.credentials import ConnectionInfo, VaultKey
    from kopf._cogs.structs.references import Resource
    from kopf._core.reactor import pacing, processing

    pacing.LENDING_DELAY = 1e6  # see the module's docs: no lending by the wall clock of valgrind
    if metrics:  # the framework's metrics on (as with `kopf run --metrics URL`), not served
        from kopf._cogs.helpers import metering
        metering.enable()
    registry = kopf.OperatorRegistry()
    resource = Resource('kopf.dev', 'v1', 'kopfexamples', namespaced=True, subresources=frozenset({'status'}))
    if sync:
        def create_fn(**_: Any) -> Any:
            return {'message': 'hello'}

        def delete_fn(**_: Any) -> None:
            pass
    else:
        async def create_fn(**_: Any) -> Any:
            return {'message': 'hello'}

        async def delete_fn(**_: Any) -> None:
            pass
    kopf.on.create('kopf.dev', 'v1', 'kopfexamples', registry=registry)(create_fn)
    kopf.on.delete('kopf.dev', 'v1', 'kopfexamples', registry=registry)(delete_fn)
    settings = kopf.OperatorSettings()
    deleted = phase == 'delete'
    events = [{'type': 'MODIFIED' if deleted else None, 'object': make_body(i, deleted=deleted)}
              for i in range(count)]

    async def main() -> None:
        from kopf._clients.vault import Vault
        from kopf._core.reactor.inventory import ResourceMemories
        vault = Vault({VaultKey('main'): ConnectionInfo(server=f'http://127.0.0.1:{port}', token='x')})
        memories = ResourceMemories()
        pacer = pacing.Pacer()
        try:
            if hasattr(processing, 'process_event'):  # this version
                from kopf._core.reactor.contexts import Delivery, OperatorScope
                scope = OperatorScope(registry=registry, settings=settings, memories=memories, vault=vault,
                                      pacer=pacer)
                for event in events:
                    await processing.process_event(Delivery(event, resource), scope=scope)
            else:  # the versions before the event path in stages (for the comparisons)
                for event in events:
                    await processing.process_resource_event(
                        raw_event=event, resource=resource, registry=registry, settings=settings,
                        memories=memories, vault=vault, pacer=pacer)
        finally:
            await vault.close()

    asyncio.run(main())


def count_instructions(
        python: str, port: int, count: int, phase: str, sync: bool, metrics: bool = False,
) -> int:
    command = ['valgrind', '--tool=callgrind', '--callgrind-out-file=/dev/null',
               python, str(HERE), '--drive', str(port), str(count), phase, *(['--sync'] if sync else []),
               *(['--metrics'] if metrics else [])]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    match = re.search(r'Collected : (\d+)', result.stderr)
    if match is None:
        raise RuntimeError(f'No instructions counted by callgrind:\n{result.stderr[-2000:]}')
    return int(match.group(1))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0] if __doc__ else None)
    parser.add_argument('--python', action='append', help='the Python(s) to measure (default: this one)')
    parser.add_argument('--phase', choices=['delete', 'create', 'tick', 'echo'], default='delete')
    parser.add_argument('--sync', action='store_true', help='sync handlers (called in threads)')
    parser.add_argument('--events', default='300,1300', help='the two runs\' numbers of events')
    parser.add_argument('--metrics', action='store_true', help='with the framework\'s metrics on')
    parser.add_argument('--serve', nargs=2, help=argparse.SUPPRESS)
    parser.add_argument('--drive', nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.serve is not None:
        serve(int(args.serve[0]), args.serve[1])
        return
    if args.drive is not None:
        port, count, phase = args.drive
        drive(int(port), int(count), phase, args.sync, args.metrics)
        return

    if shutil.which('valgrind') is None:
        sys.exit('valgrind is needed: e.g. `apt-get install valgrind`.')
    low, high = (int(value) for value in args.events.split(','))
    port = free_port()
    server = subprocess.Popen([sys.executable, str(HERE), '--serve', str(port), args.phase])
    try:
        for _ in range(100):  # until the server listens
            with socket.socket() as sock:
                if sock.connect_ex(('127.0.0.1', port)) == 0:
                    break
            time.sleep(0.05)
        for python in args.python or [sys.executable]:
            few = count_instructions(python, port, low, args.phase, args.sync, args.metrics)
            many = count_instructions(python, port, high, args.phase, args.sync, args.metrics)
            per_event = (many - few) / (high - low)
            mode = (' (sync)' if args.sync else '') + (' (metrics on)' if args.metrics else '')
            print(f'{python}: {args.phase}{mode}: {per_event:,.0f} instructions per processed event',
                  flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == '__main__':
    main()
