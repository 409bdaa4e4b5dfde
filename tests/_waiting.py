"""
Waiting in the synchronous tests of real API servers: until a condition is truthy (returned then).

Unlike :func:`kopf.testing.eventually` (where a check passes unless it returns ``False`` or fails an
assertion), ``None``, ``[]`` and ``0`` mean "not yet" here: e.g. ``wait_until(lambda: lease.spec.holder)``
waits for a holder and returns it. The default timeout suits a real kube-apiserver on a busy 2-core machine.
"""
import time
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar('_T')

WAIT = 30.0  # seconds


def wait_until(condition: Callable[[], _T], within: float = WAIT) -> _T:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f'The condition has not been met in {within}s.')
