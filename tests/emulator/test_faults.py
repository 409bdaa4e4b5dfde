"""Fault injection and request counting."""

import asyncio
import json
import time

import aiohttp
import pytest

CMS = '/api/v1/namespaces/default/configmaps'


def configmap(name: str) -> dict[str, object]:
    return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name}}


async def test_failing_the_next_requests(emulator, api) -> None:
    emulator.fail_requests(2, status=503)
    first = await api.get(CMS)
    second = await api.get(CMS)
    third = await api.get(CMS)
    assert [first.status, second.status, third.status] == [503, 503, 200]
    assert first.body['kind'] == 'Status'
    assert first.body['reason'] == 'ServiceUnavailable'


async def test_failures_filtered_by_method_verb_and_path(emulator, api) -> None:
    await api.post(CMS, configmap('cm1'))
    emulator.fail_requests(1, status=500, method='PATCH', path=r'/configmaps/cm1$')
    emulator.fail_requests(1, status=504, verb='list')
    assert (await api.get(f'{CMS}/cm1')).status == 200
    assert (await api.patch('/api/v1/namespaces/default/configmaps/cm1', {'data': {}})).status == 500
    assert (await api.patch('/api/v1/namespaces/default/configmaps/cm1', {'data': {}})).status == 200
    listed = await api.get(CMS)
    assert listed.status == 504
    assert listed.body['reason'] == 'Timeout'
    assert (await api.get(CMS)).status == 200


async def test_throttling_with_retry_after(emulator, api) -> None:
    emulator.fail_requests(1, status=429, retry_after=7)
    reply = await api.get(CMS)
    assert reply.status == 429
    assert reply.headers['Retry-After'] == '7'
    assert reply.body['reason'] == 'TooManyRequests'
    assert reply.body['details']['retryAfterSeconds'] == 7


async def test_failing_until_cleared(emulator, api) -> None:
    emulator.fail_requests(None, status=500, verb='create')
    for _ in range(3):
        assert (await api.post(CMS, configmap('cm1'))).status == 500
    emulator.clear_faults()
    assert (await api.post(CMS, configmap('cm1'))).status == 201


async def test_failed_requests_change_nothing(emulator, api) -> None:
    emulator.fail_requests(1, status=500, verb='create')
    await api.post(CMS, configmap('cm1'))
    assert (await api.get(f'{CMS}/cm1')).status == 404


async def test_latency(emulator, api) -> None:
    emulator.add_latency(0.3, count=1, verb='list')
    started = time.monotonic()
    assert (await api.get(CMS)).status == 200
    assert time.monotonic() - started >= 0.3
    # Consumed: the next one is not delayed (its duration is not measured: that would be flaky).
    assert emulator.faults.armed is False


async def test_request_timestamps(emulator, api) -> None:
    assert emulator.requests.first_at() is None
    assert emulator.requests.last_at('patch') is None
    before = time.monotonic()
    await api.post(CMS, configmap('a'))
    between = time.monotonic()
    await api.patch(f'{CMS}/a', {'data': {'x': '1'}})
    after = time.monotonic()

    counter = emulator.requests
    assert before <= counter.first_at() <= between
    assert before <= counter.first_at('create') == counter.last_at('create') <= between
    assert between <= counter.first_at('patch') == counter.last_at('patch') == counter.last_at() <= after
    counter.reset()
    assert counter.first_at() is None and counter.last_at() is None


async def test_request_counters(emulator, api) -> None:
    await api.post(CMS, configmap('a'))
    await api.post(CMS, configmap('b'))
    await api.patch(f'{CMS}/a', {'data': {'x': '1'}})
    await api.patch(f'{CMS}/a', {'data': {'x': '2'}})
    await api.patch(f'{CMS}/b', {'data': {'x': '1'}})
    await api.get(f'{CMS}/a')
    await api.get(CMS)
    await api.get('/api/v1')
    await api.delete(f'{CMS}/b')

    counter = emulator.requests
    assert counter.by_verb() == {'create': 2, 'patch': 3, 'get': 1, 'list': 1, 'discovery': 1, 'delete': 1}
    assert counter.count('patch') == 3
    assert counter.count('patch', 'configmaps', name='a') == 2
    assert counter.count('patch', 'configmaps', namespace='default', name='b') == 1
    assert counter.count(resource='configmaps', name='a') == 3
    assert counter.count('patch', 'pods') == 0
    assert counter.total == 9
    counter.reset()
    assert counter.total == 0


async def test_request_counters_of_custom_resources(emulator, api, crd) -> None:
    await api.post(
        '/apis/kopf.dev/v1/namespaces/default/kopfexamples',
        {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex1'}},
    )
    await api.patch('/apis/kopf.dev/v1/namespaces/default/kopfexamples/kex1/status', {'status': {}})
    assert emulator.requests.count('create', 'kopfexamples.kopf.dev') == 1
    assert emulator.requests.count('patch', 'kopfexamples', group='kopf.dev', subresource='status') == 1


@pytest.mark.parametrize('abort', [False, True])
async def test_dropping_watches(emulator, api, abort: bool) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f'{emulator.url}{CMS}?watch=true') as cms_response,
        session.get(f'{emulator.url}/api/v1/namespaces?watch=true') as namespaces_response,
    ):
        initial = [json.loads(await namespaces_response.content.readline()) for _ in range(2)]
        assert {event['object']['metadata']['name'] for event in initial} == {'default', 'kube-system'}
        assert emulator.open_watches == 2

        assert emulator.drop_watches(path='/configmaps', abort=abort) == 1
        if abort:
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(cms_response.read(), timeout=10)
        else:
            assert await asyncio.wait_for(cms_response.read(), timeout=10) == b''

        # The other watch is still alive and gets new events.
        await api.post(
            '/api/v1/namespaces', {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'x'}}
        )
        event = json.loads(await asyncio.wait_for(namespaces_response.content.readline(), timeout=10))
        assert event['type'] == 'ADDED'
        assert emulator.drop_watches() == 1


def test_faults_from_another_thread(k8s_emulator) -> None:
    k8s_emulator.fail_requests(1, status=500)

    async def probe() -> int:
        url = f'{k8s_emulator.url}/version'
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return response.status

    assert asyncio.run(probe()) == 500
    assert asyncio.run(probe()) == 200
    assert k8s_emulator.requests.count('discovery') == 2


@pytest.mark.parametrize('status', [200, 502])
async def test_raw_bodies_instead_of_statuses(emulator, api, status: int) -> None:
    emulator.fail_requests(1, status=status, verb='list', raw_body=b'<html>a proxy says no</html>')
    reply = await api.get(CMS)
    assert reply.status == status
    assert reply.raw == b'<html>a proxy says no</html>'
    assert reply.headers['Content-Type'].startswith('text/html')
    assert (await api.get(CMS)).body['kind'] == 'ConfigMapList'


async def test_raw_lines_injected_into_watches(emulator, api) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f'{emulator.url}{CMS}?watch=true') as cms_response,
        session.get(f'{emulator.url}/api/v1/namespaces?watch=true') as namespaces_response,
    ):
        initial = [json.loads(await namespaces_response.content.readline()) for _ in range(2)]
        assert len(initial) == 2
        assert emulator.inject_watch_line(b'garbage{', path='/configmaps') == 1
        assert emulator.inject_watch_line(b'{"type": "ADDED"}\n', path='/configmaps') == 1
        assert await asyncio.wait_for(cms_response.content.readline(), timeout=10) == b'garbage{\n'
        assert await asyncio.wait_for(cms_response.content.readline(), timeout=10) == b'{"type": "ADDED"}\n'

        # The streams go on as usual after the garbage.
        await api.post(CMS, configmap('cm1'))
        event = json.loads(await asyncio.wait_for(cms_response.content.readline(), timeout=10))
        assert (event['type'], event['object']['metadata']['name']) == ('ADDED', 'cm1')


async def test_accepted_tokens(emulator, api) -> None:
    assert (await api.get(CMS)).status == 200  # any credentials, or none, by default
    emulator.accept_tokens({'new-token'})
    for headers in [{}, {'Authorization': 'Bearer old-token'}, {'Authorization': 'Basic bmV3LXRva2Vu'}]:
        reply = await api.get(CMS, headers=headers)
        assert reply.status == 401
        assert (reply.body['reason'], reply.body['message']) == ('Unauthorized', 'Unauthorized')
    assert (await api.get(CMS, headers={'Authorization': 'Bearer new-token'})).status == 200
    emulator.accept_tokens(None)
    assert (await api.get(CMS)).status == 200


async def test_latency_after_applying_lets_the_watchers_see_the_change_before_the_response(
        emulator, api) -> None:
    await api.post(CMS, configmap('cm1'))
    listed = await api.get(CMS)
    version = listed.body['metadata']['resourceVersion']
    emulator.add_latency(1.0, count=1, verb='patch', after_applying=True)
    watched: list[tuple[float, str]] = []

    async def watch() -> None:
        async with api.session.get(f'{CMS}?watch=true&resourceVersion={version}') as response:
            async for line in response.content:
                if line.strip():
                    event = json.loads(line)
                    watched.append((time.monotonic(), event['type']))
                    return

    watching = asyncio.create_task(watch())
    started = time.monotonic()
    patched = await api.patch(f'{CMS}/cm1', {'data': {'x': '1'}})
    answered = time.monotonic()
    await watching
    assert patched.status == 200
    assert patched.body['data'] == {'x': '1'}
    assert answered - started >= 1.0
    assert watched[0][1] == 'MODIFIED'
    assert watched[0][0] < started + 0.5  # the echo came long before the response (1 s)
    assert emulator.faults.armed is False  # consumed


async def test_latency_after_applying_delays_the_error_responses_too(emulator, api) -> None:
    emulator.add_latency(0.5, count=1, verb='patch', after_applying=True)
    started = time.monotonic()
    missing = await api.patch(f'{CMS}/missing', {'data': {'x': '1'}})
    assert missing.status == 404
    assert time.monotonic() - started >= 0.5
    assert emulator.faults.armed is False
