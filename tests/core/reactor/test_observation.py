"""
The observation of the cluster: the resources (CRDs at runtime) and the namespaces (patterns at runtime).
"""
import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Collection, Coroutine
from typing import Any

import pytest

from kopf._clients.errors import APIServerError
from kopf._clients.vault import Vault
from kopf._cogs.structs.references import NamespacePattern, Selector
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import ErrorsMode, HandlerId, WatchingHandler
from kopf._core.intents.registries import OperatorRegistry
from kopf._core.reactor.observation import Insights, namespace_observer, resource_observer
from kopf.testing.emulator import KubernetesEmulator

Kube = Any  # the conftest's raw client
Eventually = Callable[..., Coroutine[Any, Any, None]]


def names(insights: Insights) -> set[str]:
    return {resource.name for resource in insights.resources}


@pytest.fixture
def registry() -> OperatorRegistry:
    registry = OperatorRegistry()
    for name in ['kopfexamples', 'widgets']:
        registry.watching.append(WatchingHandler(fn=lambda **_: None, id=HandlerId(name),
                                                 selector=Selector(name), errors=ErrorsMode.IGNORED))
    return registry


@pytest.fixture
async def insights() -> Insights:
    return Insights()


@pytest.fixture
async def observe_resources(
        settings: OperatorSettings, registry: OperatorRegistry, vault: Vault, insights: Insights,
) -> AsyncIterator[Callable[[], None]]:
    tasks: list[asyncio.Task[None]] = []

    def start() -> None:
        tasks.append(asyncio.create_task(resource_observer(
            settings=settings, registry=registry, vault=vault, insights=insights)))

    yield start
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)


@pytest.fixture
async def observe_namespaces(
        settings: OperatorSettings, vault: Vault, insights: Insights,
) -> AsyncIterator[Callable[..., None]]:
    tasks: list[asyncio.Task[None]] = []

    def start(namespaces: Collection[NamespacePattern] = (), clusterwide: bool = False) -> None:
        tasks.append(asyncio.create_task(namespace_observer(
            settings=settings, vault=vault, insights=insights,
            clusterwide=clusterwide, namespaces=namespaces)))

    yield start
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)


async def test_crds_created_and_deleted_at_runtime(
        kube: Kube, kex_crd: None, insights: Insights, observe_resources: Callable[[], None],
        eventually: Eventually, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    observe_resources()
    await asyncio.wait_for(insights.ready_resources.wait(), timeout=5)
    assert names(insights) == {'kopfexamples.kopf.dev'}
    assert "Unresolved resources cannot be served (try creating their CRDs): Selector(any_name='widgets')" \
        in caplog.messages

    await kube.create_crd('widgets', 'Widget', 'example.com')
    await eventually(lambda: names(insights) == {'kopfexamples.kopf.dev', 'widgets.example.com'})
    assert insights.changed.is_set()

    await kube.delete_crd('widgets.example.com')
    await eventually(lambda: names(insights) == {'kopfexamples.kopf.dev'})


async def test_a_name_of_several_api_groups_is_ambiguous_not_absent(
        kube: Kube, kex_crd: None, insights: Insights, observe_resources: Callable[[], None],
        eventually: Eventually, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    await kube.create_crd('widgets', 'Widget', 'example.com')
    await kube.create_crd('widgets', 'Widget', 'example.org')
    observe_resources()
    await asyncio.wait_for(insights.ready_resources.wait(), timeout=5)
    assert names(insights) == {'kopfexamples.kopf.dev'}
    assert ("Ambiguous resources will not be served (try specifying API groups): "
            "Selector(any_name='widgets')") \
        in caplog.messages
    assert not any('try creating their CRDs' in message for message in caplog.messages)


async def test_disabled_scanning_serves_only_the_initial_resources(
        kube: Kube, kex_crd: None, settings: OperatorSettings, insights: Insights,
        observe_resources: Callable[[], None], emulator: KubernetesEmulator,
) -> None:
    settings.scanning.disabled = True
    observe_resources()
    await asyncio.wait_for(insights.ready_resources.wait(), timeout=5)
    assert names(insights) == {'kopfexamples.kopf.dev'}
    # Without watching the CRDs, nothing can notice the new ones.
    assert emulator.requests.count('watch', 'customresourcedefinitions') == 0
    assert emulator.requests.count('list', 'customresourcedefinitions') == 0


async def test_forbidden_crds_watching_scans_once(
        kube: Kube, kex_crd: None, insights: Insights, observe_resources: Callable[[], None],
        emulator: KubernetesEmulator, caplog: pytest.LogCaptureFixture,
) -> None:
    emulator.fail_requests(None, status=403, path='/customresourcedefinitions')
    caplog.set_level(logging.WARNING)
    observe_resources()
    await asyncio.wait_for(insights.ready_resources.wait(), timeout=5)
    assert names(insights) == {'kopfexamples.kopf.dev'}
    assert any('custom resource definitions cannot be watched' in message for message in caplog.messages)


async def test_namespace_patterns_follow_the_namespaces_at_runtime(
        kube: Kube, insights: Insights, observe_namespaces: Callable[..., None], eventually: Eventually,
) -> None:
    await kube.create_namespace('ns-a1')
    await kube.create_namespace('ns-x1')
    observe_namespaces(['ns-*,!ns-x*', 'default'])
    await asyncio.wait_for(insights.ready_namespaces.wait(), timeout=5)
    assert insights.namespaces == {'ns-a1', 'default'}

    await kube.create_namespace('ns-a2')
    await kube.create_namespace('ns-x2')
    await kube.create_namespace('other')
    await eventually(lambda: insights.namespaces == {'ns-a1', 'ns-a2', 'default'})

    await kube.delete_namespace('ns-a1')
    await eventually(lambda: insights.namespaces == {'ns-a2', 'default'})


async def test_specific_namespaces_need_no_namespace_listing(
        insights: Insights, observe_namespaces: Callable[..., None], emulator: KubernetesEmulator,
) -> None:
    observe_namespaces(['ns1', 'absent-ns'])
    await asyncio.wait_for(insights.ready_namespaces.wait(), timeout=5)
    assert insights.namespaces == {'ns1', 'absent-ns'}
    assert emulator.requests.count(resource='namespaces') == 0


async def test_clusterwide_mode_observes_no_namespaces(
        insights: Insights, observe_namespaces: Callable[..., None], emulator: KubernetesEmulator,
) -> None:
    observe_namespaces(clusterwide=True)
    await asyncio.wait_for(insights.ready_namespaces.wait(), timeout=5)
    assert insights.namespaces == {None}
    assert emulator.requests.count(resource='namespaces') == 0


async def test_forbidden_namespaces_fall_back_to_specific_names(
        insights: Insights, observe_namespaces: Callable[..., None], emulator: KubernetesEmulator,
        caplog: pytest.LogCaptureFixture,
) -> None:
    emulator.fail_requests(None, status=403, path='/api/v1/namespaces')
    caplog.set_level(logging.WARNING)
    observe_namespaces(['ns-*', 'default', 'kube-system'])
    await asyncio.wait_for(insights.ready_namespaces.wait(), timeout=5)
    assert insights.namespaces == {'default', 'kube-system'}
    assert any('Not enough permissions to watch the namespaces' in message for message in caplog.messages)
    assert any("ignoring: 'ns-*'" in message for message in caplog.messages)


async def test_disabled_scanning_ignores_namespace_patterns(
        settings: OperatorSettings, insights: Insights, observe_namespaces: Callable[..., None],
        emulator: KubernetesEmulator,
) -> None:
    settings.scanning.disabled = True
    observe_namespaces(['ns-*', 'default'])
    await asyncio.wait_for(insights.ready_namespaces.wait(), timeout=5)
    assert insights.namespaces == {'default'}
    assert emulator.requests.count(resource='namespaces') == 0


async def test_namespace_observation_fails_when_the_api_stays_broken(
        settings: OperatorSettings, vault: Vault, insights: Insights, emulator: KubernetesEmulator,
) -> None:
    emulator.fail_requests(None, status=500, verb='list', path='/api/v1/namespaces')
    with pytest.raises(APIServerError):
        await asyncio.wait_for(namespace_observer(settings=settings, vault=vault, insights=insights,
                                                  clusterwide=False, namespaces=['default*']), timeout=5)
    assert emulator.requests.count('list', 'namespaces') == 4  # 1 attempt + 3 retries by the settings


async def test_resource_observation_fails_when_the_api_stays_broken(
        settings: OperatorSettings, registry: OperatorRegistry, vault: Vault, insights: Insights,
        emulator: KubernetesEmulator,
) -> None:
    emulator.fail_requests(None, status=500, path='^/apis$')
    with pytest.raises(APIServerError):
        await asyncio.wait_for(resource_observer(settings=settings, registry=registry, vault=vault,
                                                 insights=insights), timeout=5)
