"""
The core's handling benchmark: N pre-existing objects, one operator, the emulator as the API.

For each implementation (this project, and Kopf 1.45.2 if a virtualenv with it is given),
it measures: API requests per object by verb (PATCH above all), the handling throughput
(objects per second from the operator's first API request to its last PATCH request, both
timed by the emulator, not polled), the operator's CPU time per object, the peak RSS of the
operator process, and -- for this project -- the memory per idle object (the RSS difference
between two object counts after all workers went idle).

The emulator runs in this process (its own thread), the operator in a subprocess, so that
on a 2-core machine each gets a core. Usage (from the repository root):

    python benchmarks/core_handling.py --objects 1000 --install-kopf /tmp/kopf-venv

``--install-kopf DIR`` makes a virtualenv with kopf==1.45.2 from the package index in DIR
(once: an existing one is reused) and runs Kopf from it; ``--kopf-python`` takes any Python
that has Kopf 1.45.2 installed instead.

Options: --operator create_only|create_delete, --no-status-subresource,
--repeat N (interleaved runs of both implementations, medians shown),
--callgrind (instructions per object under valgrind: slow, but free of the machine's noise),
--idle 1000,10000 (the idle-memory counts; empty to skip),
--ours-python (default: this interpreter; for a fair peak RSS, one without the optional
`kubernetes` and `pykube-ng`, which are imported for the login if installed), --timeout (seconds per run).
"""
import argparse
import asyncio
import dataclasses
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

from _harness import (
    install_kopf,
    populate,
    read_cpu_seconds,
    read_proc_status,
    start_operator,
    stop_operator,
    wait_until,
)

from kopf.testing import KubernetesEmulator


@dataclasses.dataclass
class Result:
    name: str
    objects: int
    seconds: float
    cpu_seconds: float  # the operator process's user+system CPU time during the handling
    requests: dict[str, int]
    peak_rss_mb: float

    @property
    def rate(self) -> float:
        return self.objects / self.seconds if self.seconds else 0.0


def is_handled(obj: dict[str, Any]) -> bool:
    """Handled: the result is in the status and the diff-base is stored, no progress is left."""
    annotations = obj.get('metadata', {}).get('annotations', {})
    return (
        'create_fn' in obj.get('status', {})
        and 'kopf.zalando.org/last-handled-configuration' in annotations
        and 'kopf.zalando.org/create_fn' not in annotations
    )


def all_handled(emulator: KubernetesEmulator, count: int) -> bool:
    return sum(map(is_handled, emulator.list_objects('kopfexamples.kopf.dev'))) >= count


def measure_handling(name: str, python: str, operator: str, count: int, timeout: float,
                     status_subresource: bool) -> Result:
    with KubernetesEmulator(history_limit=max(10_000, count * 20)) as emulator:
        asyncio.run(populate(emulator.url, count, status_subresource=status_subresource))
        emulator.requests.reset()
        process = start_operator(python, operator, emulator.kubeconfig_path)
        try:
            if not wait_until(lambda: emulator.requests.total > 0, timeout, interval=0.01):
                raise RuntimeError(f'{name}: the operator made no API requests (exit: {process.poll()}).')
            cpu_started = read_cpu_seconds(process.pid)
            done = wait_until(
                lambda: all_handled(emulator, count),
                timeout)
            cpu_seconds = read_cpu_seconds(process.pid) - cpu_started
            if not done:
                raise RuntimeError(f'{name}: not all objects were handled in {timeout}s.')
            time.sleep(1.0)  # let the trailing requests of the last objects arrive
            # The window is exact, not polled: from the first API request to the last PATCH
            # (the one that made the last object handled), both timed by the emulator.
            seconds = (emulator.requests.last_at('patch') or 0.0) - (emulator.requests.first_at() or 0.0)
            peak_rss = read_proc_status(process.pid, 'VmHWM')
            requests = emulator.requests.by_verb()
        finally:
            stop_operator(process)
    return Result(name=name, objects=count, seconds=seconds, cpu_seconds=cpu_seconds,
                  requests=requests, peak_rss_mb=peak_rss)


def median_result(results: list[Result]) -> Result:
    """Every measure's median over the runs (the requests are those of the median run by rate)."""
    by_rate = sorted(results, key=lambda r: r.rate)
    middle = by_rate[len(by_rate) // 2]
    return dataclasses.replace(
        middle,
        seconds=statistics.median(r.seconds for r in results),
        cpu_seconds=statistics.median(r.cpu_seconds for r in results),
        peak_rss_mb=statistics.median(r.peak_rss_mb for r in results),
    )


def count_instructions(python: str, operator: str, count: int, timeout: float,
                       status_subresource: bool) -> int:
    """The instructions executed by the operator process (under callgrind) to handle `count` objects."""
    with KubernetesEmulator(history_limit=max(10_000, count * 20)) as emulator, \
            tempfile.TemporaryDirectory() as tmpdir:
        asyncio.run(populate(emulator.url, count, status_subresource=status_subresource))
        output = pathlib.Path(tmpdir) / 'callgrind.out'
        wrapper = ['valgrind', '--tool=callgrind', f'--callgrind-out-file={output}']
        process = start_operator(python, operator, emulator.kubeconfig_path, wrapper=wrapper)
        try:
            if not wait_until(
                    lambda: all_handled(emulator, count),
                    timeout, interval=1.0):
                raise RuntimeError(f'callgrind: not all {count} objects were handled in {timeout}s.')
            time.sleep(2.0)  # the trailing requests
        finally:
            stop_operator(process)
        for line in output.read_text().splitlines():
            if line.startswith('summary:'):
                return int(line.split()[1])
    raise RuntimeError('callgrind: no summary in its output.')


def measure_idle_rss(python: str, operator: str, count: int, timeout: float, settle: float) -> float:
    """The operator's RSS once `count` objects are handled and every worker has gone idle."""
    with KubernetesEmulator(history_limit=max(10_000, count * 20)) as emulator:
        asyncio.run(populate(emulator.url, count))
        process = start_operator(python, operator, emulator.kubeconfig_path)
        try:
            if not wait_until(
                    lambda: all_handled(emulator, count),
                    timeout, interval=1.0):
                raise RuntimeError(f'idle: not all {count} objects were handled in {timeout}s.')
            time.sleep(settle)
            return read_proc_status(process.pid, 'VmRSS')
        finally:
            stop_operator(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--objects', type=int, default=1000)
    parser.add_argument('--operator', default='create_only', choices=['create_only', 'create_delete'])
    parser.add_argument('--ours-python', default=sys.executable)
    parser.add_argument('--kopf-python', default=None, help='a Python with kopf==1.45.2 installed')
    parser.add_argument('--install-kopf', default=None, metavar='DIR',
                        help='make (or reuse) a virtualenv with kopf==1.45.2 in DIR and run Kopf from it')
    parser.add_argument('--idle', default='1000,10000', help='object counts for idle memory; empty: skip')
    parser.add_argument('--timeout', type=float, default=300.0)
    parser.add_argument('--repeat', type=int, default=1, help='runs per implementation (medians are shown)')
    parser.add_argument('--callgrind', action='store_true',
                        help='also count the instructions per object under valgrind (slow, but noise-free)')
    parser.add_argument('--no-status-subresource', action='store_true',
                        help='a CRD without the status subresource (status and metadata in one request)')
    args = parser.parse_args()

    if args.install_kopf and args.kopf_python:
        parser.error('--install-kopf and --kopf-python are mutually exclusive.')
    kopf_python = install_kopf(pathlib.Path(args.install_kopf)) if args.install_kopf else args.kopf_python
    runs = [('this project', args.ours_python)]
    if kopf_python:
        runs.append(('Kopf 1.45.2', kopf_python))
    status_subresource = not args.no_status_subresource
    # The runs of both implementations are interleaved and repeated: the machine's noise (other
    # processes, CPU frequency) then affects both alike, and the medians are less noisy than one run.
    measured: dict[str, list[Result]] = {name: [] for name, _ in runs}
    for _ in range(args.repeat):
        for name, python in runs:
            measured[name].append(measure_handling(name, python, args.operator, args.objects, args.timeout,
                                                   status_subresource))
    results = [median_result(measured[name]) for name, _ in runs]

    crd_kind = 'with' if status_subresource else 'without'
    repeats = f', medians of {args.repeat} interleaved runs' if args.repeat > 1 else ''
    print(f'\nHandling {args.objects} pre-existing objects with the {args.operator!r} operator, '
          f'a CRD {crd_kind} the status subresource{repeats}:\n')
    print(f'| {"implementation":<14} | objects/s | seconds | CPU ms/obj | PATCH/obj | requests/obj (by verb) '
          f'| peak RSS MB |')
    print(f'|{"-" * 16}|-----------|---------|------------|-----------|{"-" * 24}|-------------|')
    for r in results:
        per_object = ', '.join(f'{verb} {n / r.objects:.2f}' for verb, n in sorted(r.requests.items())
                               if n / r.objects >= 0.01)
        patches = r.requests.get('patch', 0) / r.objects
        cpu_ms = r.cpu_seconds * 1000 / r.objects
        print(f'| {r.name:<14} | {r.rate:9.0f} | {r.seconds:7.2f} | {cpu_ms:10.2f} | {patches:9.2f} | '
              f'{per_object:<22} | {r.peak_rss_mb:11.1f} |')
    if args.repeat > 1:
        for name, _ in runs:
            rates = ', '.join(f'{r.rate:.0f}' for r in sorted(measured[name], key=lambda r: r.rate))
            print(f'\n{name}: objects/s of all runs: {rates}', end='')
        print()

    if args.callgrind:
        # Instructions are not affected by the machine's noise: the same run gives the same count.
        # Two object counts, so that the start-up (imports, discovery) cancels out.
        lo, hi = args.objects // 4, args.objects
        print(f'\nInstructions per handled object (callgrind; {hi} minus {lo} objects):\n')
        for name, python in runs:
            instructions = {n: count_instructions(python, args.operator, n, args.timeout * 20,
                                                  status_subresource)
                            for n in (lo, hi)}
            per_object = (instructions[hi] - instructions[lo]) / (hi - lo)
            print(f'  {name:<14} {per_object / 1e6:6.2f} M instructions/object')

    counts = [int(c) for c in args.idle.split(',') if c.strip()]
    if len(counts) >= 2:
        settle = 8.0  # longer than settings.queueing.idle_timeout (5s): the workers must exit
        rss = {c: measure_idle_rss(args.ours_python, args.operator, c, args.timeout, settle) for c in counts}
        lo, hi = min(counts), max(counts)
        per_object_kb = (rss[hi] - rss[lo]) * 1024 / (hi - lo)
        listing = ', '.join(f'{c} objects: {rss[c]:.1f} MB' for c in counts)
        print(f'\nIdle memory of this project: {listing}; '
              f'about {per_object_kb:.2f} KB per idle watched object.')


if __name__ == '__main__':
    main()
