"""
Admission: the reviews served by the validating & mutating handlers, and the managed webhook configurations.

The webhook servers and tunnels (``settings.admission.server``, e.g. ``kopf.WebhookServer``) only
receive the requests and send the answers back; they get the framework's :class:`~kopf.WebhookFn`
to call for every review (made here by :func:`make_webhook_fn`) and yield the client configs
by which the apiservers reach them. Any callable with that protocol works: the built-in ones of
kopf-webhooks are not imported here, so that kopf-core alone still runs operators without them.

One review is served so:

* the review is checked: a malformed one (not an ``AdmissionReview``, no ``request.uid``, no resource,
  an unknown operation, a resource or a webhook id this operator does not serve) raises
  :class:`AdmissionReviewError`, which the servers answer with HTTP 400, and nothing is logged
  as a failure of the operator;
* the handlers are those of the addressed webhook (the handler id is the last component
  of the URL path of the managed configurations), or all the handlers of the resource if
  the request is not addressed (custom servers may do so); they are filtered as usual;
* all of them run one after another, with the same ``patch`` and ``warnings``; the mutations are
  combined into one JSON-patch against the reviewed object. The failures deny the admission:
  one is reported, by priority: :class:`kopf.AdmissionError` (its message and code), then
  other permanent errors, then temporary errors, then any others (all with the code 500).
  The handlers with ``ignore_failures=True`` cannot deny the admission by their errors.

The managed configurations (``settings.admission.managed``): one ``ValidatingWebhookConfiguration``
and one ``MutatingWebhookConfiguration`` with that name, with a webhook per handler: its rules
(for the handler's resources found in the cluster, its operations & subresource), the labels
filter as an ``objectSelector``, and the server's latest client config with the handler id added
to the URL's path. They are created or overwritten at start, and again on every change of the
client config or of the cluster's resources, so that the stale webhooks are removed. At a graceful
exit, only the webhooks of the ``persistent=True`` handlers are left in them.
"""
import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any, Protocol, TypeGuard

from kopf._clients import creating, errors
from kopf._clients.vault import Vault
from kopf._cogs.helpers import metering
from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.patches import Patch
from kopf._cogs.structs.references import Resource
from kopf._cogs.structs.reviews import Headers, SSLPeer, WebhookClientConfig, WebhookFn
from kopf._core.actions import application, invocation, loggers
from kopf._core.actions.contexts import cause_var, handler_var, owner_var
from kopf._core.actions.errors import AdmissionError, PermanentError, TemporaryError
from kopf._core.intents import filters
from kopf._core.intents.causes import ResourceWebhookCause
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import ADMISSION_OPERATIONS, HandlerId, WebhookHandler, WebhookType
from kopf._core.intents.registries import OperatorRegistry

__all__ = [
    'AdmissionReviewError',
    'ClientConfigs',
    'WebhookInsights',
    'admission_webhook_server',
    'build_webhooks',
    'configuration_manager',
    'make_webhook_fn',
    'serve_admission_request',
]

logger = logging.getLogger(__name__)

REVIEW_VERSIONS = ('admission.k8s.io/v1', 'admission.k8s.io/v1beta1')

VALIDATING_CONFIGURATIONS = Resource(
    'admissionregistration.k8s.io', 'v1', 'validatingwebhookconfigurations',
    kind='ValidatingWebhookConfiguration', namespaced=False,
)
MUTATING_CONFIGURATIONS = Resource(
    'admissionregistration.k8s.io', 'v1', 'mutatingwebhookconfigurations',
    kind='MutatingWebhookConfiguration', namespaced=False,
)
CONFIGURATIONS: Mapping[WebhookType, Resource] = {
    WebhookType.VALIDATING: VALIDATING_CONFIGURATIONS,
    WebhookType.MUTATING: MUTATING_CONFIGURATIONS,
}


class AdmissionReviewError(ValueError):
    """
    The admission review cannot be served as it is: malformed, or not for this operator.

    The webhook servers answer it with HTTP 400 and the message; it is the client's mistake,
    not the operator's failure.
    """


class WebhookInsights(Protocol):
    """What the admission needs to know about the cluster (the operator's insights provide it)."""

    webhook_resources: set[Resource]
    ready_resources: asyncio.Event


class ResourceMemoRecall(Protocol):
    """
    How the memo of an object is recalled: the object's own if the operator knows the object
    (e.g. it watches its resource), a throwaway one otherwise (e.g. the creations): the admission
    alone never makes the operator remember an object, which it would never forget then.
    """

    def __call__(self, raw_body: Mapping[str, Any]) -> Any: ...


#
# Serving the reviews.
#

def make_webhook_fn(
        *,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        insights: WebhookInsights,
        recall_memo: ResourceMemoRecall | None = None,
        indices: Mapping[str, Any] | None = None,
) -> WebhookFn:
    """The framework's function that the webhook servers call for every review they receive."""

    async def webhook_fn(
            request: Mapping[str, Any],
            *,
            webhook: str | None = None,
            headers: Headers | None = None,
            sslpeer: SSLPeer | None = None,
    ) -> Mapping[str, Any]:
        return await serve_admission_request(
            request, webhook=webhook, headers=headers, sslpeer=sslpeer,
            registry=registry, settings=settings, insights=insights,
            recall_memo=recall_memo, indices=indices,
        )

    return webhook_fn


@dataclasses.dataclass(frozen=True)
class _Review:
    """The parts of a review that the serving needs, checked."""

    api_version: str
    uid: str
    resource: Resource
    operation: str
    subresource: str | None
    body: Mapping[str, Any]
    old_body: Mapping[str, Any] | None
    dryrun: bool
    userinfo: Mapping[str, Any]


async def serve_admission_request(
        request: Mapping[str, Any],
        *,
        webhook: str | None = None,
        headers: Headers | None = None,
        sslpeer: SSLPeer | None = None,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        insights: WebhookInsights,
        recall_memo: ResourceMemoRecall | None = None,
        indices: Mapping[str, Any] | None = None,
) -> Mapping[str, Any]:
    """
    Serve one admission review: run the matching handlers, return the review with the response.

    Raises :class:`AdmissionReviewError` if the review is malformed or is not for this operator.
    """
    started = time.monotonic() if metering.meters is not None else 0.0
    review = _parse_review(request, insights=insights, registry=registry)
    reason: WebhookType | None = None
    if webhook is not None:
        resource_handlers = registry.webhooks.get_resource_handlers(review.resource)
        addressed = next((handler for handler in resource_handlers if handler.id == webhook), None)
        if addressed is None:
            known = ', '.join(sorted(handler.id for handler in resource_handlers)) or 'none'
            raise AdmissionReviewError(f'Unknown webhook {webhook!r} for {review.resource.name}; '
                                       f'the webhooks of this resource are: {known}.')
        reason = addressed.reason

    raw_body = review.body
    memo = recall_memo(raw_body) if recall_memo is not None else None
    body = Body(raw_body)
    warnings: list[str] = []
    cause = ResourceWebhookCause(
        logger=loggers.LocalObjectLogger(body=raw_body, settings=settings),  # it reads the body only to log
        memo=memo, indices=indices if indices is not None else {},
        resource=review.resource, body=body, patch=Patch(body=raw_body),
        reason=reason,  # None selects both types (an unaddressed request)
        webhook=HandlerId(webhook) if webhook is not None else None,
        operation=review.operation, subresource=review.subresource, dryrun=review.dryrun,
        userinfo=review.userinfo, warnings=warnings,
        headers=headers if headers is not None else {}, sslpeer=sslpeer if sslpeer is not None else {},
    )

    failures: list[tuple[WebhookHandler, BaseException]] = []
    object_logger = cause.logger
    debugging = object_logger.isEnabledFor(logging.DEBUG)  # once per review, not per handler
    for handler in registry.webhooks.iter_handlers(cause):
        if debugging:
            object_logger.debug(f'Webhook {handler.id!r} is invoked.')
        try:
            await _call_handler(handler, cause, settings=settings)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            _log_failure(handler, e, cause)
            if not handler.ignore_failures:
                failures.append((handler, e))
        else:
            object_logger.info(f'Webhook {handler.id!r} succeeded.')

    response: dict[str, Any] = {'uid': review.uid, 'allowed': not failures}
    if failures:
        response['status'] = _describe_denial(failures)
    elif cause.patch:
        operations = cause.patch.as_json_patch(raw_body)  # the merge-patch alone is converted directly
        if operations:
            response['patchType'] = 'JSONPatch'
            response['patch'] = base64.b64encode(json.dumps(operations).encode()).decode()
    if warnings:
        response['warnings'] = [str(warning) for warning in warnings]
    meters = metering.meters
    if meters is not None:
        name = meters.capped('webhook', webhook if webhook is not None else 'all')
        outcome = ('allowed' if not failures else
                   'denied' if all(isinstance(e, PermanentError) for _, e in failures) else 'error')
        meters.child(meters.admission_reviews, name, outcome).inc()
        meters.child(meters.admission_duration, name).observe(time.monotonic() - started)
    return {'apiVersion': review.api_version, 'kind': 'AdmissionReview', 'response': response}


async def _call_handler(
        handler: WebhookHandler,
        cause: ResourceWebhookCause,
        *,
        settings: OperatorSettings,
) -> None:
    tokens = (owner_var.set(cause.body), handler_var.set(handler), cause_var.set(cause))
    try:
        fn = handler.fn
        if invocation.is_async_fn(fn):  # directly: the reviews are on the path of every API request
            await fn(**cause.kwargs_for(handler))
        else:
            await invocation.invoke(fn, kwargs=cause.kwargs_for(handler),
                                    executor=settings.execution.executor)
    finally:
        cause_var.reset(tokens[2])
        handler_var.reset(tokens[1])
        owner_var.reset(tokens[0])


def _log_failure(handler: WebhookHandler, error: BaseException, cause: ResourceWebhookCause) -> None:
    """The failures' lines and levels as in Kopf (users grep and alert on them)."""
    ignored = ' It is ignored (ignore_failures=True).' if handler.ignore_failures else ''
    if isinstance(error, (AdmissionError, PermanentError)):  # AdmissionError is a PermanentError
        cause.logger.error(f'Webhook {handler.id!r} failed permanently: {error}{ignored}')
    elif isinstance(error, TemporaryError):
        cause.logger.error(f'Webhook {handler.id!r} failed temporarily: {error}{ignored}')
    else:
        cause.logger.exception(f'Webhook {handler.id!r} failed with an exception and will stop now: '
                               f'{error}{ignored}')


def _describe_denial(failures: Collection[tuple[WebhookHandler, BaseException]]) -> dict[str, Any]:
    """The status of the one failure reported: admission errors first, then permanent, temporary, others."""
    def priority(failure: tuple[WebhookHandler, BaseException]) -> int:
        error = failure[1]
        return (0 if isinstance(error, AdmissionError) else
                1 if isinstance(error, PermanentError) else
                2 if isinstance(error, TemporaryError) else 3)

    _, error = min(failures, key=priority)  # the first one of the best priority
    if isinstance(error, AdmissionError):
        code = error.code if isinstance(error.code, int) else 500
        return {'message': error.message or str(error), 'code': code}
    return {'message': str(error) or type(error).__name__, 'code': 500}


def _is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    # JSON-parsed reviews are dicts: the ABC's costlier check is only for the custom servers' mappings.
    return type(value) is dict or isinstance(value, Mapping)


def _parse_review(
        request: Mapping[str, Any],
        *,
        insights: WebhookInsights,
        registry: OperatorRegistry,
) -> _Review:
    if not _is_mapping(request):
        raise AdmissionReviewError(f'An admission review must be a JSON object, '
                                   f'got {type(request).__name__}.')
    kind, api_version = request.get('kind'), request.get('apiVersion')
    if kind != 'AdmissionReview' or api_version not in REVIEW_VERSIONS:
        versions = ' or '.join(REVIEW_VERSIONS)
        raise AdmissionReviewError(f'Expected kind: AdmissionReview of apiVersion {versions}; '
                                   f'got kind={kind!r}, apiVersion={api_version!r}.')
    payload = request.get('request')
    if not _is_mapping(payload):
        raise AdmissionReviewError('The admission review has no "request" object.')
    uid = payload.get('uid')
    if type(uid) is not str or not uid:
        raise AdmissionReviewError('The admission review has no "request.uid" (a non-empty string).')
    operation = payload.get('operation')
    if operation not in ADMISSION_OPERATIONS:
        raise AdmissionReviewError(f'Unknown "request.operation": {operation!r}; '
                                   f'expected one of: {", ".join(sorted(ADMISSION_OPERATIONS))}.')
    gvr = payload.get('resource')
    group, version, plural = (gvr.get('group', ''), gvr.get('version'), gvr.get('resource')) \
        if _is_mapping(gvr) else (None, None, None)
    if type(group) is not str or type(version) is not str or type(plural) is not str:
        raise AdmissionReviewError('The admission review has no valid "request.resource" '
                                   '(group, version, resource).')
    resource = _find_resource(group, version, plural, kind=payload.get('kind'),
                              insights=insights, registry=registry)
    body, old_body = payload.get('object'), payload.get('oldObject')
    for name, obj in [('object', body), ('oldObject', old_body)]:
        if obj is not None and not _is_mapping(obj):
            raise AdmissionReviewError(f'"request.{name}" must be an object or null, '
                                       f'got {type(obj).__name__}.')
        metadata = obj.get('metadata') if obj is not None else None
        if metadata is not None and not _is_mapping(metadata):
            raise AdmissionReviewError(f'"request.{name}.metadata" must be an object, '
                                       f'got {type(metadata).__name__}.')
    subject: Mapping[str, Any] | None = body if body is not None else old_body  # deletions: as it was
    if subject is None:
        raise AdmissionReviewError('The admission review has neither "request.object" '
                                   'nor "request.oldObject".')
    subresource = payload.get('subResource') or None
    userinfo = payload.get('userInfo')
    return _Review(
        api_version=api_version, uid=uid, resource=resource, operation=operation,
        subresource=str(subresource) if subresource is not None else None,
        body=subject,
        old_body=old_body, dryrun=bool(payload.get('dryRun')),
        userinfo=userinfo if _is_mapping(userinfo) else {},
    )


# The served resources by their names, for the set of them that the insights had at the last review
# (the set itself is kept: compared by identity, it is never confused with another one).
_resource_index: tuple[Collection[Resource], dict[tuple[str, str, str], Resource]] = (frozenset(), {})


def _find_resource(
        group: str, version: str, plural: str,
        *,
        kind: Any,
        insights: WebhookInsights,
        registry: OperatorRegistry,
) -> Resource:
    """The served resource of the review: as discovered in the cluster, or as the review describes it."""
    global _resource_index
    resources = insights.webhook_resources
    indexed, index = _resource_index
    if indexed is not resources or len(index) != len(resources):  # the observer replaces the set on changes
        index = {(resource.group, resource.version, resource.plural): resource for resource in resources}
        _resource_index = (resources, index)
    found = index.get((group, version, plural))
    if found is not None:
        return found
    # Not discovered (yet): the selectors that need only these names can still match it.
    kind_name = kind.get('kind') if _is_mapping(kind) else None
    described = Resource(group, version, plural, kind=kind_name if isinstance(kind_name, str) else None)
    if registry.webhooks.has_handlers(described):
        return described
    raise AdmissionReviewError(f'The resource {described.name or plural!r} (version {version!r}) '
                               f'has no admission handlers in this operator.')


#
# The webhook server or tunnel as a core task of the operator.
#

class ClientConfigs:
    """The latest client config of the webhook server, for those who wait for it and its changes."""

    def __init__(self) -> None:
        super().__init__()
        self._latest: WebhookClientConfig | None = None
        self._changed = asyncio.Condition()

    @property
    def latest(self) -> WebhookClientConfig | None:
        return self._latest

    async def set(self, config: WebhookClientConfig) -> None:
        async with self._changed:
            self._latest = config
            self._changed.notify_all()

    async def wait_for_change(self, previous: WebhookClientConfig | None) -> WebhookClientConfig:
        async with self._changed:
            await self._changed.wait_for(lambda: self._latest is not None and self._latest is not previous)
            assert self._latest is not None
            return self._latest


async def admission_webhook_server(
        *,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        insights: WebhookInsights,
        configs: ClientConfigs,
        recall_memo: ResourceMemoRecall | None = None,
        indices: Mapping[str, Any] | None = None,
) -> None:
    """
    Run the webhook server or tunnel of ``settings.admission.server`` for the operator's lifetime.

    If it supports the async context manager protocol, it is entered first (and what it returns
    is used as the server). Its exit, normal or not, is the operator's exit.
    """
    server = settings.admission.server
    if server is None:
        raise RuntimeError('settings.admission.server is not set.')
    fn = make_webhook_fn(registry=registry, settings=settings, insights=insights,
                         recall_memo=recall_memo, indices=indices)
    async with contextlib.AsyncExitStack() as stack:
        if hasattr(server, '__aenter__') and hasattr(server, '__aexit__'):
            server = await stack.enter_async_context(server)
        source: AsyncIterator[WebhookClientConfig] = server(fn)
        if not hasattr(source, '__anext__'):
            raise TypeError(f'The webhook server/tunnel {server!r} must return an async iterator '
                            f'of client configs when called with the webhook function, '
                            f'but returned {source!r}. See the docs on custom servers and tunnels.')
        aclose = getattr(source, 'aclose', None)
        if aclose is not None:
            stack.push_async_callback(aclose)
        async for client_config in source:
            logger.debug(f'The webhook server/tunnel is reachable at: {_describe_config(client_config)}')
            await configs.set(client_config)
    raise RuntimeError(f'The webhook server/tunnel {server!r} has exited; the operator cannot serve '
                       f'the admission without it.')


def _describe_config(config: WebhookClientConfig) -> str:
    if config.get('url'):
        return str(config.get('url'))
    service = config.get('service') or {}
    namespace, name, port = service.get('namespace'), service.get('name'), service.get('port')
    return f'service {namespace}/{name}:{port}{service.get("path") or ""}'


#
# The managed webhook configurations.
#

async def configuration_manager(
        *,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        insights: WebhookInsights,
        configs: ClientConfigs,
        vault: Vault,
        changed: asyncio.Event,
) -> None:
    """
    Keep the validating & mutating configurations named ``settings.admission.managed`` up to date.

    ``changed`` is set by the resources' observer when the served resources change. At exit
    (cancellation), the non-persistent webhooks are removed from the configurations.
    """
    name = settings.admission.managed
    if not name:
        raise RuntimeError('settings.admission.managed is not set.')
    await insights.ready_resources.wait()
    client_config: WebhookClientConfig | None = None
    written: dict[WebhookType, list[dict[str, Any]]] = {}
    try:
        while True:
            changed.clear()
            if client_config is not None:
                for reason, resource in CONFIGURATIONS.items():
                    webhooks = build_webhooks(registry.webhooks.get_all_handlers(), reason=reason,
                                              name=name, resources=insights.webhook_resources,
                                              client_config=client_config)
                    if webhooks != written.get(reason):
                        logger.info(f'Reconfiguring the {reason.value} webhook {name}.')
                        await _upsert(resource, name=name, webhooks=webhooks, settings=settings, vault=vault)
                        written[reason] = webhooks
            waiters = [asyncio.create_task(configs.wait_for_change(client_config)),
                       asyncio.create_task(changed.wait())]
            try:
                done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
            if waiters[0] in done and not waiters[0].cancelled():
                client_config = waiters[0].result()
    finally:
        if client_config is not None:
            await asyncio.shield(_remove_non_persistent(
                registry=registry, settings=settings, vault=vault, insights=insights,
                name=name, client_config=client_config, written=written))


async def _remove_non_persistent(
        *,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        vault: Vault,
        insights: WebhookInsights,
        name: str,
        client_config: WebhookClientConfig,
        written: Mapping[WebhookType, list[dict[str, Any]]],
) -> None:
    for reason, resource in CONFIGURATIONS.items():
        if reason not in written:
            continue
        logger.info(f'Cleaning up the admission webhook {name}.')
        persistent = [handler for handler in registry.webhooks.get_all_handlers() if handler.persistent]
        webhooks = build_webhooks(persistent, reason=reason, name=name,
                                  resources=insights.webhook_resources, client_config=client_config)
        try:
            await _upsert(resource, name=name, webhooks=webhooks, settings=settings, vault=vault)
        except Exception as e:  # the exit goes on: the operator has no way to retry it later.
            logger.warning(f'Failed to remove the non-persistent webhooks from {resource.kind} {name!r}: {e}')


async def _upsert(
        resource: Resource,
        *,
        name: str,
        webhooks: list[dict[str, Any]],
        settings: OperatorSettings,
        vault: Vault,
) -> None:
    """Create the configuration, or overwrite its webhooks if it exists (the others' fields stay)."""
    body = {'apiVersion': resource.api_version, 'kind': resource.kind, 'metadata': {'name': name}}
    logger.debug(f'Updating {resource.kind} {name!r} with {len(webhooks)} webhook(s).')
    for _ in range(3):  # a race with another creator or deleter is resolved by another attempt.
        patched = await application.apply_patch(settings=settings, vault=vault, resource=resource, body=body,
                                                patch=Patch({'webhooks': webhooks}), logger=logger)
        if patched is not None:
            return
        try:
            await creating.create_obj(settings=settings, vault=vault, resource=resource,
                                      body={**body, 'webhooks': webhooks}, logger=logger)
            return
        except errors.APIConflictError:
            continue
    raise RuntimeError(f'Cannot create or update {resource.kind} {name!r}: it appears and disappears.')


def build_webhooks(
        handlers: Collection[WebhookHandler],
        *,
        reason: WebhookType,
        name: str,
        resources: Collection[Resource],
        client_config: WebhookClientConfig,
) -> list[dict[str, Any]]:
    """The webhooks of the handlers of one type, as they go into a managed configuration."""
    webhooks: list[dict[str, Any]] = []
    for handler in handlers:
        if handler.reason != reason or handler.selector is None:
            continue
        matched = sorted((resource for resource in resources if handler.selector.check(resource)),
                         key=lambda resource: (resource.group, resource.version, resource.plural))
        if not matched:
            continue
        operations = sorted(handler.operations) if handler.operations is not None else ['*']
        webhook: dict[str, Any] = {
            'name': _webhook_name(handler.id, name),
            'sideEffects': 'NoneOnDryRun' if handler.side_effects else 'None',
            'failurePolicy': 'Ignore' if handler.ignore_failures else 'Fail',
            'matchPolicy': 'Equivalent',
            'rules': [
                {
                    'apiGroups': [resource.group],
                    'apiVersions': [resource.version],
                    'resources': _rule_resources(resource, handler.subresource),
                    'operations': operations,
                    'scope': '*',
                }
                for resource in matched
            ],
            'objectSelector': _object_selector(handler.labels),
            'clientConfig': _addressed_config(client_config, handler.id),
            'admissionReviewVersions': ['v1', 'v1beta1'],
            'timeoutSeconds': 30,
        }
        webhooks.append(webhook)
    return webhooks


def _webhook_name(handler_id: str, name: str) -> str:
    # The webhooks' names must be DNS names: the handler ids (e.g. "fn/spec.field") are adapted.
    adapted = re.sub(r'[^a-z0-9.-]+', '-', handler_id.lower()).strip('-.')
    return f'{adapted or "webhook"}.{name}'


def _rule_resources(resource: Resource, subresource: str | None) -> list[str]:
    if subresource is None:
        return [resource.plural]
    if subresource == '*':
        return [resource.plural, f'{resource.plural}/*']
    return [f'{resource.plural}/{subresource}']


def _object_selector(labels: filters.MetaFilter | None) -> dict[str, Any]:
    """The labels filter as a label selector; callbacks are checked only when the review arrives."""
    expressions: list[dict[str, Any]] = []
    for key, criterion in (labels or {}).items():
        if criterion is filters.MetaFilterToken.PRESENT:
            expressions.append({'key': key, 'operator': 'Exists'})
        elif criterion is filters.MetaFilterToken.ABSENT:
            expressions.append({'key': key, 'operator': 'DoesNotExist'})
        elif isinstance(criterion, str):
            expressions.append({'key': key, 'operator': 'In', 'values': [criterion]})
    return {'matchExpressions': expressions} if expressions else {}


def _addressed_config(client_config: WebhookClientConfig, handler_id: str) -> dict[str, Any]:
    """The client config with the handler id as the last component of the URL's or the service's path."""
    config: dict[str, Any] = {key: value for key, value in client_config.items() if value is not None}
    quoted = urllib.parse.quote(handler_id, safe='')
    url = config.get('url')
    if url:
        parts = urllib.parse.urlsplit(url)
        config['url'] = urllib.parse.urlunsplit(parts._replace(path=f'{parts.path.rstrip("/")}/{quoted}'))
    service = config.get('service')
    if service:
        service = {key: value for key, value in service.items() if value is not None}
        service['path'] = f'{str(service.get("path") or "").rstrip("/")}/{quoted}'
        config['service'] = service
    return config


def ensure_server_is_configured(registry: OperatorRegistry, settings: OperatorSettings) -> None:
    """Fail the operator's start if there are admission handlers but nothing to serve them."""
    if registry.webhooks and settings.admission.server is None:
        ids = ', '.join(repr(handler.id) for handler in registry.webhooks.get_all_handlers())
        raise RuntimeError(
            f'Admission handlers exist ({ids}), but no webhook server/tunnel is configured to serve them. '
            f'Set settings.admission.server in a startup handler, e.g. to kopf.WebhookServer(...) '
            f'(see the docs on admission); or remove the @kopf.on.validate/mutate handlers.')
    if settings.admission.managed is not None and settings.admission.server is None:
        raise RuntimeError(
            f'settings.admission.managed={settings.admission.managed!r} needs a webhook server/tunnel '
            f'in settings.admission.server to put into the webhook configurations.')
