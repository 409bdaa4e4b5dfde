"""
The sync functions' hop to the executor's threads and back: the operator's CPU and context switches per call.

A sync handler runs in ``settings.execution.executor`` (a thread pool, as in Kopf): each call wakes a thread
up, hands the GIL over to it and back, and wakes the event loop up with the result. In a burst of events, the
calls are handed over in batches (one wake-up for many); in a trickle (e.g. a real API server's events of a
deletion, one every few milliseconds), every call pays the whole hop, which ``core_handling.py --api
control-plane`` shows as a tenth or more of the operator's CPU per deleted object. This benchmark measures
that hop alone, through the framework's own ``invoke()``:

* a trickle: N calls of a no-op sync function, one after another, with ``--gap`` seconds of an idle loop
  between them (``asyncio.sleep``); the executor is a ``ThreadPoolExecutor`` of ``--workers`` threads, all
  started beforehand (as in an operator that has had a burst once); with ``--burst K``, K calls at once
  (gathered) at every step instead of one, as in a burst of events;
* the same loop without the calls, right after: its CPU is subtracted (the idle loop's own wake-ups);
* with ``--saturated`` instead: all the threads blocked by calls and as many calls more waiting for them, the
  process's CPU (ms) and context switches per second of that wait (the loop's checks for more runners);
* per call: the process's CPU time (all threads), its context switches (of all threads, from
  ``/proc/self/task/*/status``), and the executor's jobs (its ``submit()`` calls).

Each Python (``--python``, repeatable: e.g. two venvs with different code) runs in a subprocess, once per
repeat, interleaved (the order alternates); the medians are shown, and each one's ratio to the first one's
in the same repeat (paired). The CPU varies ±30% from run to run on a shared VM; the switches and the
jobs barely vary.

Usage (from the repository root)::

    python benchmarks/sync_calls.py --python /tmp/before/bin/python --python .venv/bin/python --repeat 7
"""
import argparse
import asyncio
import concurrent.futures
import json
import pathlib
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve()


def context_switches() -> int:
    """The voluntary and involuntary context switches of all threads of this process so far (live threads)."""
    total = 0
    for status in pathlib.Path('/proc/self/task').glob('*/status'):
        try:
            text = status.read_text()
        except OSError:  # the thread has exited meanwhile
            continue
        for line in text.splitlines():
            if line.startswith(('voluntary_ctxt_switches:', 'nonvoluntary_ctxt_switches:')):
                total += int(line.split()[1])
    return total


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    jobs = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        self.jobs += 1
        return super().submit(fn, *args, **kwargs)


def noop(**_: Any) -> None:
    pass


async def measure(calls: int, gap: float, workers: int, burst: int) -> dict[str, float]:
    """In the child: the CPU (µs), switches and jobs per call of the trickle, minus the idle loop's."""
    from kopf._core.actions.invocation import invoke

    executor = CountingExecutor(max_workers=workers)
    # All the threads started (each held by a call that sleeps, so that every one needs a thread of its own).
    await asyncio.gather(*(invoke(lambda **_: time.sleep(0.01), kwargs={}, executor=executor)
                           for _ in range(workers)))
    await asyncio.sleep(0.2)  # the runners of the warm-up are gone
    jobs0, cpu0, switches0 = executor.jobs, time.process_time(), context_switches()
    for _ in range(calls // burst):
        await asyncio.gather(*(invoke(noop, kwargs={}, executor=executor) for _ in range(burst)))
        await asyncio.sleep(gap)
    jobs1, cpu1, switches1 = executor.jobs, time.process_time(), context_switches()
    for _ in range(calls // burst):
        await asyncio.sleep(gap)
    cpu2, switches2 = time.process_time(), context_switches()
    executor.shutdown(wait=True)
    return {
        'cpu': ((cpu1 - cpu0) - (cpu2 - cpu1)) * 1e6 / calls,  # µs
        'switches': ((switches1 - switches0) - (switches2 - switches1)) / calls,
        'jobs': (jobs1 - jobs0) / calls,
    }


async def measure_saturated(workers: int, seconds: float = 2.0) -> dict[str, float]:
    """In the child: the CPU (ms per second) while all the threads are blocked and more calls wait."""
    from kopf._core.actions.invocation import invoke

    executor = CountingExecutor(max_workers=workers)
    release = threading.Event()
    blocked = [asyncio.create_task(invoke(lambda **_: release.wait(30), kwargs={}, executor=executor))
               for _ in range(workers * 2)]
    await asyncio.sleep(0.5)  # the threads are all taken, the calls beyond them wait (the checks backed off)
    jobs0, cpu0, switches0, started = executor.jobs, time.process_time(), context_switches(), time.monotonic()
    await asyncio.sleep(seconds)
    jobs1, cpu1, switches1, ended = executor.jobs, time.process_time(), context_switches(), time.monotonic()
    release.set()
    await asyncio.gather(*blocked)
    executor.shutdown(wait=True)
    duration = ended - started
    return {'cpu': (cpu1 - cpu0) * 1e3 / duration,  # ms
            'switches': (switches1 - switches0) / duration, 'jobs': (jobs1 - jobs0) / duration}


def run_child(python: str, args: argparse.Namespace) -> dict[str, float]:
    command = [python, str(HERE), '--child', '--calls', str(args.calls), '--gap', str(args.gap),
               '--workers', str(args.workers), '--burst', str(args.burst),
               *(['--saturated'] if args.saturated else [])]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0] if __doc__ else None)
    parser.add_argument('--python', action='append', help='a Python with this project installed (repeatable)')
    parser.add_argument('--calls', type=int, default=3000)
    parser.add_argument('--gap', type=float, default=0.002, help='seconds of an idle loop between the calls')
    parser.add_argument('--workers', type=int, default=6, help="the executor's threads (Python's default "
                                                               "for 2 CPUs: 6)")
    parser.add_argument('--burst', type=int, default=1, help='calls at once at every step (gathered)')
    parser.add_argument('--repeat', type=int, default=5)
    parser.add_argument('--saturated', action='store_true', help='instead: the CPU per second (ms) and the '
                        'switches per second while all the threads are blocked and twice as many calls wait')
    parser.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.saturated:
            print(json.dumps(asyncio.run(measure_saturated(args.workers))))
        else:
            print(json.dumps(asyncio.run(measure(args.calls, args.gap, args.workers, args.burst))))
        return

    pythons = args.python or [sys.executable]
    per, unit = ('second', 'ms') if args.saturated else ('call', 'µs')
    results: dict[str, list[dict[str, float]]] = {python: [] for python in pythons}
    for repeat in range(args.repeat):
        for python in (pythons if repeat % 2 == 0 else pythons[::-1]):
            result = run_child(python, args)
            results[python].append(result)
            print(f'# {python}: {result["cpu"]:.1f} {unit} CPU, {result["switches"]:.2f} switches, '
                  f'{result["jobs"]:.3f} jobs per {per}', file=sys.stderr)

    if args.saturated:
        print(f'{args.workers} threads blocked, {args.workers} more calls waiting; per second; '
              f'medians of {args.repeat} runs; paired ratios to the first one:')
    else:
        print(f'{args.calls} sync no-op calls, {args.burst} at once every {args.gap * 1000:g} ms of an idle '
              f'loop, {args.workers} threads; medians of {args.repeat} runs; paired ratios to the first one:')
    print(f'| Python | CPU {unit}/{per} | context switches/{per} | executor jobs/{per} '
          '| CPU ÷ first, paired | switches ÷ first, paired |')
    print('|---|---:|---:|---:|---:|---:|')
    first = results[pythons[0]]
    for python in pythons:
        runs = results[python]
        cpu = [run['cpu'] / base['cpu'] for run, base in zip(runs, first, strict=True)]
        switches = [run['switches'] / base['switches'] for run, base in zip(runs, first, strict=True)]
        print(f'| {python} | {statistics.median(r["cpu"] for r in runs):.1f} '
              f'| {statistics.median(r["switches"] for r in runs):.2f} '
              f'| {statistics.median(r["jobs"] for r in runs):.3f} '
              f'| {statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f}) '
              f'| {statistics.median(switches):.2f} ({min(switches):.2f}-{max(switches):.2f}) |')


if __name__ == '__main__':
    main()
