"""
Benchmark: PATCH requests per second that the Kubernetes API emulator serves on one CPU core.

The emulator runs in a subprocess (``python -m kopf.testing.emulator``) pinned to one core;
the load generator runs in this process, pinned to another core where possible, and speaks
minimal HTTP/1.1 over keep-alive connections, so that the client is cheaper than the server.

Each request is a JSON merge-patch of a small custom object; the objects are patched round-robin.
The run is repeated with open watch streams on the same resource, which receive every change.

    python benchmarks/emulator_patch.py [--seconds 5] [--connections 32] [--objects 100] [--watchers 10]
"""

import argparse
import asyncio
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.parse
from typing import Any

import yaml

CRD = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': 'benchmarks.kopf.dev'},
    'spec': {
        'group': 'kopf.dev',
        'scope': 'Namespaced',
        'names': {'plural': 'benchmarks', 'singular': 'benchmark', 'kind': 'Benchmark'},
        'versions': [
            {
                'name': 'v1',
                'served': True,
                'storage': True,
                'subresources': {'status': {}},
                'schema': {
                    'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}
                },
            }
        ],
    },
}
OBJECTS_PATH = '/apis/kopf.dev/v1/namespaces/default/benchmarks'


class Connection:
    """A bare keep-alive HTTP/1.1 connection: as little client-side work per request as possible."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader = reader
        self.writer = writer
        self.host = host

    @classmethod
    async def open(cls, host: str, port: int) -> 'Connection':
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, f'{host}:{port}')

    async def request(
        self, method: str, path: str, body: bytes = b'', content_type: str = 'application/json'
    ) -> tuple[int, bytes]:
        head = (
            f'{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: {content_type}\r\n'
            f'Content-Length: {len(body)}\r\n\r\n'
        ).encode()
        self.writer.write(head + body)
        status_and_headers = await self.reader.readuntil(b'\r\n\r\n')
        lines = status_and_headers.split(b'\r\n')
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            if line[:15].lower() == b'content-length:':
                length = int(line[15:])
        payload = await self.reader.readexactly(length) if length else b''
        return status, payload

    def close(self) -> None:
        self.writer.close()


async def _watch(host: str, port: int, path: str, received: list[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f'GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n'.encode())
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            received[0] += line.count(b'"type":"MODIFIED"')
    finally:
        writer.close()


async def _load(
    host: str, port: int, *, seconds: float, connections: int, objects: int, watchers: int, label: str
) -> float:
    setup = await Connection.open(host, port)
    try:
        _, payload = await setup.request('GET', '/apis/kopf.dev/v1/namespaces/default/benchmarks?limit=1')
        version = json.loads(payload)['metadata']['resourceVersion']
    finally:
        setup.close()

    received = [0]
    watch_path = f'{OBJECTS_PATH}?watch=true&resourceVersion={version}'
    watch_tasks = [asyncio.create_task(_watch(host, port, watch_path, received)) for _ in range(watchers)]
    pool = [await Connection.open(host, port) for _ in range(connections)]
    counts = [0] * connections
    failures = [0]
    deadline = time.perf_counter() + seconds

    async def worker(index: int) -> None:
        connection = pool[index]
        number = index
        while time.perf_counter() < deadline:
            name = f'object-{number % objects}'
            body = b'{"spec":{"counter":%d}}' % number
            status, _ = await connection.request(
                'PATCH', f'{OBJECTS_PATH}/{name}', body, 'application/merge-patch+json'
            )
            if status != 200:
                failures[0] += 1
            counts[index] += 1
            number += connections

    started = time.perf_counter()
    await asyncio.gather(*(worker(index) for index in range(connections)))
    elapsed = time.perf_counter() - started
    for connection in pool:
        connection.close()
    for task in watch_tasks:
        task.cancel()
    await asyncio.gather(*watch_tasks, return_exceptions=True)
    total = sum(counts)
    rate = total / elapsed
    print(
        f'{label}: {total} PATCH requests in {elapsed:.2f}s = {rate:,.0f} requests/second '
        f'({failures[0]} failed; {received[0]} events received by {watchers} watchers)'
    )
    return rate


async def _prepare(host: str, port: int, objects: int) -> None:
    connection = await Connection.open(host, port)
    try:
        status, payload = await connection.request(
            'POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', json.dumps(CRD).encode()
        )
        assert status == 201, payload
        for index in range(objects):
            body = {
                'apiVersion': 'kopf.dev/v1',
                'kind': 'Benchmark',
                'metadata': {'name': f'object-{index}'},
                'spec': {'counter': 0, 'field': 'value'},
            }
            status, payload = await connection.request('POST', OBJECTS_PATH, json.dumps(body).encode())
            assert status == 201, payload
    finally:
        connection.close()


def _pin_to_core(core: int) -> None:
    if hasattr(os, 'sched_setaffinity') and core in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {core})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument('--seconds', type=float, default=5.0, help='duration of each run')
    parser.add_argument('--connections', type=int, default=32, help='concurrent keep-alive connections')
    parser.add_argument('--objects', type=int, default=100, help='how many objects to patch round-robin')
    parser.add_argument('--watchers', type=int, default=10, help='open watch streams in the second run')
    arguments = parser.parse_args(argv)

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else []
    server_core = cores[0] if cores else None
    client_core = cores[1] if len(cores) > 1 else None

    with tempfile.TemporaryDirectory() as directory:
        kubeconfig = pathlib.Path(directory) / 'kubeconfig'
        command = [
            sys.executable,
            '-m',
            'kopf.testing.emulator',
            '--port',
            '0',
            '--kubeconfig',
            str(kubeconfig),
        ]
        if server_core is not None:
            server = subprocess.Popen(
                command, preexec_fn=lambda: _pin_to_core(server_core), stderr=subprocess.DEVNULL
            )
        else:
            server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not kubeconfig.exists():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError('The emulator did not start.')
                time.sleep(0.05)
            config: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
            url = urllib.parse.urlsplit(config['clusters'][0]['cluster']['server'])
            assert url.hostname is not None and url.port is not None
            if client_core is not None:
                _pin_to_core(client_core)
            print(
                f'Server pinned to core {server_core}, client to core {client_core}; '
                f'{arguments.connections} connections, {arguments.objects} objects.'
            )

            async def run() -> None:
                assert url.hostname is not None and url.port is not None
                await _prepare(url.hostname, url.port, arguments.objects)
                await _load(
                    url.hostname,
                    url.port,
                    seconds=1.0,
                    connections=arguments.connections,
                    objects=arguments.objects,
                    watchers=0,
                    label='warm-up',
                )
                await _load(
                    url.hostname,
                    url.port,
                    seconds=arguments.seconds,
                    connections=arguments.connections,
                    objects=arguments.objects,
                    watchers=0,
                    label='no watchers',
                )
                await _load(
                    url.hostname,
                    url.port,
                    seconds=arguments.seconds,
                    connections=arguments.connections,
                    objects=arguments.objects,
                    watchers=arguments.watchers,
                    label=f'{arguments.watchers} watchers',
                )

            asyncio.run(run())
        finally:
            server.terminate()
            server.wait(timeout=10)


if __name__ == '__main__':
    main()
