"""
Fixtures of the CLI tests.

The command configures the process-wide logging and imports the operator's sources (which
changes ``sys.path`` and ``sys.modules``): all of this is restored after every test. The operators
run in-process via ``KopfRunner`` against the emulator, so the options are observed by their
effects: the logs' format, the API requests, the settings seen by the handlers.
The helpers are fixtures, since the test modules cannot import each other (importlib mode).
"""
import json
import os
import pathlib
import re
import subprocess
import threading
from typing import Any

import pytest

from kopf.testing.emulator import KubernetesEmulator

WAIT_TIMEOUT = 10.0


@pytest.fixture()
def no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """No credentials anywhere: no kubeconfig, not in a cluster."""
    monkeypatch.setenv('KUBECONFIG', str(tmp_path / 'absent-kubeconfig'))
    monkeypatch.delenv('KUBERNETES_SERVICE_HOST', raising=False)
    monkeypatch.delenv('KUBERNETES_SERVICE_PORT', raising=False)


@pytest.fixture()
def unreachable_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """Credentials for a cluster that does not listen (port 1 is never served for us)."""
    path = tmp_path / 'unreachable-kubeconfig'
    path.write_text(json.dumps({
        'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'nowhere',
        'clusters': [{'name': 'nowhere', 'cluster': {'server': 'http://127.0.0.1:1'}}],
        'users': [{'name': 'nobody', 'user': {}}],
        'contexts': [{'name': 'nowhere', 'context': {'cluster': 'nowhere', 'user': 'nobody'}}],
    }))
    monkeypatch.setenv('KUBECONFIG', str(path))
    monkeypatch.delenv('KUBERNETES_SERVICE_HOST', raising=False)


@pytest.fixture()
def kopf_env(k8s_emulator: KubernetesEmulator) -> dict[str, str]:
    """The environment for a ``kopf`` subprocess that talks to the emulator."""
    return {**os.environ, 'KUBECONFIG': str(k8s_emulator.kubeconfig_path)}


@pytest.fixture(autouse=True)
def _isolated(restore_logging: None, restore_imports: None) -> None:
    """Every test here changes the logging and imports operator sources: both are restored."""


# A log line of the "full" format: "[timestamp] logger [LEVEL] message".
LOG_LINE = re.compile(r'^\[[^]]+\] (?P<logger>\S+)\s+\[(?P<level>\w+)\s*\] (?P<message>.*)$')
PROCESS_TIMEOUT = 30.0
LAST_LINES = 20  # of the output, shown when a process does not exit in time


class KopfProcess:
    """A running ``kopf run`` in a subprocess; its stderr is read in the background, to wait for lines."""

    def __init__(self, args: list[str], env: dict[str, str], timeout: float = PROCESS_TIMEOUT) -> None:
        self.timeout = timeout
        self.popen = subprocess.Popen(args, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            with self._changed:
                self.lines.append(line.rstrip('\n'))
                self._changed.notify_all()

    @property
    def messages(self) -> list[str]:
        """The logged messages without the timestamps & the loggers' names (other lines as they are)."""
        return [match['message'] if (match := LOG_LINE.match(line)) else line for line in self.lines]

    def wait_for_line(self, line: str) -> None:
        """Wait until this exact line is printed (or the process exits)."""
        with self._changed:
            if not self._changed.wait_for(lambda: line in self.lines or self.popen.poll() is not None,
                                          timeout=self.timeout):
                pytest.fail(f'No line {line!r} in {self.timeout} seconds: {self.lines}')
        assert line in self.lines, self.lines

    def wait_for(self, pattern: str) -> str:
        """Wait until a message matches the regexp fully; return it."""
        regexp = re.compile(pattern)

        def found() -> str | None:
            return next((message for message in self.messages if regexp.fullmatch(message)), None)

        with self._changed:
            if not self._changed.wait_for(lambda: found() is not None or self.popen.poll() is not None,
                                          timeout=self.timeout):
                pytest.fail(f'No message {pattern!r} in {self.timeout} seconds: {self.lines}')
        message = found()
        assert message is not None, self.lines
        return message

    def wait(self) -> int:
        """Wait for the exit; if it does not come in time, fail with the last lines printed (the why)."""
        try:
            code = self.popen.wait(self.timeout)
        except subprocess.TimeoutExpired:
            with self._changed:
                last = self.lines[-LAST_LINES:]
            pytest.fail(f'The process has not exited in {self.timeout} seconds; its last lines:\n'
                        + '\n'.join(last), pytrace=False)
        self._reader.join(self.timeout)
        return code


@pytest.fixture()
def kopf_process() -> Any:
    """The class of the ``kopf run`` subprocesses (the test modules cannot import each other)."""
    return KopfProcess


# A token that must never appear in any output (the tests grep for it).
SECRET = 'sEcReT-tOkEn-in-the-kubeconfig'


def kubeconfig_doc(**overrides: Any) -> dict[str, Any]:
    """A valid kubeconfig document with a token (to be broken by the overrides); for tables too."""
    doc: dict[str, Any] = {
        'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'ctx',
        'clusters': [{'name': 'c', 'cluster': {'server': 'https://127.0.0.1:1'}}],
        'users': [{'name': 'u', 'user': {'token': SECRET}}],
        'contexts': [{'name': 'ctx', 'context': {'cluster': 'c', 'user': 'u'}}],
    }
    doc.update(overrides)
    return doc
