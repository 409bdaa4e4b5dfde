import asyncio
import contextlib
import json
from typing import Any

import kmock
import pytest

from kopf._clients import errors, watching
from kopf._clients.vault import Vault
from kopf._clients.watching import Bookmark
from kopf._cogs.configs.networking import StandaloneClientSettings
from kopf._cogs.structs.references import Resource

pytestmark = pytest.mark.looptime

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', namespaced=True)
URL = '/apis/kopf.dev/v1/namespaces/ns1/kopfexamples'
WATCH = {'watch': 'true', 'allowWatchBookmarks': 'true'}


def obj(name: str, rv: str) -> dict[str, Any]:
    metadata = {'name': name, 'resourceVersion': rv}
    return {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': metadata}


def line(type: str, body: dict[str, Any]) -> bytes:
    return json.dumps({'type': type, 'object': body}).encode() + b'\n'


def bookmark(rv: str, **annotations: str) -> bytes:
    metadata: dict[str, Any] = {'resourceVersion': rv}
    if annotations:
        metadata['annotations'] = annotations
    return line('BOOKMARK', {'kind': 'KopfExample', 'apiVersion': 'kopf.dev/v1', 'metadata': metadata})


def listing(rv: str, *names: str) -> dict[str, Any]:
    return {'kind': 'KopfExampleList', 'metadata': {'resourceVersion': rv},
            'items': [{'metadata': {'name': name, 'resourceVersion': rv}} for name in names]}


def listed(name: str, rv: str) -> dict[str, Any]:
    return {'type': None, 'object': obj(name, rv)}


async def take(count: int, settings: StandaloneClientSettings, vault: Vault) -> list[Any]:
    items: list[Any] = []
    stream = watching.infinite_watch(settings=settings, vault=vault, resource=KEX, namespace='ns1')
    async with contextlib.aclosing(stream):
        async for item in stream:
            items.append(item)
            if len(items) >= count:
                break
    return items


def watches(handler: kmock.RawHandler) -> Any:
    return handler[f'get {URL}', kmock.params(watch='true')]


def lists(handler: kmock.RawHandler) -> list[Any]:
    return [req for req in handler if req.params.get('watch') != 'true']


async def test_list_then_watch(kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
                               looptime: float) -> None:
    watches(kmock) << (line('ADDED', obj('c', '101')), line('MODIFIED', obj('a', '102')), ...)
    kmock[f'get {URL}'] << listing('100', 'a', 'b')

    items = await take(5, settings, vault)

    assert items == [
        listed('a', '100'), listed('b', '100'), Bookmark.LISTED,
        {'type': 'ADDED', 'object': obj('c', '101')},
        {'type': 'MODIFIED', 'object': obj('a', '102')},
    ]
    assert [(req.method, req.url.path, req.params) for req in kmock] == [
        ('GET', URL, {}),
        ('GET', URL, {**WATCH, 'resourceVersion': '100'}),
    ]
    assert looptime == 0


async def test_reconnects_after_server_closes_with_backoff(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
) -> None:
    settings.watching.reconnect_backoff = 5
    watches(kmock)[:1] << (line('ADDED', obj('c', '101')),)
    watches(kmock)[1:] << (line('DELETED', obj('c', '102')), ...)
    kmock[f'get {URL}'] << listing('100')

    items = await take(3, settings, vault)

    assert items == [Bookmark.LISTED, {'type': 'ADDED', 'object': obj('c', '101')},
                     {'type': 'DELETED', 'object': obj('c', '102')}]
    assert [req.params.get('resourceVersion') for req in watches(kmock)] == ['100', '101']
    assert looptime == 5


async def test_every_end_of_a_watch_request_is_told_before_the_stream_is_reestablished(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
) -> None:
    gone = {'kind': 'Status', 'apiVersion': 'v1', 'status': 'Failure', 'code': 410, 'reason': 'Expired'}
    watches(kmock)[:1] << (line('ADDED', obj('c', '101')),)  # closed by the server
    watches(kmock)[1:2] << (line('MODIFIED', obj('c', '102')), line('ERROR', gone))  # 410 Gone: relisting
    watches(kmock)[2:] << (line('DELETED', obj('c', '201')), ...)
    kmock[f'get {URL}'][:1] << listing('100')
    kmock[f'get {URL}'][1:] << listing('200', 'c')
    items: list[Any] = []
    stream = watching.infinite_watch(settings=settings, vault=vault, resource=KEX, namespace='ns1',
                                     on_interruption=lambda: items.append('interrupted'))
    async with contextlib.aclosing(stream):
        async for item in stream:
            items.append(item)
            if len(items) >= 8:
                break

    # Told in order with the events: the events after it come with the re-established stream.
    assert items == [
        Bookmark.LISTED,
        {'type': 'ADDED', 'object': obj('c', '101')},
        'interrupted',
        {'type': 'MODIFIED', 'object': obj('c', '102')},
        'interrupted',
        listed('c', '200'), Bookmark.LISTED,
        {'type': 'DELETED', 'object': obj('c', '201')},
    ]


async def test_bookmarks_advance_resource_version(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
) -> None:
    watches(kmock)[:1] << (line('ADDED', obj('c', '101')), bookmark('150'))
    watches(kmock)[1:] << (line('MODIFIED', obj('c', '160')), ...)
    kmock[f'get {URL}'] << listing('100')

    items = await take(3, settings, vault)

    # Bookmarks are not yielded; they only move the resumption point.
    assert items == [Bookmark.LISTED, {'type': 'ADDED', 'object': obj('c', '101')},
                     {'type': 'MODIFIED', 'object': obj('c', '160')}]
    assert [req.params for req in watches(kmock)] == [
        {**WATCH, 'resourceVersion': '100'},
        {**WATCH, 'resourceVersion': '150'},
    ]


def page(rv: str, token: str | None, *names: str) -> dict[str, Any]:
    metadata = {'resourceVersion': rv, **({'continue': token} if token else {})}
    return {**listing(rv, *names), 'metadata': metadata}


@pytest.mark.parametrize('paged', [False, True])
async def test_the_pages_are_handed_over_as_they_come_if_paged(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, paged: bool,
) -> None:
    settings.watching.chunk_size = 1
    watches(kmock) << (...,)
    kmock[f'get {URL}', kmock.params(limit='1', **{'continue': 't2'})] << page('100', None, 'c')
    kmock[f'get {URL}', kmock.params(limit='1', **{'continue': 't1'})] << page('100', 't2', 'b')
    kmock[f'get {URL}', kmock.params(limit='1')] << page('100', 't1', 'a')
    seen: list[tuple[Any, int]] = []  # the items, and how many list requests have come by then
    stream = watching.infinite_watch(settings=settings, vault=vault, resource=KEX, namespace='ns1',
                                     paged=paged)
    async with contextlib.aclosing(stream):
        async for item in stream:
            seen.append((item, len(lists(kmock))))
            if item is Bookmark.LISTED:
                break

    assert [item for item, _ in seen] == [listed('a', '100'), listed('b', '100'), listed('c', '100'),
                                          Bookmark.LISTED]
    assert seen[0][1] == (1 if paged else 3)  # the first page's objects at once, or after all pages
    assert [req.params.get('continue') for req in lists(kmock)] == [None, 't1', 't2']


async def test_a_paged_listing_restarted_midway_is_told_as_an_interruption(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
) -> None:
    settings.watching.chunk_size = 1
    watches(kmock) << (...,)
    kmock[f'get {URL}', kmock.params(limit='1', **{'continue': 'old'})] << 410 << {'kind': 'Status'}
    kmock[f'get {URL}', kmock.params(limit='1', **{'continue': 'new'})] << page('200', None, 'b')
    kmock[f'get {URL}', kmock.params(limit='1')][:1] << page('100', 'old', 'x')
    kmock[f'get {URL}', kmock.params(limit='1')][1:] << page('200', 'new', 'a')
    items: list[Any] = []
    stream = watching.infinite_watch(settings=settings, vault=vault, resource=KEX, namespace='ns1',
                                     paged=True, on_interruption=lambda: items.append('interrupted'))
    async with contextlib.aclosing(stream):
        async for item in stream:
            items.append(item)
            if item is Bookmark.LISTED:
                break

    # The restarted listing's objects come after the word that the earlier ones are void.
    assert items == [listed('x', '100'), 'interrupted',
                     listed('a', '200'), listed('b', '200'), Bookmark.LISTED]


async def test_410_status_relists(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                  vault: Vault) -> None:
    watches(kmock)[:1] << 410 << {'kind': 'Status', 'code': 410, 'reason': 'Expired'}
    watches(kmock)[1:] << (line('MODIFIED', obj('b', '201')), ...)
    kmock[f'get {URL}'][:1] << listing('100', 'a')
    kmock[f'get {URL}'][1:] << listing('200', 'b')

    items = await take(5, settings, vault)

    assert items == [
        listed('a', '100'), Bookmark.LISTED,
        listed('b', '200'), Bookmark.LISTED,
        {'type': 'MODIFIED', 'object': obj('b', '201')},
    ]
    assert [(req.params.get('watch'), req.params.get('resourceVersion')) for req in kmock] == [
        (None, None), ('true', '100'), (None, None), ('true', '200'),
    ]


async def test_410_error_event_relists(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                       vault: Vault) -> None:
    gone = {'kind': 'Status', 'apiVersion': 'v1', 'status': 'Failure', 'code': 410, 'reason': 'Expired',
            'message': 'too old resource version: 100 (150)'}
    watches(kmock)[:1] << (line('ADDED', obj('x', '101')), line('ERROR', gone), ...)
    watches(kmock)[1:] << (line('MODIFIED', obj('b', '201')), ...)
    kmock[f'get {URL}'][:1] << listing('100', 'a')
    kmock[f'get {URL}'][1:] << listing('200', 'b')

    items = await take(6, settings, vault)

    assert items == [
        listed('a', '100'), Bookmark.LISTED,
        {'type': 'ADDED', 'object': obj('x', '101')},
        listed('b', '200'), Bookmark.LISTED,
        {'type': 'MODIFIED', 'object': obj('b', '201')},
    ]
    assert [req.params.get('resourceVersion') for req in watches(kmock)] == ['100', '200']


async def test_other_client_error_events_escalate(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                                  vault: Vault) -> None:
    forbidden = {'kind': 'Status', 'code': 403, 'reason': 'Forbidden', 'message': 'no access'}
    watches(kmock) << (line('ERROR', forbidden), ...)
    kmock[f'get {URL}'] << listing('100')
    with pytest.raises(errors.APIForbiddenError, match='no access'):
        await take(10, settings, vault)


async def test_server_error_events_reconnect(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                             vault: Vault, caplog: pytest.LogCaptureFixture) -> None:
    failure = {'kind': 'Status', 'code': 500, 'message': 'etcd is sad'}
    watches(kmock)[:1] << (line('ERROR', failure), ...)
    watches(kmock)[1:] << (line('ADDED', obj('a', '101')), ...)
    kmock[f'get {URL}'] << listing('100')

    items = await take(2, settings, vault)

    assert items == [Bookmark.LISTED, {'type': 'ADDED', 'object': obj('a', '101')}]
    assert [req.params.get('resourceVersion') for req in watches(kmock)] == ['100', '100']
    assert 'etcd is sad' in caplog.text


async def test_server_error_events_drop_the_rest_of_their_chunk(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
) -> None:
    # The lines after the error in the same chunk (read at once) are not from a trustworthy stream either,
    # and the stream is left at once (not when it goes silent).
    failure = {'kind': 'Status', 'code': 500, 'message': 'etcd is sad'}
    watches(kmock)[:1] << (line('ERROR', failure) + line('ADDED', obj('x', '150')), ...)
    watches(kmock)[1:] << (line('ADDED', obj('a', '101')), ...)
    kmock[f'get {URL}'] << listing('100')

    items = await take(2, settings, vault)

    assert items == [Bookmark.LISTED, {'type': 'ADDED', 'object': obj('a', '101')}]
    assert [req.params.get('resourceVersion') for req in watches(kmock)] == ['100', '100']
    assert looptime == 0.1  # the default reconnect backoff only


async def test_stream_cut_midline(kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
                                  caplog: pytest.LogCaptureFixture) -> None:
    cut = line('MODIFIED', obj('a', '102'))[:25]
    watches(kmock)[:1] << (line('ADDED', obj('a', '101')), cut)
    watches(kmock)[1:] << (line('MODIFIED', obj('a', '102')), ...)
    kmock[f'get {URL}'] << listing('100')

    items = await take(3, settings, vault)

    assert items == [Bookmark.LISTED, {'type': 'ADDED', 'object': obj('a', '101')},
                     {'type': 'MODIFIED', 'object': obj('a', '102')}]
    assert [req.params.get('resourceVersion') for req in watches(kmock)] == ['100', '101']
    assert 'ended in the middle of a line' in caplog.text


async def test_lines_split_across_chunks(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                         vault: Vault) -> None:
    data = line('ADDED', obj('a', '101')) + line('ADDED', obj('b', '102'))
    watches(kmock) << (data[:10], data[10:70], data[70:], ...)
    kmock[f'get {URL}'] << listing('100')
    items = await take(3, settings, vault)
    assert items == [Bookmark.LISTED, {'type': 'ADDED', 'object': obj('a', '101')},
                     {'type': 'ADDED', 'object': obj('b', '102')}]


async def test_garbage_lines_skipped(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                     vault: Vault, caplog: pytest.LogCaptureFixture) -> None:
    watches(kmock) << (
        b'this is not json\n',
        b'{"type": "ADDED", "object": {"invalid utf-8": "\xff\xfe"}}\n',
        b'[1, 2, 3]\n',
        b'{"type": "ADDED"}\n',
        b'\n',
        line('WHATEVER', obj('z', '101')),
        line('ADDED', obj('a', '102')),
        ...
    )
    kmock[f'get {URL}'] << listing('100')

    items = await take(2, settings, vault)

    assert items == [Bookmark.LISTED, {'type': 'ADDED', 'object': obj('a', '102')}]
    assert "Skipping an unparseable line in the watch-stream: b'this is not json'" in caplog.text
    invalid_utf8 = 'b\'{"type": "ADDED", "object": {"invalid utf-8": "\\xff\\xfe"}}\''
    assert f'Skipping an unparseable line in the watch-stream: {invalid_utf8}' in caplog.text
    assert "Skipping an unrecognised line in the watch-stream: b'[1, 2, 3]'" in caplog.text
    assert 'Skipping an unrecognised line in the watch-stream: b\'{"type": "ADDED"}\'' in caplog.text
    assert "Skipping an unknown type of watch-event: 'WHATEVER'" in caplog.text


async def test_silent_stream_reconnects_after_inactivity(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
) -> None:
    watches(kmock)[:1] << (line('ADDED', obj('a', '101')), ...)  # and then silence forever
    watches(kmock)[1:] << (line('MODIFIED', obj('a', '102')), ...)
    kmock[f'get {URL}'] << listing('100')

    items = await take(3, settings, vault)

    assert items == [Bookmark.LISTED, {'type': 'ADDED', 'object': obj('a', '101')},
                     {'type': 'MODIFIED', 'object': obj('a', '102')}]
    assert [req.params.get('resourceVersion') for req in watches(kmock)] == ['100', '101']
    assert looptime == 70 + 0.1  # the default inactivity timeout + the default reconnect backoff


async def test_bookmarks_keep_the_stream_alive(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
) -> None:
    settings.watching.inactivity_timeout = 10
    settings.watching.reconnect_backoff = 0
    heartbeat = [(lambda: asyncio.sleep(6), bookmark(str(110 + i))) for i in range(3)]
    watches(kmock)[:1] << (*[item for pair in heartbeat for item in pair], ...)
    watches(kmock)[1:] << (line('ADDED', obj('a', '201')), ...)
    kmock[f'get {URL}'] << listing('100')

    items = await take(2, settings, vault)

    assert items == [Bookmark.LISTED, {'type': 'ADDED', 'object': obj('a', '201')}]
    assert [req.params.get('resourceVersion') for req in watches(kmock)] == ['100', '112']
    assert looptime == 6 * 3 + 10  # the silence is counted from the last bookmark


async def test_a_slow_consumer_is_not_a_silent_stream(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
) -> None:
    # The silence is counted from the start of every read, not from the latest chunk: the time spent
    # by the consumer between the reads (here, longer than the inactivity timeout) is not silence.
    settings.watching.inactivity_timeout = 10
    events = [line('ADDED', obj(f'o{i}', str(101 + i))) for i in range(5)]
    watches(kmock)[:1] << (*[item for event in events for item in (lambda: asyncio.sleep(1), event)], ...)
    kmock[f'get {URL}'] << listing('100')

    items: list[Any] = []
    stream = watching.infinite_watch(settings=settings, vault=vault, resource=KEX, namespace='ns1')
    async with contextlib.aclosing(stream):
        async for item in stream:
            items.append(item)
            if len(items) >= 6:
                break
            await asyncio.sleep(15)  # the consumer's own work

    assert [item['object']['metadata']['name'] for item in items[1:]] == ['o0', 'o1', 'o2', 'o3', 'o4']
    assert len(watches(kmock)) == 1  # no reconnects: the stream was never silent for 10 s


async def test_a_busy_stream_does_not_make_a_timer_per_chunk(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
        monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The loop's timers of the inactivity timeout (70 s) are counted; kmock's short pauses are not.
    loop = asyncio.get_running_loop()
    long_timers = 0
    original_call_at = loop.call_at

    def call_at(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        nonlocal long_timers
        long_timers += when - loop.time() > 60
        return original_call_at(when, *args, **kwargs)

    monkeypatch.setattr(loop, 'call_at', call_at)
    events = [line('ADDED', obj(f'o{i}', str(101 + i))) for i in range(300)]
    paused = [item for event in events for item in (lambda: asyncio.sleep(0.001), event)]  # a chunk each
    watches(kmock)[:1] << (*paused, ...)
    kmock[f'get {URL}'] << listing('100')

    items = await take(301, settings, vault)

    assert items[-1] == {'type': 'ADDED', 'object': obj('o299', '400')}
    assert long_timers <= 10  # the requests' own, and the reads' one; with a timer per read: 300 or more


async def test_a_cancellation_during_a_read_is_not_a_timeout(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
) -> None:
    settings.watching.inactivity_timeout = 10
    watches(kmock) << (line('ADDED', obj('a', '101')), ...)  # and then silence
    kmock[f'get {URL}'] << listing('100')
    task = asyncio.create_task(take(100, settings, vault))
    await asyncio.sleep(5)  # in the middle of the silent read
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert looptime == 5
    assert len(watches(kmock)) == 1


async def test_client_timeout_reconnects(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                         vault: Vault, looptime: float) -> None:
    settings.watching.client_timeout = 30
    settings.watching.reconnect_backoff = 0
    watches(kmock)[:1] << (line('ADDED', obj('a', '101')), ...)
    watches(kmock)[1:] << (line('MODIFIED', obj('a', '102')), ...)
    kmock[f'get {URL}'] << listing('100')

    items = await take(3, settings, vault)

    assert items[-1] == {'type': 'MODIFIED', 'object': obj('a', '102')}
    assert [req.params.get('resourceVersion') for req in watches(kmock)] == ['100', '101']
    assert looptime == 30


async def test_server_timeout_and_selectors_in_params(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
) -> None:
    settings.watching.server_timeout = 123.4
    settings.watching.label_selectors['kopfexamples'] = 'app=x'
    settings.watching.field_selectors['kopfexamples'] = 'metadata.name=y'
    watches(kmock) << (line('ADDED', obj('a', '101')), ...)
    kmock[f'get {URL}'] << listing('100')

    await take(2, settings, vault)

    assert [req.params for req in kmock] == [
        {'labelSelector': 'app=x', 'fieldSelector': 'metadata.name=y'},
        {**WATCH, 'resourceVersion': '100', 'timeoutSeconds': '123',
         'labelSelector': 'app=x', 'fieldSelector': 'metadata.name=y'},
    ]


async def test_initial_streaming(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                 vault: Vault) -> None:
    settings.watching.initial_streaming = True
    watches(kmock)[:1] << (
        line('ADDED', obj('a', '300')),
        line('ADDED', obj('b', '300')),
        bookmark('300', **{'k8s.io/initial-events-end': 'true'}),
        line('MODIFIED', obj('a', '301')),
    )
    watches(kmock)[1:] << (line('DELETED', obj('b', '302')), ...)

    items = await take(5, settings, vault)

    # Exactly as with the list-then-watch mode: the listing is atomic and ends with LISTED.
    assert items == [
        listed('a', '300'), listed('b', '300'), Bookmark.LISTED,
        {'type': 'MODIFIED', 'object': obj('a', '301')},
        {'type': 'DELETED', 'object': obj('b', '302')},
    ]
    assert lists(kmock) == []
    assert [req.params for req in kmock] == [
        {**WATCH, 'sendInitialEvents': 'true', 'resourceVersionMatch': 'NotOlderThan'},
        {**WATCH, 'resourceVersion': '301'},
    ]


async def test_initial_streaming_interrupted_restarts(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
) -> None:
    settings.watching.initial_streaming = True
    watches(kmock)[:1] << (line('ADDED', obj('gone', '300')),)  # disconnected before the end
    watches(kmock)[1:] << (
        line('ADDED', obj('b', '310')),
        bookmark('310', **{'k8s.io/initial-events-end': 'true'}),
        line('MODIFIED', obj('b', '311')),
        ...
    )

    items = await take(3, settings, vault)

    assert items == [listed('b', '310'), Bookmark.LISTED, {'type': 'MODIFIED', 'object': obj('b', '311')}]
    streaming = {**WATCH, 'sendInitialEvents': 'true', 'resourceVersionMatch': 'NotOlderThan'}
    assert [req.params for req in kmock] == [streaming, streaming]


async def test_initial_streaming_fallback(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                          vault: Vault, caplog: pytest.LogCaptureFixture) -> None:
    settings.watching.initial_streaming = True
    kmock[f'get {URL}', kmock.params(sendInitialEvents='true')] << 422 << {'kind': 'Status', 'code': 422}
    watches(kmock) << (line('ADDED', obj('b', '201')), ...)
    kmock[f'get {URL}'] << listing('200', 'a')

    items = await take(3, settings, vault)

    assert items == [listed('a', '200'), Bookmark.LISTED, {'type': 'ADDED', 'object': obj('b', '201')}]
    assert [req.params for req in kmock] == [
        {**WATCH, 'sendInitialEvents': 'true', 'resourceVersionMatch': 'NotOlderThan'},
        {},
        {**WATCH, 'resourceVersion': '200'},
    ]
    assert 'falling back to list-then-watch' in caplog.text


async def test_watch_request_errors_escalate(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                             vault: Vault) -> None:
    watches(kmock) << 403 << {'kind': 'Status', 'code': 403}
    kmock[f'get {URL}'] << listing('100')
    with pytest.raises(errors.APIForbiddenError):
        await take(10, settings, vault)


@pytest.mark.parametrize('watch_connect, net_connect, request_timeout, expected', [
    (1, 2, 3, 1),
    (None, 2, 3, 2),
    (None, None, 3, 3),
    (None, None, None, None),
])
def test_connect_timeout_fallbacks(settings: StandaloneClientSettings, watch_connect: float | None,
                                   net_connect: float | None, request_timeout: float | None,
                                   expected: float | None) -> None:
    settings.watching.connect_timeout = watch_connect
    settings.networking.connect_timeout = net_connect
    settings.networking.request_timeout = request_timeout
    settings.watching.client_timeout = 99
    timeout = watching.get_watch_timeout(settings)
    assert timeout.connect == expected
    assert timeout.total == 99


# The server-side sharding (KEP-5866): the shardSelector of the lists & the watches, the servers' echo.

SELECTOR = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
INVALID = {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure', 'code': 500,
           'message': 'invalid shard selector: hexStart must have \'0x\' prefix, got "0"'}


async def take_sharded(count: int, settings: StandaloneClientSettings, vault: Vault,
                       echoes: list[str | None]) -> list[Any]:
    items: list[Any] = []
    stream = watching.infinite_watch(settings=settings, vault=vault, resource=KEX, namespace='ns1',
                                     shard_selector=SELECTOR, on_shard_info=echoes.append)
    async with contextlib.aclosing(stream):
        async for item in stream:
            items.append(item)
            if len(items) >= count:
                break
    return items


@pytest.mark.parametrize('shard_info, echo', [
    ({'shardInfo': {'selector': SELECTOR}}, SELECTOR),  # e.g. the built-in resources of 1.36+ with the gate
    ({}, None),  # the servers without the gate, the custom resources
])
async def test_the_shard_selector_goes_with_the_lists_and_the_watches(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
        shard_info: dict[str, Any], echo: str | None,
) -> None:
    settings.watching.chunk_size = 1
    watches(kmock) << (line('ADDED', obj('c', '101')), ...)
    page1 = listing('100', 'a')
    page1['metadata'].update(shard_info, **{'continue': 'token1'})
    page2 = listing('100', 'b')
    page2['metadata'].update(shard_info)
    kmock[f'get {URL}', kmock.params(**{'continue': 'token1'})] << page2
    kmock[f'get {URL}'] << page1
    echoes: list[str | None] = []

    items = await take_sharded(4, settings, vault, echoes)

    assert items == [listed('a', '100'), listed('b', '100'), Bookmark.LISTED,
                     {'type': 'ADDED', 'object': obj('c', '101')}]
    assert [req.params for req in kmock] == [  # every page: the continuation tokens do not keep it
        {'shardSelector': SELECTOR, 'limit': '1'},
        {'shardSelector': SELECTOR, 'limit': '1', 'continue': 'token1'},
        {**WATCH, 'shardSelector': SELECTOR, 'resourceVersion': '100'},
    ]
    assert echoes == [echo]  # once per listing


async def test_the_shard_selector_goes_with_the_streamed_listings_with_no_echo(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
) -> None:
    settings.watching.initial_streaming = True
    watches(kmock) << (line('ADDED', obj('b', '310')),
                       bookmark('310', **{'k8s.io/initial-events-end': 'true'}),
                       line('MODIFIED', obj('b', '311')), ...)
    echoes: list[str | None] = []

    items = await take_sharded(3, settings, vault, echoes)

    assert items == [listed('b', '310'), Bookmark.LISTED, {'type': 'MODIFIED', 'object': obj('b', '311')}]
    assert [req.params for req in kmock] == [{**WATCH, 'shardSelector': SELECTOR, 'sendInitialEvents': 'true',
                                              'resourceVersionMatch': 'NotOlderThan'}]
    assert echoes == [None]


@pytest.mark.parametrize('rejected', ['list', 'watch'])
async def test_a_rejected_shard_selector_is_dropped_with_a_warning(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
        caplog: pytest.LogCaptureFixture, rejected: str,
) -> None:
    settings.networking.error_backoffs = []  # not retried: the 500 comes at once
    sharded = kmock.params(shardSelector=SELECTOR)
    if rejected == 'list':
        kmock[f'get {URL}', sharded] << 500 << INVALID
    else:
        kmock[f'get {URL}', kmock.params(watch='true'), sharded] << 500 << INVALID
    watches(kmock) << (line('ADDED', obj('c', '101')), ...)
    kmock[f'get {URL}'] << listing('100', 'a')

    items = await take_sharded(3, settings, vault, [])

    assert items == [listed('a', '100'), Bookmark.LISTED, {'type': 'ADDED', 'object': obj('c', '101')}]
    assert [req.params.get('shardSelector') for req in kmock] == \
        ([SELECTOR, None, None] if rejected == 'list' else [SELECTOR, SELECTOR, None])
    assert 'The server rejects the shard selector (invalid shard selector: hexStart' in caplog.text
