"""
The operator-level activities: running the handlers until done, and the authentication with re-logins.

The activities keep their progress in the wall-clock time (as all handlers do), so the tests use
real time with short delays; the API server is the emulator (in its own thread).
"""
import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from kopf._clients import api, logins
from kopf._clients.vault import Vault
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError
from kopf._core.actions.errors import HandlerRetriesError, PermanentError, TemporaryError
from kopf._core.engines.activities import (
    ActivityError,
    authenticate,
    authenticator,
    run_activity,
    run_probes,
)
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import Activity, ActivityHandler, ErrorsMode, HandlerId
from kopf._core.intents.memos import Memo
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing.emulator import KubernetesEmulator


@pytest.fixture
def registry() -> OperatorRegistry:
    return OperatorRegistry()


@pytest.fixture
def settings() -> OperatorSettings:
    settings = OperatorSettings()
    settings.networking.error_backoffs = [0.01]
    return settings


@pytest.fixture
async def vault() -> AsyncIterator[Vault]:
    vault = Vault()
    yield vault
    await vault.close()


def add(registry: OperatorRegistry, activity: Activity, fn: Callable[..., Any], **kwargs: Any) -> None:
    registry.activities.append(ActivityHandler(fn=fn, id=HandlerId(kwargs.pop('id', fn.__name__)),
                                               activity=activity, **kwargs))


async def test_handlers_get_their_kwargs_and_results_are_collected(
        registry: OperatorRegistry, settings: OperatorSettings, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    received: dict[str, Any] = {}

    def sync_fn(**kwargs: Any) -> str:
        received.update(kwargs)
        return 'sync-result'

    async def async_fn(**_: Any) -> int:
        return 123

    add(registry, Activity.STARTUP, sync_fn, param='the-param')
    add(registry, Activity.STARTUP, async_fn)
    add(registry, Activity.CLEANUP, lambda **_: 'not-this-one', id='other')
    memo = Memo()
    results = await run_activity(activity=Activity.STARTUP, registry=registry, settings=settings, memo=memo,
                                 indices={'idx': 'the-index'})
    assert results == {'sync_fn': 'sync-result', 'async_fn': 123}
    assert received['activity'] == Activity.STARTUP
    assert received['settings'] is settings
    assert received['memo'] is memo
    assert received['param'] == 'the-param'
    assert received['idx'] == 'the-index'
    assert received['retry'] == 0
    assert received['logger'].name == 'kopf.activities.startup'
    assert {'started', 'runtime'} <= set(received)
    assert caplog.messages == [
        "Activity 'sync_fn' is invoked.", "Activity 'sync_fn' succeeded.",
        "Activity 'async_fn' is invoked.", "Activity 'async_fn' succeeded.",
    ]


async def test_failed_handlers_are_retried_until_done(
        registry: OperatorRegistry, settings: OperatorSettings, caplog: pytest.LogCaptureFixture,
) -> None:
    attempts: list[str] = []

    def temporary(retry: int, **_: Any) -> str:
        attempts.append(f'temporary#{retry}')
        if retry < 2:
            raise TemporaryError('not yet', delay=0.05)
        return 'done'

    def arbitrary(retry: int, **_: Any) -> str:
        attempts.append(f'arbitrary#{retry}')
        if retry < 1:
            raise ValueError('boom')
        return 'done'

    add(registry, Activity.STARTUP, temporary)
    add(registry, Activity.STARTUP, arbitrary, backoff=0.05)
    results = await run_activity(activity=Activity.STARTUP, registry=registry, settings=settings)
    assert results == {'temporary': 'done', 'arbitrary': 'done'}
    assert attempts == ['temporary#0', 'arbitrary#0', 'temporary#1', 'arbitrary#1', 'temporary#2']
    assert "Activity 'temporary' failed temporarily: not yet" in caplog.messages
    assert "Activity 'arbitrary' failed with an exception and will try again in 0.05 seconds: boom" \
        in caplog.messages


async def test_permanent_failures_fail_the_activity_after_the_others_are_done(
        registry: OperatorRegistry, settings: OperatorSettings, caplog: pytest.LogCaptureFixture,
) -> None:
    def good(**_: Any) -> str:
        return 'ok'

    def permanent(**_: Any) -> None:
        raise PermanentError('nope')

    def limited(**_: Any) -> None:
        raise ValueError('bad')

    def ignored(**_: Any) -> None:
        raise ValueError('whatever')

    add(registry, Activity.STARTUP, limited, retries=2, backoff=0.01)
    add(registry, Activity.STARTUP, good)
    add(registry, Activity.STARTUP, permanent)
    add(registry, Activity.STARTUP, ignored, errors=ErrorsMode.IGNORED)
    with pytest.raises(ActivityError, match=r'One or more handlers failed\.') as excinfo:
        await run_activity(activity=Activity.STARTUP, registry=registry, settings=settings)

    outcomes = excinfo.value.outcomes
    assert isinstance(excinfo.value.__cause__, HandlerRetriesError)  # the first one in the declaration order
    assert isinstance(outcomes[HandlerId('permanent')].exception, PermanentError)
    assert outcomes[HandlerId('good')].result == 'ok'
    assert outcomes[HandlerId('ignored')].exception is None
    assert "Activity 'permanent' failed permanently: nope" in caplog.messages
    assert ("Activity 'limited' failed with an exception and will stop now "
            "(it would exceed 2 retries on the next attempt): bad") in caplog.messages
    assert "Activity 'ignored' failed with an exception and will ignore it: whatever" in caplog.messages


async def test_probes_report_their_results(registry: OperatorRegistry, settings: OperatorSettings) -> None:
    add(registry, Activity.PROBE, lambda **_: 42, id='answer')
    add(registry, Activity.PROBE, lambda **_: 'pong', id='ping')
    assert await run_probes(registry=registry, settings=settings) == {'answer': 42, 'ping': 'pong'}


async def test_probes_are_attempted_once_and_fail_the_report_with_no_retries(
        registry: OperatorRegistry, settings: OperatorSettings, caplog: pytest.LogCaptureFixture,
) -> None:
    attempts: list[str] = []

    def temporary(**_: Any) -> None:
        attempts.append('temporary')
        raise TemporaryError('later', delay=60)

    def arbitrary(**_: Any) -> None:
        attempts.append('arbitrary')
        raise ValueError('boom')

    add(registry, Activity.PROBE, temporary)
    add(registry, Activity.PROBE, arbitrary, retries=5, backoff=60)
    add(registry, Activity.PROBE, lambda **_: 'ok', id='good')
    with pytest.raises(ActivityError, match=r'One or more probes failed\.') as excinfo:
        await asyncio.wait_for(run_probes(registry=registry, settings=settings), timeout=5)
    assert attempts == ['temporary', 'arbitrary']
    assert isinstance(excinfo.value.__cause__, TemporaryError)
    assert isinstance(excinfo.value.outcomes[HandlerId('arbitrary')].exception, ValueError)
    assert excinfo.value.outcomes[HandlerId('good')].result == 'ok'
    assert "Activity 'arbitrary' failed with an exception and will stop now: boom" in caplog.messages


#
# Authentication.
#

async def test_login_handlers_populate_the_vault(
        registry: OperatorRegistry, settings: OperatorSettings, vault: Vault, emulator: KubernetesEmulator,
        caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    add(registry, Activity.AUTHENTICATION, lambda **_: ConnectionInfo(server=emulator.url), id='mylogin')
    add(registry, Activity.AUTHENTICATION, lambda **_: None, id='nothing')
    add(registry, Activity.AUTHENTICATION, lambda **_: 'garbage', id='garbage')
    await authenticate(registry=registry, settings=settings, vault=vault)
    assert [key async for key, _ in vault] == ['mylogin']
    assert caplog.messages[0] == 'Initial authentication has been initiated.'
    assert caplog.messages[-1] == 'Initial authentication has finished.'
    assert "Login handler 'garbage' returned str instead of kopf.ConnectionInfo; ignoring it." \
        in caplog.messages
    assert 'kopf.activities.authentication' in {record.name for record in caplog.records}


async def test_no_credentials_is_a_login_error(
        registry: OperatorRegistry, settings: OperatorSettings, vault: Vault,
        caplog: pytest.LogCaptureFixture,
) -> None:
    add(registry, Activity.AUTHENTICATION, lambda **_: None, id='nothing')
    with pytest.raises(LoginError, match='Ran out of valid credentials'):
        await authenticate(registry=registry, settings=settings, vault=vault)
    assert 'Initial authentication has failed: no credentials were retrieved from the login handlers.' \
        in caplog.messages


async def test_failed_login_handlers_do_not_prevent_the_others(
        registry: OperatorRegistry, settings: OperatorSettings, vault: Vault, emulator: KubernetesEmulator,
) -> None:
    def broken(**_: Any) -> None:
        raise PermanentError('no luck')

    add(registry, Activity.AUTHENTICATION, broken)
    add(registry, Activity.AUTHENTICATION, lambda **_: ConnectionInfo(server=emulator.url), id='working')
    await authenticate(registry=registry, settings=settings, vault=vault)
    assert [key async for key, _ in vault] == ['working']


async def test_default_login_functions_when_no_handlers(
        registry: OperatorRegistry, settings: OperatorSettings, vault: Vault, emulator: KubernetesEmulator,
        caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    await authenticate(registry=registry, settings=settings, vault=vault)
    # Depending on the installed client libraries: piggybacking, or the built-in kubeconfig login.
    default_names = [fn.__name__ for fn in logins.default_login_fns()]
    keys = [key async for key, _ in vault]
    assert keys and set(keys) <= set(default_names)
    assert all(f'Activity {name!r} is invoked.' in caplog.messages for name in default_names)
    assert await api.request('GET', '/api', settings=settings, vault=vault) is not None


async def test_relogin_when_the_credentials_are_rejected(
        registry: OperatorRegistry, settings: OperatorSettings, vault: Vault, emulator: KubernetesEmulator,
        caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    tokens = iter(['first-token', 'second-token'])
    given: list[str] = []

    def login(**_: Any) -> ConnectionInfo:
        given.append(next(tokens))
        return ConnectionInfo(server=emulator.url, token=given[-1])

    add(registry, Activity.AUTHENTICATION, login)
    task = asyncio.create_task(authenticator(registry=registry, settings=settings, vault=vault))
    try:
        await asyncio.wait_for(vault.wait_for_readiness(), timeout=5)
        emulator.fail_requests(1, status=401)
        result = await asyncio.wait_for(api.request('GET', '/api', settings=settings, vault=vault), timeout=5)
        assert result is not None
        assert given == ['first-token', 'second-token']
        assert [info.token async for _, info in vault] == ['second-token']
        assert 'Re-authentication has been initiated.' in caplog.messages
        assert 'Re-authentication has finished.' in caplog.messages
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.wait([task])


async def test_relogin_with_the_same_rejected_credentials_fails(
        registry: OperatorRegistry, settings: OperatorSettings, vault: Vault, emulator: KubernetesEmulator,
) -> None:
    logins: list[str] = []

    async def stale(**_: Any) -> ConnectionInfo:
        logins.append('stale')
        if len(logins) > 1:
            # The API call must be already waiting for the re-login: the later calls wait for the next one,
            # which never comes, since the operator stops because of the failed authenticator.
            await asyncio.sleep(0.2)
        return ConnectionInfo(server=emulator.url, token='stale')

    add(registry, Activity.AUTHENTICATION, stale)
    task = asyncio.create_task(authenticator(registry=registry, settings=settings, vault=vault))
    try:
        await asyncio.wait_for(vault.wait_for_readiness(), timeout=5)
        emulator.fail_requests(1, status=401)
        with pytest.raises(LoginError):
            await asyncio.wait_for(api.request('GET', '/api', settings=settings, vault=vault), timeout=5)
        await asyncio.wait_for(asyncio.wait([task]), timeout=5)
        assert isinstance(task.exception(), LoginError)
        assert logins == ['stale', 'stale']
    finally:
        task.cancel()
        await asyncio.wait([task])


@pytest.fixture
def emulator(k8s_emulator: KubernetesEmulator) -> KubernetesEmulator:
    return k8s_emulator


async def test_a_broken_kubeconfig_is_reported_once_per_round_by_the_default_logins(
        registry: OperatorRegistry, settings: OperatorSettings, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip('pykube')
    pytest.importorskip('kubernetes')
    path = tmp_path / 'kubeconfig.yaml'
    path.write_text('clusters: [\n')
    monkeypatch.setenv('KUBECONFIG', str(path))
    monkeypatch.delenv('KUBERNETES_SERVICE_HOST', raising=False)
    monkeypatch.delenv('KUBERNETES_SERVICE_PORT', raising=False)
    caplog.set_level(logging.DEBUG)
    for _ in range(2):  # every round reports it anew (e.g. a re-authentication after a fix that failed)
        caplog.clear()
        with pytest.raises(LoginError, match='not valid YAML'):
            await authenticate(registry=registry, settings=settings, vault=Vault())
        messages = [record.getMessage() for record in caplog.records]
        failures = [message for message in messages if 'failed permanently' in message]
        assert len(failures) == 1
        assert "Activity 'login_via_pykube' failed permanently: The kubeconfig file" in failures[0]
        assert any('The kubeconfig is not usable, as reported above' in record.getMessage()
                   for record in caplog.records)
