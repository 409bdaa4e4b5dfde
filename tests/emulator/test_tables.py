"""Server-side printing: Tables for ``kubectl get``, with the printer columns of CRDs."""

import copy
import datetime
import json

import pytest

from kopf.testing.emulator.tables import human_age, table_version

TABLE_ACCEPT = (
    'application/json;as=Table;v=v1;g=meta.k8s.io,'
    'application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json'
)
CMS = '/api/v1/namespaces/default/configmaps'
CRDS = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions'
KEXES = '/apis/kopf.dev/v1/namespaces/default/kopfexamples'


@pytest.mark.parametrize(
    'accept, expected',
    [
        (TABLE_ACCEPT, 'v1'),
        ('application/json;as=Table;v=v1beta1;g=meta.k8s.io', 'v1beta1'),
        ('application/json', None),
        ('', None),
    ],
)
def test_table_version_negotiation(accept: str, expected: str | None) -> None:
    assert table_version(accept) == expected


@pytest.mark.parametrize(
    'seconds, expected',
    [
        (0, '0s'),
        (59, '59s'),
        (119, '119s'),
        (120, '2m'),
        (125, '2m5s'),
        (600, '10m'),
        (3 * 3600, '3h'),
        (3 * 3600 + 60, '3h1m'),
        (30 * 3600, '30h'),
        (3 * 86400 + 3600, '3d1h'),
        (100 * 86400, '100d'),
        (3 * 365 * 86400, '3y'),
        (-10, '<invalid>'),
    ],
)
def test_human_age(seconds: int, expected: str) -> None:
    now = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    created = (now - datetime.timedelta(seconds=seconds)).strftime('%Y-%m-%dT%H:%M:%SZ')
    assert human_age(created, now) == expected
    assert human_age('garbage', now) == '<unknown>'


async def test_builtin_tables(api) -> None:
    await api.post(CMS, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1'}})
    reply = await api.get(CMS, headers={'Accept': TABLE_ACCEPT})
    assert reply.status == 200
    assert reply.body['kind'] == 'Table'
    assert reply.body['apiVersion'] == 'meta.k8s.io/v1'
    assert [column['name'] for column in reply.body['columnDefinitions']] == ['Name', 'Age']
    assert reply.body['rows'][0]['cells'][0] == 'cm1'
    assert reply.body['rows'][0]['object']['kind'] == 'PartialObjectMetadata'
    assert reply.body['rows'][0]['object']['metadata']['name'] == 'cm1'

    single = await api.get(f'{CMS}/cm1?includeObject=Object', headers={'Accept': TABLE_ACCEPT})
    assert single.body['rows'][0]['object']['kind'] == 'ConfigMap'


async def test_custom_printer_columns(api, crd) -> None:
    body = copy.deepcopy(crd)
    body['spec']['versions'][0]['additionalPrinterColumns'] = [
        {'name': 'Duration', 'type': 'string', 'jsonPath': '.spec.duration'},
        {'name': 'First', 'type': 'string', 'jsonPath': '.spec.items[0]'},
        {'name': 'Count', 'type': 'integer', 'jsonPath': '.spec.count'},
        {'name': 'Missing', 'type': 'string', 'jsonPath': '.status.absent'},
        {'name': 'Created', 'type': 'date', 'jsonPath': '.metadata.creationTimestamp'},
    ]
    assert (await api.put(f'{CRDS}/kopfexamples.kopf.dev', body)).status == 200
    await api.post(
        KEXES,
        {
            'apiVersion': 'kopf.dev/v1',
            'kind': 'KopfExample',
            'metadata': {'name': 'kex1'},
            'spec': {'duration': '1m', 'items': ['a', 'b'], 'count': 3},
        },
    )
    reply = await api.get(KEXES, headers={'Accept': TABLE_ACCEPT})
    assert [column['name'] for column in reply.body['columnDefinitions']] == [
        'Name',
        'Duration',
        'First',
        'Count',
        'Missing',
        'Created',
    ]
    cells = reply.body['rows'][0]['cells']
    assert cells[:5] == ['kex1', '1m', 'a', 3, None]
    assert cells[5].endswith('s')


async def test_watched_tables(emulator, api) -> None:
    await api.post(CMS, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1'}})
    async with api.session.get(f'{CMS}?watch=true', headers={'Accept': TABLE_ACCEPT}) as response:
        event = json.loads(await response.content.readline())
    assert event['type'] == 'ADDED'
    assert event['object']['kind'] == 'Table'
    assert event['object']['rows'][0]['cells'][0] == 'cm1'
