"""
Shared fixtures of the persistence tests.

The captured behaviour of the original Kopf is in ``fixtures/kopf-1.45.2/`` (made by
``tools/compat/capture_kopf.py``): one file per scenario of Kopf running against a cluster,
and ``storages.json`` with the outcomes of direct calls of Kopf's storage classes.
The test modules load them at import time, since they parametrize the tests by their content.
Helpers are given as fixtures, since test modules cannot import each other (importlib mode).
"""
from collections.abc import Callable
from typing import Any

import pytest

from kopf._core import persistence


def make_storage(spec: dict[str, Any]) -> Any:
    """Our storage of the same class and with the same arguments as in a captured storage spec."""
    cls = getattr(persistence, spec['class'])
    if 'storages' in spec:
        return cls([make_storage(child) for child in spec['storages']])
    return cls(**spec.get('kwargs', {}))


@pytest.fixture()
def storage_factory() -> Callable[[dict[str, Any]], Any]:
    return make_storage
