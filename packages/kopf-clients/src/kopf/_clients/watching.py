"""
Watching the objects of a resource: an endless stream of their states, surviving all disconnects.

:func:`infinite_watch` yields, in order:

* For every (re)listing: each existing object as ``{'type': None, 'object': {...}}``,
  followed by :data:`Bookmark.LISTED`. The listing is atomic: it is never interrupted by other
  events, and it is never partial. Objects known to the consumer but absent in the listing
  are gone (deleted while the stream was not watching): the consumer should forget them when
  it sees ``LISTED``. The first listing happens at start; later ones happen when the server
  says that the history is too old to resume from (HTTP 410 Gone, as a status or as an ERROR event).
  In the ``paged`` mode, the objects of each page are handed over as soon as it comes, so the listing's
  objects are never all in memory at once (with ``settings.watching.chunk_size``); if the
  listing restarts midway (its continuation token has expired), ``on_interruption`` is called first:
  the objects handed over since the last ``LISTED`` are void, and the listing starts over.
* Watch-events as the server sends them: ``{'type': 'ADDED'|'MODIFIED'|'DELETED', 'object': {...}}``.

The service lines of the stream are consumed internally: BOOKMARKs advance the resource version
from which the stream resumes after a reconnect; ERRORs lead to a relisting (410), a reconnect (5xx),
or an :class:`~kopf._clients.errors.APIError` (other codes, e.g. 403 when the permissions are revoked).

The stream reconnects (after ``settings.watching.reconnect_backoff``) from the last known resource
version when the server closes it (e.g. by ``settings.watching.server_timeout``), when the client-side
``client_timeout`` is reached, when the connection breaks, or when the stream is silent for longer than
``inactivity_timeout`` (the server sends bookmarks every minute, so silence means a dead connection).
Lines cut midway by a broken connection are dropped; unparseable lines are skipped with a warning.

With ``settings.watching.initial_streaming``, the listing is done by the watch request itself
(``sendInitialEvents=true``) instead of a separate list request; the consumer sees no difference.
If the server does not support it, the watcher falls back to the list-then-watch mode.

Every end of a watch request (then, the stream is re-established) is told to the consumer by the
``on_interruption`` callback, if given: the events that happen meanwhile come later than usual
(after the reconnect: replayed from the last known version, or with a relisting), but they come.

With a ``shard_selector`` (the sharding: the ranges of the uids' hashes, KEP-5866), the lists and the
watches ask the server only for those objects. The servers with the feature gate ``ShardedListAndWatch``
filter them (and the lists of the built-in resources say so: ``on_shard_info`` gets the applied selector;
it gets None if the listing says nothing, or if the listing is streamed); the others ignore it silently,
and the consumer filters the objects itself. A server that rejects the selector as invalid (HTTP 500,
"invalid shard selector") is asked without it from then on, with a warning.
"""
import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from kopf._clients import api, errors, fetching
from kopf._clients.connections import NetworkError, StreamedResponse, Timeouts
from kopf._clients.vault import Vault
from kopf._cogs.aiokits import alarms
from kopf._cogs.configs.networking import ClientSettings
from kopf._cogs.helpers import jsons, metering
from kopf._cogs.structs.bodies import RawBody, RawEvent, RawInput
from kopf._cogs.structs.references import Resource

default_logger = logging.getLogger(__name__)

# The annotation on the bookmark that ends the initial events of a streaming list.
INITIAL_EVENTS_END = 'k8s.io/initial-events-end'


class Bookmark(enum.Enum):
    """Markers in the stream of watch-events, in addition to the events themselves."""

    LISTED = 'LISTED'
    """All objects of a (re)listing have been yielded; those not among them do not exist anymore."""


class _Relist(Exception):
    """An internal signal: the resource version is too old (410 Gone), a fresh listing is needed."""


def _get_resource_version(obj: Mapping[str, Any]) -> str | None:
    metadata = obj.get('metadata')
    value = None
    if type(metadata) is dict or isinstance(metadata, Mapping):
        value = metadata.get('resourceVersion')
    return str(value) if value else None


def get_watch_timeout(settings: ClientSettings) -> Timeouts:
    """The client-side timeouts of a watch request: the total lifetime and the connection handshake."""
    connect_timeout = settings.watching.connect_timeout
    if connect_timeout is None:
        connect_timeout = settings.networking.connect_timeout
    if connect_timeout is None:
        connect_timeout = settings.networking.request_timeout
    return Timeouts(total=settings.watching.client_timeout, connect=connect_timeout)


def build_watch_params(
        settings: ClientSettings,
        resource: Resource,
        *,
        since: str | None,
        streaming: bool = False,
        shard_selector: str | None = None,
) -> dict[str, str]:
    """The query params of one watch request."""
    params = {'watch': 'true', 'allowWatchBookmarks': 'true'}
    params.update(fetching.build_selector_params(settings, resource))
    if shard_selector:
        params['shardSelector'] = shard_selector
    if since is not None:
        params['resourceVersion'] = since
    if settings.watching.server_timeout is not None:
        params['timeoutSeconds'] = str(int(settings.watching.server_timeout))
    if streaming:
        params['sendInitialEvents'] = 'true'
        params['resourceVersionMatch'] = 'NotOlderThan'
    return params


class _InactivityTimeout:
    """
    The inactivity timeout of a watch-stream's reads: as ``asyncio.timeout()`` around every read, but lazy.

    A watch-stream is read chunk by chunk, and in a burst of events, often a chunk per event:
    ``asyncio.timeout()`` around every read would arm a timer of the loop and cancel it for each of them.
    Here, a read only notes when it has started; one timer looks at the current read when the earliest
    possible expiry comes, and re-arms itself for that read's deadline (or goes away between the reads).
    The expired read is cancelled, and the cancellation turns into ``TimeoutError``, as with the original.
    """

    __slots__ = ('_cancelling', '_expired', '_reading', '_started', '_task', '_timeout', '_timer')

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self._timeout = timeout
        self._started = 0.0  # when the current or latest read has started (in the loop's time)
        self._reading = False
        self._expired = False
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0

    def expired(self) -> bool:
        """Whether the latest read was interrupted by this timeout (not by another one or a cancellation)."""
        return self._expired

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError('The inactivity timeout must be used in a task.')
        loop = asyncio.get_running_loop()
        self._task = task
        self._cancelling = task.cancelling()
        self._started = loop.time()
        self._reading = True
        self._expired = False
        if self._timer is None:
            self._timer = loop.call_at(self._started + self._timeout, self._check)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: object) -> None:
        self._reading = False
        task, self._task = self._task, None
        # Our own cancellation is taken back in any case; it becomes a timeout only if nobody else cancels.
        if self._expired and task is not None and task.uncancel() <= self._cancelling \
                and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    def _check(self) -> None:
        self._timer = None
        if not self._reading or self._task is None:
            return  # between the reads: the next read arms the timer again
        loop = asyncio.get_running_loop()
        deadline = self._started + self._timeout
        if loop.time() + alarms.CLOCK_SLACK >= deadline:
            self._expired = True
            self._task.cancel()
        else:
            self._timer = loop.call_at(deadline, self._check)


async def _read_lines(
        response: StreamedResponse,
        *,
        inactivity_timeout: float | None,
        what: str,
        logger: api.Logger,
) -> AsyncGenerator[list[bytearray], None]:
    """
    Split a streamed response into lines until the stream ends, breaks, or goes silent.

    The end, the break, and the silence are not errors: the caller reconnects in all cases.
    The lines come in batches, as they arrive (many of them in a burst), unparsed: not every line of
    a batch is parsed at once (the consumer can hold back), and not every line goes through all the
    generators of the watching one by one (each level is a few calls per line).
    """
    buffer = bytearray()
    silence = _InactivityTimeout(inactivity_timeout) if inactivity_timeout is not None else None
    try:
        while True:
            try:
                if silence is None:
                    chunk = await response.readany()
                else:
                    async with silence:
                        chunk = await response.readany()
            except TimeoutError:
                if silence is not None and silence.expired():
                    logger.debug(f'The watch-stream has been silent for {inactivity_timeout}s; '
                                 f'reconnecting: {what}')
                else:
                    logger.debug(f'The watch-stream has reached its client-side timeout: {what}')
                chunk = b''
            except NetworkError as e:
                logger.debug(f'The watch-stream has been disconnected: {what} -> {e!r}')
                chunk = b''

            if not chunk:  # EOF or the end of our patience.
                if buffer.strip():
                    logger.warning(f'The watch-stream has ended in the middle of a line; dropping it: {what}')
                return

            buffer.extend(chunk)
            *lines, rest = buffer.split(b'\n')
            buffer = bytearray(rest)
            if lines:
                yield lines
    finally:
        if silence is not None:
            silence.close()  # not to keep this generator's objects until the timer fires for nothing


def _parse_line(line: bytearray, logger: api.Logger) -> RawInput | None:
    """A line of the watch-stream as a raw input; None if it is blank, or not JSON, or not a watch-event."""
    if not line.strip():
        return None
    try:
        data = jsons.loads(line)
    except ValueError:  # incl. UnicodeDecodeError
        logger.warning(f'Skipping an unparseable line in the watch-stream: {bytes(line[:200])!r}')
        return None
    if not isinstance(data, dict) or not isinstance(data.get('type'), str) \
            or not isinstance(data.get('object'), dict):
        logger.warning(f'Skipping an unrecognised line in the watch-stream: {bytes(line[:200])!r}')
        return None
    return data  # type: ignore[return-value]  # not cast(): it is a call, and this is done for every line


async def _watch_once(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        since: str | None,
        streaming: bool,
        logger: api.Logger,
        shard_selector: str | None = None,
) -> AsyncGenerator[list[bytearray], None]:
    """One watch request: yield its lines (in batches) until the stream ends in any way; 410 is _Relist."""
    url = resource.get_url(namespace=namespace)
    params = build_watch_params(settings, resource, since=since, streaming=streaming,
                                shard_selector=shard_selector)
    what = f'{resource} in {namespace!r}' if namespace is not None else f'{resource} cluster-wide'
    inactivity_timeout = settings.watching.inactivity_timeout
    try:
        async with contextlib.AsyncExitStack() as stack:
            # A request that gets no response at all is as dead as a silent stream: reconnect.
            try:
                async with asyncio.timeout(inactivity_timeout):
                    response = await stack.enter_async_context(api.stream(
                        'GET', url, params=params, timeouts=get_watch_timeout(settings),
                        settings=settings, vault=vault, logger=logger))
            except TimeoutError:
                logger.debug(f'The watch-request for {what} got no response in {inactivity_timeout}s; '
                             f'reconnecting.')
                return
            async for lines in _read_lines(response, inactivity_timeout=inactivity_timeout,
                                           what=what, logger=logger):
                yield lines
    except errors.APIGoneError as e:
        raise _Relist() from e


async def infinite_watch(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        logger: api.Logger | None = None,
        on_interruption: Callable[[], None] | None = None,
        shard_selector: str | None = None,
        on_shard_info: Callable[[str | None], None] | None = None,
        paged: bool = False,
) -> AsyncGenerator[RawEvent | Bookmark, None]:
    """
    List & watch the objects of a resource forever; see the module's description for the contract.

    ``namespace=None`` means cluster-wide (or a cluster-scoped resource).
    The stream ends only with an exception (e.g. when the resource is gone or permissions are
    revoked) or when the consumer stops iterating. ``on_interruption`` is called whenever a watch
    request has ended in any way (closed, broken, silent, 410 Gone), before the stream is re-established.
    ``shard_selector`` & ``on_shard_info``: the server-side sharding (see the module's description).
    ``paged``: the listing's pages (``settings.watching.chunk_size``) are handed over as they come, not when
    all have come (see the module's description); ``on_interruption`` then also says that the objects
    handed over since the last :data:`Bookmark.LISTED` are void: the listing has restarted.
    """
    actual_logger: api.Logger = logger if logger is not None else default_logger
    streaming = bool(settings.watching.initial_streaming)
    resource_version: str | None = None
    first_request = True
    partial = False  # some pages of a listing have been handed over (the paged mode), but not all

    restart_reason = ''
    while True:
        if not first_request:
            meters = metering.meters
            if meters is not None:
                meters.child(meters.watch_restarts, _name_of(resource), restart_reason or 'reconnect').inc()
            await asyncio.sleep(settings.watching.reconnect_backoff)
        first_request = False
        restart_reason = ''

        # The classic list-then-watch mode: the listing is a separate request (or several, by pages).
        if resource_version is None and not streaming:
            objs: list[RawBody] = []
            listed_version: str | None = None
            try:
                if not paged:
                    objs, listed_version = await fetching.list_objs(
                        settings=settings, vault=vault, resource=resource, namespace=namespace,
                        logger=actual_logger, shard_selector=shard_selector, on_shard_info=on_shard_info)
                else:
                    pages = fetching.list_pages(settings=settings, vault=vault, resource=resource,
                                                namespace=namespace, logger=actual_logger,
                                                shard_selector=shard_selector, on_shard_info=on_shard_info)
                    async with contextlib.aclosing(pages):
                        async for page in pages:
                            listed_version = page.resource_version
                            if page.first and partial and on_interruption is not None:
                                on_interruption()  # the pages handed over so far are void: it starts over
                            partial = True
                            objs = page.items
                            objs.reverse()
                            while objs:  # one by one, none kept (see below)
                                yield {'type': None, 'object': objs.pop()}
            except errors.APIServerError as e:
                if not shard_selector or not _is_invalid_shard_selector(e):
                    raise
                _warn_about_shard_selector(e, actual_logger)
                shard_selector = None
                continue
            # Hand the objects over one by one and keep none: this generator lives as long as the watching,
            # and the listing must not stay in memory after the consumer is done with the objects.
            objs.reverse()
            while objs:
                yield {'type': None, 'object': objs.pop()}
            del objs
            resource_version, partial = listed_version, False
            yield Bookmark.LISTED

        # In the streaming mode, the initial objects are held until the listing is complete.
        listing: list[RawBody] | None = [] if resource_version is None else None
        watch_lines = _watch_once(settings=settings, vault=vault, resource=resource,
                                  namespace=namespace, since=resource_version,
                                  streaming=listing is not None, logger=actual_logger,
                                  shard_selector=shard_selector)
        try:
            # Close the stream promptly on any exit (relisting, errors, the consumer stopping).
            async with contextlib.aclosing(watch_lines):
                async for lines in watch_lines:
                    reconnecting = False
                    for raw_line in lines:
                        line = _parse_line(raw_line, actual_logger)
                        if line is None:
                            continue
                        event_type = line['type']
                        payload = line['object']
                        new_version = _get_resource_version(payload)

                        if event_type == 'ERROR':
                            code = payload.get('code')
                            if code == 410:
                                raise _Relist()
                            if isinstance(code, int) and 400 <= code < 500:
                                raise errors.make_error(code, payload)
                            actual_logger.warning(f'The watch-stream has reported an error: {payload}')
                            restart_reason = 'error'
                            reconnecting = True
                            break

                        elif event_type == 'BOOKMARK':
                            annotations = payload.get('metadata', {}).get('annotations') or {}
                            if listing is not None and annotations.get(INITIAL_EVENTS_END) == 'true':
                                listed_objs, listing = listing, None
                                actual_logger.debug(f'The listing of {resource} is streamed: '
                                                    f'{len(listed_objs)} objects.')
                                listed_objs.reverse()
                                if shard_selector and on_shard_info is not None:
                                    on_shard_info(None)  # the streamed listings say nothing about it
                                while listed_objs:  # handed over one by one, none kept (see above)
                                    yield {'type': None, 'object': listed_objs.pop()}
                                yield Bookmark.LISTED
                            resource_version = new_version or resource_version

                        elif event_type in ('ADDED', 'MODIFIED', 'DELETED'):
                            if listing is not None:
                                listing.append(payload)  # type: ignore[arg-type]  # not cast(): a call, for every object
                            else:
                                yield {'type': event_type, 'object': payload}  # type: ignore[misc]
                                resource_version = new_version or resource_version

                        else:
                            actual_logger.warning(f'Skipping an unknown type of watch-event: {event_type!r}')
                    if reconnecting:
                        break

        except _Relist:
            actual_logger.debug(f'The resource version of {resource} is too old; relisting.')
            resource_version = None
            restart_reason = 'gone'

        except errors.APIServerError as e:
            if not shard_selector or not _is_invalid_shard_selector(e):
                raise
            _warn_about_shard_selector(e, actual_logger)
            shard_selector = None

        except errors.APIClientError as e:
            # Old servers or disabled feature gates reject the streaming lists: list-then-watch instead.
            if listing is None or e.status not in (400, 422):
                raise
            actual_logger.warning(f'The streaming lists are not supported by the server; '
                                  f'falling back to list-then-watch: {e}')
            streaming = False

        # A streaming listing interrupted midway is discarded: a partial listing means nothing.
        if listing is not None:
            resource_version = None

        if on_interruption is not None:
            on_interruption()


def _is_invalid_shard_selector(error: errors.APIError) -> bool:
    message = (error.payload or {}).get('message')
    return error.status == 500 and isinstance(message, str) and message.startswith('invalid shard selector')


def _warn_about_shard_selector(error: errors.APIError, logger: api.Logger) -> None:
    message = (error.payload or {}).get('message')
    logger.warning(f'The server rejects the shard selector ({message}); watching without it: the objects '
                   f'of the other replicas are filtered here. Report it to Kopf with the server\'s version.')


def _name_of(resource: Resource) -> str:
    """The resource as the metrics name it: ``plural.group`` (``plural`` for the core API)."""
    return f'{resource.plural}.{resource.group}' if resource.group else resource.plural
