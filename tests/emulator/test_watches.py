"""Watches: events in order, replays from a resourceVersion, bookmarks, 410 Gone, timeouts, filters."""

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest

from kopf.testing import KubernetesEmulator, eventually_async

CMS = '/api/v1/namespaces/default/configmaps'


def configmap(name: str, **metadata: Any) -> dict[str, Any]:
    return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name, **metadata}}


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(event['type'], event['object']['metadata'].get('name', '')) for event in events]


async def test_watch_replays_history_in_order(api) -> None:
    start = (await api.get(CMS)).body['metadata']['resourceVersion']
    await api.post(CMS, configmap('a'))
    await api.post(CMS, configmap('b'))
    await api.patch(f'{CMS}/a', {'data': {'x': 'y'}})
    await api.delete(f'{CMS}/b')
    await api.post(CMS, configmap('end'))
    events = await api.watch_events(f'{CMS}?watch=true&resourceVersion={start}', until='end')
    assert summary(events) == [('ADDED', 'a'), ('ADDED', 'b'), ('MODIFIED', 'a'), ('DELETED', 'b')]
    versions = [int(event['object']['metadata']['resourceVersion']) for event in events]
    assert versions == sorted(versions) and len(set(versions)) == 4
    assert events[2]['object']['data'] == {'x': 'y'}


async def test_watch_without_version_starts_with_the_current_state(api) -> None:
    await api.post(CMS, configmap('a'))
    await api.patch(f'{CMS}/a', {'data': {'x': 'y'}})
    await api.post(CMS, configmap('end'))
    events = await api.watch_events(f'{CMS}?watch=1', until='end')
    assert summary(events) == [('ADDED', 'a')]
    assert events[0]['object']['data'] == {'x': 'y'}


async def test_live_events_arrive_while_watching(emulator, api) -> None:
    start = (await api.get(CMS)).body['metadata']['resourceVersion']
    url = f'{emulator.url}{CMS}?watch=true&resourceVersion={start}'
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        await api.post(CMS, configmap('a'))
        first = json.loads(await response.content.readline())
        await api.delete(f'{CMS}/a')
        second = json.loads(await response.content.readline())
    assert summary([first, second]) == [('ADDED', 'a'), ('DELETED', 'a')]


async def test_watch_ends_after_the_timeout_without_bookmarks_unless_allowed() -> None:
    # Nothing happens: the stream must still end by itself; and no bookmarks in it, though frequent.
    async with (
        KubernetesEmulator(bookmark_interval=0.1) as emulator,
        aiohttp.ClientSession(emulator.url) as session,
        session.get(f'{CMS}?watch=true&timeoutSeconds=1') as response,
    ):
        assert await asyncio.wait_for(response.read(), timeout=10) == b''


async def test_watch_across_namespaces_and_of_one_object(api) -> None:
    start = (await api.get(CMS)).body['metadata']['resourceVersion']
    await api.post('/api/v1/namespaces/kube-system/configmaps', configmap('a'))
    await api.post(CMS, configmap('a'))
    await api.post(CMS, configmap('b'))
    await api.patch(f'{CMS}/a', {'data': {'k': 'v'}})
    everywhere = await api.watch_events(f'/api/v1/configmaps?watch=true&resourceVersion={start}', until='b')
    assert [
        (event['object']['metadata']['namespace'], event['object']['metadata']['name'])
        for event in everywhere
    ] == [('kube-system', 'a'), ('default', 'a')]
    async with api.session.get(
        f'/api/v1/watch/namespaces/default/configmaps/a?resourceVersion={start}'
    ) as response:
        one = [json.loads(await response.content.readline()) for _ in range(2)]
    assert summary(one) == [('ADDED', 'a'), ('MODIFIED', 'a')]
    by_field = await api.watch_events(
        f'{CMS}?watch=true&resourceVersion={start}&fieldSelector=metadata.name%3Da', until='a'
    )
    assert by_field == []  # the first event is about "a" already


async def test_selector_transitions_become_added_and_deleted(api) -> None:
    start = (await api.get(CMS)).body['metadata']['resourceVersion']
    await api.post(CMS, configmap('a'))
    await api.patch(f'{CMS}/a', {'metadata': {'labels': {'watched': 'yes'}}})
    await api.patch(f'{CMS}/a', {'data': {'k': 'v'}})
    await api.patch(f'{CMS}/a', {'metadata': {'labels': {'watched': 'no'}}})
    last = await api.patch(f'{CMS}/a', {'data': {'k': 'w'}})
    await api.post(CMS, configmap('end', labels={'watched': 'yes'}))
    events = await api.watch_events(
        f'{CMS}?watch=true&resourceVersion={start}&labelSelector=watched%3Dyes', until='end'
    )
    assert summary(events) == [('ADDED', 'a'), ('MODIFIED', 'a'), ('DELETED', 'a')]
    assert events[2]['object']['metadata']['labels'] == {'watched': 'yes'}  # the last matching state
    assert int(events[2]['object']['metadata']['resourceVersion']) < int(
        last.body['metadata']['resourceVersion']
    )


async def test_bookmarks_are_sent_when_allowed() -> None:
    async with KubernetesEmulator(bookmark_interval=0.1) as emulator:
        async with aiohttp.ClientSession(emulator.url) as session:
            url = f'{CMS}?watch=true&allowWatchBookmarks=true&timeoutSeconds=30'
            async with session.get(url) as response:
                line = await asyncio.wait_for(response.content.readline(), timeout=10)
        event = json.loads(line)
        assert event['type'] == 'BOOKMARK'
        assert event['object']['kind'] == 'ConfigMap'
        assert int(event['object']['metadata']['resourceVersion']) > 0


async def test_initial_events_end_with_a_bookmark(api) -> None:
    await api.post(CMS, configmap('a'))
    url = (
        f'{CMS}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan'
    )
    async with api.session.get(url) as response:
        events = [json.loads(await response.content.readline()) for _ in range(2)]
    assert [event['type'] for event in events] == ['ADDED', 'BOOKMARK']
    assert events[1]['object']['metadata']['annotations'] == {'k8s.io/initial-events-end': 'true'}


async def test_too_old_resource_version_is_gone(emulator, api) -> None:
    start = (await api.get(CMS)).body['metadata']['resourceVersion']
    await api.post(CMS, configmap('a'))
    emulator.forget_history()
    events = await api.watch_events(f'{CMS}?watch=true&resourceVersion={start}')  # ends by itself
    assert len(events) == 1
    assert events[0]['type'] == 'ERROR'
    assert events[0]['object']['kind'] == 'Status'
    assert events[0]['object']['code'] == 410
    assert events[0]['object']['reason'] == 'Expired'
    assert 'too old resource version' in events[0]['object']['message']

    current = (await api.get(CMS)).body['metadata']['resourceVersion']
    await api.post(CMS, configmap('end'))
    assert await api.watch_events(f'{CMS}?watch=true&resourceVersion={current}', until='end') == []


async def test_history_is_limited() -> None:
    async with (
        KubernetesEmulator(history_limit=3) as emulator,
        aiohttp.ClientSession(emulator.url) as session,
    ):
        async with session.get(CMS) as response:
            start = (await response.json())['metadata']['resourceVersion']
        for index in range(5):
            async with session.post(CMS, json=configmap(f'cm{index}')) as response:
                assert response.status == 201
        async with session.get(f'{CMS}?watch=true&resourceVersion={start}') as response:
            events = [json.loads(line) for line in (await response.read()).splitlines()]
        assert [event['type'] for event in events] == ['ERROR']
        async with session.get(f'{CMS}/cm1') as response:
            recent = (await response.json())['metadata']['resourceVersion']
        async with session.get(f'{CMS}?watch=true&resourceVersion={recent}') as response:
            events = [json.loads(await response.content.readline()) for _ in range(3)]
        assert summary(events) == [('ADDED', 'cm2'), ('ADDED', 'cm3'), ('ADDED', 'cm4')]


async def test_invalid_resource_version(api) -> None:
    reply = await api.get(f'{CMS}?watch=true&resourceVersion=abc')
    assert reply.status == 400
    assert reply.body['kind'] == 'Status'


async def test_watches_of_custom_objects_end_when_the_crd_is_deleted(emulator, api, crd) -> None:
    url = f'{emulator.url}/apis/kopf.dev/v1/kopfexamples?watch=true'
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert emulator.open_watches == 1
        await api.delete('/apis/apiextensions.k8s.io/v1/customresourcedefinitions/kopfexamples.kopf.dev')
        assert await asyncio.wait_for(response.read(), timeout=10) == b''


async def test_a_watcher_gone_mid_stream_is_not_a_server_error(emulator, caplog) -> None:
    # A watch-client that goes away while an event is on its way to it (e.g. an operator stopping)
    # is the usual end of a watch: no "Error handling request" traceback from the server.
    # The steps are ordered so that the event is written after the server has seen the client's EOF
    # but before it has noticed the connection lost (the next loop iteration): the race of real runs.
    caplog.set_level(logging.DEBUG)
    host, port = emulator.url.removeprefix('http://').rsplit(':', 1)
    watch_reader, watch_writer = await asyncio.open_connection(host, int(port))
    watch_writer.write(f'GET {CMS}?watch=true HTTP/1.1\r\nHost: {host}\r\n\r\n'.encode())
    await watch_reader.readuntil(b'\r\n\r\n')  # the headers: the watch is in place
    post_reader, post_writer = await asyncio.open_connection(host, int(port))
    body = json.dumps(configmap('late')).encode()
    post_writer.write(f'POST {CMS} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n'
                      f'Content-Length: {len(body)}\r\n\r\n'.encode() + body)
    await asyncio.sleep(0)  # the server reads the POST in the next iteration; then the watcher leaves
    watch_writer.close()
    status_line = await post_reader.readline()
    post_writer.close()
    assert b' 201 ' in status_line
    # The watch's handling is over by then on Python 3.11-3.12, a few milliseconds later on 3.13 (its loop's
    # order of the EOF and the write differs); either way, it ends with no traceback.
    await eventually_async(lambda: emulator.open_watches == 0, within=5, message='The watch is still open.')
    problems = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert not problems, [record.getMessage() for record in problems]


@pytest.mark.parametrize('capacity', [200, None], ids=['like-kube-apiserver', 'unlimited'])
async def test_a_watcher_that_does_not_read_is_cut_off_as_kube_apiserver_does(capacity: int | None) -> None:
    # Its events fill the sockets' buffers, then the watcher's capacity: the stream ends after what is in the
    # sockets (the client re-watches from its last version, as after any end). Not with no capacity.
    async with (
        KubernetesEmulator(watcher_capacity=capacity) as emulator,
        aiohttp.ClientSession(emulator.url) as session,
    ):
        async with session.get(CMS) as response:
            start = (await response.json())['metadata']['resourceVersion']
        async with session.get(f'{CMS}?watch=true&resourceVersion={start}') as watch:
            assert watch.status == 200
            count = 0
            while count < 2000 and not (count % 50 == 0 and emulator.terminated_watches):
                async with session.post(CMS, json={**configmap(f'cm{count}'), 'data': {'x': 'x' * 10_000}}):
                    count += 1  # ~10 KB per event, never read meanwhile
            if capacity is None:  # the stream goes on: all the events, in order
                lines = [await asyncio.wait_for(watch.content.readline(), timeout=10) for _ in range(count)]
            else:  # the stream ends: what was in the sockets
                lines = (await asyncio.wait_for(watch.read(), timeout=10)).splitlines()
        terminated = emulator.terminated_watches
    names = [json.loads(line)['object']['metadata']['name'] for line in lines]
    if capacity is None:
        assert terminated == []
        assert names == [f'cm{index}' for index in range(2000)]
    else:
        assert terminated == [f'{CMS}?watch=true&resourceVersion={start}']
        assert 0 < len(names) < count
        assert names == [f'cm{index}' for index in range(len(names))]  # in order, nothing lost but the tail


@pytest.mark.parametrize('capacity', [0, -1, 1.5, '200'])
def test_a_bad_watcher_capacity_is_a_clear_error(capacity: Any) -> None:
    message = (r"^The emulator's watcher_capacity must be a positive integer \(events\) "
               r"or None \(never end a watch\), got ")
    with pytest.raises(ValueError, match=message):
        KubernetesEmulator(watcher_capacity=capacity)
