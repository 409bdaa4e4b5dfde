"""``kopf.testing.Cluster`` and ``eventually``: a test's user of any API server (the ``k8s_api`` switch)."""
import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from kopf.testing import ApiError, AsyncCluster, Cluster, eventually, eventually_async
from kopf.testing.plugin import KubeAPI

CONFIGMAPS = '/api/v1/namespaces/{}/configmaps'


@pytest.fixture()
def user(k8s_api: KubeAPI) -> Cluster:
    return Cluster(k8s_api.kubeconfig_path)


@pytest.fixture()
async def async_user(k8s_api: KubeAPI) -> AsyncIterator[AsyncCluster]:
    async with AsyncCluster(k8s_api.kubeconfig_path) as user:
        yield user


@pytest.fixture()
def namespace(user: Cluster) -> Iterator[str]:
    name = f'cluster-{uuid.uuid4().hex[:8]}'
    user.create_namespace(name)
    yield name
    user.delete(f'/api/v1/namespaces/{name}')


@pytest.mark.kube_api
def test_objects_are_created_read_patched_listed_and_deleted(user: Cluster, namespace: str) -> None:
    path = CONFIGMAPS.format(namespace)
    body = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1', 'labels': {'a': 'b'}},
            'data': {'x': '1'}}
    assert user.create(path, body)['data'] == {'x': '1'}
    assert user.patch(f'{path}/cm1', {'data': {'y': '2'}})['data'] == {'x': '1', 'y': '2'}
    assert user.get(f'{path}/cm1')['data'] == {'x': '1', 'y': '2'}
    assert [obj['metadata']['name'] for obj in user.items(path, labelSelector='a=b')] == ['cm1']
    assert user.items(path, labelSelector='a=c') == []
    user.delete(f'{path}/cm1')
    assert user.get(f'{path}/cm1') is None
    assert user.delete(f'{path}/cm1') is None  # already gone: no error


@pytest.mark.kube_api
def test_errors_name_the_request_the_code_and_the_reason(user: Cluster, namespace: str) -> None:
    path = CONFIGMAPS.format(namespace)
    body = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1'}}
    user.create(path, body)
    with pytest.raises(ApiError) as error:
        user.create(path, body)
    assert (error.value.status, error.value.reason) == (409, 'AlreadyExists')
    assert str(error.value).startswith(f'POST {path} -> 409: ')
    assert 'already exists' in error.value.message


@pytest.mark.kube_api
def test_errors_are_answers_when_sent(user: Cluster, namespace: str) -> None:
    path = CONFIGMAPS.format(namespace)
    body = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1'}}
    assert user.send('POST', path, body).status == 201
    answer = user.send('POST', path, body)
    assert (answer.status, answer.reason) == (409, 'AlreadyExists')
    assert 'already exists' in answer.message


@pytest.mark.kube_api
async def test_the_async_twin_does_the_same(async_user: AsyncCluster, namespace: str) -> None:
    path = CONFIGMAPS.format(namespace)
    body = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1', 'labels': {'a': 'b'}},
            'data': {'x': '1'}}
    assert (await async_user.create(path, body))['data'] == {'x': '1'}
    assert (await async_user.patch(f'{path}/cm1', {'data': {'y': '2'}}))['data'] == {'x': '1', 'y': '2'}
    assert (await async_user.get(f'{path}/cm1'))['data'] == {'x': '1', 'y': '2'}
    assert [obj['metadata']['name'] for obj in await async_user.items(path, labelSelector='a=b')] == ['cm1']
    with pytest.raises(ApiError) as error:
        await async_user.create(path, body)
    assert (error.value.status, error.value.reason) == (409, 'AlreadyExists')
    assert (await async_user.send('POST', path, body)).status == 409
    await async_user.delete(f'{path}/cm1')
    assert await async_user.get(f'{path}/cm1') is None
    assert await async_user.delete(f'{path}/cm1') is None  # already gone: no error


@pytest.mark.kube_api
def test_crds_are_applied_idempotently_and_established(user: Cluster) -> None:
    group = 'cluster.kopf.dev'
    crd = {
        'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
        'metadata': {'name': f'things.{group}'},
        'spec': {'group': group, 'scope': 'Cluster',
                 'names': {'plural': 'things', 'singular': 'thing', 'kind': 'Thing'},
                 'versions': [{'name': 'v1', 'served': True, 'storage': True, 'schema': {
                     'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}}}]},
    }
    first = user.apply_crd(crd)
    again = user.apply_crd(crd)  # exists: kept
    assert first['metadata']['uid'] == again['metadata']['uid']
    assert user.items(f'/apis/{group}/v1/things') == []  # served


def test_eventually_returns_the_first_passing_result() -> None:
    attempts: list[int] = []

    def check() -> int:
        attempts.append(1)
        assert len(attempts) >= 3, 'not yet'
        return len(attempts)

    assert eventually(check, interval=0) == 3


def test_eventually_fails_with_the_last_assertion() -> None:
    def check() -> None:
        raise AssertionError('still missing')

    with pytest.raises(AssertionError, match='still missing'):
        eventually(check, within=0, interval=0)


def test_eventually_does_not_repeat_other_errors() -> None:
    attempts: list[int] = []

    def check() -> Any:
        attempts.append(1)
        raise KeyError('broken')

    with pytest.raises(KeyError):
        eventually(check, interval=0)
    assert len(attempts) == 1


async def test_eventually_async_returns_the_first_passing_result() -> None:
    attempts: list[int] = []

    def check() -> int:
        attempts.append(1)
        assert len(attempts) >= 2
        return len(attempts)

    assert await eventually_async(check, interval=0) == 2


def test_eventually_repeats_a_false_condition() -> None:
    attempts: list[int] = []

    def condition() -> bool:
        attempts.append(1)
        return len(attempts) >= 3

    assert eventually(condition, interval=0) is True
    assert len(attempts) == 3


def test_eventually_fails_a_false_condition_with_the_message() -> None:
    with pytest.raises(AssertionError, match=r'^The condition has not been met in 0s\. It is missing\.$'):
        eventually(lambda: False, within=0, interval=0, message='It is missing.')


def test_eventually_takes_other_falsy_results_as_passed() -> None:
    assert eventually(lambda: None, within=0) is None  # an assertion's result, not a condition's
    assert eventually(list, within=0) == []


async def test_eventually_async_awaits_async_checks_in_the_loop() -> None:
    attempts: list[int] = []

    async def check() -> int:
        attempts.append(1)
        await asyncio.sleep(0)
        assert len(attempts) >= 2
        return len(attempts)

    assert await eventually_async(check, interval=0) == 2


async def test_eventually_async_repeats_a_false_condition() -> None:
    flag = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, flag.set)
    assert await eventually_async(flag.is_set, interval=0.01) is True


async def test_eventually_async_fails_a_false_condition_with_the_message() -> None:
    with pytest.raises(AssertionError, match=r'^The condition has not been met in 0s\. Nope\.$'):
        await eventually_async(lambda: False, within=0, interval=0, message='Nope.')
