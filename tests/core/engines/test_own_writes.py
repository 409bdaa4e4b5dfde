"""
The daemons' & timers' own writes (issue #40): remembered as patched until the echo comes, seen by the next
call if it comes late; nothing else copied, never older than what the live body has (see ``ObjectSpawns``).

The calls that see them are tested end to end in ``tests/core/integration/test_timers.py`` and
``test_daemons.py`` (a watch outage); here, what exactly the live body becomes.
"""
from typing import Any

from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.dicts import raw_mapping
from kopf._cogs.structs.patches import Patch
from kopf._cogs.structs.references import Resource
from kopf._core.engines.spawns import ObjectSpawns

RESOURCE = Resource('kopf.dev', 'v1', 'kopfexamples', namespaced=True)


def make_spawns(version: str = '100') -> ObjectSpawns:
    body = Body({'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
                 'metadata': {'name': 'kex1', 'resourceVersion': version, 'labels': {'a': 'b'}},
                 'spec': {'field': 'value', 'items': [1, 2]},
                 'status': {'counter': 1, 'other': {'x': 1}, 'gone': 'soon'}})
    return ObjectSpawns(owner=None, body=body, resource=RESOURCE, memo=None, changed_at=0)


def make_latest(version: str = '101', **status: Any) -> dict[str, Any]:
    return {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
            'metadata': {'name': 'kex1', 'resourceVersion': version, 'labels': {'a': 'b'},
                         'managedFields': [{'manager': 'kopf'}]},
            'spec': {'field': 'changed-by-someone-else', 'items': [1, 2]},
            'status': {'counter': 2, 'other': {'x': 1}, **status}}


def test_the_next_call_sees_the_patched_fields_and_nothing_else() -> None:
    spawns = make_spawns()
    before = raw_mapping(spawns.body)
    spawns.remember_own_write(Patch({'status': {'counter': 2, 'gone': None}}), make_latest())
    assert raw_mapping(spawns.body) is before  # nothing is done until the next call (the echo may come)
    spawns.see_own_write()
    after = raw_mapping(spawns.body)
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


def test_nested_patches_are_merged_as_merge_patches() -> None:
    spawns = make_spawns()
    spawns.remember_own_write(Patch({'status': {'other': {'y': 2}, 'new': {'z': [1]}}}), make_latest())
    spawns.see_own_write()
    assert raw_mapping(spawns.body)['status'] == {'counter': 1, 'other': {'x': 1, 'y': 2}, 'new': {'z': [1]},
                                                   'gone': 'soon'}


def test_the_echo_makes_the_own_write_needless() -> None:
    spawns = make_spawns()
    spawns.remember_own_write(Patch({'status': {'counter': 2}}), make_latest())
    echo = make_latest()
    spawns.notice_state(echo)
    assert spawns.own_write is None
    spawns.see_own_write()
    assert raw_mapping(spawns.body) is echo


def test_a_late_older_event_does_not_undo_the_own_write() -> None:
    spawns = make_spawns()
    spawns.remember_own_write(Patch({'status': {'counter': 2}}), make_latest(version='102'))
    spawns.see_own_write()
    spawns.notice_state(make_latest(version='101', counter=7))  # e.g. someone else's write before ours
    assert spawns.own_write is not None
    spawns.see_own_write()
    assert raw_mapping(spawns.body)['status']['counter'] == 2
    assert raw_mapping(spawns.body)['metadata']['resourceVersion'] == '102'


def test_a_response_older_than_the_live_body_changes_nothing() -> None:
    spawns = make_spawns(version='105')
    before = raw_mapping(spawns.body)
    spawns.remember_own_write(Patch({'status': {'counter': 2}}), make_latest(version='101'))
    spawns.see_own_write()
    assert raw_mapping(spawns.body) is before


def test_opaque_versions_are_never_newer() -> None:
    spawns = make_spawns(version='abc')
    before = raw_mapping(spawns.body)
    spawns.remember_own_write(Patch({'status': {'counter': 2}}), make_latest(version='def'))
    spawns.see_own_write()
    assert raw_mapping(spawns.body) is before


def test_transformation_functions_take_the_whole_response() -> None:
    spawns = make_spawns()
    patch = Patch()
    patch.fns.append(lambda body: None)
    latest = make_latest()
    spawns.remember_own_write(patch, latest)
    spawns.see_own_write()
    assert raw_mapping(spawns.body) is latest
