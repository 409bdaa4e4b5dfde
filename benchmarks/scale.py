"""
Scale (#39): N objects of a CRD watched with no handler due, then a burst of changes; ours vs the floor.

N objects (``kex-0``, ``kex-1``, ...) are pre-created in the emulator (in this process, its own thread)
as already handled: their diff-base annotation (``kopf.zalando.org/last-handled-configuration``) matches
their spec, as a restarted operator sees them. The operator (``operators/update_only.py``: one update
handler) runs in a subprocess; the floor is ``floor_client.py --scenario scale`` (aiohttp, a paginated
listing: ``limit=500`` + ``continue``). Per run:

* **all seen**: from spawning the process to the moment it has processed every object of the listing.
  Ours: the operator serves its metrics (``SCALE_METRICS_PORT``), polled every 0.1 s until
  ``kopf_objects{state="known"}`` == N and ``kopf_workqueue_depth`` == 0 (every listed object is known
  to the queueing and none of them waits to be processed); the poll's interval bounds the error.
  The floor: it prints the monotonic time (system-wide) when its workers have looked at every listed object.
* that no handler was due: the operator's PATCHes before the burst (must be 0);
* **RSS**: the peak (``VmHWM``) after all are seen, and the idle one (``VmRSS``) ``--settle`` seconds
  later (after the workers' idle timeout, 5 s by default); per object = the difference between the
  largest and the smallest N divided by the difference of N;
* **burst**: then ``--burst`` objects (``kex-0`` ...) get a new spec at once (merge-patches by this
  process, 50 at a time, marked by a header so that the emulator's hook tells them from the
  operator's); events/s = burst / (from the first of these changes to the operator's last PATCH, both
  timed by the emulator's request hook), once every changed object has its new diff-base stored.
  ``--bursts`` of them one after another (each once the previous one is handled): the run's events/s is
  their median (one burst of 1,000 varies too much from run to run to judge a 10% difference). Also per
  burst: the operator's CPU time per changed object (``/proc``; a per-event cost that grows with N shows
  here whoever bounds the rate), and how busy this process (the emulator's) was meanwhile, in its CPU seconds
  per second. The changes' requests come from a subprocess: in this process, they took the GIL from the
  emulator's thread, which was then ~95% busy, and its rate, not the operator's, was the burst's.
  This process's heap (the emulator's N objects) is frozen (``gc.freeze()``) once populated, so that its
  full collections, which take longer the more objects it holds, do not stop the emulator in a burst.

Usage (from the repository root):

    python benchmarks/scale.py --objects 1000,100000 --repeat 2 [--no-floor] [--profile DIR]

``--chunk-size 500`` paginates our listing too (``settings.watching.chunk_size``).
``--initial-streaming`` lists by a watch-stream instead (``settings.watching.initial_streaming``: the objects
come as events, each parsed on its own: no big response and no big document's parsing at once).
``--baseline-python PY`` runs another version of this project too (e.g. the previous commit's), interleaved.
``--profile DIR`` runs ours under cProfile (``DIR/ours-N.prof``; slower: for finding costs, not timing).
"""
import argparse
import asyncio
import gc
import json
import pathlib
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from _harness import (
    BASELINE_NAME,
    CRD,
    HERE,
    OURS_NAME,
    Operator,
    add_ours_options,
    create_crd,
    ours_python,
    run_order,
)
from floor_client import LAST_HANDLED, essence

from kopf.testing import KubernetesEmulator

COLLECTION = '/apis/kopf.dev/v1/namespaces/default/kopfexamples'
BENCH_HEADER = 'X-Scale-Benchmark'
FLOOR_NAME = 'the floor'
QUIET_SECONDS = 0.5


class Hook:
    """The emulator's request hook: the operator's PATCHes (not the benchmark's) and its listing requests."""

    def __init__(self) -> None:
        self.patches = 0
        self.last_patch_at: float | None = None
        self.last_patch_cpu = 0.0  # this process's CPU time then (the emulator's thread, mostly)
        self.first_bench_at: float | None = None
        self.first_bench_cpu = 0.0
        self.lists: list[str] = []  # the query strings of the operator's GETs of the collection

    def reset_burst(self) -> None:
        self.first_bench_at = None

    def burst_started_at(self) -> float | None:
        return self.first_bench_at

    def wrap(self, handler: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        async def hooked(request: Any) -> Any:
            if request.headers.get(BENCH_HEADER):
                if self.first_bench_at is None:
                    self.first_bench_at = time.monotonic()
                    self.first_bench_cpu = time.process_time()
            elif request.method == 'PATCH':
                self.patches += 1
                self.last_patch_at = time.monotonic()
                self.last_patch_cpu = time.process_time()
            elif request.method == 'GET' and request.path == COLLECTION:
                self.lists.append(request.query_string)
            return await handler(request)
        return hooked


def handled_body(i: int) -> dict[str, Any]:
    body: dict[str, Any] = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
                            'metadata': {'name': f'kex-{i}'}, 'spec': {'field': f'value-{i}'}}
    body['metadata']['annotations'] = {LAST_HANDLED: essence(body)}
    return body


async def populate(url: str, count: int, concurrency: int = 50) -> None:
    """The CRD and ``count`` objects as handled before (the diff-base matches the spec)."""
    async with aiohttp.ClientSession(base_url=url, headers={BENCH_HEADER: '1'}) as session:
        await create_crd(session, CRD)
        semaphore = asyncio.Semaphore(concurrency)

        async def create(i: int) -> None:
            async with semaphore, session.post(COLLECTION, json=handled_body(i)) as r:
                r.raise_for_status()

        await asyncio.gather(*(create(i) for i in range(count)))


def changed_value(number: int, i: int) -> str:
    return f'changed-{number}-{i}'


async def change(url: str, count: int, number: int, concurrency: int = 50) -> None:
    async with aiohttp.ClientSession(base_url=url, headers={BENCH_HEADER: '1'}) as session:
        semaphore = asyncio.Semaphore(concurrency)
        headers = {'Content-Type': 'application/merge-patch+json'}

        async def patch(i: int) -> None:
            body = json.dumps({'spec': {'field': changed_value(number, i)}})
            async with semaphore, session.patch(f'{COLLECTION}/kex-{i}', data=body, headers=headers) as r:
                r.raise_for_status()

        await asyncio.gather(*(patch(i) for i in range(count)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return int(s.getsockname()[1])


def read_gauges(port: int) -> tuple[float, float] | None:
    """``kopf_objects{state="known"}`` and ``kopf_workqueue_depth``, or None if not served yet."""
    # Only these two (the others' rendering would cost the operator's loop ~1-2 ms every 0.1 s).
    query = 'name[]=kopf_objects&name[]=kopf_workqueue_depth'
    try:
        with urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics?{query}', timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    known = re.search(r'^kopf_objects\{[^}]*state="known"[^}]*\} (\S+)', text, re.MULTILINE)
    depth = re.search(r'^kopf_workqueue_depth\{[^}]*\} (\S+)', text, re.MULTILINE)
    if known is None or depth is None:
        return None
    return float(known.group(1)), float(depth.group(1))


def burst_done(emulator: KubernetesEmulator, burst: int, number: int) -> bool:
    for i in range(burst):
        obj = emulator.get_object('kopfexamples.kopf.dev', f'kex-{i}', namespace='default')
        value = f'"{changed_value(number, i)}"'
        if obj is None or value not in obj['metadata'].get('annotations', {}).get(LAST_HANDLED, ''):
            return False
    return True


def measure(name: str, python: str, count: int, *, burst: int, bursts: int, settle: float, timeout: float,
            profile: pathlib.Path | None = None, chunk_size: int | None = None,
            initial_streaming: bool = False) -> dict[str, Any]:
    hook = Hook()
    emulator = KubernetesEmulator(history_limit=max(10_000, burst * 20))
    emulator._handler = hook.wrap(emulator._handler)  # type: ignore[assignment]
    with emulator:
        populating_at = time.monotonic()
        asyncio.run(populate(emulator.url, count))
        populate_seconds = time.monotonic() - populating_at
        # The emulator's N stored objects are this process's: out of its garbage collector's sight from
        # now on, so that its full collections (~0.2 s at 1,000 objects, ~0.6-0.9 s at 100,000) do not
        # pause the emulator for longer at a bigger N in the middle of a burst (the operator is measured).
        gc.collect()
        gc.freeze()
        port = free_port()
        if name != FLOOR_NAME:
            wrapper = [python, '-m', 'cProfile', '-o', str(profile)] if profile else [python]
            command = [*wrapper, str(HERE / 'operators' / 'runner.py'),
                       str(HERE / 'operators' / 'update_only.py')]
        else:
            command = [python, str(HERE / 'floor_client.py'), '--server', emulator.url, '--scenario', 'scale']
        with Operator(python, 'update_only', emulator.kubeconfig_path, command=command,
                      env={'SCALE_METRICS_PORT': str(port),
                           **({'SCALE_CHUNK_SIZE': str(chunk_size)} if chunk_size else {}),
                           **({'SCALE_INITIAL_STREAMING': '1'} if initial_streaming else {})}) as operator:
            seen_at: float | None = None
            deadline = time.monotonic() + timeout
            while seen_at is None:
                operator.check_alive(f'{name}: all seen')
                if time.monotonic() > deadline:
                    operator.fail(f'{name}: not all {count} seen in {timeout:.0f}s')
                if name != FLOOR_NAME:
                    gauges = read_gauges(port)
                    if gauges is not None and gauges[0] >= count and gauges[1] == 0:
                        seen_at = time.monotonic()
                else:
                    found = re.search(r'^SEEN (\d+) (\S+)$', operator.log_path.read_text(), re.MULTILINE)
                    if found:
                        seen_at = float(found.group(2))
                time.sleep(0.1)
            peak_seen = operator.peak_rss_mb()
            time.sleep(settle)
            idle_rss = operator.rss_mb()
            start_patches = hook.patches
            bursts_seconds: list[float] = []
            bursts_cpu: list[float] = []  # the operator's CPU seconds per burst
            bursts_busy: list[float] = []  # the emulator's process: its CPU seconds per second of the burst
            for number in range(bursts):  # one after another (each once the previous one is handled)
                hook.reset_burst()
                cpu_before = operator.cpu_seconds()
                # The changes' requests from a process of their own: in this one, they would take the GIL
                # from the emulator's thread (the rig, not the operator, would bound the burst's rate).
                subprocess.run([sys.executable, __file__, '--change', emulator.url, str(burst), str(number)],
                               check=True)
                first_at = hook.burst_started_at()
                checked: float | None = None
                while True:
                    operator.check_alive(f'{name}: the burst')
                    last = hook.last_patch_at
                    if last is not None and last != checked and time.monotonic() - last > QUIET_SECONDS:
                        if burst_done(emulator, burst, number):
                            break
                        checked = last
                    if time.monotonic() > deadline + timeout:
                        operator.fail(f'{name}: the burst of {burst} not handled in {timeout:.0f}s')
                    time.sleep(0.05)
                assert first_at is not None and hook.last_patch_at is not None
                bursts_seconds.append(hook.last_patch_at - first_at)
                # (The operator's CPU includes the quiet time after its last PATCH: it idles then.)
                bursts_cpu.append(operator.cpu_seconds() - cpu_before)
                bursts_busy.append((hook.last_patch_cpu - hook.first_bench_cpu) / bursts_seconds[-1])
            peak_rss = operator.peak_rss_mb()
            started_at = operator.started_at
    gc.unfreeze()  # the emulator is gone: its objects are freed (those in cycles by the next collection)
    return {'name': name, 'objects': count, 'seen_seconds': seen_at - started_at,
            'start_patches': start_patches, 'burst_patches': hook.patches - start_patches,
            'peak_seen_mb': peak_seen, 'idle_mb': idle_rss, 'peak_mb': peak_rss,
            'bursts_per_second': [round(burst / seconds) for seconds in bursts_seconds],
            'events_per_second': statistics.median(burst / seconds for seconds in bursts_seconds),
            'burst_cpu_ms_per_event': statistics.median(cpu * 1000 / burst for cpu in bursts_cpu),
            'emulator_busy': statistics.median(bursts_busy),
            'lists': sorted({re.sub(r'continue=[^&]*', 'continue=…', q) for q in hook.lists})[:4],
            'populate_seconds': populate_seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--objects', default='1000,100000', help='object counts, comma-separated')
    parser.add_argument('--repeat', type=int, default=1)
    parser.add_argument('--burst', type=int, default=1000, help='objects changed at once after all are seen')
    parser.add_argument('--bursts', type=int, default=5,
                        help='bursts per run, one after another: their median events/s is the run\'s')
    parser.add_argument('--settle', type=float, default=8.0, help='seconds from all seen to the idle RSS')
    parser.add_argument('--timeout', type=float, default=900.0)
    add_ours_options(parser)
    parser.add_argument('--floor-python', default=sys.executable)
    parser.add_argument('--chunk-size', type=int, default=None,
                        help="ours: settings.watching.chunk_size (the listing's limit per page; "
                             "default: all at once)")
    parser.add_argument('--initial-streaming', action='store_true',
                        help='ours: settings.watching.initial_streaming (the listing as watch-events)')
    parser.add_argument('--baseline-python', default=None,
                        help='a Python with another version of this project (e.g. the previous commit\'s, '
                             'installed by install_ours()), run interleaved as "this project, baseline"')
    parser.add_argument('--no-floor', action='store_true')
    parser.add_argument('--no-ours', action='store_true')
    parser.add_argument('--profile', type=pathlib.Path, default=None, metavar='DIR',
                        help='run ours under cProfile, the stats to DIR/ours-N.prof')
    parser.add_argument('--change', nargs=3, metavar=('URL', 'COUNT', 'NUMBER'), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.change is not None:  # one burst's changes (run by measure() as a subprocess)
        url, count, number = args.change
        asyncio.run(change(url, int(count), int(number)))
        return
    counts = [int(item) for item in args.objects.split(',') if item.strip()]
    if any(count < args.burst for count in counts):
        parser.error(f'--burst {args.burst} is more than the smallest --objects.')
    names = (([] if args.no_ours else [OURS_NAME]) + ([BASELINE_NAME] if args.baseline_python else []) +
             ([] if args.no_floor else [FLOOR_NAME]))
    pythons = {OURS_NAME: ours_python(parser, args), BASELINE_NAME: args.baseline_python,
               FLOOR_NAME: args.floor_python}
    results: list[dict[str, Any]] = []
    for repeat in range(args.repeat):
        for count in counts:
            for name in run_order(names, repeat):  # no one always after the same one
                profile = args.profile / f'ours-{count}.prof' if args.profile and name == OURS_NAME else None
                if profile:
                    profile.parent.mkdir(parents=True, exist_ok=True)
                result = measure(name, pythons[name], count, burst=args.burst, bursts=args.bursts,
                                 settle=args.settle,
                                 timeout=args.timeout, profile=profile, chunk_size=args.chunk_size,
                                 initial_streaming=args.initial_streaming)
                results.append(result)
                print(f'[{repeat + 1}] {json.dumps(result)}', flush=True)
    print()
    print('| N | implementation | all seen, s | peak RSS, MB | idle RSS, MB | burst events/s '
          '| burst CPU ms/event | the emulator busy | start PATCHes |')
    print('|---|---|---|---|---|---|---|---|---|')
    medians: dict[tuple[str, int], dict[str, float]] = {}
    for count in counts:
        for name in names:
            runs = [r for r in results if r['name'] == name and r['objects'] == count]
            m = {key: statistics.median(r[key] for r in runs)
                 for key in ('seen_seconds', 'peak_mb', 'idle_mb', 'events_per_second', 'start_patches',
                             'burst_cpu_ms_per_event', 'emulator_busy')}
            medians[(name, count)] = m
            print(f"| {count:,} | {name} | {m['seen_seconds']:.2f} | {m['peak_mb']:.1f} | {m['idle_mb']:.1f} "
                  f"| {m['events_per_second']:.0f} | {m['burst_cpu_ms_per_event']:.3f} "
                  f"| {m['emulator_busy']:.0%} | {m['start_patches']:.0f} |")
    if len(counts) >= 2:
        small, big = min(counts), max(counts)
        print()
        for name in names:
            a, b = medians[(name, small)], medians[(name, big)]
            per = {key: (b[key] - a[key]) * 1024 * 1024 / (big - small) for key in ('peak_mb', 'idle_mb')}
            print(f"{name}: per object (N={small:,}..{big:,}): peak {per['peak_mb'] / 1024:.2f} KB, "
                  f"idle {per['idle_mb'] / 1024:.2f} KB; burst events/s {big:,}/{small:,}: "
                  f"{b['events_per_second'] / a['events_per_second']:.2f}; burst CPU per event "
                  f"{big:,}/{small:,}: {b['burst_cpu_ms_per_event'] / a['burst_cpu_ms_per_event']:.2f}")
        if OURS_NAME in names and FLOOR_NAME in names:
            for count in counts:
                ours, floor = medians[(OURS_NAME, count)], medians[(FLOOR_NAME, count)]
                seen_ratio = ours['seen_seconds'] / floor['seen_seconds']
                print(f'N={count:,}: all seen ours/floor = {seen_ratio:.2f}')
        if BASELINE_NAME in names and OURS_NAME in names:
            for count in counts:
                seen = {name: [r['seen_seconds'] for r in results
                               if r['name'] == name and r['objects'] == count]
                        for name in (OURS_NAME, BASELINE_NAME)}
                pairs = zip(seen[OURS_NAME], seen[BASELINE_NAME], strict=True)
                ratios = ', '.join(f'{after / before:.2f}' for after, before in pairs)
                print(f'N={count:,}: all seen ours/baseline, paired: {ratios}')


if __name__ == '__main__':
    main()
