from typing import Any

import pytest

from kopf._kits.hierarchies import adjust_namespace


@pytest.mark.parametrize('metadata, namespace, forced, expected', [
    pytest.param(None, 'ns1', False, {'metadata': {'namespace': 'ns1'}}, id='absent'),
    pytest.param({'name': 'x'}, 'ns1', False, {'metadata': {'name': 'x', 'namespace': 'ns1'}},
                 id='others-kept'),
    pytest.param({'namespace': 'mine'}, 'ns1', False, {'metadata': {'namespace': 'mine'}},
                 id='existing-kept'),
    pytest.param({'namespace': 'mine'}, 'ns1', True, {'metadata': {'namespace': 'ns1'}},
                 id='existing-forced'),
    pytest.param({'namespace': 'ns1'}, 'ns1', True, {'metadata': {'namespace': 'ns1'}}, id='same-forced'),
])
def test_namespacing(flavour: Any, metadata: Any, namespace: str, forced: bool, expected: Any) -> None:
    obj = flavour.make('V1Pod', {} if metadata is None else {'metadata': metadata})
    adjust_namespace(obj, namespace, forced=forced)
    assert flavour.dump(obj) == expected
    adjust_namespace(obj, namespace, forced=forced)  # idempotent
    assert flavour.dump(obj) == expected


@pytest.mark.parametrize('kwargs', [
    pytest.param({}, id='omitted'),
    pytest.param({'namespace': None}, id='none'),
])
def test_implicit_namespace_of_the_owner(flavour: Any, handled: dict[str, Any], kwargs: Any) -> None:
    objs = [flavour.make('V1Pod', {}), flavour.make('V1Pod', {'metadata': {'namespace': 'mine'}})]
    adjust_namespace(objs, **kwargs)
    assert [flavour.dump(obj) for obj in objs] == [
        {'metadata': {'namespace': 'default'}},
        {'metadata': {'namespace': 'mine'}},
    ]
    adjust_namespace(objs, forced=True, **kwargs)
    assert [flavour.dump(obj) for obj in objs] == [
        {'metadata': {'namespace': 'default'}},
        {'metadata': {'namespace': 'default'}},
    ]


@pytest.mark.parametrize('forced', [False, True])
def test_cluster_scoped_owner_changes_nothing(flavour: Any, handled: dict[str, Any], forced: bool) -> None:
    del handled['metadata']['namespace']
    objs = [flavour.make('V1Pod', {}), flavour.make('V1Pod', {'metadata': {'namespace': 'mine'}})]
    adjust_namespace(objs, forced=forced)
    assert [flavour.dump(obj) for obj in objs] == [{}, {'metadata': {'namespace': 'mine'}}]


def test_bad_namespace() -> None:
    with pytest.raises(TypeError, match=r'namespace must be a string'):
        adjust_namespace({}, 123)  # type: ignore[arg-type]


@pytest.mark.parametrize('forced', [False, True])
def test_empty_namespace_means_none(flavour: Any, forced: bool) -> None:
    # Kubernetes treats "" as "no namespace" (cluster-scoped), so there is nothing to put.
    obj = flavour.make('V1Pod', {'metadata': {'namespace': 'mine'}})
    adjust_namespace(obj, '', forced=forced)
    assert flavour.dump(obj) == {'metadata': {'namespace': 'mine'}}
