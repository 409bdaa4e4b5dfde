"""
The HTTP layer: URL routing, query parameters, content negotiation, discovery and watch streams.

One low-level aiohttp handler serves everything: the URL space of the Kubernetes API is parsed
by hand (cheaper than a router, and resources appear and disappear with CRDs anyway).
"""

import asyncio
import base64
import binascii
import dataclasses
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from kopf.testing.emulator import errors, schemas, selectors, sharding, tables
from kopf.testing.emulator.faults import FaultInjector, RequestCounter, RequestKey
from kopf.testing.emulator.operations import Operations, Outcome, decode_json_body, decode_yaml_body
from kopf.testing.emulator.resources import ResourceInfo, ResourceRegistry
from kopf.testing.emulator.store import (
    ObjectStore,
    StoredObject,
    Watcher,
    encode,
    event_line,
    with_api_version,
)

logger = logging.getLogger(__name__)

KUBERNETES_VERSION = {
    'major': '1',
    'minor': '32',
    'gitVersion': 'v1.32.0-kopf-emulator',
    'gitCommit': '0000000000000000000000000000000000000000',
    'gitTreeState': 'clean',
    'buildDate': '2025-01-01T00:00:00Z',
    'goVersion': 'go1.23.0',
    'compiler': 'gc',
    'platform': 'linux/amd64',
}
_NAMESPACE_SUBRESOURCES = frozenset({'status', 'finalize'})
_OBJECT_CONTENT_TYPES = ('application/json', 'application/yaml')  # protobuf is not supported
_JSON = 'application/json'
_PROTOBUF = 'application/vnd.kubernetes.protobuf'
_PROTOBUF_PREFIX = b'k8s\x00'
_OPTIONS_KINDS = {  # the kinds of the options of write requests, in their validation errors
    'create': 'CreateOptions',
    'update': 'UpdateOptions',
    'patch': 'PatchOptions',
    'delete': 'DeleteOptions',
    'deletecollection': 'DeleteOptions',
}
MAX_BODY_SIZE = 3 * 1024 * 1024  # as in real API servers


@dataclasses.dataclass(frozen=True)
class Route:
    """
    A parsed resource URL.

    ``/api(s)/{group}/{version}[/watch][/namespaces/{ns}]/{plural}[/{name}[/{sub}]]``
    """

    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    watch: bool = False  # the deprecated /watch/ URL prefix


def parse_route(path: str) -> Route | None:
    """Parse a resource URL; ``None`` for anything else (discovery, health checks, unknown URLs)."""
    parts = path.strip('/').split('/')
    if parts[0] == 'api' and len(parts) >= 3:
        group, version, rest = '', parts[1], parts[2:]
    elif parts[0] == 'apis' and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    watch = rest[0] == 'watch'
    if watch:
        rest = rest[1:]
    namespace: str | None = None
    if (
        len(rest) >= 3
        and rest[0] == 'namespaces'
        and not (len(rest) == 3 and rest[2] in _NAMESPACE_SUBRESOURCES)
    ):
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3 or not all(rest):
        return None
    return Route(
        group=group,
        version=version,
        plural=rest[0],
        namespace=namespace,
        name=rest[1] if len(rest) > 1 else None,
        subresource=rest[2] if len(rest) > 2 else None,
        watch=watch,
    )


def _verb(method: str, route: Route, query: Mapping[str, str]) -> str:
    if method == 'GET':
        if route.watch or query.get('watch') in ('true', '1'):
            return 'watch'
        return 'get' if route.name else 'list'
    if method == 'POST':
        return 'create'
    if method == 'PUT':
        return 'update'
    if method == 'PATCH':
        return 'patch'
    if method == 'DELETE':
        return 'delete' if route.name else 'deletecollection'
    return method.lower()


def _json_response(code: int, body: bytes, warnings: Sequence[str] = ()) -> web.Response:
    response = web.Response(body=body, status=code, content_type=_JSON)
    for warning in warnings:  # the text as a quoted string (RFC 9110), as real servers send it
        quoted = warning.replace('\\', '\\\\').replace('"', '\\"')
        response.headers.add('Warning', f'299 - "{quoted}"')
    return response


def error_response(error: errors.ApiError) -> web.Response:
    if error.plain_text:
        return web.Response(status=error.code, text=error.message + '\n', content_type='text/plain')
    response = _json_response(error.code, encode(error.as_status()), error.warnings)
    for header, value in error.headers.items():
        response.headers[header] = value
    return response


def _content_type(request: web.BaseRequest) -> str:
    return request.headers.get('Content-Type', '').split(';', 1)[0].strip().lower()


def _flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, '').lower() in ('true', '1')


def _integer(query: Mapping[str, str], name: str) -> int | None:
    text = query.get(name)
    if text is None or text == '':
        return None
    try:
        value = int(text)
    except ValueError:
        raise errors.bad_request(f'invalid value for {name}: {text!r}') from None
    if value < 0:
        raise errors.bad_request(f'{name} must not be negative: {text!r}')
    return value


def _limit(query: Mapping[str, str]) -> int:
    """The page size of a list; like real servers, a negative one means no limit (as zero does)."""
    text = query.get('limit')
    if not text:
        return 0
    try:
        return max(0, int(text))
    except ValueError:
        raise errors.bad_request(f'invalid value for limit: {text!r}') from None


@dataclasses.dataclass
class WatchSettings:
    bookmark_interval: float = 60.0
    default_timeout: float | None = None  # a server-side limit for watches that do not ask for one
    # Like kube-apiserver (its watchers' channels of a custom resource, its dispatch budget): a watch whose
    # client does not read is ended when so many events wait for so long (beyond the sockets' buffers).
    watcher_capacity: int | None = 200
    watcher_patience: float = 0.1
    feature_gates: dict[str, bool] = dataclasses.field(default_factory=dict)  # the emulator's, shared


class ApiHandler:
    """The single request handler of the emulator's HTTP server."""

    def __init__(
        self,
        *,
        registry: ResourceRegistry,
        store: ObjectStore,
        operations: Operations,
        counter: RequestCounter,
        faults: FaultInjector,
        watch_settings: WatchSettings,
    ) -> None:
        self.registry = registry
        self.store = store
        self.operations = operations
        self.counter = counter
        self.faults = faults
        self.watch_settings = watch_settings
        self.server_address = ''
        self._documents: dict[str, tuple[int, bytes]] = {}

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            path = request.path
            method = request.method
            route = parse_route(path)
            if route is None:
                verb = 'discovery'
                self.counter.record(RequestKey(verb, '', '', '', '', ''))
            else:
                verb = _verb(method, route, request.query)
                self.counter.record(
                    RequestKey(
                        verb,
                        route.group,
                        route.plural,
                        route.subresource or '',
                        route.namespace or '',
                        route.name or '',
                    )
                )
            if self.faults.accepted_tokens is not None and self.faults.rejects(
                request.headers.get('Authorization')
            ):
                raise errors.ApiError(401, 'Unauthorized')
            response_delay = 0.0
            if self.faults.armed:
                delay, response_delay = self.faults.take_latency(method, verb, path)
                if delay > 0:
                    await asyncio.sleep(delay)
                failure = self.faults.take_failure(method, verb, path)
                if failure is not None and failure.raw_body is not None:
                    return web.Response(
                        status=failure.status, body=failure.raw_body, content_type='text/html'
                    )
                if failure is not None:
                    headers = {}
                    details: dict[str, Any] = {}
                    if failure.retry_after is not None:
                        headers['Retry-After'] = str(max(0, round(failure.retry_after)))
                        details['retryAfterSeconds'] = max(0, round(failure.retry_after))
                    raise errors.ApiError(failure.status, failure.message, details=details, headers=headers)
            try:
                if route is None:
                    return self._non_resource(method, path)
                return await self._resource(request, route, verb)
            finally:
                if response_delay > 0:  # served (and seen by the watch-streams) at once, answered later
                    await asyncio.sleep(response_delay)
        except errors.ApiError as e:
            return error_response(e)
        except web.HTTPRequestEntityTooLarge:
            return error_response(errors.ApiError(413, f'Request entity too large: limit is {MAX_BODY_SIZE}'))
        except ConnectionResetError:  # incl. aiohttp's: the client has gone while its response was written
            # Re-raised, it would be logged by aiohttp as a server error with a traceback; the client that
            # could read the status is gone anyway (writing this response fails quietly in aiohttp).
            logger.debug('The client has disconnected during %s %s', request.method, request.path_qs)
            return web.Response(status=499, text='The client has closed the connection.')
        except Exception as e:
            logger.exception('The emulator failed to serve %s %s', request.method, request.path_qs)
            return error_response(errors.internal_error(f'{type(e).__name__}: {e}'))

    # ----------------------------------------------------------------------------------------
    # Discovery & non-resource URLs.

    def _non_resource(self, method: str, path: str) -> web.StreamResponse:
        stripped = path.rstrip('/') or '/'
        if stripped in ('/healthz', '/livez', '/readyz') or stripped.startswith(
            ('/healthz/', '/livez/', '/readyz/')
        ):
            return web.Response(text='ok', content_type='text/plain')
        if method != 'GET':
            raise errors.method_not_allowed('the server does not allow this method on the requested resource')
        document = self._document(stripped)
        if document is None:
            raise self._unknown(stripped)
        return _json_response(200, document)

    def _unknown(self, path: str) -> errors.ApiError:
        """
        A 404 for an unknown URL, as real servers answer it.

        Under ``/api`` and the groups that are served, it is a Status (NotFound); elsewhere (an unknown
        group, e.g. of a CRD not created yet, or no API at all) it is a plain ``404 page not found``.
        """
        parts = path.strip('/').split('/')
        if parts[0] in ('api', 'openapi') or (
            parts[0] == 'apis' and (len(parts) == 1 or self.registry.group_versions().get(parts[1]))
        ):
            return errors.unknown_resource()
        return errors.page_not_found()

    def _document(self, path: str) -> bytes | None:
        """A discovery or OpenAPI document, cached until the set of served resources changes."""
        cached = self._documents.get(path)
        if cached is not None and cached[0] == self.registry.generation:
            return cached[1]
        content = self._build_document(path)
        if content is None:
            return None  # not cached: arbitrary unknown URLs must not grow the cache
        encoded = encode(content)
        self._documents[path] = (self.registry.generation, encoded)
        return encoded

    def _build_document(self, path: str) -> dict[str, Any] | None:
        parts = path.strip('/').split('/')
        registry = self.registry
        if path == '/version':
            return KUBERNETES_VERSION
        if path == '/api':
            return {
                **registry.core_versions(),
                'serverAddressByClientCIDRs': [
                    {'clientCIDR': '0.0.0.0/0', 'serverAddress': self.server_address}
                ],
            }
        if path == '/apis':
            return registry.group_list()
        if parts[0] == 'api' and len(parts) == 2:
            return registry.resource_list('', parts[1])
        if parts[0] == 'apis' and len(parts) == 2:
            return registry.group_document(parts[1])
        if parts[0] == 'apis' and len(parts) == 3:
            return registry.resource_list(parts[1], parts[2])
        if path == '/openapi/v3':
            return registry.openapi_root()
        if parts[:2] == ['openapi', 'v3'] and len(parts) == 4 and parts[2] == 'api':
            return registry.openapi_document('', parts[3])
        if parts[:2] == ['openapi', 'v3'] and len(parts) == 5 and parts[2] == 'apis':
            return registry.openapi_document(parts[3], parts[4])
        return None  # including /openapi/v2, which kubectl tolerates the absence of

    # ----------------------------------------------------------------------------------------
    # Resources.

    async def _resource(self, request: web.BaseRequest, route: Route, verb: str) -> web.StreamResponse:
        info = self.registry.lookup(route.group, route.version, route.plural)
        if info is None:
            raise self._unknown(request.path)
        if route.namespace is not None and not info.namespaced:
            raise errors.unknown_resource()
        if route.subresource is not None and (route.subresource != 'status' or not info.has_status):
            raise errors.unknown_resource()
        namespace = route.namespace
        name = route.name
        query = request.query
        if verb in ('get', 'list', 'watch'):
            self._check_accept(request)
        dry_run = 'dryRun' in query
        if dry_run and verb in _OPTIONS_KINDS:
            values = query.getall('dryRun')
            if values != ['All']:
                quoted = ','.join(json.dumps(value) for value in values)
                raise errors.invalid(_OPTIONS_KINDS[verb], 'meta.k8s.io', '', [errors.Cause(
                    'dryRun', f'Unsupported value: [{quoted}]: supported values: "All"',
                    reason='FieldValueNotSupported',
                )])

        field_validation = query.get('fieldValidation', '')
        if verb in ('create', 'update', 'patch') and field_validation not in schemas.FIELD_VALIDATION_MODES:
            supported = ', '.join(json.dumps(mode) for mode in schemas.FIELD_VALIDATION_MODES)
            message = f'Unsupported value: {json.dumps(field_validation)}: supported values: {supported}'
            raise errors.invalid(_OPTIONS_KINDS[verb], 'meta.k8s.io', '', [
                errors.Cause('fieldValidation', message, reason='FieldValueNotSupported'),
            ])

        if info.namespaced and namespace is None and name is not None:
            raise errors.unknown_resource()
        if info.namespaced and namespace is None and verb not in ('list', 'watch'):
            raise errors.method_not_allowed('the server does not allow this method on the requested resource')

        if verb == 'get':
            assert name is not None
            stored = self.operations.get(info, namespace, name)
            table_version = tables.table_version(request.headers.get('Accept', ''))
            if table_version is not None:
                table = tables.make_table(
                    info,
                    [with_api_version(stored.body, info.api_version)],
                    version=table_version,
                    include_object=query.get('includeObject', ''),
                )
                return _json_response(200, encode(table))
            return _json_response(200, stored.encoded_as(info.api_version))
        if verb == 'list':
            return _json_response(200, self._list(info, namespace, query, request.headers.get('Accept', '')))
        if verb == 'watch':
            return await self._watch(request, info, route)
        if verb == 'create':
            if name is not None:
                raise errors.method_not_allowed(
                    'the server does not allow this method on the requested resource'
                )
            body = self._decode_object(request, await request.read(), info)
            outcome = await self.operations.create(
                info, namespace, body, dry_run=dry_run, field_manager=query.get('fieldManager'),
                field_validation=field_validation,
            )
            return self._outcome(outcome)
        if verb == 'update':
            if name is None:
                raise errors.method_not_allowed(
                    'the server does not allow this method on the requested resource'
                )
            body = self._decode_object(request, await request.read(), info)
            outcome = await self.operations.update(
                info, namespace, name, body, subresource=route.subresource, dry_run=dry_run,
                field_validation=field_validation,
            )
            return self._outcome(outcome)
        if verb == 'patch':
            if name is None:
                raise errors.method_not_allowed(
                    'the server does not allow this method on the requested resource'
                )
            outcome = await self.operations.patch(
                info,
                namespace,
                name,
                _content_type(request),
                await request.read(),
                subresource=route.subresource,
                dry_run=dry_run,
                field_manager=query.get('fieldManager'),
                field_validation=field_validation,
            )
            return self._outcome(outcome)
        if verb in ('delete', 'deletecollection'):
            if route.subresource is not None:
                raise errors.method_not_allowed(
                    'the server does not allow this method on the requested resource'
                )
            options = self._delete_options(request, await request.read())
            if name is not None:
                outcome = await self.operations.delete(info, namespace, name, options, dry_run=dry_run)
            else:
                label_selector, field_selector = self._selectors(info, query)
                outcome = await self.operations.delete_collection(
                    info, namespace, label_selector, field_selector, options, dry_run=dry_run
                )
            return self._outcome(outcome)
        raise errors.method_not_allowed('the server does not allow this method on the requested resource')

    @staticmethod
    def _outcome(outcome: Outcome) -> web.Response:
        return _json_response(outcome.code, outcome.encoded, outcome.warnings)

    @staticmethod
    def _check_accept(request: web.BaseRequest) -> None:
        accept = request.headers.get('Accept', '')
        if accept and 'json' not in accept and '*/*' not in accept and 'application/*' not in accept:
            raise errors.ApiError(406, f'only the following media types are accepted: {_JSON}')

    @staticmethod
    def _decode_object(request: web.BaseRequest, raw: bytes, info: ResourceInfo) -> Any:
        content_type = _content_type(request)
        if content_type in ('', _JSON, '*/*'):
            # Like real servers: no content type means the default one, JSON.
            return decode_json_body(raw)
        if content_type in ('application/yaml', 'application/x-yaml', 'text/yaml'):
            return decode_yaml_body(raw)
        if content_type == _PROTOBUF and not info.custom and not raw.startswith(_PROTOBUF_PREFIX):
            # Real servers take protobuf for the built-in kinds (not for custom ones): this is not it.
            # (Real protobuf is not decoded by the emulator: 415 below, a known difference.)
            raise errors.bad_request(
                f'the object provided is unrecognized (must be of type {info.kind}): provided data '
                f'does not appear to be a protobuf message, expected prefix [107 56 115 0] '
                f'({raw[:64].decode(errors="replace")})'
            )
        raise errors.unsupported_media_type(_OBJECT_CONTENT_TYPES)

    @staticmethod
    def _delete_options(request: web.BaseRequest, raw: bytes) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if raw.strip():
            content_type = _content_type(request)
            decoded = decode_yaml_body(raw) if 'yaml' in content_type else decode_json_body(raw)
            if not isinstance(decoded, dict):
                raise errors.bad_request('the delete options must be a JSON object')
            options.update(decoded)
        query = request.query
        if 'propagationPolicy' in query:
            options['propagationPolicy'] = query['propagationPolicy']
        if 'orphanDependents' in query:
            options['orphanDependents'] = _flag(query, 'orphanDependents')
        if 'gracePeriodSeconds' in query:
            options['gracePeriodSeconds'] = _integer(query, 'gracePeriodSeconds')
        policy = options.get('propagationPolicy')
        if policy is not None and policy not in ('Orphan', 'Background', 'Foreground'):
            raise errors.invalid(
                'DeleteOptions',
                'meta.k8s.io',
                '',
                [
                    errors.Cause(
                        'propagationPolicy',
                        f'Unsupported value: "{policy}": supported values: '
                        f'"Foreground", "Background", "Orphan", "nil"',
                        reason='FieldValueNotSupported',
                    )
                ],
            )
        return options

    @staticmethod
    def _selectors(
        info: ResourceInfo,
        query: Mapping[str, str],
    ) -> tuple[selectors.LabelSelector, selectors.FieldSelector]:
        try:
            label_selector = selectors.parse_label_selector(query.get('labelSelector', ''))
            field_selector = selectors.parse_field_selector(
                query.get('fieldSelector', ''), info.field_selector_paths
            )
        except selectors.SelectorError as e:
            raise errors.bad_request(str(e)) from None
        return label_selector, field_selector

    def _shard_selector(self, query: Mapping[str, str]) -> sharding.ShardSelector | None:
        """The shard selector of a list or a watch; ignored without the feature gate (as real servers do)."""
        if not self.watch_settings.feature_gates.get(sharding.FEATURE_GATE, False):
            return None
        return sharding.parse_shard_selector(query.get('shardSelector', ''))

    # ----------------------------------------------------------------------------------------
    # Lists.

    def _list(
        self, info: ResourceInfo, namespace: str | None, query: Mapping[str, str], accept: str
    ) -> bytes:
        label_selector, field_selector = self._selectors(info, query)
        shard_selector = self._shard_selector(query)
        limit = _limit(query)
        start: tuple[str, str] | None = None
        token = query.get('continue')
        if token:
            try:
                decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
                start = (str(decoded['start'][0]), str(decoded['start'][1]))
            except (ValueError, KeyError, IndexError, TypeError, binascii.Error):
                raise errors.bad_request('continue key is not valid: the token is malformed') from None

        api_version = info.api_version
        found: list[StoredObject] = []
        for stored in self.store.objects(info.storage_key, namespace, after=start):
            if limit and len(found) > limit:
                break  # one more than a page: there is a next page (the rest is counted without a scan)
            metadata = stored.body['metadata']
            if label_selector and not selectors.labels_match(label_selector, metadata.get('labels')):
                continue
            if field_selector and not selectors.fields_match(field_selector, stored.body):
                continue
            if shard_selector is not None and not shard_selector.matches(stored.body):
                continue
            found.append(stored)

        list_metadata: dict[str, Any] = {'resourceVersion': str(self.store.last_resource_version)}
        if limit and len(found) > limit:
            last = found[limit - 1]
            token_data = {'rv': self.store.last_resource_version, 'start': [last.namespace, last.name]}
            list_metadata['continue'] = base64.urlsafe_b64encode(json.dumps(token_data).encode()).decode()
            if not label_selector and not field_selector and shard_selector is None:
                list_metadata['remainingItemCount'] = (
                    self.store.count_after(info.storage_key, namespace, start) - limit
                )
            found = found[:limit]
        if shard_selector is not None and not info.custom:  # as kube-apiserver 1.37: no echo for CRs
            list_metadata['shardInfo'] = {'selector': shard_selector.render()}
        table_version = tables.table_version(accept)
        if table_version is not None:
            table = tables.make_table(
                info,
                [with_api_version(stored.body, api_version) for stored in found],
                version=table_version,
                include_object=query.get('includeObject', ''),
                list_metadata=list_metadata,
            )
            return encode(table)
        return (
            b'{"kind":"'
            + info.list_kind.encode()
            + b'","apiVersion":"'
            + api_version.encode()
            + b'","metadata":'
            + encode(list_metadata)
            + b',"items":['
            + b','.join(stored.encoded_as(api_version) for stored in found)
            + b']}'
        )

    # ----------------------------------------------------------------------------------------
    # Watches.

    async def _watch(self, request: web.BaseRequest, info: ResourceInfo, route: Route) -> web.StreamResponse:
        query = request.query
        label_selector, field_selector = self._selectors(info, query)
        shard_selector = self._shard_selector(query)
        if route.name is not None:
            field_selector += (selectors.FieldRequirement('metadata.name', False, route.name),)
        timeout_seconds = _integer(query, 'timeoutSeconds')
        allow_bookmarks = _flag(query, 'allowWatchBookmarks')
        send_initial_events = _flag(query, 'sendInitialEvents')
        resource_version = query.get('resourceVersion', '')
        table_version = tables.table_version(request.headers.get('Accept', ''))
        include_object = query.get('includeObject', '')

        def as_table(body: dict[str, Any]) -> dict[str, Any]:
            assert table_version is not None
            return tables.make_table(info, [body], version=table_version, include_object=include_object)

        watcher = Watcher(
            info,
            namespace=route.namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            path=request.path_qs,
            transform=as_table if table_version is not None else None,
            shard_selector=shard_selector,
        )
        state = self.store.state(info.storage_key)

        # Everything until the watcher is subscribed is synchronous: no event can slip in between.
        if send_initial_events or resource_version in ('', '0'):
            for stored in self.store.objects(info.storage_key, route.namespace):
                if not watcher.matches(stored.body):
                    continue
                watcher.sent += 1
                if watcher.transform is not None:
                    watcher.pending.append(watcher.render('ADDED', stored.body))
                else:
                    encoded = stored.encoded_as(info.api_version)
                    watcher.pending.append(b'{"type":"ADDED","object":' + encoded + b'}\n')
            if send_initial_events and allow_bookmarks:
                watcher.pending.append(self._bookmark(info, initial_events_end=True))
        else:
            try:
                since = int(resource_version)
            except ValueError:
                raise errors.bad_request(
                    f'resourceVersion: Invalid value: "{resource_version}": must be an integer'
                ) from None
            if since < state.replayable_after:
                return await self._expired_watch(request, since, state.replayable_after)
            replayed = []
            for event in reversed(state.history):
                if event.resource_version <= since:
                    break
                replayed.append(event)
            for event in reversed(replayed):
                watcher.offer(event)
        state.watchers.add(watcher)
        watcher.capacity = self.watch_settings.watcher_capacity
        watcher.patience = self.watch_settings.watcher_patience

        response = web.StreamResponse(status=200, headers={'Content-Type': _JSON})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            await self._stream(
                response, watcher, info, timeout_seconds=timeout_seconds, allow_bookmarks=allow_bookmarks
            )
            if watcher.aborted:
                if request.transport is not None:
                    request.transport.abort()
                return response
            await response.write_eof()
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError is one too
            # The client has gone first (e.g. an operator stopping), maybe while an event was on its way
            # (its EOF is seen, its connection not yet closed): the usual end of a watch, not an error.
            logger.debug('The watcher has disconnected from %s', request.path_qs)
        finally:
            state.watchers.discard(watcher)
            self.store.finished_watches.append((watcher.path, watcher.sent))
            if watcher.terminated:
                self.store.terminated_watches.append(watcher.path)
                logger.debug('The watcher of %s is cut off: it does not read its events.', request.path_qs)
        return response

    async def _stream(
        self,
        response: web.StreamResponse,
        watcher: Watcher,
        info: ResourceInfo,
        *,
        timeout_seconds: int | None,
        allow_bookmarks: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        # Like real servers, zero means no limit requested (so, the server's own limit).
        limit = timeout_seconds if timeout_seconds else self.watch_settings.default_timeout
        deadline = loop.time() + limit if limit is not None else None
        interval = self.watch_settings.bookmark_interval
        next_bookmark = loop.time() + interval if allow_bookmarks else None
        while not watcher.closed:
            if watcher.pending:
                chunk = b''.join(watcher.pending)
                watcher.pending.clear()
                watcher.blocked_since = time.monotonic()  # until written: the client's not reading blocks it
                try:
                    await response.write(chunk)
                finally:
                    watcher.blocked_since = None
                continue
            watcher.wakeup.clear()
            now = loop.time()
            moments = [moment for moment in (deadline, next_bookmark) if moment is not None]
            delay = max(0.0, min(moments) - now) if moments else None
            try:
                await asyncio.wait_for(watcher.wakeup.wait(), timeout=delay)
            except TimeoutError:
                pass
            now = loop.time()
            if deadline is not None and now >= deadline:
                break
            if next_bookmark is not None and now >= next_bookmark:
                watcher.push(self._bookmark(info))
                next_bookmark = now + interval

    def _bookmark(self, info: ResourceInfo, *, initial_events_end: bool = False) -> bytes:
        metadata: dict[str, Any] = {'resourceVersion': str(self.store.last_resource_version)}
        if initial_events_end:
            metadata['annotations'] = {'k8s.io/initial-events-end': 'true'}
        return event_line(
            'BOOKMARK', {'kind': info.kind, 'apiVersion': info.api_version, 'metadata': metadata}
        )

    @staticmethod
    async def _expired_watch(request: web.BaseRequest, since: int, oldest: int) -> web.StreamResponse:
        """Like real servers: a successful response with one ERROR event saying 410 Gone."""
        error = errors.expired(f'too old resource version: {since} ({oldest})')
        response = web.StreamResponse(status=200, headers={'Content-Type': _JSON})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(event_line('ERROR', error.as_status()))
        await response.write_eof()
        return response
