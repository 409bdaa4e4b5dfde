"""
The admission benchmark: reviews over TLS to a validating and a mutating handler, this project vs Kopf 1.45.2.

The same operator file (``operators/admission.py``) runs under both implementations in a subprocess
pinned to one CPU core (``taskset -c 0``), with ``kopf.WebhookServer`` on a local port and a certificate
made here (Kopf's self-signed certificates cannot be made on OpenSSL 3.0.10+). The emulator (the API
server the operators log in to and observe; a process of its own) and the load generator (this
process) are pinned to the other core. The load generator speaks bare HTTP/1.1 over TLS keep-alive
connections, so that it costs much less per review than the servers; the reviews alternate between
the two handlers (``/validate_fn`` and ``/mutate_fn``), the mutation returns a JSON-patch,
the validation allows.

Measured per implementation:

* latency: one connection, one review at a time (as one apiserver calling one webhook):
  the median and the 99th percentile of the round-trip time of ``--latency-reviews`` reviews;
* throughput: ``--connections`` connections busy all the time for ``--seconds`` seconds:
  reviews/second on the operator's one core, and the operator's CPU time per review, hence
  the reviews per CPU-second: what one core can serve when it does nothing else; and the CPU shares
  of the operator and of the load generator in the window. (On a small VM shared with other jobs,
  they may add up to one core: they take turns, and the measured reviews/second depends on the load
  generator's cost too, while the reviews per CPU-second does not.)

Usage (from the repository root)::

    python benchmarks/admission.py --install-kopf /tmp/kopf-venv --repeat 3

``--repeat N`` interleaves the runs of both implementations and shows the medians.
``--sync`` uses sync handlers (run in the executor's threads) instead of async ones.
"""
import argparse
import asyncio
import contextlib
import datetime
import json
import os
import pathlib
import selectors
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import yaml
from _harness import (
    Implementation,
    Operator,
    OperatorFailed,
    add_implementation_options,
    implementations,
    populate,
    run_order,
)

OPERATOR_CORE = 0
CLIENT_CORE = 1


def review(uid: str, operation: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({
        'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview',
        'request': {
            'uid': uid,
            'kind': {'group': 'kopf.dev', 'version': 'v1', 'kind': 'KopfExample'},
            'resource': {'group': 'kopf.dev', 'version': 'v1', 'resource': 'kopfexamples'},
            'requestKind': {'group': 'kopf.dev', 'version': 'v1', 'kind': 'KopfExample'},
            'requestResource': {'group': 'kopf.dev', 'version': 'v1', 'resource': 'kopfexamples'},
            'name': obj['metadata']['name'], 'namespace': 'default', 'operation': operation,
            'userInfo': {'username': 'admin', 'uid': 'admin', 'groups': ['system:masters']},
            'object': obj, 'oldObject': None, 'dryRun': False,
        },
    }).encode()


def make_requests(port: int) -> list[bytes]:
    """The raw HTTP requests: a validation and a mutation, of a typical small object."""
    obj = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
           'metadata': {'name': 'kex-1', 'namespace': 'default', 'labels': {'app': 'bench'}},
           'spec': {'field': 'value', 'items': ['a', 'b', 'c']}}
    requests = []
    for path, body in [('/validate_fn', review('uid-validate', 'CREATE', obj)),
                       ('/mutate_fn', review('uid-mutate', 'CREATE', obj))]:
        head = (f'POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n'
                f'Content-Length: {len(body)}\r\n\r\n')
        requests.append(head.encode() + body)
    return requests


class Connection:
    """
    One keep-alive TLS connection of the load generator: a request out, the whole response in.

    Plain non-blocking SSL sockets with a selector, not asyncio: the TLS is then done in C (asyncio's
    TLS goes through Python code), so that the load generator costs less per review than the servers
    and can keep the faster of them busy from one core.
    """

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        raw = socket.create_connection(('127.0.0.1', port))
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = context.wrap_socket(raw, server_hostname='localhost')
        self.buffer = bytearray()

    def send(self, request: bytes) -> None:
        self.sock.setblocking(True)  # the requests are small: never blocks for long
        self.sock.sendall(request)
        self.sock.setblocking(False)

    def receive(self) -> int:
        """Read what has arrived; return how many complete responses are in it (and drop them)."""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise RuntimeError('The server has closed the connection.')
                self.buffer += chunk
                if not self.sock.pending():
                    break
        except (ssl.SSLWantReadError, BlockingIOError):
            pass
        done = 0
        while True:
            end = self.buffer.find(b'\r\n\r\n')
            if end < 0:
                return done
            head = bytes(self.buffer[:end])
            length = 0
            for line in head.split(b'\r\n'):
                if line[:15].lower() == b'content-length:':
                    length = int(line[15:])
            total = end + 4 + length
            if len(self.buffer) < total:
                return done
            body = bytes(self.buffer[end + 4:total])
            del self.buffer[:total]
            if head[9:12] != b'200' or (b'"allowed": true' not in body and b'"allowed":true' not in body):
                raise RuntimeError(f'Unexpected answer: {head!r} {body[:300]!r}')
            done += 1

    def roundtrip(self, request: bytes) -> None:
        self.send(request)
        self.sock.setblocking(True)
        try:
            while not self.receive_blocking():
                pass
        finally:
            self.sock.setblocking(False)

    def receive_blocking(self) -> int:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise RuntimeError('The server has closed the connection.')
        self.buffer += chunk
        self.sock.setblocking(False)
        try:
            return self.receive()
        finally:
            self.sock.setblocking(True)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def measure_latency(port: int, context: ssl.SSLContext, count: int) -> list[float]:
    requests = make_requests(port)
    connection = Connection(port, context)
    try:
        for i in range(200):  # warm-up: caches, the handlers' first calls, the executor's threads
            connection.roundtrip(requests[i % 2])
        latencies = []
        for i in range(count):
            started = time.perf_counter()
            connection.roundtrip(requests[i % 2])
            latencies.append(time.perf_counter() - started)
        return latencies
    finally:
        connection.close()


def measure_throughput(port: int, context: ssl.SSLContext, connections: int, seconds: float,
                       operator: Operator) -> tuple[int, float, float, float]:
    """The reviews done in the window, its duration, the operator's and the load generator's CPU seconds."""
    requests = make_requests(port)
    pool = [Connection(port, context) for _ in range(connections)]
    selector = selectors.DefaultSelector()
    sent = {}
    for index, connection in enumerate(pool):
        connection.sock.setblocking(False)
        selector.register(connection.sock, selectors.EVENT_READ, connection)
        sent[id(connection)] = index
        connection.send(requests[index % 2])
    try:
        done, measuring = 0, False
        warmup_end = time.monotonic() + 1.0  # 1s of warm-up under the load, then the window
        deadline = warmup_end + seconds
        cpu_before, own_before, started = 0.0, 0.0, 0.0
        while True:
            now = time.monotonic()
            if not measuring and now >= warmup_end:
                measuring, done, started = True, 0, now
                cpu_before, own_before = operator.cpu_seconds(), time.process_time()
            if now >= deadline:
                break
            for key, _ in selector.select(timeout=1.0):
                connection = key.data
                completed = connection.receive()
                if completed:
                    done += completed
                    sent[id(connection)] += 1
                    connection.send(requests[sent[id(connection)] % 2])
        duration, cpu = time.monotonic() - started, operator.cpu_seconds() - cpu_before
        return done, duration, cpu, time.process_time() - own_before
    finally:
        selector.close()
        for connection in pool:
            connection.close()


def make_certificate(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'localhost')])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName('localhost')]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    certfile, pkeyfile = directory / 'cert.pem', directory / 'pkey.pem'
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pkeyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return certfile, pkeyfile


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, operator: Operator, timeout: float = 30) -> None:
    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(('127.0.0.1', port)) == 0
    operator.wait_until(listening, timeout, 'The webhook server is not listening', interval=0.1)


def run_once(impl: Implementation, args: argparse.Namespace, kubeconfig: pathlib.Path,
             certfile: pathlib.Path, pkeyfile: pathlib.Path) -> dict[str, float]:
    port = free_port()
    env = {'BENCH_WEBHOOK_PORT': str(port), 'BENCH_CERTFILE': str(certfile), 'BENCH_PKEYFILE': str(pkeyfile),
           'BENCH_SYNC_HANDLERS': '1' if args.sync else '0'}
    wrapper = ['taskset', '-c', str(OPERATOR_CORE)] if _can_pin() else []
    context = ssl.create_default_context(cafile=str(certfile))
    with Operator(impl.python, 'admission', kubeconfig, env=env, wrapper=wrapper) as operator:
        wait_for_port(port, operator)
        latencies = measure_latency(port, context, args.latency_reviews)
        done, duration, cpu, own_cpu = measure_throughput(port, context, args.connections, args.seconds,
                                                          operator)
    latencies.sort()
    return {
        'median_ms': statistics.median(latencies) * 1000,
        'p99_ms': latencies[int(len(latencies) * 0.99) - 1] * 1000,
        'reviews_per_s': done / duration,
        'cpu_us_per_review': cpu / done * 1e6 if done else float('nan'),
        'operator_cpu_pct': cpu / duration * 100,
        'loader_cpu_pct': own_cpu / duration * 100,
    }


@contextlib.contextmanager
def emulator_process(directory: pathlib.Path) -> Iterator[pathlib.Path]:
    """
    The emulator in a process of its own (on the load generator's core; it idles during the load).

    Not in a thread of this process: the load generator would then wait for the GIL at times
    (up to the switch interval, 5 ms), which would show up as the servers' latency.
    """
    kubeconfig = directory / 'kubeconfig'
    command = [sys.executable, '-m', 'kopf.testing.emulator', '--port', '0', '--kubeconfig', str(kubeconfig)]
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not kubeconfig.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError('The emulator did not start.')
            time.sleep(0.05)
        config: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
        asyncio.run(populate(config['clusters'][0]['cluster']['server'], 1))
        yield kubeconfig
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _can_pin() -> bool:
    return hasattr(os, 'sched_getaffinity') and {OPERATOR_CORE, CLIENT_CORE} <= os.sched_getaffinity(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_implementation_options(parser)
    parser.add_argument('--repeat', type=int, default=1)
    parser.add_argument('--seconds', type=float, default=5.0, help='the throughput window')
    parser.add_argument('--connections', type=int, default=48, help='for the throughput')
    parser.add_argument('--latency-reviews', type=int, default=3000)
    parser.add_argument('--sync', action='store_true', help='sync handlers instead of async ones')
    args = parser.parse_args()
    impls = implementations(parser, args)
    if _can_pin():
        os.sched_setaffinity(0, {CLIENT_CORE})

    results: dict[str, list[dict[str, float]]] = {impl.name: [] for impl in impls}
    with tempfile.TemporaryDirectory() as tmpdir, emulator_process(pathlib.Path(tmpdir)) as kubeconfig:
        certfile, pkeyfile = make_certificate(pathlib.Path(tmpdir))
        for attempt in range(args.repeat):
            for impl in run_order(impls, attempt):  # no one always after the same one
                try:
                    measures = run_once(impl, args, kubeconfig, certfile, pkeyfile)
                except OperatorFailed as e:
                    print(f'{impl.name}: run {attempt + 1} failed: {e}', flush=True)
                    continue
                results[impl.name].append(measures)
                print(f'{impl.name} (run {attempt + 1}): ' +
                      ', '.join(f'{key}={value:.2f}' for key, value in measures.items()), flush=True)

    print()
    print(f'Admission reviews over TLS, {"sync" if args.sync else "async"} handlers '
          f'(medians of {args.repeat} run(s)); the operator on one core:')
    print()
    print('| implementation | reviews/s (measured) | reviews per CPU-second | median latency | p99 latency '
          '| CPU per review |')
    print('|---|---:|---:|---:|---:|---:|')
    medians: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        if not runs:
            print(f'| {name} | failed | | | | |')
            continue
        medians[name] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        m = medians[name]
        print(f'| {name} | {m["reviews_per_s"]:,.0f} | {1e6 / m["cpu_us_per_review"]:,.0f} '
              f'| {m["median_ms"]:.2f} ms | {m["p99_ms"]:.2f} ms | {m["cpu_us_per_review"]:.0f} µs |')
    if len(medians) == 2:
        ours, theirs = medians.values()
        print()
        print(f'Ratios: {ours["reviews_per_s"] / theirs["reviews_per_s"]:.1f}x the measured reviews/s, '
              f'{theirs["cpu_us_per_review"] / ours["cpu_us_per_review"]:.1f}x the reviews per CPU-second.')


if __name__ == '__main__':
    sys.exit(main())
