import asyncio
import dataclasses
import logging
from typing import Any

import kmock
import pytest

from kopf._clients import api, errors
from kopf._clients.connections import CannotConnect
from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import StandaloneClientSettings
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError, VaultKey

from .conftest import SECRET_TOKEN, with_token

pytestmark = pytest.mark.looptime


async def test_request_contract(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                vault: Vault) -> None:
    kmock['post /apis/kopf.dev/v1/namespaces/ns1/kopfexamples'] << {'metadata': {'name': 'x'}}

    result = await api.request('POST', '/apis/kopf.dev/v1/namespaces/ns1/kopfexamples',
                               payload={'spec': {'a': 1}}, params={'dryRun': 'All'},
                               settings=settings, vault=vault)

    assert result == {'metadata': {'name': 'x'}}
    assert len(kmock) == 1
    request = kmock[0]
    assert request.method == 'POST'
    assert request.url.path == '/apis/kopf.dev/v1/namespaces/ns1/kopfexamples'
    assert request.params == {'dryRun': 'All'}
    assert request.headers['Authorization'] == f'Bearer {SECRET_TOKEN}'
    assert request.headers['Content-Type'] == 'application/json'
    assert request.headers['Accept'] == 'application/json'
    assert request.data == {'spec': {'a': 1}}


async def test_custom_content_type_and_scheme(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, info: ConnectionInfo,
) -> None:
    kmock['patch /api/v1/namespaces/ns1/pods/p1'] << {}
    async with Vault({'main': with_token(info, 'abc', scheme='Digest')}) as vault:
        await api.request('PATCH', '/api/v1/namespaces/ns1/pods/p1', payload={'a': None},
                          content_type='application/merge-patch+json', settings=settings, vault=vault)
    assert kmock[0].headers['Content-Type'] == 'application/merge-patch+json'
    assert kmock[0].headers['Authorization'] == 'Digest abc'
    assert kmock[0].body == b'{"a":null}'  # compact: nothing in the API's JSON needs the spaces


async def test_empty_response_is_none(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                      vault: Vault) -> None:
    kmock['delete /x'] << b''
    result = await api.request('DELETE', '/x', settings=settings, vault=vault)
    assert result is None
    assert kmock[0].method == 'DELETE'
    assert kmock[0].body == b''
    assert 'Content-Type' not in kmock[0].headers


async def test_server_path_prefix_is_kept(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                          server: str) -> None:
    kmock['get /prefix/api'] << {'versions': ['v1']}
    async with Vault({'main': ConnectionInfo(server=server + '/prefix/')}) as vault:
        result = await api.request('GET', '/api', settings=settings, vault=vault)
    assert result == {'versions': ['v1']}
    assert kmock[0].url.path == '/prefix/api'
    assert 'Authorization' not in kmock[0].headers


async def test_basic_auth(kmock: kmock.RawHandler, settings: StandaloneClientSettings, server: str) -> None:
    kmock['get /api'] << {}
    async with Vault({'main': ConnectionInfo(server=server, username='user', password='pass')}) as vault:
        await api.request('GET', '/api', settings=settings, vault=vault)
    assert kmock[0].headers['Authorization'] == 'Basic dXNlcjpwYXNz'


async def test_5xx_then_success(kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
                                looptime: float, caplog: pytest.LogCaptureFixture) -> None:
    kmock['get /api'][:2] << 503 << {'kind': 'Status', 'code': 503, 'message': 'busy'}
    kmock['get /api'][2:] << {'versions': ['v1']}

    result = await api.request('GET', '/api', settings=settings, vault=vault)

    assert result == {'versions': ['v1']}
    assert len(kmock) == 3
    assert all(req.method == 'GET' and req.url.path == '/api' for req in kmock)
    assert looptime == 1 + 2  # the first two backoffs
    assert 'Request attempt #1 failed; will retry' in caplog.text
    assert 'Request attempt #2 failed; will retry' in caplog.text
    # Not errors yet (only if the retries run out, which the caller sees): one WARNING line each.
    retries = [record for record in caplog.records if 'will retry' in record.getMessage()]
    assert [record.levelname for record in retries] == ['WARNING', 'WARNING']
    assert not any(record.exc_info for record in retries)


async def test_retries_exhausted(kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
                                 looptime: float) -> None:
    kmock['get /api'] << 500 << {'kind': 'Status', 'code': 500, 'message': 'boom', 'reason': 'InternalError'}

    with pytest.raises(errors.APIServerError) as exc_info:
        await api.request('GET', '/api', settings=settings, vault=vault)

    assert exc_info.value.status == 500
    assert exc_info.value.message == 'boom'
    assert len(kmock) == 4  # 3 backoffs => 4 attempts
    assert looptime == 1 + 2 + 3


@pytest.mark.parametrize('body', [
    pytest.param(b'<html><body>502 Bad Gateway</body></html>', id='html'),
    pytest.param(b'{"kind": "Status", "trunc', id='truncated'),
    pytest.param(b'\xff\xfe', id='not-utf8'),
])
async def test_non_json_success_is_retried_then_escalated(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, server: str,
        looptime: float, caplog: pytest.LogCaptureFixture, body: bytes,
) -> None:
    # E.g. a proxy in front of the API answering in its own way: never handed to the callers as data.
    kmock['get /api'][:1] << 200 << body
    kmock['get /api'][1:2] << {'versions': ['v1']}
    kmock['get /api'][2:] << 200 << body

    assert await api.request('GET', '/api', settings=settings, vault=vault) == {'versions': ['v1']}
    assert looptime == 1
    assert caplog.messages == [f'Request attempt #1 failed; will retry: GET /api -> '
                               f'HTTP 200 for GET {server}/api: the response is not JSON: {body!r}, '
                               f'retrying in 1 s']

    with pytest.raises(errors.APINonJSONResponseError) as exc_info:
        await api.request('GET', '/api', settings=settings, vault=vault)
    assert str(exc_info.value) == f'HTTP 200 for GET {server}/api: the response is not JSON: {body!r}'


async def test_a_decoding_function_is_retried_as_the_decoding_is(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, server: str,
        looptime: float, caplog: pytest.LogCaptureFixture,
) -> None:
    # E.g. the timers' patches, which need only the version: a response that is not JSON is retried as usual.
    kmock['patch /x'][:1] << 200 << b'<html>502</html>'
    kmock['patch /x'][1:] << {'metadata': {'resourceVersion': '5'}, 'spec': {'resourceVersion': '3'}}

    version = await api.request('PATCH', '/x', payload={}, settings=settings, vault=vault,
                                decode=api.decode_version)
    assert version == '5'
    assert looptime == 1
    assert caplog.messages == [f'Request attempt #1 failed; will retry: PATCH /x -> HTTP 200 for PATCH '
                               f"{server}/x: the response is not JSON: b'<html>502</html>', retrying in 1 s"]


@pytest.mark.parametrize('backoffs, attempts, total', [
    pytest.param(2.5, 2, 2.5, id='a-number'),
    pytest.param([], 1, 0, id='empty'),
    pytest.param((4, 4), 3, 8, id='tuple'),
])
async def test_backoff_forms(kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
                             looptime: float, backoffs: object, attempts: int, total: float) -> None:
    settings.networking.error_backoffs = backoffs  # type: ignore[assignment]
    kmock['get /api'] << 502
    with pytest.raises(errors.APIServerError):
        await api.request('GET', '/api', settings=settings, vault=vault)
    assert len(kmock) == attempts
    assert looptime == total


async def test_infinite_reiterable_backoffs(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                            vault: Vault, looptime: float) -> None:
    class Forever:
        def __iter__(self):  # type: ignore[no-untyped-def]
            while True:
                yield 10

    settings.networking.error_backoffs = Forever()
    kmock['get /api'][:5] << 500
    kmock['get /api'][5:] << {}
    await api.request('GET', '/api', settings=settings, vault=vault)
    assert looptime == 50

    # Re-iterated from the start for the next call; a success resets nothing globally.
    kmock['get /apis'][:1] << 500
    kmock['get /apis'][1:] << {}
    await api.request('GET', '/apis', settings=settings, vault=vault)
    assert looptime == 60


@pytest.mark.parametrize('status', [400, 403, 404, 409, 422])
async def test_4xx_not_retried(kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
                               looptime: float, status: int) -> None:
    kmock['get /api'] << status << {'kind': 'Status', 'code': status}
    with pytest.raises(errors.APIClientError) as exc_info:
        await api.request('GET', '/api', settings=settings, vault=vault)
    assert exc_info.value.status == status
    assert len(kmock) == 1
    assert looptime == 0


async def test_no_retry_statuses(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                 vault: Vault) -> None:
    kmock['get /apis/metrics.k8s.io/v1beta1'] << 503
    with pytest.raises(errors.APIServerError):
        await api.request('GET', '/apis/metrics.k8s.io/v1beta1', settings=settings, vault=vault,
                          no_retry_statuses={503})
    assert len(kmock) == 1


async def test_429_waits_at_least_retry_after(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                              vault: Vault, looptime: float) -> None:
    kmock['get /api'][:1] << 429 << {'Retry-After': '7'} << {'kind': 'Status', 'code': 429}
    kmock['get /api'][1:] << {'ok': True}
    result = await api.request('GET', '/api', settings=settings, vault=vault)
    assert result == {'ok': True}
    assert len(kmock) == 2
    assert looptime == 7  # the server's 7s is longer than our own 1s.


async def test_429_own_backoff_when_longer(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                           vault: Vault, looptime: float) -> None:
    settings.networking.error_backoffs = [10]
    kmock['get /api'][:1] << 429 << {'Retry-After': '3'}
    kmock['get /api'][1:] << {}
    await api.request('GET', '/api', settings=settings, vault=vault)
    assert looptime == 10


async def test_429_enforced_retry_after(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                        vault: Vault, looptime: float) -> None:
    settings.networking.error_backoffs = [10]
    settings.networking.enforce_retry_after = True
    kmock['get /api'][:1] << 429 << {'Retry-After': '3'}
    kmock['get /api'][1:] << {}
    await api.request('GET', '/api', settings=settings, vault=vault)
    assert looptime == 3


async def test_429_retry_after_from_status_details(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
) -> None:
    kmock['get /api'][:1] << 429 << {'kind': 'Status', 'code': 429, 'details': {'retryAfterSeconds': 4}}
    kmock['get /api'][1:] << {}
    await api.request('GET', '/api', settings=settings, vault=vault)
    assert looptime == 4


async def test_429_without_retry_after_uses_backoffs(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault, looptime: float,
) -> None:
    kmock['get /api'] << 429
    with pytest.raises(errors.APITooManyRequestsError):
        await api.request('GET', '/api', settings=settings, vault=vault)
    assert len(kmock) == 4
    assert looptime == 1 + 2 + 3


async def test_network_errors_retried(settings: StandaloneClientSettings, looptime: float,
                                      unused_tcp_port: int) -> None:
    # Nothing listens on this port: the connection is refused every time.
    async with Vault({'main': ConnectionInfo(server=f'http://127.0.0.1:{unused_tcp_port}')}) as vault:
        with pytest.raises(CannotConnect):
            await api.request('GET', '/api', settings=settings, vault=vault)
    assert looptime == 1 + 2 + 3


async def test_request_timeout_retried(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                       vault: Vault, looptime: float) -> None:
    settings.networking.request_timeout = 5
    settings.networking.error_backoffs = [1]
    kmock['get /api'][:1] << (lambda: asyncio.sleep(100)) << {}
    kmock['get /api'][1:] << {'ok': True}
    result = await api.request('GET', '/api', settings=settings, vault=vault)
    assert result == {'ok': True}
    assert looptime == 5 + 1


async def test_request_timeout_exhausted(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                         vault: Vault, looptime: float) -> None:
    settings.networking.request_timeout = 5
    settings.networking.error_backoffs = []
    kmock['get /api'] << (lambda: asyncio.sleep(100)) << {}
    with pytest.raises(asyncio.TimeoutError):
        await api.request('GET', '/api', settings=settings, vault=vault)
    assert looptime == 5


async def test_401_relogin_then_success(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                        info: ConnectionInfo, looptime: float) -> None:
    kmock['get /api', kmock.headers({'Authorization': 'Bearer old'})] << 401 << {'kind': 'Status'}
    kmock['get /api', kmock.headers({'Authorization': 'Bearer new'})] << {'ok': True}
    relogins: list[int] = []

    async def relogin() -> dict[str, ConnectionInfo]:
        relogins.append(1)
        return {'main': with_token(info, 'new')}

    async with Vault({'main': with_token(info, 'old')}, relogin=relogin) as vault:
        result = await api.request('GET', '/api', settings=settings, vault=vault)

    assert result == {'ok': True}
    assert len(relogins) == 1
    assert [req.headers['Authorization'] for req in kmock] == ['Bearer old', 'Bearer new']
    assert looptime == 0  # 401 is not a backoff-worthy error.


async def test_401_after_successes_relogs_in(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                            info: ConnectionInfo) -> None:
    # The credential's session exists after the first request: the later ones take the fast path.
    kmock['get /api', kmock.headers({'Authorization': 'Bearer old'})][:2] << {'token': 'old'}
    kmock['get /api', kmock.headers({'Authorization': 'Bearer old'})] << 401
    kmock['get /api', kmock.headers({'Authorization': 'Bearer new'})] << {'token': 'new'}
    relogins: list[int] = []

    async def relogin() -> dict[str, ConnectionInfo]:
        relogins.append(1)
        return {'main': with_token(info, 'new')}

    async with Vault({'main': with_token(info, 'old')}, relogin=relogin) as vault:
        results = [await api.request('GET', '/api', settings=settings, vault=vault) for _ in range(3)]

    assert results == [{'token': 'old'}, {'token': 'old'}, {'token': 'new'}]
    assert len(relogins) == 1
    assert [req.headers['Authorization'] for req in kmock] == ['Bearer old'] * 3 + ['Bearer new']


async def test_401_switches_to_next_credentials(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                                info: ConnectionInfo) -> None:
    kmock['get /api', kmock.headers({'Authorization': 'Bearer a'})] << 401
    kmock['get /api', kmock.headers({'Authorization': 'Bearer b'})] << {'ok': True}
    credentials = {'a': with_token(info, 'a', priority=10), 'b': with_token(info, 'b', priority=5)}
    async with Vault(credentials) as vault:
        assert await api.request('GET', '/api', settings=settings, vault=vault) == {'ok': True}
        assert await api.request('GET', '/api', settings=settings, vault=vault) == {'ok': True}
    # The invalidated credentials are not tried again for the second request.
    assert [req.headers['Authorization'] for req in kmock] == ['Bearer a', 'Bearer b', 'Bearer b']


async def test_401_of_a_leased_credential_switches_to_next_credentials(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, info: ConnectionInfo,
) -> None:
    # The best credential's session exists after the first request: the second one leases it directly.
    kmock['get /api', kmock.headers({'Authorization': 'Bearer a'})][:1] << {'via': 'a'}
    kmock['get /api', kmock.headers({'Authorization': 'Bearer a'})] << 401
    kmock['get /api', kmock.headers({'Authorization': 'Bearer b'})] << {'via': 'b'}
    credentials = {'a': with_token(info, 'a', priority=10), 'b': with_token(info, 'b', priority=5)}
    async with Vault(credentials) as vault:
        results = [await api.request('GET', '/api', settings=settings, vault=vault) for _ in range(3)]
    assert results == [{'via': 'a'}, {'via': 'b'}, {'via': 'b'}]
    assert [req.headers['Authorization'] for req in kmock] == ['Bearer a', 'Bearer a', 'Bearer b', 'Bearer b']


async def test_401_with_failed_relogin(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                       info: ConnectionInfo) -> None:
    kmock['get /api'] << 401 << {'kind': 'Status', 'code': 401, 'message': 'Unauthorized'}

    async def relogin() -> dict[str, ConnectionInfo]:
        return {'main': with_token(info, 'old')}  # the same bad credentials again: ignored.

    async with Vault({'main': with_token(info, 'old')}, relogin=relogin) as vault:
        with pytest.raises(LoginError) as exc_info:
            await api.request('GET', '/api', settings=settings, vault=vault)
    assert isinstance(exc_info.value.__cause__, errors.APIUnauthorizedError)
    assert len(kmock) == 1


async def test_concurrent_requests_wait_for_one_relogin(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, info: ConnectionInfo, looptime: float,
) -> None:
    kmock['get /api', kmock.headers({'Authorization': 'Bearer old'})] << 401
    kmock['get /api', kmock.headers({'Authorization': 'Bearer new'})] << {'ok': True}
    relogins: list[int] = []

    async def relogin() -> dict[str, ConnectionInfo]:
        relogins.append(1)
        await asyncio.sleep(10)  # slow enough for all requests to fail with 401 and to wait.
        return {'main': with_token(info, 'new')}

    async with Vault({'main': with_token(info, 'old')}, relogin=relogin) as vault:
        results = await asyncio.gather(*[
            api.request('GET', '/api', settings=settings, vault=vault) for _ in range(5)
        ])

    assert results == [{'ok': True}] * 5
    assert len(relogins) == 1
    headers = [req.headers['Authorization'] for req in kmock]
    assert headers.count('Bearer new') == 5
    assert 1 <= headers.count('Bearer old') <= 5
    assert looptime == 10


async def test_custom_logger_gets_retry_messages(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault,
        caplog: pytest.LogCaptureFixture,
) -> None:
    kmock['get /api'][:1] << 500
    kmock['get /api'][1:] << {}
    caplog.set_level(logging.DEBUG)
    await api.request('GET', '/api', settings=settings, vault=vault, logger=logging.getLogger('my.logger'))
    assert [r.name for r in caplog.records if 'will retry' in r.getMessage()] == ['my.logger']


async def test_dynamic_url_from_context(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                        info: ConnectionInfo) -> None:
    kmock['get /api/v1/namespaces/ctx-ns/pods'] << {'items': []}
    async with Vault({'main': with_token(info, 't', default_namespace='ctx-ns')}) as vault:
        await api.request('GET', lambda ctx: f'/api/v1/namespaces/{ctx.default_namespace}/pods',
                          settings=settings, vault=vault)
    assert kmock[0].url.path == '/api/v1/namespaces/ctx-ns/pods'


async def test_session_reused_per_credentials(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                              vault: Vault) -> None:
    kmock['get /api'] << (lambda req: {'peer': req._raw_request.transport.get_extra_info('peername')[1]})
    results = [await api.request('GET', '/api', settings=settings, vault=vault) for _ in range(3)]
    # The same client port means the same keep-alive connection of the same session's pool.
    assert len({result['peer'] for result in results}) == 1


@dataclasses.dataclass
class InFlight:
    now: int = 0
    peak: int = 0


@pytest.fixture
def in_flight(kmock: kmock.RawHandler) -> InFlight:
    """``GET /api`` takes 1 s and answers with the client's port; how many are in it at once, at the most."""
    counter = InFlight()

    async def slow(req: Any) -> dict[str, Any]:
        counter.now += 1
        counter.peak = max(counter.peak, counter.now)
        await asyncio.sleep(1)
        counter.now -= 1
        return {'peer': req._raw_request.transport.get_extra_info('peername')[1]}

    kmock['get /api'] << slow
    return counter


async def test_concurrent_requests_are_limited_by_default(
        in_flight: InFlight, settings: StandaloneClientSettings, vault: Vault) -> None:
    assert settings.networking.max_concurrent_requests == 100
    await asyncio.gather(*(api.request('GET', '/api', settings=settings, vault=vault) for _ in range(150)))
    assert in_flight.peak == 100


async def test_concurrent_requests_are_limited_and_reuse_the_connections(
        in_flight: InFlight, settings: StandaloneClientSettings, vault: Vault) -> None:
    settings.networking.max_concurrent_requests = 3
    results = await asyncio.gather(*(api.request('GET', '/api', settings=settings, vault=vault)
                                     for _ in range(10)))
    assert in_flight.peak == 3  # the burst is served 3 at a time...
    assert len({result['peer'] for result in results}) == 3  # ...via 3 keep-alive connections only


async def test_requests_limits_of_different_settings_are_kept_apart(
        in_flight: InFlight, vault: Vault) -> None:
    narrow, wide = StandaloneClientSettings(), StandaloneClientSettings()
    narrow.networking.max_concurrent_requests = 2
    wide.networking.max_concurrent_requests = 5
    # The same credential, two operators' settings: each gets its own slots (a context of its own).
    await asyncio.gather(*(api.request('GET', '/api', settings=narrow, vault=vault) for _ in range(10)))
    assert in_flight.peak == 2
    await asyncio.gather(*(api.request('GET', '/api', settings=wide, vault=vault) for _ in range(10)))
    assert in_flight.peak == 5
    in_flight.peak = 0
    await asyncio.gather(*(api.request('GET', '/api', settings=settings, vault=vault)
                           for settings in [narrow, wide] for _ in range(10)))
    assert in_flight.peak == 2 + 5


@pytest.mark.parametrize('value', [0, -1, 1.5, '10', None, True])
def test_requests_limit_must_be_a_positive_integer(value: Any) -> None:
    settings = StandaloneClientSettings()
    with pytest.raises(ValueError) as err:
        settings.networking.max_concurrent_requests = value
    assert str(err.value) == (f'settings.networking.max_concurrent_requests must be a positive integer, '
                              f'got {value!r}.')
    assert settings.networking.max_concurrent_requests == 100


async def test_streams_are_not_limited_by_the_requests_limit(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, vault: Vault) -> None:
    settings.networking.max_concurrent_requests = 1
    kmock['get /stream'] << (b'hello\n', lambda: asyncio.sleep(10), b'world\n')
    kmock['get /api'] << {}
    async with (
        api.stream('GET', '/stream', settings=settings, vault=vault),
        api.stream('GET', '/stream', settings=settings, vault=vault),
    ):
        assert await api.request('GET', '/api', settings=settings, vault=vault) == {}


async def test_stream_gives_open_response(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                          vault: Vault) -> None:
    kmock['get /stream'] << (b'hello\n', b'world\n')
    async with api.stream('GET', '/stream', params={'watch': 'true'}, settings=settings, vault=vault) as resp:
        assert await resp.read() == b'hello\nworld\n'
    assert kmock[0].params == {'watch': 'true'}
    assert kmock[0].headers['Authorization'] == f'Bearer {SECRET_TOKEN}'


async def test_stream_retries_connection(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                         vault: Vault, looptime: float) -> None:
    kmock['get /stream'][:1] << 503
    kmock['get /stream'][1:] << (b'hello\n',)
    async with api.stream('GET', '/stream', settings=settings, vault=vault) as resp:
        assert await resp.read() == b'hello\n'
    assert len(kmock) == 2
    assert looptime == 1


async def test_stream_keeps_session_open_while_used(
        kmock: kmock.RawHandler, settings: StandaloneClientSettings, info: ConnectionInfo,
) -> None:
    kmock['get /stream'] << (b'hello\n', lambda: asyncio.sleep(1), b'world\n')
    async with (
        Vault({VaultKey('main'): info}) as vault,
        api.stream('GET', '/stream', settings=settings, vault=vault) as resp,
    ):
        # Another request invalidates the credentials in the middle of the stream.
        await vault.invalidate('main', info)
        assert await resp.read() == b'hello\nworld\n'
