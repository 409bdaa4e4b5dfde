"""
The object writer: the one way a change reaches an object, for every caller of the framework.

Every caller (the change handling, the event-watching handlers, the daemons and timers, the touches
after the delays) accumulates its changes into one :class:`kopf.Patch` and hands it to
:func:`apply_patch`, which sends it with as few requests as the API allows:

* the merge-patch: the client (:mod:`kopf._clients.patching`) alone decides which part goes where:
  ``status`` to the ``/status`` endpoint if the resource has the status subresource (the API ignores
  the status changes sent to the main endpoint then, and the other changes sent to ``/status``),
  everything else to the main endpoint; the main part goes first;
* our finalizer: if the patch adds or removes it (as decided by :mod:`kopf._core.persistence.finalizers`),
  the main part is guarded by the object's ``resourceVersion``, so that the finalizers added by others
  meanwhile are never lost in the whole list; if the API rejects it (the object has changed),
  the rest is applied unguarded and our finalizer alone is changed by a guarded JSON-patch of its
  position against the fresh object (built anew from a newer one if the object changes again meanwhile,
  a few times). When the finalizer is removed from an object being deleted,
  the status goes first: the object can vanish right after the finalizer's removal;
* the transformation functions (``patch.fns``): one JSON-patch, computed against the body returned
  by the previous request (or the original one), guarded by its ``resourceVersion``, so that
  positions in lists are never applied to a changed object.

So, a successful handler with no result costs 1 request (its progress and the diff-base go together);
with a result, 2 requests for resources with the status subresource (1 without).

The delayed handlers are retried by "touching" the object after the sleep (a dummy annotation
or status field, per the progress storage), which causes a new watch-event and a new cycle.
The sleep is interrupted by any new event of the object, which starts a new cycle anyway.
"""
import asyncio
import datetime
import logging
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from kopf._clients.errors import APIConflictError, APINotFoundError, APIUnprocessableEntityError
from kopf._clients.fetching import read_obj
from kopf._clients.patching import json_patch_obj, patch_obj, split_merge_patch
from kopf._clients.vault import Vault
from kopf._cogs.aiokits.capacity import Hold
from kopf._cogs.helpers.typedefs import Logger
from kopf._cogs.structs import dicts
from kopf._cogs.structs.bodies import Body, RawBody, version_of
from kopf._cogs.structs.patches import JSONPatch, Patch
from kopf._cogs.structs.references import Resource
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.persistence import finalizers
from kopf._core.persistence.progress import ProgressStorage

__all__ = [
    'apply_patch',
    'sleep',
    'sleep_for_delays',
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
        seat: Hold | None = None,
        version_only: bool = False,
) -> RawBody | None:
    """
    Apply the patch to the object; return the object as patched, or None if it does not exist anymore.

    An empty patch sends nothing and returns the body as it is (as a raw dict). The patch itself
    is never modified. The API errors other than "not found" propagate. The object's processing ``seat``
    is lent while the requests wait for the server (see :func:`kopf._clients.api.request`).

    With ``version_only``, the caller needs only the patched object's ``metadata.resourceVersion``: then,
    the returned body may have only that field, the responses not decoded beyond it, unless the application
    itself needs them (the transformation functions, our finalizer's change against a changed object, the
    inconsistencies' debug logging).
    """
    if not patch and not patch.fns:
        return _as_raw(body)

    body = dicts.raw_mapping(body)  # a live view (kopf.Body) resolves its path on every access
    finalizer: str = settings.persistence.finalizer
    guarded = _changes_our_finalizer(body, patch, finalizer)
    releasing = guarded and finalizers.is_deletion_ongoing(body)
    version_only = version_only and not patch.fns and not logger.isEnabledFor(logging.DEBUG)
    writer = _Writer(settings=settings, vault=vault, resource=resource, body=body, logger=logger, seat=seat,
                     version_only=version_only)

    main, status = split_merge_patch(resource, patch)
    if releasing and status:
        if await writer.merge_patch(status, subject='status') is None:
            return None
        status = {}
    if guarded:
        if await writer.merge_patch_guarded(main, then=status, finalizer=finalizer) is None:
            return None
    else:
        for part, subject in [(main, 'resource'), (status, 'status')]:
            if part and await writer.merge_patch(part, subject=subject) is None:
                return None

    if patch.fns:
        transformations = Patch(body=writer.latest)
        transformations.fns = list(patch.fns)
        operations = transformations.as_json_patch()
        if operations and await writer.json_patch(operations) is None:
            return None

    # E.g. the fields pruned by the CRD's schema. (The released objects can be returned as they were.)
    if not patch.fns and not releasing and logger.isEnabledFor(logging.DEBUG):
        inconsistencies = tuple(_iter_inconsistencies(patch, writer.latest))
        if inconsistencies:
            logger.debug(f'Patching failed with inconsistencies: {inconsistencies}')
    return writer.latest


# How many times our finalizer is added or removed against a newer version of an object that keeps changing.
_FINALIZER_ATTEMPTS = 3


class _Writer:
    """The requests of one application of a patch, each against the latest known state of the object."""

    def __init__(self, *, settings: OperatorSettings, vault: Vault, resource: Resource,
                 body: Mapping[str, Any], logger: Logger, seat: Hold | None = None,
                 version_only: bool = False) -> None:
        meta = body.get('metadata', {})
        self.seat = seat
        self.version_only = version_only
        self.settings = settings
        self.vault = vault
        self.resource = resource
        self.logger = logger
        self.namespace: str | None = meta.get('namespace')
        self.name: str = meta.get('name', '')
        self.original = body
        self._latest: RawBody | None = None  # the unpatched body is unwrapped only if needed (rarely)

    @property
    def latest(self) -> RawBody:
        return self._latest if self._latest is not None else _as_raw(self.original)

    async def merge_patch(self, part: Mapping[str, Any], *, subject: str,
                          whole: bool = False) -> RawBody | None:
        """Merge-patch a part; the patched object (only its version if so asked and not needed ``whole``)."""
        if self.logger.isEnabledFor(logging.DEBUG):  # the patches can be big; the debug logs are usually off
            self.logger.debug(f'Merge-patching the {subject} with: {part}')
        patched = await patch_obj(settings=self.settings, vault=self.vault, resource=self.resource,
                                  namespace=self.namespace, name=self.name, patch=part, logger=self.logger,
                                  seat=self.seat, version_only=self.version_only and not whole)
        return self._remember(patched)

    async def json_patch(self, operations: JSONPatch) -> RawBody | None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug(f'JSON-patching the resource with: {operations}')
        patched = await json_patch_obj(settings=self.settings, vault=self.vault, resource=self.resource,
                                       namespace=self.namespace, name=self.name, patch=operations,
                                       logger=self.logger, seat=self.seat)
        return self._remember(patched)

    async def merge_patch_guarded(self, main: Mapping[str, Any], *, then: Mapping[str, Any],
                                  finalizer: str) -> RawBody | None:
        """
        Apply the main part with the whole new list of finalizers guarded by the version, then the rest.

        If the object has changed since that version (e.g. someone has added their own finalizer,
        which the list would lose), the API rejects the patch. Then, the rest of the patch is applied
        unguarded, and our finalizer alone is added or removed with a JSON-patch of its position,
        guarded by the fresh version of the object (as Kopf does it in all cases).
        """
        metadata = dict(main.get('metadata', {}))
        version = version_of(self.latest)
        if version is not None:
            metadata['resourceVersion'] = version
        try:
            if await self.merge_patch({**main, 'metadata': metadata}, subject='resource') is None:
                return None
        except APIConflictError:
            pass
        else:
            return await self.merge_patch(then, subject='status') if then else self.latest

        wanted: list[str] = list(metadata.pop('finalizers') or [])  # None when none are left
        metadata.pop('resourceVersion', None)
        rest = {key: value for key, value in main.items() if key != 'metadata'}
        if metadata:
            rest['metadata'] = metadata
        self.logger.debug('The object has changed meanwhile; the finalizer is changed separately.')

        fresh: RawBody | None
        if rest or then:
            fresh = await self.merge_patch({**rest, **then}, subject='resource', whole=True)
        else:
            fresh = await self._read()
        # Between the fresh state and the JSON-patch, the object can change again (e.g. other controllers
        # are busy with it): the patch's `test` of the version fails (HTTP 422). It is built anew from
        # a newer state a few times; a lasting contention fails as the other API errors do.
        attempts = 1
        while fresh is not None:
            if finalizer in wanted:
                operations = finalizers.make_blocking_json_patch(fresh, finalizer)
            else:
                operations = finalizers.make_allowing_json_patch(fresh, finalizer)
            if not operations:
                return fresh
            try:
                return await self.json_patch(operations)
            except APIUnprocessableEntityError:
                if attempts >= _FINALIZER_ATTEMPTS:
                    raise
            attempts += 1
            self.logger.debug('The object has changed again; retrying the finalizer on it.')
            fresh = await self._read()
        return None

    async def _read(self) -> RawBody | None:
        try:
            fresh = await read_obj(settings=self.settings, vault=self.vault, resource=self.resource,
                                   namespace=self.namespace, name=self.name, logger=self.logger)
        except APINotFoundError:
            return None
        return self._remember(fresh)

    def _remember(self, patched: RawBody | None) -> RawBody | None:
        if patched is not None:
            self._latest = patched
        return patched


def _changes_our_finalizer(body: Mapping[str, Any], patch: Patch, finalizer: str) -> bool:
    """Whether the patch adds or removes our finalizer (and so replaces the list in a guarded way)."""
    if not finalizers.changes_finalizers(patch):
        return False
    wanted = patch['metadata']['finalizers'] or []
    return (finalizer in wanted) != finalizers.is_deletion_blocked(body, finalizer)


def _iter_inconsistencies(
        patch: Mapping[str, Any],
        body: Mapping[str, Any] | None,
        path: tuple[str, ...] = (),
) -> Iterator[tuple[str, tuple[str, ...], Any, Any]]:
    """The fields of the merge-patch that the patched object has not got as patched: (op, path, old, new)."""
    for key, value in patch.items():
        if path == ('metadata',) and key == 'resourceVersion':
            continue  # a precondition, not a change
        actual = body.get(key) if body is not None else None
        if isinstance(value, Mapping):
            if isinstance(actual, Mapping):
                yield from _iter_inconsistencies(value, actual, (*path, key))
            elif value:
                yield ('add', (*path, key), actual, value)
        elif value is None:
            if actual is not None:
                yield ('remove', (*path, key), actual, value)
        elif actual != value:
            yield ('change', (*path, key), actual, value)


def _as_raw(body: Mapping[str, Any]) -> RawBody:
    # A live view (kopf.Body) is unwrapped into a plain dict; nested values are raw already.
    return dict(body.items())  # type: ignore[return-value]


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
        seat: Hold | None = None,
) -> RawBody | None:
    """Touch the object (via the storage's dummy marker) to get a new watch-event for it."""
    patch = Patch(body=body)
    storage.touch(body=body, patch=patch, value=datetime.datetime.now(datetime.UTC).isoformat())
    return await apply_patch(settings=settings, vault=vault, resource=resource,
                             body=body, patch=patch, logger=logger, seat=seat)
