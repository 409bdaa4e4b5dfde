"""
The errors of :class:`KubernetesControlPlane`: one class per bad case, each with a one-line message.

Where a process's log explains the failure, its last lines follow the first line of the message,
indented. Messages never contain the admin token or any key: the log lines are redacted.
"""

import pathlib
from collections.abc import Sequence

__all__ = [
    'BinariesNotFoundError',
    'ControlPlaneError',
    'PortInUseError',
    'ProcessExitedError',
    'StartTimeoutError',
]


class ControlPlaneError(Exception):
    """The base of all errors of starting or running the Kubernetes control plane."""


class BinariesNotFoundError(ControlPlaneError, FileNotFoundError):
    """The ``etcd`` or ``kube-apiserver`` binaries are not found (or not executable)."""


class PortInUseError(ControlPlaneError):
    """A port that etcd or kube-apiserver must listen on is taken by another process."""

    def __init__(self, message: str, *, port: int) -> None:
        super().__init__(message)
        self.port = port


class ProcessExitedError(ControlPlaneError):
    """``etcd`` or ``kube-apiserver`` exited while starting; its last log lines are in the message."""

    def __init__(
            self,
            message: str,
            *,
            process_name: str,
            exit_code: int | None,
            log_path: pathlib.Path | None = None,
            log_tail: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.process_name = process_name
        self.exit_code = exit_code
        self.log_path = log_path
        self.log_tail = list(log_tail)


class StartTimeoutError(ControlPlaneError, TimeoutError):
    """The control plane did not become ready (``/readyz``) within the start timeout."""

    def __init__(self, message: str, *, timeout: float, log_tail: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.log_tail = list(log_tail)
