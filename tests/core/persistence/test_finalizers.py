"""
Our finalizer: when it is added or removed (the decisions), and how (the merge-patch of the whole list
for the guarded request, and the JSON-patches of its position as Kopf sends them).
"""
from typing import Any

import pytest

from kopf._cogs.structs.patches import Patch
from kopf._core.persistence import (
    DEFAULT_FINALIZER,
    is_deletion_blocked,
    is_deletion_ongoing,
    make_allowing_json_patch,
    make_blocking_json_patch,
)
from kopf._core.persistence.finalizers import (
    FinalizerAction,
    FinalizerDecision,
    apply_decision,
    changes_finalizers,
    decide,
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


#
# The decisions: when our finalizer is added or removed.
#

OURS = DEFAULT_FINALIZER
OTHER = 'other.example.com/finalizer'
BLOCK = FinalizerDecision(FinalizerAction.ADD,
                          'Adding the finalizer, thus preventing the actual deletion.')
RELEASE = FinalizerDecision(FinalizerAction.REMOVE,
                            'Removing the finalizer, thus allowing the actual deletion.')
UNNEEDED = FinalizerDecision(FinalizerAction.REMOVE,
                             'Removing the finalizer, as there are no handlers requiring it.')


def _object(finalizers: list[str] | None = None, *, deleted: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {'name': 'x', 'resourceVersion': '7'}
    if finalizers is not None:
        meta['finalizers'] = list(finalizers)
    if deleted:
        meta['deletionTimestamp'] = '2020-01-01T00:00:00Z'
    return {'metadata': meta}


@pytest.mark.parametrize('raw, deleting, ours', [
    ({}, False, False),
    ({'metadata': {}}, False, False),
    ({'metadata': {'deletionTimestamp': 'now'}}, True, False),
    ({'metadata': {'finalizers': [OTHER]}}, False, False),
    ({'metadata': {'finalizers': [OTHER, OURS]}}, False, True),
    ({'metadata': {'finalizers': [OURS], 'deletionTimestamp': 'now'}}, True, True),
])
def test_deletion_and_finalizer_checks(raw: dict[str, Any], deleting: bool, ours: bool) -> None:
    assert is_deletion_ongoing(raw) is deleting
    assert is_deletion_blocked(raw, OURS) is ours


@pytest.mark.parametrize('finalizers, deleted, required, done, expected', [
    # A living object: the finalizer follows the requirement.
    ([], False, True, False, BLOCK),
    ([OTHER], False, True, False, BLOCK),
    ([OURS], False, True, False, None),
    ([], False, False, False, None),
    ([OURS], False, False, False, UNNEEDED),
    ([OURS], False, False, True, UNNEEDED),
    # An object being deleted: never blocked anew; released when the deletion is done.
    ([], True, True, False, None),
    ([OTHER], True, True, True, None),
    ([OURS], True, True, False, None),
    ([OURS], True, False, False, None),
    ([OURS], True, True, True, RELEASE),
    ([OURS, OTHER], True, False, True, RELEASE),
])
def test_decisions(finalizers: list[str], deleted: bool, required: bool, done: bool,
                   expected: FinalizerDecision | None) -> None:
    raw = _object(finalizers, deleted=deleted)
    assert decide(body=raw, finalizer=OURS, requires_finalizer=required, deletion_done=done) == expected


@pytest.mark.parametrize('decision, finalizers, expected', [
    (BLOCK, None, [OURS]),
    (BLOCK, [OTHER], [OTHER, OURS]),
    (BLOCK, [OURS], [OURS]),
    (RELEASE, [OURS], None),  # the last one goes with the whole field, as the API does it
    (RELEASE, [OTHER, OURS], [OTHER]),
    (UNNEEDED, [OURS, OTHER], [OTHER]),
])
def test_applying_decisions(decision: FinalizerDecision, finalizers: list[str] | None,
                            expected: list[str] | None) -> None:
    raw = _object(finalizers)
    patch = Patch()
    apply_decision(decision, body=raw, patch=patch, finalizer=OURS)
    assert patch == {'metadata': {'finalizers': expected}}
    assert changes_finalizers(patch)
    assert raw['metadata'].get('finalizers') == finalizers  # the body is intact


def test_applying_decisions_accumulates_in_the_patch() -> None:
    raw = _object([OTHER])
    patch = Patch({'metadata': {'finalizers': [OTHER, 'third']}})
    apply_decision(BLOCK, body=raw, patch=patch, finalizer=OURS)
    assert patch == {'metadata': {'finalizers': [OTHER, 'third', OURS]}}


def test_other_patches_do_not_change_finalizers() -> None:
    assert not changes_finalizers({'metadata': {'labels': {'a': 'b'}}})
    assert not changes_finalizers({'status': {'finalizers': []}})
