"""
Fixtures of the KopfRunner tests.

The runner invokes ``kopf run``, which configures the process-wide logging and loads the sources
(changing ``sys.path`` & ``sys.modules``): all of this is restored after every test. Handlers are
declared in the tests themselves, in a fresh registry per test, so they can signal the test.
The helpers are fixtures, since the test modules cannot import each other (importlib mode).
"""
import threading
from collections.abc import Iterator

import pytest

WAIT_TIMEOUT = 10.0


@pytest.fixture(autouse=True)
def _no_leftover_runner_threads() -> Iterator[None]:
    """Every runner's thread must be over by the end of its test: a leak would hide a hang."""
    yield
    leftovers = [thread for thread in threading.enumerate() if thread.name == 'KopfRunner']
    for thread in leftovers:
        thread.join(WAIT_TIMEOUT)
    assert not [thread for thread in leftovers if thread.is_alive()]


@pytest.fixture(autouse=True)
def _isolated(restore_logging: None, restore_imports: None) -> None:
    """Every test here changes the logging and imports operator sources: both are restored."""
