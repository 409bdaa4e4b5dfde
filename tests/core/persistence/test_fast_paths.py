"""
The persistence's fast paths, pinned to the general ones: for random objects, the same answers.

The handling cycles skip the general methods of the storages when the storages tell that those would
do nothing (``holds_no_records``, ``holds_no_touch``, both at once as ``holds_no_state``,
``holds_nothing_to_clear``), and the conventions
remember or shortcut what they compute. Here, every fast answer is compared with what the general path
computes, for random objects: random records of random storages (random prefixes and fields), touch
markers, Kopf's old status records, garbage in the storages' places, and the ReplicaSets' marked keys;
for every built-in storage class, their combinations, the custom storages that implement only
the general methods, and the descendants of the built-in ones that redefine some of them.

A built-in storage's answer must be exact (True exactly when the general path does nothing);
a custom storage's answer may be "maybe" (False), but never a wrong True.
"""
import copy
import json
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kopf._cogs.helpers import jsons
from kopf._cogs.structs import diffs
from kopf._cogs.structs.bodies import Body, BodyEssence
from kopf._cogs.structs.patches import Patch, apply_merge_patch
from kopf._core.persistence import conventions, diffbase, finalizers
from kopf._core.persistence.progress import (
    AnnotationsProgressStorage,
    MultiProgressStorage,
    ProgressRecord,
    ProgressStorage,
    SmartProgressStorage,
    StatusProgressStorage,
    holds_no_records,
    untouch,
    without_records,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#
# Custom storages: only the general methods, or the built-in ones with some general methods redefined.
#


class GeneralOnlyStorage(ProgressStorage):
    """A custom storage as documented: the general methods only; the records in its own annotations."""

    def __init__(self, prefix: str = 'custom.example.com') -> None:
        self.prefix = prefix

    def fetch(self, *, key: str, body: Body) -> ProgressRecord | None:
        encoded = conventions.annotations_of(body).get(f'{self.prefix}/{key.replace("/", ".")}')
        return None if encoded is None else json.loads(encoded)  # type: ignore[no-any-return]

    def store(self, *, key: str, record: ProgressRecord, body: Body, patch: Patch) -> None:
        patch.meta.annotations[f'{self.prefix}/{key.replace("/", ".")}'] = json.dumps(record)

    def purge(self, *, key: str, body: Body, patch: Patch) -> None:
        if f'{self.prefix}/{key.replace("/", ".")}' in conventions.annotations_of(body):
            patch.meta.annotations[f'{self.prefix}/{key.replace("/", ".")}'] = None

    def touch(self, *, body: Body, patch: Patch, value: str | None) -> None:
        if conventions.annotations_of(body).get(f'{self.prefix}/touch') != value:
            patch.meta.annotations[f'{self.prefix}/touch'] = value

    def clear(self, *, essence: BodyEssence) -> BodyEssence:
        cleared = copy.deepcopy(dict(essence))
        annotations = cleared.get('metadata', {}).get('annotations', {})
        for name in [name for name in annotations if name.startswith(f'{self.prefix}/')]:
            del annotations[name]
        self.remove_empty_stanzas(cleared)
        return cleared  # type: ignore[return-value]


class ElsewhereStorage(AnnotationsProgressStorage):
    """A descendant of a built-in storage that keeps its records elsewhere: the annotations tell nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.database: dict[str, ProgressRecord] = {'create_fn': {'started': 'elsewhere'}}

    def fetch(self, *, key: str, body: Body) -> ProgressRecord | None:
        return self.database.get(key)

    def purge(self, *, key: str, body: Body, patch: Patch) -> None:
        pass  # in the database on flush(); the general path is only asked here, not applied


class BatchingStorage(AnnotationsProgressStorage):
    """A descendant that batches its writes until flushed: the end of every cycle must flush it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


class ClearingStorage(StatusProgressStorage):
    """A descendant that also clears a field of its own from the essences."""

    def clear(self, *, essence: BodyEssence) -> BodyEssence:
        cleared = dict(super().clear(essence=essence))
        cleared.pop('secret', None)
        return cleared  # type: ignore[return-value]


class OwnTouchStorage(StatusProgressStorage):
    """A descendant with its own dummy field: touch() redefined, the rest as in the base."""

    def touch(self, *, body: Body, patch: Patch, value: str | None) -> None:
        if dict(body).get('spec', {}).get('touched') != value:
            patch.spec['touched'] = value


class NameMarkingStorage(AnnotationsProgressStorage):
    """A descendant whose keys depend on the object (as the ReplicaSets' do): they cannot be remembered."""

    def mark_key(self, key: str, *, body: Body) -> str:
        return f'{key}.{dict(body).get("spec", {}).get("x")}'


class OwnAnswerStorage(AnnotationsProgressStorage):
    """A descendant with its own (cautious) answer about the records: the answers derived from it follow."""

    def holds_no_records(self, *, keys: Collection[str], body: Body) -> bool:
        return False


BUILT_IN_CLASSES = {AnnotationsProgressStorage, StatusProgressStorage, MultiProgressStorage,
                    SmartProgressStorage, type(SmartProgressStorage().storages[1])}  # incl. the read-only one

#
# Random storages and objects.
#

PREFIXES = st.sampled_from([
    'kopf.zalando.org', 'my-op.example.com', 'sub.kopf.zalando.org', 'custom.example.com',
    'a-very-long-prefix-of-some-operator-that-goes-on.example.com',  # the V1 keys are cut oddly then
]) | st.from_regex(r'[a-z]{1,6}(\.[a-z]{1,6}){0,2}', fullmatch=True)
IDS = st.sampled_from([
    'create_fn', 'update_fn', 'delete_fn', 'parent/child', 'parent/child/grandchild',
    'field_fn/spec.field', 'x' * 46, 'y' * 47, 'z' * 70, 'long-parent-' + 'p' * 60 + '/child',
]) | st.text(alphabet='abz_-./~', min_size=1, max_size=80)
NAMES = st.sampled_from(['kopf', 'my-op'])
FIELDS = st.sampled_from([
    'status.{name}.progress', 'status.{name}', 'status.progress', 'status.{name}.dummy', 'spec.records',
    ('status', 'a.b'), 'metadata.annotations',  # odd, but allowed: the records among the annotations
])
TOUCH_FIELDS = st.sampled_from(['status.{name}.dummy', 'status.dummy', 'status.{name}.progress', 'spec.x'])
TOUCH_KEYS = st.sampled_from(['touch-dummy', 'touched', 'create_fn', 'w' * 70])
JSON_SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | st.text(alphabet='ab{}"', max_size=4)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text('abk', max_size=3), children,
                                                                        max_size=3),
    max_leaves=6,
)

annotations_storages = st.builds(AnnotationsProgressStorage, prefix=PREFIXES, verbose=st.booleans(),
                                 touch_key=TOUCH_KEYS, v1=st.booleans())
status_storages = st.builds(StatusProgressStorage, name=NAMES, field=FIELDS, touch_field=TOUCH_FIELDS)
smart_storages = st.builds(SmartProgressStorage, name=NAMES, field=FIELDS, touch_field=TOUCH_FIELDS,
                           touch_key=TOUCH_KEYS, prefix=PREFIXES, v1=st.booleans(), verbose=st.booleans())
built_in_leaves = annotations_storages | status_storages | smart_storages | st.just(SmartProgressStorage())
custom_leaves = st.one_of(
    st.builds(GeneralOnlyStorage, prefix=PREFIXES),
    st.builds(ElsewhereStorage),
    st.builds(BatchingStorage, prefix=PREFIXES),
    st.builds(ClearingStorage, field=FIELDS),
    st.builds(OwnTouchStorage, field=FIELDS),
    st.builds(NameMarkingStorage, prefix=PREFIXES, touch_key=TOUCH_KEYS, v1=st.booleans()),
    st.builds(OwnAnswerStorage, prefix=PREFIXES),
)
any_leaves = built_in_leaves | custom_leaves
multi_storages = st.lists(any_leaves, min_size=1, max_size=3).map(MultiProgressStorage)
any_storages = st.one_of(
    any_leaves,
    multi_storages,
    st.lists(any_leaves | multi_storages, min_size=1, max_size=2).map(MultiProgressStorage),  # nested
    st.just(MultiProgressStorage([])),
)
records = st.fixed_dictionaries({}, optional={
    'started': st.just('2020-01-01T00:00:00+00:00'), 'purpose': st.sampled_from(['create', 'update']),
    'retries': st.integers(0, 3), 'success': st.booleans(), 'failure': st.booleans(),
    'message': st.none() | st.text(max_size=5), 'subrefs': st.lists(IDS, max_size=2),
})


def is_built_in(storage: ProgressStorage) -> bool:
    if type(storage) not in BUILT_IN_CLASSES:
        return False
    return all(is_built_in(part) for part in getattr(storage, 'storages', ()))


def leaves(storage: ProgressStorage) -> list[ProgressStorage]:
    if isinstance(storage, MultiProgressStorage):
        return [leaf for part in storage.storages for leaf in leaves(part)]
    return [storage]


@st.composite
def objects(draw: st.DrawFn, storage: ProgressStorage, keys: Collection[str]) -> dict[str, Any]:
    """
    An object as written by random storages (often the asked one), with garbage and noise around.

    The records are written by the storages themselves (incl. the asked one and its parts), so that
    the asked keys are often there; other storages (other prefixes & fields) write their own records.
    """
    raw: dict[str, Any] = {'apiVersion': 'v1', 'metadata': {'name': 'n', 'uid': 'u'}, 'spec': {'x': 1}}
    if draw(st.booleans()):  # the keys are marked on the ReplicaSets of Deployments
        raw['kind'] = 'ReplicaSet'
        raw['metadata']['ownerReferences'] = [{'kind': draw(st.sampled_from(['Deployment', 'StatefulSet']))}]
    writers = draw(st.lists(built_in_leaves, max_size=2))
    writers += [leaf for leaf in leaves(storage) if draw(st.integers(0, 3))]  # mostly, the asked one
    for writer in writers:
        patch = Patch()
        body = Body(copy.deepcopy(raw))
        try:
            for key in draw(st.lists(st.sampled_from([*keys, 'other_fn']), min_size=1, max_size=3)):
                writer.store(key=key, record=draw(records), body=body, patch=patch)
            writer.touch(body=body, patch=patch, value=draw(st.sampled_from(['x', '2020', None])))
        except (TypeError, ValueError):  # e.g. a field inside another storage's serialised records
            continue
        raw = apply_merge_patch(raw, json.loads(json.dumps(patch)))
    if draw(st.booleans()):  # Kopf's old status records, as the smart storage reads them
        raw.setdefault('status', {}).setdefault('kopf', {})['progress'] = {
            key: draw(records) for key in draw(st.lists(st.sampled_from([*keys, 'other_fn']), max_size=2))}
    # Noise and garbage: odd values in the storages' places, other annotations, other status fields.
    annotations = raw.setdefault('metadata', {}).setdefault('annotations', {})
    for _ in range(draw(st.integers(0, 3))):
        prefix, key = draw(PREFIXES), draw(st.sampled_from([*keys, 'touch-dummy', 'kopf-managed']))
        annotations[f'{prefix}/{key}'] = draw(st.sampled_from(['null', '{}', '{broken', '"str"', '[]', 'x']))
    for _ in range(draw(st.integers(0, 2))):
        path = draw(st.sampled_from([('status',), ('status', 'kopf'), ('status', 'kopf', 'progress'),
                                     ('status', 'my-op'), ('spec', 'records'), ('status', 'dummy')]))
        target = raw
        for step in path[:-1]:
            target = target.setdefault(step, {}) if isinstance(target.get(step, {}), dict) else {}
        target[path[-1]] = draw(JSON_VALUES)
    if not annotations and draw(st.booleans()):
        del raw['metadata']['annotations']
    return raw


def general_holds_no_records(storage: ProgressStorage, *, keys: Collection[str], body: Body) -> bool:
    """Nothing to fetch, nothing to purge: as the general methods tell it."""
    for key in keys:
        try:
            if storage.fetch(key=key, body=body) is not None:
                return False
        except ValueError:  # an unreadable record is a record too (it is reported, then purged)
            return False
        patch = Patch()
        storage.purge(key=key, body=body, patch=patch)
        if patch:
            return False
    return True


def flushes_of(storage: ProgressStorage) -> list[int]:
    return [leaf.flushes for leaf in leaves(storage) if isinstance(leaf, BatchingStorage)]


#
# The progress storages' fast answers.
#


@SETTINGS
@given(st.data(), any_storages, st.lists(IDS, min_size=1, max_size=4))
def test_records_are_absent_exactly_when_the_general_path_finds_none(
        data: st.DataObject, storage: ProgressStorage, keys: list[str],
) -> None:
    body = Body(data.draw(objects(storage, keys)))
    fast = storage.holds_no_records(keys=keys, body=body)
    general = general_holds_no_records(storage, keys=keys, body=body)
    event(f'built-in={is_built_in(storage)}, fast={fast}, general={general}')
    assert holds_no_records(storage, keys=keys, body=body) is fast
    if is_built_in(storage):
        assert fast == general, f'the fast answer {fast} differs from the general path for {storage!r}'
    else:
        assert general or not fast, f'no records assumed, but the general path finds some for {storage!r}'


@SETTINGS
@given(st.data(), any_storages, st.lists(IDS, min_size=1, max_size=4), st.booleans())
def test_no_state_is_no_records_and_no_touch(
        data: st.DataObject, storage: ProgressStorage, keys: list[str], as_tuple: bool,
) -> None:
    body = Body(data.draw(objects(storage, keys)))
    if data.draw(st.booleans()):
        body['spec']['x'] = data.draw(st.integers(0, 2))  # another object for the keys that depend on it
    asked: Collection[str] = tuple(keys) if as_tuple else keys  # the listings ask with tuples
    fast = storage.holds_no_state(keys=asked, body=body)
    again = storage.holds_no_state(keys=asked, body=body)  # remembered now, if it is remembered at all
    records, touch = storage.holds_no_records(keys=keys, body=body), storage.holds_no_touch(body=body)
    untouched = Patch()
    storage.touch(body=body, patch=untouched, value=None)
    event(f'built-in={is_built_in(storage)}, fast={fast}, records={records}, touch={touch}')
    assert again is fast
    if is_built_in(storage):
        assert fast == (records and touch), f'the fast answer {fast} differs from the two for {storage!r}'
    if fast:  # never a wrong "nothing": neither for the built-in storages, nor for the custom ones
        assert general_holds_no_records(storage, keys=keys, body=body), f'records for {storage!r}'
        assert not untouched, f'a touch for {storage!r}'


@pytest.mark.parametrize('storage, raw', [
    pytest.param(NameMarkingStorage(), {'kind': 'KopfExample', 'spec': {'x': 1}},
                 id='marked-by-a-descendant'),
    pytest.param(AnnotationsProgressStorage(), {
        'kind': 'ReplicaSet', 'metadata': {'ownerReferences': [{'kind': 'Deployment'}]},
    }, id='a-replicaset-of-a-deployment'),
])
@pytest.mark.parametrize('key', ['create_fn', 'touch-dummy'])
def test_no_state_is_known_by_the_keys_of_each_object_where_they_depend_on_it(
        storage: AnnotationsProgressStorage, raw: dict[str, Any], key: str,
) -> None:
    # E.g. one object of another kind first: its keys, if remembered, would not be this object's keys.
    assert storage.holds_no_state(keys=('create_fn',), body=Body({'kind': 'Pod', 'spec': {'x': 2}}))
    body = Body(copy.deepcopy(raw))
    patch = Patch()
    if key == 'touch-dummy':
        storage.touch(body=body, patch=patch, value='x')
    else:
        storage.store(key=key, record={'started': '2020-01-01T00:00:00+00:00'}, body=body, patch=patch)
    body = Body(apply_merge_patch(copy.deepcopy(raw), json.loads(json.dumps(patch))))
    assert all(name.startswith('kopf.zalando.org/') for name in patch['metadata']['annotations'])
    assert not storage.holds_no_state(keys=('create_fn',), body=body)
    assert not storage.holds_no_state(keys=('create_fn',), body=body)  # also when remembered


@SETTINGS
@given(st.data(), any_storages)
def test_untouching_is_touching_with_none_then_flushing(
        data: st.DataObject, storage: ProgressStorage,
) -> None:
    body = Body(data.draw(objects(storage, ['create_fn'])))
    fast = storage.holds_no_touch(body=body)

    before = flushes_of(storage)
    expected = Patch()
    storage.touch(body=body, patch=expected, value=None)
    storage.flush()
    general_flushes = [after - was for after, was in zip(flushes_of(storage), before, strict=True)]

    before = flushes_of(storage)
    actual = Patch()
    untouch(storage, body=body, patch=actual)
    fast_flushes = [after - was for after, was in zip(flushes_of(storage), before, strict=True)]

    event(f'built-in={is_built_in(storage)}, fast={fast}, touched={bool(expected)}')
    assert actual == expected and actual.fns == expected.fns
    assert fast_flushes == general_flushes
    if is_built_in(storage):
        assert fast == (not expected), f'the fast answer {fast} differs from the general path for {storage!r}'
    else:
        assert not expected or not fast, f'nothing to untouch assumed, but there is for {storage!r}'


@st.composite
def essences(draw: st.DrawFn) -> dict[str, Any]:
    """The essences as built by the diff-base storages, and odd ones: empty stanzas, records in them."""
    essence: dict[str, Any] = {}
    if draw(st.booleans()):
        essence['spec'] = draw(JSON_VALUES)
    if draw(st.booleans()):
        essence['secret'] = 'x'
    if draw(st.booleans()):
        metadata: dict[str, Any] = {}
        essence['metadata'] = metadata
        if draw(st.booleans()):
            metadata['labels'] = draw(st.dictionaries(st.sampled_from(['a', 'b']), st.just('v'), max_size=2))
        if draw(st.booleans()):
            names = st.builds('{}/{}'.format, PREFIXES, IDS) | st.sampled_from(['a', 'b/c'])
            metadata['annotations'] = draw(st.dictionaries(names, st.just('{}'), max_size=3))
    if draw(st.booleans()):
        essence['status'] = draw(st.one_of(
            JSON_VALUES,
            st.fixed_dictionaries({}, optional={'kopf': st.fixed_dictionaries({}, optional={
                'progress': JSON_VALUES, 'dummy': JSON_VALUES}), 'my-op': JSON_VALUES, 'other': JSON_VALUES}),
        ))
    return essence


@SETTINGS
@given(any_storages, essences() | st.builds(lambda raw: diffbase.AnnotationsDiffBaseStorage().build(
    body=Body(raw), extra_fields=['status']), essences()))
def test_clearing_without_copies_is_the_same_as_clearing(storage: ProgressStorage, essence: Any) -> None:
    original = copy.deepcopy(essence)
    fast = storage.holds_nothing_to_clear(essence=essence)
    result = without_records(storage, essence=essence)
    event(f'fast={fast}, cleared={result != essence}')
    assert result == storage.clear(essence=copy.deepcopy(essence))
    assert essence == original, 'the original essence is modified'
    if fast:
        assert result is essence
        assert storage.clear(essence=essence) == essence, f'nothing to clear assumed, but is: {storage!r}'


@SETTINGS
@given(st.data(), any_storages, IDS)
def test_the_unreadable_records_are_located(data: st.DataObject, storage: ProgressStorage, key: str) -> None:
    body = Body(data.draw(objects(storage, [key])))
    try:
        found = storage.fetch(key=key, body=body) is not None
    except ValueError:
        found = True
    location = storage.locate(key=key, body=body)
    if found and all(type(leaf) in BUILT_IN_CLASSES for leaf in leaves(storage)):
        assert location is not None, f'a record is fetched, but not located by {storage!r}'
    if location is None:
        return
    where, value = location
    assert where.startswith(('The annotation ', 'The field ')) and value is not None


@given(st.sampled_from([GeneralOnlyStorage, ElsewhereStorage, BatchingStorage, ClearingStorage,
                        OwnTouchStorage, NameMarkingStorage, OwnAnswerStorage]))
def test_the_redefined_general_methods_get_the_default_answers(cls: type[ProgressStorage]) -> None:
    # Not a property, but the premise of the properties above: which answers are derived from what.
    redefined = {name for name in ['fetch', 'purge', 'touch', 'flush', 'clear', 'holds_no_records',
                                   'holds_no_touch'] if name in cls.__dict__}
    answers = {'holds_no_records': {'fetch', 'purge'}, 'holds_no_touch': {'touch', 'flush'},
               'holds_nothing_to_clear': {'clear'},
               'holds_no_state': {'fetch', 'purge', 'touch', 'flush', 'holds_no_records', 'holds_no_touch'}}
    base = cls.__mro__[1]  # a built-in storage, or the interface itself
    for answer, general in answers.items():
        if answer in cls.__dict__:
            continue  # its own answer: kept as it is
        expected = getattr(ProgressStorage, answer) if general & redefined else getattr(base, answer)
        assert getattr(cls, answer) is expected, f'{cls.__name__}.{answer}'


#
# The conventions' fast paths: remembered keys, the skipped marking, the skipped cleaning, the copies.
#

BODIES_TO_MARK = st.sampled_from([
    {}, {'kind': 'Pod'}, {'kind': 'ReplicaSet'}, {'kind': 'ReplicaSet', 'metadata': {}},
    {'kind': 'ReplicaSet', 'metadata': {'ownerReferences': [{'kind': 'Deployment'}]}},
    {'kind': 'ReplicaSet', 'metadata': {'ownerReferences': [{'kind': 'StatefulSet'},
                                                            {'kind': 'Deployment'}]}},
    {'kind': 'Pod', 'metadata': {'ownerReferences': [{'kind': 'Deployment'}]}},
])


class MarkingEverything(AnnotationsProgressStorage):
    def mark_key(self, key: str, *, body: Body) -> str:
        return key + '-marked'


def general_keys(storage: AnnotationsProgressStorage, key: str, body: Body | None) -> tuple[str, ...]:
    """The keys as the key-forming convention defines them: never remembered, every key marked anew."""
    marked = storage.mark_key(key, body=body) if body is not None else key
    v2_key = storage.make_v2_key(marked)
    if not storage.v1:
        return (v2_key,)
    v1_key = storage.make_v1_key(marked)
    return (v2_key,) if v1_key == v2_key else (v2_key, v1_key)


@SETTINGS
@given(PREFIXES, st.booleans(), st.lists(IDS, min_size=1, max_size=5), st.none() | BODIES_TO_MARK,
       st.sampled_from([AnnotationsProgressStorage, MarkingEverything, diffbase.AnnotationsDiffBaseStorage]))
def test_remembered_keys_are_the_same_as_formed_anew(
        prefix: str, v1: bool, keys: list[str], raw: dict[str, Any] | None, cls: Callable[..., Any],
) -> None:
    storage = cls(prefix=prefix, v1=v1)
    body = Body(raw) if raw is not None else None
    for key in [*keys, *keys]:  # the second time, remembered
        assert tuple(storage.make_keys(key, body=body)) == general_keys(storage, key, body)
    for prefix_, v1_ in [(prefix, not v1), ('changed.example.com', not v1)]:  # changed later, one by one
        storage.prefix, storage.v1 = prefix_, v1_
        for key in keys:
            assert tuple(storage.make_keys(key, body=body)) == general_keys(storage, key, body)


@SETTINGS
@given(essences() | st.dictionaries(st.sampled_from(['metadata', 'status', 'spec']), JSON_VALUES))
def test_empty_stanzas_are_detected_whenever_they_would_be_removed(essence: dict[str, Any]) -> None:
    cleaned = copy.deepcopy(essence)
    conventions.StorageStanzaCleaner.remove_empty_stanzas(cleaned)
    detected = conventions.StorageStanzaCleaner.has_empty_stanzas(essence)
    if not detected:
        assert cleaned == essence
    if essence.get('metadata') is None or type(essence['metadata']) is dict:  # exact for the usual essences
        assert detected == (cleaned != essence)


@SETTINGS
@given(essences(), st.lists(st.sampled_from(['status', 'kopf', 'progress', 'spec', 'x', 'metadata']),
                            min_size=1, max_size=4))
def test_removal_along_a_path_leaves_the_original_intact(essence: dict[str, Any], path: list[str]) -> None:
    # The general definition: the field removed, then the dicts on its path left empty (deepest first).
    expected = copy.deepcopy(essence)
    parents = [expected]
    for step in path[:-1]:
        child = parents[-1].get(step)
        if not isinstance(child, dict):
            break
        parents.append(child)
    else:
        parents[-1].pop(path[-1], None)
    for depth in range(len(parents) - 1, 0, -1):
        if parents[depth]:
            break
        del parents[depth - 1][path[depth - 1]]
    original = copy.deepcopy(essence)
    shallow = dict(essence)
    conventions.remove_along(shallow, path)
    assert shallow == expected
    assert essence == original


# The mappings other than dicts (e.g. views) are copied as JSON objects too.
JSON_WITH_MAPPINGS = st.recursive(
    JSON_SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text('abk', max_size=3), children,
                                                                        max_size=3).map(MappingProxyType),
    max_leaves=6,
) | JSON_VALUES


@SETTINGS
@given(JSON_WITH_MAPPINGS)
def test_fast_copies_are_the_deep_copies(value: Any) -> None:
    # The general twin: a deep copy of JSON data (the views and other mappings become dicts).
    expected = json.loads(json.dumps(value, default=dict))
    recursive = conventions._copy_json_recursively(value)
    iterative = conventions._copy_json_iteratively(value)
    assert json.dumps(recursive) == json.dumps(iterative) == json.dumps(expected)  # the order of keys too
    assert recursive == iterative == expected
    assert not _shares_containers(recursive, value) and not _shares_containers(iterative, value)


def _shares_containers(copied: Any, original: Any) -> bool:
    if isinstance(original, (dict, list, MappingProxyType)) and copied is original:
        return True
    if isinstance(original, Mapping):
        return any(_shares_containers(copied[key], item) for key, item in original.items())
    if isinstance(original, list):
        return any(_shares_containers(c, o) for c, o in zip(copied, original, strict=True))
    return False


@SETTINGS
@given(JSON_VALUES | st.integers(), st.booleans())
def test_remembered_parsing_is_the_same_as_parsing(value: Any, twice: bool) -> None:
    text = json.dumps(value, separators=(',', ':'))
    first = conventions.decode_json(text)
    if twice:  # the remembered one is given as a copy: the changes of the first do not leak
        if isinstance(first, dict):
            first['mutated'] = True
        elif isinstance(first, list):
            first.append('mutated')
    assert conventions.decode_json(text) == json.loads(text)
    assert conventions.copy_json(conventions._parse_json(text)) == json.loads(text)  # without orjson


ANNOTATION_NAMES = st.builds('{}/{}'.format, PREFIXES, st.sampled_from(['kopf-managed', 'x', 'fn'])) | \
    st.sampled_from(['kubectl.kubernetes.io/last-applied-configuration', 'plain', 'a/b/c'])


@SETTINGS
@given(st.dictionaries(ANNOTATION_NAMES, st.just('v'), max_size=5))
def test_annotations_of_the_essences_are_filtered_by_the_general_rule(annotations: dict[str, str]) -> None:
    storage = diffbase.AnnotationsDiffBaseStorage()
    marked = storage.detect_marked_prefixes(annotations)
    expected = {key: value for key, value in annotations.items()
                if not diffbase.is_system_annotation(key, marked)}
    assert storage._remove_system_annotations(annotations) == expected


METADATA_WITH_FINALIZERS = st.fixed_dictionaries({}, optional={
    'deletionTimestamp': st.none() | st.just('2020'),
    'finalizers': JSON_VALUES | st.lists(st.sampled_from([finalizers.DEFAULT_FINALIZER, 'other'])),
})


@SETTINGS
@given(st.fixed_dictionaries({}, optional={'metadata': JSON_VALUES | METADATA_WITH_FINALIZERS}),
       st.booleans())
def test_the_shortcuts_to_the_metadata_are_the_resolved_fields(raw: dict[str, Any], view: bool) -> None:
    from kopf._cogs.structs import dicts
    body: Any = Body(raw) if view else raw
    stored = dicts.resolve(raw, ('metadata', 'finalizers'), None)
    assert finalizers.finalizers_of(body) == (list(stored) if isinstance(stored, list) else [])
    assert finalizers.is_deletion_ongoing(body) == (
        dicts.resolve(raw, ('metadata', 'deletionTimestamp'), None) is not None)
    assert finalizers.is_deletion_blocked(body, finalizers.DEFAULT_FINALIZER) == (
        isinstance(stored, list) and finalizers.DEFAULT_FINALIZER in stored)


#
# The diff-bases' fast answer: an object's essence surely unchanged (the dismissal of the listed objects).
#


class StatusEssenceStorage(diffbase.AnnotationsDiffBaseStorage):
    """A descendant that builds the essences otherwise: with the status (so, other essences are stored)."""

    def build(self, *, body: Body, extra_fields: Any = None) -> BodyEssence:
        essence = dict(super().build(body=body, extra_fields=extra_fields))
        if 'status' in body:
            essence['status'] = copy.deepcopy(body['status'])
        return essence  # type: ignore[return-value]


# The values that are equal in Python but not in their JSON (nor in the diffs), non-ASCII texts, big integers.
ESSENTIAL_SCALARS = (JSON_SCALARS | st.sampled_from([1, 1.0, True, 0, 0.0, False, 1e16, 2**70, 'ä', '\u2603'])
                     | st.floats(allow_nan=False, allow_infinity=False))
ESSENTIAL_VALUES = st.recursive(
    ESSENTIAL_SCALARS,
    lambda children: (st.lists(children, max_size=3) |
                      st.dictionaries(st.sampled_from('abk'), children, max_size=3)),
    max_leaves=6,
)


@st.composite
def stateful_objects(draw: st.DrawFn) -> dict[str, Any]:
    """An object with random essential fields, labels, annotations (others' and kubectl's), and a status."""
    metadata: dict[str, Any] = {'name': 'n', 'uid': 'u', 'resourceVersion': draw(st.sampled_from(['1', '2']))}
    raw: dict[str, Any] = {'apiVersion': 'v1', 'kind': draw(st.sampled_from(['KopfExample', 'ReplicaSet'])),
                           'metadata': metadata}
    if draw(st.booleans()):
        metadata['ownerReferences'] = [{'kind': 'Deployment'}]
    if draw(st.booleans()):
        metadata['labels'] = draw(st.dictionaries(st.sampled_from(['a', 'b']), st.sampled_from(['v', 'w']),
                                                  max_size=2))
    if draw(st.booleans()):
        metadata['annotations'] = draw(st.dictionaries(ANNOTATION_NAMES, st.sampled_from(['v', 'w']),
                                                       max_size=3))
    for field in draw(st.lists(st.sampled_from(['spec', 'data', 'status']), unique=True)):
        raw[field] = draw(ESSENTIAL_VALUES)
    return raw


@SETTINGS
@given(st.data(), stateful_objects(), st.sampled_from(['this', 'other', 'text']),
       st.sampled_from(['plain', 'prefixed', 'ignoring', 'descendant']), st.none() | st.just(['status.a']))
def test_a_surely_unchanged_essence_has_no_diff_from_the_stored_one(
        data: st.DataObject, raw: dict[str, Any], stored: str, variant: str, extra_fields: list[str] | None,
) -> None:
    storage = (diffbase.AnnotationsDiffBaseStorage() if variant == 'plain' else
               diffbase.AnnotationsDiffBaseStorage(prefix=data.draw(PREFIXES), v1=data.draw(st.booleans()))
               if variant == 'prefixed' else
               diffbase.AnnotationsDiffBaseStorage(ignored_fields=['spec.a']) if variant == 'ignoring' else
               StatusEssenceStorage())
    # The diff-base as stored for this object (twice: the 1st store may add a marker to the essence),
    # or for another state of it (values equal in Python, not in JSON; another status or labels), or a text.
    source = raw
    if stored == 'other':
        change = data.draw(st.sampled_from(['retyped', 'status', 'labels']))
        if change == 'retyped':
            raw['spec'] = {'k': data.draw(st.sampled_from([1, 1.0, True]))}
        elif change == 'status':
            raw['status'] = {'a': data.draw(ESSENTIAL_VALUES)}
        source = copy.deepcopy(raw)
        if change == 'retyped':
            source['spec'] = {'k': data.draw(st.sampled_from([1, 1.0, True]))}
        elif change == 'status':
            del source['status']
        else:
            source['metadata']['labels'] = {'a': data.draw(st.sampled_from(['v', 'x']))}
    for _ in range(2 if stored != 'text' else 0):
        patch = Patch()
        essence = storage.build(body=Body(source), extra_fields=extra_fields)
        storage.store(body=Body(source), patch=patch, essence=essence)
        annotations = {**raw['metadata'].get('annotations', {}), **patch.meta.annotations}
        raw['metadata']['annotations'] = annotations
        if stored == 'this':
            source = raw
    if stored == 'text':
        key = data.draw(st.sampled_from(list(storage.make_keys(storage.key, body=Body(raw)))))
        essence = storage.build(body=Body(raw), extra_fields=extra_fields)
        raw['metadata'].setdefault('annotations', {})[key] = data.draw(st.sampled_from([
            'null\n', '{}\n', '{broken\n', '[]\n', json.dumps(essence) + '\n',  # with spaces
            json.dumps(essence, separators=(',', ':'), ensure_ascii=False) + '\n',  # non-ASCII as it is
            json.dumps(essence, separators=(',', ':')),  # no newline
        ]))

    body = Body(raw)
    sure = storage.surely_unchanged(body=body, extra_fields=extra_fields)
    try:
        old = storage.fetch(body=body)
    except ValueError:
        old = None
    new = storage.build(body=body, extra_fields=extra_fields)
    unchanged = type(old) is dict and not diffs.diff(old, new)
    event(f'sure={sure}, unchanged={unchanged}, stored={stored}')
    if sure:
        assert unchanged, (old, new)

    # And it is sure where it is used: the built-in storage, the essences that the framework stored itself.
    # (Not for non-ASCII texts, stored with escapes; nor for the floats that the native JSON writes apart.)
    same_json = jsons.ACCELERATED and conventions.encode_json(new) == jsons.dumps(new).decode()
    if stored == 'this' and variant in ['plain', 'prefixed'] and not extra_fields and same_json:
        assert sure
