"""
The core's handling benchmark: Kopf 1.45.2, this project, and the floor, side by side.

N pre-existing objects of a CRD; an operator with a create handler (``operators/create_only.py``)
or with a create and a delete handler (``operators/create_delete.py``); the emulator as the API
server (in this process, its own thread), each operator in a subprocess (so that on a 2-core
machine each gets a core). The same operator file runs under this project and under Kopf 1.45.2
(``operators/runner.py``, i.e. ``kopf.run()``); the floor is ``floor_client.py``: a minimal
hand-written aiohttp client that makes the same requests per object with no framework at all.

Every scenario (an operator, an object count, an API latency) runs each implementation once per repeat,
interleaved, and the medians are shown. Per run, all timed by the emulator (not polled):

* the time from spawning the operator's process to its first API request (imports, login),
  and to its LIST of the objects (plus the discovery);
* create: objects/s from that LIST to the last PATCH of the create phase (every object handled:
  its result in the status, the diff-base stored);
* delete (``create_delete`` only): all objects are deleted by one DELETE of the collection (so
  that the benchmark's own requests cost nothing per object), then objects/s from that request
  to the last PATCH (every finalizer removed, every object gone);
* the operator's CPU time per object from its LIST to the end of the last phase
  (``/proc/PID/stat``), and the part of it from the DELETE to the end (in parentheses), its peak RSS
  (``VmHWM``), its API requests per object by verb (and, in the progress lines, its watch requests: more
  than one per watched resource are re-watches, e.g. after the server has ended a watch whose client did
  not read for a while, as both servers do);
* the ratios of each measure to Kopf's and to the floor's.

``--api control-plane`` runs every measurement on a fresh real etcd + kube-apiserver instead
(``kopf.testing.KubernetesControlPlane``; the binaries from ``$KUBEBUILDER_ASSETS``), the operators
logged in over HTTPS by the kubeconfig, the objects created 32 at a time. There are no request hooks
there: the operator's requests (their verbs, its first request, its LIST) come from kube-apiserver's
audit log, and the end of each phase is when the benchmark's own watch of the objects sees the last
one handled or gone (see ``_controlplane.py``). ``--latency``, ``--trace`` and ``--callgrind`` are
the emulator's only.

Usage (from the repository root):

    python benchmarks/core_handling.py --kopf-python /tmp/kopf-venv/bin/python \\
        --ours-python /tmp/ours-venv/bin/python --objects 1000,5000,20000 --repeat 3

``--install-kopf DIR`` makes a virtualenv with kopf==1.45.2 from the package index in DIR
(once: an existing one is reused) and runs Kopf from it; ``--kopf-python`` takes any Python
that has Kopf 1.45.2 installed instead; without either, Kopf is not run.

Options: --objects 1000[,5000,...], --operator create_delete[,create_only], --latency 0[,5]
(milliseconds added to every API request by the emulator's fault injection),
--repeat N (interleaved runs, medians shown), --no-floor, --no-ours, --floor-python, --floor-concurrency,
--plot PATH / --no-plot (matplotlib: objects/s and RSS against N), --trace DIR (every request's
method, path and body, per run: to see the requests per object), --no-status-subresource,
--callgrind (instructions per object in each phase under valgrind, for the first operator and object count:
slow, but free of the machine's noise),
--idle 1000,10000 (this project's idle memory per watched object; empty to skip),
--ours-python (default: this interpreter; for a fair peak RSS and start-up, one without the optional
`kubernetes` and `pykube-ng`, which are imported for the login if installed), or --install-ours DIR (a
virtualenv with this project installed from the working tree, as a user installs it), --timeout (seconds per
phase).
"""
import argparse
import asyncio
import dataclasses
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
from _controlplane import ControlPlaneRun, Observer
from _harness import (
    BASELINE_NAME,
    HERE,
    KOPF_NAME,
    OPERATORS,
    OURS_NAME,
    Operator,
    OperatorFailed,
    RequestLog,
    add_ours_options,
    install_kopf,
    median_range,
    ours_python,
    populate,
    read_proc_status,
    run_order,
    start_operator,
    stop_operator,
    wait_until,
)

from kopf.testing import KubernetesEmulator

EMULATOR, CONTROL_PLANE = 'emulator', 'control-plane'
FLOOR_NAME = 'the floor'
OURS_METRICS_NAME = f'{OURS_NAME}, metrics on'
OURS_ASYNC_NAME = f'{OURS_NAME}, async handlers'
LEAN_FLOOR_NAME = 'the lean floor'
OPERATORS_CHOICES = ('create_delete', 'create_only')
COLLECTION = '/apis/kopf.dev/v1/namespaces/default/kopfexamples'
QUIET_SECONDS = 0.5  # no PATCH for this long: the phase may be over (then it is checked exactly)
DEFAULT_PLOT = HERE / 'core_handling.png'
CONTROL_PLANE_PLOT = HERE / 'core_handling-control-plane.png'
# The same in every plot, whoever runs.
COLORS = {KOPF_NAME: 'C0', OURS_NAME: 'C1', FLOOR_NAME: 'C2', OURS_METRICS_NAME: 'C3',
          BASELINE_NAME: 'C4', LEAN_FLOOR_NAME: 'C5', OURS_ASYNC_NAME: 'C6'}


@dataclasses.dataclass(frozen=True)
class Implementation:
    name: str
    python: str
    floor: bool = False
    floor_concurrency: int = 100
    metrics: bool = False  # this project with its metrics on (served on a free port, not scraped)
    lean: bool = False  # the lean floor: floor_client.py --client lean (the project's HTTP client & JSON)
    uvloop: bool = False  # on uvloop's event loop (all implementations alike, with --uvloop)
    async_handlers: bool = False  # this project with the operator's async variant (operators/*_async.py)

    def command(self, operator: str, login: Sequence[str], status_subresource: bool) -> list[str]:
        """The operator's command; ``login`` is the floor's: ``--server URL`` or ``--kubeconfig PATH``."""
        if not self.floor:
            variant = f'{operator}_async' if self.async_handlers else operator
            return [self.python, str(OPERATORS / 'runner.py'), str(OPERATORS / f'{variant}.py'),
                    *(['--metrics'] if self.metrics else []), *(['--uvloop'] if self.uvloop else [])]
        return [self.python, str(HERE / 'floor_client.py'), *login,
                '--concurrency', str(self.floor_concurrency),
                *(['--delete-handler'] if operator == 'create_delete' else []),
                *([] if status_subresource else ['--no-status-subresource']),
                *(['--client', 'lean'] if self.lean else []), *(['--uvloop'] if self.uvloop else [])]


@dataclasses.dataclass(frozen=True)
class Scenario:
    operator: str
    objects: int
    latency_ms: float

    @property
    def deletes(self) -> bool:
        return self.operator == 'create_delete'

    def describe(self) -> str:
        return f'{self.operator}, {self.objects} objects, {self.latency_ms:g} ms latency'


@dataclasses.dataclass
class Result:
    name: str
    scenario: Scenario
    startup_seconds: float  # from spawning the process to its first API request
    listed_seconds: float  # from spawning the process to its LIST of the objects
    create_seconds: float
    delete_seconds: float | None
    cpu_seconds: float  # the operator's user+system CPU time from its LIST to the end of the phases
    delete_cpu_seconds: float | None  # the part of it from the DELETE of the collection to the end
    requests: dict[str, int]  # the operator's requests by verb
    peak_rss_mb: float

    @property
    def create_rate(self) -> float:
        return self.scenario.objects / self.create_seconds if self.create_seconds > 0 else 0.0

    @property
    def delete_rate(self) -> float | None:
        if self.delete_seconds is None:
            return None
        return self.scenario.objects / self.delete_seconds if self.delete_seconds > 0 else 0.0

    @property
    def cpu_ms_per_object(self) -> float:
        return self.cpu_seconds * 1000 / self.scenario.objects

    @property
    def delete_cpu_ms_per_object(self) -> float | None:
        if self.delete_cpu_seconds is None:
            return None
        return self.delete_cpu_seconds * 1000 / self.scenario.objects


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


def wait_for_phase(operator: Operator, emulator: KubernetesEmulator, done: Callable[[], bool],
                   started_at: float, timeout: float, what: str) -> float:
    """
    Wait until the phase is done; return when its last PATCH arrived (timed by the emulator).

    Checking ``done()`` costs a decoding of all objects in this process, which would compete with
    the emulator for the GIL; so it is checked only once a PATCH of this phase (after ``started_at``)
    has come and no other PATCH has come for a while since.
    """
    deadline = time.monotonic() + timeout
    checked_at: float | None = None  # the last PATCH's time when done() was last checked (false)
    while True:
        operator.check_alive(what)
        last_patch = emulator.requests.last_at('patch')
        if last_patch is not None and last_patch > started_at and last_patch != checked_at \
                and time.monotonic() - last_patch > QUIET_SECONDS:
            if done():
                return last_patch
            checked_at = last_patch
        if time.monotonic() > deadline:
            operator.fail(f'{what}: not done in {timeout:.0f}s')
        time.sleep(0.05)


async def delete_all(url: str) -> None:
    async with aiohttp.ClientSession(base_url=url) as session, session.delete(COLLECTION) as response:
        response.raise_for_status()
        await response.read()


def measure(implementation: Implementation, scenario: Scenario, *, timeout: float,
            status_subresource: bool, trace_path: pathlib.Path | None = None) -> Result:
    count = scenario.objects
    log = RequestLog(trace=trace_path is not None, collection=COLLECTION)
    emulator = KubernetesEmulator(history_limit=max(10_000, count * 20))
    emulator._handler = log.wrap(emulator._handler)  # type: ignore[assignment]
    name = implementation.name
    with emulator:
        asyncio.run(populate(emulator.url, count, status_subresource=status_subresource))
        if scenario.latency_ms:
            emulator.add_latency(scenario.latency_ms / 1000)
        emulator.requests.reset()
        log.reset()
        command = implementation.command(scenario.operator, ['--server', emulator.url], status_subresource)
        with Operator(implementation.python, scenario.operator, emulator.kubeconfig_path,
                      command=command) as operator:
            operator.wait_until(lambda: log.listed_at is not None, timeout,
                                f'{name}: the LIST of the objects', interval=0.002)
            cpu_started = operator.cpu_seconds()
            assert log.listed_at is not None
            listed_at = log.listed_at
            created_at = wait_for_phase(operator, emulator, lambda: all_handled(emulator, count), listed_at,
                                        timeout, f'{name}: handling the creation of {count} objects')
            delete_seconds: float | None = None
            delete_cpu_started: float | None = None
            if scenario.deletes:
                delete_cpu_started = operator.cpu_seconds()
                asyncio.run(delete_all(emulator.url))
                deleting_at = emulator.requests.first_at('deletecollection') or created_at
                deleted_at = wait_for_phase(
                    operator, emulator, lambda: not emulator.list_objects('kopfexamples.kopf.dev'),
                    deleting_at, timeout, f'{name}: handling the deletion of {count} objects')
                delete_seconds = deleted_at - deleting_at
            cpu_ended = operator.cpu_seconds()
            cpu_seconds = cpu_ended - cpu_started
            delete_cpu_seconds = cpu_ended - delete_cpu_started if delete_cpu_started is not None else None
            peak_rss = operator.peak_rss_mb()
            first_request_at = emulator.requests.first_at() or listed_at
            requests = emulator.requests.by_verb()
            requests.pop('deletecollection', None)  # the benchmark's own request
            startup_seconds = first_request_at - operator.started_at
            listed_seconds = listed_at - operator.started_at
    if trace_path is not None and log.lines is not None:
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        trace_path.write_text('\n'.join(log.lines) + '\n')
    return Result(name=name, scenario=scenario, startup_seconds=startup_seconds,
                  listed_seconds=listed_seconds, create_seconds=created_at - listed_at,
                  delete_seconds=delete_seconds, cpu_seconds=cpu_seconds,
                  delete_cpu_seconds=delete_cpu_seconds, requests=requests,
                  peak_rss_mb=peak_rss)


def wait_observed(operator: Operator, observer: Observer, done: Callable[[], bool], timeout: float,
                  what: str) -> None:
    """Wait until the benchmark's watch shows the phase done; fail if the operator or the watch fails."""
    deadline = time.monotonic() + timeout
    while not done():
        observer.check()
        operator.check_alive(what)
        if time.monotonic() > deadline:
            operator.fail(f'{what}: not done in {timeout:.0f}s')
        time.sleep(0.05)


def measure_on_control_plane(implementation: Implementation, scenario: Scenario, *, timeout: float,
                             status_subresource: bool) -> Result:
    """
    The same measures on a fresh real control plane (see ``_controlplane.py``).

    The operator's requests, its first request and its LIST of the objects come from kube-apiserver's
    audit log (when they were received, as on the emulator); the end of each phase is when the
    benchmark's own watch of the objects sees the last object handled (create) or gone (delete),
    and the deletion starts when the benchmark sends its DELETE of the collection.
    """
    count = scenario.objects
    name = implementation.name
    with ControlPlaneRun() as run:
        run.populate(count, status_subresource=status_subresource)
        with Observer(run) as observer:
            run.audit.skip()  # the benchmark's own requests are not logged; the start-up's are not counted
            login = ['--kubeconfig', str(run.kubeconfig_path)]
            command = implementation.command(scenario.operator, login, status_subresource)
            with Operator(implementation.python, scenario.operator, run.kubeconfig_path,
                          command=command) as operator:
                operator.wait_until(lambda: run.audit.first_at('list', 'kopfexamples') is not None, timeout,
                                    f'{name}: the LIST of the objects', interval=0.005)
                cpu_started = operator.cpu_seconds()
                listed_at = run.audit.first_at('list', 'kopfexamples')
                assert listed_at is not None
                wait_observed(operator, observer, lambda: len(observer.handled) >= count, timeout,
                              f'{name}: handling the creation of {count} objects')
                assert observer.handled_at is not None
                created_at = observer.handled_at
                delete_seconds: float | None = None
                delete_cpu_started: float | None = None
                if scenario.deletes:
                    delete_cpu_started = operator.cpu_seconds()
                    deleting_at = time.monotonic()
                    run.delete_all()
                    wait_observed(operator, observer, lambda: not observer.alive, timeout,
                                  f'{name}: handling the deletion of {count} objects')
                    assert observer.gone_at is not None
                    delete_seconds = observer.gone_at - deleting_at
                cpu_ended = operator.cpu_seconds()
                cpu_seconds = cpu_ended - cpu_started
                delete_cpu_seconds = None if delete_cpu_started is None else cpu_ended - delete_cpu_started
                peak_rss = operator.peak_rss_mb()
                requests = run.audit.by_verb()
                first_request_at = run.audit.first_at() or listed_at
    return Result(name=name, scenario=scenario, startup_seconds=first_request_at - operator.started_at,
                  listed_seconds=listed_at - operator.started_at, create_seconds=created_at - listed_at,
                  delete_seconds=delete_seconds, cpu_seconds=cpu_seconds,
                  delete_cpu_seconds=delete_cpu_seconds, requests=requests,
                  peak_rss_mb=peak_rss)


def median_result(results: list[Result]) -> Result:
    """Every measure's median over the runs (the requests are those of the median run by rate)."""
    by_rate = sorted(results, key=lambda r: r.create_rate)
    middle = by_rate[len(by_rate) // 2]
    deletes = [r.delete_seconds for r in results if r.delete_seconds is not None]
    deletes_cpu = [r.delete_cpu_seconds for r in results if r.delete_cpu_seconds is not None]
    return dataclasses.replace(
        middle,
        startup_seconds=statistics.median(r.startup_seconds for r in results),
        listed_seconds=statistics.median(r.listed_seconds for r in results),
        create_seconds=statistics.median(r.create_seconds for r in results),
        delete_seconds=statistics.median(deletes) if deletes else None,
        cpu_seconds=statistics.median(r.cpu_seconds for r in results),
        delete_cpu_seconds=statistics.median(deletes_cpu) if deletes_cpu else None,
        peak_rss_mb=statistics.median(r.peak_rss_mb for r in results),
    )


def ratio(value: float | None, reference: Result | None, measure: Callable[[Result], float | None]) -> str:
    base = measure(reference) if reference is not None else None
    if value is None or not base:
        return '—'
    return f'{value / base:.2f}'


def print_table(scenarios: Sequence[Scenario], names: Sequence[str],
                results: dict[tuple[Scenario, str], Result]) -> None:
    """One table: a row per scenario and implementation, with the ratios to Kopf and to the floor."""
    header = ('| operator | latency | N | implementation | create obj/s | delete obj/s | CPU ms/obj (delete) '
              '| peak RSS MB | requests/obj by verb '
              '| start → 1st request / LIST, ms | create vs Kopf / floor '
              '| delete vs Kopf / floor | CPU vs Kopf / floor | RSS vs Kopf / floor |')
    print(header)
    print('|' + '|'.join('---' for _ in range(header.count('|') - 1)) + '|')
    for scenario in scenarios:
        kopf = results.get((scenario, KOPF_NAME))
        floor = results.get((scenario, FLOOR_NAME))
        for name in names:
            r = results.get((scenario, name))
            if r is None:
                continue
            verbs = ', '.join(f'{verb} {n / scenario.objects:.2f}' for verb, n in sorted(r.requests.items())
                              if n / scenario.objects >= 0.01)
            delete_rate = r.delete_rate
            cells = [
                scenario.operator, f'{scenario.latency_ms:g} ms', f'{scenario.objects:,}', name,
                f'{r.create_rate:,.0f}', f'{delete_rate:,.0f}' if delete_rate is not None else '—',
                f'{r.cpu_ms_per_object:.2f}' + (f' ({d:.2f})' if (d := r.delete_cpu_ms_per_object) is not None
                                                else ''),
                f'{r.peak_rss_mb:.1f}', verbs,
                f'{r.startup_seconds * 1000:.0f} / {r.listed_seconds * 1000:.0f}',
            ]
            measures: list[Callable[[Result], float | None]] = [
                lambda x: x.create_rate, lambda x: x.delete_rate,
                lambda x: x.cpu_ms_per_object, lambda x: x.peak_rss_mb]
            for measure_of in measures:
                value = measure_of(r)
                cells.append(f'{ratio(value, kopf, measure_of)} / {ratio(value, floor, measure_of)}')
            print('| ' + ' | '.join(cells) + ' |')


def print_scaling(scenarios: Sequence[Scenario], names: Sequence[str],
                  results: dict[tuple[Scenario, str], Result]) -> None:
    """The objects/s at the largest N relative to the smallest N: a cost that grows with N shows here."""
    counts = sorted({s.objects for s in scenarios})
    if len(counts) < 2:
        return
    lo, hi = counts[0], counts[-1]
    print(f'\nScaling: objects/s at N = {hi:,} relative to N = {lo:,} (create; delete):')
    for operator, latency in dict.fromkeys((s.operator, s.latency_ms) for s in scenarios):
        for name in names:
            small = results.get((Scenario(operator, lo, latency), name))
            large = results.get((Scenario(operator, hi, latency), name))
            if small is None or large is None:
                continue
            cells = [ratio(large.create_rate, small, lambda r: r.create_rate)]
            if large.delete_rate is not None:
                cells.append(ratio(large.delete_rate, small, lambda r: r.delete_rate))
            print(f'  {operator}, {latency:g} ms latency, {name}: {"; ".join(cells)}')


def print_paired_to_ours(scenarios: Sequence[Scenario], names: Sequence[str],
                         by_repeat: dict[tuple[Scenario, str], dict[int, Result]]) -> None:
    """The variants of this project (baseline, metrics on) relative to its run of the same repeat."""
    lines: list[str] = []
    measures: list[tuple[str, Callable[[Result], float | None]]] = [
        ('create/s', lambda r: r.create_rate), ('delete/s', lambda r: r.delete_rate),
        ('CPU/obj', lambda r: r.cpu_ms_per_object), ('CPU/deleted obj', lambda r: r.delete_cpu_ms_per_object)]
    for scenario in scenarios:
        ours = by_repeat.get((scenario, OURS_NAME), {})
        for name in names:
            if name not in (BASELINE_NAME, OURS_METRICS_NAME, OURS_ASYNC_NAME, LEAN_FLOOR_NAME):
                continue
            cells: list[str] = []
            for label, measure_of in measures:
                ratios = [value / reference for repeat, run in by_repeat.get((scenario, name), {}).items()
                          if repeat in ours and (value := measure_of(run)) is not None
                          and (reference := measure_of(ours[repeat]))]
                if ratios:
                    cells.append(f'{label} {median_range(ratios, 3)}')
            if cells:
                lines.append(f'  {scenario.describe()}, {name}: {"; ".join(cells)}')
    if lines:
        print(f"\nRelative to {OURS_NAME}'s run of the same repeat: median (min-max):")
        print('\n'.join(lines))


def print_paired_ratios(scenarios: Sequence[Scenario], names: Sequence[str],
                        by_repeat: dict[tuple[Scenario, str], dict[int, Result]]) -> None:
    """
    The objects/s and the CPU per deleted object of each run relative to the floor's run of the same repeat.

    The machine's speed drifts over minutes (other tenants of a VM, its CPU frequency), and the runs
    of one repeat are the closest in time: their ratios drift less with it than the ratio of the medians.
    """
    lines: list[str] = []
    for scenario in scenarios:
        floor_runs = by_repeat.get((scenario, FLOOR_NAME), {})
        for name in names:
            if name == FLOOR_NAME:
                continue
            runs = by_repeat.get((scenario, name), {})
            cells: list[str] = []
            rates: list[Callable[[Result], float | None]] = [
                lambda r: r.create_rate, lambda r: r.delete_rate, lambda r: r.delete_cpu_ms_per_object]
            for rate_of in rates:
                ratios: list[float] = []
                for repeat, run in runs.items():
                    value = rate_of(run)
                    floor = rate_of(floor_runs[repeat]) if repeat in floor_runs else None
                    if value is not None and floor:
                        ratios.append(value / floor)
                if ratios:
                    cells.append(median_range(ratios))
            if cells:
                lines.append(f'  {scenario.describe()}, {name}: {"; ".join(cells)}')
    if lines:
        print("\nRelative to the floor's run of the same repeat: median (min-max); created/s; deleted/s; "
              "CPU per deleted object (from the DELETE to the end):")
        print('\n'.join(lines))


def make_plot(path: pathlib.Path, scenarios: Sequence[Scenario], names: Sequence[str],
              results: dict[tuple[Scenario, str], Result]) -> None:
    """Objects/s per phase and the peak RSS against N: a row per operator, a line per implementation."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print(f'\nNo plot: matplotlib is not installed in {sys.executable}. It is needed only for the plot '
              f'of this benchmark: `{sys.executable} -m pip install matplotlib`, or pass --no-plot.')
        return
    operators = sorted({s.operator for s in scenarios})
    latencies = sorted({s.latency_ms for s in scenarios})
    panels: list[tuple[str, Callable[[Result], float | None]]] = [
        ('create objects/s', lambda r: r.create_rate),
        ('delete objects/s', lambda r: r.delete_rate),
        ('peak RSS, MB', lambda r: r.peak_rss_mb),
    ]
    figure, axes = plt.subplots(len(operators), len(panels), figsize=(5 * len(panels), 4 * len(operators)),
                                squeeze=False)
    styles = ['-', '--', ':', '-.']
    markers = ['o', 's', '^', 'D']
    for row, operator in enumerate(operators):
        for column, (title, measure_of) in enumerate(panels):
            ax = axes[row][column]
            for index, name in enumerate(names):
                for latency_index, latency in enumerate(latencies):
                    measured = sorted(((s.objects, measure_of(results[(s, name)])) for s in scenarios
                                       if s.operator == operator and s.latency_ms == latency
                                       and (s, name) in results), key=lambda point: point[0])
                    points = [(n, v) for n, v in measured if v is not None]
                    if points:
                        ax.plot([n for n, _ in points], [v for _, v in points],
                                marker=markers[latency_index % len(markers)],
                                color=COLORS.get(name, f'C{index}'),
                                linestyle=styles[latency_index % len(styles)],
                                label=f'{name}, {latency:g} ms latency')
            ax.set_xscale('log')
            counts = sorted({s.objects for s in scenarios})
            ax.set_xticks(counts, [f'{n:,}' for n in counts])
            ax.minorticks_off()
            ax.set_xlabel('objects (N)')
            ax.set_title(f'{operator}: {title}')
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            if ax.has_data():
                ax.legend(fontsize='small')
            else:
                ax.set_visible(False)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    print(f'\nThe plot is saved to {path}')


def count_instructions(implementation: Implementation, operator: str, count: int, timeout: float,
                       status_subresource: bool) -> dict[str, float]:
    """
    The instructions executed by the operator process (under callgrind) per object in each phase.

    The counters are dumped (``callgrind_control --dump``) when the LIST arrives, when all objects
    are handled, and when all are gone; each dump holds the instructions since the previous one
    (all threads), so the start-up (imports, discovery) is not counted in the phases.
    """
    with KubernetesEmulator(history_limit=max(10_000, count * 20)) as emulator, \
            tempfile.TemporaryDirectory() as tmpdir:
        asyncio.run(populate(emulator.url, count, status_subresource=status_subresource))
        output = pathlib.Path(tmpdir) / 'callgrind.out'
        wrapper = ['valgrind', '--tool=callgrind', f'--callgrind-out-file={output}']
        command = implementation.command(operator, ['--server', emulator.url], status_subresource)
        with Operator(implementation.python, operator, emulator.kubeconfig_path,
                      wrapper=wrapper, command=command) as process:
            def dump(what: str) -> None:
                subprocess.run(['callgrind_control', '--dump=' + what, str(process.pid)],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)

            process.wait_until(lambda: emulator.requests.first_at('list') is not None, timeout,
                               'callgrind: the LIST', interval=0.01)
            dump('startup')
            process.wait_until(lambda: all_handled(emulator, count), timeout,
                               f'callgrind: handling {count} objects', interval=1.0)
            time.sleep(QUIET_SECONDS * 4)  # the trailing requests, if any
            dump('create')
            if operator == 'create_delete':
                asyncio.run(delete_all(emulator.url))
                process.wait_until(lambda: not emulator.list_objects('kopfexamples.kopf.dev'), timeout,
                                   f'callgrind: deleting {count} objects', interval=1.0)
                time.sleep(QUIET_SECONDS * 4)
                dump('delete')
        phases: dict[str, float] = {}
        for path in pathlib.Path(tmpdir).glob('callgrind.out.*'):
            text = path.read_text(errors='replace')
            trigger = re.search(r'^desc: Trigger: dump (\w+)', text, re.MULTILINE)
            totals = re.search(r'^totals: (\d+)', text, re.MULTILINE)
            if trigger and totals and trigger.group(1) in ('create', 'delete'):
                phases[trigger.group(1)] = int(totals.group(1)) / count
    if not phases:
        raise RuntimeError('callgrind: no dumps of the phases.')
    return phases


def measure_idle_rss(python: str, operator: str, count: int, timeout: float, settle: float,
                     api: str = EMULATOR) -> float:
    """The operator's RSS once `count` objects are handled and every worker has gone idle."""
    if api == CONTROL_PLANE:
        with ControlPlaneRun() as run:
            run.populate(count)
            with Observer(run) as observer:
                process = start_operator(python, operator, run.kubeconfig_path)
                try:
                    if not wait_until(lambda: len(observer.handled) >= count, timeout, interval=1.0):
                        raise RuntimeError(f'idle: not all {count} objects were handled in {timeout}s.')
                    time.sleep(settle)
                    return read_proc_status(process.pid, 'VmRSS')
                finally:
                    stop_operator(process)
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


def comma_separated(convert: Callable[[str], Any], choices: Sequence[Any] = ()) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        values = [convert(item.strip()) for item in text.split(',') if item.strip()]
        if not values:
            raise argparse.ArgumentTypeError('expected one or more comma-separated values')
        wrong = [value for value in values if choices and value not in choices]
        if wrong:
            raise argparse.ArgumentTypeError(f'unknown {wrong}: choose from {", ".join(map(str, choices))}')
        return values
    return parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--objects', type=comma_separated(int), default=[1000],
                        help='object counts, comma-separated (e.g. 1000,5000,20000; default 1000)')
    parser.add_argument('--operator', type=comma_separated(str, OPERATORS_CHOICES),
                        default=list(OPERATORS_CHOICES),
                        help='create_delete and/or create_only, comma-separated (default: both)')
    parser.add_argument('--api', choices=[EMULATOR, CONTROL_PLANE], default=EMULATOR,
                        help='the API server: the emulator (in this process, the default), or a real etcd + '
                             'kube-apiserver (kopf.testing.KubernetesControlPlane: $KUBEBUILDER_ASSETS)')
    parser.add_argument('--latency', type=comma_separated(float), default=None,
                        help='milliseconds added to every API request by the emulator, comma-separated '
                             '(default: 0,5; the emulator only)')
    add_ours_options(parser)
    parser.add_argument('--kopf-python', default=None, help='a Python with kopf==1.45.2 installed')
    parser.add_argument('--install-kopf', default=None, metavar='DIR',
                        help='make (or reuse) a virtualenv with kopf==1.45.2 in DIR and run Kopf from it')
    parser.add_argument('--no-floor', action='store_true', help='do not run the floor client')
    parser.add_argument('--no-ours', action='store_true', help='do not run this project')
    parser.add_argument('--baseline-python', default=None,
                        help='also run this project from another Python (an older checkout), interleaved')
    parser.add_argument('--async-handlers', action='store_true',
                        help="also this project with the operator's async handlers (no executor's threads)")
    parser.add_argument('--lean-floor', action='store_true',
                        help="also run the lean floor: the floor over the project's own HTTP client & JSON")
    parser.add_argument('--metrics', action='store_true',
                        help='also run this project with its metrics on (kopf run --metrics), interleaved')
    parser.add_argument('--uvloop', action='store_true',
                        help="run every implementation on uvloop's event loop (installed in each Python)")
    parser.add_argument('--floor-python', default=None,
                        help='the Python of the floor client (it needs aiohttp only; default: --ours-python)')
    parser.add_argument('--floor-concurrency', type=int, default=100,
                        help="the floor's objects processed at once (default: 100)")
    parser.add_argument('--plot', type=pathlib.Path, default=None,
                        help=f'where to save the plot (default: {DEFAULT_PLOT.relative_to(HERE.parent)}, '
                             f'or {CONTROL_PLANE_PLOT.relative_to(HERE.parent)} with --api {CONTROL_PLANE})')
    parser.add_argument('--no-plot', action='store_true', help='do not make the plot')
    parser.add_argument('--trace', type=pathlib.Path, default=None, metavar='DIR',
                        help='write every request of the first run of each implementation & scenario to DIR')
    parser.add_argument('--idle', default='1000,10000', help='object counts for idle memory; empty: skip')
    parser.add_argument('--timeout', type=float, default=300.0, help='seconds for any one phase (300)')
    parser.add_argument('--repeat', type=int, default=1, help='runs per implementation (medians are shown)')
    parser.add_argument('--callgrind', action='store_true',
                        help='also count the instructions per object under valgrind (slow, but noise-free)')
    parser.add_argument('--no-status-subresource', action='store_true',
                        help='a CRD without the status subresource (status and metadata in one request)')
    args = parser.parse_args()

    if args.install_kopf and args.kopf_python:
        parser.error('--install-kopf and --kopf-python are mutually exclusive.')
    if args.repeat < 1:
        parser.error(f'--repeat must be at least 1, got {args.repeat}.')
    if args.floor_concurrency < 1:
        parser.error(f'--floor-concurrency must be at least 1, got {args.floor_concurrency}.')
    if any(n < 1 for n in args.objects):
        parser.error(f'--objects must be positive, got {args.objects}.')
    if args.api == CONTROL_PLANE:
        for option, given in [('--latency', args.latency is not None), ('--trace', args.trace is not None),
                              ('--callgrind', args.callgrind)]:
            if given:
                parser.error(f'{option} exists only on the emulator, not with --api {CONTROL_PLANE}.')
        args.latency = [0.0]
    elif args.latency is None:
        args.latency = [0.0, 5.0]
    if any(ms < 0 for ms in args.latency):
        parser.error(f'--latency must not be negative, got {args.latency}.')
    if args.plot is None:
        args.plot = CONTROL_PLANE_PLOT if args.api == CONTROL_PLANE else DEFAULT_PLOT
    kopf_python = install_kopf(pathlib.Path(args.install_kopf)) if args.install_kopf else args.kopf_python
    args.ours_python = ours_python(parser, args)
    implementations: list[Implementation] = []
    if kopf_python:
        implementations.append(Implementation(KOPF_NAME, kopf_python))
    if args.baseline_python:
        implementations.append(Implementation(BASELINE_NAME, args.baseline_python))
    if not args.no_ours:
        implementations.append(Implementation(OURS_NAME, args.ours_python))
        if args.metrics:
            implementations.append(Implementation(OURS_METRICS_NAME, args.ours_python, metrics=True))
        if args.async_handlers:
            implementations.append(Implementation(OURS_ASYNC_NAME, args.ours_python, async_handlers=True))
    if not args.no_floor:
        implementations.append(Implementation(FLOOR_NAME, args.floor_python or args.ours_python, floor=True,
                                              floor_concurrency=args.floor_concurrency))
    if args.lean_floor:
        implementations.append(Implementation(LEAN_FLOOR_NAME, args.ours_python, floor=True, lean=True,
                                              floor_concurrency=args.floor_concurrency))
    if args.uvloop:
        implementations = [dataclasses.replace(i, uvloop=True) for i in implementations]
    if not implementations:
        parser.error('Nothing to run: --no-ours and --no-floor, and no --kopf-python or --install-kopf.')
    names = [i.name for i in implementations]
    status_subresource = not args.no_status_subresource
    scenarios = [Scenario(operator, objects, latency)
                 for operator in args.operator for latency in args.latency for objects in args.objects]

    # The runs of all implementations are interleaved and repeated: the machine's noise (other
    # processes, CPU frequency) then affects them alike, and the medians are less noisy than one run.
    measured: dict[tuple[Scenario, str], list[Result]] = {}
    by_repeat: dict[tuple[Scenario, str], dict[int, Result]] = {}  # for the per-run ratios to the floor
    failures: list[str] = []
    for repeat in range(args.repeat):
        for scenario in scenarios:
            for implementation in run_order(implementations, repeat):  # no one always after the same one
                trace_path = None
                if args.trace is not None and repeat == 0:
                    slug = implementation.name.replace(' ', '-').replace('.', '')
                    trace_path = args.trace / (f'{scenario.operator}-{scenario.objects}-'
                                               f'{scenario.latency_ms:g}ms-{slug}.log')
                print(f'[{repeat + 1}/{args.repeat}] {scenario.describe()}: {implementation.name} ...',
                      end=' ', flush=True)
                try:
                    if args.api == CONTROL_PLANE:
                        result = measure_on_control_plane(implementation, scenario, timeout=args.timeout,
                                                          status_subresource=status_subresource)
                    else:
                        result = measure(implementation, scenario, timeout=args.timeout,
                                         status_subresource=status_subresource, trace_path=trace_path)
                except OperatorFailed as e:
                    print('FAILED')
                    failures.append(f'{scenario.describe()}, {implementation.name}: {e}')
                    continue
                delete = f', delete {result.delete_rate:,.0f}/s' if result.delete_rate is not None else ''
                delete_cpu = result.delete_cpu_ms_per_object
                delete_cpu_text = f' (delete {delete_cpu:.2f})' if delete_cpu is not None else ''
                print(f'create {result.create_rate:,.0f}/s{delete}, '
                      f'CPU {result.cpu_ms_per_object:.2f} ms/obj{delete_cpu_text}, '
                      f'peak RSS {result.peak_rss_mb:.1f} MB, '
                      f'{result.requests.get("watch", 0)} watch requests', flush=True)  # more: re-watches
                measured.setdefault((scenario, implementation.name), []).append(result)
                by_repeat.setdefault((scenario, implementation.name), {})[repeat] = result
    results = {key: median_result(runs) for key, runs in measured.items()}

    crd_kind = 'with' if status_subresource else 'without'
    repeats = f'; medians of {args.repeat} interleaved runs' if args.repeat > 1 else ''
    substrate = 'a real kube-apiserver' if args.api == CONTROL_PLANE else 'the emulator'
    print(f'\nHandling N pre-existing objects on {substrate}, a CRD {crd_kind} the status subresource'
          f'{repeats}:\n')
    print_table(scenarios, names, results)
    print_scaling(scenarios, names, results)
    if args.repeat > 1:
        print('\nObjects/s of all runs (create; delete):')
        for (scenario, name), runs in measured.items():
            creates = ', '.join(f'{r.create_rate:.0f}' for r in sorted(runs, key=lambda r: r.create_rate))
            deletes = ', '.join(f'{r.delete_rate:.0f}' for r in runs if r.delete_rate is not None)
            print(f'  {scenario.describe()}, {name}: {creates}' + (f'; {deletes}' if deletes else ''))
        print_paired_ratios(scenarios, names, by_repeat)
        print_paired_to_ours(scenarios, names, by_repeat)
    for failure in failures:
        print(f'\nFAILED: {failure}')
    if not args.no_plot and results:
        make_plot(args.plot, scenarios, names, results)

    if args.callgrind:
        # Instructions are not affected by the machine's noise: the same run gives about the same count.
        operator, objects = args.operator[0], args.objects[0]
        print(f'\nInstructions per handled object ({operator}, {objects} objects, callgrind, '
              f'all threads; the start-up not counted):\n')
        print('| implementation | create M instr/obj | delete M instr/obj '
              '| create vs floor | delete vs floor |')
        print('|---|---|---|---|---|')
        counted = {implementation.name: count_instructions(implementation, operator, objects,
                                                           args.timeout * 20, status_subresource)
                   for implementation in implementations}
        floor_counts = counted.get(FLOOR_NAME, {})
        phase_names = ('create', 'delete')
        for name, phases in counted.items():
            cells = [f'{phases[phase] / 1e6:.3f}' if phase in phases else '—' for phase in phase_names]
            cells += [f'{phases[phase] / floor_counts[phase]:.2f}'
                      if phase in phases and phase in floor_counts else '—' for phase in phase_names]
            print(f'| {name} | ' + ' | '.join(cells) + ' |')

    counts = [int(c) for c in args.idle.split(',') if c.strip()]
    if len(counts) >= 2:
        settle = 8.0  # longer than settings.queueing.idle_timeout (5s): the workers must exit
        operator = args.operator[0]
        rss = {c: measure_idle_rss(args.ours_python, operator, c, args.timeout, settle, args.api)
               for c in counts}
        lo, hi = min(counts), max(counts)
        per_object_kb = (rss[hi] - rss[lo]) * 1024 / (hi - lo)
        listing = ', '.join(f'{c} objects: {rss[c]:.1f} MB' for c in counts)
        print(f'\nIdle memory of this project ({operator}): {listing}; '
              f'about {per_object_kb:.2f} KB per idle watched object.')
    if failures:
        sys.exit(1)


if __name__ == '__main__':
    main()
