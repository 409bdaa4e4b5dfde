"""
The client's fast paths, pinned to the general ones: for random vaults, the same credentials; for random
objects, the same versions.

The requests take the best credential and its attached object directly (``Vault.lease_best()``) in the usual
case, rather than via the iteration over the vault (``Vault.extended()``), which re-checks the expirations
and re-logins when depleted: the lease must be of the credential that the iteration would yield first.

The version of a patched object is found in the response's text (``api.decode_version()``) when only it is
needed (e.g. by the timers): it must be the version that the decoded response has in its metadata.
"""
import asyncio
import datetime
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kopf._clients import api, errors
from kopf._clients.connections import Response
from kopf._clients.vault import Vault
from kopf._cogs.structs.bodies import version_of
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


# Texts meant to confuse a search in the text: the key in strings, keys with quotes, escapes, other versions.
TRICKY_TEXTS = st.sampled_from(['resourceVersion', '"resourceVersion":"', '"resourceVersion":"1"', '\\',
                                '\\"', 'x"resourceVersion', '", "resourceVersion": "', '\u00e9', '1', ''])
TEXTS = st.one_of(TRICKY_TEXTS, st.text(max_size=8))
KEYS = st.one_of(st.sampled_from(['resourceVersion', 'metadata', 'spec', 'status']), TEXTS)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | TEXTS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=3),
    max_leaves=10,
)
VERSIONS = st.one_of(st.text(max_size=6), st.sampled_from(['12345', '', '\\', '"', '1"2', '\u00e9']))


def respond(body: Any, *, compact: bool) -> Response:
    text = json.dumps(body, separators=(',', ':') if compact else None, ensure_ascii=compact)
    return Response(200, {}, text.encode('utf-8'), 'PATCH', '/x')


def decoded_version(response: Response) -> str | None:
    """The general path: the response decoded in full, its version as the framework reads it from a body."""
    return version_of(api.decode_response(response))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, JSON_VALUES, max_size=4), st.dictionaries(KEYS, JSON_VALUES, max_size=4),
       VERSIONS, st.booleans(), st.booleans())
def test_the_version_found_in_the_text_is_the_decoded_metadatas(
        top: dict[str, Any], metadata: dict[str, Any], version: str, compact: bool, first: bool,
) -> None:
    metadata = {**metadata, 'resourceVersion': version}  # the API's objects always have one
    rest = {key: value for key, value in top.items() if key != 'metadata'}
    body = {'metadata': metadata, **rest} if first else {**rest, 'metadata': metadata}
    response = respond(body, compact=compact)
    assert api.decode_version(response) == decoded_version(response) == (version or None)  # '' is none


@pytest.mark.parametrize('body, expected', [
    pytest.param({'metadata': {'resourceVersion': '5'}, 'status': {'ref': {'resourceVersion': '3'}}}, '5',
                 id='nested-version-after'),
    pytest.param({'spec': {'ref': {'resourceVersion': '3'}}, 'metadata': {'resourceVersion': '5'}}, '5',
                 id='nested-version-before'),
    pytest.param({'spec': {'text': '"resourceVersion":"3"'}, 'metadata': {'resourceVersion': '5'}}, '5',
                 id='in-a-string'),
    pytest.param({'spec': {'x"resourceVersion': '3'}, 'metadata': {'resourceVersion': '5'}}, '5',
                 id='in-a-key-with-a-quote'),
    pytest.param({'metadata': {'resourceVersion': '5\\"'}}, '5\\"', id='escapes-in-the-version'),
    pytest.param({'metadata': {}, 'spec': {}}, None, id='none-at-all'),
])
def test_the_version_is_the_metadatas_when_others_are_around(
        body: dict[str, Any], expected: str | None,
) -> None:
    response = respond(body, compact=True)
    assert api.decode_version(response) == decoded_version(response) == expected


def test_a_response_that_is_not_json_fails_as_when_decoded() -> None:
    response = Response(200, {}, b'<html>not JSON</html>', 'PATCH', '/x')
    with pytest.raises(errors.APINonJSONResponseError):
        api.decode_version(response)
