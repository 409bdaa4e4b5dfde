import asyncio
import contextlib
import datetime
import time
from collections.abc import Iterator

import pytest

from kopf._clients.vault import Vault
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError, VaultKey

pytestmark = pytest.mark.looptime

INFO_A = ConnectionInfo(server='https://a', token='a', priority=30)
INFO_B = ConnectionInfo(server='https://b', token='b', priority=20)
INFO_C = ConnectionInfo(server='https://c', token='c', priority=10)


class Closeable:
    def __init__(self, info: ConnectionInfo) -> None:
        self.info = info
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def collect(vault: Vault) -> list[VaultKey]:
    return [key async for key, _ in vault]


async def test_best_priority_first_each_once() -> None:
    vault = Vault({'c': INFO_C, 'a': INFO_A, 'b': INFO_B})
    assert await collect(vault) == ['a', 'b', 'c']
    assert not vault.is_empty()


async def test_iteration_yields_the_infos() -> None:
    vault = Vault({'a': INFO_A})
    assert [(key, info) async for key, info in vault] == [('a', INFO_A)]


@contextlib.contextmanager
def timezone(tz: str) -> Iterator[None]:
    # The real process-wide timezone, not a patched function: naive times must not depend on it.
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv('TZ', tz)
        time.tzset()
        try:
            yield
        finally:
            monkeypatch.undo()
            time.tzset()


@pytest.mark.parametrize('tz', ['Etc/GMT-14', 'Etc/GMT+12', 'UTC'])
async def test_expired_skipped_and_dropped_naive_as_utc(tz: str) -> None:
    utcnow_naive = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    with timezone(tz):
        vault = Vault({
            'past-naive': ConnectionInfo(server='https://x', token='1', priority=9,
                                         expiration=utcnow_naive - datetime.timedelta(hours=1)),
            'past-aware': ConnectionInfo(server='https://x', token='2', priority=8,
                                         expiration=datetime.datetime.now(datetime.UTC)
                                         .astimezone(datetime.timezone(datetime.timedelta(hours=5)))
                                         - datetime.timedelta(minutes=1)),
            'future-naive': ConnectionInfo(server='https://x', token='3', priority=7,
                                           expiration=utcnow_naive + datetime.timedelta(hours=1)),
            'future-aware': ConnectionInfo(server='https://x', token='4', priority=6,
                                           expiration=datetime.datetime.now(datetime.UTC)
                                           + datetime.timedelta(minutes=1)),
            'eternal': ConnectionInfo(server='https://x', token='5', priority=5),
        })
        assert await collect(vault) == ['future-naive', 'future-aware', 'eternal']


async def test_replaced_credentials_objects_are_closed() -> None:
    vault = Vault({'a': INFO_A, 'b': INFO_B})
    objs = [obj async for _, _, obj in vault.extended(Closeable, 'test')]
    await vault.populate({'a': INFO_C, 'b': INFO_B})
    assert [obj.closed for obj in objs] == [True, False]  # the same credentials keep their objects.
    assert [obj.info async for _, _, obj in vault.extended(Closeable, 'test')] == [INFO_B, INFO_C]


@pytest.mark.looptime(False)
async def test_expired_credentials_objects_are_closed() -> None:
    # The expiration is in the wall-clock time, which the fake loop time does not move: use the real time.
    expiration = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=0.1)
    vault = Vault({'a': ConnectionInfo(server='https://x', expiration=expiration)})
    objs = [obj async for _, _, obj in vault.extended(Closeable, 'test')]
    assert not objs[0].closed
    async with asyncio.timeout(5):
        await vault.wait_for_emptiness()
    assert objs[0].closed


async def test_invalidation_goes_to_next() -> None:
    vault = Vault({'a': INFO_A, 'b': INFO_B})
    seen = []
    async for key, info in vault:
        seen.append(key)
        if key == 'a':
            await vault.invalidate(key, info)
    assert seen == ['a', 'b']
    assert await collect(vault) == ['b']


async def test_invalid_credentials_ignored_when_resupplied() -> None:
    vault = Vault({'a': INFO_A, 'b': INFO_B})
    await vault.invalidate('a', INFO_A)
    # Even with another expiration/priority, the same secrets are the same broken secrets.
    expiration = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    again = ConnectionInfo(server='https://a', token='a', priority=99, expiration=expiration)
    await vault.populate({'a': again, 'a2': INFO_A})
    assert await collect(vault) == ['b']


async def test_invalidation_of_outdated_credentials_keeps_new_ones() -> None:
    vault = Vault({'a': INFO_A})
    await vault.populate({'a': INFO_B})
    await vault.invalidate('a', INFO_A)  # e.g. a late 401 of a request made with the old credentials.
    assert [(key, info) async for key, info in vault] == [('a', INFO_B)]


async def test_relogin_when_depleted() -> None:
    calls: list[int] = []

    async def relogin() -> dict[str, ConnectionInfo]:
        calls.append(1)
        return {'b': INFO_B}

    vault = Vault({'a': INFO_A}, relogin=relogin)
    seen = []
    async for key, info in vault:
        seen.append(key)
        if key == 'a':
            await vault.invalidate(key, info)
    assert seen == ['a', 'b']
    assert calls == [1]


async def test_relogin_on_empty_vault_at_start() -> None:
    async def relogin() -> dict[str, ConnectionInfo]:
        return {'a': INFO_A}

    vault = Vault(relogin=relogin)
    assert vault.is_empty()
    assert await collect(vault) == ['a']


async def test_relogin_once_for_concurrent_consumers(looptime: float) -> None:
    calls: list[int] = []

    async def relogin() -> dict[str, ConnectionInfo]:
        calls.append(1)
        await asyncio.sleep(5)
        return {'b': INFO_B}

    vault = Vault(relogin=relogin)
    results = await asyncio.gather(*[collect(vault) for _ in range(10)])
    assert results == [['b']] * 10
    assert calls == [1]
    assert looptime == 5


async def test_relogin_with_nothing_fails_all_waiters(looptime: float) -> None:
    calls: list[int] = []

    async def relogin() -> None:
        calls.append(1)
        await asyncio.sleep(5)

    vault = Vault(relogin=relogin)
    results = await asyncio.gather(*[collect(vault) for _ in range(10)], return_exceptions=True)
    assert all(isinstance(result, LoginError) for result in results)
    assert calls == [1]

    # A later consumer tries again (and fails again).
    with pytest.raises(LoginError):
        await collect(vault)
    assert calls == [1, 1]


async def test_relogin_failure_is_caused_by_the_invalidation() -> None:
    async def relogin() -> dict[str, ConnectionInfo]:
        return {'a': INFO_A}  # the known-invalid one

    vault = Vault({'a': INFO_A}, relogin=relogin)
    cause = RuntimeError('401')
    with pytest.raises(LoginError) as exc_info:
        async for key, info in vault:
            await vault.invalidate(key, info, exc=cause)
    assert exc_info.value.__cause__ is cause


async def test_relogin_errors_propagate_to_consumers() -> None:
    async def relogin() -> None:
        raise LoginError('no way')

    vault = Vault(relogin=relogin)
    with pytest.raises(LoginError, match='no way'):
        await collect(vault)


async def test_external_relogin_via_populate(looptime: float) -> None:
    vault = Vault()
    consumers = asyncio.gather(*[collect(vault) for _ in range(3)])
    await vault.wait_for_emptiness()
    await asyncio.sleep(5)
    assert not consumers.done()
    await vault.populate({'a': INFO_A})
    assert await consumers == [['a']] * 3
    assert looptime == 5


async def test_external_relogin_with_nothing(looptime: float) -> None:
    vault = Vault({'a': INFO_A})
    await vault.invalidate('a', INFO_A)
    consumers = asyncio.gather(*[collect(vault) for _ in range(3)], return_exceptions=True)
    await asyncio.sleep(1)
    await vault.populate({'a': INFO_A})  # known-invalid: ignored
    results = await consumers
    assert all(isinstance(result, LoginError) for result in results)


async def test_wait_for_readiness(looptime: float) -> None:
    vault = Vault()
    waiter = asyncio.create_task(vault.wait_for_readiness())
    await asyncio.sleep(3)
    assert not waiter.done()
    await vault.populate({'a': INFO_A})
    await waiter
    assert looptime == 3


async def test_wait_for_emptiness_on_invalidation(looptime: float) -> None:
    vault = Vault({'a': INFO_A})
    waiter = asyncio.create_task(vault.wait_for_emptiness())
    await asyncio.sleep(3)
    assert not waiter.done()
    await vault.invalidate('a', INFO_A)
    await waiter
    assert looptime == 3


@pytest.mark.looptime(False)
async def test_wait_for_emptiness_on_expiration() -> None:
    # The expiration is in the wall-clock time, which the fake loop time does not move: use the real time.
    expiration = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=0.1)
    vault = Vault({'a': ConnectionInfo(server='https://x', expiration=expiration)})
    async with asyncio.timeout(5):
        await vault.wait_for_emptiness()
    assert vault.is_empty()


async def test_extended_objects_cached_per_credentials_and_purpose() -> None:
    made: list[str] = []

    def factory(info: ConnectionInfo) -> str:
        made.append(f'{info.token}')
        return f'obj-{info.token}'

    vault = Vault({'a': INFO_A, 'b': INFO_B})
    assert [obj async for _, _, obj in vault.extended(factory, 'p1')] == ['obj-a', 'obj-b']
    assert [obj async for _, _, obj in vault.extended(factory, 'p1')] == ['obj-a', 'obj-b']
    assert [obj async for _, _, obj in vault.extended(factory, 'p2')] == ['obj-a', 'obj-b']
    assert made == ['a', 'b', 'a', 'b']


async def test_extended_objects_closed_on_invalidation_and_close() -> None:
    vault = Vault({'a': INFO_A, 'b': INFO_B})
    objs = [obj async for _, _, obj in vault.extended(Closeable, 'test')]
    await vault.invalidate('a', INFO_A)
    assert [obj.closed for obj in objs] == [True, False]
    await vault.close()
    assert [obj.closed for obj in objs] == [True, True]


async def test_extended_objects_not_closed_while_in_use() -> None:
    vault = Vault({'a': INFO_A})
    async with contextlib.aclosing(vault.extended(Closeable, 'test')) as items:
        async for key, info, obj in items:
            await vault.invalidate(key, info)
            assert not obj.closed  # still in use by this consumer
            break
    assert obj.closed  # released by the consumer


async def test_lease_best_for_one_unexpiring_credential_with_its_object() -> None:
    vault = Vault({'a': INFO_A})
    assert vault.lease_best(Closeable, 'test') is None  # the object is not made yet
    objs = [obj async for _, _, obj in vault.extended(Closeable, 'test')]

    lease = vault.lease_best(Closeable, 'test')
    assert lease is not None
    assert (lease.key, lease.info, lease.obj) == ('a', INFO_A, objs[0])
    assert vault.lease_best(Closeable, 'other') is None  # another purpose: another object
    await lease.release()
    await lease.release()  # idempotent
    assert not lease.obj.closed


async def test_lease_best_of_several_credentials_is_the_first_of_the_iteration() -> None:
    vault = Vault({'b': INFO_B, 'a': INFO_A, 'c': INFO_C})
    assert vault.lease_best(Closeable, 'test') is None  # the objects are not made yet
    objs = {key: obj async for key, _, obj in vault.extended(Closeable, 'test')}
    lease = vault.lease_best(Closeable, 'test')
    assert lease is not None
    assert (lease.key, lease.info, lease.obj) == ('a', INFO_A, objs['a'])
    await lease.release()

    # Of equal priorities, any one (randomly, as the iteration does), but never a lower one.
    equal = ConnectionInfo(server='https://a2', token='a2', priority=INFO_A.priority)
    vault = Vault({'a': INFO_A, 'a2': equal, 'c': INFO_C})
    [obj async for _, _, obj in vault.extended(Closeable, 'test')]
    leased = set()
    for _ in range(50):
        lease = vault.lease_best(Closeable, 'test')
        assert lease is not None
        leased.add(lease.key)
        await lease.release()
    assert leased == {'a', 'a2'}


async def test_lease_best_refuses_expiring_credentials() -> None:
    expiring = ConnectionInfo(server='https://x', token='x',
                              expiration=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1))
    vault = Vault({'x': expiring})
    [obj async for _, _, obj in vault.extended(Closeable, 'test')]
    assert vault.lease_best(Closeable, 'test') is None


async def test_leased_object_closed_only_when_released() -> None:
    vault = Vault({'a': INFO_A})
    [obj async for _, _, obj in vault.extended(Closeable, 'test')]
    lease = vault.lease_best(Closeable, 'test')
    assert lease is not None
    await vault.invalidate(lease.key, lease.info)
    assert not lease.obj.closed  # still in use
    assert vault.lease_best(Closeable, 'test') is None  # nothing to lease anymore
    await lease.release()
    assert lease.obj.closed


async def test_sync_close_and_aclose_supported() -> None:
    class SyncCloseable:
        closed = False

        def __init__(self, info: ConnectionInfo) -> None:
            pass

        def close(self) -> None:
            self.closed = True

    class AsyncAcloseable(SyncCloseable):
        async def aclose(self) -> None:
            self.closed = True

    vault = Vault({'a': INFO_A})
    objs1 = [obj async for _, _, obj in vault.extended(SyncCloseable, 'p1')]
    objs2 = [obj async for _, _, obj in vault.extended(AsyncAcloseable, 'p2')]
    await vault.close()
    assert objs1[0].closed and objs2[0].closed


async def test_only_connection_infos_accepted() -> None:
    with pytest.raises(TypeError):
        Vault({'a': 'not-credentials'})  # type: ignore[dict-item]


async def test_repr_has_no_secrets() -> None:
    vault = Vault({'a': ConnectionInfo(server='https://x', token='very-secret')})
    assert 'very-secret' not in repr(vault)


async def test_leases_released_without_awaiting_unless_something_is_to_be_closed() -> None:
    vault = Vault({'a': INFO_A})
    [obj async for _, _, obj in vault.extended(Closeable, 'test')]
    first = vault.lease_best(Closeable, 'test')
    second = vault.lease_best(Closeable, 'test')
    assert first is not None and second is not None
    assert first.release_nowait()  # still in use by another lease: nothing to close
    assert first.release_nowait()  # idempotent
    await vault.invalidate(second.key, second.info)
    assert not second.release_nowait()  # the last user of a dropped credential: its object must be closed
    assert not second.obj.closed
    await second.release()
    assert second.obj.closed
    assert second.release_nowait()  # released already


async def test_credentials_of_a_wrong_type_are_one_clear_error() -> None:
    with pytest.raises(TypeError, match=r"^Credentials must be ConnectionInfo or AiohttpSession; "
                                        r"got dict for 'main'\.$"):
        Vault({'main': {'server': 'https://example.com'}})  # type: ignore[dict-item]
