"""The three patch formats, as functions and over HTTP."""

import copy
from typing import Any

import pytest

from kopf.testing.emulator.patches import (
    PatchApplicationError,
    PatchFormatError,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
)

CMS = '/api/v1/namespaces/default/configmaps'
PODS = '/api/v1/namespaces/default/pods'


# Examples from RFC 7386, Appendix A.
@pytest.mark.parametrize(
    'target, patch, expected',
    [
        ({'a': 'b'}, {'a': 'c'}, {'a': 'c'}),
        ({'a': 'b'}, {'b': 'c'}, {'a': 'b', 'b': 'c'}),
        ({'a': 'b'}, {'a': None}, {}),
        ({'a': 'b', 'b': 'c'}, {'a': None}, {'b': 'c'}),
        ({'a': ['b']}, {'a': 'c'}, {'a': 'c'}),
        ({'a': 'c'}, {'a': ['b']}, {'a': ['b']}),
        ({'a': {'b': 'c'}}, {'a': {'b': 'd', 'c': None}}, {'a': {'b': 'd'}}),
        ({'a': [{'b': 'c'}]}, {'a': [1]}, {'a': [1]}),
        (['a', 'b'], ['c', 'd'], ['c', 'd']),
        ({'a': 'b'}, ['c'], ['c']),
        ({'a': 'foo'}, None, None),
        ({'a': 'foo'}, 'bar', 'bar'),
        ({'e': None}, {'a': 1}, {'e': None, 'a': 1}),
        ([1, 2], {'a': 'b', 'c': None}, {'a': 'b'}),
        ({}, {'a': {'bb': {'ccc': None}}}, {'a': {'bb': {}}}),
    ],
)
def test_merge_patch_rfc7386_examples(target: Any, patch: Any, expected: Any) -> None:
    original = copy.deepcopy(target)
    assert apply_merge_patch(target, patch) == expected
    assert target == original  # inputs are never modified


def test_merge_patch_shares_unchanged_branches() -> None:
    target = {'spec': {'big': {'x': 1}}, 'status': {'y': 2}}
    result = apply_merge_patch(target, {'status': {'y': 3}})
    assert result['spec'] is target['spec']
    assert result['status'] is not target['status']


# Examples from RFC 6902, Appendix A (and a few edge cases).
@pytest.mark.parametrize(
    'doc, patch, expected',
    [
        ({'foo': 'bar'}, [{'op': 'add', 'path': '/baz', 'value': 'qux'}], {'foo': 'bar', 'baz': 'qux'}),
        (
            {'foo': ['bar', 'baz']},
            [{'op': 'add', 'path': '/foo/1', 'value': 'qux'}],
            {'foo': ['bar', 'qux', 'baz']},
        ),
        ({'baz': 'qux', 'foo': 'bar'}, [{'op': 'remove', 'path': '/baz'}], {'foo': 'bar'}),
        ({'foo': ['bar', 'qux', 'baz']}, [{'op': 'remove', 'path': '/foo/1'}], {'foo': ['bar', 'baz']}),
        (
            {'baz': 'qux', 'foo': 'bar'},
            [{'op': 'replace', 'path': '/baz', 'value': 'boo'}],
            {'baz': 'boo', 'foo': 'bar'},
        ),
        (
            {'foo': {'bar': 'baz', 'waldo': 'fred'}, 'qux': {'corge': 'grault'}},
            [{'op': 'move', 'from': '/foo/waldo', 'path': '/qux/thud'}],
            {'foo': {'bar': 'baz'}, 'qux': {'corge': 'grault', 'thud': 'fred'}},
        ),
        (
            {'foo': ['all', 'grass', 'cows', 'eat']},
            [{'op': 'move', 'from': '/foo/1', 'path': '/foo/3'}],
            {'foo': ['all', 'cows', 'eat', 'grass']},
        ),
        (
            {'baz': 'qux', 'foo': ['a', 2, 'c']},
            [{'op': 'test', 'path': '/baz', 'value': 'qux'}, {'op': 'test', 'path': '/foo/1', 'value': 2}],
            {'baz': 'qux', 'foo': ['a', 2, 'c']},
        ),
        (
            {'foo': 'bar'},
            [{'op': 'add', 'path': '/child', 'value': {'grandchild': {}}}],
            {'foo': 'bar', 'child': {'grandchild': {}}},
        ),
        (
            {'foo': ['bar']},
            [{'op': 'add', 'path': '/foo/-', 'value': ['abc', 'def']}],
            {'foo': ['bar', ['abc', 'def']]},
        ),
        ({'/': 9, '~1': 10}, [{'op': 'test', 'path': '/~01', 'value': 10}], {'/': 9, '~1': 10}),
        ({'a': {'b': 1}}, [{'op': 'copy', 'from': '/a', 'path': '/c'}], {'a': {'b': 1}, 'c': {'b': 1}}),
        ({'a': 1}, [{'op': 'replace', 'path': '', 'value': {'b': 2}}], {'b': 2}),
    ],
)
def test_json_patch_rfc6902_examples(doc: Any, patch: Any, expected: Any) -> None:
    original = copy.deepcopy(doc)
    assert apply_json_patch(doc, patch) == expected
    assert doc == original


@pytest.mark.parametrize(
    'doc, patch',
    [
        ({'baz': 'qux'}, [{'op': 'test', 'path': '/baz', 'value': 'bar'}]),
        ({'foo': 'bar'}, [{'op': 'add', 'path': '/baz/bat', 'value': 'qux'}]),
        ({'foo': ['a']}, [{'op': 'add', 'path': '/foo/5', 'value': 'x'}]),
        ({'foo': ['a']}, [{'op': 'remove', 'path': '/foo/01'}]),
        ({'a': 1}, [{'op': 'test', 'path': '/a', 'value': True}]),  # JSON's true is not 1
        ({'a': {'b': 1}}, [{'op': 'move', 'from': '/a', 'path': '/a/b/c'}]),
    ],
)
def test_json_patch_failures(doc: Any, patch: Any) -> None:
    with pytest.raises(PatchApplicationError):
        apply_json_patch(doc, patch)


@pytest.mark.parametrize(
    'patch',
    [
        {'op': 'add'},
        ['not-an-object'],
        [{'op': 1, 'path': '/a'}],
        [{'op': 'add', 'path': 1, 'value': 1}],
    ],
)
def test_json_patch_format_errors(patch: Any) -> None:
    # Only what does not decode into a list of operations: 400 Bad Request, as real servers.
    with pytest.raises(PatchFormatError):
        apply_json_patch({'a': 1}, patch)


@pytest.mark.parametrize(
    'patch',
    [
        [{'op': 'frobnicate', 'path': '/a'}],
        [{'op': 'add', 'path': '/a'}],
        [{'op': 'copy', 'path': '/a'}],
        [{'path': '/a'}],
        [{'op': 'add', 'path': 'no-slash', 'value': 1}],
        [{'op': 'add', 'path': '/b', 'value': 1}, {'op': 'frobnicate', 'path': '/a'}],
    ],
)
def test_json_patch_invalid_operations(patch: Any) -> None:
    # Unknown or incomplete operations decode, but cannot be applied: 422 Invalid, as real servers.
    with pytest.raises(PatchApplicationError):
        apply_json_patch({'a': 1}, patch)


def test_strategic_merge_patch_without_lists_is_a_merge_patch() -> None:
    target = {'metadata': {'labels': {'a': '1', 'b': '2'}}, 'data': {'x': 'y'}}
    patch = {'metadata': {'labels': {'a': None, 'c': '3'}}, 'data': {'z': 'w'}}
    assert apply_strategic_merge_patch(target, patch) == apply_merge_patch(target, patch)


def test_strategic_merge_patch_directives() -> None:
    target = {'spec': {'a': 1, 'b': 2}, 'other': {'x': 1}, 'kept': {'y': 1}}
    patch = {
        'spec': {'$patch': 'replace', 'c': 3},
        'other': {'$patch': 'delete'},
        'kept': {'z': 2, '$retainKeys': ['z']},
    }
    assert apply_strategic_merge_patch(target, patch) == {'spec': {'c': 3}, 'kept': {'z': 2}}


def test_strategic_merge_patch_merges_known_lists_by_key() -> None:
    target = {
        'spec': {'containers': [{'name': 'a', 'image': 'a:1'}, {'name': 'b', 'image': 'b:1'}]},
        'metadata': {'finalizers': ['x', 'y']},
    }
    patch = {
        'spec': {
            'containers': [
                {'name': 'b', 'image': 'b:2'},
                {'name': 'c', 'image': 'c:1'},
                {'name': 'a', '$patch': 'delete'},
            ],
            '$setElementOrder/containers': [{'name': 'b'}, {'name': 'c'}],
        },
        'metadata': {'finalizers': ['z'], '$deleteFromPrimitiveList/finalizers': ['x']},
    }
    result = apply_strategic_merge_patch(target, patch)
    assert result['spec']['containers'] == [{'name': 'b', 'image': 'b:2'}, {'name': 'c', 'image': 'c:1'}]
    assert result['metadata']['finalizers'] == ['z', 'y']  # new items first, as in real API servers


def test_strategic_merge_patch_replaces_unknown_lists() -> None:
    assert apply_strategic_merge_patch({'items': [1, 2]}, {'items': [3]}) == {'items': [3]}


async def test_strategic_merge_patch_over_http(api) -> None:
    pod = {
        'apiVersion': 'v1',
        'kind': 'Pod',
        'metadata': {'name': 'p1', 'labels': {'a': '1'}},
        'spec': {'containers': [{'name': 'main', 'image': 'nginx:1'}, {'name': 'side', 'image': 'side:1'}]},
    }
    assert (await api.post(PODS, pod)).status == 201
    reply = await api.patch(
        f'{PODS}/p1',
        {'metadata': {'labels': {'b': '2'}}, 'spec': {'containers': [{'name': 'main', 'image': 'nginx:2'}]}},
        content_type='application/strategic-merge-patch+json',
    )
    assert reply.status == 200
    assert reply.body['metadata']['labels'] == {'a': '1', 'b': '2'}
    containers = reply.body['spec']['containers']
    assert [(c['name'], c['image'], c['imagePullPolicy']) for c in containers] == [
        ('main', 'nginx:2', 'IfNotPresent'),  # the server's default, kept by the merge
        ('side', 'side:1', 'IfNotPresent'),
    ]


async def test_json_patch_over_http(api) -> None:
    await api.post(
        CMS, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1'}, 'data': {'a': 'b'}}
    )
    reply = await api.patch(
        f'{CMS}/cm1',
        [
            {'op': 'test', 'path': '/data/a', 'value': 'b'},
            {'op': 'add', 'path': '/metadata/labels', 'value': {'x': 'y'}},
            {'op': 'move', 'from': '/data/a', 'path': '/data/c'},
        ],
        content_type='application/json-patch+json',
    )
    assert reply.status == 200
    assert reply.body['data'] == {'c': 'b'}
    assert reply.body['metadata']['labels'] == {'x': 'y'}


async def test_resource_version_in_a_patch_is_a_precondition(api) -> None:
    created = (
        await api.post(CMS, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1'}})
    ).body
    version = created['metadata']['resourceVersion']
    first = await api.patch(f'{CMS}/cm1', {'metadata': {'resourceVersion': version}, 'data': {'a': '1'}})
    assert first.status == 200
    second = await api.patch(f'{CMS}/cm1', {'metadata': {'resourceVersion': version}, 'data': {'a': '2'}})
    assert second.status == 409
    assert second.body['reason'] == 'Conflict'


async def test_server_side_apply_creates_and_merges(api) -> None:
    document = b'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm1\ndata:\n  a: b\n'
    created = await api.request(
        'PATCH', f'{CMS}/cm1?fieldManager=tests', data=document, content_type='application/apply-patch+yaml'
    )
    assert created.status == 201
    updated = await api.request(
        'PATCH',
        f'{CMS}/cm1?fieldManager=tests',
        data=document.replace(b'a: b', b'c: d'),
        content_type='application/apply-patch+yaml',
    )
    assert updated.status == 200
    assert updated.body['data'] == {'a': 'b', 'c': 'd'}
    unmanaged = await api.request(
        'PATCH', f'{CMS}/cm1', data=document, content_type='application/apply-patch+yaml'
    )
    assert unmanaged.status == 400
