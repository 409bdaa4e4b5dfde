"""Deleting objects."""
import logging
from collections.abc import Mapping
from typing import Any, cast

from kopf._clients import api, errors
from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import ClientSettings
from kopf._cogs.structs.bodies import RawBody
from kopf._cogs.structs.references import Resource

default_logger = logging.getLogger(__name__)


async def delete_obj(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        name: str,
        options: Mapping[str, Any] | None = None,
        logger: api.Logger | None = None,
) -> RawBody | None:
    """
    Delete an object; return what the server returns (the object or a status), or None if it is gone.

    ``options`` is a ``DeleteOptions`` body, e.g. ``{'propagationPolicy': 'Foreground'}``.
    A missing object (HTTP 404) is not an error: the goal of having no such object is achieved.
    """
    actual_logger: api.Logger = logger if logger is not None else default_logger
    url = resource.get_url(namespace=namespace, name=name)
    payload = dict(options) if options is not None else None
    try:
        data = await api.request('DELETE', url, payload=payload, settings=settings, vault=vault,
                                 logger=actual_logger)
    except errors.APINotFoundError:
        actual_logger.debug(f'The object {name!r} of {resource} does not exist already; nothing to delete.')
        return None
    return cast(RawBody, data)
