"""
The API calls of the operators' coordination: the peering objects and the Leases.

These objects are not the objects the operator handles, so their writes do not go through the object
writer of the framework: they are small documents that the coordinators own (a peer's own record in
a peering object, the holder of a Lease). The optimistic concurrency (``resourceVersion`` in the body,
HTTP 409 on a conflict) is the callers' business.
"""
import logging
from collections.abc import Collection, Mapping
from typing import Any, cast

from kopf._clients import api, errors
from kopf._clients.vault import Vault
from kopf._cogs.aiokits.backoffs import BackoffsSpec
from kopf._cogs.configs.networking import ClientSettings
from kopf._cogs.structs.bodies import RawBody
from kopf._cogs.structs.references import Resource

default_logger = logging.getLogger(__name__)


async def is_served(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        logger: api.Logger | None = None,
) -> bool:
    """Whether the cluster serves the resource at all (e.g. its CRD exists): a listing of one item."""
    url = resource.get_url(namespace=namespace)
    try:
        await api.request('GET', url, params={'limit': '1'}, settings=settings, vault=vault,
                          logger=logger if logger is not None else default_logger)
    except errors.APINotFoundError:
        return False
    return True


async def merge_patch(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        logger: api.Logger | None = None,
) -> RawBody:
    """Merge-patch the object itself (not its subresources), whatever fields the patch touches."""
    url = resource.get_url(namespace=namespace, name=name)
    data = await api.request('PATCH', url, payload=dict(patch), content_type='application/merge-patch+json',
                             settings=settings, vault=vault,
                             logger=logger if logger is not None else default_logger)
    return cast(RawBody, data)


async def replace(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        backoffs: BackoffsSpec | None = None,
        no_retry_statuses: Collection[int] = (),
        logger: api.Logger | None = None,
) -> RawBody:
    """
    Replace the object (PUT); with ``metadata.resourceVersion`` in the body, a concurrent change
    raises :class:`~kopf._clients.errors.APIConflictError`.
    """
    url = resource.get_url(namespace=namespace, name=name)
    data = await api.request('PUT', url, payload=dict(body), settings=settings, vault=vault,
                             backoffs=backoffs, no_retry_statuses=no_retry_statuses,
                             logger=logger if logger is not None else default_logger)
    return cast(RawBody, data)


async def list_labelled(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        labels: Mapping[str, str],
        backoffs: BackoffsSpec | None = None,
        logger: api.Logger | None = None,
) -> list[RawBody]:
    """
    The objects with these labels (one page: the coordination's objects are few), e.g. a sharding's Leases.

    Not by the settings' selectors of the watched resources (``settings.watching``): they are not for these.
    """
    url = resource.get_url(namespace=namespace)
    selector = ','.join(f'{key}={value}' for key, value in labels.items())
    data = await api.request('GET', url, params={'labelSelector': selector}, settings=settings, vault=vault,
                             backoffs=backoffs, logger=logger if logger is not None else default_logger)
    items = data.get('items') if isinstance(data, Mapping) else None
    return [cast(RawBody, item) for item in items or [] if isinstance(item, dict)]
