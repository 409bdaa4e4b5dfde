"""
Admission control: calling the webhooks of the stored validating & mutating webhook configurations.

When such configurations exist, every create/update/delete that matches their rules and
selectors is sent to the configured URL as an ``AdmissionReview`` (over TLS with the given
``caBundle``, or plain HTTP for the convenience of tests). Mutating webhooks run first, one by
one, and their JSON-patches are applied; then the validating ones. Denials become API errors
with the webhook's message and code; warnings become ``Warning`` headers of the response;
unreachable webhooks obey their ``failurePolicy``.
"""

import base64
import binascii
import dataclasses
import json
import logging
import ssl
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import aiohttp

from kopf.testing.emulator import errors, patches, selectors
from kopf.testing.emulator.resources import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    NAMESPACES,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    ResourceInfo,
)
from kopf.testing.emulator.store import ObjectStore, parse_number

logger = logging.getLogger(__name__)

Operation = Literal['CREATE', 'UPDATE', 'DELETE']
_USER_INFO = {'username': 'kubernetes-admin', 'groups': ['system:masters', 'system:authenticated']}


@dataclasses.dataclass(frozen=True)
class AdmissionRequest:
    """What is being admitted: the operation, the object as it would be stored, and the old one."""

    info: ResourceInfo
    operation: Operation
    namespace: str | None
    name: str
    obj: dict[str, Any] | None
    old_obj: dict[str, Any] | None
    dry_run: bool = False
    subresource: str | None = None
    options: dict[str, Any] | None = None

    def replace(self, **changes: Any) -> 'AdmissionRequest':
        return dataclasses.replace(self, **changes)


class _WebhookFailure(Exception):
    """The webhook could not be called or answered nonsense; the failure policy decides what follows."""


class AdmissionController:
    """Finds the webhooks relevant to a request, calls them, and applies their verdicts."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._session: aiohttp.ClientSession | None = None
        self._ssl_contexts: dict[str, ssl.SSLContext] = {}

    @property
    def active(self) -> bool:
        """Whether any webhook configuration exists: if not, requests skip admission entirely."""
        return bool(
            self._store.count(VALIDATING_WEBHOOK_CONFIGURATIONS.storage_key)
            or self._store.count(MUTATING_WEBHOOK_CONFIGURATIONS.storage_key)
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def mutate(self, request: AdmissionRequest, warnings: list[str]) -> dict[str, Any]:
        """Run the mutating webhooks in order; return the object with all their patches applied."""
        obj = request.obj
        for webhook in self._webhooks(MUTATING_WEBHOOK_CONFIGURATIONS.storage_key, request):
            response = await self._review(webhook, request.replace(obj=obj), warnings)
            if response is None or obj is None:
                continue
            patch = response.get('patch')
            if patch:
                if response.get('patchType', 'JSONPatch') != 'JSONPatch':
                    raise errors.internal_error(
                        f'the webhook "{webhook.get("name")}" returned '
                        f'an unsupported patchType {response.get("patchType")!r}'
                    )
                try:
                    operations = json.loads(base64.b64decode(patch), parse_float=parse_number)
                    obj = patches.apply_json_patch(obj, operations)
                except (
                    ValueError,
                    binascii.Error,
                    patches.PatchFormatError,
                    patches.PatchApplicationError,
                ) as e:
                    raise errors.internal_error(
                        f'the patch of the webhook "{webhook.get("name")}" could not be applied: {e}'
                    ) from None
                if not isinstance(obj, dict):
                    raise errors.internal_error(
                        f'the webhook "{webhook.get("name")}" produced an invalid object'
                    )
        assert obj is not None or request.obj is None
        return obj if obj is not None else {}

    async def validate(self, request: AdmissionRequest, warnings: list[str]) -> None:
        """Run the validating webhooks; any denial fails the request."""
        for webhook in self._webhooks(VALIDATING_WEBHOOK_CONFIGURATIONS.storage_key, request):
            await self._review(webhook, request, warnings)

    def _webhooks(self, key: tuple[str, str], request: AdmissionRequest) -> Iterator[dict[str, Any]]:
        for configuration in self._store.objects(key):
            for webhook in configuration.body.get('webhooks') or []:
                if isinstance(webhook, dict) and self._applies(webhook, request):
                    yield webhook

    def _applies(self, webhook: dict[str, Any], request: AdmissionRequest) -> bool:
        rules = webhook.get('rules') or []
        if not any(isinstance(rule, dict) and _rule_matches(rule, request) for rule in rules):
            return False
        object_selector = selectors.label_selector_from_struct(webhook.get('objectSelector'))
        if object_selector is None:
            return False
        if object_selector:
            candidates = [obj for obj in (request.obj, request.old_obj) if obj is not None]
            if not any(
                selectors.labels_match(object_selector, obj.get('metadata', {}).get('labels'))
                for obj in candidates
            ):
                return False
        namespace_selector = selectors.label_selector_from_struct(webhook.get('namespaceSelector'))
        if namespace_selector is None:
            return False
        if namespace_selector:
            if request.info.storage_key == NAMESPACES.storage_key:
                subject = request.obj or request.old_obj or {}
                labels = subject.get('metadata', {}).get('labels')
            elif request.info.namespaced and request.namespace:
                namespace = self._store.get(NAMESPACES.storage_key, None, request.namespace)
                labels = namespace.body['metadata'].get('labels') if namespace is not None else None
            else:
                return True  # cluster-scoped objects are not filtered by namespaces
            if not selectors.labels_match(namespace_selector, labels):
                return False
        return True

    async def _review(
        self, webhook: dict[str, Any], request: AdmissionRequest, warnings: list[str]
    ) -> dict[str, Any] | None:
        """Call one webhook; return its response if it allowed the request, ``None`` if ignored."""
        name = str(webhook.get('name', ''))
        try:
            response = await self._call(webhook, request)
        except _WebhookFailure as e:
            if webhook.get('failurePolicy', 'Fail') == 'Ignore':
                logger.warning('Ignoring the failure of the webhook %r: %s', name, e)
                return None
            raise errors.internal_error(f'failed calling webhook "{name}": {e}') from None
        warnings.extend(str(warning) for warning in response.get('warnings') or [])
        if not response.get('allowed'):
            raise _denial(name, response.get('status'))
        return response

    async def _call(self, webhook: dict[str, Any], request: AdmissionRequest) -> dict[str, Any]:
        client_config = webhook.get('clientConfig') or {}
        url = client_config.get('url')
        service = client_config.get('service')
        if not url and isinstance(service, dict):
            url = (
                f'https://{service.get("name")}.{service.get("namespace")}.svc:{service.get("port", 443)}'
                f'{service.get("path", "")}'
            )
        if not url:
            raise _WebhookFailure('the webhook has neither a URL nor a service')
        review_versions = webhook.get('admissionReviewVersions') or ['v1']
        review_version = (
            'v1' if 'v1' in review_versions else 'v1beta1' if 'v1beta1' in review_versions else None
        )
        if review_version is None:
            raise _WebhookFailure(f'no supported AdmissionReview version in {review_versions!r}')
        timeout = float(webhook.get('timeoutSeconds') or 10)
        request_uid = str(uuid.uuid4())
        review = {
            'apiVersion': f'admission.k8s.io/{review_version}',
            'kind': 'AdmissionReview',
            'request': self._request_payload(request, request_uid),
        }
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            ssl_context = (
                self._ssl_context(str(client_config.get('caBundle') or ''))
                if url.startswith('https:')
                else None
            )
            async with self._session.post(
                url,
                json=review,
                ssl=ssl_context if ssl_context is not None else True,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                if response.status != 200:
                    raise _WebhookFailure(f'the server responded with HTTP {response.status}')
                answer = await response.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ssl.SSLError, ValueError, OSError) as e:
            raise _WebhookFailure(f'failed to call webhook: Post "{url}": {e or type(e).__name__}') from None
        result = answer.get('response') if isinstance(answer, dict) else None
        if not isinstance(result, dict):
            raise _WebhookFailure('the webhook response has no "response" object')
        if result.get('uid') != request_uid:
            raise _WebhookFailure(f'expected response.uid="{request_uid}", got "{result.get("uid")}"')
        return result

    def _request_payload(self, request: AdmissionRequest, uid: str) -> dict[str, Any]:
        info = request.info
        kind = {'group': info.group, 'version': info.version, 'kind': info.kind}
        resource = {'group': info.group, 'version': info.version, 'resource': info.plural}
        payload: dict[str, Any] = {
            'uid': uid,
            'kind': kind,
            'resource': resource,
            'requestKind': kind,
            'requestResource': resource,
            'name': request.name,
            'operation': request.operation,
            'userInfo': _USER_INFO,
            'object': request.obj,
            'oldObject': request.old_obj,
            'dryRun': request.dry_run,
            'options': request.options,
        }
        if request.namespace:
            payload['namespace'] = request.namespace
        if request.subresource:
            payload['subResource'] = payload['requestSubResource'] = request.subresource
        return payload

    def _ssl_context(self, ca_bundle: str) -> ssl.SSLContext:
        context = self._ssl_contexts.get(ca_bundle)
        if context is None:
            if ca_bundle:
                try:
                    pem = base64.b64decode(ca_bundle).decode()
                except (ValueError, binascii.Error) as e:
                    raise _WebhookFailure(f'the caBundle is not valid base64: {e}') from None
                context = ssl.create_default_context(cadata=pem)
            else:
                context = ssl.create_default_context()
            # As kube-apiserver (Go) verifies the webhooks, on every Python: partial chains, no RFC strictness
            # (the same flags as kopf._cogs.helpers.tls, which this self-contained server does not import).
            context.verify_flags &= ~ssl.VERIFY_X509_STRICT
            context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
            self._ssl_contexts[ca_bundle] = context
        return context


def _rule_matches(rule: dict[str, Any], request: AdmissionRequest) -> bool:
    info = request.info
    operations = rule.get('operations') or []
    if '*' not in operations and request.operation not in operations:
        return False
    groups = rule.get('apiGroups') or []
    if '*' not in groups and info.group not in groups:
        return False
    versions = rule.get('apiVersions') or []
    if '*' not in versions and info.version not in versions:
        return False
    scope = rule.get('scope', '*')
    if (scope == 'Cluster' and info.namespaced) or (scope == 'Namespaced' and not info.namespaced):
        return False
    wanted_subresource = request.subresource or ''
    for pattern in rule.get('resources') or []:
        resource, _, subresource = str(pattern).partition('/')
        if resource not in ('*', info.plural):
            continue
        if subresource == '*' or subresource == wanted_subresource:
            return True
    return False


def _denial(name: str, status: Any) -> errors.ApiError:
    """The error of a denied request, worded as real API servers word it."""
    status = status if isinstance(status, dict) else {}
    code = status.get('code') if isinstance(status.get('code'), int) else 0
    code = code if code >= 400 else 400
    prefix = f'admission webhook "{name}" denied the request'
    if status.get('message'):
        message = f'{prefix}: {status["message"]}'
    elif status.get('reason'):
        message = f'{prefix}: {status["reason"]}'
    else:
        message = f'{prefix} without explanation'
    return errors.ApiError(code, message, reason=status.get('reason') or None, details=status.get('details'))
