"""
Blocking and allowing the deletion: the finalizer as JSON-patches (as Kopf sends them) and merge-patches.
"""
from typing import Any

import pytest

from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.patches import Patch
from kopf._core.persistence import (
    DEFAULT_FINALIZER,
    allow_deletion,
    block_deletion,
    is_deletion_blocked,
    is_deletion_ongoing,
    make_allowing_json_patch,
    make_allowing_merge_patch,
    make_blocking_json_patch,
    make_blocking_merge_patch,
)

F = DEFAULT_FINALIZER
TEST = {'op': 'test', 'path': '/metadata/resourceVersion', 'value': '7'}


def _body(finalizers: list[str] | None, **metadata: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {'name': 'x', 'resourceVersion': '7', **metadata}
    if finalizers is not None:
        meta['finalizers'] = finalizers
    return {'metadata': meta}


def test_default_finalizer_is_kopfs() -> None:
    assert DEFAULT_FINALIZER == 'kopf.zalando.org/KopfFinalizerMarker'


@pytest.mark.parametrize('finalizers, expected', [
    (None, [TEST, {'op': 'add', 'path': '/metadata/finalizers', 'value': [F]}]),
    ([], [TEST, {'op': 'add', 'path': '/metadata/finalizers/0', 'value': F}]),
    (['a'], [TEST, {'op': 'add', 'path': '/metadata/finalizers/1', 'value': F}]),
    (['a', 'b'], [TEST, {'op': 'add', 'path': '/metadata/finalizers/2', 'value': F}]),
    ([F], []),
    (['a', F], []),
])
def test_blocking(finalizers: list[str] | None, expected: list[dict[str, Any]]) -> None:
    body = _body(finalizers)
    assert make_blocking_json_patch(body) == expected
    patch = Patch(body=body)
    block_deletion(body=Body(body), patch=patch)
    assert patch.as_json_patch() == expected  # the same as a transformation function of a patch
    assert is_deletion_blocked(body) == (not expected)


@pytest.mark.parametrize('finalizers, expected', [
    (None, []),
    (['a'], []),
    ([F], [TEST, {'op': 'remove', 'path': '/metadata/finalizers'}]),
    (['a', F], [TEST, {'op': 'remove', 'path': '/metadata/finalizers/1'}]),
    ([F, 'a'], [TEST, {'op': 'remove', 'path': '/metadata/finalizers/0'}]),
    (['a', F, 'b'], [TEST, {'op': 'remove', 'path': '/metadata/finalizers/1'}]),
])
def test_allowing(finalizers: list[str] | None, expected: list[dict[str, Any]]) -> None:
    body = _body(finalizers)
    assert make_allowing_json_patch(body) == expected
    patch = Patch(body=body)
    allow_deletion(body=Body(body), patch=patch)
    assert patch.as_json_patch() == expected


def test_duplicates_are_removed_from_the_end() -> None:
    body = _body([F, 'a', F])
    assert make_allowing_json_patch(body, guarded=False) == [
        {'op': 'remove', 'path': '/metadata/finalizers/2'},
        {'op': 'remove', 'path': '/metadata/finalizers/0'},
    ]


@pytest.mark.parametrize('guarded, body, expected_test', [
    (True, _body(None), True),
    (False, _body(None), False),
    (True, {'metadata': {}}, False),  # nothing to guard with
])
def test_guarding(guarded: bool, body: dict[str, Any], expected_test: bool) -> None:
    ops = make_blocking_json_patch(body, guarded=guarded)
    assert (ops[0]['op'] == 'test') == expected_test


@pytest.mark.parametrize('finalizers, blocking, allowing', [
    (None, {'metadata': {'finalizers': [F]}}, {}),
    (['a'], {'metadata': {'finalizers': ['a', F]}}, {}),
    ([F], {}, {'metadata': {'finalizers': None}}),
    (['a', F], {}, {'metadata': {'finalizers': ['a']}}),
])
def test_merge_patches(
        finalizers: list[str] | None, blocking: dict[str, Any], allowing: dict[str, Any],
) -> None:
    assert make_blocking_merge_patch(_body(finalizers)) == blocking
    assert make_allowing_merge_patch(_body(finalizers)) == allowing


def test_custom_finalizer() -> None:
    body = _body(['my.example.com/finalizer'])
    assert is_deletion_blocked(body, 'my.example.com/finalizer')
    assert not is_deletion_blocked(body)
    assert make_allowing_json_patch(body, 'my.example.com/finalizer', guarded=False) == [
        {'op': 'remove', 'path': '/metadata/finalizers'}]


@pytest.mark.parametrize('body, expected', [
    ({}, False),
    (_body(None), False),
    (_body([F], deletionTimestamp='2020-01-01T00:00:00Z'), True),
])
def test_deletion_ongoing(body: dict[str, Any], expected: bool) -> None:
    assert is_deletion_ongoing(body) == expected
