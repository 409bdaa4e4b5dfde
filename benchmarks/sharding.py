"""
The sharding benchmark (#41): 1, 2, 3 replicas (``kopf run --shards``) splitting I/O-bound handling.

The emulator runs in this process (its own thread), each replica in a subprocess
(``kopf run -n default --shards default/bench operators/sharded.py``) with a kubeconfig to the emulator.
The operator's create handler waits 50 ms (``--handler-seconds``) and returns a result that
the framework stores in the object's status; each replica processes at most 20 objects at once
(``settings.queueing.worker_limit``, ``--worker-limit``): so one replica does at most ~400 objects/s,
and the replicas, not the API server or the CPU, are meant to be the bottleneck.

One run: the emulator (with or without the feature gate ``ShardedListAndWatch``, i.e. the server-side
``shardSelector``) and the CRD; N replicas started; the wait until the 32 shards are split evenly among
them (by their Leases) and their watch-streams have settled; then 5,000 objects (``--objects``) are created
(50 at a time) and the benchmark polls the stored objects for the handlers' results. Measured:

* objects/s: the objects divided by the time from the first creation to the last result stored;
  also the steady rate: 80% of the objects divided by the time between the 10% and the 90% handled;
* the CPU time of every replica (``/proc/PID/stat``) from the first creation to the last result;
* the watch-events of the objects that the emulator has sent to the replicas (all of them).

The CPU spent on the events of the objects that a replica does not own: the same N replicas are run
with the server-side selector (the emulator's feature gate on: a replica gets only its own objects'
events) and without it (every replica gets every event and drops the foreign ones itself). All else is
the same, so the difference of the replicas' CPU is the cost of the foreign events (their reading,
JSON decoding, and dropping); divided by the difference of the events sent, it is the cost per foreign
event. (With one replica, the selector is never sent: it holds all the shards.)

The runs are interleaved (1, 2, 3 replicas; without & with the selector) ``--repeat`` times; the medians.

Usage (from the repository root)::

    .venv/bin/python benchmarks/sharding.py --repeat 3
    .venv/bin/python benchmarks/sharding.py --objects 2000 --replicas 1 2 --repeat 2
"""
import argparse
import asyncio
import copy
import json
import statistics
import sys
import threading
import time
from collections.abc import Sequence

import aiohttp
from _harness import (
    CRD,
    HERE,
    Operator,
    OperatorFailed,
    create_crd,
    create_objects,
    example_bodies,
    run_order,
)

from kopf.testing import KubernetesEmulator

NAME = 'bench'
COUNT = 32  # settings.sharding.count's default
HISTORY_LIMIT = 100_000
DONE = b'"handled":1'
FEATURE_GATE = 'ShardedListAndWatch'


def shard_holders(emulator: KubernetesEmulator) -> dict[str, str]:
    leases = emulator.list_objects('leases.coordination.k8s.io', namespace='default')
    return {lease['metadata']['name']: (lease.get('spec') or {}).get('holderIdentity') or ''
            for lease in leases if lease['metadata']['name'].startswith(f'{NAME}-')}


def is_balanced(emulator: KubernetesEmulator, replicas: int) -> bool:
    leases = shard_holders(emulator)
    members = {holder for name, holder in leases.items() if name.startswith(f'{NAME}-member-') and holder}
    shards = [holder for name, holder in leases.items() if name.startswith(f'{NAME}-shard-') and holder]
    counts = [shards.count(member) for member in members]
    return (len(members) == replicas and len(shards) == COUNT and set(shards) == members
            and max(counts) - min(counts) <= 1)


def count_handled(emulator: KubernetesEmulator) -> int:
    # The stored objects are immutable (see engines.py): read from this thread without decoding them.
    return sum(DONE in stored.encoded for stored in emulator.store.objects(('kopf.dev', 'kopfexamples')))


def replica(python: str, emulator: KubernetesEmulator, args: argparse.Namespace) -> Operator:
    env = {'BENCH_HANDLER_SECONDS': str(args.handler_seconds), 'BENCH_WORKER_LIMIT': str(args.worker_limit)}
    command = [python, '-m', 'kopf', 'run', '-n', 'default', '--shards', f'default/{NAME}',
               str(HERE / 'operators' / 'sharded.py')]
    return Operator(python, 'sharded', emulator.kubeconfig_path, env=env, command=command)


def measure_once(args: argparse.Namespace, replicas: int, selector: bool) -> dict[str, float]:
    gates = {FEATURE_GATE: selector}
    with KubernetesEmulator(history_limit=HISTORY_LIMIT, feature_gates=gates) as emulator:
        async def setup() -> None:
            async with aiohttp.ClientSession(base_url=emulator.url) as session:
                await create_crd(session, copy.deepcopy(CRD))
        asyncio.run(setup())
        operators = [replica(args.python, emulator, args) for _ in range(replicas)]
        try:
            for operator in operators:
                operator.__enter__()
            deadline = time.monotonic() + args.timeout
            while not is_balanced(emulator, replicas):
                for operator in operators:
                    operator.check_alive('the shards\' split')
                if time.monotonic() > deadline:
                    operators[0].fail(f'the shards are not split in {args.timeout}s: '
                                      f'{shard_holders(emulator)}')
                time.sleep(0.2)
            time.sleep(args.settle)  # the watch-streams restarted for the gained shards; the idle CPU settles
            idle_cpu = [operator.cpu_seconds() for operator in operators]
            idle_at = time.monotonic()
            time.sleep(args.idle)
            idle_cpu = [op.cpu_seconds() - cpu for op, cpu in zip(operators, idle_cpu, strict=True)]
            idle_s = time.monotonic() - idle_at

            events_before = emulator.watch_events(path='kopfexamples')
            cpu_before = [operator.cpu_seconds() for operator in operators]
            started = time.monotonic()
            bodies = example_bodies(args.objects)

            async def create_all() -> None:
                async with aiohttp.ClientSession(base_url=emulator.url) as session:
                    await create_objects(session, 'kopfexamples', bodies)

            # The creation in its own thread, while this one polls for the results from the start.
            creator = threading.Thread(target=asyncio.run, args=(create_all(),), daemon=True)
            creator.start()
            marks: dict[float, float] = {}
            fractions = (0.1, 0.9)
            last, last_progress = -1, time.monotonic()
            while True:
                handled = count_handled(emulator)
                now = time.monotonic()
                for fraction in fractions:
                    if fraction not in marks and handled >= fraction * args.objects:
                        marks[fraction] = now
                if handled >= args.objects:
                    break
                if handled > last:
                    last, last_progress = handled, now
                for operator in operators:
                    operator.check_alive('the handling')
                if now - last_progress > args.stall or now - started > args.timeout:
                    operators[0].fail(f'the handling is stuck at {handled} of {args.objects}')
                time.sleep(0.05)
            finished = time.monotonic()
            cpu = [op.cpu_seconds() - before for op, before in zip(operators, cpu_before, strict=True)]
            creator.join()
            events = emulator.watch_events(path='kopfexamples') - events_before
        finally:
            for operator in operators:
                operator.__exit__()
    duration = finished - started
    return {
        'objects_per_s': args.objects / duration,
        'steady_per_s': 0.8 * args.objects / (marks[0.9] - marks[0.1]),
        'duration_s': duration,
        'cpu_total_s': sum(cpu),
        'cpu_max_s': max(cpu),
        'cpu_min_s': min(cpu),
        'idle_cpu_per_s': sum(idle_cpu) / idle_s,  # the leases' renewals & co, all replicas together
        'events': events,
    }


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float('nan')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--python', default=sys.executable, help='the Python of the replicas (this one)')
    parser.add_argument('--objects', type=int, default=5000)
    parser.add_argument('--replicas', type=int, nargs='+', default=[1, 2, 3])
    parser.add_argument('--handler-seconds', type=float, default=0.05)
    parser.add_argument('--worker-limit', type=int, default=20)
    parser.add_argument('--repeat', type=int, default=3)
    parser.add_argument('--no-server-selector', action='store_true',
                        help='only the runs without the server-side shardSelector (the client-side filter)')
    parser.add_argument('--settle', type=float, default=3.0,
                        help='seconds after the split, before measuring')
    parser.add_argument('--idle', type=float, default=2.0,
                        help='seconds of idle CPU measured before creating')
    parser.add_argument('--timeout', type=float, default=300.0)
    parser.add_argument('--stall', type=float, default=30.0)
    parser.add_argument('--json', help='write the raw results to this file')
    args = parser.parse_args()

    modes = [(n, False) for n in args.replicas]
    if not args.no_server_selector:
        modes += [(n, True) for n in args.replicas if n > 1]
    results: dict[tuple[int, bool], list[dict[str, float]]] = {mode: [] for mode in modes}
    for repetition in range(args.repeat):
        for replicas, selector in run_order(modes, repetition):  # no one always after the same one
            label = f'{replicas} replica(s), {"server-side selector" if selector else "client-side filter"}'
            try:
                measures = measure_once(args, replicas, selector)
            except OperatorFailed as e:
                print(f'#{repetition + 1} {label}: FAILED: {e}', flush=True)
                continue
            results[(replicas, selector)].append(measures)
            print(f'#{repetition + 1} {label}: {measures["objects_per_s"]:.0f} obj/s '
                  f'(steady {measures["steady_per_s"]:.0f}), {measures["duration_s"]:.1f} s, '
                  f'CPU {measures["cpu_total_s"]:.2f} s (per replica {measures["cpu_min_s"]:.2f}..'
                  f'{measures["cpu_max_s"]:.2f}), {measures["events"]:.0f} events, '
                  f'idle CPU {measures["idle_cpu_per_s"] * 1000:.0f} ms/s', flush=True)

    def med(mode: tuple[int, bool], key: str) -> float:
        return median([measures[key] for measures in results.get(mode, [])])

    base = med((1, False), 'objects_per_s')
    base_steady = med((1, False), 'steady_per_s')
    print(f'\n{args.objects} objects, {args.handler_seconds * 1000:.0f} ms handlers, '
          f'worker_limit={args.worker_limit}; medians of {args.repeat}:')
    print('| replicas | selector | objects/s | x of 1 | steady obj/s | x of 1 | CPU s (all) | CPU s/replica '
          '| events sent |')
    print('|---|---|---|---|---|---|---|---|---|')
    for mode in modes:
        replicas, selector = mode
        rate, steady = med(mode, 'objects_per_s'), med(mode, 'steady_per_s')
        print(f'| {replicas} | {"server" if selector else "client"} | {rate:.0f} | {rate / base:.2f} '
              f'| {steady:.0f} | {steady / base_steady:.2f} | {med(mode, "cpu_total_s"):.2f} '
              f'| {med(mode, "cpu_total_s") / replicas:.2f} | {med(mode, "events"):.0f} |')
    # Paired: each repetition's rate against the same repetition's 1-replica rate (the load of a shared
    # machine drifts over minutes; the runs of one repetition are a minute or two apart).
    singles = [measures['objects_per_s'] for measures in results.get((1, False), [])]
    for mode in modes:
        if mode[0] > 1 and len(results.get(mode, [])) == len(singles) > 0:
            pairs = zip(results[mode], singles, strict=True)
            ratios = [measures['objects_per_s'] / single for measures, single in pairs]
            print(f'{mode[0]} replicas ({"server" if mode[1] else "client"}), paired ratios to 1: '
                  f'{", ".join(f"{ratio:.2f}" for ratio in ratios)}; median {median(ratios):.2f}')
    for replicas in args.replicas:
        off, on = (replicas, False), (replicas, True)
        if replicas > 1 and results.get(on) and results.get(off):
            cpu = med(off, 'cpu_total_s') - med(on, 'cpu_total_s')
            foreign = med(off, 'events') - med(on, 'events')
            share = 100 * cpu / med(off, 'cpu_total_s')
            print(f'{replicas} replicas: the foreign events cost {cpu:.2f} CPU s in all '
                  f'({cpu / replicas:.2f} s per replica, {share:.0f}% of their CPU) '
                  f'for {foreign:.0f} foreign events: {cpu / foreign * 1e6:.0f} µs per event.')
    if args.json:
        with open(args.json, 'w') as file:
            raw = {f'{n}-{"server" if s else "client"}': v for (n, s), v in results.items()}
            json.dump(raw, file, indent=1)


if __name__ == '__main__':
    main()
