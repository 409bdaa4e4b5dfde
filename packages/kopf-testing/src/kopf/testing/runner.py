"""
:class:`KopfRunner`: an operator running in the background of a test, as ``kopf run`` would run it.

The command runs in-process, in a thread with its own event loop, not in a subprocess: so that the
exceptions (with their tracebacks) reach the test as they are, and so that the test's mocks and
patches apply to the operator too (they do not cross process boundaries).

Stopping is done via the operator's stop flag, never via OS signals: signals go to the main
thread, which runs the test. The runner never hangs the test run: if the operator does not start
or stop within the timeout, its tasks are cancelled, and the test fails with an error that shows
where the operator's thread was stuck.
"""
import abc
import asyncio
import os
import re
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

import click.testing

from kopf._cli.commands import main
from kopf._cli.controls import RunControls
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import _kubeconfigs

if TYPE_CHECKING:
    from kopf.testing.emulator import KubernetesEmulator

# Without an explicit timeout, this is how long the operator may take to start up or to stop.
DEFAULT_TIMEOUT = 60.0

# After the timeout, all the operator's tasks are cancelled; this is how long they may take to exit.
CANCELLATION_GRACE_PERIOD = 5.0

# How often to check whether the operator is ready or has exited (both are set in other threads).
_POLLING_INTERVAL = 0.01


class OperatorStuckError(TimeoutError):
    """The operator has not started up or stopped in time; the message shows where it was stuck."""


class _AbstractKopfRunner(abc.ABC):
    """
    A context manager that runs something in a background thread with its own event loop.

    On entering, the thread starts, and the runner waits until it reports its readiness or exits.
    On exiting, the thread is asked to stop (by :meth:`_request_stop`) and is waited for:
    up to the timeout, then its asyncio tasks are cancelled, then it is abandoned with an error.
    """

    def __init__(self, *, timeout: float | None) -> None:
        super().__init__()
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._finished = threading.Event()
        self._saved_stdio: tuple[TextIO, TextIO, TextIO] | None = None

    @abc.abstractmethod
    def _invoke(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run in the background thread with the given event loop, until stopped."""
        raise NotImplementedError

    @abc.abstractmethod
    def _request_stop(self) -> None:
        """Ask the thread to stop gracefully."""
        raise NotImplementedError

    def _restore_globals(self) -> None:
        """Undo the process-wide changes of the abandoned thread (the stdio streams, etc.)."""
        if self._saved_stdio is not None:
            sys.stdin, sys.stdout, sys.stderr = self._saved_stdio

    def _start_thread(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f'{type(self).__name__} can be entered only once; create a new one.')
        self._saved_stdio = (sys.stdin, sys.stdout, sys.stderr)
        self._thread = threading.Thread(target=self._thread_main, name=f'{type(self).__name__}', daemon=True)
        self._thread.start()

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)  # for the code that looks it up instead of receiving it
        self._loop = loop
        try:
            self._invoke(loop)
        finally:
            try:
                if not loop.is_closed():
                    _finalize_loop(loop)
            finally:
                asyncio.set_event_loop(None)
                self._finished.set()

    def _wait_until_ready(self) -> bool:
        """Wait until the thread is ready or has exited; False if neither happens in time."""
        deadline = time.monotonic() + self.timeout
        while not self._ready.wait(_POLLING_INTERVAL):
            if self._finished.is_set():
                return True
            if time.monotonic() >= deadline:
                return False
        return True

    def _stop_thread(self, *, reason: str) -> None:
        """Stop the thread gracefully, or forcedly after the timeout; raise if it was not graceful."""
        self._request_stop()
        if self._finished.wait(self.timeout):
            return

        # Too late: remember where it hangs (that is what the developer needs), then cancel everything.
        stack = self._describe_thread()
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(_cancel_all_tasks, loop)
            except RuntimeError:  # the loop is closed already: the thread hangs outside of it
                pass
        cancelled = self._finished.wait(min(CANCELLATION_GRACE_PERIOD, max(self.timeout, 1.0)))
        if not cancelled:
            self._restore_globals()
        outcome = (
            'Its tasks were cancelled, and it has exited.' if cancelled else
            'Cancelling its tasks did not help either: the thread is abandoned and keeps running.'
        )
        raise OperatorStuckError(
            f'The operator {reason} within {self.timeout} seconds. {outcome}\n'
            f'It was stuck here:\n{stack}'
        )

    def _describe_thread(self) -> str:
        """The stack of the thread and of its asyncio tasks, as text, for the failure message."""
        thread = self._thread
        frame = sys._current_frames().get(thread.ident) if thread is not None and thread.ident else None
        lines = ['Thread stack (most recent call last):\n']
        lines.extend(traceback.format_stack(frame) if frame is not None else ['  (no stack: not running)\n'])
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                tasks = list(asyncio.all_tasks(loop))
            except RuntimeError:  # changed while being iterated by another thread: skip the details
                tasks = []
            for task in tasks:
                try:
                    lines.append(_describe_task(task))
                except Exception:  # the task is changing in its thread; the details are optional
                    lines.append(f'{task!r}\n')
        return ''.join(lines)


class KopfRunner(_AbstractKopfRunner):
    """
    Run an operator in the background of a test, as a context manager; see the docs' "Testing".

    The positional arguments and the extra keyword arguments are those of click's
    :meth:`click.testing.CliRunner.invoke` (without the command itself), starting with the
    command-line arguments, e.g. ``['run', '-A', '--verbose', 'handlers.py']``.

    On entering the ``with`` block, the operator starts in a background thread; the block begins
    once the operator is ready (its startup handlers have finished), or has exited. On exiting
    the block, the operator is stopped via its stop flag and waited for; its results are then
    available: :attr:`exit_code`, :attr:`exception`, :attr:`output`, :attr:`stdout`,
    :attr:`stderr`. Note that, as with click's test runner, the standard streams are replaced for
    the whole process while the operator runs: the test's own prints are captured too.

    :param reraise: re-raise the operator's exception (if any) when exiting the block, or when
        entering if the operator has exited already. A command that fails on its own (e.g. a file
        that cannot be loaded) raises the original error behind the short message it prints;
        the misuse of the command line raises ``SystemExit`` with its exit code.
    :param timeout: how long (in seconds) the operator may take to get ready, and to stop.
        Beyond that, its tasks are cancelled and :class:`OperatorStuckError` is raised with the
        stack of the operator's thread. ``None`` means :data:`DEFAULT_TIMEOUT`: there is always
        a limit, so that a stuck operator fails the test instead of hanging the test run.
    :param registry: the registry with the handlers; the files and modules loaded by
        ``kopf run`` register their handlers into it (it is the default registry while they
        load). Without it, the global default registry is used and kept: since the files are
        executed anew on every run, several runs with the same files in one process accumulate
        their handlers there; a fresh ``kopf.OperatorRegistry()`` per run avoids that.
        (Modules given with ``-m`` are imported only once per process, as usual in Python.)
    :param settings: the operator's settings (``kopf.OperatorSettings``) to start with.
    :param emulator: run the operator against a Kubernetes API emulator instead of the cluster
        of the environment: ``True`` starts a fresh :class:`kopf.testing.KubernetesEmulator`
        for the duration of the block (see :attr:`emulator`); an already running emulator
        (e.g. the ``k8s_emulator`` fixture) is used as it is. ``KUBECONFIG`` points to it while
        the operator runs (for the whole process, so the test's own API clients use it too).

    Example::

        def test_operator():
            with KopfRunner(['run', '-A', '--verbose', 'handlers.py'], emulator=True) as runner:
                ...  # create & check objects, e.g. via runner.emulator or kubectl
            assert runner.exit_code == 0
            assert runner.exception is None
            assert 'Handler succeeded' in runner.output
    """

    def __init__(
            self,
            *args: Any,
            reraise: bool = True,
            timeout: float | None = None,
            registry: OperatorRegistry | None = None,
            settings: OperatorSettings | None = None,
            emulator: 'bool | KubernetesEmulator' = False,
            **kwargs: Any,
    ) -> None:
        super().__init__(timeout=timeout)
        if 'obj' in kwargs:
            raise TypeError('KopfRunner uses the click context object itself; "obj" cannot be passed.')
        self.reraise = reraise
        self._args = args
        self._kwargs = kwargs
        self._emulator_option = emulator
        self._emulator: KubernetesEmulator | None = None
        self._owns_emulator = False
        self._saved_environ: dict[str, str | None] = {}
        self._restore_libraries: Callable[[], None] | None = None
        self._stop_flag = threading.Event()
        self._controls = RunControls(
            registry=registry,
            settings=settings,
            stop_flag=self._stop_flag,
            ready_flag=self._ready,
        )
        self._result: click.testing.Result | None = None
        self._crash: BaseException | None = None  # escaped click's runner (catch_exceptions=False)

    def __enter__(self) -> 'KopfRunner':
        self._start_emulator()
        try:
            self._start_thread()
            if not self._wait_until_ready():
                stack = self._describe_thread()
                self._stop_thread(reason='did not get ready, and then did not stop,')
                output = self._output_or_crash()
                last_error = _last_error(output)
                failing = f'; its last error: {last_error}' if last_error else '.'
                raise OperatorStuckError(
                    f'The operator did not get ready within {self.timeout} seconds, '
                    f'and was stopped{failing}\n'
                    f'It was waiting here:\n{stack}\nIts output:\n{output}'
                )
        except BaseException:
            self._stop_emulator()
            raise
        if self._finished.is_set():  # exited before the block: no need to wait for the block to end
            self._stop_emulator()
            if self.reraise and self.exception is not None:
                raise self.exception
        return self

    def __exit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            traceback: types.TracebackType | None,
    ) -> None:
        try:
            self._stop_thread(reason='did not stop')
        finally:
            self._stop_emulator()
        # The block's own failure is more relevant to the test: do not replace it.
        if exc is None and self.reraise and self.exception is not None:
            raise self.exception

    #
    # The results, once the operator has exited.
    #

    @property
    def emulator(self) -> 'KubernetesEmulator':
        """The Kubernetes API emulator that the operator talks to (if asked for by ``emulator=``)."""
        if self._emulator is None:
            raise RuntimeError('This runner uses no emulator: pass emulator=True or an emulator to use one.')
        return self._emulator

    @property
    def finished(self) -> bool:
        """Whether the operator has exited (on its own, or when stopped)."""
        return self._finished.is_set()

    @property
    def result(self) -> click.testing.Result:
        """The raw result of click's test runner."""
        if not self._finished.is_set():
            raise RuntimeError('The operator is still running: its results are available after it exits.')
        if self._result is None:
            raise RuntimeError('The operator has crashed outside of the command; see .exception.')
        return self._result

    @property
    def exit_code(self) -> int:
        """The exit code of the command: 0 on success, 1 on failures, 2 on the command line misuse."""
        if self._crash is not None and self._finished.is_set():
            return 1
        return self.result.exit_code

    @property
    def exception(self) -> BaseException | None:
        """
        The error that made the command fail, or None if it succeeded.

        When the command has reported a failure as a short message (e.g. a file that cannot be
        loaded), this is the original error behind it, not the ``SystemExit`` of the command.
        """
        if self._crash is not None and self._finished.is_set():
            return self._crash
        result = self.result
        if isinstance(result.exception, SystemExit) and self._controls.failure is not None:
            return self._controls.failure
        return result.exception

    @property
    def exc_info(self) -> tuple[type[BaseException], BaseException, types.TracebackType | None] | None:
        """The error of :attr:`exception` as a ``sys.exc_info()``-like triplet, or None."""
        exception = self.exception
        if exception is None:
            return None
        return type(exception), exception, exception.__traceback__

    def _output_or_crash(self) -> str:
        return self.output if self._crash is None else repr(self._crash)

    @property
    def output(self) -> str:
        """Everything the command has printed, logs included: stdout & stderr interleaved."""
        return self.result.output if self._crash is None else ''

    @property
    def stdout(self) -> str:
        """What the command has printed to stdout."""
        return self.result.stdout if self._crash is None else ''

    @property
    def stderr(self) -> str:
        """What the command has printed to stderr; the logs go here."""
        return self.result.stderr if self._crash is None else ''

    #
    # The machinery.
    #

    def _invoke(self, loop: asyncio.AbstractEventLoop) -> None:
        self._controls.loop = loop
        try:
            runner = click.testing.CliRunner()
            self._result = runner.invoke(main, *self._args, obj=self._controls, **self._kwargs)
        except BaseException as e:
            self._crash = e

    def _request_stop(self) -> None:
        self._stop_flag.set()

    def _restore_globals(self) -> None:
        super()._restore_globals()
        for name, value in self._saved_environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def _start_emulator(self) -> None:
        option = self._emulator_option
        if option is False:
            emulator = None
        elif option is True:
            from kopf.testing.emulator import KubernetesEmulator
            emulator = KubernetesEmulator()
            emulator.start_in_thread()
            self._owns_emulator = True
        else:
            emulator = option
        self._emulator = emulator

        # Whatever the command's environment changes, it must be restorable if the thread is abandoned.
        user_env: Mapping[str, str | None] = self._kwargs.get('env') or {}
        env: dict[str, str | None] = {}
        if emulator is not None:
            env['KUBECONFIG'] = str(emulator.kubeconfig_path)
        env.update(user_env)  # the user's explicit choice wins
        if env:
            self._kwargs['env'] = env
        self._saved_environ = {name: os.environ.get(name) for name in env}
        kubeconfig = env.get('KUBECONFIG')
        if kubeconfig is not None:  # the client libraries imported before the runner read the old one
            self._restore_libraries = _kubeconfigs.point_client_libraries(kubeconfig)

    def _stop_emulator(self) -> None:
        if self._restore_libraries is not None:
            self._restore_libraries()
            self._restore_libraries = None
        if self._owns_emulator and self._emulator is not None:
            self._owns_emulator = False
            self._emulator.stop_thread()


# The log lines of errors in the text formats ("... [ERROR   ] message"), and the CLI's own ("Error: ...").
_ERROR_LINE = re.compile(r'\[(?:ERROR|CRITICAL)\s*\]\s*(?P<message>.*\S)|^Error: (?P<cli>.*\S)')


def _last_error(output: str) -> str | None:
    """The last error that the operator logged or printed (what it was failing at), if any."""
    for line in reversed(output.splitlines()):
        match = _ERROR_LINE.search(line)
        if match:
            return match.group('message') or match.group('cli')
    return None


def _cancel_all_tasks(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


def _finalize_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Close the loop as ``asyncio.run()`` would: with the leftover tasks cancelled and awaited."""
    tasks = asyncio.all_tasks(loop)
    _cancel_all_tasks(loop)
    if tasks:
        loop.run_until_complete(asyncio.wait(tasks, timeout=CANCELLATION_GRACE_PERIOD))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


def _describe_task(task: asyncio.Task[Any]) -> str:
    """
    The full chain of awaits of a task, down to where it is suspended.

    ``Task.get_stack()`` shows only the outermost coroutine of a suspended task, which is rarely
    the place where it hangs; the awaited coroutines are followed here instead.
    """
    frames: list[types.FrameType] = []
    awaitable: Any = task.get_coro()
    while awaitable is not None and len(frames) < 100:
        frame = getattr(awaitable, 'cr_frame', None) or getattr(awaitable, 'gi_frame', None)
        if frame is not None:
            frames.append(frame)
        awaitable = getattr(awaitable, 'cr_await', None) or getattr(awaitable, 'gi_yieldfrom', None)
    summary = traceback.StackSummary.extract((frame, frame.f_lineno) for frame in frames)
    return f'Task {task.get_name()!r} (awaits, outermost first):\n{"".join(summary.format())}'
