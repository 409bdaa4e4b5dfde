"""
The control plane's reaper: a watchdog process that stops etcd and kube-apiserver if their owner dies.

Run as a script by :class:`kopf.testing.apiserver.processes.Reaper` (the standard library only: it never
imports the ``kopf`` package). It reads its orders from its standard input, one per line:
``+PGID`` (a process group to watch), ``-PGID`` (stopped by its owner: forget it), ``q`` (the owner
has stopped everything: exit). When its standard input ends without a ``q`` — the owning process has
exited without stopping the control plane (SIGKILL, a crash, ``os._exit()``) — it sends SIGKILL to every
watched group, waits for them to vanish, and removes the owner's temporary directory (its first
argument, if any: the keys and etcd's data are not left behind).
"""
import os
import shutil
import signal
import sys
import time

VANISH_TIMEOUT = 10.0  # seconds to wait for the killed groups to vanish before removing the directory
POLL_INTERVAL = 0.05


def main() -> None:
    directory = sys.argv[1] if len(sys.argv) > 1 else ''
    groups: set[int] = set()
    for line in sys.stdin.buffer:  # until the owner closes it, or dies
        order = line.strip()
        if order == b'q':
            return
        if order[:1] in (b'+', b'-') and order[1:].isdigit():
            (groups.add if order[:1] == b'+' else groups.discard)(int(order[1:]))
    for group in groups:
        _kill(group)
    deadline = time.monotonic() + VANISH_TIMEOUT
    while any(_alive(group) for group in groups) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


def _kill(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(group: int) -> bool:
    """Whether the group's leader still runs (a zombie does not: it waits only to be reaped)."""
    try:
        with open(f'/proc/{group}/stat', 'rb') as f:
            return f.read().rsplit(b')', 1)[1].split()[0] != b'Z'
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:  # no /proc: ask the kernel (a zombie counts as alive then, until the timeout)
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True


if __name__ == '__main__':
    main()
