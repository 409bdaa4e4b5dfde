import logging
from typing import Any

import pytest

from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.diffs import Diff
from kopf._cogs.structs.patches import Patch
from kopf._cogs.structs.references import Resource
from kopf._core.intents.causes import (
    ActivityCause,
    ResourceChangingCause,
    ResourceWebhookCause,
    detect_changing_cause,
    detect_changing_reason,
)
from kopf._core.intents.handlers import (
    Activity,
    ActivityHandler,
    ChangingHandler,
    HandlerId,
    Reason,
    WebhookType,
)

KEX = Resource('kopf.dev', 'v1', 'kopfexamples')
OURS = 'kopf.zalando.org/KopfFinalizerMarker'
OTHER = 'other.example.com/finalizer'
LOGGER = logging.getLogger('tests.causes')


def fn(**_: Any) -> None:
    pass


ESSENCE = {'spec': {'a': 1}}
CHANGED = {'spec': {'a': 2}}


@pytest.mark.parametrize('event_type, finalizers, deleted, old, new, initial, expected', [
    # The object is gone from the cluster: nothing but forgetting it.
    ('DELETED', [OURS], True, ESSENCE, ESSENCE, True, Reason.GONE),
    ('DELETED', [], False, None, ESSENCE, False, Reason.GONE),
    # Being deleted: handled only if our finalizer blocks the deletion, regardless of other changes.
    ('MODIFIED', [], True, ESSENCE, ESSENCE, False, Reason.FREE),
    ('MODIFIED', [OTHER], True, ESSENCE, CHANGED, True, Reason.FREE),
    ('MODIFIED', [OURS], True, ESSENCE, ESSENCE, False, Reason.DELETE),
    ('MODIFIED', [OTHER, OURS], True, ESSENCE, CHANGED, True, Reason.DELETE),
    (None, [OURS], True, None, ESSENCE, True, Reason.DELETE),
    # Never handled: a creation, also when first seen in the initial listing.
    ('ADDED', [], False, None, ESSENCE, False, Reason.CREATE),
    (None, [], False, None, ESSENCE, True, Reason.CREATE),
    ('MODIFIED', [OURS], False, None, ESSENCE, False, Reason.CREATE),
    # Handled before: an update if the essence differs.
    ('MODIFIED', [OURS], False, ESSENCE, CHANGED, False, Reason.UPDATE),
    (None, [OURS], False, ESSENCE, CHANGED, True, Reason.UPDATE),
    # Unchanged: resuming if first seen in this operator's lifetime, otherwise nothing to do.
    (None, [OURS], False, ESSENCE, ESSENCE, True, Reason.RESUME),
    ('MODIFIED', [OURS], False, ESSENCE, ESSENCE, False, Reason.NOOP),
    ('MODIFIED', [], False, {}, {}, False, Reason.NOOP),
])
def test_detect_changing_reason(event_type, finalizers, deleted, old, new, initial, expected, make_body):
    raw = make_body(finalizers=finalizers, deleted=deleted)
    cause = detect_changing_cause(
        event_type=event_type, resource=KEX, body=Body(raw), old=old, new=new,
        finalizer=OURS, initial=initial, logger=LOGGER,
    )
    assert cause.reason == expected
    assert detect_changing_reason(event_type=event_type, body=raw, old=old, diff=cause.diff,
                                  finalizer=OURS, initial=initial) == expected


def test_detected_cause_carries_everything(make_body):
    raw = make_body(spec={'a': 2})
    body = Body(raw)
    patch = Patch()
    memo = object()
    cause = detect_changing_cause(
        event_type='MODIFIED', resource=KEX, body=body, old=ESSENCE, new=CHANGED, finalizer=OURS,
        initial=True, logger=LOGGER, patch=patch, memo=memo, indices={'idx': 1},
    )
    assert cause.reason == Reason.UPDATE
    assert cause.initial is True
    assert cause.diff == (('change', ('spec', 'a'), 1, 2),)
    assert cause.old == ESSENCE and cause.new == CHANGED
    assert cause.body is body and cause.patch is patch and cause.memo is memo
    assert cause.resource == KEX and cause.logger is LOGGER
    assert cause.indices == {'idx': 1}
    assert cause.deleted is False


def test_creation_diff_is_the_whole_essence(make_body):
    cause = detect_changing_cause(event_type='ADDED', resource=KEX, body=Body(make_body()), old=None,
                                  new=ESSENCE, finalizer=OURS, initial=False, logger=LOGGER)
    assert cause.diff == (('add', (), None, ESSENCE),)


def test_default_patch_is_made_for_the_body(make_body):
    body = Body(make_body())
    cause = detect_changing_cause(event_type='ADDED', resource=KEX, body=body, old=None, new={},
                                  finalizer=OURS, initial=False, logger=LOGGER)
    assert isinstance(cause.patch, Patch) and not cause.patch
    assert cause.patch.body is body


def test_resource_kwargs(make_body):
    raw = make_body(spec={'a': 1}, status={'s': 2}, labels={'l': 'v'}, annotations={'an': 'v'})
    body = Body(raw)
    cause = ResourceChangingCause(
        resource=KEX, body=body, logger=LOGGER, memo='memo', reason=Reason.UPDATE,
        old=ESSENCE, new=CHANGED, diff=Diff([('change', ('spec', 'a'), 1, 2)]),
    )
    kwargs = cause.kwargs
    assert kwargs['body'] is body
    assert kwargs['spec'] == {'a': 1} and kwargs['status'] == {'s': 2}
    assert kwargs['meta'] is body.metadata
    assert kwargs['labels'] == {'l': 'v'} and kwargs['annotations'] == {'an': 'v'}
    assert (kwargs['uid'], kwargs['name'], kwargs['namespace']) == ('uid1', 'kex1', 'ns1')
    assert kwargs['resource'] == KEX and kwargs['logger'] is LOGGER and kwargs['memo'] == 'memo'
    assert kwargs['patch'] is cause.patch
    assert kwargs['reason'] == Reason.UPDATE
    assert (kwargs['old'], kwargs['new'], kwargs['diff']) == (ESSENCE, CHANGED, cause.diff)
    assert 'param' not in kwargs


def test_handler_kwargs_are_narrowed_to_the_handler_field(make_body):
    cause = ResourceChangingCause(
        resource=KEX, body=Body(make_body()), logger=LOGGER, reason=Reason.UPDATE,
        old={'spec': {'a': 1, 'b': 0}}, new={'spec': {'a': 2, 'b': 0}},
        diff=Diff([('change', ('spec', 'a'), 1, 2)]),
    )
    whole = cause.kwargs_for(ChangingHandler(fn=fn, id=HandlerId('fn'), param=7))
    assert whole['param'] == 7
    assert whole['old'] == {'spec': {'a': 1, 'b': 0}}
    narrowed = cause.kwargs_for(ChangingHandler(fn=fn, id=HandlerId('fn'), field=('spec', 'a')))
    assert (narrowed['old'], narrowed['new']) == (1, 2)
    assert narrowed['diff'] == (('change', (), 1, 2),)
    parent = cause.kwargs_for(ChangingHandler(fn=fn, id=HandlerId('fn'), field=('spec',)))
    assert parent['old'] == {'a': 1, 'b': 0}
    assert parent['diff'] == (('change', ('a',), 1, 2),)
    absent = cause.kwargs_for(ChangingHandler(fn=fn, id=HandlerId('fn'), field=('spec', 'zzz')))
    assert (absent['old'], absent['new'], absent['diff']) == (None, None, ())


def test_indices_override_the_framework_kwargs(make_body):
    cause = ResourceChangingCause(
        resource=KEX, body=Body(make_body()), logger=LOGGER, reason=Reason.UPDATE,
        old={'spec': {'a': 1}}, new={'spec': {'a': 2}}, diff=Diff([('change', ('spec', 'a'), 1, 2)]),
        indices={'name': 'an index', 'old': 'another index', 'param': 'idx'},
    )
    kwargs = cause.kwargs_for(ChangingHandler(fn=fn, id=HandlerId('fn'), field=('spec', 'a'), param=1))
    assert kwargs['name'] == 'an index' and kwargs['old'] == 'another index' and kwargs['param'] == 'idx'
    assert kwargs['new'] == 2


def test_activity_kwargs():
    settings = object()
    cause = ActivityCause(activity=Activity.STARTUP, settings=settings, logger=LOGGER, memo='m',
                          indices={'idx': 1})
    kwargs = cause.kwargs_for(ActivityHandler(fn=fn, id=HandlerId('fn'), activity=Activity.STARTUP, param=2))
    assert kwargs == {'activity': Activity.STARTUP, 'settings': settings, 'logger': LOGGER, 'memo': 'm',
                      'idx': 1, 'param': 2}


def test_webhook_kwargs(make_body):
    warnings: list[str] = []
    cause = ResourceWebhookCause(
        resource=KEX, body=Body(make_body()), logger=LOGGER, reason=WebhookType.VALIDATING,
        operation='CREATE', subresource=None, dryrun=True, userinfo={'username': 'admin'},
        warnings=warnings, headers={'Host': 'x'}, sslpeer={'subject': ()},
    )
    kwargs = cause.kwargs
    assert kwargs['warnings'] is warnings
    assert kwargs['dryrun'] is True and kwargs['operation'] == 'CREATE' and kwargs['subresource'] is None
    assert kwargs['userinfo'] == {'username': 'admin'}
    assert kwargs['headers'] == {'Host': 'x'} and kwargs['sslpeer'] == {'subject': ()}
    assert kwargs['name'] == 'kex1'


def test_kwargs_are_new_dicts_every_time_so_changes_do_not_leak(make_body):
    cause = ResourceChangingCause(
        resource=KEX, body=Body(make_body()), logger=LOGGER, reason=Reason.UPDATE,
        old={'spec': {'a': 1}}, new={'spec': {'a': 2}}, diff=Diff([('change', ('spec', 'a'), 1, 2)]),
    )
    first = cause.kwargs
    first['state'] = 'added by a lifecycle'
    first['name'] = 'overwritten'
    narrowed = cause.kwargs_for(ChangingHandler(fn=fn, id=HandlerId('fn'), field=('spec', 'a'), param=1))
    narrowed['extra'] = True
    whole = cause.kwargs_for(ChangingHandler(fn=fn, id=HandlerId('fn'), param=2))
    assert 'state' not in whole and 'extra' not in whole and 'state' not in cause.kwargs
    assert whole['name'] == cause.kwargs['name'] == 'kex1'
    assert whole['old'] == {'spec': {'a': 1}} and whole['param'] == 2
    assert narrowed['old'] == 1 and narrowed['param'] == 1
