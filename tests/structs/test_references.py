"""The URLs of resources, their objects and subresources."""
import urllib.parse

import pytest

from kopf._cogs.structs.references import Resource

NAMESPACED = Resource('kopf.dev', 'v1', 'kopfexamples', namespaced=True)
CLUSTER = Resource('', 'v1', 'namespaces', namespaced=False)


@pytest.mark.parametrize('kwargs, url', [
    ({}, '/apis/kopf.dev/v1/kopfexamples'),
    ({'namespace': 'ns1'}, '/apis/kopf.dev/v1/namespaces/ns1/kopfexamples'),
    ({'namespace': 'ns1', 'name': 'kex-1.a'}, '/apis/kopf.dev/v1/namespaces/ns1/kopfexamples/kex-1.a'),
    ({'namespace': 'ns1', 'name': 'kex1', 'subresource': 'status'},
     '/apis/kopf.dev/v1/namespaces/ns1/kopfexamples/kex1/status'),
    ({'namespace': 'ns1', 'params': {'watch': 'true', 'labelSelector': 'a=b,c'}},
     '/apis/kopf.dev/v1/namespaces/ns1/kopfexamples?watch=true&labelSelector=a%3Db%2Cc'),
    ({'server': 'https://host:6443/', 'namespace': 'ns1'},
     'https://host:6443/apis/kopf.dev/v1/namespaces/ns1/kopfexamples'),
])
def test_urls_of_a_namespaced_resource(kwargs: dict[str, str], url: str) -> None:
    assert NAMESPACED.get_url(**kwargs) == url  # type: ignore[arg-type]


def test_urls_of_the_core_api() -> None:
    assert CLUSTER.get_url(name='default') == '/api/v1/namespaces/default'


@pytest.mark.parametrize('part', [
    'plain', 'with-dash.and.dots_and~tilde', 'UPPER09', '',
    'with/slash', 'with space', 'per%cent', 'qu?ery#frag', 'colon:at@plus+', 'ünïcödé', '日本',
])
def test_names_are_percent_encoded_as_path_segments(part: str) -> None:
    expected = urllib.parse.quote(part, safe='')
    url = NAMESPACED.get_url(namespace=part, name=part, subresource=part)
    assert url == f'/apis/kopf.dev/v1/namespaces/{expected}/kopfexamples/{expected}/{expected}'


def test_bad_combinations_are_explained() -> None:
    with pytest.raises(ValueError, match='Subresources can be accessed only on named objects'):
        NAMESPACED.get_url(namespace='ns1', subresource='status')
    with pytest.raises(ValueError, match='cannot have a namespace'):
        CLUSTER.get_url(namespace='ns1')
    with pytest.raises(ValueError, match='needs a namespace'):
        NAMESPACED.get_url(name='kex1')
