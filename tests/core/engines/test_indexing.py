"""
The indexing engine: the indices' structure, the objects' contributions, the errors, the readiness.

The events are given to the engine directly (as the reactor does for every event of an object);
the indexing functions are real handlers from a real registry, declared with ``@kopf.index``.
No API is involved: the indexing never talks to the cluster.
"""
import asyncio
import collections.abc
import logging
from typing import Any

import pytest

import kopf
from kopf._cogs.structs.bodies import RawEvent
from kopf._cogs.structs.references import Resource
from kopf._core.engines.indexing import IndexingReadiness, OperatorIndexers

PODS = Resource('', 'v1', 'pods', kind='Pod', namespaced=True)


def event(name: str, *, type: str | None = 'MODIFIED', namespace: str = 'ns1',
          labels: dict[str, str] | None = None, spec: Any = None, uid: str | None = None) -> RawEvent:
    body = {'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {'name': name, 'namespace': namespace, 'uid': uid or f'uid-{name}',
                         'labels': labels or {}},
            'spec': spec if spec is not None else {}}
    return {'type': type, 'object': body}  # type: ignore[typeddict-item]


@pytest.fixture
def registry() -> kopf.OperatorRegistry:
    return kopf.OperatorRegistry()


@pytest.fixture
def settings() -> kopf.OperatorSettings:
    return kopf.OperatorSettings()


@pytest.fixture
def indexers(registry: kopf.OperatorRegistry) -> OperatorIndexers:
    return kopf.OperatorIndexers()


@pytest.fixture
def feed(indexers: OperatorIndexers, registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings) -> Any:
    async def feed(*events: RawEvent) -> None:
        for raw_event in events:
            await indexers.index_resource_event(raw_event=raw_event, resource=PODS,
                                                registry=registry, settings=settings)
    return feed


def as_dict(index: kopf.Index[Any, Any]) -> dict[Any, list[Any]]:
    return {key: sorted(store, key=repr) for key, store in index.items()}


#
# The structure.
#

def test_index_and_store_are_read_only_abstract_collections(indexers: OperatorIndexers) -> None:
    assert issubclass(kopf.Index, collections.abc.Mapping)
    assert not issubclass(kopf.Index, collections.abc.MutableMapping)
    assert issubclass(kopf.Store, collections.abc.Collection)
    assert not issubclass(kopf.Store, collections.abc.MutableSet)
    assert not hasattr(kopf.Store, 'add') and not hasattr(kopf.Store, 'append')
    assert isinstance(indexers.indices, collections.abc.Mapping)
    assert not isinstance(indexers.indices, collections.abc.MutableMapping)


def test_indices_exist_before_anything_is_indexed(registry: kopf.OperatorRegistry,
                                                  indexers: OperatorIndexers) -> None:
    @kopf.index('pods', registry=registry)
    def by_name(name: str, **_: Any) -> Any:
        return name

    @kopf.index('pods', id='renamed', registry=registry)
    def some_fn(**_: Any) -> Any:
        return None

    indexers.ensure(registry.indexing.get_all_handlers())
    assert set(indexers.indices) == {'by_name', 'renamed'}
    assert dict(indexers.indices['by_name']) == {}
    assert len(indexers) == 2 and indexers['renamed'] is indexers.indices['renamed']


async def test_values_of_several_objects_accumulate_under_their_keys(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    results = {'pod1': {'key1': 'valueA'}, 'pod2': {'key1': 'valueB'}, 'pod3': {'key2': {'key3': 'valueC'}}}

    @kopf.index('pods', registry=registry)
    def idx(name: str, **_: Any) -> Any:
        return results[name]

    await feed(event('pod1', type=None), event('pod2', type=None), event('pod3', type=None))
    index = indexers.indices['idx']
    assert as_dict(index) == {'key1': ['valueA', 'valueB'], 'key2': [{'key3': 'valueC'}]}
    assert isinstance(index, kopf.Index)
    assert isinstance(index['key1'], kopf.Store)
    assert len(index['key1']) == 2 and 'valueA' in index['key1'] and 'valueX' not in index['key1']
    assert index.get('absent') is None and 'absent' not in index


async def test_multiple_keys_of_one_object(registry: kopf.OperatorRegistry,
                                           indexers: OperatorIndexers, feed: Any) -> None:
    @kopf.index('pods', registry=registry)
    def by_label(labels: kopf.Labels, name: str, **_: Any) -> Any:
        return dict.fromkeys(labels.items(), name)

    await feed(event('pod1', labels={'a': '1', 'b': '2'}), event('pod2', labels={'a': '1', 'b': '3'}))
    assert as_dict(indexers['by_label']) == {('a', '1'): ['pod1', 'pod2'], ('b', '2'): ['pod1'],
                                             ('b', '3'): ['pod2']}


async def test_changes_replace_the_contribution_and_drop_empty_keys(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    @kopf.index('pods', registry=registry)
    def by_label(labels: kopf.Labels, name: str, **_: Any) -> Any:
        return dict.fromkeys(labels.items(), name)

    await feed(event('pod1', labels={'a': '1', 'b': '2'}), event('pod2', labels={'a': '1'}))
    await feed(event('pod1', labels={'a': '9', 'c': '3'}))
    assert as_dict(indexers['by_label']) == {('a', '1'): ['pod2'], ('a', '9'): ['pod1'], ('c', '3'): ['pod1']}


async def test_deletions_remove_the_values_and_the_empty_keys(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    @kopf.index('pods', registry=registry)
    def by_namespace(namespace: str, name: str, **_: Any) -> Any:
        return {namespace: name}

    await feed(event('pod1'), event('pod2'), event('pod3', namespace='ns2'))
    await feed(event('pod1', type='DELETED'), event('pod3', namespace='ns2', type='DELETED'))
    assert as_dict(indexers['by_namespace']) == {'ns1': ['pod2']}


async def test_recreated_objects_with_the_same_name_are_different_objects(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    @kopf.index('pods', registry=registry)
    def by_name(name: str, uid: str, **_: Any) -> Any:
        return {name: uid}

    await feed(event('pod1', uid='old'), event('pod1', uid='new', type='ADDED'))
    await feed(event('pod1', uid='old', type='DELETED'))  # comes later via its own stream
    assert as_dict(indexers['by_name']) == {'pod1': ['new']}


async def test_objects_stop_and_start_matching_the_filters(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    @kopf.index('pods', labels={'app': 'web'}, when=lambda spec, **_: not spec.get('paused'),
                registry=registry)
    def web(name: str, **_: Any) -> Any:
        return name

    await feed(event('pod1', labels={'app': 'web'}), event('pod2', labels={'app': 'web'}))
    assert as_dict(indexers['web']) == {None: ['pod1', 'pod2']}

    await feed(event('pod1', labels={'app': 'db'}),
               event('pod2', labels={'app': 'web'}, spec={'paused': True}))
    assert as_dict(indexers['web']) == {}

    await feed(event('pod1', labels={'app': 'web'}))
    assert as_dict(indexers['web']) == {None: ['pod1']}


async def test_field_and_value_filters(registry: kopf.OperatorRegistry,
                                       indexers: OperatorIndexers, feed: Any) -> None:
    @kopf.index('pods', field='spec.role', value='leader', registry=registry)
    def leaders(name: str, **_: Any) -> Any:
        return name

    await feed(event('pod1', spec={'role': 'leader'}), event('pod2', spec={'role': 'follower'}))
    assert as_dict(indexers['leaders']) == {None: ['pod1']}
    await feed(event('pod1', spec={'role': 'follower'}), event('pod2', spec={'role': 'leader'}))
    assert as_dict(indexers['leaders']) == {None: ['pod2']}


#
# The results.
#

async def test_non_dicts_are_values_under_the_key_none(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    results: dict[str, Any] = {'pod1': 'pod1', 'pod2': {'main', 'sidecar'}, 'pod3': ('ns1', 'pod3'),
                               'pod4': kopf.Memo(a=1), 'pod5': 0, 'pod6': ['x']}

    @kopf.index('pods', registry=registry)
    def idx(name: str, **_: Any) -> Any:
        return results[name]

    await feed(*[event(name) for name in results])
    assert list(indexers['idx']) == [None]
    values = list(indexers['idx'][None])
    assert len(values) == len(results)
    for value in results.values():
        assert value in values
    assert any(type(value) is kopf.Memo for value in values)  # not merged as a dict: stored as is


async def test_none_keeps_the_previous_contribution(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    results: dict[str, Any] = {'pod1': {'key': 'v1'}}

    @kopf.index('pods', registry=registry)
    def idx(name: str, **_: Any) -> Any:
        return results.get(name)

    await feed(event('pod1'), event('pod2'))
    assert as_dict(indexers['idx']) == {'key': ['v1']}  # pod2 is not indexed at all
    results.clear()
    await feed(event('pod1'))
    assert as_dict(indexers['idx']) == {'key': ['v1']}  # stale, but kept


async def test_none_values_in_dicts_are_indexed(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    @kopf.index('pods', registry=registry)
    def idx(**_: Any) -> Any:
        return {'key': None}

    await feed(event('pod1'), event('pod2'))
    assert as_dict(indexers['idx']) == {'key': [None, None]}


async def test_empty_dicts_remove_the_contribution(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    results: dict[str, Any] = {'pod1': {'key': 'v1'}}

    @kopf.index('pods', registry=registry)
    def idx(name: str, **_: Any) -> Any:
        return results[name]

    await feed(event('pod1'))
    results['pod1'] = {}
    await feed(event('pod1'))
    assert as_dict(indexers['idx']) == {}


async def test_kwargs_of_the_indexing_functions(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any,
        settings: kopf.OperatorSettings) -> None:
    seen: dict[str, Any] = {}

    @kopf.index('pods', param=123, registry=registry)
    def idx(**kwargs: Any) -> Any:
        seen.update(kwargs)

    memo = kopf.Memo(x=1)
    await indexers.index_resource_event(raw_event=event('pod1', labels={'a': 'b'}), resource=PODS,
                                        registry=registry, settings=settings, memo=memo)
    assert seen['name'] == 'pod1' and seen['namespace'] == 'ns1' and seen['uid'] == 'uid-pod1'
    assert seen['labels'] == {'a': 'b'} and seen['body']['kind'] == 'Pod'
    assert seen['resource'] == PODS and seen['memo'] is memo and seen['param'] == 123
    assert seen['retry'] == 0 and 'logger' in seen and 'spec' in seen and 'meta' in seen
    assert seen['idx'] is indexers['idx']  # the indices themselves too, as for any handler


async def test_patching_in_indexing_functions_is_reported_not_applied(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    @kopf.index('pods', registry=registry)
    def idx(patch: kopf.Patch, **_: Any) -> Any:
        patch.metadata.labels['x'] = 'y'
        return 'value'

    await feed(event('pod1'))
    assert as_dict(indexers['idx']) == {None: ['value']}
    assert "Indexer 'idx' has patched the object, but the patches of the indexing functions " \
           "are not applied" in caplog.text


#
# The errors.
#

async def test_ignored_errors_keep_the_stale_values(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    fail = False

    @kopf.index('pods', registry=registry)  # errors=IGNORED by default
    def idx(name: str, spec: kopf.Spec, **_: Any) -> Any:
        if fail:
            raise Exception('Keep the stale values.')
        return {name: spec.get('v')}

    await feed(event('pod1', spec={'v': 1}))
    fail = True
    await feed(event('pod1', spec={'v': 2}))
    assert as_dict(indexers['idx']) == {'pod1': [1]}
    assert 'Keep the stale values.' in caplog.text
    assert any(record.exc_info for record in caplog.records)  # the traceback of an arbitrary exception

    fail = False
    await feed(event('pod1', spec={'v': 3}))
    assert as_dict(indexers['idx']) == {'pod1': [3]}


@pytest.mark.parametrize('errors, exception', [
    (kopf.ErrorsMode.PERMANENT, Exception('Excluded forever.')),
    (kopf.ErrorsMode.IGNORED, kopf.PermanentError('Excluded forever.')),
])
async def test_permanent_errors_exclude_the_object_forever(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any,
        errors: kopf.ErrorsMode, exception: Exception) -> None:
    calls: list[str] = []

    @kopf.index('pods', errors=errors, registry=registry)
    def idx(name: str, spec: kopf.Spec, **_: Any) -> Any:
        calls.append(name)
        if spec.get('fail'):
            raise exception
        return name

    await feed(event('pod1'), event('pod2'))
    await feed(event('pod1', spec={'fail': True}))
    assert as_dict(indexers['idx']) == {None: ['pod2']}
    await feed(event('pod1'), event('pod1'))
    assert as_dict(indexers['idx']) == {None: ['pod2']}
    assert calls == ['pod1', 'pod2', 'pod1']  # never called again for the failed object

    # A deletion forgets the exclusion: a re-created object (with the same uid, in theory) is indexed again.
    await feed(event('pod1', type='DELETED'), event('pod1'))
    assert as_dict(indexers['idx']) == {None: ['pod1', 'pod2']}


async def test_temporary_errors_without_delays_are_retried_on_the_next_event(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    retries: list[int] = []

    @kopf.index('pods', registry=registry)
    def idx(name: str, spec: kopf.Spec, retry: int, **_: Any) -> Any:
        retries.append(retry)
        if spec.get('fail'):
            raise kopf.TemporaryError('Not now.', delay=0)
        return name

    await feed(event('pod1'))
    await feed(event('pod1', spec={'fail': True}))
    assert as_dict(indexers['idx']) == {}  # removed for the time of the errors
    await feed(event('pod1', spec={'fail': True}))
    await feed(event('pod1'))
    assert as_dict(indexers['idx']) == {None: ['pod1']}
    assert retries == [0, 0, 1, 2]
    await feed(event('pod1'))
    assert retries == [0, 0, 1, 2, 0]  # a success resets the retrying state


async def test_temporary_errors_with_delays_exclude_the_object_for_the_delay(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    calls: list[str] = []

    @kopf.index('pods', errors=kopf.ErrorsMode.TEMPORARY, backoff=60, registry=registry)
    def idx(name: str, **_: Any) -> Any:
        calls.append(name)
        raise Exception('Excluded for 60s.')

    await feed(event('pod1'), event('pod1'), event('pod1'))
    assert calls == ['pod1']
    assert as_dict(indexers['idx']) == {}


async def test_temporary_errors_out_of_retries_become_permanent(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    @kopf.index('pods', errors=kopf.ErrorsMode.TEMPORARY, backoff=0, retries=2, registry=registry)
    def idx(retry: int, **_: Any) -> Any:
        calls.append(retry)
        raise Exception('Boom.')

    await feed(*[event('pod1') for _ in range(5)])
    assert calls == [0, 1]
    assert 'exceed 2 retries' in caplog.text


#
# The readiness.
#

@pytest.mark.looptime
async def test_readiness_waits_for_all_the_streams_known_at_the_time() -> None:
    readiness = IndexingReadiness()
    toggle1 = readiness.expect('pods in ns1')
    toggle2 = readiness.expect('pods in ns2')
    toggle3 = readiness.expect('pods in ns3')
    waiter = asyncio.create_task(readiness.wait())
    toggle1.turn_on()
    toggle3.drop()  # e.g. the namespace is gone: nothing to wait for
    await asyncio.sleep(1)
    assert not waiter.done()
    assert [readiness.ready] == [False]  # (not narrowed by the type checker)
    toggle2.turn_on()
    await asyncio.wait_for(waiter, timeout=1)
    assert readiness.ready

    late = readiness.expect('pods in ns4')  # a new namespace after the start: nobody waits for it
    await asyncio.wait_for(readiness.wait(), timeout=1)
    late.turn_on()
    late.drop()


@pytest.mark.looptime
async def test_readiness_without_indexed_streams_is_immediate() -> None:
    readiness = IndexingReadiness()
    await asyncio.wait_for(readiness.wait(), timeout=1)
    assert readiness.ready


@pytest.mark.looptime
async def test_long_waiting_is_reported_with_the_streams_not_ready(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    readiness = IndexingReadiness(reporting_interval=30)
    ready = readiness.expect('pods.v1 in \'ns1\'')
    toggle = readiness.expect('kopfexamples.v1.kopf.dev in \'ns2\'')
    ready.turn_on()
    waiter = asyncio.create_task(readiness.wait())
    await asyncio.sleep(29)
    assert 'waiting for the indices' not in caplog.text
    await asyncio.sleep(2)
    assert ("The handlers are waiting for the indices to be filled from the initial listings of: "
            "kopfexamples.v1.kopf.dev in 'ns2'.") in caplog.text
    await asyncio.sleep(30)
    assert caplog.text.count('The handlers are waiting for the indices') == 2
    toggle.turn_on()
    await asyncio.wait_for(waiter, timeout=1)
    await asyncio.sleep(100)
    assert caplog.text.count('The handlers are waiting for the indices') == 2


@pytest.mark.looptime
async def test_nobody_waiting_means_nothing_to_report(caplog: pytest.LogCaptureFixture) -> None:
    readiness = IndexingReadiness(reporting_interval=30)
    readiness.expect('pods in ns1')
    waiter = asyncio.create_task(readiness.wait())
    await asyncio.sleep(10)
    waiter.cancel()  # e.g. the operator exits before the indices are ready
    await asyncio.wait([waiter])
    await asyncio.sleep(100)
    assert 'The handlers are waiting for the indices' not in caplog.text


async def test_iterating_while_the_index_changes_sees_a_snapshot(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    @kopf.index('pods', registry=registry)
    def by_name(name: str, **_: Any) -> Any:
        return {name: name}

    await feed(event('pod1'), event('pod2'), event('pod3'))
    index = indexers['by_name']
    seen_items, seen_values, seen_keys = [], [], []
    for key, store in index.items():
        seen_items.append((key, list(store)))
        await feed(event('pod2', type='DELETED'), event('pod3', type='DELETED'))
    for store in index.values():
        seen_values.append(list(store))
        await feed(event('pod1', type='DELETED'))
    for key in index:
        seen_keys.append(key)
    assert seen_items == [('pod1', ['pod1']), ('pod2', []), ('pod3', [])]  # the stores are emptied, not gone
    assert seen_values == [['pod1']]
    assert seen_keys == []


async def test_exclusions_last_while_the_object_does_not_match_the_filters(
        registry: kopf.OperatorRegistry, indexers: OperatorIndexers, feed: Any) -> None:
    calls: list[str] = []

    @kopf.index('pods', labels={'app': 'web'}, registry=registry)
    def idx(name: str, **_: Any) -> Any:
        calls.append(name)
        raise kopf.PermanentError('Excluded forever.')

    await feed(event('pod1', labels={'app': 'web'}))
    await feed(event('pod1', labels={'app': 'db'}))
    await feed(event('pod1', labels={'app': 'web'}))
    assert calls == ['pod1']
    assert as_dict(indexers['idx']) == {}
