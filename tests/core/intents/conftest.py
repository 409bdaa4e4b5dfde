"""
Shared fixtures of the declarative layer's tests: bodies, causes, registries.

The helpers are given as fixtures (factories), since the test modules cannot import each other
(pytest runs in the importlib mode, without the tests' directories on sys.path).
"""
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.references import Resource
from kopf._core.intents.causes import (
    ResourceChangingCause,
    ResourceSpawningCause,
    ResourceWatchingCause,
    detect_changing_cause,
)
from kopf._core.intents.handlers import Reason
from kopf._core.intents.registries import OperatorRegistry, get_default_registry, set_default_registry

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', singular='kopfexample',
               shortcuts=frozenset({'kex'}), namespaced=True)
POD = Resource('', 'v1', 'pods', kind='Pod', singular='pod', shortcuts=frozenset({'po'}),
               categories=frozenset({'all'}), namespaced=True)
FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'
LOGGER = logging.getLogger('tests.intents')


def _make_body(
        *,
        spec: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        finalizers: list[str] | None = None,
        deleted: bool = False,
        status: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {'name': 'kex1', 'namespace': 'ns1', 'uid': 'uid1'}
    if labels is not None:
        meta['labels'] = dict(labels)
    if annotations is not None:
        meta['annotations'] = dict(annotations)
    if finalizers is not None:
        meta['finalizers'] = list(finalizers)
    if deleted:
        meta['deletionTimestamp'] = '2020-12-31T23:59:59Z'
    body: dict[str, Any] = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': meta}
    if spec is not None:
        body['spec'] = dict(spec)
    if status is not None:
        body['status'] = dict(status)
    return body


def _changing_cause(
        *,
        reason: Reason,
        raw: Mapping[str, Any] | None = None,
        old: Any = None,
        new: Any = None,
        initial: bool = False,
        resource: Resource = KEX,
        indices: Mapping[str, Any] | None = None,
) -> ResourceChangingCause:
    """A cause with an explicit reason; the diff is computed from old & new as the detection does."""
    raw = raw if raw is not None else _make_body()
    cause = detect_changing_cause(
        event_type='MODIFIED', resource=resource, body=Body(raw), old=old, new=new,
        finalizer=FINALIZER, initial=initial, logger=LOGGER, indices=indices,
    )
    cause.reason = reason
    return cause


def _watching_cause(
        raw: Mapping[str, Any] | None = None,
        *,
        resource: Resource = KEX,
) -> ResourceWatchingCause:
    raw = raw if raw is not None else _make_body()
    return ResourceWatchingCause(
        resource=resource, body=Body(raw), type='ADDED', event={'type': 'ADDED', 'object': dict(raw)},
        logger=LOGGER,
    )


def _spawning_cause(
        raw: Mapping[str, Any] | None = None,
        *,
        resource: Resource = KEX,
) -> ResourceSpawningCause:
    raw = raw if raw is not None else _make_body()
    return ResourceSpawningCause(resource=resource, body=Body(raw), logger=LOGGER)


@pytest.fixture()
def registry() -> OperatorRegistry:
    return OperatorRegistry()


@pytest.fixture()
def default_registry() -> Iterator[OperatorRegistry]:
    """A fresh default registry for the decorators without registry=, with the previous one restored after."""
    previous = get_default_registry()
    fresh = OperatorRegistry()
    set_default_registry(fresh)
    try:
        yield fresh
    finally:
        set_default_registry(previous)


@pytest.fixture()
def make_body() -> Any:
    return _make_body


@pytest.fixture()
def changing_cause() -> Any:
    return _changing_cause


@pytest.fixture()
def watching_cause() -> Any:
    return _watching_cause


@pytest.fixture()
def spawning_cause() -> Any:
    return _spawning_cause
