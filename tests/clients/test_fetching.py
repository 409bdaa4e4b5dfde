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

