import datetime
import logging
import re

import kmock
import pytest

from kopf._clients import events
from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import StandaloneClientSettings

pytestmark = pytest.mark.looptime

REF = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'name': 'kex1', 'uid': 'uid-1', 'namespace': 'ns1'}


async def test_post_event_contract(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                   vault: Vault) -> None:
    kmock['post /api/v1/namespaces/ns1/events'] << {'metadata': {'name': 'kopf-event-abc'}}

    result = await events.post_event(settings=settings, vault=vault, ref=REF, type='Warning',
                                     reason='SomeReason', message='Some message',
                                     component='my-op', instance='pod-1', name_prefix='my-op-')

    assert result is True
    assert len(kmock) == 1
    request = kmock[0]
    assert request.method == 'POST'
    assert request.url.path == '/api/v1/namespaces/ns1/events'
    assert request.params == {}
    assert request.headers['Content-Type'] == 'application/json'
    data = dict(request.data)
    timestamps = {key: data.pop(key) for key in ['firstTimestamp', 'lastTimestamp', 'eventTime']}
    assert data == {
        'apiVersion': 'v1',
        'kind': 'Event',
        'metadata': {'namespace': 'ns1', 'generateName': 'my-op-'},
        'action': 'Action',
        'type': 'Warning',
        'reason': 'SomeReason',
        'message': 'Some message',
        'reportingComponent': 'my-op',
        'reportingInstance': 'pod-1',
        'source': {'component': 'my-op'},
        'involvedObject': REF,
        'count': 1,
    }
    assert re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ', timestamps['firstTimestamp'])
    assert timestamps['lastTimestamp'] == timestamps['firstTimestamp']
    assert re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z', timestamps['eventTime'])
    assert timestamps['eventTime'].startswith(timestamps['firstTimestamp'][:-1])


async def test_created_event_is_not_decoded(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
        caplog: pytest.LogCaptureFixture,
) -> None:
    # No one reads the created event: even an answer that is not JSON is a posted event, not a failure.
    kmock['post /api/v1/namespaces/ns1/events'] << b'not json at all'
    result = await events.post_event(settings=settings, vault=vault, ref=REF, type='Normal', reason='R')
    assert result is True
    assert len(kmock) == 1
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


def test_event_defaults_and_timestamps() -> None:
    now = datetime.datetime(2020, 12, 31, 23, 59, 59, 123456, tzinfo=datetime.UTC)
    body = events.build_event(ref=REF, type='Normal', reason='R', now=now)
    assert body['metadata'] == {'namespace': 'ns1', 'generateName': 'kopf-event-'}
    assert body['reportingComponent'] == 'kopf'
    assert body['reportingInstance'] == 'dev'
    assert body['source'] == {'component': 'kopf'}
    assert body['message'] == ''
    assert body['firstTimestamp'] == body['lastTimestamp'] == '2020-12-31T23:59:59Z'
    assert body['eventTime'] == '2020-12-31T23:59:59.123456Z'


async def test_cluster_scoped_objects_go_to_default_namespace(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
) -> None:
    kmock['post /api/v1/namespaces/default/events'] << {}
    ref = {'apiVersion': 'v1', 'kind': 'Node', 'name': 'node1', 'uid': 'uid-2'}
    await events.post_event(settings=settings, vault=vault, ref=ref, type='Normal', reason='R')
    assert kmock[0].url.path == '/api/v1/namespaces/default/events'
    assert kmock[0].data['involvedObject'] == ref
    assert kmock[0].data['metadata']['namespace'] == 'default'


async def test_long_messages_are_cut(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                     vault: Vault) -> None:
    kmock['post /api/v1/namespaces/ns1/events'] << {}
    await events.post_event(settings=settings, vault=vault, ref=REF, type='Normal', reason='R',
                            message='x' * 2000)
    message = kmock[0].data['message']
    assert len(message) == 1024
    assert message.endswith('...')


@pytest.mark.parametrize('api_version', ['v1', 'events.k8s.io/v1'])
async def test_no_events_for_events(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                    vault: Vault, api_version: str) -> None:
    ref = {'apiVersion': api_version, 'kind': 'Event', 'name': 'e1', 'namespace': 'ns1'}
    result = await events.post_event(settings=settings, vault=vault, ref=ref, type='Normal', reason='R')
    assert result is False
    assert len(kmock) == 0


async def test_missing_namespace_is_quiet(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                          vault: Vault, caplog: pytest.LogCaptureFixture) -> None:
    kmock['post /api/v1/namespaces/ns1/events'] << 404 << {'kind': 'Status', 'code': 404}
    caplog.set_level(logging.DEBUG)
    for _ in range(10):
        result = await events.post_event(settings=settings, vault=vault, ref=REF, type='Normal', reason='R')
        assert result is False
    assert len(kmock) == 10  # no retries
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


async def test_terminating_namespace_is_quiet_and_not_retried(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
        caplog: pytest.LogCaptureFixture, looptime: float,
) -> None:
    # As real servers refuse new objects in a namespace being deleted (e.g. with the object's events).
    status = {'kind': 'Status', 'code': 403, 'reason': 'Forbidden',
              'message': 'events "kopf-event-x" is forbidden: unable to create new content in namespace '
                         'ns1 because it is being terminated',
              'details': {'name': 'kopf-event-x', 'kind': 'events', 'causes': [
                  {'reason': 'NamespaceTerminating', 'message': 'namespace ns1 is being terminated',
                   'field': 'metadata.namespace'}]}}
    kmock['post /api/v1/namespaces/ns1/events'] << 403 << status
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        result = await events.post_event(settings=settings, vault=vault, ref=REF, type='Normal', reason='R',
                                         backoffs=[1, 1], best_effort=True)
        assert result is False
    assert len(kmock) == 3  # no retries, even as best-effort
    assert looptime == 0
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert "Cannot post an event to the namespace 'ns1': it is being deleted." in caplog.messages


async def test_other_failures_are_logged_not_raised(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
        caplog: pytest.LogCaptureFixture, looptime: float,
) -> None:
    settings.networking.error_backoffs = [1]
    kmock['post /api/v1/namespaces/ns1/events'][:1] << 403 << {'kind': 'Status', 'code': 403}
    kmock['post /api/v1/namespaces/ns1/events'][1:] << 500 << {'kind': 'Status', 'code': 500}

    for reason in ['R1', 'R2']:
        assert await events.post_event(settings=settings, vault=vault, ref=REF, type='Normal',
                                       reason=reason) is False

    assert len(kmock) == 3  # 1x 403 without retries, 2x 500 with one retry
    assert looptime == 1
    # The retried attempts are warnings too (one line each); the given-up posts are what counts here.
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and 'will retry' not in r.getMessage()]
    assert len(warnings) == 2
    assert 'Failed to post an event' in warnings[0] and 'HTTP 403' in warnings[0]
    assert 'Failed to post an event' in warnings[1] and 'HTTP 500' in warnings[1]


async def test_best_effort_retries_every_failure_but_the_absent_namespace_with_own_backoffs(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
        caplog: pytest.LogCaptureFixture, looptime: float,
) -> None:
    settings.networking.error_backoffs = [100, 100]  # replaced by the call's own backoffs
    kmock['post /api/v1/namespaces/ns1/events'][:1] << 403 << {'kind': 'Status', 'code': 403}
    kmock['post /api/v1/namespaces/ns1/events'][1:2] << 500 << {'kind': 'Status', 'code': 500}
    kmock['post /api/v1/namespaces/ns1/events'][2:] << {'kind': 'Event'}
    result = await events.post_event(settings=settings, vault=vault, ref=REF, type='Normal', reason='R',
                                     backoffs=[2, 3], best_effort=True)
    assert result is True
    assert len(kmock) == 3
    assert looptime == 5
    retries = [r.getMessage() for r in caplog.records if 'will retry' in r.getMessage()]
    assert len(retries) == 2 and 'HTTP 403' in retries[0]


async def test_best_effort_gives_up_after_own_backoffs_and_never_retries_the_absent_namespace(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
) -> None:
    kmock['post /api/v1/namespaces/ns1/events'][:2] << 409 << {'kind': 'Status', 'code': 409}
    kmock['post /api/v1/namespaces/ns1/events'][2:] << 404 << {'kind': 'Status', 'code': 404}
    assert await events.post_event(settings=settings, vault=vault, ref=REF, type='Normal', reason='R',
                                   backoffs=[7], best_effort=True) is False
    assert len(kmock) == 2 and looptime == 7
    assert await events.post_event(settings=settings, vault=vault, ref=REF, type='Normal', reason='R',
                                   backoffs=[7], best_effort=True) is False
    assert len(kmock) == 3 and looptime == 7
