"""
Fixtures of the logging tests: the global logging state is restored after every test,
since ``kopf.configure()`` deliberately changes the root logger and some third-party loggers.
"""
import copy
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


@pytest.fixture()
def settings() -> OperatorSettings:
    return OperatorSettings()


@pytest.fixture()
def namespaced_body() -> dict[str, Any]:
    return copy.deepcopy(NAMESPACED_BODY)


@pytest.fixture()
def cluster_body() -> dict[str, Any]:
    return copy.deepcopy(CLUSTER_BODY)


@pytest.fixture(autouse=True)
def _isolated(restore_logging: None) -> None:
    """``kopf.configure()`` changes the process-wide logging: it is restored after every test."""
