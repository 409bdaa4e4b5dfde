"""
The soak's invariant "every handler saw the final state": which misses are the allowed ones.

A change handler's call that saw an older state than the final one is allowed only if the cycle went on in
another process (what the handlers saw is kept in memory only): the next call for the object that saw a newer
state was made by another process. Not the next call of any state: the same process can finish the cycle's
steps of the missed call's state and be killed before the cycle's end is stored (seen on the real server).
"""
import pathlib
import sys
import types
from typing import Any

# The repository's root is not on sys.path under `pytest` (--import-mode=importlib); the checks import
# their sibling modules as the package `tools.soak` (as `python -m tools.soak` runs them).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from tools.soak.checks import _unseen_by_some

FINAL = [{'metadata': {'name': 'obj', 'labels': {'color': 'black'}}, 'spec': {'version': 6, 'field': 'f6'}}]


def call(handler: str, pid: int, version: int, color: str, field: str, **extra: Any) -> dict[str, Any]:
    return {'object': 'obj', 'handler': handler, 'outcome': 'ok', 'pid': pid, 'version': version,
            'labels': {'color': color}, 'field': field, **extra}


def soak_of(*records: dict[str, Any]) -> Any:
    return types.SimpleNamespace(journal=types.SimpleNamespace(records=list(records)),
                                 world=types.SimpleNamespace(stubborn=set()))


def test_all_seen_is_neither() -> None:
    soak = soak_of(call('update_fn', 1, 6, 'black', 'f6'), call('field_fn', 1, 6, 'black', 'f6', new='f6'))
    assert _unseen_by_some(soak, FINAL) == ([], [])


def test_a_cycle_continued_by_another_process_after_its_steps_in_the_first_one() -> None:
    # Process 1 handles version 5 in two steps (update_fn, then field_fn), is killed before the cycle's
    # end is stored; process 2 continues the cycle (update_fn is done in its records) with version 6.
    soak = soak_of(call('update_fn', 1, 5, 'blue', 'f5'), call('field_fn', 1, 5, 'blue', 'f5', new='f5'),
                   call('field_fn', 2, 6, 'black', 'f6', new='f6'))
    assert _unseen_by_some(soak, FINAL) == ([], ['obj'])


def test_a_cycle_continued_by_the_same_process_is_a_miss() -> None:
    # The same process must call update_fn again for the newer state (it remembers what it has seen).
    soak = soak_of(call('update_fn', 1, 5, 'blue', 'f5'), call('field_fn', 1, 5, 'blue', 'f5', new='f5'),
                   call('field_fn', 1, 6, 'black', 'f6', new='f6'),
                   call('field_fn', 2, 6, 'black', 'f6', new='f6'))
    assert _unseen_by_some(soak, FINAL) == (['obj'], [])


def test_a_handler_never_called_after_its_old_state_with_no_later_calls_is_a_miss() -> None:
    soak = soak_of(call('field_fn', 1, 6, 'black', 'f6', new='f6'), call('update_fn', 1, 5, 'blue', 'f5'))
    assert _unseen_by_some(soak, FINAL) == (['obj'], [])
