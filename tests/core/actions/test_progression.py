import datetime
import json
from typing import Any

import pytest

from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.patches import Patch
from kopf._core.actions.errors import HandlerChildrenRetry, PermanentError, TemporaryError
from kopf._core.actions.progression import HandlerState, Outcome, State
from kopf._core.intents.handlers import ChangingHandler, HandlerId, Reason

# The records exactly as Kopf 1.45.2 has written them to the annotations (observed in its logs).
KOPF_RECORDS = {
    'create_fn': '{"started":"2026-11-21T00:30:17.252362+00:00",'
                 '"stopped":"2026-11-21T00:30:17.257325+00:00",'
                 '"purpose":"create","retries":1,"success":true,"failure":false}',
    'create_retry': '{"started":"2026-11-21T00:30:17.252377+00:00",'
                    '"delayed":"2026-11-21T00:30:18.274088+00:00",'
                    '"purpose":"create","retries":1,"success":false,"failure":false,"message":"not yet"}',
    'create_sub': '{"started":"2026-11-21T00:30:17.252382+00:00",'
                  '"stopped":"2026-11-21T00:30:17.284396+00:00",'
                  '"purpose":"create","retries":1,"success":true,"failure":false,'
                  '"subrefs":["create_sub/child1"]}',
    'field_fn/spec.field': '{"started":"2026-11-21T00:30:17.252387+00:00",'
                           '"purpose":"create","retries":0,"success":false,"failure":false}',
    'h_perm': '{"started":"2026-11-21T00:33:32.693333+00:00","stopped":"2026-11-21T00:33:32.694692+00:00",'
              '"purpose":"create","retries":1,"success":false,"failure":true,"message":"boom"}',
    'parent': '{"started":"2026-11-21T00:34:11.337638+00:00","delayed":"2026-11-21T00:34:11.855600+00:00",'
              '"purpose":"create","retries":2,"success":false,"failure":false,"message":"None",'
              '"subrefs":["parent/c1","parent/c2","parent/c2/g1"]}',
}


def make_handler(id: str) -> ChangingHandler:
    return ChangingHandler(fn=lambda **_: None, id=HandlerId(id))


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def annotations_of(records: dict[str, str]) -> dict[str, str]:
    return {f'kopf.zalando.org/{key.replace("/", ".")}': value for key, value in records.items()}


@pytest.mark.parametrize('key', sorted(KOPF_RECORDS))
def test_kopf_records_survive_a_roundtrip(storage: Any, make_body: Any, key: str) -> None:
    body = Body(make_body(annotations=annotations_of(KOPF_RECORDS)))
    record = storage.fetch(key=key, body=body)
    state = HandlerState.from_record(record)
    assert not state.changed

    patch = Patch()
    storage.store(key=key, record=state.as_record(), body=Body(make_body()), patch=patch)
    assert patch['metadata']['annotations'][f'kopf.zalando.org/{key.replace("/", ".")}'] == KOPF_RECORDS[key]


def test_kopf_record_fields_are_parsed() -> None:
    state = HandlerState.from_record(json.loads(KOPF_RECORDS['parent']))
    assert state.started == datetime.datetime(2026, 11, 21, 0, 34, 11, 337638, tzinfo=datetime.UTC)
    assert state.stopped is None
    assert state.delayed == datetime.datetime(2026, 11, 21, 0, 34, 11, 855600, tzinfo=datetime.UTC)
    assert state.purpose == 'create'
    assert state.retries == 2
    assert not state.success and not state.failure and not state.finished
    assert state.message == 'None'
    assert state.subrefs == ('parent/c1', 'parent/c2', 'parent/c2/g1')


def test_records_without_timezones_are_in_utc() -> None:
    state = HandlerState.from_record({'started': '2020-01-01T00:00:00', 'purpose': 'update'})
    assert state.started == datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    assert state.retries == 0
    assert state.changed  # it will be re-written in the canonical format


def test_records_go_to_the_storage_in_kopf_format_with_all_fields() -> None:
    state = HandlerState.from_record(json.loads(KOPF_RECORDS['create_retry']))
    assert list(state.as_record().items()) == [
        ('started', '2026-11-21T00:30:17.252377+00:00'),
        ('stopped', None),
        ('delayed', '2026-11-21T00:30:18.274088+00:00'),
        ('purpose', 'create'),
        ('retries', 1),
        ('success', False),
        ('failure', False),
        ('message', 'not yet'),
        ('subrefs', None),
    ]


def test_state_from_kopf_annotations(storage: Any, make_body: Any) -> None:
    body = Body(make_body(annotations=annotations_of(KOPF_RECORDS)))
    handlers = [make_handler(id) for id in ['create_fn', 'create_retry', 'create_sub', 'field_fn/spec.field',
                                            'absent']]
    state = State.from_storage(body=body, storage=storage, handlers=handlers)
    assert set(state) == {'create_fn', 'create_retry', 'create_sub', 'field_fn/spec.field'}
    assert state.purpose == 'create'
    assert state.counts == (2, 0, 2)
    assert not state.done
    assert state['create_sub'].subrefs == ('create_sub/child1',)


def test_nothing_stored_means_no_purpose(storage: Any, make_body: Any) -> None:
    state = State.from_storage(body=Body(make_body()), storage=storage, handlers=[make_handler('fn')])
    assert len(state) == 0
    assert state.purpose is None
    assert state.done
    assert state.delay is None


def test_new_handlers_start_now_and_only_they_are_stored(storage: Any, make_body: Any) -> None:
    body = Body(make_body(annotations=annotations_of({'create_fn': KOPF_RECORDS['create_fn']})))
    handlers = [make_handler('create_fn'), make_handler('new_fn')]
    before = now()
    state = State.from_storage(body=body, storage=storage, handlers=handlers).with_handlers(handlers)
    after = now()

    assert state['new_fn'].purpose == 'create'
    assert state['new_fn'].started is not None and before <= state['new_fn'].started <= after
    assert state['new_fn'].retries == 0
    assert not state['new_fn'].finished

    patch = Patch()
    state.store(body=body, patch=patch, storage=storage)
    assert list(patch['metadata']['annotations']) == ['kopf.zalando.org/new_fn']
    record = json.loads(patch['metadata']['annotations']['kopf.zalando.org/new_fn'])
    assert list(record) == ['started', 'purpose', 'retries', 'success', 'failure']


def test_with_handlers_drops_other_handlers() -> None:
    state = State({HandlerId('a'): HandlerState(retries=1), HandlerId('b'): HandlerState(retries=2)})
    narrowed = state.with_handlers([make_handler('b'), make_handler('c')])
    assert list(narrowed) == ['b', 'c']
    assert narrowed['b'].retries == 2
    assert 'a' in state  # immutable: the original is intact


def test_success_outcome() -> None:
    state = HandlerState.from_scratch(purpose='create')
    new = state.with_outcome(Outcome(final=True, result={'x': 1}))
    assert new.success and not new.failure and new.finished
    assert new.retries == 1
    assert new.stopped is not None and new.stopped >= state.started  # type: ignore[operator]
    assert new.delayed is None and new.message is None
    assert new.started == state.started
    assert new.changed
    assert state.retries == 0  # immutable


def test_permanent_failure_outcome() -> None:
    state = HandlerState.from_scratch(purpose='create')
    new = state.with_outcome(Outcome(final=True, exception=PermanentError('boom')))
    assert new.failure and not new.success and new.finished
    assert new.message == 'boom'
    assert new.stopped is not None


def test_temporary_failure_outcome_with_delay() -> None:
    state = HandlerState.from_scratch(purpose='create')
    before = now()
    new = state.with_outcome(Outcome(final=False, delay=60, exception=TemporaryError('later')))
    assert not new.finished
    assert new.retries == 1
    assert new.message == 'later'
    assert new.delayed is not None and new.delayed >= before + datetime.timedelta(seconds=60)
    assert new.sleeping and not new.awakened
    assert 59 < new.delay <= 60


def test_temporary_failure_without_delay_removes_the_previous_delay() -> None:
    state = HandlerState(started=now(), delayed=now() + datetime.timedelta(hours=1), retries=3)
    new = state.with_outcome(Outcome(final=False, delay=None, exception=TemporaryError('now')))
    assert new.delayed is None
    assert new.awakened and not new.sleeping
    assert new.delay == 0
    assert new.retries == 4


def test_subrefs_accumulate_across_outcomes() -> None:
    state = HandlerState(started=now(), subrefs=(HandlerId('p/a'), HandlerId('p/c')))
    retry = HandlerChildrenRetry(delay=0)
    new = state.with_outcome(Outcome(final=False, delay=0, exception=retry, subrefs=[HandlerId('p/b')]))
    assert new.subrefs == ('p/a', 'p/b', 'p/c')


def test_past_delays_are_due_now() -> None:
    state = HandlerState(started=now(), delayed=now() - datetime.timedelta(seconds=5))
    assert state.awakened and not state.sleeping
    assert state.delay == 0


def test_finished_handlers_never_sleep() -> None:
    state = HandlerState(started=now(), delayed=now() + datetime.timedelta(hours=1), success=True)
    assert not state.sleeping
    assert state.delay == 0


def test_runtime_is_since_the_first_attempt() -> None:
    state = HandlerState(started=now() - datetime.timedelta(minutes=5))
    assert datetime.timedelta(minutes=5) <= state.runtime < datetime.timedelta(minutes=6)


def test_delays_of_the_unfinished_handlers() -> None:
    state = State({
        HandlerId('done'): HandlerState(started=now(), success=True),
        HandlerId('due'): HandlerState(started=now()),
        HandlerId('later'): HandlerState(started=now(), delayed=now() + datetime.timedelta(seconds=30)),
    })
    assert len(state.delays) == 2
    assert state.delays[0] == 0
    assert 29 < state.delays[1] <= 30
    assert state.delay == 0
    assert not state.done


def test_with_outcomes_advances_the_known_handlers_only() -> None:
    state = State({HandlerId('a'): HandlerState(started=now()), HandlerId('b'): HandlerState(started=now())},
                  purpose='create')
    new = state.with_outcomes({HandlerId('a'): Outcome(final=True), HandlerId('zzz'): Outcome(final=True)})
    assert set(new) == {'a', 'b'}
    assert new['a'].success and not new['b'].finished
    assert new.purpose == 'create'
    assert new.counts == (1, 0, 1)
    assert not state['a'].finished  # immutable


def test_done_with_successes_and_failures() -> None:
    state = State({HandlerId('a'): HandlerState(success=True), HandlerId('b'): HandlerState(failure=True)})
    assert state.done
    assert state.counts == (1, 1, 0)
    assert state.delays == []


def test_purge_removes_the_handlers_and_their_subhandlers(storage: Any, make_body: Any) -> None:
    body = Body(make_body(annotations={
        **annotations_of(KOPF_RECORDS),
        'kopf.zalando.org/create_sub.child1': '{}',
        'kopf.zalando.org/parent.c1': '{}',
        'kopf.zalando.org/parent.c2.g1': '{}',
        'kopf.zalando.org/stale': '{}',
        'someannotation': 'somevalue',
    }))
    handlers = [make_handler('create_sub'), make_handler('parent')]
    state = State.from_storage(body=body, storage=storage, handlers=handlers)
    patch = Patch()
    state.purge(body=body, patch=patch, storage=storage, handlers=[make_handler('stale')])
    assert patch == {'metadata': {'annotations': {
        'kopf.zalando.org/create_sub': None,
        'kopf.zalando.org/parent': None,
        'kopf.zalando.org/stale': None,
        'kopf.zalando.org/create_sub.child1': None,
        'kopf.zalando.org/parent.c1': None,
        'kopf.zalando.org/parent.c2.g1': None,
        # parent/c2 is not in the annotations: the storage does not purge the absent records.
    }}}


def test_update_superseded_by_deletion(storage: Any, make_body: Any) -> None:
    # As Kopf does it: the handlers of both keep their progress (incl. retries and delays),
    # the others are forgotten, and the counts of the superseded cycle are reported.
    future = (now() + datetime.timedelta(seconds=30)).isoformat()
    body = Body(make_body(annotations=annotations_of({
        'u': json.dumps({'started': now().isoformat(), 'delayed': future, 'purpose': 'update', 'retries': 1,
                         'success': False, 'failure': False, 'message': 'u wait'}),
        'u_done': json.dumps({'started': now().isoformat(), 'stopped': now().isoformat(), 'purpose': 'update',
                              'retries': 1, 'success': True, 'failure': False}),
        'fn2': json.dumps({'started': now().isoformat(), 'delayed': future, 'purpose': 'update', 'retries': 1,
                           'success': False, 'failure': False, 'message': 'upd wait'}),
    })))
    all_handlers = [make_handler('c'), make_handler('u'), make_handler('u_done'), make_handler('fn2')]
    delete_handlers = [make_handler('fn2')]

    state = State.from_storage(body=body, storage=storage, handlers=all_handlers)
    assert state.purpose == 'update'
    assert state.counts == (1, 0, 2)  # "1 succeeded; 0 failed; 2 left to the moment."

    patch = Patch()
    state.purge(body=body, patch=patch, storage=storage, handlers=all_handlers)
    state = state.with_purpose(Reason.DELETE).with_handlers(delete_handlers)
    state.store(body=body, patch=patch, storage=storage)

    annotations = patch['metadata']['annotations']
    assert annotations['kopf.zalando.org/u'] is None
    assert annotations['kopf.zalando.org/u_done'] is None
    record = json.loads(annotations['kopf.zalando.org/fn2'])
    assert record['purpose'] == 'delete'
    assert record['retries'] == 1
    assert record['delayed'] == future
    assert record['message'] == 'upd wait'
    assert list(state) == ['fn2']
    assert state.purpose == 'delete'
    assert state['fn2'].sleeping


def test_with_the_same_purpose_nothing_changes(storage: Any, make_body: Any) -> None:
    body = Body(make_body(annotations=annotations_of({'create_fn': KOPF_RECORDS['create_fn']})))
    state = State.from_storage(body=body, storage=storage, handlers=[make_handler('create_fn')])
    assert state.with_purpose(Reason.CREATE) is state
    patch = Patch()
    state.with_purpose(Reason.CREATE).store(body=body, patch=patch, storage=storage)
    assert not patch


def test_kwargs_of_the_handlers() -> None:
    started = now() - datetime.timedelta(seconds=10)
    state = State({HandlerId('a'): HandlerState(started=started, retries=3)})
    kwargs = state.kwargs_for(make_handler('a'))
    assert kwargs['retry'] == 3
    assert kwargs['started'] == started
    assert datetime.timedelta(seconds=10) <= kwargs['runtime'] < datetime.timedelta(seconds=11)
    fresh = state.kwargs_for(make_handler('b'))
    assert fresh['retry'] == 0
    assert fresh['runtime'] < datetime.timedelta(seconds=1)
