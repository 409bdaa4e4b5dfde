import asyncio
import contextlib
import logging
from typing import Any

import kmock
import pytest

from kopf._clients import errors, fetching
from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import StandaloneClientSettings
from kopf._cogs.structs.references import EVERYTHING, Resource

pytestmark = pytest.mark.looptime

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', singular='kopfexample',
               shortcuts=frozenset({'kex'}), namespaced=True, subresources=frozenset({'status'}))
URL = '/apis/kopf.dev/v1/namespaces/ns1/kopfexamples'


async def test_read_obj(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                        vault: Vault) -> None:
    kmock[f'get {URL}/name1'] << {'metadata': {'name': 'name1'}}
    body = await fetching.read_obj(settings=settings, vault=vault, resource=KEX,
                                   namespace='ns1', name='name1')
    assert body == {'metadata': {'name': 'name1'}}
    assert kmock[0].method == 'GET'
    assert kmock[0].url.path == f'{URL}/name1'
    assert kmock[0].params == {}


async def test_read_missing_obj(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                vault: Vault) -> None:
    kmock[f'get {URL}/name1'] << 404 << {'kind': 'Status', 'code': 404}
    with pytest.raises(errors.APINotFoundError):
        await fetching.read_obj(settings=settings, vault=vault, resource=KEX, namespace='ns1', name='name1')


async def test_list_in_one_go(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                              vault: Vault) -> None:
    kmock[f'get {URL}'] << {
        'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExampleList', 'metadata': {'resourceVersion': '123'},
        'items': [{'metadata': {'name': 'a'}}, {'kind': 'Custom', 'metadata': {'name': 'b'}}],
    }
    objs, resource_version = await fetching.list_objs(settings=settings, vault=vault, resource=KEX,
                                                      namespace='ns1')
    assert resource_version == '123'
    assert objs == [
        {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'a'}},
        {'apiVersion': 'kopf.dev/v1', 'kind': 'Custom', 'metadata': {'name': 'b'}},
    ]
    assert len(kmock) == 1
    assert kmock[0].method == 'GET'
    assert kmock[0].url.path == URL
    assert kmock[0].params == {}


async def test_list_cluster_wide_with_null_items(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                                 vault: Vault) -> None:
    kmock['get /apis/kopf.dev/v1/kopfexamples'] << {'metadata': {'resourceVersion': '5'}, 'items': None}
    objs, resource_version = await fetching.list_objs(settings=settings, vault=vault, resource=KEX,
                                                      namespace=None)
    assert objs == []
    assert resource_version == '5'


async def test_list_with_pagination(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                    vault: Vault) -> None:
    settings.watching.chunk_size = 2
    kmock[f'get {URL}', kmock.params(limit='2', **{'continue': 'token1'})] << {
        'metadata': {'resourceVersion': '100', 'continue': 'token2'},
        'items': [{'metadata': {'name': 'c'}}, {'metadata': {'name': 'd'}}],
    }
    kmock[f'get {URL}', kmock.params(limit='2', **{'continue': 'token2'})] << {
        'metadata': {'resourceVersion': '100'},
        'items': [{'metadata': {'name': 'e'}}],
    }
    kmock[f'get {URL}', kmock.params(limit='2')] << {
        'metadata': {'resourceVersion': '100', 'continue': 'token1', 'remainingItemCount': 3},
        'items': [{'metadata': {'name': 'a'}}, {'metadata': {'name': 'b'}}],
    }

    objs, resource_version = await fetching.list_objs(settings=settings, vault=vault, resource=KEX,
                                                      namespace='ns1')

    assert [obj['metadata']['name'] for obj in objs] == ['a', 'b', 'c', 'd', 'e']
    assert resource_version == '100'
    assert [req.params for req in kmock] == [
        {'limit': '2'},
        {'limit': '2', 'continue': 'token1'},
        {'limit': '2', 'continue': 'token2'},
    ]


async def test_list_restarts_when_continuation_expires(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
) -> None:
    settings.watching.chunk_size = 1
    kmock[f'get {URL}', kmock.params(limit='1', **{'continue': 'old'})] << 410 << {'kind': 'Status'}
    kmock[f'get {URL}', kmock.params(limit='1', **{'continue': 'new'})] << {
        'metadata': {'resourceVersion': '200'}, 'items': [{'metadata': {'name': 'b'}}],
    }
    kmock[f'get {URL}', kmock.params(limit='1')][:1] << {
        'metadata': {'resourceVersion': '100', 'continue': 'old'}, 'items': [{'metadata': {'name': 'x'}}],
    }
    kmock[f'get {URL}', kmock.params(limit='1')][1:] << {
        'metadata': {'resourceVersion': '200', 'continue': 'new'}, 'items': [{'metadata': {'name': 'a'}}],
    }
    objs, resource_version = await fetching.list_objs(settings=settings, vault=vault, resource=KEX,
                                                      namespace='ns1')
    assert [obj['metadata']['name'] for obj in objs] == ['a', 'b']
    assert resource_version == '200'
    assert [req.params.get('continue') for req in kmock] == [None, 'old', None, 'new']


async def test_list_requests_the_next_page_while_the_consumer_handles_the_current_one(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
) -> None:
    settings.watching.chunk_size = 1
    requested = {token: asyncio.Event() for token in ['', 'token1', 'token2']}

    def page(token: str, name: str, next_token: str | None) -> Any:
        def respond() -> dict[str, Any]:
            requested[token].set()
            metadata = {'resourceVersion': '100', **({'continue': next_token} if next_token else {})}
            return {'metadata': metadata, 'items': [{'metadata': {'name': name}}]}
        return respond

    kmock[f'get {URL}', kmock.params(limit='1', **{'continue': 'token1'})] << page('token1', 'b', 'token2')
    kmock[f'get {URL}', kmock.params(limit='1', **{'continue': 'token2'})] << page('token2', 'c', None)
    kmock[f'get {URL}', kmock.params(limit='1')] << page('', 'a', 'token1')

    names: list[str] = []
    pages = fetching.list_pages(settings=settings, vault=vault, resource=KEX, namespace='ns1')
    async with contextlib.aclosing(pages):
        async for listed in pages:
            names.extend(obj['metadata']['name'] for obj in listed.items)
            if len(names) == 1:  # the server has the next page's request before this one is done with
                await asyncio.wait_for(requested['token1'].wait(), timeout=1)
    assert names == ['a', 'b', 'c']
    assert [req.params.get('continue') for req in kmock] == [None, 'token1', 'token2']  # each page once
    assert looptime == 0


async def test_list_stopped_early_cancels_the_page_requested_ahead(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
        caplog: pytest.LogCaptureFixture,
) -> None:
    settings.watching.chunk_size = 1
    requested = asyncio.Event()

    def never() -> Any:
        requested.set()
        return asyncio.sleep(100)

    kmock[f'get {URL}', kmock.params(limit='1', **{'continue': 'token1'})] << never << {}
    kmock[f'get {URL}', kmock.params(limit='1')] << {
        'metadata': {'resourceVersion': '100', 'continue': 'token1'}, 'items': [{'metadata': {'name': 'a'}}],
    }
    pages = fetching.list_pages(settings=settings, vault=vault, resource=KEX, namespace='ns1')
    async with contextlib.aclosing(pages):
        async for listed in pages:
            assert [obj['metadata']['name'] for obj in listed.items] == ['a']
            await asyncio.wait_for(requested.wait(), timeout=1)  # it is in the server
            ahead = [task for task in asyncio.all_tasks() if task.get_coro().__name__ == 'request']
            break
    assert len(ahead) == 1
    await asyncio.wait(ahead, timeout=1)
    assert ahead[0].cancelled()
    assert looptime == 0  # not waited for
    assert [req.params.get('continue') for req in kmock] == [None, 'token1']
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_list_requests_again_a_page_requested_ahead_that_is_not_json(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
        caplog: pytest.LogCaptureFixture,
) -> None:
    settings.watching.chunk_size = 1
    kmock[f'get {URL}', kmock.params(limit='1', **{'continue': 'token1'})][:1] << 200 << b'<html>502</html>'
    kmock[f'get {URL}', kmock.params(limit='1', **{'continue': 'token1'})][1:] << {
        'metadata': {'resourceVersion': '100'}, 'items': [{'metadata': {'name': 'b'}}],
    }
    kmock[f'get {URL}', kmock.params(limit='1')] << {
        'metadata': {'resourceVersion': '100', 'continue': 'token1'}, 'items': [{'metadata': {'name': 'a'}}],
    }
    objs, _ = await fetching.list_objs(settings=settings, vault=vault, resource=KEX, namespace='ns1')
    assert [obj['metadata']['name'] for obj in objs] == ['a', 'b']
    assert [req.params.get('continue') for req in kmock] == [None, 'token1', 'token1']
    assert [m.split(':')[0] for m in caplog.messages] == [
        'The page of kopfexamples.kopf.dev requested ahead is not JSON; requesting it again']
    assert looptime == 0


async def test_list_with_selectors(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                   vault: Vault) -> None:
    settings.watching.label_selectors['kex'] = {'app': 'x', 'tier': None, 'old': False, 'env': ['a', 'b']}
    settings.watching.shard_selectors[EVERYTHING] = 'shard=1'
    settings.watching.field_selectors['kopfexamples.kopf.dev'] = 'metadata.name!=skipped'
    settings.watching.field_selectors['pods'] = 'irrelevant=1'
    kmock[f'get {URL}'] << {'metadata': {'resourceVersion': '1'}, 'items': []}

    await fetching.list_objs(settings=settings, vault=vault, resource=KEX, namespace='ns1')

    assert kmock[0].params == {
        'labelSelector': 'app=x,tier,!old,env in (a,b),shard=1',
        'fieldSelector': 'metadata.name!=skipped',
    }


@pytest.mark.parametrize('key', ['kopfexamples', 'kopfexamples.kopf.dev', 'kopfexamples.v1.kopf.dev',
                                 'KopfExample', 'kopfexample', 'kex', EVERYTHING])
def test_selector_keys(settings: StandaloneClientSettings, key: object) -> None:
    settings.watching.label_selectors[key] = 'a=b'
    assert fetching.build_selector_params(settings, KEX) == {'labelSelector': 'a=b'}


def test_specific_selector_wins_over_everything(settings: StandaloneClientSettings) -> None:
    settings.watching.label_selectors[EVERYTHING] = 'generic=1'
    settings.watching.label_selectors['kex'] = 'specific=1'
    assert fetching.build_selector_params(settings, KEX) == {'labelSelector': 'specific=1'}


def test_no_selectors_for_other_resources(settings: StandaloneClientSettings) -> None:
    settings.watching.label_selectors['pods'] = 'a=b'
    assert fetching.build_selector_params(settings, KEX) == {}

