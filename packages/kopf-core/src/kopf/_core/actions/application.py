"""
Applying the accumulated changes to an object, and waking the object's handling up after the delays.

All the changes of a handling cycle are accumulated into one :class:`kopf.Patch`: the handlers'
own changes (``patch`` kwarg), the progress of the handlers, their results in the status,
the diff-base (the last handled essence), the finalizers, the cleanup of the "touch" marker.
:func:`apply_patch` sends it with as few requests as the API allows:

* the merge-patch without ``status``: one request to the object's main endpoint;
* the ``status`` of the merge-patch: one request to the ``/status`` endpoint if the resource has
  the status subresource (the API ignores the status changes sent to the main endpoint then,
  and the other changes sent to ``/status``); otherwise, it goes with the main request;
* the transformation functions (``patch.fns``): one JSON-patch, computed against the body
  returned by the previous request (or the original one), guarded by its ``resourceVersion``,
  so that the positions in lists are never applied to a changed object. Its operations on
  ``/status`` go to the status endpoint (the client splits them).

So, a successful handler with no result costs 1 request (its progress and the diff-base go together);
with a result, 2 requests for resources with the status subresource (1 without). The results cannot go
to the main endpoint in the same request: it is the API server that ignores them there.

The delayed handlers are retried by "touching" the object after the sleep (a dummy annotation
or status field, per the progress storage), which causes a new watch-event and a new cycle.
The sleep is interrupted by any new event of the object, which starts a new cycle anyway.
"""
import asyncio
import copy
import datetime
import logging
from collections.abc import Collection, Mapping
from typing import Any

from kopf._clients.patching import json_patch_obj, patch_obj, split_merge_patch
from kopf._clients.vault import Vault
from kopf._cogs.helpers.typedefs import Logger
from kopf._cogs.structs.bodies import Body, RawBody
from kopf._cogs.structs.patches import Patch
from kopf._cogs.structs.references import Resource
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.persistence.progress import ProgressStorage

__all__ = [
    'apply_patch',
    'combine_patches',
    'sleep',
    'sleep_for_delays',
    'sleep_then_touch',
    'touch',
]


async def apply_patch(
        *,
        settings: OperatorSettings,
        vault: Vault,
        resource: Resource,
        body: Mapping[str, Any],
        patch: Patch,
        logger: Logger,
) -> RawBody | None:
    """
    Apply the patch to the object; return the object as patched, or None if it does not exist anymore.

    An empty patch sends nothing and returns the body as it is (as a raw dict).
    The API errors other than "not found" (e.g. a conflict of the guarded JSON-patch) propagate.
    """
    meta = body.get('metadata', {})
    namespace: str | None = meta.get('namespace')
    name: str = meta.get('name', '')
    current: RawBody | None = None  # the unpatched body is unwrapped only if needed (rarely)

    main, status = split_merge_patch(resource, patch)
    for part, subject in [(main, 'resource'), (status, 'status')]:
        if part:
            if logger.isEnabledFor(logging.DEBUG):  # the patches can be big; the debug logs are usually off
                logger.debug(f'Merge-patching the {subject} with: {part}')
            patched = await patch_obj(settings=settings, vault=vault, resource=resource,
                                      namespace=namespace, name=name, patch=part, logger=logger)
            if patched is None:
                return None
            current = patched

    if patch.fns:
        transformations = Patch(body=current if current is not None else _as_raw(body))
        transformations.fns = list(patch.fns)
        operations = transformations.as_json_patch()
        if operations:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(f'JSON-patching the resource with: {operations}')
            patched = await json_patch_obj(settings=settings, vault=vault, resource=resource,
                                           namespace=namespace, name=name, patch=operations, logger=logger)
            if patched is None:
                return None
            current = patched

    return current if current is not None else _as_raw(body)


def _as_raw(body: Mapping[str, Any]) -> RawBody:
    # A live view (kopf.Body) is unwrapped into a plain dict; nested values are raw already.
    return dict(body.items())  # type: ignore[return-value]


def combine_patches(*patches: Patch) -> Patch:
    """
    Combine several patches into one, as if they were applied one after another.

    The later values win; nested mappings are merged; the functions are concatenated in order.
    Not every sequence of merge-patches can be expressed as one: if a patch removes a mapping
    (``None``) and a later one puts a mapping there, the removal would be lost in the combination
    (a mapping in a merge-patch is merged into the existing value, never replaces it);
    a ``ValueError`` is raised then, so that the caller applies them separately.
    """
    combined = Patch(body=patches[0].body if patches else None)
    for patch in patches:
        _merge_patch_into(combined, patch, path=())
        combined.fns.extend(patch.fns)
    return combined


def _merge_patch_into(target: dict[str, Any], patch: Mapping[str, Any], *, path: tuple[str, ...]) -> None:
    for key, value in patch.items():
        if isinstance(value, Mapping):
            existing = target.get(key, ...)
            if existing is None:
                where = '.'.join((*path, key))
                raise ValueError(f'Cannot combine the patches: {where!r} is removed and then patched.')
            if not isinstance(existing, dict):
                existing = target[key] = {}
            _merge_patch_into(existing, value, path=(*path, key))
        else:
            target[key] = copy.deepcopy(value)


async def sleep(delay: float, wakeup: asyncio.Event | None = None) -> float | None:
    """
    Sleep for the delay unless woken up earlier: return the seconds left then, or None if fully slept.

    An already set event interrupts the sleep immediately. The event is not cleared here.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    if wakeup is None:
        await asyncio.sleep(max(0.0, delay))
        return None
    if wakeup.is_set():
        return delay
    try:
        await asyncio.wait_for(wakeup.wait(), timeout=max(0.0, delay))
    except TimeoutError:
        return None
    return delay - (loop.time() - started)


async def sleep_for_delays(
        *,
        delays: Collection[float],
        wakeup: asyncio.Event | None,
        patched: bool,
        logger: Logger,
) -> bool:
    """
    Wait for the nearest of the delayed handlers; return True if the object must be touched now.

    No waiting is needed if there are no delays, or if the object has just been patched
    (the patch causes a new event, which starts a new cycle, which will wait for the rest of it),
    or if a new event of the object arrives meanwhile (``wakeup``).
    """
    if not delays:
        return False
    delay = min(delays)
    if patched:
        logger.debug(f'Sleeping was skipped because of the patch, {delay} seconds left.')
        return False
    logger.debug(f'Sleeping for {delay} seconds for the delayed handlers.')
    left = await sleep(delay, wakeup)
    if left is not None:
        logger.debug(f'Sleeping was interrupted by new changes, {left} seconds left.')
        return False
    return True


async def touch(
        *,
        settings: OperatorSettings,
        vault: Vault,
        resource: Resource,
        body: Body,
        storage: ProgressStorage,
        logger: Logger,
) -> RawBody | None:
    """Touch the object (via the storage's dummy marker) to get a new watch-event for it."""
    patch = Patch(body=body)
    storage.touch(body=body, patch=patch, value=datetime.datetime.now(datetime.UTC).isoformat())
    return await apply_patch(settings=settings, vault=vault, resource=resource,
                             body=body, patch=patch, logger=logger)


async def sleep_then_touch(
        *,
        settings: OperatorSettings,
        vault: Vault,
        resource: Resource,
        body: Body,
        storage: ProgressStorage,
        delays: Collection[float],
        wakeup: asyncio.Event | None,
        patched: bool,
        logger: Logger,
) -> None:
    """The end of a cycle with unfinished handlers: sleep for the delays if needed, then touch the object."""
    if await sleep_for_delays(delays=delays, wakeup=wakeup, patched=patched, logger=logger):
        await touch(settings=settings, vault=vault, resource=resource,
                    body=body, storage=storage, logger=logger)
