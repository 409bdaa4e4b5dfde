"""
The engines' benchmark: timers and indexing, this project against Kopf 1.45.2.

Each scenario runs the same operator file (``operators/timer.py``, ``operators/index.py``) under
both implementations: the emulator runs in this process (its own thread), the operator in
a subprocess (``operators/runner.py``, i.e. ``kopf.run()``) with a kubeconfig to the emulator.
All objects exist before the operator starts. Scenarios (``--scenario``, all by default):

``timer-1s``
    1,000 objects (``--timer-objects``; ``--object-size`` for bigger ones, e.g. 8000 bytes as the real
    objects are with their managed fields), a timer with ``interval=1`` that PATCHes a per-object
    counter into the status at every tick. Once every object has ticked, after a warm-up
    (``--warmup`` s), over a steady window (``--window`` s): the PATCH requests per second to the
    objects as counted by the emulator (and as a % of the ideal: one per object per second), the
    ticks per second that reached the API (the stored counters' growth), the operator's CPU time
    per tick, the other requests per tick; and the operator's peak RSS.

``timer-60s-idle``
    10,000 objects (``--idle-objects``), a timer with ``interval=60, initial_delay=5``
    (``--initial-delay``): the time from the operator's start (its process spawned) to the first
    tick of all objects (each object's first status PATCH stored), also from the first object's
    first tick (the spread), and from the earliest moment possible, the objects' LIST plus the initial
    delay (how late the last first tick is: the issue's "under 2 s after the initial delay"); then, after
    ``--settle`` s of idleness, the operator's RSS, and the
    RSS per idle timed object: the RSS with 10,000 objects minus the RSS of the same operator with
    1,000 objects (``--idle-baseline``), divided by the difference of the counts.

``index-10k``
    10,000 objects (``--index-objects``) indexed by ``@kopf.index`` (name -> spec.field), and one
    marker object of another resource whose create handler stores the index's size in the
    marker's status (handlers run only once all indices are populated): the time from the
    operator's start to that handler's result stored, with and without the index (the same
    operator and objects, ``BENCH_INDEX=0``), the index's size as seen by the handler (must be all
    objects), and the RSS per indexed object: the RSS with the index minus without it (after
    ``--settle`` s), divided by the count.

Usage (from the repository root)::

    python benchmarks/engines.py --install-kopf /tmp/kopf-venv --repeat 3
    python benchmarks/engines.py --scenario timer-1s --ours-python .venv/bin/python --kopf-python ...
    python benchmarks/engines.py --scenario timer-1s --install-ours /tmp/ours-venv --baseline-python \
        /tmp/base-venv/bin/python --lean-floor --no-floor --repeat 3    # before/after, paired

The timer scenarios also run the floor (``floor_client.py --timer``; ``--no-floor`` to skip it):
a minimal hand-written aiohttp client that makes the same requests (the finalizer, then a status
PATCH per tick) with no framework, so the table shows what the substrate (Python, aiohttp, JSON,
the emulator on this machine) allows, e.g. whether 10,000 first ticks can be done in 2 s here at all.

``--api control-plane --scenario timer-60s-idle`` runs the timers' burst on a fresh real etcd +
kube-apiserver per run instead (``kopf.testing.KubernetesControlPlane``; see ``_controlplane.py``):
the operator's first request and LIST from kube-apiserver's audit log, the first ticks as the
benchmark's own watch of the objects sees them. The other scenarios run on the emulator only.

``--repeat N`` interleaves the runs of all implementations and shows the medians. A run that
fails (an operator that exits, stalls, or does not finish in ``--timeout`` s) is reported in the
output with the tail of the operator's log; the other runs and scenarios go on.
"""
import argparse
import asyncio
import dataclasses
import re
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
from _controlplane import ControlPlaneRun, Observer
from _harness import (
    CRD,
    HERE,
    Implementation,
    Operator,
    OperatorFailed,
    RequestLog,
    add_implementation_options,
    create_crd,
    create_objects,
    example_bodies,
    implementations,
    make_crd,
    median_range,
    populate,
    run_order,
)

from kopf.testing import KubernetesEmulator

EMULATOR, CONTROL_PLANE = 'emulator', 'control-plane'
COLLECTION = '/apis/kopf.dev/v1/namespaces/default/kopfexamples'  # the objects (see populate())
HISTORY_LIMIT = 50_000  # enough for watches that reconnect; older events are not needed
TICK = re.compile(rb'"tick":(\d+)')
NAN = float('nan')
SCENARIOS = ('timer-1s', 'timer-60s-idle', 'index-10k')
FLOOR_NAME = 'the floor'
LEAN_FLOOR_NAME = 'the lean floor'
FLOORS = (FLOOR_NAME, LEAN_FLOOR_NAME)
Measures = dict[str, float]


# ------------------------------------------------------------------------------------------------
# What the emulator has stored.

def stored_encodings(emulator: KubernetesEmulator, plural: str, group: str = 'kopf.dev') -> list[bytes]:
    """
    The stored objects' JSON, read from this thread without decoding them.

    Decoding 10,000 objects at every poll would take the GIL from the emulator's thread for
    ~100 ms; a byte search takes a few. Reading the store from another thread is safe here:
    the stored objects are immutable, the names are listed in one C call (under the GIL),
    and no object is deleted during the benchmark.
    """
    return [stored.encoded for stored in emulator.store.objects((group, plural))]


def ticks_of(emulator: KubernetesEmulator) -> list[int]:
    """Per object, its stored tick counter (0 if it never ticked)."""
    ticks = []
    for encoded in stored_encodings(emulator, 'kopfexamples'):
        match = TICK.search(encoded)
        ticks.append(int(match.group(1)) if match else 0)
    return ticks


def count_ticked(emulator: KubernetesEmulator) -> int:
    return sum(b'"tick":' in encoded for encoded in stored_encodings(emulator, 'kopfexamples'))


def wait_for_count(operator: Operator, counter: Callable[[], int], target: int, *,
                   timeout: float, stall: float, what: str, interval: float = 0.25,
                   on_first: Callable[[], None] | None = None) -> None:
    """
    Wait until the counter reaches the target; fail early if the operator exits or makes no progress.

    A broken engine (e.g. a timer that never ticks) then fails in ``stall`` seconds, not in ``timeout``.
    """
    deadline = time.monotonic() + timeout
    last_count, last_progress = -1, time.monotonic()
    while True:
        count = counter()
        now = time.monotonic()
        if count > last_count:
            if last_count <= 0 < count and on_first is not None:
                on_first()
            last_count, last_progress = count, now
        if count >= target:
            return
        operator.check_alive(what)
        if now >= deadline:
            operator.fail(f'{what}: {count} of {target} in {timeout:.0f}s')
        if now - last_progress >= stall:
            nothing = ' (nothing at all: does the operator support this?)' if count == 0 else ''
            operator.fail(f'{what}: stuck at {count} of {target} for {stall:.0f}s{nothing}')
        time.sleep(interval)


# ------------------------------------------------------------------------------------------------
# The scenarios: each measures one implementation once, and returns its measures.

def timer_env(args: argparse.Namespace, interval: float, initial_delay: float = 0) -> dict[str, str]:
    return {
        'BENCH_TIMER_INTERVAL': str(interval),
        'BENCH_TIMER_INITIAL_DELAY': str(initial_delay),
        'BENCH_SYNC_HANDLERS': '1' if args.sync_handlers else '0',
    }


def timer_operator(implementation: Implementation, args: argparse.Namespace,
                   server: KubernetesEmulator | ControlPlaneRun, interval: float, initial_delay: float = 0
                   ) -> Operator:
    """The timer operator (``operators/timer.py``) of an implementation, or the floor's equivalent."""
    env = timer_env(args, interval=interval, initial_delay=initial_delay)
    command = None
    if implementation.name in FLOORS:
        login = (['--kubeconfig', str(server.kubeconfig_path)] if isinstance(server, ControlPlaneRun)
                 else ['--server', server.url])
        command = [implementation.python, str(HERE / 'floor_client.py'), *login,
                   '--concurrency', str(args.floor_concurrency),
                   '--timer', str(interval), '--initial-delay', str(initial_delay),
                   *(['--client', 'lean'] if implementation.name == LEAN_FLOOR_NAME else [])]
    return Operator(implementation.python, 'timer', server.kubeconfig_path, env=env, command=command)


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float
    cpu_seconds: float
    patches: int  # the PATCH requests to the objects (any subresource)
    requests: dict[str, int]  # all requests by verb
    ticks: int  # the sum of the stored tick counters


def take_sample(emulator: KubernetesEmulator, operator: Operator) -> Sample:
    return Sample(at=time.monotonic(), cpu_seconds=operator.cpu_seconds(),
                  patches=emulator.requests.count('patch', 'kopfexamples'),
                  requests=emulator.requests.by_verb(), ticks=sum(ticks_of(emulator)))


def watch_tick_rate(emulator: KubernetesEmulator, window: float, poll: float = 0.05) -> float:
    """
    The ticks per second of all objects together, from each object's own tick period in the window.

    Counting the ticks between two moments is not enough: timers started together tick together,
    so a window holds 9 or 10 bursts depending on its phase (±10% for 10 periods). Instead, the
    stored counters are polled, and each object's rate is its ticks between its first and its last
    tick seen in the window, divided by the time between them (±2 polls over ~10 periods: ±1%).
    """
    first: dict[int, tuple[float, int]] = {}  # object's position -> when a new counter was seen, and it
    last: dict[int, tuple[float, int]] = {}
    previous = ticks_of(emulator)
    started = time.monotonic()
    while time.monotonic() - started < window:
        time.sleep(poll)
        current, seen_at = ticks_of(emulator), time.monotonic()
        for position, (before, now) in enumerate(zip(previous, current, strict=True)):
            if now != before:
                first.setdefault(position, (seen_at, now))
                last[position] = (seen_at, now)
        previous = current
    rate = 0.0
    for position, (first_at, first_tick) in first.items():
        last_at, last_tick = last[position]
        if last_tick - first_tick >= 2:
            rate += (last_tick - first_tick) / (last_at - first_at)
        else:  # too slow to have a period in the window: roughly
            rate += (last_tick - first_tick + 1) / window
    return rate


def measure_timer_1s(implementation: Implementation, args: argparse.Namespace) -> Measures:
    count = args.timer_objects
    with KubernetesEmulator(history_limit=HISTORY_LIMIT) as emulator:
        asyncio.run(populate(emulator.url, count, size=args.object_size))
        emulator.requests.reset()
        with timer_operator(implementation, args, emulator, interval=1) as operator:
            wait_for_count(operator, lambda: count_ticked(emulator), count, timeout=args.timeout,
                           stall=args.stall, what=f'the first tick of all {count} objects')
            time.sleep(args.warmup)
            operator.check_alive('the warm-up')
            before = take_sample(emulator, operator)
            tick_rate = watch_tick_rate(emulator, args.window)
            operator.check_alive('the measured window')
            after = take_sample(emulator, operator)
            peak_rss = operator.peak_rss_mb()
    # The ticks and the requests counted in the window come in the same bursts, so their ratios are
    # right, though their rates are not (see above): rates are derived from the per-object tick rate.
    ticks = after.ticks - before.ticks
    patches_per_tick = (after.patches - before.patches) / ticks if ticks else NAN
    cpu_ms_per_tick = (after.cpu_seconds - before.cpu_seconds) * 1000 / ticks if ticks else NAN
    measures = {
        'patch_rate': tick_rate * patches_per_tick,
        'ideal_pct': 100 * tick_rate * patches_per_tick / count,
        'tick_rate': tick_rate,
        'cpu_ms_per_tick': cpu_ms_per_tick,
        'cpu_pct': cpu_ms_per_tick * tick_rate / 10,
        'peak_rss_mb': peak_rss,
    }
    for verb in after.requests.keys() | before.requests.keys():
        requests = after.requests.get(verb, 0) - before.requests.get(verb, 0)
        measures[f'requests:{verb}'] = requests / ticks if ticks else NAN
    return measures


def measure_idle_timers_once(implementation: Implementation, args: argparse.Namespace,
                             count: int) -> Measures:
    log = RequestLog(trace=False, collection=COLLECTION)
    emulator = KubernetesEmulator(history_limit=HISTORY_LIMIT)
    emulator._handler = log.wrap(emulator._handler)  # type: ignore[assignment]
    with emulator:
        asyncio.run(populate(emulator.url, count))
        emulator.requests.reset()
        log.reset()
        with timer_operator(implementation, args, emulator, interval=args.idle_interval,
                            initial_delay=args.initial_delay) as operator:
            first_tick_at: list[float] = []
            first_tick_cpu: list[float] = []

            def on_first() -> None:
                first_tick_at.append(time.monotonic())
                first_tick_cpu.append(operator.cpu_seconds())

            wait_for_count(operator, lambda: count_ticked(emulator), count,
                           timeout=args.timeout, stall=args.stall + args.initial_delay,
                           what=f'the first tick of all {count} objects', interval=0.1, on_first=on_first)
            burst_cpu = operator.cpu_seconds() - first_tick_cpu[0]
            # The last first tick is the last PATCH so far (nothing else is patched until the next
            # ticks, `interval` later): exact, unlike the polling, which only bounds it.
            seen_at = time.monotonic()
            all_ticked_at = min(seen_at, emulator.requests.last_at('patch') or seen_at)
            first_request_at = emulator.requests.first_at() or all_ticked_at
            if all_ticked_at - first_tick_at[0] >= args.idle_interval - args.settle:
                operator.fail('the first ticks took longer than the interval: '
                              'the idle RSS would not be that of idle timers')
            time.sleep(args.settle)
            operator.check_alive('the idle settling')
            rss = operator.rss_mb()
            peak_rss = operator.peak_rss_mb()
    return {
        'startup_s': first_request_at - operator.started_at,
        'all_ticked_s': all_ticked_at - operator.started_at,
        'spread_s': all_ticked_at - first_tick_at[0],
        # How late the last first tick is against the earliest possible one: the objects' LIST + the delay.
        'late_s': all_ticked_at - (log.listed_at or first_request_at) - args.initial_delay,
        # The operator's own CPU in the burst of the first ticks (from the first one seen to all seen):
        # the wall time of the burst is bound by the API server (the emulator) too, the CPU is the operator's.
        'burst_cpu_ms': burst_cpu * 1000 / count,
        'burst_cpu_pct': burst_cpu * 100 / max(seen_at - first_tick_at[0], 1e-9),
        'rss_mb': rss,
        'peak_rss_mb': peak_rss,
    }


def measure_idle_timers_on_control_plane(implementation: Implementation, args: argparse.Namespace,
                                         count: int) -> Measures:
    """
    The same measures on a fresh real control plane (see ``_controlplane.py``).

    The operator's first request and its LIST of the objects come from kube-apiserver's audit log
    (when they were received); the first ticks (the first and the last of them) are timed when the
    benchmark's own watch of the objects sees them stored.
    """
    with ControlPlaneRun() as run:
        run.populate(count)
        with Observer(run) as observer:
            run.audit.skip()  # the benchmark's own requests are not logged; the start-up's are not counted
            with timer_operator(implementation, args, run, interval=args.idle_interval,
                                initial_delay=args.initial_delay) as operator:
                first_tick_at: list[float] = []
                first_tick_cpu: list[float] = []

                def on_first() -> None:
                    first_tick_at.append(time.monotonic())
                    first_tick_cpu.append(operator.cpu_seconds())

                def ticked() -> int:
                    observer.check()
                    return len(observer.ticks)

                wait_for_count(operator, ticked, count, timeout=args.timeout,
                               stall=args.stall + args.initial_delay,
                               what=f'the first tick of all {count} objects', interval=0.1, on_first=on_first)
                burst_cpu = operator.cpu_seconds() - first_tick_cpu[0]
                seen_at = time.monotonic()
                assert observer.ticked_at is not None and observer.first_ticked_at is not None
                all_ticked_at = observer.ticked_at
                first_request_at = run.audit.first_at() or all_ticked_at
                listed_at = run.audit.first_at('list', 'kopfexamples') or first_request_at
                if all_ticked_at - observer.first_ticked_at >= args.idle_interval - args.settle:
                    operator.fail('the first ticks took longer than the interval: '
                                  'the idle RSS would not be that of idle timers')
                time.sleep(args.settle)
                operator.check_alive('the idle settling')
                rss = operator.rss_mb()
                peak_rss = operator.peak_rss_mb()
    return {
        'startup_s': first_request_at - operator.started_at,
        'all_ticked_s': all_ticked_at - operator.started_at,
        'spread_s': all_ticked_at - observer.first_ticked_at,
        'late_s': all_ticked_at - listed_at - args.initial_delay,
        'burst_cpu_ms': burst_cpu * 1000 / count,
        'burst_cpu_pct': burst_cpu * 100 / max(seen_at - first_tick_at[0], 1e-9),
        'rss_mb': rss,
        'peak_rss_mb': peak_rss,
    }


def measure_timer_60s_idle(implementation: Implementation, args: argparse.Namespace) -> Measures:
    measure_once = (measure_idle_timers_on_control_plane if args.api == CONTROL_PLANE
                    else measure_idle_timers_once)
    full = measure_once(implementation, args, args.idle_objects)
    baseline = measure_once(implementation, args, args.idle_baseline)
    per_object_kb = (full['rss_mb'] - baseline['rss_mb']) * 1024 / (args.idle_objects - args.idle_baseline)
    return {**full, 'baseline_rss_mb': baseline['rss_mb'], 'kb_per_object': per_object_kb}


async def populate_indexed(url: str, count: int) -> None:
    """The objects to index, and the marker: one object of another resource (no status subresource)."""
    async with aiohttp.ClientSession(base_url=url) as session:
        await create_crd(session, CRD)
        await create_crd(session, make_crd('kopfmarkers', 'KopfMarker', status_subresource=False))
        await create_objects(session, 'kopfexamples', example_bodies(count))
        marker = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfMarker', 'metadata': {'name': 'marker'}}
        await create_objects(session, 'kopfmarkers', [marker])


def measure_index_once(implementation: Implementation, args: argparse.Namespace,
                       with_index: bool) -> Measures:
    """
    One run; if the handler is not called in ``--index-timeout`` seconds, that is the lower bound of its time.

    (Kopf 1.45.2's index pre-population takes time quadratic in the objects' count, all of it CPU:
    ~10s for 2,000 objects, ~60s for 4,000, minutes for 10,000; a lower bound is enough to compare.)
    """
    count = args.index_objects
    result: dict[str, Any] = {}

    def marker_handled() -> bool:
        marker = emulator.get_object('kopfmarkers.kopf.dev', 'marker', namespace='default') or {}
        result.update(marker.get('status', {}).get('check_fn') or {})
        return bool(result)

    with KubernetesEmulator(history_limit=HISTORY_LIMIT) as emulator:
        asyncio.run(populate_indexed(emulator.url, count))
        emulator.requests.reset()
        env = {'BENCH_INDEX': '1' if with_index else '0'}
        with Operator(implementation.python, 'index', emulator.kubeconfig_path, env=env) as operator:
            deadline = time.monotonic() + args.index_timeout
            while not marker_handled() and time.monotonic() < deadline:
                operator.check_alive('the marker handler')
                time.sleep(0.02)
            handled_at = time.monotonic()
            first_request_at = emulator.requests.first_at() or handled_at
            if result:
                time.sleep(args.settle)
                operator.check_alive('the idle settling')
            rss = operator.rss_mb()
            peak_rss = operator.peak_rss_mb()
    indexed = result.get('indexed')
    if with_index and indexed == -1:
        raise OperatorFailed('the marker handler got no index in its kwargs (`by_name`)')
    if with_index and result and indexed != count:
        raise OperatorFailed(f'the marker handler saw an incomplete index: {indexed} of {count} objects')
    measures = {
        'startup_s': first_request_at - operator.started_at,
        'handled_s': handled_at - operator.started_at,
        'rss_mb': rss,
        'peak_rss_mb': peak_rss,
    }
    if not result:  # not handled in time: the times and the peak are lower bounds, the RSS is not idle
        measures.update({'lower_bound:handled_s': 1.0, 'lower_bound:peak_rss_mb': 1.0, 'rss_mb': NAN})
    return measures


def measure_index_10k(implementation: Implementation, args: argparse.Namespace) -> Measures:
    indexed = measure_index_once(implementation, args, with_index=True)
    plain = measure_index_once(implementation, args, with_index=False)
    if 'lower_bound:handled_s' in plain:
        raise OperatorFailed(f'the marker handler was not called in {args.index_timeout:.0f}s '
                             f'even without the index')
    bounds = {key: 1.0 for key in indexed if key.startswith('lower_bound:')}
    if bounds:
        bounds['lower_bound:index_cost_s'] = 1.0
    return {
        **bounds,
        'startup_s': indexed['startup_s'],
        'handled_s': indexed['handled_s'],
        'plain_handled_s': plain['handled_s'],
        'index_cost_s': indexed['handled_s'] - plain['handled_s'],
        'rss_mb': indexed['rss_mb'],
        'plain_rss_mb': plain['rss_mb'],
        'kb_per_object': (indexed['rss_mb'] - plain['rss_mb']) * 1024 / args.index_objects,
        'peak_rss_mb': indexed['peak_rss_mb'],
    }


# ------------------------------------------------------------------------------------------------
# Tables.

@dataclasses.dataclass(frozen=True)
class Column:
    key: str
    header: str
    digits: int
    ratio: bool = True  # whether "this project ÷ Kopf" means anything for it


def scenario_columns(scenario: str) -> list[Column]:
    if scenario == 'timer-1s':
        return [Column('patch_rate', 'PATCH/s', 0), Column('ideal_pct', '% of ideal', 1),
                Column('tick_rate', 'ticks/s', 0), Column('cpu_ms_per_tick', 'CPU ms/tick', 3),
                Column('cpu_pct', 'CPU %', 0), Column('peak_rss_mb', 'peak RSS MB', 1)]
    if scenario == 'timer-60s-idle':
        return [Column('startup_s', 'start → 1st request s', 2),
                Column('all_ticked_s', 'start → all 1st ticks s', 2),
                Column('spread_s', '1st → last 1st tick s', 2),
                Column('late_s', 'LIST + delay → all 1st ticks s', 2),
                Column('burst_cpu_ms', 'burst CPU ms/tick', 3), Column('burst_cpu_pct', 'burst CPU %', 0),
                Column('rss_mb', 'idle RSS MB', 1), Column('baseline_rss_mb', 'baseline RSS MB', 1),
                Column('kb_per_object', 'KB/timed object', 2), Column('peak_rss_mb', 'peak RSS MB', 1)]
    if scenario == 'index-10k':
        return [Column('startup_s', 'start → 1st request s', 2),
                Column('handled_s', 'start → handler s', 2),
                Column('plain_handled_s', 'same without index s', 2),
                Column('index_cost_s', 'index cost s', 2),
                Column('rss_mb', 'RSS MB', 1), Column('plain_rss_mb', 'RSS without index MB', 1),
                Column('kb_per_object', 'KB/indexed object', 2), Column('peak_rss_mb', 'peak RSS MB', 1)]
    raise ValueError(f'Unknown scenario: {scenario!r}')


def medians(runs: Sequence[Measures]) -> Measures:
    """Every measure's median over the runs; a measure is a lower bound if it was one in any run."""
    result: Measures = {}
    for key in set().union(*runs):
        if key.startswith('lower_bound:'):
            result[key] = max(run.get(key, 0.0) for run in runs)
        else:
            default = 0.0 if key.startswith('requests:') else NAN  # no requests of a verb: 0 of them
            values = [value for run in runs if is_number(value := run.get(key, default))]
            result[key] = statistics.median(values) if values else NAN
    return result


def is_number(value: float | None) -> bool:
    return value is not None and value == value  # NaN != NaN


def format_value(measures: Measures, key: str, digits: int) -> str:
    value = measures.get(key)
    if not is_number(value):
        return '—'
    return ('>' if measures.get(f'lower_bound:{key}') else '') + f'{value:,.{digits}f}'


def format_ratio(ours: Measures, kopf: Measures, key: str) -> str:
    """This project's measure divided by Kopf's; '<' if Kopf's is a lower bound (and ours is not)."""
    a, b = ours.get(key), kopf.get(key)
    if not is_number(a) or not is_number(b) or not b or ours.get(f'lower_bound:{key}'):
        return '—'
    return ('<' if kopf.get(f'lower_bound:{key}') else '') + f'{a / b:.2f}'  # type: ignore[operator]


def format_paired(ours: Sequence[Measures], other: Sequence[Measures], key: str) -> str:
    """The median (min-max) of the runs' ratios: run i of one to run i of the other (interleaved: paired)."""
    ratios = [a / b for x, y in zip(ours, other, strict=True)
              if is_number(a := x.get(key)) and is_number(b := y.get(key)) and b
              and not x.get(f'lower_bound:{key}') and not y.get(f'lower_bound:{key}')]
    return median_range(ratios) if ratios else '—'


def print_table(scenario: str, names: Sequence[str], results: dict[str, Measures | None],
                failures: dict[str, list[str]], measured: dict[str, list[Measures]] | None = None) -> None:
    columns = scenario_columns(scenario)
    with_requests = scenario == 'timer-1s'
    headers = ['implementation', *(c.header for c in columns)]
    headers += ['other requests/tick'] if with_requests else []
    rows: list[list[str]] = []
    for name in names:
        measures = results.get(name)
        if measures is None:
            rows.append([name, *(['failed'] * len(columns))] + (['—'] if with_requests else []))
            continue
        row = [name, *(format_value(measures, c.key, c.digits) for c in columns)]
        if with_requests:
            others = sorted((key.split(':', 1)[1], value) for key, value in measures.items()
                            if key.startswith('requests:') and key != 'requests:patch' and value >= 0.005)
            row.append(', '.join(f'{verb} {value:.2f}' for verb, value in others) or 'none')
        rows.append(row)
    ours = results.get(names[0])
    for other_name in names[1:]:
        other = results.get(other_name)
        if ours is not None and other is not None:
            ratios = [format_ratio(ours, other, c.key) if c.ratio else '—' for c in columns]
            rows.append([f'ratio ({names[0]} ÷ {other_name})', *ratios] + (['—'] if with_requests else []))
        runs_of_ours, runs_of_other = (measured or {}).get(names[0], []), (measured or {}).get(other_name, [])
        if len(runs_of_ours) > 1 and len(runs_of_ours) == len(runs_of_other):  # no failed runs: pairs
            paired = [format_paired(runs_of_ours, runs_of_other, c.key) if c.ratio else '—' for c in columns]
            rows.append([f'paired ({names[0]} ÷ {other_name})', *paired] + (['—'] if with_requests else []))
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) for i in range(len(headers))]
    print('| ' + ' | '.join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + ' |')
    print('|' + '|'.join('-' * (w + 2) for w in widths) + '|')
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        print('| ' + ' | '.join(cells) + ' |')
    for name in names:
        for failure in failures.get(name, []):
            print(f'\n{name} failed: {failure}')


def describe(scenario: str, args: argparse.Namespace) -> str:
    handler = 'sync' if args.sync_handlers else 'async'
    if scenario == 'timer-1s':
        size = f' of ~{args.object_size:,} more bytes each' if args.object_size else ''
        return (f'{args.timer_objects} objects{size}, a timer with interval=1 ({handler}) that patches the '
                f'status; a {args.window:g}s window after all ticked once and {args.warmup:g}s of warm-up')
    if scenario == 'timer-60s-idle':
        return (f'{args.idle_objects} objects, a timer with interval={args.idle_interval:g}, '
                f'initial_delay={args.initial_delay:g} ({handler}); KB/timed object: the idle RSS '
                f'{args.settle:g}s after all ticked, minus that with {args.idle_baseline} objects, '
                f'divided by {args.idle_objects - args.idle_baseline}')
    return (f'{args.index_objects} objects in @kopf.index, the create handler of one marker of another '
            f'resource; KB/indexed object: the RSS {args.settle:g}s after the handler, minus that of '
            f'the same run without the index, divided by {args.index_objects}')


MEASURERS: dict[str, Callable[[Implementation, argparse.Namespace], Measures]] = {
    'timer-1s': measure_timer_1s,
    'timer-60s-idle': measure_timer_60s_idle,
    'index-10k': measure_index_10k,
}


def run_scenario(scenario: str, runs: Sequence[Implementation], args: argparse.Namespace) -> None:
    if not scenario.startswith('timer-'):  # the floor client has no equivalent of the other operators
        runs = [impl for impl in runs if impl.name not in FLOORS]
    measured: dict[str, list[Measures]] = {impl.name: [] for impl in runs}
    failures: dict[str, list[str]] = {impl.name: [] for impl in runs}
    # Interleaved: the machine's noise (other processes, CPU frequency) affects both alike.
    for attempt in range(args.repeat):
        for impl in run_order(runs, attempt):  # no one always after the same one
            print(f'[{scenario}] {impl.name}, run {attempt + 1} of {args.repeat} ...',
                  file=sys.stderr, flush=True)
            started = time.monotonic()
            try:
                measured[impl.name].append(MEASURERS[scenario](impl, args))
            except OperatorFailed as e:
                failures[impl.name].append(str(e))
            print(f'[{scenario}] {impl.name}: {time.monotonic() - started:.0f}s', file=sys.stderr, flush=True)
    results = {name: medians(found) if found else None for name, found in measured.items()}
    repeats = f'; medians of {args.repeat} interleaved runs' if args.repeat > 1 else ''
    substrate = ' on a real kube-apiserver' if args.api == CONTROL_PLANE else ''
    print(f'\n### `{scenario}`{substrate}: {describe(scenario, args)}{repeats}\n')
    print_table(scenario, [impl.name for impl in runs], results, failures, measured)
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--scenario', default='all', choices=['all', *SCENARIOS])
    parser.add_argument('--api', choices=[EMULATOR, CONTROL_PLANE], default=EMULATOR,
                        help='the API server: the emulator (in this process, the default), or a real etcd + '
                             'kube-apiserver (kopf.testing.KubernetesControlPlane; timer-60s-idle only)')
    add_implementation_options(parser)
    parser.add_argument('--repeat', type=int, default=1, help='runs per implementation (medians are shown)')
    parser.add_argument('--timeout', type=float, default=180.0, help='seconds to wait for any one outcome')
    parser.add_argument('--stall', type=float, default=30.0,
                        help='fail if no more objects tick for this long (seconds)')
    parser.add_argument('--settle', type=float, default=8.0,
                        help='idle seconds before reading the idle RSS (above the workers\' idle timeout)')
    parser.add_argument('--sync-handlers', action='store_true', help='sync timer handlers instead of async')
    parser.add_argument('--no-floor', action='store_true', help='do not run the floor client')
    parser.add_argument('--lean-floor', action='store_true',
                        help="also run the lean floor: the floor over the project's own HTTP client & JSON")
    parser.add_argument('--floor-python', default=None,
                        help='the Python of the floor client (it needs aiohttp only; default: --ours-python)')
    parser.add_argument('--floor-concurrency', type=int, default=400,
                        help="the floor's objects processed and ticks sent at once (default: 400)")
    parser.add_argument('--timer-objects', type=int, default=1000, help='timer-1s: objects')
    parser.add_argument('--object-size', type=int, default=0,
                        help="timer-1s: ~bytes of JSON added to each object's spec, in small fields")
    parser.add_argument('--warmup', type=float, default=3.0, help='timer-1s: seconds after all ticked once')
    parser.add_argument('--window', type=float, default=10.0, help='timer-1s: the measured seconds')
    parser.add_argument('--idle-objects', type=int, default=10_000, help='timer-60s-idle: objects')
    parser.add_argument('--idle-baseline', type=int, default=1000,
                        help='timer-60s-idle: objects of the baseline run for the RSS per object')
    parser.add_argument('--idle-interval', type=float, default=60.0, help='timer-60s-idle: the interval')
    parser.add_argument('--initial-delay', type=float, default=5.0, help='timer-60s-idle: the initial delay')
    parser.add_argument('--index-objects', type=int, default=10_000, help='index-10k: objects')
    parser.add_argument('--index-timeout', type=float, default=60.0,
                        help='index-10k: seconds to wait for the handler; if longer, this is a lower bound')
    args = parser.parse_args()
    if args.idle_baseline >= args.idle_objects:
        parser.error('--idle-baseline must be less than --idle-objects.')
    if args.api == CONTROL_PLANE and args.scenario != 'timer-60s-idle':
        parser.error(f'--api {CONTROL_PLANE} runs only the timers\' burst: add --scenario timer-60s-idle.')

    # A termination (e.g. by a CI's timeout) unwinds like Ctrl-C: the operators are stopped, not orphaned.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    runs = implementations(parser, args)
    if not args.no_floor:
        runs.append(Implementation(FLOOR_NAME, args.floor_python or args.ours_python))
    if args.lean_floor:  # it imports kopf._clients: the Python of this project
        runs.append(Implementation(LEAN_FLOOR_NAME, args.ours_python))
    for scenario in SCENARIOS if args.scenario == 'all' else [args.scenario]:
        run_scenario(scenario, runs, args)


if __name__ == '__main__':
    main()
