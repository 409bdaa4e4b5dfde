"""
Capture what the original Kopf writes to a cluster, as JSON fixtures for our compatibility tests.

A developer's tool, not run in CI: it needs Kopf itself installed in a separate virtualenv.
For every scenario, it starts a fresh Kubernetes API emulator (ours, in this process), creates
the objects, runs ``kopf run`` from that virtualenv as a black box, performs the scenario's steps
(e.g. changes or deletes the objects), stops Kopf, and stores what has happened:
the objects before and after, every modifying request that Kopf has sent (with its body),
the request counts, and the object-related log lines. Uids and timestamps are scrubbed;
the timestamps are replaced with fake ones that keep their format, order and equality.

At the end, ``probe_kopf_storages.py`` runs in Kopf's virtualenv to record how Kopf's storage
classes react to a table of direct calls (``storages.json``).

Usage (from the repository root)::

    /work/venv/bin/python tools/compat/capture_kopf.py [--kopf-venv /work/kopf-venv] [--only NAME ...]
"""

import argparse
import base64
import dataclasses
import datetime
import hashlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web

from kopf.testing.emulator import KubernetesEmulator

REPO = pathlib.Path(__file__).resolve().parents[2]
KOPF_VERSION = '1.45.2'
DEFAULT_OUTPUT = REPO / 'tests' / 'core' / 'persistence' / 'fixtures' / f'kopf-{KOPF_VERSION}'
SCRIPT_AGENT = 'kopf-compat-capture'
NAMESPACE = 'default'
KEX_PATH = f'/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfexamples'

CRD: dict[str, Any] = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': 'kopfexamples.kopf.dev'},
    'spec': {
        'scope': 'Namespaced',
        'group': 'kopf.dev',
        'names': {
            'kind': 'KopfExample',
            'plural': 'kopfexamples',
            'singular': 'kopfexample',
            'shortNames': ['kex'],
        },
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


def kex(name: str = 'kex1', **extra: Any) -> dict[str, Any]:
    """A sample object; ``extra`` goes into the metadata (labels, annotations, finalizers...)."""
    metadata: dict[str, Any] = {
        'name': name,
        'namespace': NAMESPACE,
        'labels': {'somelabel': 'somevalue'},
        'annotations': {'someannotation': 'somevalue'},
    }
    metadata.update(extra)
    return {
        'apiVersion': 'kopf.dev/v1',
        'kind': 'KopfExample',
        'metadata': metadata,
        'spec': {'duration': '1m', 'field': 'value', 'items': ['item1', 'item2']},
    }


# ---------------------------------------------------------------------------------------------
# Scenario steps: what the script does while Kopf runs.


@dataclasses.dataclass(frozen=True)
class WaitLog:
    """Wait until the log has this many lines matching the pattern."""

    pattern: str
    count: int = 1
    timeout: float = 20


@dataclasses.dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclasses.dataclass(frozen=True)
class MergePatch:
    name: str
    body: dict[str, Any]
    subresource: str = ''


@dataclasses.dataclass(frozen=True)
class Delete:
    name: str


@dataclasses.dataclass(frozen=True)
class WaitGone:
    name: str
    timeout: float = 20


Step = WaitLog | Sleep | MergePatch | Delete | WaitGone


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    operator: str
    objects: tuple[dict[str, Any], ...] = (kex(),)
    statuses: tuple[tuple[str, dict[str, Any]], ...] = ()  # set via the status subresource before start
    steps: tuple[Step, ...] = (WaitLog('Handling cycle is finished'),)


CYCLE_DONE = 'Handling cycle is finished'


def _ids_with_hash_char(char: str, length: int) -> str:
    """An id longer than any key limit, whose blake2b-4 hash in standard base64 contains the char."""
    for index in range(100_000):
        candidate = (f'hash-{index}-' + 'z' * length)[:length]
        digest = hashlib.blake2b(candidate.encode(), digest_size=4).digest()
        if char in base64.b64encode(digest).decode():
            return candidate
    raise LookupError(char)


LONG_IDS = {
    'id46': 'v1-boundary-' + 'a' * 34,  # 17+46 = 63 chars of the whole V1 key: not hashed
    'id47': 'v1-boundary-' + 'b' * 35,  # 64 chars of the whole V1 key: V1 is hashed, V2 is not
    'id63': 'v2-boundary-' + 'c' * 51,  # the V2 name at its limit
    'id64': 'v2-boundary-' + 'd' * 52,  # the V2 name over its limit: both are hashed
    'plus': _ids_with_hash_char('+', 70),
    'slash': _ids_with_hash_char('/', 70),
}
LONG_PARENT = 'parent-' + 'p' * 63  # its sub-handler's id has a '/' and is long enough to be hashed


SCENARIOS: list[Scenario] = [
    Scenario(
        name='create-single',
        description="One creation handler with a result; the object carries kubectl's last-applied "
        'annotation. Shows the minimal sequence of patches (no finalizer without deletion '
        'handlers) and the diff-base.',
        operator="""
            @kopf.on.create('kopfexamples')
            def create_fn(**_):
                return {'message': 'hello'}
        """,
        objects=(
            kex(
                annotations={
                    'someannotation': 'somevalue',
                    'kubectl.kubernetes.io/last-applied-configuration': '{"apiVersion":"kopf.dev/v1"}\n',
                }
            ),
        ),
    ),
    Scenario(
        name='create-several',
        description='Three creation handlers: the first succeeds, the second fails with TemporaryError '
        '(delay=1) once, the third succeeds; progress records between the steps.',
        operator="""
            @kopf.on.create('kopfexamples')
            def create_a(**_):
                return {'message': 'hello'}

            @kopf.on.create('kopfexamples')
            def create_retry(retry, **_):
                if retry < 1:
                    raise kopf.TemporaryError('not yet', delay=1)
                return 'done'

            @kopf.on.create('kopfexamples')
            def create_b(**_):
                return None
        """,
    ),
    Scenario(
        name='permanent-error',
        description='A creation handler fails with PermanentError; another one succeeds.',
        operator="""
            @kopf.on.create('kopfexamples')
            def create_ok(**_):
                return 1

            @kopf.on.create('kopfexamples')
            def create_fails(**_):
                raise kopf.PermanentError('boom')
        """,
    ),
    Scenario(
        name='arbitrary-exception',
        description='A creation handler raises ValueError in the default errors mode (temporary, with '
        'the default 60 s backoff); Kopf is stopped before the retry.',
        operator="""
            @kopf.on.create('kopfexamples')
            def create_ok(**_):
                return 1

            @kopf.on.create('kopfexamples')
            def create_raises(**_):
                raise ValueError('oops')
        """,
        steps=(WaitLog(r"Handler 'create_raises' failed with an exception"), Sleep(2)),
    ),
    Scenario(
        name='subhandlers',
        description='A creation handler with two sub-handlers, the second fails temporarily once.',
        operator="""
            @kopf.on.create('kopfexamples')
            def create_parent(**_):
                @kopf.subhandler(id='child1')
                def child1(**_):
                    return 1

                @kopf.subhandler(id='child2')
                def child2(retry, **_):
                    if retry < 1:
                        raise kopf.TemporaryError('later', delay=1)
                    return 2
        """,
    ),
    Scenario(
        name='field-handler',
        description='Field handlers on creation and on a change of the field (old/new, the diff).',
        operator="""
            @kopf.on.field('kopfexamples', field='spec.field')
            def field_fn(old, new, diff, logger, **_):
                logger.info(f'FIELD old={old!r} new={new!r} diff={diff!r}')
                return {'new': new}

            @kopf.on.field('kopfexamples', field='spec.items', id='items-watcher')
            def items_fn(old, new, **_):
                return len(new or [])
        """,
        steps=(
            WaitLog(CYCLE_DONE),
            MergePatch('kex1', {'spec': {'field': 'changed'}}),
            WaitLog(CYCLE_DONE, count=2),
        ),
    ),
    Scenario(
        name='long-ids',
        description='Handler ids around the key length limits, ids whose hash has "+" or "/" in '
        'the standard base64, and a long parent id with a sub-handler ("/" in the id).',
        operator=f"""
            IDS = {json.dumps(LONG_IDS)}

            @kopf.on.create('kopfexamples')
            def create_first(retry, **_):
                if retry < 1:
                    raise kopf.TemporaryError('later', delay=1)

            for hid in IDS.values():
                @kopf.on.create('kopfexamples', id=hid)
                def fn(**_):
                    return None

            @kopf.on.create('kopfexamples', id={LONG_PARENT!r})
            def create_parent(**_):
                @kopf.subhandler(id='child')
                def child(retry, **_):
                    if retry < 1:
                        raise kopf.TemporaryError('later', delay=1)
        """,
    ),
    Scenario(
        name='update',
        description="Creation, then a change of the spec and a label: the update handler's diff; "
        'then a change of the status only, which is not essential.',
        operator="""
            @kopf.on.create('kopfexamples')
            def create_fn(**_):
                return 'created'

            @kopf.on.update('kopfexamples')
            def update_fn(diff, old, new, logger, **_):
                logger.info(f'DIFF {diff!r}')
                return 'updated'
        """,
        steps=(
            WaitLog(CYCLE_DONE),
            MergePatch(
                'kex1',
                {
                    'metadata': {'labels': {'newlabel': 'newvalue'}},
                    'spec': {'field': 'changed', 'items': None},
                },
            ),
            WaitLog(CYCLE_DONE, count=2),
            MergePatch('kex1', {'status': {'external': 'value'}}, subresource='status'),
            WaitLog('the essence is the same'),
            Sleep(1),
        ),
    ),
    Scenario(
        name='delete',
        description='Creation and deletion handlers: the finalizer is added, then removed after '
        'the deletion handler.',
        operator="""
            @kopf.on.create('kopfexamples')
            def create_fn(**_):
                return 'created'

            @kopf.on.delete('kopfexamples')
            def delete_fn(logger, **_):
                logger.info('DELETING')
        """,
        steps=(WaitLog(CYCLE_DONE), Delete('kex1'), WaitGone('kex1'), Sleep(1)),
    ),
    Scenario(
        name='delete-foreign-finalizer',
        description='Same as "delete", but the object has a foreign finalizer before and after Kopf\'s.',
        operator="""
            @kopf.on.create('kopfexamples')
            def create_fn(**_):
                return 'created'

            @kopf.on.delete('kopfexamples')
            def delete_fn(**_):
                pass
        """,
        objects=(kex(finalizers=['example.com/first']),),
        steps=(
            WaitLog(CYCLE_DONE),
            MergePatch(
                'kex1',
                {
                    'metadata': {
                        'finalizers': [
                            'example.com/first',
                            'kopf.zalando.org/KopfFinalizerMarker',
                            'example.com/last',
                        ]
                    }
                },
            ),
            Sleep(1),
            Delete('kex1'),
            WaitLog(r'Removing the finalizer'),
            Sleep(2),
        ),
    ),
    Scenario(
        name='status-progress',
        description='settings.persistence.progress_storage = kopf.StatusProgressStorage().',
        operator="""
            @kopf.on.startup()
            def configure(settings, **_):
                settings.persistence.progress_storage = kopf.StatusProgressStorage()

            @kopf.on.create('kopfexamples')
            def create_a(**_):
                return 'a'

            @kopf.on.create('kopfexamples')
            def create_retry(retry, **_):
                if retry < 1:
                    raise kopf.TemporaryError('not yet', delay=1)
        """,
    ),
    Scenario(
        name='smart-reads-status',
        description='The default (smart) storage with a legacy status.kopf.progress: a handler marked '
        'as succeeded there is not called again; a pending one is retried; nothing is '
        'written to the status; the status records are purged at the end.',
        operator="""
            @kopf.on.create('kopfexamples')
            def create_done(logger, **_):
                logger.info('MUST NOT BE CALLED')

            @kopf.on.create('kopfexamples')
            def create_pending(retry, logger, **_):
                logger.info(f'PENDING retry={retry}')

            @kopf.on.create('kopfexamples')
            def create_new(retry, **_):
                if retry < 1:
                    raise kopf.TemporaryError('not yet', delay=1)
        """,
        statuses=(
            (
                'kex1',
                {
                    'status': {
                        'kopf': {
                            'progress': {
                                'create_done': {
                                    'started': '2020-01-01T00:00:00.000000+00:00',
                                    'stopped': '2020-01-01T00:00:01.000000+00:00',
                                    'purpose': 'create',
                                    'retries': 1,
                                    'success': True,
                                    'failure': False,
                                },
                                'create_pending': {
                                    'started': '2020-01-01T00:00:00.000000+00:00',
                                    'delayed': '2020-01-01T00:00:02.000000+00:00',
                                    'purpose': 'create',
                                    'retries': 3,
                                    'success': False,
                                    'failure': False,
                                    'message': 'legacy',
                                },
                            }
                        }
                    }
                },
            ),
        ),
    ),
    Scenario(
        name='status-diffbase',
        description='settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(); then an update.',
        operator="""
            @kopf.on.startup()
            def configure(settings, **_):
                settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage()

            @kopf.on.create('kopfexamples')
            def create_fn(**_):
                return 'created'

            @kopf.on.update('kopfexamples')
            def update_fn(diff, logger, **_):
                logger.info(f'DIFF {diff!r}')
        """,
        steps=(
            WaitLog(CYCLE_DONE),
            MergePatch('kex1', {'spec': {'field': 'changed'}}),
            WaitLog(CYCLE_DONE, count=2),
        ),
    ),
    Scenario(
        name='diffbase-only-same',
        description='The object already has a diff-base equal to its essence (handled by another '
        'operator instance): nothing is called, nothing is written.',
        operator="""
            @kopf.on.create('kopfexamples')
            def create_fn(logger, **_):
                logger.info('MUST NOT BE CALLED')

            @kopf.on.update('kopfexamples')
            def update_fn(logger, **_):
                logger.info('MUST NOT BE CALLED')
        """,
        objects=(
            kex(
                annotations={
                    'someannotation': 'somevalue',
                    'kopf.zalando.org/last-handled-configuration': (
                        '{"spec":{"duration":"1m","field":"value","items":["item1","item2"]},'
                        '"metadata":{"labels":{"somelabel":"somevalue"},'
                        '"annotations":{"someannotation":"somevalue"}}}\n'
                    ),
                }
            ),
        ),
        steps=(WaitLog('Starting the watch-stream for kopfexamples'), Sleep(3)),
    ),
    Scenario(
        name='diffbase-only-changed',
        description='The object has a diff-base that differs from its essence: an update, not a creation.',
        operator="""
            @kopf.on.create('kopfexamples')
            def create_fn(logger, **_):
                logger.info('MUST NOT BE CALLED')

            @kopf.on.update('kopfexamples')
            def update_fn(diff, logger, **_):
                logger.info(f'DIFF {diff!r}')
        """,
        objects=(
            kex(
                annotations={
                    'someannotation': 'somevalue',
                    'kopf.zalando.org/last-handled-configuration': (
                        '{"spec":{"duration":"1m","field":"old-value"},'
                        '"metadata":{"labels":{"somelabel":"somevalue"},'
                        '"annotations":{"someannotation":"somevalue"}}}\n'
                    ),
                }
            ),
        ),
    ),
    Scenario(
        name='custom-prefix',
        description='Annotations storages with a custom prefix: the kopf-managed marker is added.',
        operator="""
            @kopf.on.startup()
            def configure(settings, **_):
                prefix = 'my-op.example.com'
                settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
                settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=prefix)

            @kopf.on.create('kopfexamples')
            def create_a(**_):
                return 'a'

            @kopf.on.create('kopfexamples')
            def create_retry(retry, **_):
                if retry < 1:
                    raise kopf.TemporaryError('not yet', delay=1)
        """,
    ),
    Scenario(
        name='verbose-progress',
        description='AnnotationsProgressStorage(verbose=True): the records keep their nulls. Observed: '
        'Kopf re-sends the unchanged records of all handlers; such a no-op patch causes '
        'no watch-event (as in a real cluster), and the cycle stalls until a new event.',
        operator="""
            @kopf.on.startup()
            def configure(settings, **_):
                settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(verbose=True)

            @kopf.on.create('kopfexamples')
            def create_a(**_):
                return 'a'

            @kopf.on.create('kopfexamples')
            def create_retry(retry, **_):
                if retry < 1:
                    raise kopf.TemporaryError('not yet', delay=1)
        """,
        steps=(WaitLog('failed temporarily'), Sleep(4)),
    ),
    Scenario(
        name='multi-progress',
        description='MultiProgressStorage of annotations (custom prefix) and a custom status field.',
        operator="""
            @kopf.on.startup()
            def configure(settings, **_):
                settings.persistence.progress_storage = kopf.MultiProgressStorage([
                    kopf.AnnotationsProgressStorage(prefix='my-op.example.com'),
                    kopf.StatusProgressStorage(field='status.my-op'),
                ])

            @kopf.on.create('kopfexamples')
            def create_a(**_):
                return 'a'

            @kopf.on.create('kopfexamples')
            def create_retry(retry, **_):
                if retry < 1:
                    raise kopf.TemporaryError('not yet', delay=1)
        """,
    ),
    Scenario(
        name='foreign-kopf-annotations',
        description='The object carries annotations of another Kopf-based operator (marked with its '
        'kopf-managed marker): they are not part of the essence.',
        operator="""
            @kopf.on.create('kopfexamples')
            def create_fn(**_):
                return 'created'
        """,
        objects=(
            kex(
                annotations={
                    'someannotation': 'somevalue',
                    'other-op.example.com/kopf-managed': 'yes',
                    'other-op.example.com/last-handled-configuration': '{"spec":{}}\n',
                    'sub.kopf.zalando.org/something': 'x',
                }
            ),
        ),
    ),
]


# ---------------------------------------------------------------------------------------------
# Recording the requests.


class Recorder:
    """Wraps the emulator's request handler: remembers every modifying request and its outcome."""

    def __init__(self, inner: Callable[[web.BaseRequest], Any]) -> None:
        self.inner = inner
        self.records: list[dict[str, Any]] = []

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        payload = await request.read() if request.method in ('POST', 'PUT', 'PATCH', 'DELETE') else b''
        response: web.StreamResponse = await self.inner(request)
        if request.method != 'GET':
            agent = request.headers.get('User-Agent', '')
            self.records.append(
                {
                    'actor': 'script' if agent == SCRIPT_AGENT else 'kopf',
                    'method': request.method,
                    'path': request.path,
                    'query': request.query_string,
                    'content_type': request.headers.get('Content-Type', ''),
                    'body': json.loads(payload) if payload else None,
                    'status': response.status,
                }
            )
        return response


def call(url: str, method: str, path: str, body: Any = None, content_type: str = 'application/json') -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method=method)
    request.add_header('User-Agent', SCRIPT_AGENT)
    if data is not None:
        request.add_header('Content-Type', content_type)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b'null')
    except urllib.error.HTTPError as e:
        raise RuntimeError(f'{method} {path} failed: {e.code} {e.read()!r}') from e


# ---------------------------------------------------------------------------------------------
# Scrubbing: stable fixtures from one capture to another.

TIMESTAMP = re.compile(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?\+00:00')
LOG_LINE = re.compile(r'^\[(?P<time>[^\]]+)\] (?P<logger>\S+)\s+\[(?P<level>\w+)\s*\] (?P<message>.*)$')
BODY_DUMP = re.compile(r'^(?P<head>\[[^\]]*\] \S[^:]* is in progress): \{.*\}$')
SECONDS = re.compile(r'\d+\.\d+ seconds')


class Scrubber:
    """Replaces the timestamps with fake ones, in order of appearance; the same one stays the same."""

    def __init__(self) -> None:
        self.mapping: dict[str, str] = {}
        self.base = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)

    def _fake(self, match: re.Match[str]) -> str:
        real = match.group(0)
        if real.startswith('2020-'):  # the scenarios' own pre-set timestamps are kept as they are
            return real
        if real not in self.mapping:
            index = len(self.mapping) + 1
            self.mapping[real] = (
                self.base + datetime.timedelta(seconds=index, microseconds=index)
            ).isoformat()
        return self.mapping[real]

    def text(self, text: str) -> str:
        return TIMESTAMP.sub(self._fake, text)

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            return {key: self.value(item) for key, item in value.items()}
        return value

    def body(self, body: dict[str, Any] | None) -> dict[str, Any] | None:
        if body is None:
            return None
        body = self.value(body)
        metadata = body.get('metadata', {})
        for field in ('uid', 'creationTimestamp', 'deletionTimestamp'):
            if field in metadata:
                metadata[field] = f'<{field}>'
        metadata.pop('managedFields', None)
        return body


def parse_log(lines: list[str], scrubber: Scrubber) -> list[str]:
    """The object-related log lines, without the times, bodies dumps, and tracebacks."""
    result: list[str] = []
    skipped = 0
    for line in lines:
        match = LOG_LINE.match(line)
        if match is None:
            skipped += 1  # a continuation line: a traceback or a multi-line message; not kept
            continue
        if skipped and result:
            result[-1] += f'  (+{skipped} continuation lines)'
        skipped = 0
        if match.group('logger') != 'kopf.objects':
            continue
        message = match.group('message')
        dumped = BODY_DUMP.match(message)
        if dumped:
            message = dumped.group('head') + ': <body>'
        message = SECONDS.sub('<N> seconds', scrubber.text(message))
        result.append(f'[{match.group("level")}] {message}')
    if skipped and result:
        result[-1] += f'  (+{skipped} continuation lines)'
    return result


# ---------------------------------------------------------------------------------------------
# Running one scenario.


def _kopf_lines(log_path: pathlib.Path) -> list[str]:
    return log_path.read_text(errors='replace').splitlines() if log_path.exists() else []


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def run_scenario(scenario: Scenario, kopf_venv: pathlib.Path, workdir: pathlib.Path) -> dict[str, Any]:
    emulator = KubernetesEmulator(kubeconfig_path=workdir / f'{scenario.name}.kubeconfig')
    # A dev tool's shortcut: the handler is wrapped before the server starts and captures it.
    recorder = Recorder(emulator._handler)
    emulator._handler = recorder  # type: ignore[assignment]
    notes: list[str] = []
    with emulator:
        url = emulator.url
        call(url, 'POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', CRD)
        before: dict[str, Any] = {}
        for obj in scenario.objects:
            name = obj['metadata']['name']
            call(url, 'POST', KEX_PATH, obj)
        for name, status in scenario.statuses:
            call(url, 'PATCH', f'{KEX_PATH}/{name}/status', status, 'application/merge-patch+json')
        for obj in scenario.objects:
            name = obj['metadata']['name']
            before[name] = emulator.get_object('kopfexamples.kopf.dev', name, namespace=NAMESPACE)

        operator_path = workdir / f'{scenario.name}.py'
        operator_path.write_text('import kopf\n' + textwrap.dedent(scenario.operator))
        log_path = workdir / f'{scenario.name}.log'
        recorder.records.clear()
        emulator.requests.reset()
        env = dict(os.environ, KUBECONFIG=str(emulator.kubeconfig_path))
        with open(log_path, 'wb') as log_file:
            process = subprocess.Popen(
                [
                    str(kopf_venv / 'bin' / 'kopf'),
                    'run',
                    '--standalone',
                    '-n',
                    NAMESPACE,
                    '--verbose',
                    str(operator_path),
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=workdir,
            )
            try:
                for step in scenario.steps:
                    if isinstance(step, WaitLog):
                        pattern = re.compile(step.pattern)

                        def enough(pattern: re.Pattern[str] = pattern, count: int = step.count) -> bool:
                            found = [line for line in _kopf_lines(log_path) if pattern.search(line)]
                            return len(found) >= count

                        if not _wait(enough, step.timeout):
                            notes.append(f'TIMED OUT waiting for {step.count}x {step.pattern!r}')
                    elif isinstance(step, Sleep):
                        time.sleep(step.seconds)
                    elif isinstance(step, MergePatch):
                        suffix = f'/{step.subresource}' if step.subresource else ''
                        call(
                            url,
                            'PATCH',
                            f'{KEX_PATH}/{step.name}{suffix}',
                            step.body,
                            'application/merge-patch+json',
                        )
                    elif isinstance(step, Delete):
                        call(url, 'DELETE', f'{KEX_PATH}/{step.name}')
                    elif isinstance(step, WaitGone):

                        def gone(name: str = step.name) -> bool:
                            return (
                                emulator.get_object('kopfexamples.kopf.dev', name, namespace=NAMESPACE)
                                is None
                            )

                        if not _wait(gone, step.timeout):
                            notes.append(f'TIMED OUT waiting for {step.name!r} to be deleted')
                time.sleep(0.5)  # let the last patches of the cycle arrive
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                    notes.append('Kopf did not stop on SIGTERM in time; killed.')

        after = {
            name: emulator.get_object('kopfexamples.kopf.dev', name, namespace=NAMESPACE) for name in before
        }
        counts = emulator.requests.snapshot()

    scrubber = Scrubber()
    kex_requests = [r for r in recorder.records if '/kopfexamples' in r['path']]
    events = [r for r in recorder.records if r['path'].endswith('/events') and r['actor'] == 'kopf']
    others: dict[str, int] = {}
    for r in recorder.records:
        if r not in kex_requests and r not in events:
            others[f'{r["method"]} {r["path"]}'] = others.get(f'{r["method"]} {r["path"]}', 0) + 1
    kopf_counts: dict[str, int] = {}
    for key, count in counts.items():
        if key.resource == 'kopfexamples':
            label = key.verb + (f'/{key.subresource}' if key.subresource else '')
            kopf_counts[label] = kopf_counts.get(label, 0) + count
    return {
        'kopf_version': KOPF_VERSION,
        'scenario': scenario.name,
        'description': scenario.description,
        'notes': notes,
        'operator': textwrap.dedent(scenario.operator).strip().splitlines(),
        'objects': {
            name: {'before': scrubber.body(before[name]), 'after': scrubber.body(after[name])}
            for name in before
        },
        'requests': [dict(r, body=scrubber.value(r['body'])) for r in kex_requests],
        'request_counts': dict(sorted(kopf_counts.items())),  # incl. the script's own: see "actor"
        'events': [
            {
                'type': (r['body'] or {}).get('type'),
                'reason': (r['body'] or {}).get('reason'),
                'message': scrubber.text((r['body'] or {}).get('message', '')),
            }
            for r in events
        ],
        'other_requests': others,
        'log': parse_log(_kopf_lines(log_path), scrubber),
    }


def iterate_scenarios(only: list[str]) -> Iterator[Scenario]:
    for scenario in SCENARIOS:
        if not only or scenario.name in only:
            yield scenario


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0] if __doc__ else None)
    parser.add_argument('--kopf-venv', type=pathlib.Path, default=pathlib.Path('/work/kopf-venv'))
    parser.add_argument('--output', type=pathlib.Path, default=DEFAULT_OUTPUT)
    parser.add_argument('--only', nargs='*', default=[], help='scenario names (all by default)')
    parser.add_argument('--no-probe', action='store_true', help='skip the direct calls of the storages')
    args = parser.parse_args()

    args.output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix='kopf-capture-') as tmp:
        for scenario in iterate_scenarios(args.only):
            started = time.monotonic()
            fixture = run_scenario(scenario, args.kopf_venv, pathlib.Path(tmp))
            path = args.output / f'{scenario.name}.json'
            path.write_text(json.dumps(fixture, indent=2, ensure_ascii=False) + '\n')
            status = '; '.join(fixture['notes']) or 'ok'
            print(
                f'{scenario.name}: {time.monotonic() - started:.1f}s, '
                f'{len(fixture["requests"])} requests -> {path.name} ({status})',
                file=sys.stderr,
            )

    if not args.no_probe:
        probe = pathlib.Path(__file__).with_name('probe_kopf_storages.py')
        subprocess.run(
            [
                str(args.kopf_venv / 'bin' / 'python'),
                str(probe),
                '--output',
                str(args.output / 'storages.json'),
            ],
            check=True,
        )


if __name__ == '__main__':
    main()
