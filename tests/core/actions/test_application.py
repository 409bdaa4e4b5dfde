import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kopf._clients.creating import create_obj
from kopf._clients.deleting import delete_obj
from kopf._clients.errors import APIError
from kopf._clients.patching import json_patch_obj
from kopf._clients.vault import Vault
from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.credentials import ConnectionInfo, VaultKey
from kopf._cogs.structs.patches import Patch
from kopf._cogs.structs.references import Resource
from kopf._core.actions.application import apply_patch, touch
from kopf._core.intents.configuration import OperatorSettings

CRDS = Resource('apiextensions.k8s.io', 'v1', 'customresourcedefinitions', namespaced=False)
WITH_STATUS = Resource('kopf.dev', 'v1', 'kopfexamples', namespaced=True, subresources=frozenset({'status'}))
NO_STATUS = Resource('kopf.dev', 'v1', 'kopfplains', namespaced=True)


def crd_body(plural: str, kind: str, *, status: bool) -> dict[str, Any]:
    version: dict[str, Any] = {
        'name': 'v1', 'served': True, 'storage': True,
        'schema': {'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}},
    }
    if status:
        version['subresources'] = {'status': {}}
    return {
        'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
        'metadata': {'name': f'{plural}.kopf.dev'},
        'spec': {'group': 'kopf.dev', 'scope': 'Namespaced', 'versions': [version],
                 'names': {'plural': plural, 'singular': plural[:-1], 'kind': kind}},
    }


@pytest.fixture
async def vault(k8s_emulator: Any) -> AsyncIterator[Vault]:
    vault = Vault({VaultKey('emulator'): ConnectionInfo(server=k8s_emulator.url)})
    yield vault
    await vault.close()


@pytest.fixture
def settings() -> OperatorSettings:
    return OperatorSettings()


@pytest.fixture
async def created(k8s_emulator: Any, vault: Vault, settings: OperatorSettings) -> dict[str, Any]:
    for plural, kind, status in [('kopfexamples', 'KopfExample', True), ('kopfplains', 'KopfPlain', False)]:
        crd = crd_body(plural, kind, status=status)
        await create_obj(settings=settings, vault=vault, resource=CRDS, body=crd)
    body = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
            'metadata': {'name': 'kex1', 'namespace': 'default', 'annotations': {'a': 'b'}},
            'spec': {'items': ['x', 'y']}}
    created = await create_obj(settings=settings, vault=vault, resource=WITH_STATUS, body=body)
    k8s_emulator.requests.reset()
    return dict(created)


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)


@pytest.fixture
def logger() -> logging.Logger:
    return logging.getLogger('tests.actions')


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == 'tests.actions']


async def test_merge_patch_without_status_is_one_request(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    patch = Patch()
    patch.meta.annotations['kopf.zalando.org/fn'] = '{}'
    patch.meta.annotations['a'] = None
    patch.spec['z'] = 1
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=Body(created),
                               patch=patch, logger=logger)
    assert result is not None
    assert result['metadata']['annotations'] == {'kopf.zalando.org/fn': '{}'}
    assert result['spec'] == {'items': ['x', 'y'], 'z': 1}
    assert k8s_emulator.requests.count('patch') == 1
    assert messages(caplog) == [
        "Merge-patching the resource with: "
        "{'metadata': {'annotations': {'kopf.zalando.org/fn': '{}', 'a': None}}, 'spec': {'z': 1}}",
    ]


async def test_merge_patch_with_status_is_split_into_two_requests(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    patch = Patch()
    patch.meta.annotations['kopf.zalando.org/fn'] = '{}'
    patch.status['fn'] = {'message': 'hello'}
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                               patch=patch, logger=logger)
    assert result is not None
    assert result['metadata']['annotations']['kopf.zalando.org/fn'] == '{}'
    assert result['status'] == {'fn': {'message': 'hello'}}
    assert k8s_emulator.requests.count('patch') == 2
    assert k8s_emulator.requests.count('patch', subresource='status') == 1
    assert messages(caplog) == [
        "Merge-patching the resource with: {'metadata': {'annotations': {'kopf.zalando.org/fn': '{}'}}}",
        "Merge-patching the status with: {'status': {'fn': {'message': 'hello'}}}",
    ]


async def test_status_only_is_one_request(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger) -> None:
    patch = Patch()
    patch.status['fn'] = 1
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                               patch=patch, logger=logger)
    assert result is not None and result['status'] == {'fn': 1}
    assert k8s_emulator.requests.count('patch') == 1
    assert k8s_emulator.requests.count('patch', subresource='status') == 1


async def test_status_goes_with_the_rest_without_the_subresource(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    plain = await create_obj(settings=settings, vault=vault, resource=NO_STATUS, body={
        'apiVersion': 'kopf.dev/v1', 'kind': 'KopfPlain', 'metadata': {'name': 'p1', 'namespace': 'default'}})
    k8s_emulator.requests.reset()
    patch = Patch()
    patch.meta.labels['x'] = 'y'
    patch.status['fn'] = 1
    result = await apply_patch(settings=settings, vault=vault, resource=NO_STATUS, body=plain,
                               patch=patch, logger=logger)
    assert result is not None
    assert result['status'] == {'fn': 1}
    assert result['metadata']['labels'] == {'x': 'y'}
    assert k8s_emulator.requests.count('patch') == 1
    assert messages(caplog) == [
        "Merge-patching the resource with: {'metadata': {'labels': {'x': 'y'}}, 'status': {'fn': 1}}",
    ]


async def test_functions_are_applied_as_a_guarded_json_patch(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    patch = Patch()
    patch.spec['z'] = 1
    patch.fns.append(lambda body: body['spec']['items'].remove('x'))
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                               patch=patch, logger=logger)
    assert result is not None
    assert result['spec'] == {'items': ['y'], 'z': 1}
    assert k8s_emulator.requests.count('patch') == 2
    logs = messages(caplog)
    assert logs[0] == "Merge-patching the resource with: {'spec': {'z': 1}}"
    # The guard is the version after the merge-patch, not the original one:
    version = int(created['metadata']['resourceVersion'])
    assert logs[1].startswith("JSON-patching the resource with: [{'op': 'test', 'path': "
                              "'/metadata/resourceVersion'")
    assert f"'value': '{version}'" not in logs[1]
    assert "{'op': 'remove', 'path': '/spec/items/0'}" in logs[1]


async def test_functions_against_a_changed_object_fail(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger) -> None:
    outdated = dict(created, metadata=dict(created['metadata'], resourceVersion='1'))
    patch = Patch()
    patch.fns.append(lambda body: body['spec']['items'].remove('x'))
    with pytest.raises(APIError):
        await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=outdated,
                          patch=patch, logger=logger)


async def test_functions_with_no_changes_send_nothing(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger) -> None:
    patch = Patch()
    patch.fns.append(lambda body: None)
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                               patch=patch, logger=logger)
    assert result == created
    assert k8s_emulator.requests.count('patch') == 0


async def test_empty_patch_sends_nothing(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=Body(created),
                               patch=Patch(), logger=logger)
    assert result == created
    assert k8s_emulator.requests.total == 0
    assert messages(caplog) == []


@pytest.mark.parametrize('with_fns', [False, True])
async def test_gone_object(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, with_fns: bool) -> None:
    await delete_obj(settings=settings, vault=vault, resource=WITH_STATUS, namespace='default', name='kex1')
    patch = Patch()
    if with_fns:
        patch.fns.append(lambda body: body['spec']['items'].remove('x'))
    else:
        patch.spec['z'] = 1
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                               patch=patch, logger=logger)
    assert result is None


async def test_touch(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, caplog: pytest.LogCaptureFixture, storage: Any) -> None:
    result = await touch(settings=settings, vault=vault, resource=WITH_STATUS, body=Body(created),
                         storage=storage, logger=logger)
    assert result is not None
    value = result['metadata']['annotations']['kopf.zalando.org/touch-dummy']
    assert value.endswith('+00:00')
    assert k8s_emulator.requests.count('patch') == 1
    assert messages(caplog) == [
        f"Merge-patching the resource with: {{'metadata': {{'annotations': "
        f"{{'kopf.zalando.org/touch-dummy': '{value}'}}}}}}",
    ]


async def test_one_request_for_a_whole_successful_cycle(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, storage: Any, make_cause: Any) -> None:
    # A single handler with no result: its progress and the diff-base (and the finalizer) in one request.
    from kopf._core.actions.execution import execute_handlers_once
    from kopf._core.actions.lifecycles import asap
    from kopf._core.actions.progression import State
    from kopf._core.intents.handlers import ChangingHandler, HandlerId

    handlers = [ChangingHandler(fn=lambda **_: None, id=HandlerId('fn'))]
    settings.persistence.progress_storage = storage
    cause = make_cause(created)
    state = State.from_storage(body=cause.body, storage=storage, handlers=handlers)
    state = state.with_purpose(cause.reason).with_handlers(handlers)
    outcomes = await execute_handlers_once(lifecycle=asap, settings=settings, handlers=handlers, cause=cause,
                                           state=state, logger=logger)
    state = state.with_outcomes(outcomes)
    assert state.done
    state.purge(body=cause.body, patch=cause.patch, storage=storage, handlers=handlers)
    cause.patch.meta.annotations['kopf.zalando.org/last-handled-configuration'] = '{"spec":{}}'
    cause.patch.meta['finalizers'] = ['kopf.zalando.org/KopfFinalizerMarker']
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=cause.body,
                               patch=cause.patch, logger=logger)
    assert result is not None
    assert result['metadata']['finalizers'] == ['kopf.zalando.org/KopfFinalizerMarker']
    assert k8s_emulator.requests.count('patch') == 1


#
# Our finalizer: the writer guards the whole list by the version, and falls back to a JSON-patch.
#

OURS = 'kopf.zalando.org/KopfFinalizerMarker'
TEST_FAILED = 'testing value /metadata/resourceVersion'  # a JSON-patch's `test` operation has failed


async def add_others_finalizer(k8s_emulator: Any, vault: Vault, settings: OperatorSettings) -> None:
    """Someone else's finalizer added to the object (after the test has seen it); its requests not counted."""
    json_patch = [{'op': 'add', 'path': '/metadata/finalizers', 'value': ['other/finalizer']}]
    await json_patch_obj(settings=settings, vault=vault, resource=WITH_STATUS,
                         namespace='default', name='kex1', patch=json_patch)
    k8s_emulator.requests.reset()


async def test_adding_our_finalizer_is_guarded_by_the_version_and_leaves_the_patch_intact(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    patch = Patch()
    patch.meta['finalizers'] = [OURS]
    patch.status['fn'] = 1
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                               patch=patch, logger=logger)
    assert result is not None
    assert result['metadata']['finalizers'] == [OURS]
    assert result['status'] == {'fn': 1}
    assert patch == {'metadata': {'finalizers': [OURS]}, 'status': {'fn': 1}}  # not modified by the guard
    version = created['metadata']['resourceVersion']
    assert messages(caplog) == [
        f"Merge-patching the resource with: {{'metadata': {{'finalizers': ['{OURS}'], "
        f"'resourceVersion': '{version}'}}}}",
        "Merge-patching the status with: {'status': {'fn': 1}}",
    ]
    assert k8s_emulator.requests.count('patch') == 2


async def test_adding_our_finalizer_to_a_changed_object_keeps_the_others_finalizers(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    # Someone adds their finalizer after we have seen the object: our whole list would lose it.
    await add_others_finalizer(k8s_emulator, vault, settings)

    patch = Patch()
    patch.meta['finalizers'] = [OURS]
    patch.meta.labels['x'] = 'y'
    patch.status['fn'] = 1
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                               patch=patch, logger=logger)
    assert result is not None
    stored = k8s_emulator.get_object('kopfexamples.kopf.dev', 'kex1', namespace='default')
    assert stored['metadata']['finalizers'] == ['other/finalizer', OURS]
    assert stored['metadata']['labels'] == {'x': 'y'}
    assert stored['status'] == {'fn': 1}
    assert result['metadata']['resourceVersion'] == stored['metadata']['resourceVersion']
    assert 'The object has changed meanwhile; the finalizer is changed separately.' in messages(caplog)
    # The rejected guarded patch; the rest (main, status); the finalizer alone.
    assert k8s_emulator.requests.count('patch') == 4
    assert k8s_emulator.requests.count('patch', subresource='status') == 1


async def test_our_finalizer_is_retried_when_the_object_changes_again_meanwhile(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    # The guarded merge-patch is rejected (the object has changed), and then the JSON-patch too
    # (it has changed again between the fresh read and the JSON-patch): it is built anew from a newer state.
    k8s_emulator.fail_requests(1, status=409, method='PATCH', message='the object has been modified')
    k8s_emulator.fail_requests(1, status=422, method='PATCH', message=TEST_FAILED)
    patch = Patch()
    patch.meta['finalizers'] = [OURS]
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                               patch=patch, logger=logger)
    assert result is not None
    stored = k8s_emulator.get_object('kopfexamples.kopf.dev', 'kex1', namespace='default')
    assert stored['metadata']['finalizers'] == [OURS]
    assert result['metadata']['resourceVersion'] == stored['metadata']['resourceVersion']
    assert 'The object has changed again; retrying the finalizer on it.' in messages(caplog)
    # The guarded merge-patch (409), a read, the JSON-patch (422), a read, the JSON-patch.
    assert k8s_emulator.requests.count('patch') == 3
    assert k8s_emulator.requests.count('get') == 2


async def test_our_finalizer_fails_when_the_object_keeps_changing(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger) -> None:
    k8s_emulator.fail_requests(1, status=409, method='PATCH', message='the object has been modified')
    k8s_emulator.fail_requests(None, status=422, method='PATCH', message=TEST_FAILED)
    patch = Patch()
    patch.meta['finalizers'] = [OURS]
    with pytest.raises(APIError) as err:
        await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                          patch=patch, logger=logger)
    assert err.value.status == 422
    assert k8s_emulator.requests.count('patch') == 1 + 3  # a limited number of attempts, no endless loop
    stored = k8s_emulator.get_object('kopfexamples.kopf.dev', 'kex1', namespace='default')
    assert not stored['metadata'].get('finalizers')


async def test_releasing_puts_the_status_first_then_removes_our_finalizer(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    blocked = Patch()
    blocked.meta['finalizers'] = [OURS]
    await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                      patch=blocked, logger=logger)
    await delete_obj(settings=settings, vault=vault, resource=WITH_STATUS, namespace='default', name='kex1')
    deleting = k8s_emulator.get_object('kopfexamples.kopf.dev', 'kex1', namespace='default')
    assert deleting['metadata']['deletionTimestamp']
    caplog.clear()
    k8s_emulator.requests.reset()

    patch = Patch()
    patch.meta['finalizers'] = None
    patch.status['fn'] = 'done'
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=deleting,
                               patch=patch, logger=logger)
    assert result is not None
    assert k8s_emulator.get_object('kopfexamples.kopf.dev', 'kex1', namespace='default') is None
    logs = messages(caplog)
    assert logs[0] == "Merge-patching the status with: {'status': {'fn': 'done'}}"
    assert logs[1].startswith("Merge-patching the resource with: {'metadata': {'finalizers': None, ")
    assert k8s_emulator.requests.count('patch') == 2


@pytest.fixture
def quiet_logger() -> logging.Logger:
    """A logger with no debug logs: the writer decodes the responses in full for the debug logs' checks."""
    logger = logging.getLogger('tests.actions.quiet')
    logger.setLevel(logging.INFO)
    return logger


async def test_our_finalizer_for_the_version_only_reads_only_the_version(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        quiet_logger: logging.Logger) -> None:
    patch = Patch()
    patch.meta['finalizers'] = [OURS]
    patch.status['fn'] = 1
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                               patch=patch, logger=quiet_logger, version_only=True)
    stored = k8s_emulator.get_object('kopfexamples.kopf.dev', 'kex1', namespace='default')
    assert stored['metadata']['finalizers'] == [OURS]
    assert stored['status'] == {'fn': 1}
    assert result == {'metadata': {'resourceVersion': stored['metadata']['resourceVersion']}}
    assert k8s_emulator.requests.count('patch') == 2


async def test_our_finalizer_for_the_version_only_on_a_changed_object_reads_it_in_full(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        quiet_logger: logging.Logger) -> None:
    # The fallback's JSON-patch is built from the fresh object's finalizers: it is decoded whatever is asked.
    await add_others_finalizer(k8s_emulator, vault, settings)

    patch = Patch()
    patch.meta['finalizers'] = [OURS]
    patch.meta.labels['x'] = 'y'
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                               patch=patch, logger=quiet_logger, version_only=True)
    stored = k8s_emulator.get_object('kopfexamples.kopf.dev', 'kex1', namespace='default')
    assert stored['metadata']['finalizers'] == ['other/finalizer', OURS]
    assert stored['metadata']['labels'] == {'x': 'y'}
    assert result is not None
    assert result['metadata']['resourceVersion'] == stored['metadata']['resourceVersion']
    assert k8s_emulator.requests.count('patch') == 3  # the rejected guarded one, the rest, the finalizer


async def test_releasing_for_the_version_only_reads_only_the_version(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, quiet_logger: logging.Logger) -> None:
    blocked = Patch()
    blocked.meta['finalizers'] = [OURS, 'other/finalizer']
    await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                      patch=blocked, logger=logger)
    await delete_obj(settings=settings, vault=vault, resource=WITH_STATUS, namespace='default', name='kex1')
    deleting = k8s_emulator.get_object('kopfexamples.kopf.dev', 'kex1', namespace='default')
    k8s_emulator.requests.reset()

    patch = Patch()
    patch.meta['finalizers'] = ['other/finalizer']
    patch.status['fn'] = 'done'
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=deleting,
                               patch=patch, logger=quiet_logger, version_only=True)
    released = k8s_emulator.get_object('kopfexamples.kopf.dev', 'kex1', namespace='default')
    assert released['metadata']['finalizers'] == ['other/finalizer']
    assert released['status'] == {'fn': 'done'}
    assert result == {'metadata': {'resourceVersion': released['metadata']['resourceVersion']}}
    assert k8s_emulator.requests.count('patch') == 2


async def test_other_finalizers_are_not_guarded(
        k8s_emulator: Any, vault: Vault, settings: OperatorSettings, created: dict[str, Any],
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    patch = Patch()
    patch.meta['finalizers'] = ['other/finalizer']
    result = await apply_patch(settings=settings, vault=vault, resource=WITH_STATUS, body=created,
                               patch=patch, logger=logger)
    assert result is not None and result['metadata']['finalizers'] == ['other/finalizer']
    assert messages(caplog) == [
        "Merge-patching the resource with: {'metadata': {'finalizers': ['other/finalizer']}}",
    ]


#
# Sleeping for the delayed handlers.
#

@pytest.mark.looptime
async def test_sleep_fully() -> None:
    from kopf._core.actions.application import sleep
    loop = asyncio.get_running_loop()
    assert await sleep(10, asyncio.Event()) is None
    assert loop.time() == pytest.approx(10)
    assert await sleep(5) is None
    assert loop.time() == pytest.approx(15)


@pytest.mark.looptime
async def test_sleep_interrupted() -> None:
    from kopf._core.actions.application import sleep
    loop = asyncio.get_running_loop()
    wakeup = asyncio.Event()
    loop.call_later(3, wakeup.set)
    left = await sleep(10, wakeup)
    assert left == pytest.approx(7)
    assert loop.time() == pytest.approx(3)


@pytest.mark.looptime
async def test_sleep_with_the_event_set_beforehand() -> None:
    from kopf._core.actions.application import sleep
    wakeup = asyncio.Event()
    wakeup.set()
    assert await sleep(10, wakeup) == 10
    assert asyncio.get_running_loop().time() == 0


@pytest.mark.looptime
async def test_sleep_for_delays(caplog: pytest.LogCaptureFixture, logger: logging.Logger) -> None:
    from kopf._core.actions.application import sleep_for_delays
    loop = asyncio.get_running_loop()

    assert not await sleep_for_delays(delays=[], wakeup=None, patched=False, logger=logger)
    assert not await sleep_for_delays(delays=[5.5, 3.25], wakeup=None, patched=True, logger=logger)
    assert loop.time() == 0
    assert await sleep_for_delays(delays=[5.5, 3.25], wakeup=asyncio.Event(), patched=False, logger=logger)
    assert loop.time() == pytest.approx(3.25)

    wakeup = asyncio.Event()
    loop.call_later(1, wakeup.set)
    assert not await sleep_for_delays(delays=[10], wakeup=wakeup, patched=False, logger=logger)
    assert loop.time() == pytest.approx(4.25)

    logs = messages(caplog)
    assert logs[:3] == [
        'Sleeping was skipped because of the patch, 3.25 seconds left.',
        'Sleeping for 3.25 seconds for the delayed handlers.',
        'Sleeping for 10 seconds for the delayed handlers.',
    ]
    assert logs[3].startswith('Sleeping was interrupted by new changes, 9.')
    assert logs[3].endswith(' seconds left.')
