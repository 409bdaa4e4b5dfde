"""
Shared fixtures of the persistence tests: the captured behaviour of the original Kopf.

The fixtures in ``fixtures/kopf-1.45.2/`` are made by ``tools/compat/capture_kopf.py``:
one file per scenario of Kopf running against a cluster (the objects before/after, every
request Kopf has sent, the log), and ``storages.json`` with the outcomes of direct calls
of Kopf's storage classes. Helpers are given as fixtures, since test modules cannot import
each other (pytest runs in the importlib mode).
"""
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

from kopf._core import persistence

FIXTURES = pathlib.Path(__file__).parent / 'fixtures' / 'kopf-1.45.2'

StorageFactory = Callable[[dict[str, Any]], Any]


def load_fixture(name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return result


def make_storage(spec: dict[str, Any]) -> Any:
    """Our storage of the same class and with the same arguments as in a captured storage spec."""
    cls = getattr(persistence, spec['class'])
    if 'storages' in spec:
        return cls([make_storage(child) for child in spec['storages']])
    return cls(**spec.get('kwargs', {}))


@pytest.fixture(scope='session')
def probe() -> dict[str, Any]:
    return load_fixture('storages.json')


@pytest.fixture()
def storage_factory() -> StorageFactory:
    return make_storage
