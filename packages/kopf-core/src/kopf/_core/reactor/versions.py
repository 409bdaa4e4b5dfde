"""
Consistency and echoes: which versions of an object the processing waits for, and which it can skip.

The change handling needs a consistent state of the object: our own latest patch must have arrived
via the watch-stream, otherwise the old state of the object would be handled once again.
Until then, or until ``settings.persistence.consistency_timeout`` passes since the patch, the handling
waits; a newer event of the object (the delivery's ``pressure``) interrupts the wait, and the newer
event is processed instead. A state known to be stale is not handled even after the timeout: when a newer
event is there already, or when the watch-stream was held back since the patch: by the back-pressure (the
echo is late by our own doing), or by an interruption (e.g. the API server restarting for longer than the
timeout): the echo will come with the re-established stream. Otherwise, the handlers whose outcomes the
patch has stored would run again. The event-watching handlers are never delayed by this.

The echo of a patch that needs nothing from us (only the framework's own writes, nothing due after it,
and no changes of others under it: the patched object as the API returns it is checked) is "settled": it
is known when the patch is made, and its event is dropped by its version unprocessed, as are the events of
the earlier versions (e.g. of the cycle's earlier patches), which would only wait for it.

Once our patch has released the object for its deletion (our finalizer removed), a state of it that has our
finalizer is not handled (but by the event-watching handlers). Our finalizer cannot come back (no new
finalizers can be added to an object being deleted), so such a state is from before the release, though its
event comes after the release's success (usually, it is batched with the deletion's; not when that is late):

* written by others under the release, as kube-apiserver allows: it checks the release (our patch emptying
  the finalizers, guarded by the version) against the object, then deletes the object with no version
  precondition (``Store.deleteWithoutFinalizers()``); a write that lands in between is deleted with it;
* our own: after a conflict, the release goes as two requests (the rest of the patch, then our finalizer's
  removal, see :func:`.application.apply_patch`); the removal is answered with the first one's version (it
  is not stored itself), so that state even looks like the echo of our latest patch, awaited.

Handled, either would call the deletion handlers again (their progress is not there anymore). The states
without our finalizer (e.g. while others' finalizers hold the object) are handled as usual: nothing to do.

The fields of an object's memory that this owns are declared here (:class:`VersionBook`).
"""
import asyncio
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from kopf._cogs.structs.bodies import RawBody, RawEvent, is_newer_version, version_of
from kopf._cogs.structs.patches import Patch
from kopf._core.actions import application, loggers
from kopf._core.persistence import diffbase

__all__ = ['VersionBook', 'is_consistent', 'is_settled_echo', 'remember_version', 'settles',
           'version_of', 'wait_for_consistency']


class VersionBook:
    """The versions of an object that the processing waits for or skips (a part of its memory)."""

    __slots__ = ('expected_since', 'expected_version', 'released', 'settled_version')

    expected_version: str | None  # the resourceVersion of our latest patch that has not arrived yet
    expected_since: float  # when that patch was made (the event loop's time)
    settled_version: str | None  # the version of our latest patch if nothing is due after it (a no-op echo)
    released: bool  # our patch has released the object for its deletion: our finalizer never comes back

    def __init__(self) -> None:
        super().__init__()
        self.expected_version = None
        self.expected_since = 0.0
        self.settled_version = None
        self.released = False


def is_settled_echo(raw_event: RawEvent, book: VersionBook | None) -> bool:
    """
    Whether the event is the echo of our own latest patch, or an earlier one, that needs no processing at all.

    It is known when the patch is made (see :func:`settles`): the version that the patch has made
    differs from the handled one only by the framework's own writes, which nothing looks at, and nothing
    was due after it. So the processing of that very version would do nothing but notice the consistency.
    The object's state is the same for the same version, so a version check is enough for the echo.
    The versions before it (e.g. the echoes of the cycle's earlier patches: our finalizer, the object before
    its status) would only wait for it (they are not consistent): they are stale, and it surely comes after
    them (or a newer one): they are dropped too, the latest state is the same with or without them.
    """
    if raw_event['type'] != 'MODIFIED' or book is None or book.settled_version is None:
        return False
    version = version_of(raw_event['object'])
    if book.settled_version != version:
        return is_newer_version(book.settled_version, version)
    book.settled_version = book.expected_version = None  # consistent now, as the processing would find
    return True


def settles(patch: Patch, *, blind_to_own_writes: bool) -> bool:
    """
    Whether the object patched with the patch will be handled exactly as the object has just been.

    I.e. the patch has only what the framework itself writes --- the status (handlers' results, progress),
    our finalizer, Kopf's annotations (progress, the diff-base) --- and none of the object's handlers looks
    at those (``blind_to_own_writes``): its essence and every filter's verdict stay the same.
    """
    if patch.fns or not blind_to_own_writes:
        return False
    for key, value in patch.items():
        if key == 'status':
            continue
        if key != 'metadata' or not (type(value) is dict or isinstance(value, Mapping)):
            return False
        for meta_key, meta_value in value.items():
            if meta_key == 'finalizers':
                continue
            if meta_key != 'annotations' or not (type(meta_value) is dict or isinstance(meta_value, Mapping)):
                return False
            if not all(map(diffbase.is_system_annotation, meta_value)):
                return False
    return True


def is_consistent(book: VersionBook, raw_body: Mapping[str, Any]) -> bool:
    """Whether the version of our own latest patch (if any) has arrived with this or an earlier event."""
    expected = book.expected_version
    if expected is None:
        return True
    actual = version_of(raw_body)
    if actual is not None and (actual == expected or is_newer_version(actual, expected)):
        book.expected_version = None
        return True
    return False


def remember_version(book: VersionBook, *, old_raw: Mapping[str, Any], new_raw: RawBody | None) -> bool:
    """Remember the version made by our patch (if any) to wait for it; True if a new version was made."""
    new_version = version_of(new_raw)
    if new_version is None or new_version == version_of(old_raw):
        return False
    book.expected_version = new_version
    book.expected_since = asyncio.get_running_loop().time()
    return True


async def wait_for_consistency(
        book: VersionBook,
        *,
        pressure: asyncio.Event | None,
        held_back_since: Callable[[float], bool],
        consistency_timeout: float | None,
        lending: AbstractAsyncContextManager[None],
        logger: loggers.ObjectLogger,
) -> bool:
    """
    Wait until the consistency timeout since our latest patch; True if the object can be handled now.

    False means that a newer event of the object has arrived meanwhile (it will be processed instead),
    or that our patch is late since the watch-stream was held back or interrupted (its event will surely
    come then).
    ``pressure`` and ``held_back_since`` are those of the event's delivery (see :class:`.contexts.Delivery`);
    ``lending`` is entered for the sleep (the object's seat is lent to others meanwhile).
    """
    if pressure is not None and pressure.is_set():
        return False  # newer already (e.g. when the events come late): never handle a state known to be stale
    loop = asyncio.get_running_loop()
    remaining = book.expected_since + (consistency_timeout or 0) - loop.time()
    if remaining > 0:
        logger.debug(f'Waiting for our own patch (version {book.expected_version}) '
                     f'to arrive, for {remaining:.3f} seconds at most.')
        async with lending:
            left = await application.sleep(remaining, pressure)
        if left is not None:
            return False
    if held_back_since(book.expected_since):
        # Late by our own doing (the back-pressure) or by the stream's interruption (e.g. the API server
        # restarting): it will come, surely; the stale state is not handled.
        logger.debug(f'Our own patch (version {book.expected_version}) is late: '
                     f'the watch-stream was held back or interrupted. The object waits for it.')
        return False
    if remaining > 0:
        logger.debug(f'Our own patch (version {book.expected_version}) has not arrived '
                     f'in time; the object is handled as it is now.')
    book.expected_version = None
    return True
