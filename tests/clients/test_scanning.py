import aiohttp.test_utils
import aiohttp.web
import kmock
import pytest

from kopf._clients import errors, scanning
from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import StandaloneClientSettings
from kopf._cogs.structs.credentials import ConnectionInfo
from kopf._cogs.structs.references import Resource

pytestmark = pytest.mark.looptime

CORE_V1 = {
    'kind': 'APIResourceList',
    'groupVersion': 'v1',
    'resources': [
        {'name': 'pods', 'singularName': '', 'namespaced': True, 'kind': 'Pod',
         'verbs': ['create', 'delete', 'get', 'list', 'patch', 'watch'],
         'shortNames': ['po'], 'categories': ['all']},
        {'name': 'pods/status', 'singularName': '', 'namespaced': True, 'kind': 'Pod',
         'verbs': ['get', 'patch']},
        {'name': 'pods/log', 'singularName': '', 'namespaced': True, 'kind': 'Pod', 'verbs': ['get']},
        {'name': 'namespaces', 'singularName': 'namespace', 'namespaced': False, 'kind': 'Namespace',
         'verbs': ['get', 'list', 'watch'], 'shortNames': ['ns']},
    ],
}
APIS = {
    'kind': 'APIGroupList',
    'groups': [
        {'name': 'kopf.dev',
         'versions': [{'groupVersion': 'kopf.dev/v1', 'version': 'v1'},
                      {'groupVersion': 'kopf.dev/v1beta1', 'version': 'v1beta1'}],
         'preferredVersion': {'groupVersion': 'kopf.dev/v1', 'version': 'v1'}},
        {'name': 'metrics.k8s.io',
         'versions': [{'groupVersion': 'metrics.k8s.io/v1beta1', 'version': 'v1beta1'}],
         'preferredVersion': {'groupVersion': 'metrics.k8s.io/v1beta1', 'version': 'v1beta1'}},
    ],
}
KOPF_V1 = {
    'kind': 'APIResourceList',
    'groupVersion': 'kopf.dev/v1',
    'resources': [
        {'name': 'kopfexamples', 'singularName': 'kopfexample', 'namespaced': True, 'kind': 'KopfExample',
         'verbs': ['get', 'list', 'watch', 'patch'], 'shortNames': ['kex', 'kexes'], 'categories': ['kopf']},
        {'name': 'kopfexamples/status', 'singularName': '', 'namespaced': True, 'kind': 'KopfExample',
         'verbs': ['get', 'patch']},
    ],
}
KOPF_V1BETA1 = {
    'kind': 'APIResourceList',
    'groupVersion': 'kopf.dev/v1beta1',
    'resources': [
        {'name': 'kopfexamples', 'singularName': 'kopfexample', 'namespaced': True, 'kind': 'KopfExample',
         'verbs': ['get', 'list']},
    ],
}


def _by_key(resources: list[Resource]) -> dict[tuple[str, str, str], Resource]:
    return {(r.group, r.version, r.plural): r for r in resources}


async def test_full_scan(kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
                         looptime: float, caplog: pytest.LogCaptureFixture) -> None:
    kmock['get /api'] << {'kind': 'APIVersions', 'versions': ['v1']}
    kmock['get /api/v1'] << CORE_V1
    kmock['get /apis'] << APIS
    kmock['get /apis/kopf.dev/v1'] << KOPF_V1
    kmock['get /apis/kopf.dev/v1beta1'] << KOPF_V1BETA1
    kmock['get /apis/metrics.k8s.io/v1beta1'] << 503 << {'kind': 'Status', 'code': 503}

    resources = _by_key(await scanning.scan_resources(settings=settings, vault=vault))

    assert sorted(req.url.path for req in kmock) == [
        '/api', '/api/v1', '/apis', '/apis/kopf.dev/v1', '/apis/kopf.dev/v1beta1',
        '/apis/metrics.k8s.io/v1beta1',
    ]
    assert all(req.method == 'GET' and req.params == {} for req in kmock)
    assert set(resources) == {
        ('', 'v1', 'pods'), ('', 'v1', 'namespaces'),
        ('kopf.dev', 'v1', 'kopfexamples'), ('kopf.dev', 'v1beta1', 'kopfexamples'),
    }

    pods = resources['', 'v1', 'pods']
    assert pods.kind == 'Pod'
    assert pods.singular == 'pod'  # from the kind when the API reports none
    assert pods.shortcuts == {'po'}
    assert pods.categories == {'all'}
    assert pods.subresources == {'status', 'log'}
    assert pods.namespaced is True
    assert pods.preferred is True
    assert pods.verbs == {'create', 'delete', 'get', 'list', 'patch', 'watch'}

    namespaces = resources['', 'v1', 'namespaces']
    assert namespaces.namespaced is False
    assert namespaces.subresources == frozenset()

    kex1 = resources['kopf.dev', 'v1', 'kopfexamples']
    assert kex1.kind == 'KopfExample'
    assert kex1.singular == 'kopfexample'
    assert kex1.shortcuts == {'kex', 'kexes'}
    assert kex1.categories == {'kopf'}
    assert kex1.subresources == {'status'}
    assert kex1.preferred is True
    assert resources['kopf.dev', 'v1beta1', 'kopfexamples'].preferred is False

    # The unavailable aggregated API is skipped at once, with a warning.
    assert len(kmock['/apis/metrics.k8s.io/v1beta1']) == 1
    assert looptime == 0
    assert 'metrics.k8s.io/v1beta1 is unavailable' in caplog.text


async def test_scan_of_specific_groups(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                       vault: Vault) -> None:
    kmock['get /apis'] << APIS
    kmock['get /apis/kopf.dev/v1'] << KOPF_V1
    kmock['get /apis/kopf.dev/v1beta1'] << KOPF_V1BETA1

    resources = await scanning.scan_resources(settings=settings, vault=vault, groups=['kopf.dev'])

    assert sorted(req.url.path for req in kmock) == ['/apis', '/apis/kopf.dev/v1', '/apis/kopf.dev/v1beta1']
    assert {(r.group, r.version, r.plural) for r in resources} == {
        ('kopf.dev', 'v1', 'kopfexamples'), ('kopf.dev', 'v1beta1', 'kopfexamples'),
    }


async def test_scan_of_core_only(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                 vault: Vault) -> None:
    kmock['get /api'] << {'versions': ['v1']}
    kmock['get /api/v1'] << CORE_V1
    resources = await scanning.scan_resources(settings=settings, vault=vault, groups=[''])
    assert sorted(req.url.path for req in kmock) == ['/api', '/api/v1']
    assert {r.plural for r in resources} == {'pods', 'namespaces'}


async def test_disappeared_group_is_skipped(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                            vault: Vault) -> None:
    kmock['get /apis'] << APIS
    kmock['get /apis/kopf.dev/v1'] << 404 << {'kind': 'Status', 'code': 404}
    kmock['get /apis/kopf.dev/v1beta1'] << KOPF_V1BETA1
    kmock['get /apis/metrics.k8s.io/v1beta1'] << {'resources': []}
    resources = await scanning.scan_resources(settings=settings, vault=vault,
                                              groups=['kopf.dev', 'metrics.k8s.io'])
    assert [(r.group, r.version, r.plural) for r in resources] == [('kopf.dev', 'v1beta1', 'kopfexamples')]


async def test_other_errors_escalate(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                     vault: Vault) -> None:
    kmock['get /apis'] << APIS
    kmock['get /apis/kopf.dev/v1'] << 403 << {'kind': 'Status', 'code': 403}
    kmock['get /apis/kopf.dev/v1beta1'] << KOPF_V1BETA1
    with pytest.raises(errors.APIForbiddenError):
        await scanning.scan_resources(settings=settings, vault=vault, groups=['kopf.dev'])


async def test_list_namespaces(settings: StandaloneClientSettings) -> None:
    # kmock 0.8 fails to parse the exact path "/api/v1/namespaces" (it expects a namespace name after it),
    # so this contract is checked with a bare aiohttp server instead.
    requests: list[aiohttp.web.Request] = []

    async def handler(request: aiohttp.web.Request) -> aiohttp.web.Response:
        requests.append(request)
        return aiohttp.web.json_response({
            'kind': 'NamespaceList', 'metadata': {'resourceVersion': '1'},
            'items': [{'metadata': {'name': 'default'}}, {'metadata': {'name': 'kube-system'}}],
        })

    async with aiohttp.test_utils.RawTestServer(handler) as server:
        info = ConnectionInfo(server=str(server.make_url('')))
        async with Vault({'main': info}) as vault:
            names = await scanning.list_namespaces(settings=settings, vault=vault)
    assert names == ['default', 'kube-system']
    assert [(req.method, req.path, dict(req.query)) for req in requests] == [
        ('GET', '/api/v1/namespaces', {}),
    ]
