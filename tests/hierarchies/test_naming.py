from typing import Any

import pytest

from kopf._kits.hierarchies import harmonize_naming


@pytest.mark.parametrize('metadata, name, forced, strict, expected', [
    pytest.param(None, 'parent', False, False, {'generateName': 'parent-'}, id='prefix'),
    pytest.param(None, 'parent', False, True, {'name': 'parent'}, id='strict'),
    pytest.param(None, 'parent-', False, False, {'generateName': 'parent-'}, id='prefix-with-a-dash'),
    pytest.param({'namespace': 'ns'}, 'parent', False, False, {'namespace': 'ns', 'generateName': 'parent-'},
                 id='other-fields-kept'),
    pytest.param({'name': 'mine'}, 'parent', False, False, {'name': 'mine'}, id='named-kept-for-prefix'),
    pytest.param({'name': 'mine'}, 'parent', False, True, {'name': 'mine'}, id='named-kept-for-strict'),
    pytest.param({'generateName': 'mine-'}, 'parent', False, False, {'generateName': 'mine-'},
                 id='prefixed-kept-for-prefix'),
    pytest.param({'generateName': 'mine-'}, 'parent', False, True, {'generateName': 'mine-'},
                 id='prefixed-kept-for-strict'),
    pytest.param({'name': 'mine'}, 'parent', True, True, {'name': 'parent'}, id='named-forced-strict'),
    pytest.param({'name': 'mine'}, 'parent', True, False, {'generateName': 'parent-'},
                 id='named-forced-to-prefix'),
    pytest.param({'generateName': 'mine-'}, 'parent', True, True, {'name': 'parent'},
                 id='prefixed-forced-to-strict'),
    pytest.param({'generateName': 'mine-'}, 'parent', True, False, {'generateName': 'parent-'},
                 id='prefixed-forced-to-prefix'),
    pytest.param({'name': 'mine', 'generateName': 'mine-'}, 'parent', True, False,
                 {'generateName': 'parent-'}, id='both-forced-to-prefix'),
])
def test_naming(flavour: Any, metadata: Any, name: str, forced: bool, strict: bool, expected: Any) -> None:
    obj = flavour.make('V1Pod', {} if metadata is None else {'metadata': metadata})
    harmonize_naming(obj, name, forced=forced, strict=strict)
    assert flavour.dump(obj) == {'metadata': expected}
    harmonize_naming(obj, name, forced=forced, strict=strict)  # idempotent
    assert flavour.dump(obj) == {'metadata': expected}


@pytest.mark.parametrize('kwargs, expected', [
    pytest.param({}, {'generateName': 'kopf-example-1-'}, id='prefix'),
    pytest.param({'name': None}, {'generateName': 'kopf-example-1-'}, id='none'),
    pytest.param({'strict': True}, {'name': 'kopf-example-1'}, id='strict'),
])
def test_implicit_name_of_the_owner(
        flavour: Any, handled: dict[str, Any], kwargs: Any, expected: Any,
) -> None:
    objs = [flavour.make('V1Pod', {}), flavour.make('V1Pod', {})]
    harmonize_naming(objs, **kwargs)
    assert [flavour.dump(obj) for obj in objs] == [{'metadata': expected}, {'metadata': expected}]


def test_docs_example_of_forced_strict_implicit_naming(handled: dict[str, Any]) -> None:
    objs: list[dict[str, Any]] = [{'kind': 'Job'}, {'kind': 'Deployment', 'metadata': {'name': 'x'}}]
    harmonize_naming(objs, forced=True, strict=True)
    assert objs == [
        {'kind': 'Job', 'metadata': {'name': 'kopf-example-1'}},
        {'kind': 'Deployment', 'metadata': {'name': 'kopf-example-1'}},
    ]


@pytest.mark.parametrize('name, error, match', [
    pytest.param('', ValueError, r'non-empty string', id='empty'),
    pytest.param(123, TypeError, r'must be a string, not int', id='non-string'),
])
def test_bad_names(name: Any, error: type[Exception], match: str) -> None:
    obj: dict[str, Any] = {}
    with pytest.raises(error, match=match):
        harmonize_naming(obj, name)
    assert obj == {}


def test_implicit_owner_without_a_name(handled: dict[str, Any]) -> None:
    del handled['metadata']['name']
    with pytest.raises(ValueError, match=r'no metadata\.name'):
        harmonize_naming({})
