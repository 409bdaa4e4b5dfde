"""
Fixtures of the examples' tests.

``kopf run`` configures the process-wide logging, puts the example's directory into ``sys.path``,
and registers the example as a module (every example is named ``example.py``): all of this is
restored after every test, so that the examples do not see each other.
"""
import pathlib
import sys
from collections.abc import Iterator

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / 'examples'


@pytest.fixture(autouse=True)
def _isolated(restore_logging: None) -> Iterator[None]:
    saved_path = list(sys.path)
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name, module in list(sys.modules.items()):
            filename = getattr(module, '__file__', None)
            if filename and pathlib.Path(filename).is_relative_to(EXAMPLES):
                del sys.modules[name]
