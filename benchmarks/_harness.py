"""
What the operator benchmarks share: the CRD, filling the emulator, the operator's subprocess, /proc readings.

The emulator runs in the benchmark's process (its own thread), each operator in a subprocess
(``operators/runner.py OPERATOR_FILE``, i.e. ``kopf.run()``) with a kubeconfig to the emulator,
so that the same operator file runs under this project and under Kopf 1.45.2 alike.

Every Python that runs an operator gets the bytecode of its ``kopf`` package compiled first, once per
benchmark (:func:`ensure_bytecode`), as ``pip install`` does for the installed packages: otherwise, with
``PYTHONDONTWRITEBYTECODE`` set (as on the project's machines) or in a fresh checkout, this project's
editable sources would be compiled anew at every start (~0.4 s on a 2-core VM), and Kopf 1.45.2's and
aiohttp's, installed by pip, would not.
"""
import argparse
import asyncio
import copy
import dataclasses
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import aiohttp

T = TypeVar('T')
HERE = pathlib.Path(__file__).resolve().parent
OPERATORS = HERE / 'operators'
KOPF_REQUIREMENT = 'kopf==1.45.2'
KOPF_NAME = 'Kopf 1.45.2'
OURS_NAME = 'this project'
BASELINE_NAME = f'{OURS_NAME}, baseline'  # another version of this project, for before/after comparisons

CRD: dict[str, Any] = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': 'kopfexamples.kopf.dev'},
    'spec': {
        'group': 'kopf.dev',
        'scope': 'Namespaced',
        'names': {'kind': 'KopfExample', 'plural': 'kopfexamples', 'singular': 'kopfexample',
                  'shortNames': ['kex']},
        'versions': [{
            'name': 'v1', 'served': True, 'storage': True,
            'subresources': {'status': {}},
            'schema': {'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}},
        }],
    },
}


class RequestLog:
    """
    What the emulator's counters do not tell: when the objects were first listed; optionally,
    every request as text (``--trace``). It wraps the emulator's request handler (a private
    attribute: the emulator has no public hook for it), which costs the same for every implementation.
    """

    def __init__(self, *, trace: bool, collection: str) -> None:
        self.collection = collection  # the path of the objects' collection, whose first LIST is timed
        self.listed_at: float | None = None
        self.lines: list[str] | None = [] if trace else None

    def wrap(self, handler: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        async def logged(request: Any) -> Any:
            if self.listed_at is None and request.method == 'GET' and request.path == self.collection \
                    and 'watch' not in request.query:
                self.listed_at = time.monotonic()
            if self.lines is not None:
                body = (await request.read()).decode(errors='replace') if request.can_read_body else ''
                line = f'{time.monotonic():.6f} {request.method} {request.path_qs} {body}'
                self.lines.append(line.rstrip())
            return await handler(request)
        return logged

    def reset(self) -> None:
        self.listed_at = None
        if self.lines is not None:
            self.lines.clear()


def make_crd(plural: str, kind: str, *, status_subresource: bool = True) -> dict[str, Any]:
    """A namespaced CRD of the group ``kopf.dev`` (version v1), like the standard one, with another name."""
    crd = copy.deepcopy(CRD)
    crd['metadata']['name'] = f'{plural}.kopf.dev'
    crd['spec']['names'] = {'kind': kind, 'plural': plural, 'singular': plural.rstrip('s')}
    if not status_subresource:
        del crd['spec']['versions'][0]['subresources']
    return crd


async def create_crd(session: aiohttp.ClientSession, crd: Mapping[str, Any]) -> None:
    async with session.post('/apis/apiextensions.k8s.io/v1/customresourcedefinitions', json=crd) as r:
        r.raise_for_status()


async def create_objects(session: aiohttp.ClientSession, plural: str, bodies: Sequence[Mapping[str, Any]],
                         *, namespace: str = 'default', concurrency: int = 50) -> None:
    """Create objects of ``kopf.dev/v1`` concurrently (but bounded): ~3,000/s on one core."""
    semaphore = asyncio.Semaphore(concurrency)
    url = f'/apis/kopf.dev/v1/namespaces/{namespace}/{plural}'

    async def create(body: Mapping[str, Any]) -> None:
        async with semaphore, session.post(url, json=body) as r:
            r.raise_for_status()

    await asyncio.gather(*(create(body) for body in bodies))


def example_bodies(count: int, *, size: int = 0) -> list[dict[str, Any]]:
    """
    The standard objects; with ``size``, their spec has ~that many bytes of JSON more, in small fields.

    Real objects are bigger than the benchmarks' usual ones (their managed fields alone take a KB or a few):
    as many small fields as it takes (a list of items of ~60 bytes each), as the parsers see in real objects.
    """
    items = [{'name': f'item-{j}', 'value': j, 'enabled': True, 'note': 'padding'} for j in range(size // 60)]
    return [{'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': f'kex-{i}'},
             'spec': {'field': f'value-{i}', **({'items': items} if items else {})}}
            for i in range(count)]


async def populate(url: str, count: int, *, status_subresource: bool = True, size: int = 0) -> None:
    """Create the standard CRD (``kopfexamples``) and ``count`` objects of it (``kex-0``, ``kex-1``, ...)."""
    crd = copy.deepcopy(CRD)
    if not status_subresource:
        del crd['spec']['versions'][0]['subresources']
    async with aiohttp.ClientSession(base_url=url) as session:
        await create_crd(session, crd)
        await create_objects(session, 'kopfexamples', example_bodies(count, size=size))


def read_proc_status(pid: int, field: str) -> float:
    """A memory field of /proc/PID/status (e.g. VmHWM, VmRSS), in megabytes."""
    for line in pathlib.Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith(field + ':'):
            return int(line.split()[1]) / 1024
    return 0.0


def read_cpu_seconds(pid: int) -> float:
    """The user+system CPU time of a process so far (/proc/PID/stat, fields 14 and 15)."""
    fields = pathlib.Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def median_range(ratios: Sequence[float], digits: int = 2) -> str:
    """The paired ratios (of the runs made in the same repeat) as "median (min-max)"."""
    return f'{statistics.median(ratios):.{digits}f} ({min(ratios):.{digits}f}-{max(ratios):.{digits}f})'


def run_order(items: Sequence[T], repeat: int) -> list[T]:
    """
    The order of the implementations' runs in a repeat: a Williams design (balanced for the run before).

    A plain rotation keeps the neighbours: each implementation always runs right after the same one (e.g.
    after Kopf's heavy run, which leaves the CPU's caches and frequency in its own state), a bias of its own
    (see ``benchmarks/README.md``). In these orders, each implementation
    runs right after every other one equally often over ``len(items)`` repeats (an even number of them; an
    odd number needs twice as many repeats), and first equally often.
    """
    n = len(items)
    first = [0]
    for step in range(1, n):  # 0, 1, n-1, 2, n-2, ...
        first.append((step + 1) // 2 if step % 2 else n - step // 2)
    rows = [[(index + shift) % n for index in first] for shift in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return [items[index] for index in rows[repeat % len(rows)]]


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


class OperatorFailed(RuntimeError):
    """The operator did not do what the benchmark waited for; the message has the tail of its log."""


class Operator:
    """
    An operator file run in a subprocess by ``operators/runner.py``; a context manager.

    Its output goes to a temporary log file (not to a pipe, which could fill up and block it),
    so that a failure can show why. On exit, it is stopped by SIGINT (a graceful stop), and
    killed if it does not exit in time: no process is left behind, whatever happens.
    """

    def __init__(self, python: str, operator: str, kubeconfig: pathlib.Path, *,
                 env: Mapping[str, str] | None = None, wrapper: Sequence[str] = (),
                 keep_log: bool = False, command: Sequence[str] | None = None) -> None:
        self.python = python
        self.operator = operator
        self.command = list(command) if command is not None else None  # instead of runner.py
        self.kubeconfig = kubeconfig
        self.env = dict(env or {})
        self.wrapper = list(wrapper)
        self.keep_log = keep_log
        descriptor, path = tempfile.mkstemp(prefix=f'bench-{operator}-', suffix='.log')
        os.close(descriptor)
        self.log_path = pathlib.Path(path)
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # time.monotonic() right before the process was spawned

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError('The operator is not started.')
        return self.process.pid

    def __enter__(self) -> 'Operator':
        ensure_bytecode(self.python)
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), **self.env)
        command = [*self.wrapper, *(self.command or [
            self.python, str(OPERATORS / 'runner.py'), str(OPERATORS / f'{self.operator}.py')])]
        self.started_at = time.monotonic()
        with self.log_path.open('wb') as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
        if not self.keep_log:
            self.log_path.unlink(missing_ok=True)

    def stop(self, timeout: float = 30.0) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def check_alive(self, what: str) -> None:
        """Fail at once (not at the timeout) if the operator has exited."""
        if self.process is not None and self.process.poll() is not None:
            self.fail(f'{what}: the operator exited with {self.process.returncode}')

    def wait_until(self, predicate: Callable[[], Any], timeout: float, what: str,
                   interval: float = 0.2) -> None:
        """Wait for a condition, or fail if the operator exits or the time is out."""
        deadline = time.monotonic() + timeout
        while not predicate():
            self.check_alive(what)
            if time.monotonic() >= deadline:
                self.fail(f'{what}: not done in {timeout:.0f}s')
            time.sleep(interval)

    def fail(self, message: str) -> None:
        raise OperatorFailed(f'{message}. The tail of its log:\n{self.log_tail()}')

    def log_tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors='replace')
        return '\n'.join('    ' + line for line in text.splitlines()[-lines:]) or '    (empty)'

    def cpu_seconds(self) -> float:
        return read_cpu_seconds(self.pid)

    def rss_mb(self) -> float:
        return read_proc_status(self.pid, 'VmRSS')

    def peak_rss_mb(self) -> float:
        return read_proc_status(self.pid, 'VmHWM')


_compiled: set[str] = set()  # the Pythons whose kopf package is compiled in this benchmark


def ensure_bytecode(python: str) -> None:
    """
    Compile the ``kopf`` package of this Python to bytecode (``__pycache__``), once per benchmark.

    The installed packages (Kopf 1.45.2, aiohttp) have it from pip; this compiles the editable sources too,
    so that no implementation's start-up includes compiling its own sources. Any Python works: with no
    ``kopf`` importable (e.g. a bare floor's venv), nothing is done.
    """
    if python in _compiled:
        return
    _compiled.add(python)
    # The package's path is complete only once imported: its distributions extend it (one dir per each).
    script = ('import compileall, sys\n'
              'try:\n'
              '    import kopf\n'
              'except ImportError:\n'
              '    sys.exit(0)\n'
              'sys.exit(0 if all(compileall.compile_dir(p, quiet=1) for p in kopf.__path__) else 1)\n')
    env = {key: value for key, value in os.environ.items() if key != 'PYTHONDONTWRITEBYTECODE'}
    result = subprocess.run([python, '-c', script], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f'Compiling the kopf package of {python} failed:\n{result.stdout}{result.stderr}')


def start_operator(python: str, operator: str, kubeconfig: pathlib.Path,
                   wrapper: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """The bare operator process (its output discarded); stop it with :func:`stop_operator`."""
    ensure_bytecode(python)
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    return subprocess.Popen(
        [*wrapper, python, str(OPERATORS / 'runner.py'), str(OPERATORS / f'{operator}.py')],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def stop_operator(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def install_kopf(directory: pathlib.Path) -> str:
    """A virtualenv with Kopf 1.45.2 from the package index, made once; its Python's path."""
    python = directory / 'bin' / 'python'
    check = [str(python), '-c', 'import importlib.metadata as m; assert m.version("kopf") == "1.45.2"']
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(python)
    print(f'Installing {KOPF_REQUIREMENT} into {directory} ...', flush=True)
    subprocess.run([sys.executable, '-m', 'venv', str(directory)], check=True)
    subprocess.run([str(python), '-m', 'pip', 'install', '--quiet', KOPF_REQUIREMENT], check=True)
    subprocess.run(check, check=True)
    return str(python)


# This project's distributions with their extras, as a user installs them (some benchmarks serve the metrics).
OURS_PACKAGES = {'kopf-clients': '', 'kopf-core': '[metrics]', 'kopf-cli': '', 'kopf-testing': '',
                 'kopf-webhooks': ''}


def install_ours(directory: pathlib.Path) -> str:
    """
    A virtualenv with this project installed from the working tree as a user installs it; its Python's path.

    Wheels with their bytecode, no editable paths, and none of the optional client libraries of the
    development environment (``kubernetes``, ``pykube-ng``: the default login imports them if installed,
    ~0.4-0.6 s at every start, which Kopf 1.45.2's virtualenv does not have either); with aiohttp and
    uvloop for the floors and ``--uvloop``. The virtualenv and the dependencies are installed once;
    this project's distributions every time (the sources change between the runs).
    """
    python = directory / 'bin' / 'python'
    if not python.exists():
        subprocess.run([sys.executable, '-m', 'venv', str(directory)], check=True)
    specs = [f'{HERE.parent / "packages" / name}{extras}' for name, extras in OURS_PACKAGES.items()]
    print(f'Installing this project into {directory} ...', flush=True)
    pip = [str(python), '-m', 'pip', 'install', '--quiet']
    subprocess.run([*pip, *specs, 'aiohttp', 'uvloop'], check=True)
    subprocess.run([*pip, '--force-reinstall', '--no-deps', *specs], check=True)
    return str(python)


def add_ours_options(parser: argparse.ArgumentParser) -> None:
    """``--ours-python`` or ``--install-ours``: the Python of this project (see :func:`ours_python`)."""
    parser.add_argument('--ours-python', default=None,
                        help='the Python of this project (default: this interpreter)')
    parser.add_argument('--install-ours', default=None, metavar='DIR',
                        help='make (or reuse) a virtualenv in DIR with this project installed from the '
                             'working tree (as a user installs it) and run this project (and the lean floor) '
                             'from it')


def ours_python(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The Python of this project: ``--install-ours DIR``'s, ``--ours-python``, or the running one."""
    if args.install_ours and args.ours_python:
        parser.error('--install-ours and --ours-python are mutually exclusive.')
    if args.install_ours:
        return install_ours(pathlib.Path(args.install_ours))
    return str(args.ours_python or sys.executable)


def add_implementation_options(parser: argparse.ArgumentParser) -> None:
    add_ours_options(parser)
    parser.add_argument('--kopf-python', default=None, help='a Python with kopf==1.45.2 installed')
    parser.add_argument('--install-kopf', default=None, metavar='DIR',
                        help='make (or reuse) a virtualenv with kopf==1.45.2 in DIR and run Kopf from it')
    parser.add_argument('--baseline-python', default=None,
                        help='a Python with another version of this project (e.g. the previous commit\'s, '
                             'installed by install_ours()), run interleaved as "this project, baseline"')


@dataclasses.dataclass(frozen=True)
class Implementation:
    name: str
    python: str


def implementations(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Implementation]:
    """This project, Kopf 1.45.2 if given (``--kopf-python``) or to be installed, and a baseline of ours."""
    if args.install_kopf and args.kopf_python:
        parser.error('--install-kopf and --kopf-python are mutually exclusive.')
    kopf_python = install_kopf(pathlib.Path(args.install_kopf)) if args.install_kopf else args.kopf_python
    args.ours_python = ours_python(parser, args)
    result = [Implementation(OURS_NAME, args.ours_python)]
    if kopf_python:
        result.append(Implementation(KOPF_NAME, kopf_python))
    if args.baseline_python:
        result.append(Implementation(BASELINE_NAME, args.baseline_python))
    return result
