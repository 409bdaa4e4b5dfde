"""
The core of all API calls: credentials, timeouts, retries, throttling, error classification.

Every call to the Kubernetes API goes through :func:`request` (for regular requests with a JSON
response) or :func:`stream` (for long-living responses, such as watch-streams). Both:

* take the best credentials from the vault, with one shared HTTP session per credential;
* on HTTP 401, invalidate the credentials in the vault and repeat with the next ones
  (or with the new ones after a re-login, which the vault coordinates);
* on network errors, timeouts, and HTTP 5xx, repeat after a delay from
  ``settings.networking.error_backoffs``: there is one more attempt than delays;
  when the delays are over, the error of the last attempt escalates;
* on HTTP 429, repeat the same way, but never sooner than the server asked in ``Retry-After``
  (with ``settings.networking.enforce_retry_after``, exactly as the server asked);
* on other HTTP 4xx errors, fail immediately with an :class:`~kopf._clients.errors.APIError`.

The backoff sequence starts anew for every call: a success resets it. A call can bring its own
backoffs instead of the settings' ones, and can be "best-effort" (e.g. posting k8s-events): then
every failure except "not found" is retried, the client errors and the exhausted credentials too.

A call can bring its caller's ``seat`` (a :class:`~kopf._cogs.aiokits.capacity.Hold`, e.g. the processing's
seat of the object it patches): the seat is lent to others while the request is in flight for longer than
the seat's capacity's lending delay (only if its capacity lends in flight), and at once during the retries'
backoffs; if the request must wait for a slot, the seat is ceded meanwhile to a returning holder that waits
for one (back from its own request or handler), and lent to a newcomer after the lending delay only within
the capacity's reserve (see :meth:`~kopf._cogs.aiokits.capacity.Hold.ceding`): so the lent seats are at most
as many as the slots plus the reserve; it is taken back before the call returns.
So the seated callers are those in their own CPU steps, not those waiting for a slow API server.
"""
import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from kopf._clients import auth, errors
from kopf._clients.connections import NetworkError, Response, StreamedResponse, Timeouts
from kopf._clients.vault import Vault
from kopf._cogs.aiokits.backoffs import BackoffsSpec, iter_backoffs
from kopf._cogs.aiokits.capacity import OWN_LENDING_DELAY, Ceding, Hold
from kopf._cogs.configs.networking import ClientSettings
from kopf._cogs.helpers import jsons, metering, tracing
from kopf._cogs.structs.bodies import version_of
from kopf._cogs.structs.credentials import KubeContext, LoginError, VaultKey

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

_T = TypeVar('_T')

Logger = logging.Logger | logging.LoggerAdapter[Any]

default_logger = logging.getLogger(__name__)

# A path on the server (starting with a slash), or a function to build it from the connection context
# (e.g. when it depends on the default namespace of the credentials).
URLSpec = str | Callable[[auth.APIContext], str]

# Presumably temporary problems that are worth repeating the request for.
_NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    NetworkError,
    asyncio.TimeoutError,
)

# Everything that can be retried by some calls: the network errors always, the API errors by their kind.
_RETRIABLE_ERRORS: tuple[type[BaseException], ...] = (errors.APIError, LoginError, *_NETWORK_ERRORS)

# For the calls with no seat to lend (reusable: it keeps no state).
_NOT_LENDING: contextlib.nullcontext[None] = contextlib.nullcontext()


# How a response is given back: decoded (True), as it is (False), or by a function (e.g. decode_version).
Decoding = bool | Callable[[Response], Any]


def _context_factory(settings: ClientSettings) -> tuple[Callable[[KubeContext], auth.APIContext], str]:
    # Different settings must not share the same session: distinguish the cached objects by purpose.
    # Asked for every request: a lookup by the two values (not a cache of a function: a key tuple each time).
    networking = settings.networking
    trust_env = bool(networking.trust_env)
    limit = networking.max_concurrent_requests
    known = _CONTEXT_FACTORIES[trust_env].get(limit)
    if known is None:
        factory = functools.partial(auth.APIContext, trust_env=trust_env, max_concurrent_requests=limit)
        purpose = f'kopf-api-context(trust_env={trust_env}, max_concurrent_requests={limit})'
        known = _CONTEXT_FACTORIES[trust_env][limit] = (factory, purpose)
    return known


# The contexts' factories & purposes by trust_env & max_concurrent_requests: a few per process at most.
_CONTEXT_FACTORIES: dict[bool, dict[int, tuple[Callable[[KubeContext], auth.APIContext], str]]] = {
    False: {},
    True: {},
}


def _request_timeout(settings: ClientSettings) -> Timeouts:
    return _timeouts(settings.networking.request_timeout, settings.networking.connect_timeout)


@functools.lru_cache(maxsize=64)  # for every request: the same few values (a named tuple is made slowly)
def _timeouts(total: float | None, connect: float | None) -> Timeouts:
    return Timeouts(total, connect)


async def _retrying(
        fn: Callable[[], Awaitable[_T]],
        *,
        what: str,
        settings: ClientSettings,
        logger: Logger,
        no_retry_statuses: Collection[int] = (),
        backoffs: BackoffsSpec | None = None,
        best_effort: bool = False,
        seat: Hold | None = None,
        failed: BaseException | None = None,
) -> _T:
    """
    Call the function, repeating it on temporary errors with the delays from the settings (or given).

    The caller's ``seat`` (if any) is lent to others during the delays, taken back before the next attempt.
    ``failed``: the error of the first attempt, made by the caller already (it counts as attempt #1).
    """
    delays: Iterator[float] | None = None  # made at the first error: most requests succeed at once
    for attempt in itertools.count(1):
        try:
            if failed is not None:
                error, failed = failed, None
                raise error  # judged below as if this attempt has failed so
            return await fn()
        except (errors.APINotFoundError, errors.APINamespaceTerminatingError):
            raise  # final: the namespace or the object will not appear by retrying
        except errors.APITooManyRequestsError as e:
            if delays is None:
                delays = iter_backoffs(settings.networking.error_backoffs if backoffs is None else backoffs)
            own_delay = next(delays, None)
            if own_delay is None:
                raise
            server_delay = e.retry_after
            if server_delay is None:
                delay = own_delay
            elif settings.networking.enforce_retry_after:
                delay = server_delay
            else:
                delay = max(own_delay, server_delay)
            logger.warning(f'Request attempt #{attempt} was throttled by the server: {what}. '
                           f'Retrying in {delay} seconds.')
            meters = metering.meters
            if meters is not None:
                verb, _, path = what.partition(' ')
                meters.child(meters.throttled, verb, metering.resource_of_path(path)).inc()
            await _backoff(delay, seat)
        except _RETRIABLE_ERRORS as e:
            if isinstance(e, errors.APIServerError):
                retried = e.status not in no_retry_statuses
            elif isinstance(e, (errors.APIError, LoginError)):
                retried = best_effort  # the client errors are final, unless the caller wants it so
            else:
                retried = True  # network errors and timeouts
            if delays is None:
                delays = iter_backoffs(settings.networking.error_backoffs if backoffs is None else backoffs)
            retry_delay = next(delays, None) if retried else None
            if retry_delay is None:
                raise
            details = e if isinstance(e, (errors.APIError, LoginError)) else errors.describe_network_error(e)
            # Not an error yet: only if the retries run out (then, the caller sees the exception).
            logger.warning(f'Request attempt #{attempt} failed; will retry: {what} -> {details}, '
                           f'retrying in {retry_delay:g} s')
            await _backoff(retry_delay, seat)
    raise RuntimeError('unreachable')  # for type checkers: itertools.count() is infinite.


async def _backoff(delay: float, seat: Hold | None) -> None:
    """Sleep between the attempts, with the caller's seat (if any) lent to others meanwhile."""
    if seat is None:
        await asyncio.sleep(delay)
    else:
        async with seat.lending():
            await asyncio.sleep(delay)


async def _open(
        stack: contextlib.AsyncExitStack,
        method: str,
        url: URLSpec,
        *,
        settings: ClientSettings,
        vault: Vault,
        headers: Mapping[str, str] | None,
        params: Mapping[str, str] | None,
        timeouts: Timeouts,
        logger: Logger,
) -> StreamedResponse:
    """
    Open a streaming response with the best credentials, switching the credentials on HTTP 401.

    The credentials' lease and the response are kept open in the stack until it is closed.
    Any non-401 error escalates as an exception for the caller to decide on repeating.
    """
    factory, purpose = _context_factory(settings)
    credentials = await stack.enter_async_context(contextlib.aclosing(vault.extended(factory, purpose)))
    async for key, info, context in credentials:
        path = url(context) if callable(url) else url
        meters = metering.meters
        started = time.monotonic() if meters is not None else 0.0
        response = await context.transport.stream(method, path, headers=headers, params=params,
                                                  timeouts=timeouts)
        if meters is not None:
            _measure(meters, 'WATCH' if params and params.get('watch') else method, path, response.status,
                     time.monotonic() - started)
        if response.status >= 400:
            try:
                text = (await response.read()).decode('utf-8', errors='replace')
            except NetworkError:
                text = ''  # the status is what matters; the body is only a bonus for explanations.
            finally:
                response.close()
            error = errors.error_of_response(response.status, text, method=method, url=response.url,
                                             retry_after=response.headers.get('retry-after'))
            if isinstance(error, errors.APIUnauthorizedError):
                await _reject(vault, key, info, error, logger=logger)
                continue
            raise error
        # An unfinished stream must be closed, not returned to the pool with the unread data in it.
        stack.callback(response.close)
        return response
    # The vault yields each credential once; all of them were rejected but are still there (a race).
    raise LoginError('Ran out of valid credentials: all of them were rejected by the server.')


async def _fetch(
        method: str,
        url: URLSpec,
        *,
        settings: ClientSettings,
        vault: Vault,
        data: bytes | None,
        headers: Mapping[str, str] | None,
        params: Mapping[str, str] | None,
        timeouts: Timeouts,
        logger: Logger,
        seat: Hold | None = None,
        decode: Decoding = True,
) -> Any:
    """
    Make a regular request with the best credentials (switching them on HTTP 401) and read its response.

    The request takes a place among the credentials' limited concurrent requests (see ``APIContext``)
    for the time of sending and reading; any non-401 error escalates for the caller to decide on repeating.
    """
    factory, purpose = _context_factory(settings)

    # The usual case (unexpiring credentials, already in use before): no iteration over the vault.
    lease = vault.lease_best(factory, purpose)
    if lease is not None:
        try:
            return await _fetch_with(lease.obj, method, url, data=data, headers=headers, params=params,
                                     timeouts=timeouts, seat=seat, decode=decode)
        except errors.APIUnauthorizedError as e:
            await _reject(vault, lease.key, lease.info, e, logger=logger)
        finally:
            if not lease.release_nowait():
                await lease.release()

    async with contextlib.aclosing(vault.extended(factory, purpose)) as credentials:
        async for key, info, context in credentials:
            try:
                return await _fetch_with(context, method, url, data=data, headers=headers, params=params,
                                         timeouts=timeouts, seat=seat, decode=decode)
            except errors.APIUnauthorizedError as e:
                await _reject(vault, key, info, e, logger=logger)
    # The vault yields each credential once; all of them were rejected but are still there (a race).
    raise LoginError('Ran out of valid credentials: all of them were rejected by the server.')


async def _reject(vault: Vault, key: VaultKey, info: KubeContext, exc: errors.APIUnauthorizedError,
                  *, logger: Logger) -> None:
    """Invalidate the credentials that the server has rejected (HTTP 401), so that others are used."""
    logger.debug(f'The credentials {key!r} are rejected by the server; invalidating them.')
    if metering.meters is not None:
        metering.meters.relogins.inc()
    await vault.invalidate(key, info, exc=exc)


async def _fetch_with(
        context: auth.APIContext,
        method: str,
        url: URLSpec,
        *,
        data: bytes | None,
        headers: Mapping[str, str] | None,
        params: Mapping[str, str] | None,
        timeouts: Timeouts,
        seat: Hold | None = None,
        decode: Decoding = True,
) -> Any:
    """
    Send a request with one credential's context and read the response, in one of its request slots.

    The ``seat`` is lent after the lending delay in flight, or while waiting for the slot (then only within
    its capacity's reserve, and at once to a returning holder: see the module's description); it is taken
    back (waiting for it, if lent out) only after the slot is given back: a slot is never held by a caller
    waiting for a seat.
    """
    slots = context.slots
    lender = seat if seat is not None and seat.capacity.lending_in_flight else None
    # Waiting for a slot, the seat goes to a returning holder that waits for one (if any), or to anyone after
    # the lending delay within the pacer's reserve; taken back after the request (its slot given back first).
    # Not `async with`: no context to enter and exit for the usual requests, which get a slot at once.
    ceding: Ceding | None = None
    try:
        if not slots.take_nowait():
            if lender is not None:
                ceding = lender.ceding()
                await ceding.__aenter__()  # never suspends
            await slots.take()
            if ceding is not None:
                ceding.stop()  # in flight, it is lent as usual (if not lent already)
        meters = metering.meters
        started = time.monotonic() if meters is not None else 0.0
        lending = lender.lending(OWN_LENDING_DELAY) if lender is not None else _NOT_LENDING
        async with lending:  # never suspends
            try:
                path = url(context) if callable(url) else url
                if tracing.tracer is None:
                    response = await context.transport.request(method, path, data=data, headers=headers,
                                                               params=params, timeouts=timeouts)
                else:
                    response = await _traced_request(tracing.tracer, context, method, path, data=data,
                                                     headers=headers, params=params, timeouts=timeouts)
            finally:
                slots.give()
            if meters is not None:  # the request's own time, not the wait for the seat
                _measure(meters, method, path, response.status, time.monotonic() - started)
    finally:
        if ceding is not None:
            await ceding.__aexit__(None, None, None)  # the seat taken back, waiting for it if lent out
    if response.status >= 400:
        text = response.body.decode('utf-8', errors='replace')
        raise errors.error_of_response(response.status, text, method=method, url=response.url,
                                       retry_after=response.headers.get('retry-after'))
    if decode is True:
        return decode_response(response)
    return decode(response) if decode else response


def decode_response(response: Response) -> Any:
    """The JSON-decoded body of a successful response (None if empty); see :func:`request`'s ``decode``."""
    try:
        return jsons.loads(response.body) if response.body else None  # None if empty
    except ValueError:  # incl. UnicodeDecodeError
        raise errors.APINonJSONResponseError(response.body, status=response.status, method=response.method,
                                             url=response.url) from None


# The key as compact JSON has it. A key's opening quote is a real one: the quotes in the strings are escaped.
_VERSION_KEY = b'"resourceVersion":"'


def decode_version(response: Response) -> str | None:
    """
    The object's version as :func:`~kopf._cogs.structs.bodies.version_of` gives it from the decoded response.

    The rest of the JSON is not parsed if the version is unambiguous in its text: an object from the API
    always has its version in its metadata, so the key's only occurrence is that one (for the API's objects
    only: in a body with none in its metadata, another object's nested in it would be taken). Otherwise (e.g.
    another object nested in it with a version of its own, JSON with spaces, or escapes in the value), the
    response is decoded in full, as :func:`decode_response` does it (and with its errors).
    """
    body = response.body
    start = body.find(_VERSION_KEY)
    if start >= 0 and body.find(_VERSION_KEY, start + 1) < 0:
        start += len(_VERSION_KEY)
        end = body.find(b'"', start)
        if end >= 0 and b'\\' not in (value := body[start:end]):
            try:
                return value.decode('utf-8') or None  # an empty one is none, as version_of() says
            except UnicodeDecodeError:
                pass
    return version_of(decode_response(response))


async def _traced_request(
        tracer: 'Tracer', context: auth.APIContext, method: str, path: str, *,
        data: bytes | None, headers: Mapping[str, str] | None, params: Mapping[str, str] | None,
        timeouts: Timeouts,
) -> Any:
    """The request in a client span of its own: the method, the resource (not the object), the status."""
    from opentelemetry.trace import SpanKind, Status, StatusCode
    attributes = {'http.request.method': method, 'k8s.resource': metering.resource_of_path(path)}
    with tracer.start_as_current_span(f'HTTP {method}', kind=SpanKind.CLIENT, attributes=attributes) as span:
        response = await context.transport.request(method, path, data=data, headers=headers, params=params,
                                                   timeouts=timeouts)
        span.set_attribute('http.response.status_code', response.status)
        if response.status >= 400:
            span.set_status(Status(StatusCode.ERROR))
        return response


def _measure(meters: metering.Meters, method: str, path: str, status: int, duration: float) -> None:
    resource = metering.resource_of_path(path)
    meters.child(meters.requests, method, resource, str(status)).inc()
    meters.child(meters.request_duration, method, resource).observe(duration)


_ACCEPT_JSON: Mapping[str, str] = {'Accept': 'application/json'}


def _encode(payload: object, content_type: str | None) -> tuple[bytes | None, Mapping[str, str]]:
    if payload is None:
        return None, _ACCEPT_JSON
    return jsons.dumps(payload), _sending_json(content_type or 'application/json')


@functools.lru_cache(maxsize=16)  # a few content types: merge-patches, JSON-patches, JSON
def _sending_json(content_type: str) -> Mapping[str, str]:
    """The headers of the requests with a payload (never modified: shared by the requests)."""
    return {'Accept': 'application/json', 'Content-Type': content_type}


async def request(
        method: str,
        url: URLSpec,
        *,
        settings: ClientSettings,
        vault: Vault,
        payload: object = None,
        content_type: str | None = None,
        params: Mapping[str, str] | None = None,
        logger: Logger | None = None,
        no_retry_statuses: Collection[int] = (),
        backoffs: BackoffsSpec | None = None,
        best_effort: bool = False,
        seat: Hold | None = None,
        decode: Decoding = True,
) -> Any:
    """
    Make a regular request and return its JSON-decoded response (None if the response is empty).

    ``url`` is a path on the server (the server comes from the credentials), or a function of
    the connection context that builds the path. ``payload`` is sent as JSON with the given
    content type (``application/json`` by default). ``no_retry_statuses`` are 5xx statuses
    that escalate immediately instead of being retried (e.g. 503 of optional API groups).
    ``backoffs`` replace the settings' ``error_backoffs`` for this call; ``best_effort`` retries every
    failure except "not found" (see the module's docs). The caller's ``seat`` is lent while the call waits
    for the server (see the module's docs). With ``decode=False``, the response itself is returned, its body
    to be decoded later by :func:`decode_response` (then, a body that is not JSON is the caller's to retry);
    with a function, what it makes of the response (e.g. :func:`decode_version`), retried as the decoding is.
    Errors escalate as :class:`~kopf._clients.errors.APIError` or the network exceptions.
    """
    actual_logger: Logger = logger if logger is not None else default_logger
    data, headers = _encode(payload, content_type)
    timeouts = _request_timeout(settings)

    # The first attempt goes directly: most requests succeed at once. Only if it fails, the retrying judges
    # its error (as the first attempt's) and makes the next attempts, as it makes all of them for the streams.
    try:
        return await _fetch(method, url, settings=settings, vault=vault, data=data, headers=headers,
                            params=params, timeouts=timeouts, logger=actual_logger, seat=seat, decode=decode)
    except _RETRIABLE_ERRORS as e:
        failed: BaseException = e
    what = f'{method} {url if isinstance(url, str) else "(dynamic URL)"}'
    attempt = functools.partial(_fetch, method, url, settings=settings, vault=vault, data=data,
                                headers=headers, params=params, timeouts=timeouts, logger=actual_logger,
                                seat=seat, decode=decode)
    return await _retrying(attempt, what=what, settings=settings, logger=actual_logger,
                           no_retry_statuses=no_retry_statuses, backoffs=backoffs, best_effort=best_effort,
                           seat=seat, failed=failed)


@contextlib.asynccontextmanager
async def stream(
        method: str,
        url: URLSpec,
        *,
        settings: ClientSettings,
        vault: Vault,
        params: Mapping[str, str] | None = None,
        timeouts: Timeouts | None = None,
        logger: Logger | None = None,
) -> AsyncIterator[StreamedResponse]:
    """
    Open a long-living response (e.g. a watch-stream) and keep it open while in the context.

    Establishing the connection is retried as for regular requests (see the module's description);
    once the response is given to the caller, what happens to the stream is the caller's business
    (its ``readany()`` raises the network errors as :class:`~kopf._clients.connections.NetworkError`).
    The credentials remain in use (their transport is not closed) until the context is exited.
    """
    actual_logger: Logger = logger if logger is not None else default_logger
    _, headers = _encode(None, None)
    actual_timeouts = timeouts if timeouts is not None else _request_timeout(settings)
    what = f'{method} {url if isinstance(url, str) else "(dynamic URL)"}'

    async def attempt() -> tuple[contextlib.AsyncExitStack, StreamedResponse]:
        stack = contextlib.AsyncExitStack()
        try:
            response = await _open(stack, method, url, settings=settings, vault=vault,
                                   headers=headers, params=params, timeouts=actual_timeouts,
                                   logger=actual_logger)
        except BaseException:
            await stack.aclose()
            raise
        return stack, response

    stack, response = await _retrying(attempt, what=what, settings=settings, logger=actual_logger)
    async with stack:
        yield response
