"""
The vault: all credentials known to the operator, with their validity and cached sessions.

The credentials come from the login handlers (or login functions) as :class:`ConnectionInfo`
(or :class:`AiohttpSession`, both a :class:`KubeContext`)
objects under arbitrary keys (usually the ids of the login handlers). The API calls take them
from the vault, best first, and report back the ones rejected by the server (HTTP 401)::

    async with contextlib.aclosing(vault.extended(make_session, 'sessions')) as credentials:
        async for key, info, session in credentials:
            try:
                return await use(session)
            except APIUnauthorizedError as e:
                await vault.invalidate(key, info, exc=e)  # and go to the next credentials

Rules:

* The credentials with the highest ``priority`` go first; equal ones go in random order
  (to spread the load if there are several equally good ones).
* Expired credentials are skipped and dropped (naive expiration times are taken as UTC).
* Invalidated credentials are dropped. They are also remembered, so if a login handler
  returns the same credentials again later, they are ignored instead of failing again:
  this is what prevents a never-ending loop of re-logins with the same broken credentials.
* When no usable credentials remain, the next consumer triggers a re-login, and all
  concurrent consumers wait for its result instead of failing. Only one re-login runs at a time.
  The re-login is either the ``relogin`` callback of the vault (if given) or an external party
  that waits for :meth:`Vault.wait_for_emptiness` and calls :meth:`Vault.populate`.
  If the re-login brings nothing usable, all waiting consumers fail with :class:`LoginError`.

Each credential can have objects attached to it for different purposes (e.g. one HTTP session
per credential). They are created on first use and closed when the credential is dropped or when
the vault is closed — but never while a consumer still uses them (between a yield and the next step).
"""
import asyncio
import dataclasses
import datetime
import http
import inspect
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

from kopf._cogs.structs.credentials import KubeContext, LoginError, VaultKey

logger = logging.getLogger(__name__)

_T = TypeVar('_T')

# What a re-login callback returns: new credentials by their keys (or nothing).
ReloginFn = Callable[[], Awaitable[Mapping[VaultKey, KubeContext] | Mapping[str, KubeContext] | None]]


@dataclasses.dataclass(eq=False)
class _Item:
    """One credential in the vault with its attached objects and its current users."""

    info: KubeContext
    caches: dict[str, Any] = dataclasses.field(default_factory=dict)
    users: int = 0
    dropped: bool = False


def _identity(info: KubeContext) -> KubeContext:
    # The same secrets with a renewed expiration or another priority are still the same broken secrets.
    return dataclasses.replace(info, expiration=None, priority=0)


def _is_expired(info: KubeContext, now: datetime.datetime) -> bool:
    if info.expiration is None:
        return False
    expiration = info.expiration
    if expiration.tzinfo is None:
        expiration = expiration.replace(tzinfo=datetime.UTC)
    return expiration <= now


async def _close_object(obj: Any) -> None:
    """Close an attached object in whatever way it supports: ``aclose()``, async or sync ``close()``."""
    closer = getattr(obj, 'aclose', None) or getattr(obj, 'close', None)
    if closer is None:
        return
    try:
        result = closer()
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception(f'Failed to close an object attached to credentials: {type(obj).__name__}')



def _best_of(candidates: list[tuple[VaultKey, _Item]]) -> tuple[VaultKey, _Item]:
    """The credential of the best priority; a random one of several equal ones (to spread the load)."""
    if len(candidates) == 1:  # the usual case: one credential, nothing to choose from
        return candidates[0]
    best_priority = max(item.info.priority for _, item in candidates)
    return random.choice([(key, item) for key, item in candidates if item.info.priority == best_priority])

class Lease(Generic[_T]):
    """A credential and its attached object in use, from :meth:`Vault.lease_best`."""

    __slots__ = ('_item', '_released', '_vault', 'key', 'obj')

    def __init__(self, vault: 'Vault', key: VaultKey, item: _Item, obj: _T) -> None:
        self._vault = vault
        self._item = item
        self._released = False
        self.key = key
        self.obj = obj

    @property
    def info(self) -> KubeContext:
        return self._item.info

    async def release(self) -> None:
        """Stop using the object (idempotent): the vault can close it if the credential is dropped."""
        if not self._released:
            self._released = True
            await self._vault._unlease(self._item)

    def release_nowait(self) -> bool:
        """
        The same as :meth:`release` if it has nothing to close (the usual case); False if it must be awaited.

        For every request: not a coroutine (two, with the vault's) only to decrement a counter.
        """
        if self._released:
            return True
        item = self._item
        if item.dropped and item.users <= 1:
            return False
        self._released = True
        item.users -= 1
        return True


class Vault:
    """
    Credentials with priorities, validity tracking, re-login coordination, and attached objects.

    See the module's description for the rules. The vault is bound to no event loop until used,
    but it must be used within one event loop only.
    """

    def __init__(
            self,
            src: Mapping[VaultKey, KubeContext] | Mapping[str, KubeContext] | None = None,
            /,
            *,
            relogin: ReloginFn | None = None,
    ) -> None:
        super().__init__()
        self._items: dict[VaultKey, _Item] = {}
        self._invalid: set[KubeContext] = set()
        self._relogin = relogin
        self._last_error: BaseException | None = None

        # One re-login round at a time: consumers share it. A task for the callback, a future otherwise.
        self._round: asyncio.Future[None] | None = None

        # Notified on every change, so that waiters for readiness/emptiness can re-check the state.
        self._changed: asyncio.Condition | None = None

        if src is not None:
            self._add(src)

    def __repr__(self) -> str:
        return f'<{type(self).__name__}: {len(self._items)} credentials>'

    @property
    def _condition(self) -> asyncio.Condition:
        # Created lazily, so that the vault can be constructed outside of an event loop.
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        async with self._condition:
            self._condition.notify_all()

    def _add(self, src: Mapping[VaultKey, KubeContext] | Mapping[str, KubeContext]) -> list[_Item]:
        """Put new credentials in place (except the known-invalid ones); return the replaced items."""
        replaced: list[_Item] = []
        for key, info in src.items():
            if not isinstance(info, KubeContext):
                raise TypeError(f'Credentials must be ConnectionInfo or AiohttpSession; '
                                f'got {type(info).__name__} for {key!r}.')
            if _identity(info) in self._invalid:
                logger.debug(f'Ignoring the previously invalidated credentials for {key!r}.')
                continue
            old = self._items.get(VaultKey(key))
            if old is not None and old.info == info:
                continue  # the same credentials again: keep the attached objects (e.g. sessions).
            if old is not None:
                replaced.append(old)
            self._items[VaultKey(key)] = _Item(info=info)
        return replaced

    async def _drop(self, items: list[_Item]) -> None:
        """Mark the items as dropped and close their attached objects unless they are still in use."""
        for item in items:
            item.dropped = True
            if item.users == 0:
                await self._close_caches(item)

    async def _close_caches(self, item: _Item) -> None:
        caches, item.caches = item.caches, {}
        for obj in caches.values():
            await _close_object(obj)

    def _has_expirations(self) -> bool:
        # Most credentials never expire (e.g. service account tokens, certificates): no clock needed then.
        return any(item.info.expiration is not None for item in self._items.values())

    async def _expire(self) -> None:
        if not self._has_expirations():
            return
        now = datetime.datetime.now(datetime.UTC)
        expired = {key: item for key, item in self._items.items() if _is_expired(item.info, now)}
        for key in expired:
            logger.debug(f'Credentials for {key!r} have expired and are dropped.')
            del self._items[key]
        if expired:
            await self._drop(list(expired.values()))
            await self._notify()

    def _valid_items(self) -> Mapping[VaultKey, _Item]:
        if not self._has_expirations():
            return self._items  # read-only for the callers
        now = datetime.datetime.now(datetime.UTC)
        return {key: item for key, item in self._items.items() if not _is_expired(item.info, now)}

    @property
    def rejection(self) -> str | None:
        """
        Why the latest credentials were invalidated, in words (no secrets); ``None`` if none were.

        E.g. "the API server rejected the credentials (401 Unauthorized)" after an HTTP 401.
        """
        if self._last_error is None:
            return None
        status = getattr(self._last_error, 'status', None)
        if isinstance(status, int):
            try:
                phrase = http.HTTPStatus(status).phrase
            except ValueError:
                phrase = 'an HTTP error'
            return f'the API server rejected the credentials ({status} {phrase})'
        return f'the credentials were invalidated: {self._last_error}'

    def _depletion_error(self) -> LoginError:
        reason = self.rejection
        details = f'{reason}, and the re-login brought no new ones' if reason else 'the re-login brought none'
        error = LoginError(f'Ran out of valid credentials: {details}.')
        error.__cause__ = self._last_error
        return error

    def is_empty(self) -> bool:
        """Check whether there are no usable (valid & unexpired) credentials at the moment."""
        return not self._valid_items()

    async def populate(
            self,
            src: Mapping[VaultKey, KubeContext] | Mapping[str, KubeContext],
            /,
    ) -> None:
        """
        Add new credentials or replace the existing ones under the same keys.

        Credentials that were invalidated before are ignored. If a re-login round is awaited
        without a callback, this call completes it: successfully if usable credentials exist now,
        or with :class:`LoginError` for all waiting consumers if not.
        """
        replaced = self._add(src)
        await self._drop(replaced)
        if self._relogin is None and self._round is not None and not self._round.done():
            self._finish_round(self._round)
        await self._notify()

    async def invalidate(
            self,
            key: VaultKey | str,
            info: KubeContext,
            *,
            exc: BaseException | None = None,
    ) -> None:
        """
        Mark the credentials as invalid (e.g. after HTTP 401) and drop them from use.

        Only the given credentials are dropped: if the key has already got newer credentials
        (e.g. by a concurrent re-login), they remain. The invalid ones are remembered forever
        and ignored if supplied again. The exception (if given) becomes the cause of the
        :class:`LoginError` if the re-login brings nothing usable.
        """
        self._invalid.add(_identity(info))
        if exc is not None:
            self._last_error = exc
        item = self._items.get(VaultKey(key))
        if item is not None and item.info == info:
            logger.debug(f'Credentials for {key!r} are invalidated and dropped.')
            del self._items[VaultKey(key)]
            await self._drop([item])
            await self._notify()

    async def wait_for_readiness(self) -> None:
        """Wait until there are usable credentials in the vault (return immediately if there are)."""
        async with self._condition:
            await self._condition.wait_for(lambda: not self.is_empty())

    async def wait_for_emptiness(self) -> None:
        """
        Wait until there are no usable credentials in the vault (e.g. to log in again).

        Credentials expire with no activity in the vault, so the waiting wakes up at their expiration.
        """
        while True:
            await self._expire()
            if self.is_empty():
                return
            now = datetime.datetime.now(datetime.UTC)
            expirations = [
                (item.info.expiration if item.info.expiration.tzinfo else
                 item.info.expiration.replace(tzinfo=datetime.UTC)) - now
                for item in self._items.values() if item.info.expiration is not None
            ]
            timeout = max(0.0, min(expirations).total_seconds()) if expirations else None
            async with self._condition:
                try:
                    await asyncio.wait_for(self._condition.wait(), timeout=timeout)
                except TimeoutError:
                    pass

    def __aiter__(self) -> AsyncIterator[tuple[VaultKey, KubeContext]]:
        """Iterate over the usable credentials, best first; re-login when depleted (see the module)."""
        return self._iterate_plain()

    async def _iterate_plain(self) -> AsyncIterator[tuple[VaultKey, KubeContext]]:
        async for key, info, _ in self._iterate(None, None):
            yield key, info

    def extended(
            self,
            factory: Callable[[KubeContext], _T],
            purpose: str,
    ) -> AsyncGenerator[tuple[VaultKey, KubeContext, _T], None]:
        """
        Iterate over the usable credentials with an attached object for each, best first.

        The object is made by ``factory(info)`` on first use for this purpose and is cached
        with the credentials until they are dropped or the vault is closed; then it is closed.
        While the consumer is between the yield and the next step (i.e. uses the object),
        the object is not closed even if the credentials are invalidated in the meantime.

        Wrap the iterator into :func:`contextlib.aclosing` if the consumer can leave the loop
        early (with ``break``, ``return``, or an exception): this releases the object promptly.
        """
        return self._iterate(factory, purpose)

    def lease_best(self, factory: Callable[[KubeContext], _T], purpose: str) -> 'Lease[_T] | None':
        """
        The fast path of :meth:`extended` for the usual case: credentials that never expire.

        The credential is the one that the iteration would yield first: of the best priority (a random one
        of several equal ones, e.g. of the default logins when both pykube-ng and kubernetes are installed).
        Returns ``None`` if the case is not that simple (no credentials, expiring ones, the attached object
        not made yet): then, use :meth:`extended`. The lease must be released with :meth:`Lease.release`
        when the object is not used anymore, as with the iteration.
        """
        items = self._items
        if len(items) == 1:  # the most usual case: nothing to choose from
            ((key, item),) = items.items()
            if item.info.expiration is not None:
                return None
        elif not items or self._has_expirations():
            return None
        else:
            key, item = _best_of(list(items.items()))
        if purpose not in item.caches:
            return None
        item.users += 1
        return Lease(self, key, item, item.caches[purpose])

    async def _unlease(self, item: _Item) -> None:
        """One user less of the item; close its objects if it is dropped and this was the last user."""
        item.users -= 1
        if item.dropped and item.users == 0:
            await self._close_caches(item)

    async def _iterate(
            self,
            factory: Callable[[KubeContext], _T] | None,
            purpose: str | None,
    ) -> AsyncGenerator[tuple[VaultKey, KubeContext, _T], None]:
        # Each credential is yielded at most once per iteration, so that consumers that do not
        # invalidate them (e.g. on errors unrelated to authentication) do not loop forever.
        yielded: list[_Item] = []
        while True:
            await self._expire()
            valid = self._valid_items()
            if not valid:
                await self._refill()
                continue

            candidates = [(key, item) for key, item in valid.items()
                          if all(item is not seen for seen in yielded)]
            if not candidates:
                return  # everything usable has been tried and is still in the vault.

            key, item = _best_of(candidates)
            yielded.append(item)

            obj: Any = None
            if factory is not None and purpose is not None:
                if purpose not in item.caches:
                    item.caches[purpose] = factory(item.info)
                obj = item.caches[purpose]

            item.users += 1
            try:
                yield key, item.info, obj
            finally:
                await self._unlease(item)

    async def _refill(self) -> None:
        """Start a re-login round or join the ongoing one; fail if it brings nothing usable."""
        if self._round is None or self._round.done():
            self._round = self._start_round()
        round = self._round
        await asyncio.shield(round)

    def _start_round(self) -> asyncio.Future[None]:
        round: asyncio.Future[None]
        if self._relogin is not None:
            round = asyncio.get_running_loop().create_task(self._run_relogin())
        else:
            logger.debug('The vault is depleted; waiting for new credentials to be populated.')
            round = asyncio.get_running_loop().create_future()

        # If all consumers are cancelled while waiting, nobody retrieves the result: avoid the warnings.
        round.add_done_callback(lambda fut: fut.cancelled() or fut.exception())
        return round

    async def _run_relogin(self) -> None:
        assert self._relogin is not None
        logger.debug('The vault is depleted; re-logging in.')
        new_credentials = await self._relogin()
        replaced = self._add(new_credentials or {})
        await self._drop(replaced)
        await self._notify()
        if self.is_empty():
            raise self._depletion_error()

    def _finish_round(self, round: asyncio.Future[None]) -> None:
        if self.is_empty():
            round.set_exception(self._depletion_error())
        else:
            round.set_result(None)

    async def close(self) -> None:
        """Close all attached objects (e.g. HTTP sessions) and stop an ongoing re-login, if any."""
        if self._round is not None and not self._round.done():
            self._round.cancel()
        for item in list(self._items.values()):
            await self._close_caches(item)

    async def __aenter__(self) -> 'Vault':
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
