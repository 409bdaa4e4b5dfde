"""
The control plane's processes: started with their output in log files, stopped by SIGTERM, then SIGKILL.

Each process is the leader of a session of its own: a Ctrl+C in the terminal reaches only the
Python process, which then stops the control plane in order (kube-apiserver before etcd), and
the signals reach whatever the binary started itself (a wrapper script's children, too).

Being in sessions of their own, they would outlive their owner if it is killed (SIGKILL, e.g. by a
CI's timeout) or crashes: a :class:`Reaper` (``_reaper.py``, a watchdog process that holds the read end
of a pipe from its owner) stops them and removes the owner's temporary directory then.
"""

import collections
import logging
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence

__all__ = ['ManagedProcess', 'Reaper', 'read_log_tail']

logger = logging.getLogger('kopf.testing.apiserver')

TAIL_LINES = 10
_TAIL_BYTES = 64 * 1024
_MAX_LINE_LENGTH = 500
REDACTED = '<redacted>'


class ManagedProcess:
    """One binary of the control plane, its log file, and its stopping."""

    def __init__(
            self,
            name: str,
            command: Sequence[str],
            *,
            log_path: pathlib.Path,
            cwd: pathlib.Path,
            env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.log_path = log_path
        self._cwd = cwd
        self._env = dict(env) if env is not None else None
        self._popen: subprocess.Popen[bytes] | None = None
        self._stopped = False  # once stopped, its pid (and group id) may belong to another process
        self._log_offset = 0  # where its own output starts in the log (after an earlier process's)

    def start(self) -> None:
        with open(self.log_path, 'ab') as log:
            self._log_offset = log.tell()
            self._popen = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._cwd,
                env=self._env,
                start_new_session=True,
                close_fds=True,
            )

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def exit_code(self) -> int | None:
        """The exit code once it exited (negative: the signal that ended it), else ``None``."""
        return self._popen.poll() if self._popen is not None else None

    def stop(self, timeout: float) -> None:
        """SIGTERM, then SIGKILL if it is still alive after ``timeout`` seconds; wait for its exit."""
        popen = self._popen
        if popen is None or self._stopped:
            return
        try:
            if popen.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            # Also on an interruption while waiting (a second Ctrl+C): nothing is left running.
            if popen.poll() is None:
                self._signal(signal.SIGKILL)
                popen.wait()
            self._signal(signal.SIGKILL)  # whatever is left of its session (e.g. a wrapper's children)
            self._stopped = True

    def kill(self) -> None:
        """SIGKILL at once, and wait (for the last resort at the interpreter's exit)."""
        popen = self._popen
        if popen is not None and not self._stopped:
            self._signal(signal.SIGKILL)
            popen.wait()
            self._stopped = True

    def tail(self, lines: int = TAIL_LINES, *, redact: Iterable[str] = ()) -> list[str]:
        """The last lines of this process's own output (not of an earlier one's in the same log file)."""
        return read_log_tail(self.log_path, lines, redact=redact, offset=self._log_offset)

    def _signal(self, signum: int) -> None:
        popen = self._popen
        if popen is None or self._stopped:
            return
        try:
            os.killpg(popen.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


class Reaper:
    """
    A watchdog process: if this process exits without stopping the watched process groups, it kills them.

    It reads its orders from a pipe (see ``_reaper.py``); the pipe's end here is closed on ``exec()``,
    so that no other subprocess holds it: the reaper sees its end when this process exits in any way.
    (A child forked from this process without an ``exec()``, e.g. by ``multiprocessing``'s "fork" method,
    holds that end too: the reaper then acts only once that child has exited as well.)
    """

    def __init__(self, temporary_dir: pathlib.Path | None = None) -> None:
        self._temporary_dir = temporary_dir
        self._popen: subprocess.Popen[bytes] | None = None
        self._watched: set[int] = set()  # told to the reaper, not untold yet

    def start(self) -> None:
        if not sys.executable:  # an embedded interpreter: no Python to run it (the processes are unguarded)
            logger.debug('No Python executable for the control plane\'s reaper: not started.')
            return
        script = pathlib.Path(__file__).with_name('_reaper.py')
        self._popen = subprocess.Popen(
            [sys.executable, '-I', '-S', str(script),
             *([str(self._temporary_dir)] if self._temporary_dir is not None else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not stopped by a Ctrl+C in the terminal before its owner stops it all
            close_fds=True,
        )

    def watch(self, process: ManagedProcess) -> None:
        if process.pid is not None and process.pid not in self._watched:
            self._watched.add(process.pid)
            self._send(f'+{process.pid}\n')

    def unwatch(self, process: ManagedProcess) -> None:
        """Forget a stopped process (once; again for the same one: nothing to do)."""
        if process.pid is not None and process.pid in self._watched:
            self._watched.discard(process.pid)
            self._send(f'-{process.pid}\n')

    def close(self) -> None:
        """Let it exit with nothing done (everything is stopped by its owner), and wait for that."""
        popen, self._popen = self._popen, None
        if popen is None:
            return
        try:
            if popen.stdin is not None:
                popen.stdin.write(b'q\n')
                popen.stdin.close()
        except OSError:  # it has died itself: nothing to tell it
            pass
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()

    def _send(self, order: str) -> None:
        popen = self._popen
        if popen is None or popen.stdin is None:
            return
        try:
            popen.stdin.write(order.encode())
            popen.stdin.flush()
        except OSError as e:  # it has died itself (killed by someone): the processes are stopped as before
            logger.warning('The control plane\'s reaper has exited unexpectedly: %s', e)


def read_log_tail(
        path: pathlib.Path, lines: int = TAIL_LINES, *, redact: Iterable[str] = (), offset: int = 0,
) -> list[str]:
    """The last non-empty lines of a log file after an offset (shortened if very long), secrets replaced."""
    try:
        with open(path, 'rb') as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(offset, size - _TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    secrets = [secret for secret in redact if secret]
    result: collections.deque[str] = collections.deque(maxlen=lines)
    for raw_line in data.decode('utf-8', errors='replace').splitlines():
        line = raw_line.rstrip()
        if not line:
            continue
        for secret in secrets:
            line = line.replace(secret, REDACTED)
        if len(line) > _MAX_LINE_LENGTH:
            line = line[:_MAX_LINE_LENGTH] + '…'
        result.append(line)
    return list(result)
