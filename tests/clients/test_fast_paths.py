"""
The client's fast paths, pinned to the general ones: for random vaults, the same credentials.

The requests take the best credential and its attached object directly (``Vault.lease_best()``) in the usual
case, rather than via the iteration over the vault (``Vault.extended()``), which re-checks the expirations
and re-logins when depleted: the lease must be of the credential that the iteration would yield first.
"""
import asyncio
import datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kopf._clients.vault import Vault
from kopf._cogs.structs.credentials import ConnectionInfo

SETTINGS = settings(max_examples=100, deadline=None)
FUTURE = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=365)


class Attached:
    def __init__(self, info: ConnectionInfo) -> None:
        self.info = info

    async def close(self) -> None:
        pass


CREDENTIALS = st.dictionaries(
    st.sampled_from(['a', 'b', 'c', 'd']),
    st.tuples(st.integers(0, 2), st.booleans()),  # the priority, and whether it expires
    min_size=1, max_size=4,
)


@SETTINGS
@given(CREDENTIALS, st.sampled_from(['all', 'first', 'none']))
def test_the_leased_credential_is_the_first_of_the_iteration(
        credentials: dict[str, tuple[int, bool]], made: str,
) -> None:
    infos = {key: ConnectionInfo(server=f'https://{key}', token=key, priority=priority,
                                 expiration=FUTURE if expiring else None)
             for key, (priority, expiring) in credentials.items()}

    async def check() -> None:
        vault = Vault(dict(infos))
        objs: dict[Any, Attached] = {}
        if made != 'none':
            async for key, _, obj in vault.extended(Attached, 'test'):
                objs[key] = obj
                if made == 'first':
                    break  # only the first one's object is made
        lease = vault.lease_best(Attached, 'test')
        firsts = set()
        for _ in range(20):  # the iteration picks one of the equally good ones at random
            async for key, _, _ in vault.extended(Attached, 'other'):
                firsts.add(key)
                break
        if lease is None:
            expiring = any(info.expiration is not None for info in infos.values())
            assert expiring or made == 'none' or (made == 'first' and len(infos) > 1)
            return
        best = max(info.priority for info in infos.values())
        assert all(infos[key].priority == best for key in firsts)  # as a check of the general path
        assert infos[lease.key].priority == best
        assert lease.info == infos[lease.key] and lease.obj is objs[lease.key]
        assert all(info.expiration is None for info in infos.values())
        await lease.release()
        await vault.close()

    asyncio.run(check())
