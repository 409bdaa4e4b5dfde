"""The validating & mutating handlers, served by kopf.WebhookServer, called by the emulator over TLS."""
import logging
from typing import Any

import pytest

import kopf

from .conftest import MANAGED


async def test_validation_denies_with_the_message_and_code(registry, settings, operator, cluster) -> None:
    @kopf.on.validate('kopfexamples', registry=registry)
    def check_numbers(spec: Any, **_: Any) -> None:
        if not isinstance(spec.get('numbers', []), list):
            raise kopf.AdmissionError('Numbers must be a list if present.', code=499)

    async with operator(registry, settings):
        denied = await cluster.create('kex1', {'numbers': 'nope'})
        allowed = await cluster.create('kex2', {'numbers': [1, 2]})

    assert denied.status == 499
    assert denied.message == ('admission webhook "check-numbers.auto.kopf.dev" denied the request: '
                              'Numbers must be a list if present.')
    assert allowed.status == 201
    assert cluster.get('kex1') is None
    assert cluster.get('kex2') is not None


async def test_other_errors_deny_with_500_unless_ignored(
        registry, settings, operator, cluster, caplog,
) -> None:
    @kopf.on.validate('kopfexamples', registry=registry)
    def broken(spec: Any, **_: Any) -> None:
        if spec.get('break'):
            raise ValueError('something is wrong')

    @kopf.on.validate('kopfexamples', registry=registry, ignore_failures=True)
    def tolerated(**_: Any) -> None:
        raise ValueError('ignored')

    async with operator(registry, settings):
        denied = await cluster.create('kex1', {'break': True})
        allowed = await cluster.create('kex2', {'break': False})

    assert allowed.status == 201
    assert denied.status == 500
    assert denied.message == 'admission webhook "broken.auto.kopf.dev" denied the request: something is wrong'
    failures = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert any(record.getMessage() == "Webhook 'broken' failed with an exception and will stop now: "
               "something is wrong" for record in failures)
    assert any(record.getMessage() == "Webhook 'tolerated' failed with an exception and will stop now: "
               "ignored It is ignored (ignore_failures=True)." for record in failures)


async def test_admission_log_lines_and_levels_are_kopfs(
        registry, settings, operator, cluster, caplog,
) -> None:
    # As Kopf 1.45.2 logs them (users grep and alert on these lines).
    caplog.set_level(logging.DEBUG)

    @kopf.on.validate('kopfexamples', registry=registry)
    def passing(**_: Any) -> None:
        pass

    @kopf.on.validate('kopfexamples', registry=registry)
    def denying(spec: Any, **_: Any) -> None:
        if spec.get('deny'):
            raise kopf.AdmissionError('not like this', code=400)

    @kopf.on.validate('kopfexamples', registry=registry)
    def temporary(spec: Any, **_: Any) -> None:
        if spec.get('temporary'):
            raise kopf.TemporaryError('later')

    async with operator(registry, settings):
        await cluster.create('kex1', {'deny': True})
        await cluster.create('kex2', {'temporary': True})

    lines = [(record.levelname, record.getMessage())
             for record in caplog.records if record.name == 'kopf.objects']
    assert ('DEBUG', "Webhook 'passing' is invoked.") in lines
    assert ('INFO', "Webhook 'passing' succeeded.") in lines
    assert ('ERROR', "Webhook 'denying' failed permanently: not like this") in lines
    assert ('ERROR', "Webhook 'temporary' failed temporarily: later") in lines
    managers = [(record.levelname, record.getMessage()) for record in caplog.records
                if record.name.startswith('kopf._core.engines.admission')]
    assert ('INFO', 'Reconfiguring the validating webhook auto.kopf.dev.') in managers
    assert ('INFO', 'Cleaning up the admission webhook auto.kopf.dev.') in managers


async def test_warnings_reach_the_user(registry, settings, operator, cluster) -> None:
    @kopf.on.validate('kopfexamples', registry=registry)
    def say_hello(warnings: list[str], **_: Any) -> None:
        warnings.append("Verified with the operator's hook.")

    @kopf.on.validate('kopfexamples', registry=registry)
    async def say_hello_async(warnings: list[str], **_: Any) -> None:
        warnings.append('And with an async one.')

    async with operator(registry, settings):
        answer = await cluster.create('kex1')

    assert answer.status == 201
    assert sorted(answer.warnings) == sorted(["Verified with the operator's hook.", 'And with an async one.'])


async def test_mutations_are_applied_and_combined(registry, settings, operator, cluster) -> None:
    @kopf.on.mutate('kopfexamples', registry=registry)
    def ensure_default_numbers(spec: Any, patch: kopf.Patch, **_: Any) -> None:
        if 'numbers' not in spec:
            patch.spec['numbers'] = [1, 2, 3]

    @kopf.on.mutate('kopfexamples', registry=registry)
    def label_it(patch: kopf.Patch, **_: Any) -> None:
        patch.metadata.labels['mutated'] = 'yes'

    @kopf.on.mutate('kopfexamples', registry=registry, operations=['UPDATE'])
    def on_updates_only(patch: kopf.Patch, **_: Any) -> None:
        patch.spec['updated'] = True

    async with operator(registry, settings):
        created = await cluster.create('kex1', {'field': 'value'})
        stored_after_creation = cluster.get('kex1')
        updated = await cluster.patch('kex1', {'spec': {'field': 'other'}})
        stored_after_update = cluster.get('kex1')

    assert created.status == 201
    assert updated.status == 200
    assert stored_after_creation is not None and stored_after_update is not None
    assert stored_after_creation['spec'] == {'field': 'value', 'numbers': [1, 2, 3]}
    assert stored_after_creation['metadata']['labels'] == {'mutated': 'yes'}
    assert stored_after_update['spec'] == {'field': 'other', 'numbers': [1, 2, 3], 'updated': True}


async def test_mutations_to_values_equal_in_python_but_not_in_json_are_applied(
        registry, settings, operator, cluster,
) -> None:
    # True == 1 and False == 0 in Python, but not in JSON: the mutations must not be taken as no changes.
    @kopf.on.mutate('kopfexamples', registry=registry)
    def to_booleans(spec: Any, patch: kopf.Patch, **_: Any) -> None:
        patch.spec['enabled'] = bool(spec.get('enabled'))
        patch.spec['flags'] = [bool(flag) for flag in spec.get('flags', [])]
        patch.spec['count'] = int(spec.get('count', 0))

    async with operator(registry, settings):
        created = await cluster.create('kex1', {'enabled': 1, 'flags': [0, 1], 'count': False})
        stored = cluster.get('kex1')

    assert created.status == 201
    assert stored is not None
    assert stored['spec'] == {'enabled': True, 'flags': [False, True], 'count': 0}
    assert [type(value) for value in [stored['spec']['enabled'], *stored['spec']['flags']]] == [bool] * 3
    assert type(stored['spec']['count']) is int


async def test_kwargs_of_the_admission(registry, settings, operator, cluster) -> None:
    seen: list[dict[str, Any]] = []

    @kopf.on.validate('kopfexamples', registry=registry)
    def remember(**kwargs: Any) -> None:
        seen.append(dict(kwargs))

    async with operator(registry, settings):
        await cluster.create('kex1', {'x': 1})
        await cluster.create('kex2', {'x': 2}, dry_run=True)
        await cluster.patch('kex1', {'spec': {'x': 3}})
        await cluster.delete('kex1')

    assert [(kw['operation'], kw['dryrun'], kw['name']) for kw in seen] == [
        ('CREATE', False, 'kex1'), ('CREATE', True, 'kex2'),
        ('UPDATE', False, 'kex1'), ('DELETE', False, 'kex1'),
    ]
    first = seen[0]
    assert first['spec'] == {'x': 1}
    assert first['namespace'] == 'default'
    assert first['subresource'] is None
    assert first['userinfo']['username']
    assert first['headers']['Content-Type'].startswith('application/json')
    assert first['sslpeer'] == {}  # no client certificate: an empty mapping, as in Kopf
    assert first['sslpeer'].get('subject') is None  # as Kopf's own admission example reads it
    assert first['resource'].plural == 'kopfexamples'
    assert isinstance(first['warnings'], list)
    assert isinstance(first['patch'], kopf.Patch)
    assert seen[3]['body']['spec'] == {'x': 3}  # deletions: the object as it was


async def test_dry_run_is_checked_but_not_stored(registry, settings, operator, cluster) -> None:
    dryruns: list[bool] = []

    @kopf.on.validate('kopfexamples', registry=registry, side_effects=True)
    def side_effects(dryrun: bool, **_: Any) -> None:
        dryruns.append(dryrun)

    @kopf.on.validate('kopfexamples', registry=registry)
    def deny_bad(spec: Any, **_: Any) -> None:
        if spec.get('bad'):
            raise kopf.AdmissionError('bad', code=400)

    async with operator(registry, settings):
        denied = await cluster.create('kex1', {'bad': True}, dry_run=True)
        allowed = await cluster.create('kex1', {'bad': False}, dry_run=True)
        webhooks = (cluster.configuration('validating') or {}).get('webhooks', [])

    assert denied.status == 400
    assert allowed.status == 201
    assert cluster.get('kex1') is None
    assert dryruns == [True, True]
    assert {webhook['name']: webhook['sideEffects'] for webhook in webhooks} == {
        f'side-effects.{MANAGED}': 'NoneOnDryRun', f'deny-bad.{MANAGED}': 'None',
    }


async def test_filters_and_operations(registry, settings, operator, cluster) -> None:
    calls: list[str] = []

    @kopf.on.validate('kopfexamples', registry=registry, labels={'checked': 'yes'})
    def by_labels(name: str, **_: Any) -> None:
        calls.append(f'labels:{name}')

    @kopf.on.validate('kopfexamples', registry=registry, when=lambda spec, **_: spec.get('x') == 1)
    def by_callback(name: str, **_: Any) -> None:
        calls.append(f'when:{name}')

    @kopf.on.validate('kopfexamples', registry=registry, operation='DELETE')
    def on_deletion(name: str, **_: Any) -> None:
        calls.append(f'delete:{name}')

    @kopf.on.validate('kopfexamples', registry=registry, field='spec.x', value=2)
    def by_field(name: str, **_: Any) -> None:
        calls.append(f'field:{name}')

    @kopf.on.validate('kopfexamples', registry=registry, annotations={'note': kopf.PRESENT},
                      labels={'skipped': kopf.ABSENT})
    def by_annotations(name: str, **_: Any) -> None:
        calls.append(f'annotations:{name}')

    async with operator(registry, settings):
        await cluster.create('kex1', {'x': 1}, labels={'checked': 'yes'})
        await cluster.create('kex2', {'x': 2})
        await cluster.patch('kex2', {'metadata': {'annotations': {'note': 'hi'}}})
        await cluster.delete('kex2')
        webhooks = (cluster.configuration('validating') or {}).get('webhooks', [])

    assert calls == ['labels:kex1', 'when:kex1', 'field:kex2',
                     'field:kex2', 'annotations:kex2', 'delete:kex2', 'field:kex2', 'annotations:kex2']
    by_name = {webhook['name']: webhook for webhook in webhooks}
    assert by_name[f'by-labels.{MANAGED}']['objectSelector'] == {
        'matchExpressions': [{'key': 'checked', 'operator': 'In', 'values': ['yes']}]}
    assert by_name[f'by-callback.{MANAGED}']['objectSelector'] == {}
    assert by_name[f'on-deletion.{MANAGED}']['rules'][0]['operations'] == ['DELETE']
    assert by_name[f'by-callback.{MANAGED}']['rules'][0]['operations'] == ['*']
    assert by_name[f'by-annotations.{MANAGED}']['objectSelector'] == {
        'matchExpressions': [{'key': 'skipped', 'operator': 'DoesNotExist'}]}


async def test_indices_and_memos_are_passed(registry, settings, operator, cluster, eventually) -> None:
    seen: list[Any] = []

    @kopf.index('kopfexamples', registry=registry)
    def by_name(name: str, **_: Any) -> Any:
        return {name: 'indexed'}

    @kopf.on.validate('kopfexamples', registry=registry, operation='UPDATE')
    def peek(by_name: kopf.Index[str, str], memo: kopf.Memo, **_: Any) -> None:
        seen.append((dict(by_name), memo.get('mark')))

    @kopf.on.create('kopfexamples', registry=registry)
    def mark(memo: kopf.Memo, **_: Any) -> None:
        memo['mark'] = 'remembered'

    async with operator(registry, settings, configured=1):
        await cluster.create('kex1')
        await eventually(lambda: 'kopf.zalando.org/last-handled-configuration' in
                         ((cluster.get('kex1') or {}).get('metadata', {}).get('annotations') or {}))
        await cluster.patch('kex1', {'spec': {'x': 1}})

    assert len(seen) >= 1
    index, remembered = seen[0]
    assert set(index) == {'kex1'}
    assert remembered == 'remembered'


@pytest.mark.parametrize('subresource, expected', [
    (None, ['kopfexamples']),
    ('status', ['kopfexamples/status']),
    ('*', ['kopfexamples', 'kopfexamples/*']),
])
async def test_subresources_in_the_rules(
        registry, settings, operator, cluster, subresource, expected,
) -> None:
    @kopf.on.validate('kopfexamples', registry=registry, subresource=subresource)
    def fn(**_: Any) -> None:
        pass

    async with operator(registry, settings):
        webhooks = (cluster.configuration('validating') or {}).get('webhooks', [])

    assert webhooks[0]['rules'][0]['resources'] == expected


async def test_admission_alone_never_makes_the_operator_remember_objects(registry, settings, operator,
                                                                         cluster) -> None:
    memos: list[Any] = []

    @kopf.on.validate('kopfexamples', registry=registry)
    def fn(memo: kopf.Memo, **_: Any) -> None:
        memo['seen'] = True  # a throwaway memo: the objects are not watched by this operator
        memos.append(memo)

    memories = kopf.ResourceMemories()
    async with operator(registry, settings, memories=memories):
        await cluster.create('kex1')
        await cluster.patch('kex1', {'spec': {'x': 1}})
        await cluster.delete('kex1')

    assert len(memos) == 3
    assert len(memories) == 0
