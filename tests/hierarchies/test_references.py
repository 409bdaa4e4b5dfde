from types import MappingProxyType
from typing import Any

import pytest

from kopf._kits.hierarchies import build_object_reference, build_owner_reference

NAMESPACED = {
    'apiVersion': 'kopf.dev/v1',
    'kind': 'KopfExample',
    'metadata': {'name': 'name1', 'namespace': 'ns1', 'uid': 'uid1', 'labels': {'key': 'val'}},
    'spec': {'field': 'value'},
}
CLUSTERED = {
    'apiVersion': 'kopf.dev/v1',
    'kind': 'KopfCluster',
    'metadata': {'name': 'name1', 'uid': 'uid1'},
}
CORE_WITHOUT_API_VERSION = {
    'kind': 'Node',
    'metadata': {'name': 'node1', 'uid': 'uid1'},
}
ALL_FIELDS = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'name': 'name1', 'uid': 'uid1'}


@pytest.mark.parametrize('body, kwargs, expected', [
    pytest.param(NAMESPACED, {}, {**ALL_FIELDS, 'controller': True, 'blockOwnerDeletion': True},
                 id='defaults-are-true-and-no-namespace'),
    pytest.param(NAMESPACED, {'controller': False, 'block_owner_deletion': False},
                 {**ALL_FIELDS, 'controller': False, 'blockOwnerDeletion': False}, id='flags-false'),
    pytest.param(NAMESPACED, {'controller': None, 'block_owner_deletion': None},
                 ALL_FIELDS, id='flags-none-omitted'),
    pytest.param(NAMESPACED, {'controller': True, 'block_owner_deletion': None},
                 {**ALL_FIELDS, 'controller': True}, id='only-controller'),
    pytest.param(CLUSTERED, {}, {**ALL_FIELDS, 'kind': 'KopfCluster', 'controller': True,
                                 'blockOwnerDeletion': True}, id='cluster-scoped'),
    pytest.param(CORE_WITHOUT_API_VERSION, {}, {'kind': 'Node', 'name': 'node1', 'uid': 'uid1',
                                                'controller': True, 'blockOwnerDeletion': True},
                 id='absent-api-version-omitted'),
    pytest.param(MappingProxyType(NAMESPACED), {},
                 {**ALL_FIELDS, 'controller': True, 'blockOwnerDeletion': True}, id='read-only-mapping'),
])
def test_owner_reference(body: Any, kwargs: dict[str, Any], expected: dict[str, Any]) -> None:
    reference = build_owner_reference(body, **kwargs)
    assert isinstance(reference, dict)
    assert reference == expected


@pytest.mark.parametrize('body, expected', [
    pytest.param(NAMESPACED, {**ALL_FIELDS, 'namespace': 'ns1'}, id='namespaced'),
    pytest.param(CLUSTERED, {**ALL_FIELDS, 'kind': 'KopfCluster'}, id='cluster-scoped'),
    pytest.param(CORE_WITHOUT_API_VERSION, {'kind': 'Node', 'name': 'node1', 'uid': 'uid1'},
                 id='absent-api-version-omitted'),
    pytest.param({'metadata': {'name': 'name1'}}, {'name': 'name1'}, id='only-name'),
    pytest.param({}, {}, id='empty'),
])
def test_object_reference(body: Any, expected: dict[str, Any]) -> None:
    reference = build_object_reference(body)
    assert isinstance(reference, dict)
    assert reference == expected


@pytest.mark.parametrize('body, error, match', [
    pytest.param({'metadata': {'name': 'name1'}}, ValueError, r'metadata\.uid', id='no-uid'),
    pytest.param({'metadata': {'uid': 'uid1'}}, ValueError, r'metadata\.name', id='no-name'),
    pytest.param({'metadata': {'name': 'name1', 'uid': ''}}, ValueError, r'metadata\.uid', id='empty-uid'),
    pytest.param({'kind': 'X'}, ValueError, r'metadata\.name and metadata\.uid', id='no-metadata'),
    pytest.param({'metadata': 'oops'}, TypeError, r'metadata must be a mapping', id='non-mapping-metadata'),
    pytest.param(['not', 'a', 'mapping'], TypeError, r'must be a mapping', id='non-mapping-body'),
    pytest.param(None, TypeError, r'must be a mapping', id='none'),
])
def test_owner_reference_of_bad_owners(body: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        build_owner_reference(body)


@pytest.mark.parametrize('body', [
    pytest.param(None, id='none'),
    pytest.param('a string', id='string'),
    pytest.param({'metadata': ['oops']}, id='non-mapping-metadata'),
])
def test_object_reference_of_bad_bodies(body: Any) -> None:
    with pytest.raises(TypeError, match=r'must be a mapping'):
        build_object_reference(body)


def test_owner_reference_is_a_copy() -> None:
    body = {'metadata': {'name': 'name1', 'uid': 'uid1'}}
    reference = build_owner_reference(body)
    reference['name'] = 'changed'
    assert body == {'metadata': {'name': 'name1', 'uid': 'uid1'}}
