"""
A whole operator: the object changes while a handling cycle of several handlers is in progress.

The first handler is held (it waits for the test) while the test changes the object; then it finishes
with the old state. The handlers done before the change are re-run with it in the same cycle,
so that all of them see the essence that is stored as the diff-base at the cycle's end
(issue #16; Kopf 1.45.2 does not do this: nolar/kopf#641).
"""
import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]  # the conftest's factory of running operators (async context managers)
Eventually = Callable[..., Any]
Quiet = Callable[..., Any]
Messages = Callable[[], list[str]]


async def test_creation_handlers_all_see_the_change_made_in_the_middle(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet, messages: Messages,
) -> None:
    calls: list[tuple[str, Any, Any]] = []
    entered, release = asyncio.Event(), asyncio.Event()

    @kopf.on.create('kopfexamples', registry=registry)
    async def create_a(spec: Any, labels: Any, **_: Any) -> Any:
        calls.append(('create_a', spec['field'], dict(labels)))
        entered.set()
        await release.wait()
        return spec['field']

    @kopf.on.create('kopfexamples', registry=registry)
    async def create_b(spec: Any, labels: Any, **_: Any) -> Any:
        calls.append(('create_b', spec['field'], dict(labels)))
        return spec['field']

    @kopf.on.field('kopfexamples', field='spec.other', registry=registry)
    async def other_fn(new: Any, **_: Any) -> Any:
        calls.append(('other_fn', new, None))

    async with operator(registry, settings):
        await cluster.create('kex1', {'field': 'v1', 'other': 'o1'})
        await asyncio.wait_for(entered.wait(), timeout=5)
        await cluster.patch('kex1', {'spec': {'field': 'v2'}, 'metadata': {'labels': {'x': 'y'}}})
        release.set()
        await eventually(lambda: cluster.diffbase() is not None and not cluster.progress_annotations())
        await quiet()

    # create_a: once with the old state (it was running), once with the new one; create_b once.
    # The field handler ran before or after the change, but its field has not changed: only once.
    assert sorted(calls) == [('create_a', 'v1', {}), ('create_a', 'v2', {'x': 'y'}),
                             ('create_b', 'v2', {'x': 'y'}), ('other_fn', 'o1', None)]
    assert cluster.diffbase() == {'spec': {'field': 'v2', 'other': 'o1'}, 'metadata': {'labels': {'x': 'y'}}}
    assert cluster.status() == {'create_a': 'v2', 'create_b': 'v2'}
    assert messages().count("Handler 'create_a' is re-run: the object has changed since it ran.") == 1
    assert 'Creation is processed: 3 succeeded; 0 failed.' in messages()


async def test_a_change_made_while_the_only_handler_runs_is_handled_after_it(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, cluster: Cluster,
        operator: Operator, eventually: Eventually, quiet: Quiet, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger='kopf.objects')  # the debug logs process every echo anyway
    # The cycle's patch is applied on top of the change (a merge-patch has no precondition): its version has
    # the new spec, so it is not an echo of only the framework's own writes, and must not be skipped as one.
    calls: list[tuple[str, Any]] = []
    entered, release = asyncio.Event(), asyncio.Event()

    @kopf.on.create('kopfexamples', registry=registry)
    async def create_fn(spec: Any, **_: Any) -> Any:
        calls.append(('create', spec['field']))
        entered.set()
        await release.wait()
        return spec['field']

    @kopf.on.update('kopfexamples', registry=registry)
    async def update_fn(spec: Any, **_: Any) -> Any:
        calls.append(('update', spec['field']))
        return spec['field']

    async with operator(registry, settings):
        await cluster.create('kex1', {'field': 'v1'})
        await asyncio.wait_for(entered.wait(), timeout=5)
        await cluster.patch('kex1', {'spec': {'field': 'v2'}})
        release.set()
        await eventually(lambda: cluster.diffbase() == {'spec': {'field': 'v2'}})
        await quiet()

    assert calls == [('create', 'v1'), ('update', 'v2')]
    assert cluster.status() == {'create_fn': 'v1', 'update_fn': 'v2'}
