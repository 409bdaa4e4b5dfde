"""
The operator under the soak: ``python -m kopf run --standalone -n soak -n 'soak-tmp-*' OPERATOR.py``
(the soak's namespace, and its short-lived namespaces served as they appear and disappear).

Every handler call appends one JSON line to the journal file named by ``SOAK_JOURNAL``:
the object (its names are unique across the namespaces) and its namespace, the change (the
handler's kind), the resourceVersion, the handler, the version of the
spec it saw (``spec.version``, bumped by every change of the churn), the labels, the outcome, and
the pid (so that the checker knows which incarnation of the operator made the call).
A line is written with one ``write()`` to a file opened with ``O_APPEND``: the lines of concurrent
calls (threads, and even processes) never interleave.

Objects with ``spec.failures: N`` fail their creation N times (``TemporaryError``, a 0.5 s delay)
before it succeeds: the soak deletes some of them while the creation is still retrying.

With ``SOAK_TASKS`` (a file path), the operator counts its asyncio tasks alive every
``SOAK_TASKS_INTERVAL`` seconds (5 by default) and writes ``COUNT TIME`` there, for the soak's samples:
a daemon thread (one more thread in the figures) schedules the count in the event loop, which runs it
between its tasks' steps, and stops when the loop is closed.
"""

import asyncio
import json
import os
import threading
import time
from typing import Any

import kopf

GROUP, VERSION, PLURAL = 'soak.kopf.dev', 'v1', 'soakobjects'
JOURNAL_PATH = os.environ['SOAK_JOURNAL']
_journal_fd = os.open(JOURNAL_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def journal(handler: str, body: kopf.Body, outcome: str = 'ok', **extra: Any) -> None:
    record = {
        'object': body.metadata.name,
        'namespace': body.metadata.namespace,
        'uid': body.metadata.uid,
        'change': handler.split('_')[0],
        'handler': handler,
        'rv': body.metadata.get('resourceVersion'),
        'version': body.spec.get('version'),
        'field': body.spec.get('field'),
        'labels': dict(body.metadata.labels),
        'outcome': outcome,
        'pid': os.getpid(),
        'time': time.time(),
        **extra,
    }
    os.write(_journal_fd, (json.dumps(record, sort_keys=True) + '\n').encode())


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.queueing.exit_timeout = float(os.environ.get('SOAK_EXIT_TIMEOUT', '5'))
    settings.watching.server_timeout = 30  # the watches are also re-established by the server
    # The emulator's faults are short: retry soon. A real kube-apiserver's restart takes longer (its
    # graceful stop, its start: 5-10 s): the driver gives the backoffs that outlast it.
    backoffs = os.environ.get('SOAK_ERROR_BACKOFFS', '0.2,0.5,1,1,2')
    settings.networking.error_backoffs = [float(delay) for delay in backoffs.split(',')]
    settings.networking.request_timeout = 15
    settings.watching.client_timeout = 45
    settings.posting.loggers = True  # the log messages become k8s-events: the credentials check covers them


@kopf.on.startup()
async def count_tasks(**_: Any) -> None:
    path = os.environ.get('SOAK_TASKS')
    if path:
        interval = float(os.environ.get('SOAK_TASKS_INTERVAL', '5'))
        thread = threading.Thread(target=_tasks_counter, args=(asyncio.get_running_loop(), path, interval),
                                  name='soak-tasks-counter', daemon=True)
        thread.start()


def _tasks_counter(loop: asyncio.AbstractEventLoop, path: str, interval: float) -> None:
    while True:
        try:
            loop.call_soon_threadsafe(_write_tasks_count, path)
        except RuntimeError:  # the loop is closed: the operator is exiting
            return
        time.sleep(interval)


def _write_tasks_count(path: str) -> None:
    count = len(asyncio.all_tasks())
    with open(f'{path}.tmp', 'w') as f:
        f.write(f'{count} {time.time()}\n')
    os.replace(f'{path}.tmp', path)  # the soak never reads a half-written file


@kopf.on.create(GROUP, VERSION, PLURAL)
async def create_fn(body: kopf.Body, retry: int, **_: Any) -> None:
    failures = int(body.spec.get('failures', 0))
    if retry < failures:
        journal('create_fn', body, outcome='retry', retry=retry)
        raise kopf.TemporaryError(f'Failing on purpose ({retry + 1} of {failures}).', delay=0.5)
    await asyncio.sleep(0)
    journal('create_fn', body)


@kopf.on.update(GROUP, VERSION, PLURAL)
def update_fn(body: kopf.Body, **_: Any) -> None:
    journal('update_fn', body)


@kopf.on.field(GROUP, VERSION, PLURAL, field='spec.field')
def field_fn(body: kopf.Body, old: Any, new: Any, **_: Any) -> None:
    journal('field_fn', body, old=old, new=new)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete_fn(body: kopf.Body, **_: Any) -> None:
    await asyncio.sleep(0)
    journal('delete_fn', body)


@kopf.timer(GROUP, VERSION, PLURAL, interval=3.0, idle=1.0)
async def timer_fn(body: kopf.Body, **_: Any) -> None:
    journal('timer_fn', body)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=2.0)
async def daemon_fn(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
    journal('daemon_fn', body, outcome='started')
    while not stopped:
        await stopped.wait(5.0)
    journal('daemon_fn', body, outcome='stopped')
