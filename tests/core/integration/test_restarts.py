"""
Restarts of the operator mid-handling, and the objects handled (or half-handled) by Kopf 1.45.2 itself.

The objects left by Kopf are the captured states of ``tests/core/persistence/fixtures/kopf-1.45.2/``:
each scenario file has the operator's code, and the object before & after Kopf has handled it.
"""
import functools
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

import kopf

Cluster = Any  # the conftest's raw client of the emulator
Operator = Callable[..., Any]  # the conftest's factory of running operators (async context managers)
Eventually = Callable[..., Any]
Quiet = Callable[..., Any]

FIXTURES = pathlib.Path(__file__).parent.parent / 'persistence' / 'fixtures' / 'kopf-1.45.2'
SCENARIOS = {path.stem: json.loads(path.read_text())
             for path in sorted(FIXTURES.glob('*.json')) if path.name != 'storages.json'}

# The objects that Kopf has fully handled (the others are left in progress on purpose, or are gone).
HANDLED = [name for name, scenario in SCENARIOS.items()
           if scenario['objects']['kex1']['after'] is not None
           and name not in {'arbitrary-exception', 'verbose-progress'}]


async def test_restart_continues_the_handlers_where_the_previous_operator_stopped(
        make_registry: Callable[[], kopf.OperatorRegistry],
        settings_factory: Callable[[], kopf.OperatorSettings],
        cluster: Cluster, operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    calls: list[tuple[int, str, int]] = []

    def make_handlers(generation: int) -> kopf.OperatorRegistry:
        registry = make_registry()

        @kopf.on.create('kopfexamples', registry=registry)
        def create_first(retry: int, **_: Any) -> Any:
            calls.append((generation, 'create_first', retry))
            return 'first'

        @kopf.on.create('kopfexamples', registry=registry)
        def create_second(retry: int, **_: Any) -> Any:
            calls.append((generation, 'create_second', retry))
            if generation == 1:
                raise kopf.TemporaryError('not yet', delay=1.0)  # the operator is stopped meanwhile
            return 'second'

        return registry

    def second_is_delayed() -> bool:
        record = cluster.annotations().get('kopf.zalando.org/create_second')
        return record is not None and json.loads(record).get('retries') == 1

    async with operator(make_handlers(1), settings_factory()):
        await cluster.create('kex1')
        await eventually(second_is_delayed)
    assert calls == [(1, 'create_first', 0), (1, 'create_second', 0)]
    first_record = json.loads(cluster.annotations()['kopf.zalando.org/create_first'])
    second_record = json.loads(cluster.annotations()['kopf.zalando.org/create_second'])
    assert first_record['success'] is True
    assert second_record['success'] is False and second_record['message'] == 'not yet'

    async with operator(make_handlers(2), settings_factory()):
        await eventually(lambda: bool((cluster.get() or {}).get('status', {}).get('create_second')))
        await quiet()

    assert calls == [(1, 'create_first', 0), (1, 'create_second', 0), (2, 'create_second', 1)]
    assert cluster.get()['status'] == {'create_first': 'first', 'create_second': 'second'}
    assert cluster.progress_annotations() == {}
    assert cluster.diffbase() == {'spec': {'field': 'value'}}


async def test_changes_and_deletions_during_the_downtime_are_handled_after_a_restart(
        make_registry: Callable[[], kopf.OperatorRegistry],
        settings_factory: Callable[[], kopf.OperatorSettings],
        cluster: Cluster, operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    calls: list[tuple[str, str, Any]] = []

    def make_handlers() -> kopf.OperatorRegistry:
        registry = make_registry()

        @kopf.on.resume('kopfexamples', registry=registry)
        def resume_fn(name: str, diff: Any, **_: Any) -> None:
            calls.append(('resume', name, tuple(diff)))

        @kopf.on.create('kopfexamples', registry=registry)
        def create_fn(name: str, **_: Any) -> None:
            calls.append(('create', name, None))

        @kopf.on.update('kopfexamples', registry=registry)
        def update_fn(name: str, diff: Any, **_: Any) -> None:
            calls.append(('update', name, tuple(diff)))

        @kopf.on.delete('kopfexamples', registry=registry)
        def delete_fn(name: str, **_: Any) -> None:
            calls.append(('delete', name, None))

        return registry

    async with operator(make_handlers(), settings_factory()):
        for name in ['changed', 'same', 'deleted']:
            await cluster.create(name, {'field': 'old'})
        await eventually(lambda: len(calls) == 3)
        await quiet()

    # The downtime: the objects are changed and deleted (the deletion is blocked by the finalizer).
    await cluster.patch('changed', {'spec': {'field': 'new'}})
    await cluster.delete('deleted')
    assert cluster.get('deleted') is not None

    calls.clear()
    async with operator(make_handlers(), settings_factory()):
        await eventually(lambda: cluster.get('deleted') is None)
        await eventually(lambda: cluster.diffbase('changed') == {'spec': {'field': 'new'}})
        await quiet()

    # As Kopf 1.45.2 does: the resuming handlers are mixed into the first cycle (not into the deletion).
    change = (('change', ('spec', 'field'), 'old', 'new'),)
    assert sorted(calls) == [('delete', 'deleted', None), ('resume', 'changed', change),
                             ('resume', 'same', ()), ('update', 'changed', change)]


async def test_restart_continues_the_handlers_left_in_progress_by_kopf(
        registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings,
        cluster: Cluster, operator: Operator, eventually: Eventually, quiet: Quiet,
) -> None:
    # Kopf has run create_ok successfully, and create_raises has failed once (its retry is due).
    calls: list[tuple[str, int]] = []

    @kopf.on.create('kopfexamples', registry=registry)
    def create_ok(retry: int, **_: Any) -> Any:
        calls.append(('create_ok', retry))
        return 1

    @kopf.on.create('kopfexamples', registry=registry)
    def create_raises(retry: int, **_: Any) -> Any:
        calls.append(('create_raises', retry))
        return 'fixed'

    await create_as_kopf_left_it(cluster, SCENARIOS['arbitrary-exception']['objects']['kex1']['after'])
    async with operator(registry, settings):
        await eventually(lambda: cluster.diffbase() is not None)
        await quiet()

    assert calls == [('create_raises', 1)]
    assert cluster.get()['status'] == {'create_ok': 1, 'create_raises': 'fixed'}
    assert cluster.progress_annotations() == {}


@pytest.mark.parametrize('scenario', HANDLED)
async def test_objects_handled_by_kopf_are_not_handled_again(
        scenario: str, registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings,
        cluster: Cluster, operator: Operator, eventually: Eventually, quiet: Quiet,
        messages: Callable[[], list[str]],
) -> None:
    seen: list[str] = []

    @kopf.on.event('kopfexamples', registry=registry)
    def notice(name: str, **_: Any) -> None:
        seen.append(name)

    register_scenario_operator(registry, SCENARIOS[scenario]['operator'])
    await create_as_kopf_left_it(cluster, SCENARIOS[scenario]['objects']['kex1']['after'])
    before = cluster.get()
    requests_before = cluster.count(None, 'kex1')

    async with operator(registry, settings):
        await eventually(lambda: 'kex1' in seen)
        await quiet()

    invoked = [message for message in messages() if ' is invoked' in message and 'notice' not in message]
    assert invoked == []
    assert cluster.count(None, 'kex1') == requests_before  # no patches, not even reads
    assert cluster.get() == before


def register_scenario_operator(registry: kopf.OperatorRegistry, source: list[str]) -> None:
    """Run the scenario's operator code with its decorators bound to our registry (not the global one)."""

    class BoundOn:
        def __getattr__(self, name: str) -> Any:
            return functools.partial(getattr(kopf.on, name), registry=registry)

    class BoundKopf:
        on = BoundOn()

        def __getattr__(self, name: str) -> Any:
            return getattr(kopf, name)

    exec(compile('\n'.join(source), '<scenario>', 'exec'), {'kopf': BoundKopf()})


async def create_as_kopf_left_it(cluster: Cluster, after: dict[str, Any]) -> None:
    """Recreate the object as Kopf has left it: its metadata, spec, status, and its deletion if any."""
    metadata = {key: value for key, value in after['metadata'].items()
                if key in {'labels', 'annotations', 'finalizers'}}
    await cluster.create(after['metadata']['name'], after['spec'], metadata=metadata,
                         status=after.get('status'))
    if 'deletionTimestamp' in after['metadata']:
        await cluster.delete(after['metadata']['name'])
