"""
The sharding's arithmetic: the hash of the uids, the shards' ranges, the fair shares, the names; its settings.

The replicas' behaviour against a cluster is in ``tests/core/integration/test_sharding.py``.
"""
import collections
import fractions
import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kopf._core.engines import sharding
from kopf._core.engines.sharding import (
    ShardFilter,
    fair_share,
    fnv1a_64,
    member_lease_name,
    shard_of,
    shard_of_hash,
)
from kopf._core.intents.configuration import OperatorSettings

# The published FNV-1a 64-bit test vectors (Fowler, Noll, Vo: "FNV test vectors", fnv-test-vectors).
KNOWN_VECTORS = [
    ('', 0xcbf29ce484222325),
    ('a', 0xaf63dc4c8601ec8c),
    ('b', 0xaf63df4c8601f1a5),
    ('c', 0xaf63de4c8601eff2),
    ('foo', 0xdcb27518fed9d577),
    ('foobar', 0x85944171f73967e8),
    ('chongo was here!\n', 0x46810940eff5f915),
]


@pytest.mark.parametrize('text, expected', KNOWN_VECTORS)
def test_the_hash_is_fnv1a_64(text: str, expected: int) -> None:
    assert fnv1a_64(text) == expected


def _reference(data: bytes) -> int:
    # The definition, over bytes: for each byte, XOR it in, then multiply by the prime, modulo 2**64.
    value = 14695981039346656037
    for byte in data:
        value = (value ^ byte) * 1099511628211 % 2**64
    return value


@given(st.text())
def test_the_hash_is_of_the_utf8_bytes(text: str) -> None:
    assert fnv1a_64(text) == _reference(text.encode('utf-8'))


def test_a_uid_has_its_hash() -> None:
    uid = '6f1c8c3e-9d2a-4b5e-8f7a-1c2d3e4f5a6b'  # the value is from a C implementation with uint64_t
    assert fnv1a_64(uid) == 0xf10e47c65df8d93c


@given(st.text(min_size=1, max_size=40), st.integers(min_value=1, max_value=1000))
def test_a_shard_covers_its_contiguous_range_of_hashes(uid: str, count: int) -> None:
    shard = shard_of(uid, count)
    hash_ = fnv1a_64(uid)
    assert 0 <= shard < count
    assert fractions.Fraction(shard * 2**64, count) <= hash_ < fractions.Fraction((shard + 1) * 2**64, count)


@pytest.mark.parametrize('count', [1, 2, 3, 7, 32, 1000])
def test_the_ranges_edges_go_to_their_shards(count: int) -> None:
    # The same arithmetic as the uids', by the hashes: the edges cannot be hit by searching for uids.
    assert shard_of_hash(0, count) == 0
    assert shard_of_hash(2**64 - 1, count) == count - 1
    for shard in range(1, min(count, 50)):
        first = -(-shard * 2**64 // count)  # the ceiling: the first integer hash of the shard's range
        assert shard_of_hash(first, count) == shard
        assert shard_of_hash(first - 1, count) == shard - 1


@given(st.integers(min_value=0, max_value=2**64 - 1), st.integers(min_value=1, max_value=10_000))
def test_every_hash_is_in_its_shards_range(value: int, count: int) -> None:
    shard = shard_of_hash(value, count)
    assert fractions.Fraction(shard * 2**64, count) <= value < fractions.Fraction((shard + 1) * 2**64, count)


def test_one_shard_has_all_objects() -> None:
    assert {shard_of(str(uuid.uuid4()), 1) for _ in range(100)} == {0}


def test_the_uids_spread_evenly_over_the_shards() -> None:
    uids = [str(uuid.uuid5(uuid.NAMESPACE_DNS, f'object-{index}')) for index in range(32_000)]
    counts = collections.Counter(shard_of(uid, 32) for uid in uids)
    assert sorted(counts) == list(range(32))
    assert max(counts.values()) < 1.1 * 1000 and min(counts.values()) > 0.9 * 1000


@pytest.mark.parametrize('count', [1, 2, 7, 8, 32, 33])
@pytest.mark.parametrize('members', [1, 2, 3, 5, 40])
def test_the_fair_shares_add_up_and_differ_by_one_at_most(count: int, members: int) -> None:
    identities = [f'replica-{index}' for index in range(members)]
    shares = [fair_share(identity, identities, count) for identity in identities]
    assert sum(shares) == count
    assert max(shares) - min(shares) <= 1


def test_the_bigger_shares_go_to_the_first_identities_in_order() -> None:
    identities = ['c', 'a', 'b']
    assert [fair_share(identity, identities, 8) for identity in 'abc'] == [3, 3, 2]


def test_the_own_identity_counts_even_if_not_seen_among_the_members() -> None:
    assert fair_share('me', ['other'], 8) == 4
    assert fair_share('me', [], 8) == 8


def test_member_lease_names_are_dns_names_and_unique() -> None:
    identities = ['user@host/20260101120000/x7k', 'user.host.20260101120000.x7k', 'x' * 300, '@@@', 'R1']
    names = [member_lease_name('op', identity) for identity in identities]
    assert len(set(names)) == len(names)
    for name in names:
        assert name.startswith('op-member-')
        assert len(name) <= 253
        assert re.fullmatch(r'[a-z0-9]([-a-z0-9.]*[a-z0-9])?', name), name
    assert member_lease_name('op', 'user@host/20260101120000/x7k').startswith('op-member-user-host-2026')


def test_the_filter_owns_the_objects_of_the_held_shards_only() -> None:
    uids = [str(uuid.uuid5(uuid.NAMESPACE_DNS, f'object-{index}')) for index in range(100)]
    filter_ = ShardFilter(4)
    assert not any(filter_.owns(uid) for uid in uids)  # nothing is held at first
    filter_.owned = frozenset({1, 3})
    assert [uid for uid in uids if filter_.owns(uid)] == [uid for uid in uids if shard_of(uid, 4) in {1, 3}]
    filter_.owned = frozenset(range(4))
    assert all(filter_.owns(uid) for uid in uids)


def test_the_filter_cache_is_bounded() -> None:
    filter_ = ShardFilter(4, cache_size=10)
    filter_.owned = frozenset({0, 1})
    uids = [str(uuid.uuid5(uuid.NAMESPACE_DNS, f'object-{index}')) for index in range(25)]
    assert [filter_.owns(uid) for uid in uids] == [shard_of(uid, 4) in {0, 1} for uid in uids]
    assert len(filter_._cache) <= 10


def test_the_sharding_settings_defaults() -> None:
    settings = OperatorSettings()
    assert settings.sharding.name is None  # disabled
    assert settings.sharding.namespace is None  # "default"
    assert settings.sharding.count == 32
    assert (settings.sharding.lease_duration, settings.sharding.renew_deadline,
            settings.sharding.retry_period) == (15, 10, 2)  # as the election's


@pytest.mark.parametrize('value', [0, -1, 1.5, True, '32'])
def test_the_count_must_be_a_positive_integer(value: object) -> None:
    settings = OperatorSettings()
    with pytest.raises(ValueError, match=r'^settings.sharding.count must be a positive integer, got '):
        settings.sharding.count = value  # type: ignore[assignment]


def test_the_sharding_and_the_election_exclude_each_other() -> None:
    settings = OperatorSettings()
    settings.sharding.name = 'op'
    settings.election.lease_name = 'op'
    with pytest.raises(ValueError) as excinfo:
        sharding.check_settings(settings)
    assert str(excinfo.value) == (
        'The sharding and the leader election exclude each other: set either settings.sharding.name '
        '(--shards) or settings.election.lease_name (--lease), not both.')


@pytest.mark.parametrize('name', ['Op', 'op_1', '-op', 'x' * 64])
def test_the_sharding_name_must_be_a_dns_name(name: str) -> None:
    settings = OperatorSettings()
    settings.sharding.name = name
    with pytest.raises(ValueError, match=r'^settings.sharding.name must be a DNS name .* got '):
        sharding.check_settings(settings)


def test_the_renew_deadline_must_be_shorter_than_the_lease_duration() -> None:
    settings = OperatorSettings()
    settings.sharding.name = 'op'
    settings.sharding.renew_deadline = 15
    with pytest.raises(ValueError, match=r'^settings.sharding.renew_deadline \(15\) must be less than '
                                         r'settings.sharding.lease_duration \(15.0\).$'):
        sharding.check_settings(settings)


# The server-side selector (KEP-5866): the held shards' ranges of the hashes, as the API server takes them.

@given(count=st.integers(min_value=1, max_value=1000), data=st.data())
def test_the_ranges_start_where_the_shards_start(count: int, data: st.DataObject) -> None:
    shard = data.draw(st.integers(min_value=0, max_value=count - 1))
    start, end = sharding.shard_start(shard, count), sharding.shard_start(shard + 1, count)
    assert shard_of_hash(start, count) == shard
    assert shard_of_hash(end - 1, count) == shard
    assert start == 0 or shard_of_hash(start - 1, count) == shard - 1
    assert end == 1 << 64 or shard_of_hash(end, count) == shard + 1


def test_the_adjacent_shards_are_merged_into_one_range() -> None:
    quarter = 1 << 62
    assert sharding.shard_ranges([3, 0, 1], 4) == [(0, 2 * quarter), (3 * quarter, 4 * quarter)]
    assert sharding.shard_ranges([], 4) == []


def test_the_selector_is_in_the_servers_syntax() -> None:
    assert sharding.shard_selector({0, 2, 3}, 4) == (
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x4000000000000000') || "
        "shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')")


def test_no_selector_for_all_the_shards_nor_for_too_many_ranges() -> None:
    assert sharding.shard_selector(set(range(8)), 8) is None
    every_other = set(range(0, 2 * sharding.MAX_SELECTOR_RANGES, 2))
    assert sharding.shard_selector(every_other, 2 * sharding.MAX_SELECTOR_RANGES) is not None
    every_other = set(range(0, 2 * sharding.MAX_SELECTOR_RANGES + 2, 2))
    assert sharding.shard_selector(every_other, 2 * sharding.MAX_SELECTOR_RANGES + 2) is None


def test_no_shards_select_one_hash_value_only() -> None:  # an empty range is invalid for the servers
    assert sharding.shard_selector(set(), 8) == \
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x0000000000000001')"


@given(count=st.integers(min_value=1, max_value=64), data=st.data())
def test_the_selected_hashes_are_those_of_the_shards(count: int, data: st.DataObject) -> None:
    shards = data.draw(st.sets(st.integers(min_value=0, max_value=count - 1)))
    value = data.draw(st.integers(min_value=0, max_value=(1 << 64) - 1))
    ranges = sharding.shard_ranges(shards, count)
    assert any(start <= value < end for start, end in ranges) == (shard_of_hash(value, count) in shards)


def test_the_filter_gives_the_selector_of_the_shards_held_now() -> None:
    shard_filter = ShardFilter(4)
    shard_filter.owned = frozenset({1})
    assert shard_filter.selector() == sharding.shard_selector({1}, 4)
    shard_filter.owned = frozenset({1, 2})
    assert shard_filter.selector() == sharding.shard_selector({1, 2}, 4)
