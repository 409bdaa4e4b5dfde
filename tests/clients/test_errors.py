import datetime
import email.utils
import json
import traceback

import kmock
import pytest

from kopf._clients import api, errors
from kopf._clients.connections import ConnectionPool
from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import StandaloneClientSettings

from .conftest import SECRET_TOKEN

pytestmark = pytest.mark.looptime


async def _request(server: str, path: str, params: dict[str, str] | None = None) -> object:
    """One request, no credentials, no retries: the error as the response makes it."""
    pool = ConnectionPool(server, ssl_context=None, headers={})
    try:
        response = await pool.request('GET', path, params=params)
    finally:
        await pool.close()
    if response.status >= 400:
        raise errors.error_of_response(response.status, response.body.decode(errors='replace'),
                                       method='GET', url=response.url,
                                       retry_after=response.headers.get('retry-after'))
    return json.loads(response.body)


@pytest.mark.parametrize('status, cls', [
    (400, errors.APIClientError),
    (401, errors.APIUnauthorizedError),
    (403, errors.APIForbiddenError),
    (404, errors.APINotFoundError),
    (405, errors.APIClientError),
    (409, errors.APIConflictError),
    (410, errors.APIGoneError),
    (422, errors.APIUnprocessableEntityError),
    (429, errors.APITooManyRequestsError),
    (500, errors.APIServerError),
    (503, errors.APIServerError),
    (599, errors.APIServerError),
])
async def test_classes_by_status(kmock: kmock.RawHandler, server: str, status: int, cls: type) -> None:
    payload = {'kind': 'Status', 'code': status, 'message': 'msg', 'reason': 'Why',
               'details': {'name': 'x'}}
    kmock['get /x'] << status << payload
    with pytest.raises(errors.APIError) as exc_info:
        await _request(server, '/x', {'q': '1'})
    assert type(exc_info.value) is cls
    assert exc_info.value.status == status
    assert exc_info.value.code == status
    assert exc_info.value.payload == payload
    assert exc_info.value.message == 'msg'
    assert exc_info.value.reason == 'Why'
    assert exc_info.value.details == {'name': 'x'}
    assert str(exc_info.value) == f'HTTP {status} Why for GET {server}/x: msg'


def test_hierarchy() -> None:
    assert issubclass(errors.APIClientError, errors.APIError)
    assert issubclass(errors.APIServerError, errors.APIError)
    for cls in [errors.APIUnauthorizedError, errors.APIForbiddenError, errors.APINotFoundError,
                errors.APIConflictError, errors.APIGoneError, errors.APIUnprocessableEntityError,
                errors.APITooManyRequestsError]:
        assert issubclass(cls, errors.APIClientError)


async def test_success_is_not_an_error(kmock: kmock.RawHandler, server: str) -> None:
    kmock['get /x'] << {'a': 1}
    assert await _request(server, '/x') == {'a': 1}


async def test_non_json_error_body(kmock: kmock.RawHandler, server: str) -> None:
    kmock['get /x'] << 502 << b'<html>Bad Gateway</html>'
    with pytest.raises(errors.APIServerError) as exc_info:
        await _request(server, '/x')
    assert exc_info.value.payload is None
    assert exc_info.value.message is None
    assert str(exc_info.value) == f'HTTP 502 for GET {server}/x: <html>Bad Gateway</html>'


def test_make_error_from_watch_status() -> None:
    error = errors.make_error(403, {'kind': 'Status', 'code': 403, 'message': 'forbidden'})
    assert isinstance(error, errors.APIForbiddenError)
    assert str(error) == 'HTTP 403: forbidden'


@pytest.mark.parametrize('causes', [
    [{'reason': 'NamespaceTerminating', 'message': 'namespace ns1 is being terminated'}],
    [{'reason': 'Other'}, {'reason': 'NamespaceTerminating'}],
])
def test_namespace_terminating_is_a_forbidden_error_of_its_own(causes: list[object]) -> None:
    payload = {'kind': 'Status', 'code': 403, 'message': 'no', 'details': {'causes': causes}}
    error = errors.make_error(403, payload)
    assert type(error) is errors.APINamespaceTerminatingError
    assert isinstance(error, errors.APIForbiddenError)


@pytest.mark.parametrize('payload', [
    None,
    {'kind': 'Status', 'code': 403},
    {'kind': 'Status', 'code': 403, 'details': 'garbage'},
    {'kind': 'Status', 'code': 403, 'details': {'causes': 'garbage'}},
    {'kind': 'Status', 'code': 403, 'details': {'causes': ['garbage', {'reason': 'Other'}]}},
])
def test_other_forbidden_errors_are_plain(payload: dict[str, object] | None) -> None:
    assert type(errors.make_error(403, payload)) is errors.APIForbiddenError


@pytest.mark.parametrize('value, expected', [
    (None, None),
    ('', None),
    ('5', 5.0),
    (' 2.5 ', 2.5),
    ('-3', 0.0),
    ('garbage', None),
])
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert errors.parse_retry_after(value) == expected


def test_parse_retry_after_as_date() -> None:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=100)
    delay = errors.parse_retry_after(email.utils.format_datetime(moment, usegmt=True))
    assert delay is not None and 98 <= delay <= 100

    moment = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=100)
    assert errors.parse_retry_after(email.utils.format_datetime(moment, usegmt=True)) == 0


async def test_secrets_not_in_error_texts(kmock: kmock.RawHandler, settings: StandaloneClientSettings,
                                          vault: Vault, caplog: pytest.LogCaptureFixture) -> None:
    settings.networking.error_backoffs = [1]
    kmock['get /api'] << 500 << {'kind': 'Status', 'code': 500, 'message': 'oops'}
    with pytest.raises(errors.APIServerError) as exc_info:
        await api.request('GET', '/api', settings=settings, vault=vault)

    # The token is really used in the requests, but is not seen anywhere in the failure.
    assert kmock[0].headers['Authorization'] == f'Bearer {SECRET_TOKEN}'
    formatted = ''.join(traceback.format_exception(exc_info.value))
    assert SECRET_TOKEN not in formatted
    assert SECRET_TOKEN not in repr(exc_info.value)
    assert SECRET_TOKEN not in caplog.text
    assert 'oops' in formatted
