from typing import Any

import pytest

from kopf._kits.hierarchies import append_owner_reference, remove_owner_reference

OWNER = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
         'metadata': {'name': 'owner1', 'namespace': 'ns1', 'uid': 'uid1'}}
REF = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'name': 'owner1', 'uid': 'uid1',
       'controller': True, 'blockOwnerDeletion': True}
OTHER = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': 'other', 'uid': 'uid2'}
SAME_UID = {'apiVersion': 'v0', 'kind': 'Renamed', 'name': 'renamed', 'uid': 'uid1', 'controller': False}


@pytest.mark.parametrize('metadata, kwargs, expected', [
    pytest.param(None, {}, {'ownerReferences': [REF]}, id='no-metadata'),
    pytest.param({}, {}, {'ownerReferences': [REF]}, id='empty-metadata'),
    pytest.param({'name': 'child'}, {}, {'name': 'child', 'ownerReferences': [REF]}, id='other-fields-kept'),
    pytest.param({'ownerReferences': [OTHER]}, {}, {'ownerReferences': [OTHER, REF]}, id='other-owners-kept'),
    pytest.param({'ownerReferences': [REF]}, {}, {'ownerReferences': [REF]}, id='already-there'),
    pytest.param({'ownerReferences': [SAME_UID]}, {}, {'ownerReferences': [SAME_UID]}, id='same-uid-kept'),
    pytest.param(None, {'controller': False, 'block_owner_deletion': False},
                 {'ownerReferences': [{**REF, 'controller': False, 'blockOwnerDeletion': False}]},
                 id='flags-false'),
    pytest.param(None, {'controller': None, 'block_owner_deletion': None},
                 {'ownerReferences': [{key: val for key, val in REF.items()
                                       if key not in {'controller', 'blockOwnerDeletion'}}]},
                 id='flags-none'),
])
def test_appending(flavour: Any, metadata: Any, kwargs: dict[str, Any], expected: Any) -> None:
    obj = flavour.make('V1Pod', {} if metadata is None else {'metadata': metadata})
    append_owner_reference(obj, OWNER, **kwargs)
    assert flavour.dump(obj) == {'metadata': expected}


@pytest.mark.parametrize('metadata, expected', [
    pytest.param(None, {}, id='no-metadata'),
    pytest.param({}, {'metadata': {}}, id='empty-metadata'),
    pytest.param({'ownerReferences': [REF]}, {'metadata': {'ownerReferences': []}}, id='the-only-one'),
    pytest.param({'ownerReferences': [OTHER, REF]}, {'metadata': {'ownerReferences': [OTHER]}},
                 id='one-of-two'),
    pytest.param({'ownerReferences': [OTHER]}, {'metadata': {'ownerReferences': [OTHER]}}, id='absent'),
    pytest.param({'ownerReferences': [SAME_UID, OTHER]}, {'metadata': {'ownerReferences': [OTHER]}},
                 id='matched-by-uid-only'),
])
def test_removing(flavour: Any, metadata: Any, expected: Any) -> None:
    obj = flavour.make('V1Pod', {} if metadata is None else {'metadata': metadata})
    remove_owner_reference(obj, OWNER)
    assert flavour.dump(obj) == expected


def test_appending_is_idempotent(flavour: Any) -> None:
    obj = flavour.make('V1Pod', {'metadata': {'ownerReferences': [OTHER]}})
    append_owner_reference(obj, OWNER)
    append_owner_reference(obj, OWNER)
    assert flavour.dump(obj) == {'metadata': {'ownerReferences': [OTHER, REF]}}


def test_appending_then_removing_restores(flavour: Any) -> None:
    obj = flavour.make('V1Pod', {'metadata': {'ownerReferences': [OTHER]}})
    append_owner_reference(obj, OWNER)
    remove_owner_reference(obj, OWNER)
    remove_owner_reference(obj, OWNER)
    assert flavour.dump(obj) == {'metadata': {'ownerReferences': [OTHER]}}


@pytest.mark.parametrize('wrap', [
    pytest.param(list, id='list'),
    pytest.param(tuple, id='tuple'),
    pytest.param(lambda objs: (obj for obj in objs), id='generator'),
])
def test_several_objects(flavour: Any, wrap: Any) -> None:
    objs = [flavour.make('V1Pod', {}), flavour.make('V1Pod', {'metadata': {'ownerReferences': [OTHER]}})]
    append_owner_reference(wrap(objs), OWNER)
    assert [flavour.dump(obj) for obj in objs] == [
        {'metadata': {'ownerReferences': [REF]}},
        {'metadata': {'ownerReferences': [OTHER, REF]}},
    ]
    remove_owner_reference(wrap(objs), OWNER)
    assert [flavour.dump(obj) for obj in objs] == [
        {'metadata': {'ownerReferences': []}},
        {'metadata': {'ownerReferences': [OTHER]}},
    ]


def test_implicit_owner(flavour: Any, handled: dict[str, Any]) -> None:
    obj = flavour.make('V1Pod', {})
    append_owner_reference(obj)
    assert flavour.dump(obj) == {'metadata': {'ownerReferences': [{
        'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'name': 'kopf-example-1', 'uid': 'uid-of-owner',
        'controller': True, 'blockOwnerDeletion': True,
    }]}}
    remove_owner_reference(obj)
    assert flavour.dump(obj) == {'metadata': {'ownerReferences': []}}


def test_explicit_owner_wins_over_implicit(handled: dict[str, Any]) -> None:
    obj: dict[str, Any] = {}
    append_owner_reference(obj, OWNER)
    assert obj == {'metadata': {'ownerReferences': [REF]}}


def test_dict_containers_are_modified_in_place() -> None:
    references = [OTHER]
    obj = {'metadata': {'ownerReferences': references}}
    append_owner_reference(obj, OWNER)
    assert obj['metadata']['ownerReferences'] is references
    remove_owner_reference(obj, OWNER)
    assert obj['metadata']['ownerReferences'] is references
    assert references == [OTHER]


def test_immutable_sequences_are_replaced() -> None:
    obj: dict[str, Any] = {'metadata': {'ownerReferences': (OTHER,)}}
    append_owner_reference(obj, OWNER)
    assert obj == {'metadata': {'ownerReferences': [OTHER, REF]}}
    remove_owner_reference(obj, OWNER)
    assert obj == {'metadata': {'ownerReferences': [OTHER]}}
