"""
A deterministic gauge of the HTTP layer: CPU instructions per request, watch-event and review (callgrind).

Three scenarios, each measured in a process under callgrind while its peer runs in another process
(not counted), as the difference of two runs (``--counts``), so that the start-up cancels out:

* ``requests``: the API client (``ConnectionPool.request``) makes N GET requests one after another over
  one keep-alive connection to a canned server that answers each with an object's JSON and the headers
  of a real kube-apiserver (``Audit-Id``, the priority & fairness UIDs, ``Date``...);
* ``watch-quiet``/``watch-burst``: N watch-events through the client's stream parsing: a chunked response
  (an event per chunk, as kube-apiserver writes them) fed to the client's connection protocol in-process
  (no sockets: their reads would be cut by the timing), an event per read (a quiet stream) or in 16 KiB
  reads (a burst: the events and chunks are cut anywhere), each read taken by the consumer
  (``read_stream()``, what ``readany()`` awaits) and split into lines as the watching does;
* ``reviews``/``reviews-tls``: the webhook server's HTTP layer (``kopf._webhooks.http.start_server`` with a
  handler that returns a canned review) answers N AdmissionReviews (2 KiB, with the headers of
  kube-apiserver's webhook client) posted one after another over one keep-alive connection, plain or TLS;
* ``admission-tls``: the same reviews through the whole path of an operator's review: ``kopf.WebhookServer``
  over TLS, the framework's webhook function (``make_webhook_fn``) and a validating handler.

The measured processes run with ``PYTHONHASHSEED=0``: with random seeds, their start-ups differ by a few
million instructions, which do not cancel out (±2-4% per review in the runs of the same code).

Usage (valgrind must be installed; each Python must have this project installed, e.g. a venv copy)::

    python benchmarks/http_gauge.py --python /tmp/before/bin/python --python .venv/bin/python
    python benchmarks/http_gauge.py --scenario watch-quiet --scenario watch-burst
"""
import argparse
import asyncio
import json
import os
import pathlib
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve()
SCENARIOS = ['requests', 'watch-quiet', 'watch-burst', 'reviews', 'reviews-tls', 'admission-tls']


def make_object(index: int) -> dict[str, Any]:
    return {
        'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
        'metadata': {'name': f'kex-{index}', 'namespace': 'default', 'uid': f'c0ffee-{index:08d}',
                     'resourceVersion': str(100000 + index), 'generation': 1,
                     'creationTimestamp': '2026-11-27T00:00:00Z', 'labels': {'somelabel': 'somevalue'},
                     'finalizers': ['kopf.zalando.org/KopfFinalizerMarker'],
                     'managedFields': [{'manager': 'kopf', 'operation': 'Update', 'apiVersion': 'kopf.dev/v1',
                                        'time': '2026-11-27T00:00:00Z', 'fieldsType': 'FieldsV1'}]},
        'spec': {'field': 'value', 'items': ['item1', 'item2']},
        'status': {'create_fn': {'message': 'hello'}},
    }


APISERVER_HEADERS = (
    b'Audit-Id: 6c2e4d8a-1f6a-4f64-9c51-2f7f1d2b2b5a\r\n'
    b'Cache-Control: no-cache, private\r\n'
    b'Content-Type: application/json\r\n'
    b'X-Kubernetes-Pf-Flowschema-Uid: 1c8e3e59-3c0b-4a69-8d07-8d5c7d4d6c1d\r\n'
    b'X-Kubernetes-Pf-Prioritylevel-Uid: 0f3f4a47-7e4b-4bfb-9a8c-2d3bc3d5e0f2\r\n'
    b'Date: Fri, 27 Nov 2026 00:00:00 GMT\r\n'
)


def make_review(index: int) -> bytes:
    return json.dumps({
        'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview',
        'request': {
            'uid': f'705ab4f5-6393-11e8-b7cc-{index:012d}',
            'kind': {'group': 'kopf.dev', 'version': 'v1', 'kind': 'KopfExample'},
            'resource': {'group': 'kopf.dev', 'version': 'v1', 'resource': 'kopfexamples'},
            'requestKind': {'group': 'kopf.dev', 'version': 'v1', 'kind': 'KopfExample'},
            'requestResource': {'group': 'kopf.dev', 'version': 'v1', 'resource': 'kopfexamples'},
            'name': f'kex-{index}', 'namespace': 'default', 'operation': 'UPDATE',
            'userInfo': {'username': 'admin', 'uid': 'admin',
                         'groups': ['system:masters', 'system:authenticated']},
            'object': make_object(index), 'oldObject': make_object(index), 'dryRun': False,
            'options': {'kind': 'UpdateOptions', 'apiVersion': 'meta.k8s.io/v1'},
        },
    }).encode()


def review_request(index: int, port: int) -> bytes:
    body = make_review(index)
    return (b'POST /validate_fn?timeout=10s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n'
            b'User-Agent: kube-apiserver-admission\r\nContent-Length: %d\r\nAccept: application/json, */*\r\n'
            b'Content-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n%s') % (port, len(body), body)


#
# The peers (not counted).
#

def serve_responses(port: int) -> None:
    """The canned API server: the same 200 response with an object's JSON to every request."""
    payload = json.dumps(make_object(0), separators=(',', ':')).encode()
    response = b'HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s' % (
        APISERVER_HEADERS, len(payload), payload)

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            self.buffer = b''

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while (end := self.buffer.find(b'\r\n\r\n')) >= 0:
                self.buffer = self.buffer[end + 4:]  # GET requests only: no bodies
                self.transport.write(response)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Protocol, '127.0.0.1', port)
        await server.serve_forever()

    asyncio.run(main())


def post_reviews(port: int, count: int, context: ssl.SSLContext | None) -> None:
    """The load generator: ``count`` reviews one after another over one connection, then ``/quit``."""
    requests = [review_request(index, port) for index in range(count)]
    requests.append(b'POST /quit HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}')
    with socket.create_connection(('127.0.0.1', port)) as raw:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = context.wrap_socket(raw, server_hostname='127.0.0.1') if context is not None else raw
        buffer = b''
        for request in requests:
            sock.sendall(request)
            while (end := buffer.find(b'\r\n\r\n')) < 0 or len(buffer) < end + 4 + _length(buffer[:end]):
                data = sock.recv(65536)
                if not data:
                    raise RuntimeError('The webhook server has closed the connection.')
                buffer += data
            status = buffer[9:12]
            if status != b'200':
                raise RuntimeError(f'The webhook server has answered {buffer[:200]!r}.')
            buffer = buffer[end + 4 + _length(buffer[:end]):]


def _length(head: bytes) -> int:
    match = re.search(rb'\r\ncontent-length:\s*(\d+)', head, re.IGNORECASE)
    return int(match.group(1)) if match else 0


#
# The measured sides (under callgrind).
#

def drive_requests(port: int, count: int) -> None:
    from kopf._clients.connections import ConnectionPool

    async def main() -> None:
        pool = ConnectionPool(f'http://127.0.0.1:{port}', ssl_context=None,
                              headers={'User-Agent': 'kopf/bench', 'Authorization': 'Bearer x'})
        try:
            for index in range(count):
                path = f'/apis/kopf.dev/v1/namespaces/default/kopfexamples/kex-{index}'
                response = await pool.request('GET', path)
                assert response.status == 200
        finally:
            await pool.close()

    asyncio.run(main())


class _FakeTransport(asyncio.Transport):
    def write(self, data: Any) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def drive_watch(count: int, mode: str) -> None:
    from kopf._clients.connections import _Connection

    # The same event every time: its making is not measured (the parsing does not depend on the content).
    event = json.dumps({'type': 'MODIFIED', 'object': make_object(0)}, separators=(',', ':')).encode() + b'\n'
    chunks = [b'%x\r\n%s\r\n' % (len(event), event)] * count
    headers = APISERVER_HEADERS.replace(b'application/json', b'application/json;stream=watch')
    head = b'HTTP/1.1 200 OK\r\n%sTransfer-Encoding: chunked\r\n\r\n' % headers
    stream = b''.join(chunks)
    bursts = [stream[i:i + 16384] for i in range(0, len(stream), 16384)]

    async def consume(connection: Any, reads: list[bytes]) -> int:
        connection.send(b'', None, no_body=False, streaming=True)
        connection.data_received(head)
        lines = 0
        rest = b''
        for data in reads:
            connection.data_received(data)
            rest += await connection.read_stream()
            *complete, rest = rest.split(b'\n')
            lines += len(complete)
        return lines

    async def main() -> None:
        connection = _Connection()
        connection.connection_made(_FakeTransport())
        lines = await consume(connection, chunks if mode == 'quiet' else bursts)
        assert lines == count, (lines, count)

    asyncio.run(main())


def drive_reviews(port_file: str, tls: bool) -> None:
    from kopf._webhooks import http

    payload = json.dumps({'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview',
                          'response': {'uid': '705ab4f5-6393-11e8-b7cc-000000000000',
                                       'allowed': True}}).encode()

    async def main() -> None:
        quit_ = asyncio.Event()

        async def handler(request: Any) -> Any:
            if request.path == '/quit':
                quit_.set()
            return 200, 'application/json', payload, ''

        context = None
        if tls:
            folder = pathlib.Path(port_file).parent
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(folder / 'cert.pem', folder / 'pkey.pem')
        listener = await http.start_server(handler, host='127.0.0.1', port=0, ssl_context=context,
                                           max_body_size=6 * 1024 * 1024)
        pathlib.Path(port_file).write_text(str(listener.port))  # noqa: ASYNC240  # once, at the start
        await quit_.wait()
        await http.stop_server(listener)

    asyncio.run(main())


def drive_admission(port_file: str) -> None:
    import types

    import kopf
    from kopf._cogs.structs.references import Resource
    from kopf._core.engines.admission import make_webhook_fn

    registry = kopf.OperatorRegistry()

    @kopf.on.validate('kopf.dev', 'v1', 'kopfexamples', registry=registry)
    async def validate_fn(spec: kopf.Spec, **_: Any) -> None:
        if spec.get('field') == 'bad':
            raise kopf.AdmissionError('Bad field.')

    async def main() -> None:
        quit_ = asyncio.Event()
        ready = asyncio.Event()
        ready.set()
        resource = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', namespaced=True)
        insights = types.SimpleNamespace(webhook_resources={resource}, ready_resources=ready)
        review_fn = make_webhook_fn(registry=registry, settings=kopf.OperatorSettings(), insights=insights)

        async def webhook_fn(request: Any, *, webhook: Any = None, **kwargs: Any) -> Any:
            if webhook == 'quit':
                quit_.set()
                return {}
            return await review_fn(request, webhook=webhook, **kwargs)

        folder = pathlib.Path(port_file).parent
        server = kopf.WebhookServer(addr='127.0.0.1', port=0, host='127.0.0.1',
                                    certfile=folder / 'cert.pem', pkeyfile=folder / 'pkey.pem')
        async with server:
            configs = server(webhook_fn)
            config = await configs.__anext__()
            pathlib.Path(port_file).write_text(config['url'].rsplit(':', 1)[1])  # noqa: ASYNC240
            await quit_.wait()
            await configs.aclose()

    asyncio.run(main())


#
# The measurement.
#

# The same hashes in every run: the dicts' & sets' layouts (and their probes) do not vary by ~1% between runs.
ENV = dict(os.environ, PYTHONHASHSEED='0')


def count_instructions(python: str, *args: str) -> int:
    command = ['valgrind', '--tool=callgrind', '--callgrind-out-file=/dev/null', python, str(HERE), *args]
    result = subprocess.run(command, capture_output=True, text=True, check=True, env=ENV)
    match = re.search(r'Collected : (\d+)', result.stderr)
    if match is None:
        raise RuntimeError(f'No instructions counted by callgrind:\n{result.stderr[-2000:]}')
    return int(match.group(1))


def count_reviews(python: str, count: int, tls: bool, folder: pathlib.Path, *, whole: bool = False) -> int:
    port_file = folder / 'port'
    port_file.unlink(missing_ok=True)
    mode = ['--drive-admission', str(port_file)] if whole else ['--drive-reviews', str(port_file)]
    command = ['valgrind', '--tool=callgrind', '--callgrind-out-file=/dev/null', python, str(HERE),
               *mode, *(['--tls'] if tls else [])]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        while not port_file.exists() or not port_file.read_text():
            if server.poll() is not None:
                stderr = server.stderr.read() if server.stderr else ''
                raise RuntimeError(f'The webhook server has failed:\n{stderr}')
            time.sleep(0.1)
        context = None
        if tls:
            context = ssl.create_default_context(cafile=str(folder / 'cert.pem'))
        post_reviews(int(port_file.read_text()), count, context)
        _, stderr = server.communicate(timeout=600)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    match = re.search(r'Collected : (\d+)', stderr)
    if match is None:
        raise RuntimeError(f'No instructions counted by callgrind:\n{stderr[-2000:]}')
    return int(match.group(1))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0] if __doc__ else None)
    parser.add_argument('--python', action='append', help='the Python(s) to measure (default: this one)')
    parser.add_argument('--scenario', action='append', choices=SCENARIOS, help='all by default')
    parser.add_argument('--counts', default='200,1200', help='the two runs\' requests/events/reviews')
    parser.add_argument('--serve', type=int, help=argparse.SUPPRESS)
    parser.add_argument('--drive-requests', nargs=2, type=int, help=argparse.SUPPRESS)
    parser.add_argument('--drive-watch', nargs=2, help=argparse.SUPPRESS)
    parser.add_argument('--drive-reviews', help=argparse.SUPPRESS)
    parser.add_argument('--drive-admission', help=argparse.SUPPRESS)
    parser.add_argument('--tls', action='store_true', help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.serve is not None:
        serve_responses(args.serve)
        return
    if args.drive_requests is not None:
        drive_requests(*args.drive_requests)
        return
    if args.drive_watch is not None:
        drive_watch(int(args.drive_watch[0]), args.drive_watch[1])
        return
    if args.drive_reviews is not None:
        drive_reviews(args.drive_reviews, args.tls)
        return
    if args.drive_admission is not None:
        drive_admission(args.drive_admission)
        return

    if shutil.which('valgrind') is None:
        sys.exit('valgrind is needed: e.g. `apt-get install valgrind`.')
    low, high = (int(value) for value in args.counts.split(','))
    scenarios = args.scenario or SCENARIOS
    pythons = args.python or [sys.executable]
    with tempfile.TemporaryDirectory(prefix='kopf-http-gauge-') as tmpdir:
        folder = pathlib.Path(tmpdir)
        if any(scenario.endswith('-tls') for scenario in scenarios):  # made here: not measured
            from kopf._webhooks.certificates import build_certificate
            cert, pkey = build_certificate(['127.0.0.1'])
            (folder / 'cert.pem').write_bytes(cert)
            (folder / 'pkey.pem').write_bytes(pkey)
        port = free_port()
        server = subprocess.Popen([sys.executable, str(HERE), '--serve', str(port)])
        try:
            for _ in range(100):  # until the canned server listens
                with socket.socket() as sock:
                    if sock.connect_ex(('127.0.0.1', port)) == 0:
                        break
                time.sleep(0.05)
            for scenario in scenarios:
                for python in pythons:
                    counts = []
                    for count in (low, high):
                        if scenario == 'requests':
                            counts.append(count_instructions(python, '--drive-requests', str(port),
                                                             str(count)))
                        elif scenario.startswith('watch-'):
                            mode = scenario.split('-')[1]
                            counts.append(count_instructions(python, '--drive-watch', str(count), mode))
                        else:
                            counts.append(count_reviews(python, count, scenario.endswith('-tls'), folder,
                                                        whole=scenario.startswith('admission')))
                    per_unit = (counts[1] - counts[0]) / (high - low)
                    unit = {'requests': 'request', 'watch-quiet': 'watch-event (an event per read)',
                            'watch-burst': 'watch-event (16 KiB reads)',
                            'reviews': 'review', 'reviews-tls': 'review over TLS',
                            'admission-tls': 'review through kopf.WebhookServer & a handler'}[scenario]
                    print(f'{python}: {scenario}: {per_unit:,.0f} instructions per {unit}', flush=True)
        finally:
            server.terminate()
            server.wait()


if __name__ == '__main__':
    main()
