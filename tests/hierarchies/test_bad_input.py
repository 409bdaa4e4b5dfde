import subprocess
import sys
from types import MappingProxyType
from typing import Any

import pytest

from kopf._kits.hierarchies import (
    adjust_namespace,
    adopt,
    append_owner_reference,
    harmonize_naming,
    label,
    remove_owner_reference,
)

OWNER = {'apiVersion': 'v1', 'kind': 'X', 'metadata': {'name': 'owner1', 'namespace': 'ns1', 'uid': 'uid1'}}

# Every function with arguments that are valid except for the objects (and the owner, when used).
CALLS = [
    pytest.param(lambda objs, owner=OWNER: adopt(objs, owner), id='adopt'),
    pytest.param(lambda objs, owner=OWNER: append_owner_reference(objs, owner), id='append_owner_reference'),
    pytest.param(lambda objs, owner=OWNER: remove_owner_reference(objs, owner), id='remove_owner_reference'),
    pytest.param(lambda objs, owner=OWNER: label(objs, {'a': '1'}), id='label'),
    pytest.param(lambda objs, owner=OWNER: harmonize_naming(objs, 'name1'), id='harmonize_naming'),
    pytest.param(lambda objs, owner=OWNER: adjust_namespace(objs, 'ns1'), id='adjust_namespace'),
]


@pytest.mark.parametrize('call', CALLS)
@pytest.mark.parametrize('objs, match', [
    pytest.param('a string', r'unsupported type str', id='string'),
    pytest.param(b'bytes', r'unsupported type bytes', id='bytes'),
    pytest.param(123, r'unsupported type int', id='int'),
    pytest.param(None, r'unsupported type NoneType', id='none'),
    pytest.param(object(), r'unsupported type object', id='object'),
    pytest.param(MappingProxyType({}), r'immutable mappingproxy', id='immutable-mapping'),
    pytest.param([{}, 'a string'], r'objs\[1\] is of an unsupported type str', id='bad-item'),
    pytest.param([{}, [{}]], r'objs\[1\] is of an unsupported type list', id='nested-list'),
    pytest.param([{}, {'metadata': 'oops'}], r"objs\[1\]'s metadata must be", id='non-mapping-metadata'),
])
def test_unsupported_objects_change_nothing(call: Any, objs: Any, match: str) -> None:
    first_item_before = repr(objs[0]) if isinstance(objs, list) else None
    with pytest.raises(TypeError, match=match):
        call(objs)
    if isinstance(objs, list):
        assert repr(objs[0]) == first_item_before  # validated before modifying anything


@pytest.mark.parametrize('call', [param for param in CALLS if param.id in {
    'adopt', 'append_owner_reference', 'remove_owner_reference'}])
@pytest.mark.parametrize('owner, error, match', [
    pytest.param(['not', 'a', 'mapping'], TypeError, r'owner must be a mapping', id='non-mapping'),
    pytest.param({'metadata': 'oops'}, TypeError, r"owner's metadata must be a mapping", id='bad-metadata'),
    pytest.param({'metadata': {'name': 'owner1'}}, ValueError, r'metadata\.uid', id='no-uid'),
])
def test_bad_owners(call: Any, owner: Any, error: type[Exception], match: str) -> None:
    obj: dict[str, Any] = {}
    with pytest.raises(error, match=match):
        call(obj, owner)
    assert obj == {}


@pytest.mark.parametrize('call, param', [
    pytest.param(lambda: adopt({}), 'owner', id='adopt'),
    pytest.param(lambda: append_owner_reference({}), 'owner', id='append_owner_reference'),
    pytest.param(lambda: remove_owner_reference({}), 'owner', id='remove_owner_reference'),
    pytest.param(lambda: label({}), 'labels', id='label'),
    pytest.param(lambda: harmonize_naming({}), 'name', id='harmonize_naming'),
    pytest.param(lambda: adjust_namespace({}), 'namespace', id='adjust_namespace'),
])
def test_no_owner_outside_of_handlers(call: Any, param: str) -> None:
    match = rf'pass {param}= explicitly, or call this function inside a handler'
    with pytest.raises(LookupError, match=match):
        call()


@pytest.mark.parametrize('metadata, call, match', [
    pytest.param({'ownerReferences': 'oops'}, lambda obj: append_owner_reference(obj, OWNER),
                 r'ownerReferences must be a list', id='append-to-string'),
    pytest.param({'ownerReferences': {'uid': 'uid1'}}, lambda obj: remove_owner_reference(obj, OWNER),
                 r'ownerReferences must be a list', id='remove-from-mapping'),
    pytest.param({'labels': ['oops']}, lambda obj: label(obj, {'a': '1'}),
                 r'labels must be a mapping', id='labels-as-list'),
])
def test_bad_child_structures(metadata: Any, call: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        call({'metadata': metadata})


def test_models_without_metadata() -> None:
    client = pytest.importorskip('kubernetes.client')
    with pytest.raises(TypeError, match=r'V1PodSpec, which has no metadata'):
        label(client.V1PodSpec(containers=[]), {'a': '1'})


def test_pykube_objects_with_non_mapping_bodies() -> None:
    objects = pytest.importorskip('pykube.objects')
    with pytest.raises(TypeError, match=r'objs\.obj must be a mutable mapping'):
        label(objects.Pod(None, ['oops']), {'a': '1'})


def test_model_validation_errors_propagate(model_flavour: Any) -> None:
    # The owner lacks a kind & apiVersion: dicts accept it, but the real models require them.
    owner = {'metadata': {'name': 'owner1', 'uid': 'uid1'}}
    obj = model_flavour.make('V1Pod', {})
    if model_flavour.name == 'legacy-models':
        append_owner_reference(obj, owner)
        assert model_flavour.dump(obj) == {'metadata': {'ownerReferences': [
            {'name': 'owner1', 'uid': 'uid1', 'controller': True, 'blockOwnerDeletion': True}]}}
    else:
        with pytest.raises(ValueError):
            append_owner_reference(obj, owner)


def test_third_party_libraries_are_not_imported() -> None:
    code = (
        "import sys, kopf._kits.hierarchies; "
        "loaded = {'pykube', 'kubernetes', 'kubernetes_asyncio'} & set(sys.modules); "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, '-c', code], check=True)
