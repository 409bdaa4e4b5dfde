import kmock
import pytest

from kopf._clients import creating, deleting, errors, patching
from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import StandaloneClientSettings
from kopf._cogs.structs.references import Resource

pytestmark = pytest.mark.looptime

WITH_STATUS = Resource('kopf.dev', 'v1', 'kopfexamples', namespaced=True, subresources=frozenset({'status'}))
NO_STATUS = Resource('', 'v1', 'configmaps', namespaced=True)
CLUSTERED = Resource('kopf.dev', 'v1', 'clusterthings', namespaced=False, subresources=frozenset({'status'}))
URL = '/apis/kopf.dev/v1/namespaces/ns1/kopfexamples/name1'
MERGE = 'application/merge-patch+json'
JSONPATCH = 'application/json-patch+json'


def contract(handler: kmock.RawHandler) -> list[tuple[str, str, str | None, object]]:
    return [(req.method, req.url.path, req.headers.get('Content-Type'), req.data) for req in handler]


async def test_merge_patch_split_by_status(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                           vault: Vault) -> None:
    kmock[f'patch {URL}'] << {'metadata': {'name': 'name1'}, 'spec': {'x': 1}}
    kmock[f'patch {URL}/status'] << {'metadata': {'name': 'name1'}, 'spec': {'x': 1}, 'status': {'y': 2}}

    body = await patching.patch_obj(settings=settings, vault=vault, resource=WITH_STATUS, namespace='ns1',
                                    name='name1', patch={'spec': {'x': 1}, 'status': {'y': 2}})

    assert body == {'metadata': {'name': 'name1'}, 'spec': {'x': 1}, 'status': {'y': 2}}
    assert contract(kmock) == [
        ('PATCH', URL, MERGE, {'spec': {'x': 1}}),
        ('PATCH', f'{URL}/status', MERGE, {'status': {'y': 2}}),
    ]
    assert all(req.params == {} for req in kmock)


async def test_merge_patch_status_only(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                       vault: Vault) -> None:
    kmock[f'patch {URL}/status'] << {'status': {'y': None}}
    body = await patching.patch_obj(settings=settings, vault=vault, resource=WITH_STATUS, namespace='ns1',
                                    name='name1', patch={'status': {'y': None}})
    assert body == {'status': {'y': None}}
    assert contract(kmock) == [('PATCH', f'{URL}/status', MERGE, {'status': {'y': None}})]


async def test_merge_patch_without_status_subresource(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
) -> None:
    kmock['patch /api/v1/namespaces/ns1/configmaps/cm1'] << {'data': {}}
    patch = {'data': {'a': 'b'}, 'status': {'y': 2}}
    await patching.patch_obj(settings=settings, vault=vault, resource=NO_STATUS, namespace='ns1',
                             name='cm1', patch=patch)
    assert contract(kmock) == [('PATCH', '/api/v1/namespaces/ns1/configmaps/cm1', MERGE, patch)]


async def test_merge_patch_of_cluster_object(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                             vault: Vault) -> None:
    kmock['patch /apis/kopf.dev/v1/clusterthings/thing1'] << {}
    await patching.patch_obj(settings=settings, vault=vault, resource=CLUSTERED, namespace=None,
                             name='thing1', patch={'metadata': {'labels': {'a': 'b'}}})
    assert contract(kmock) == [('PATCH', '/apis/kopf.dev/v1/clusterthings/thing1', MERGE,
                                {'metadata': {'labels': {'a': 'b'}}})]


async def test_empty_patch_makes_no_requests(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                             vault: Vault) -> None:
    body = await patching.patch_obj(settings=settings, vault=vault, resource=WITH_STATUS, namespace='ns1',
                                    name='name1', patch={})
    assert body is None
    assert len(kmock) == 0


async def test_patch_of_missing_object(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                       vault: Vault) -> None:
    kmock[f'patch {URL}'] << 404 << {'kind': 'Status', 'code': 404}
    body = await patching.patch_obj(settings=settings, vault=vault, resource=WITH_STATUS, namespace='ns1',
                                    name='name1', patch={'spec': {'x': 1}, 'status': {'y': 2}})
    assert body is None
    assert len(kmock) == 1  # the status part is not even tried


async def test_patch_errors_escalate(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                     vault: Vault) -> None:
    kmock[f'patch {URL}'] << 422 << {'kind': 'Status', 'code': 422, 'message': 'invalid'}
    with pytest.raises(errors.APIUnprocessableEntityError, match='invalid'):
        await patching.patch_obj(settings=settings, vault=vault, resource=WITH_STATUS, namespace='ns1',
                                 name='name1', patch={'spec': {'x': 1}})


async def test_json_patch_split_by_status(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                          vault: Vault) -> None:
    kmock[f'patch {URL}'] << {'step': 'main'}
    kmock[f'patch {URL}/status'] << {'step': 'status'}
    ops = [
        {'op': 'add', 'path': '/metadata/labels/a', 'value': 'b'},
        {'op': 'replace', 'path': '/status/phase', 'value': 'Done'},
        {'op': 'remove', 'path': '/spec/x'},
        {'op': 'add', 'path': '/status', 'value': {}},
        {'op': 'add', 'path': '/statusless', 'value': 1},
    ]

    body = await patching.json_patch_obj(settings=settings, vault=vault, resource=WITH_STATUS,
                                         namespace='ns1', name='name1', patch=ops)

    assert body == {'step': 'status'}
    assert contract(kmock) == [
        ('PATCH', URL, JSONPATCH, [ops[0], ops[2], ops[4]]),
        ('PATCH', f'{URL}/status', JSONPATCH, [ops[1], ops[3]]),
    ]


async def test_json_patch_without_status_subresource(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
) -> None:
    kmock['patch /api/v1/namespaces/ns1/configmaps/cm1'] << {}
    ops = [{'op': 'replace', 'path': '/status/phase', 'value': 'Done'}]
    await patching.json_patch_obj(settings=settings, vault=vault, resource=NO_STATUS, namespace='ns1',
                                  name='cm1', patch=ops)
    assert contract(kmock) == [('PATCH', '/api/v1/namespaces/ns1/configmaps/cm1', JSONPATCH, ops)]


async def test_create(kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault) -> None:
    kmock['post /apis/kopf.dev/v1/namespaces/ns1/kopfexamples'] << {'metadata': {'name': 'n', 'uid': 'u'}}
    body = {'metadata': {'name': 'n', 'namespace': 'ns1'}, 'spec': {}}
    result = await creating.create_obj(settings=settings, vault=vault, resource=WITH_STATUS, body=body)
    assert result == {'metadata': {'name': 'n', 'uid': 'u'}}
    assert contract(kmock) == [('POST', '/apis/kopf.dev/v1/namespaces/ns1/kopfexamples',
                                'application/json', body)]


async def test_create_in_explicit_namespace(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                            vault: Vault) -> None:
    kmock['post /apis/kopf.dev/v1/namespaces/ns2/kopfexamples'] << {}
    await creating.create_obj(settings=settings, vault=vault, resource=WITH_STATUS, namespace='ns2',
                              body={'metadata': {'generateName': 'x-'}})
    assert kmock[0].url.path == '/apis/kopf.dev/v1/namespaces/ns2/kopfexamples'


async def test_create_without_namespace_fails(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                              vault: Vault) -> None:
    with pytest.raises(ValueError):
        await creating.create_obj(settings=settings, vault=vault, resource=WITH_STATUS, body={})
    assert len(kmock) == 0


async def test_create_conflict(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                               vault: Vault) -> None:
    kmock['post /apis/kopf.dev/v1/clusterthings'] << 409 << {'kind': 'Status', 'code': 409,
                                                            'reason': 'AlreadyExists'}
    with pytest.raises(errors.APIConflictError) as exc_info:
        await creating.create_obj(settings=settings, vault=vault, resource=CLUSTERED,
                                  body={'metadata': {'name': 'x'}})
    assert exc_info.value.reason == 'AlreadyExists'


async def test_delete(kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault) -> None:
    kmock[f'delete {URL}'] << {'kind': 'Status', 'status': 'Success'}
    result = await deleting.delete_obj(settings=settings, vault=vault, resource=WITH_STATUS,
                                       namespace='ns1', name='name1')
    assert result == {'kind': 'Status', 'status': 'Success'}
    assert contract(kmock) == [('DELETE', URL, None, None)]


async def test_delete_with_options(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                   vault: Vault) -> None:
    kmock[f'delete {URL}'] << {}
    await deleting.delete_obj(settings=settings, vault=vault, resource=WITH_STATUS, namespace='ns1',
                              name='name1', options={'propagationPolicy': 'Foreground'})
    assert contract(kmock) == [('DELETE', URL, 'application/json', {'propagationPolicy': 'Foreground'})]


async def test_delete_missing(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                              vault: Vault) -> None:
    kmock[f'delete {URL}'] << 404 << {'kind': 'Status', 'code': 404}
    result = await deleting.delete_obj(settings=settings, vault=vault, resource=WITH_STATUS,
                                       namespace='ns1', name='name1')
    assert result is None


@pytest.mark.parametrize('resource, patch, main, status', [
    (WITH_STATUS, {'spec': {'x': 1}}, {'spec': {'x': 1}}, {}),
    (WITH_STATUS, {'status': {'y': 2}}, {}, {'status': {'y': 2}}),
    (WITH_STATUS, {'spec': {'x': 1}, 'status': {'y': 2}}, {'spec': {'x': 1}}, {'status': {'y': 2}}),
    (WITH_STATUS, {}, {}, {}),
    (NO_STATUS, {'data': {'a': 'b'}, 'status': {'y': 2}}, {'data': {'a': 'b'}, 'status': {'y': 2}}, {}),
    (NO_STATUS, {'status': {'y': 2}}, {'status': {'y': 2}}, {}),
])
def test_merge_patch_is_split_into_the_main_and_status_parts(
        resource: Resource, patch: dict[str, object], main: dict[str, object], status: dict[str, object],
) -> None:
    result = patching.split_merge_patch(resource, patch)
    assert result == (main, status)
    assert result[0] is not patch and result[1] is not patch  # new dicts: the caller's patch is never shared
