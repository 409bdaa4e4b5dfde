"""
Reading objects: one object by its name, or all objects of a resource page by page.

Listing applies the server-side selectors configured for the resource in
``settings.watching.label_selectors``, ``field_selectors``, and ``shard_selectors``,
and fetches the objects in pages of ``settings.watching.chunk_size`` (all at once if None), handed over
as they come (:func:`list_pages`) or all together (:func:`list_objs`).

The sharding's ``shardSelector`` (the ranges of the uids' hashes, KEP-5866) is given by the caller;
the servers that apply it say so in the list's ``metadata.shardInfo`` (the others ignore it silently).
"""
import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Mapping
from typing import Any, cast

from kopf._clients import api, errors
from kopf._clients.vault import Vault
from kopf._cogs.aiokits.backoffs import BackoffsSpec
from kopf._cogs.configs.networking import ClientSettings, get_selectors
from kopf._cogs.structs.bodies import RawBody
from kopf._cogs.structs.references import EVERYTHING, Resource

default_logger = logging.getLogger(__name__)


def _resource_names(resource: Resource) -> list[str]:
    # The most specific names first: a selector for "pods" must win over one for EVERYTHING.
    names = [resource.name, f'{resource.plural}.{resource.version}.{resource.group}'.strip('.'),
             resource.plural]
    if resource.kind:
        names.append(resource.kind)
    if resource.singular:
        names.append(resource.singular)
    names.extend(sorted(resource.shortcuts))
    return names


def render_selector(selector: Any) -> str | None:
    """
    Render a selector into the query-string syntax of the API.

    A string goes as is. A mapping of labels renders ``key=value`` for values, a bare ``key``
    (the label must exist) for ``None`` and ``True``, ``!key`` (must not exist) for ``False``,
    and ``key in (a,b)`` for collections of values. A collection of strings is joined with commas.
    """
    if selector is None:
        return None
    elif isinstance(selector, str):
        return selector or None
    elif isinstance(selector, Mapping):
        parts: list[str] = []
        for key, value in selector.items():
            if value is None or value is True:
                parts.append(str(key))
            elif value is False:
                parts.append(f'!{key}')
            elif isinstance(value, str):
                parts.append(f'{key}={value}')
            elif isinstance(value, Iterable):
                parts.append(f'{key} in ({",".join(str(v) for v in value)})')
            else:
                parts.append(f'{key}={value}')
        return ','.join(parts) or None
    elif isinstance(selector, Iterable):
        return ','.join(str(part) for part in selector) or None
    else:
        raise TypeError(f'Unsupported selector: {selector!r}')


def _find_selector(mapping: Mapping[Any, Any], resource: Resource) -> str | None:
    selector = get_selectors(mapping, _resource_names(resource))
    if selector is None and EVERYTHING in mapping:
        selector = mapping[EVERYTHING]
    return render_selector(selector)


def build_selector_params(settings: ClientSettings, resource: Resource) -> dict[str, str]:
    """The ``labelSelector`` & ``fieldSelector`` query params for the resource, as configured."""
    params: dict[str, str] = {}
    label_selectors = [
        _find_selector(settings.watching.label_selectors, resource),
        _find_selector(settings.watching.shard_selectors, resource),
    ]
    label_selector = ','.join(selector for selector in label_selectors if selector)
    field_selector = _find_selector(settings.watching.field_selectors, resource)
    if label_selector:
        params['labelSelector'] = label_selector
    if field_selector:
        params['fieldSelector'] = field_selector
    return params


def _complete_item(item: dict[str, Any], *, api_version: str, kind: str | None) -> RawBody:
    # Items of lists come without apiVersion & kind, unlike the objects of watch-streams.
    # Add them, so that the consumers see the same shape of objects from both sources.
    item.setdefault('apiVersion', api_version)
    if kind:
        item.setdefault('kind', kind)
    return cast(RawBody, item)


async def read_obj(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        name: str,
        backoffs: BackoffsSpec | None = None,
        logger: api.Logger | None = None,
) -> RawBody:
    """
    Read one object; a missing one raises :class:`~kopf._clients.errors.APINotFoundError`.

    ``backoffs`` replace the settings' retries for this call (e.g. none, for a caller with a deadline).
    """
    url = resource.get_url(namespace=namespace, name=name)
    data = await api.request('GET', url, settings=settings, vault=vault, backoffs=backoffs, logger=logger)
    return cast(RawBody, data)


@dataclasses.dataclass(frozen=True)
class ListedPage:
    """A page of a listing (:func:`list_pages`)."""

    items: list[RawBody]
    resource_version: str | None
    """The listing's resource version (as of its last page so far): a watch-stream can start from it."""
    first: bool
    """The first page of the listing, or of its restart: the earlier pages (if any) are void then."""


async def list_pages(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        logger: api.Logger | None = None,
        shard_selector: str | None = None,
        on_shard_info: Callable[[str | None], None] | None = None,
) -> AsyncGenerator[ListedPage, None]:
    """
    List all objects of a resource in a namespace (or cluster-wide with None), page by page as they come.

    If the continuation token of the pages expires midway (HTTP 410), the listing restarts from the first
    page (yielded with ``first=True``): the pages are consistent only together, so the consumer must void
    the pages it has got before. The next page is requested while the consumer handles the current one
    (one page ahead; cancelled if the consumer stops early).

    ``shard_selector`` goes with every page (the continuation tokens do not keep it); ``on_shard_info``
    gets the selector that the server says it has applied (``metadata.shardInfo.selector`` of the first
    page), or None if it says nothing (it might have applied it anyway: e.g. to custom resources).
    """
    actual_logger: api.Logger = logger if logger is not None else default_logger
    url = resource.get_url(namespace=namespace)
    params = build_selector_params(settings, resource)
    if shard_selector:
        params['shardSelector'] = shard_selector
    shard_info_told = False
    chunk_size = settings.watching.chunk_size
    if chunk_size:
        params['limit'] = str(int(chunk_size))

    def request_page(token: str | None, *, decode: bool = True) -> Coroutine[Any, Any, Any]:
        page_params = dict(params, **({'continue': token} if token else {}))
        return api.request('GET', url, params=page_params, settings=settings, vault=vault,
                           logger=actual_logger, decode=decode)

    resource_version: str | None = None
    continue_token: str | None = None
    first = True
    next_page: asyncio.Task[Any] | None = None  # requested ahead, while the consumer handles the current page
    try:
        while True:
            ahead, next_page = next_page, None
            try:
                if ahead is None:
                    data = await request_page(continue_token)
                else:
                    response = await ahead
                    try:
                        data = api.decode_response(response)
                    except errors.APINonJSONResponseError as e:
                        actual_logger.warning(f'The page of {resource} requested ahead is not JSON; '
                                              f'requesting it again: {e}')
                        data = await request_page(continue_token)  # retried as any response is
                    del response
            except errors.APIGoneError:
                if continue_token is None:
                    raise
                actual_logger.warning(f'The listing of {resource} has expired midway; restarting it.')
                continue_token, first = None, True
                continue

            data = data if isinstance(data, Mapping) else {}
            list_kind = data.get('kind')
            item_kind = resource.kind or (list_kind[:-4] if isinstance(list_kind, str) and
                                          list_kind.endswith('List') else None)
            items = [_complete_item(item, api_version=resource.api_version, kind=item_kind)
                     for item in data.get('items') or [] if isinstance(item, dict)]

            metadata = data.get('metadata') or {}
            if on_shard_info is not None and shard_selector and not shard_info_told:
                shard_info_told = True
                shard_info = metadata.get('shardInfo')
                selector = shard_info.get('selector') if isinstance(shard_info, Mapping) else None
                on_shard_info(selector if isinstance(selector, str) and selector else None)
            resource_version = metadata.get('resourceVersion') or resource_version
            continue_token = metadata.get('continue') or None
            del data, metadata  # not kept while the consumer handles the page
            if continue_token is not None:
                # The server prepares the next page while the consumer handles this one (as client-go's pager
                # buffers its pages); one page ahead at most. The request is sent before the consumer goes on.
                # Its body is decoded only when consumed: its objects made among this page's long-lived ones
                # (e.g. the consumer's records of them) would keep more memory after both pages are gone.
                next_page = asyncio.create_task(request_page(continue_token, decode=False))
                await asyncio.sleep(0)
            yield ListedPage(items=items, resource_version=resource_version, first=first)
            first = False
            if continue_token is None:
                return
    finally:
        if next_page is not None:  # the consumer has stopped early: the page is not needed
            next_page.cancel()  # if already failed (e.g. 410), no warning about the error that nobody sees


async def list_objs(
        *,
        settings: ClientSettings,
        vault: Vault,
        resource: Resource,
        namespace: str | None,
        logger: api.Logger | None = None,
        shard_selector: str | None = None,
        on_shard_info: Callable[[str | None], None] | None = None,
) -> tuple[list[RawBody], str | None]:
    """
    List all objects of a resource in a namespace (or cluster-wide with None), following the pages.

    Returns the objects and the resource version of the list: a watch-stream can start from it
    to see all changes after the listing. If the continuation token of the pages expires midway
    (HTTP 410), the listing restarts from the first page: the pages are consistent only together.
    See :func:`list_pages` for the selectors.
    """
    items: list[RawBody] = []
    resource_version: str | None = None
    pages = list_pages(settings=settings, vault=vault, resource=resource, namespace=namespace, logger=logger,
                       shard_selector=shard_selector, on_shard_info=on_shard_info)
    async with contextlib.aclosing(pages):
        async for page in pages:
            if page.first:
                items = []
            items.extend(page.items)
            resource_version = page.resource_version
    return items, resource_version
