"""
Patching objects: with JSON merge-patches or with JSON-patches (RFC 6902).

If the resource has the ``status`` subresource, the API ignores the changes of ``status``
sent to the main endpoint, and the changes of everything else sent to the ``/status`` endpoint.
So the patch is split: the ``status`` part goes to ``/status``, the rest goes to the main endpoint
(first), and the body returned by the last request is returned, i.e. the object with both parts applied.
Resources without the ``status`` subresource get the whole patch at the main endpoint.

A missing object (HTTP 404) is not an error here: the object could be deleted while it was being
handled, and there is nothing to patch then. The functions return None in that case.
"""
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kopf._clients import api, errors
from kopf._clients.vault import Vault
from kopf._cogs.aiokits.capacity import Hold
from kopf._cogs.configs.networking import ClientSettings
from kopf._cogs.structs.bodies import RawBody
from kopf._cogs.structs.references import Resource

default_logger = logging.getLogger(__name__)

MERGE_PATCH = 'application/merge-patch+json'
JSON_PATCH = 'application/json-patch+json'


def split_merge_patch(
        resource: Resource,
        patch: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a merge-patch into the parts for the main endpoint and for ``/status`` (maybe empty)."""
    if 'status' not in resource.subresources or 'status' not in patch:
        return dict(patch), {}
    if len(patch) == 1:  # the status alone: e.g. a timer's result, or the status part split already
        return {}, {'status': patch['status']}
    main = {key: value for key, value in patch.items() if key != 'status'}
    return main, {'status': patch['status']}


def _touches_status(operation: Mapping[str, Any]) -> bool:
    path = str(operation.get('path', ''))
    return path == '/status' or path.startswith('/status/')


def split_json_patch(
        resource: Resource,
        patch: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split a JSON-patch into the operations for the main endpoint and for ``/status`` by their paths."""
    if 'status' not in resource.subresources:
        return [dict(op) for op in patch], []
    main = [dict(op) for op in patch if not _touches_status(op)]
    status = [dict(op) for op in patch if _touches_status(op)]
    return main, status


async def _patch_parts(
        parts: Sequence[tuple[str | None, object]],
        *,
        content_type: str,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        name: str,
        logger: api.Logger,
        seat: Hold | None,
        version_only: bool = False,
) -> RawBody | None:
    body: RawBody | None = None
    for subresource, payload in parts:
        url = resource.get_url(namespace=namespace, name=name, subresource=subresource)
        try:
            answer = await api.request('PATCH', url, payload=payload, content_type=content_type,
                                       settings=settings, vault=vault, logger=logger, seat=seat,
                                       decode=api.decode_version if version_only else True)
            if not version_only:
                body = answer
            else:
                body = {'metadata': {'resourceVersion': answer} if answer is not None else {}}
        except errors.APINotFoundError:
            logger.debug(f'The object {name!r} of {resource} does not exist anymore; nothing to patch.')
            return None
    return body


async def patch_obj(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        logger: api.Logger | None = None,
        seat: Hold | None = None,
        version_only: bool = False,
) -> RawBody | None:
    """
    Apply a JSON merge-patch to an object; return the patched object (None if it does not exist).

    An empty patch makes no requests and returns None. The caller's ``seat`` is lent while the requests wait
    for the server (see :func:`kopf._clients.api.request`). With ``version_only``, the object in the response
    is not decoded beyond its version (:func:`kopf._clients.api.decode_version`): the returned body has only
    ``metadata.resourceVersion``, e.g. for the callers that only recognise the echo of their own patch.
    """
    main, status = split_merge_patch(resource, patch)
    parts: list[tuple[str | None, object]] = []
    if main:
        parts.append((None, main))
    if status:
        parts.append(('status', status))
    return await _patch_parts(parts, content_type=MERGE_PATCH, settings=settings, vault=vault,
                              resource=resource, namespace=namespace, name=name,
                              logger=logger if logger is not None else default_logger, seat=seat,
                              version_only=version_only)


async def json_patch_obj(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Sequence[Mapping[str, Any]],
        logger: api.Logger | None = None,
        seat: Hold | None = None,
) -> RawBody | None:
    """
    Apply a JSON-patch (a list of operations) to an object; return the patched object (or None).

    The operations are routed by their paths: those under ``/status`` go to the status subresource.
    An empty patch makes no requests and returns None.
    """
    main, status = split_json_patch(resource, patch)
    parts: list[tuple[str | None, object]] = []
    if main:
        parts.append((None, main))
    if status:
        parts.append(('status', status))
    return await _patch_parts(parts, content_type=JSON_PATCH, settings=settings, vault=vault,
                              resource=resource, namespace=namespace, name=name,
                              logger=logger if logger is not None else default_logger, seat=seat)
