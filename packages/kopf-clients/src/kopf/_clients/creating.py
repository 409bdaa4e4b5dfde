"""Creating objects."""
import logging
from collections.abc import Mapping
from typing import Any, cast

from kopf._clients import api
from kopf._clients.vault import Vault
from kopf._cogs.aiokits.backoffs import BackoffsSpec
from kopf._cogs.configs.networking import ClientSettings
from kopf._cogs.structs.bodies import RawBody
from kopf._cogs.structs.references import Resource

default_logger = logging.getLogger(__name__)


async def create_obj(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        body: Mapping[str, Any],
        namespace: str | None = None,
        backoffs: BackoffsSpec | None = None,
        logger: api.Logger | None = None,
) -> RawBody:
    """
    Create an object and return it as stored by the server.

    The namespace, if not given, is taken from the body's metadata (for namespaced resources).
    An existing object with the same name raises :class:`~kopf._clients.errors.APIConflictError`.
    ``backoffs`` replace the settings' retries for this call (e.g. none, for a caller with a deadline).
    """
    if namespace is None and resource.namespaced:
        namespace = body.get('metadata', {}).get('namespace')
    if namespace is None and resource.namespaced:
        raise ValueError(f'Namespaced objects of {resource} need a namespace to be created in.')
    url = resource.get_url(namespace=namespace)
    data = await api.request('POST', url, payload=dict(body), settings=settings, vault=vault,
                             backoffs=backoffs, logger=logger if logger is not None else default_logger)
    return cast(RawBody, data)
