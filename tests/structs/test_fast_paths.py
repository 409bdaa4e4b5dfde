"""
The structures' fast paths, pinned to the general ones: for random values, the same results.

* the merge-patch converted directly to a JSON-patch (the one converter: of the mutating admission reviews,
  and of ``Patch.as_json_patch()`` without the transformation functions) vs. the general path: the merge-patch
  applied to a copy (RFC 7386) and the result diffed; checked by two independent appliers of JSON-patches
  (the ``jsonpatch`` library and the emulator's own) against two independent appliers of merge-patches;
* the JSON equality of the converter vs. the emulator's independent one;
* the diffs' shortcut for the unchanged essences (equal JSON) vs. the walk;
* the live views' shortcuts (top-level reads without the resolution) vs. the resolution.
"""
import copy
import json
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kopf._cogs.structs import dicts, diffs, patches
from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.patches import Patch
from kopf.testing.emulator import patches as emulated

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Few keys, so that the patches and the bodies overlap; the keys that must be escaped in JSON pointers.
KEYS = st.sampled_from(['a', 'b', 'spec', 'a/b', 'c~d', '~1', '0', ''])
# The values that are equal in Python but not in JSON (true vs. 1), or equal in both (1 vs. 1.0).
SCALARS = st.sampled_from([0, 1, 1.0, 2, True, False, '', 'x', '1', 0.5])
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children | st.none(), max_size=3) | st.dictionaries(KEYS, children, max_size=3),
    max_leaves=8,
)
# A merge-patch: None removes, a dict merges (into a dict, or replaces a non-dict), anything else replaces.
MERGES = st.recursive(
    st.dictionaries(KEYS, VALUES | st.none(), max_size=3),
    lambda children: st.dictionaries(KEYS, children | VALUES | st.none(), max_size=3),
    max_leaves=10,
)
BODIES = st.dictionaries(KEYS, VALUES | st.none(), max_size=4)  # incl. the keys with null

# The values equal in Python (but in JSON, only the numbers are): what a mutation easily turns one into.
ALIASES: dict[Any, list[Any]] = {1: [1, 1.0, True], 0: [0, 0.0, False], 2: [2, 2.0]}


@st.composite
def twins(draw: st.DrawFn, value: Any) -> Any:
    """The same value, but maybe with some scalars replaced by their Python-equal aliases."""
    if type(value) in (int, float, bool) and value in ALIASES:
        return draw(st.sampled_from(ALIASES[value]))
    if isinstance(value, dict):
        return {key: draw(twins(item)) for key, item in value.items()}
    if isinstance(value, list):
        return [draw(twins(item)) for item in value]
    return value


@st.composite
def merges_of(draw: st.DrawFn, body: dict[str, Any]) -> dict[str, Any]:
    """A merge-patch of the body's own keys (often with the same or the Python-equal values) and others."""
    merge: dict[str, Any] = {}
    for key, value in body.items():
        choice = draw(st.integers(0, 4))
        if choice == 1:
            merge[key] = draw(twins(value))  # the same value, or an alias
        elif choice == 2 and isinstance(value, dict):
            merge[key] = draw(merges_of(value))  # merged deeper
        elif choice == 3:
            merge[key] = draw(VALUES | st.none())
        elif choice == 4:
            merge[key] = None
    merge.update(draw(st.dictionaries(KEYS, VALUES | st.none(), max_size=2)))
    return merge


def general_json_patch(merge: dict[str, Any], body: dict[str, Any]) -> list[dict[str, Any]]:
    """The general path: the merge-patch applied to a copy of the body, and the result diffed."""
    patch = Patch(merge)
    patch.fns.append(lambda raw: None)  # nothing changes, but the functions need the general path
    return [dict(op) for op in patch.as_json_patch(body, guarded=False)]


@SETTINGS
@given(BODIES.flatmap(lambda body: st.tuples(st.just(body), merges_of(body) | MERGES)), st.booleans())
def test_merge_patches_are_converted_directly_as_the_general_path_does(
        body_and_merge: tuple[dict[str, Any], dict[str, Any]], view: bool,
) -> None:
    body, merge = body_and_merge
    original, original_merge = copy.deepcopy(body), copy.deepcopy(merge)
    fast = patches.merge_to_json_patch(merge, Body(body) if view else body)
    assert Patch(merge).as_json_patch(body) == fast  # the same converter, not another one
    general = general_json_patch(merge, body)

    # The same result by RFC 7386 (two implementations) and by RFC 6902 (two implementations each).
    merged = patches.apply_merge_patch(body, merge)
    assert emulated.json_equal(emulated.apply_merge_patch(body, merge), merged)
    for ops in [fast, general]:
        assert emulated.json_equal(jsonpatch.apply_patch(body, ops), merged), f'{ops} of {merge} to {body}'
        assert emulated.json_equal(emulated.apply_json_patch(copy.deepcopy(body), ops), merged)

    # No operations if nothing changes in JSON (the general diff also replaces 1 with 1.0, which is the same).
    assert bool(fast) == (not emulated.json_equal(merged, body))
    assert bool(fast) <= bool(general)

    # Nothing is shared or modified: the body, the merge-patch, the values of the operations.
    for op in fast:
        _wipe(op.get('value'))
    assert body == original and merge == original_merge


def _wipe(value: Any) -> None:
    """Empty all the containers in the value, the nested ones first."""
    if isinstance(value, (dict, list)):
        for item in list(value.values() if isinstance(value, dict) else value):
            _wipe(item)
        value.clear()


@SETTINGS
@given(st.data(), VALUES | st.none(), st.booleans())
def test_json_equality_is_as_the_emulators_independent_one(data: st.DataObject, a: Any, alias: bool) -> None:
    b = data.draw(twins(a)) if alias else data.draw(VALUES | st.none())
    assert patches.same_json(a, b) == emulated.json_equal(a, b)
    assert patches.same_json(a, copy.deepcopy(a))


@SETTINGS
@given(st.data(), st.dictionaries(KEYS, VALUES, max_size=4), st.sampled_from(['same', 'alias', 'other']))
def test_diffs_of_the_same_json_are_known_empty_as_the_walk_finds(
        data: st.DataObject, a: dict[str, Any], kind: str,
) -> None:
    b = (json.loads(json.dumps(a)) if kind == 'same' else data.draw(twins(a)) if kind == 'alias' else
         data.draw(st.dictionaries(KEYS, VALUES, max_size=4)))
    walked: list[diffs.DiffItem] = []
    diffs._diff_into(walked, a, b, ())
    assert diffs.diff(a, b) == diffs.Diff(walked)
    if diffs._surely_same(a, b):
        assert walked == []


NESTED = st.recursive(st.dictionaries(KEYS, VALUES, max_size=3),
                      lambda children: st.dictionaries(KEYS, children | VALUES, max_size=3), max_leaves=8)


@SETTINGS
@given(NESTED, st.lists(KEYS, max_size=2), KEYS, st.booleans())
def test_views_read_as_their_resolved_mappings(
        raw: dict[str, Any], path: list[str], key: str, replaceable: bool,
) -> None:
    cls = dicts.ReplaceableMappingView if replaceable else dicts.MappingView
    view: dicts.MappingView[str, Any] = cls(raw, tuple(path))
    resolved = dicts.resolve(raw, tuple(path), {})
    resolved = resolved if isinstance(resolved, dict) else {}
    assert dict(view) == resolved
    assert dicts.raw_mapping(view) == resolved
    assert (key in view) == (key in resolved)
    assert view.get(key, 'default') == resolved.get(key, 'default')
    if key in resolved:
        assert view[key] == resolved[key]
    nested = cls(view, (key,))  # the nested views follow their parents' sources
    expected = resolved.get(key)
    assert dict(nested) == (expected if isinstance(expected, dict) else {})
