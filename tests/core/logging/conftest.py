"""
Fixtures of the logging tests: the global logging state is restored after every test,
since ``kopf.configure()`` deliberately changes the root logger and some third-party loggers.
"""
import copy
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from kopf._core.intents.configuration import OperatorSettings

NAMESPACED_BODY: dict[str, Any] = {
    'apiVersion': 'kopf.dev/v1',
    'kind': 'KopfExample',
    'metadata': {'name': 'kex1', 'namespace': 'ns1', 'uid': 'uid1', 'labels': {'a': 'b'}},
    'spec': {'field': 'value'},
}
CLUSTER_BODY: dict[str, Any] = {
    'apiVersion': 'v1',
    'kind': 'Node',
    'metadata': {'name': 'node1', 'uid': 'uid2'},
}


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    names = ['asyncio', 'aiohttp', 'kopf', 'kopf.objects']
    root = logging.getLogger()
    root_state = (list(root.handlers), root.level)
    states = {name: (list(logging.getLogger(name).handlers), logging.getLogger(name).level,
                     logging.getLogger(name).propagate) for name in names}
    try:
        yield
    finally:
        root.handlers[:] = root_state[0]
        root.setLevel(root_state[1])
        for name, (handlers, level, propagate) in states.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate


@pytest.fixture()
def settings() -> OperatorSettings:
    return OperatorSettings()


@pytest.fixture()
def namespaced_body() -> dict[str, Any]:
    return copy.deepcopy(NAMESPACED_BODY)


@pytest.fixture()
def cluster_body() -> dict[str, Any]:
    return copy.deepcopy(CLUSTER_BODY)
