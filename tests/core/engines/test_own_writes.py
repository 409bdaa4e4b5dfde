"""
The daemons' & timers' own writes in their live body (issue #40): the patched fields as the API has stored
them, nothing else copied, never older than what the live body has (see ``spawns._take_own_write``).

The calls that see them are tested end to end in ``tests/core/integration/test_timers.py`` and
``test_daemons.py`` (a watch outage); here, what exactly the live body becomes.
"""
from typing import Any

from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.dicts import raw_mapping
from kopf._cogs.structs.patches import Patch
from kopf._core.engines.spawns import _take_own_write, is_older_than_live


def make_live(version: str = '100') -> Body:
    return Body({'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
                 'metadata': {'name': 'kex1', 'resourceVersion': version, 'labels': {'a': 'b'}},
                 'spec': {'field': 'value', 'items': [1, 2]},
                 'status': {'counter': 1, 'other': {'x': 1}, 'gone': 'soon'}})


def make_latest(version: str = '101', **status: Any) -> dict[str, Any]:
    return {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
            'metadata': {'name': 'kex1', 'resourceVersion': version, 'labels': {'a': 'b'},
                         'managedFields': [{'manager': 'kopf'}]},
            'spec': {'field': 'changed-by-someone-else', 'items': [1, 2]},
            'status': {'counter': 2, 'other': {'x': 1}, **status}}


def test_the_patched_fields_come_from_the_response_and_nothing_else() -> None:
    live = make_live()
    before = raw_mapping(live)
    patch = Patch({'status': {'counter': 2, 'gone': None}})
    _take_own_write(live, patch, make_latest())
    after = raw_mapping(live)
    assert after == {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
                     'metadata': {'name': 'kex1', 'resourceVersion': '101', 'labels': {'a': 'b'}},
                     'spec': {'field': 'value', 'items': [1, 2]},  # not patched: as the live body had it
                     'status': {'counter': 2, 'other': {'x': 1}}}
    # No copies of what is not patched: shared with the state before; the state before is not modified.
    assert after['spec'] is before['spec']
    assert after['status']['other'] is before['status']['other']
    assert after['metadata']['labels'] is before['metadata']['labels']
    assert before['status'] == {'counter': 1, 'other': {'x': 1}, 'gone': 'soon'}
    assert before['metadata']['resourceVersion'] == '100'


def test_only_the_patched_leaves_are_taken_as_stored() -> None:
    live = make_live()
    latest = make_latest(other={'x': 5, 'y': 'not patched'}, new=[1, 'stored'])
    _take_own_write(live, Patch({'status': {'other': {'x': '5'}, 'new': [1]}}), latest)
    assert raw_mapping(live)['status']['other'] == {'x': 5}
    assert raw_mapping(live)['status']['new'] == [1, 'stored']


def test_a_response_older_than_the_live_body_changes_nothing() -> None:
    live = make_live(version='105')
    before = raw_mapping(live)
    _take_own_write(live, Patch({'status': {'counter': 2}}), make_latest(version='101'))
    assert raw_mapping(live) is before


def test_transformation_functions_take_the_whole_response() -> None:
    live = make_live()
    patch = Patch()
    patch.fns.append(lambda body: None)
    latest = make_latest()
    _take_own_write(live, patch, latest)
    assert raw_mapping(live) is latest


def test_late_events_are_older_than_the_own_writes() -> None:
    live = make_live()
    _take_own_write(live, Patch({'status': {'counter': 2}}), make_latest(version='101'))
    assert is_older_than_live(live, {'metadata': {'resourceVersion': '100'}})
    assert not is_older_than_live(live, {'metadata': {'resourceVersion': '101'}})  # the echo
    assert not is_older_than_live(live, {'metadata': {'resourceVersion': '102'}})
    assert not is_older_than_live(live, {'metadata': {'resourceVersion': 'opaque'}})
