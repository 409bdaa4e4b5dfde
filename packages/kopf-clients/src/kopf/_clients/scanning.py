"""
Discovery of the cluster's API: which resources exist, in which groups & versions, and namespaces.

The core API (``/api``, ``/api/v1``) and the named groups (``/apis``, ``/apis/{group}/{version}``)
are scanned into :class:`Resource` objects with all the names a resource can be referred by
(plural, singular, kind, short names, categories), its scope, verbs, and subresources.

Aggregated API groups (served by extension servers, e.g. metrics) can be temporarily unavailable
and respond with HTTP 503: such groups are skipped with a warning instead of failing the whole scan.
Groups that disappear between listing them and scanning them (HTTP 404) are skipped silently.
"""
import asyncio
import logging
from collections.abc import Collection, Mapping
from typing import Any

from kopf._clients import api, errors, fetching
from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import ClientSettings
from kopf._cogs.structs.references import Resource

default_logger = logging.getLogger(__name__)

NAMESPACES = Resource('', 'v1', 'namespaces', kind='Namespace', singular='namespace',
                      shortcuts=frozenset({'ns'}), namespaced=False,
                      verbs=frozenset({'list', 'watch', 'get'}))


def parse_resource_list(
        data: Mapping[str, Any],
        *,
        group: str,
        version: str,
        preferred: bool,
) -> list[Resource]:
    """
    Convert an ``APIResourceList`` into resources; ``plural/sub`` entries become subresources.

    The API sometimes reports an empty singular name (older clusters, core resources):
    then the lowercased kind is used, as kubectl does.
    """
    entries = [entry for entry in data.get('resources') or [] if isinstance(entry, Mapping)]
    subresources: dict[str, set[str]] = {}
    for entry in entries:
        name = str(entry.get('name', ''))
        if '/' in name:
            plural, subresource = name.split('/', 1)
            subresources.setdefault(plural, set()).add(subresource)

    resources: list[Resource] = []
    for entry in entries:
        name = str(entry.get('name', ''))
        if not name or '/' in name:
            continue
        kind = entry.get('kind') or None
        singular = entry.get('singularName') or (kind.lower() if kind else None)
        resources.append(Resource(
            group=group,
            version=version,
            plural=name,
            kind=kind,
            singular=singular,
            shortcuts=frozenset(entry.get('shortNames') or ()),
            categories=frozenset(entry.get('categories') or ()),
            subresources=frozenset(subresources.get(name, ())),
            namespaced=bool(entry.get('namespaced', False)),
            preferred=preferred,
            verbs=frozenset(entry.get('verbs') or ()),
        ))
    return resources


async def _scan_group_version(
        path: str,
        *,
        group: str,
        version: str,
        preferred: bool,
        settings: ClientSettings,
        vault: Vault,
        logger: api.Logger,
) -> list[Resource]:
    try:
        data = await api.request('GET', path, settings=settings, vault=vault, logger=logger,
                                 no_retry_statuses={503})
    except errors.APINotFoundError:
        logger.debug(f'The API {path} has disappeared while scanning; skipping it.')
        return []
    except errors.APIServerError as e:
        if e.status != 503:
            raise
        logger.warning(f'The API {path} is unavailable (HTTP 503); skipping its resources for now.')
        return []
    if not isinstance(data, Mapping):
        return []
    return parse_resource_list(data, group=group, version=version, preferred=preferred)


async def scan_resources(
        *,
        settings: ClientSettings,
        vault: Vault,
        groups: Collection[str] | None = None,
        logger: api.Logger | None = None,
) -> list[Resource]:
    """
    Discover all resources of the cluster (or only of the given groups; ``''`` is the core API).

    All versions of every group are scanned; the resources of the group's preferred version
    have ``preferred=True``, others have ``preferred=False``.
    """
    actual_logger: api.Logger = logger if logger is not None else default_logger
    scans: list[tuple[str, str, str, bool]] = []  # path, group, version, preferred

    if groups is None or '' in groups:
        core = await api.request('GET', '/api', settings=settings, vault=vault, logger=actual_logger)
        versions = [str(v) for v in (core or {}).get('versions') or []]
        for index, version in enumerate(versions):
            scans.append((f'/api/{version}', '', version, index == 0))

    if groups is None or any(group for group in groups):
        data = await api.request('GET', '/apis', settings=settings, vault=vault, logger=actual_logger)
        for group_info in (data or {}).get('groups') or []:
            group = str(group_info.get('name', ''))
            if not group or (groups is not None and group not in groups):
                continue
            preferred_version = (group_info.get('preferredVersion') or {}).get('version')
            for version_info in group_info.get('versions') or []:
                version = str(version_info.get('version', ''))
                if version:
                    scans.append((f'/apis/{group}/{version}', group, version, version == preferred_version))

    # Dozens of group-versions at most: scanning them concurrently saves a lot of time at startup.
    results = await asyncio.gather(*[
        _scan_group_version(path, group=group, version=version, preferred=preferred,
                            settings=settings, vault=vault, logger=actual_logger)
        for path, group, version, preferred in scans
    ])
    return [resource for result in results for resource in result]


async def list_namespaces(
        *,
        settings: ClientSettings,
        vault: Vault,
        logger: api.Logger | None = None,
) -> list[str]:
    """List the names of all namespaces of the cluster (all pages, if paginated)."""
    objs, _ = await fetching.list_objs(settings=settings, vault=vault, resource=NAMESPACES,
                                       namespace=None, logger=logger)
    return [str(obj.get('metadata', {}).get('name')) for obj in objs if obj.get('metadata', {}).get('name')]
