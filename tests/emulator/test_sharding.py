"""
The emulator's feature gates: the sharded lists & watches are off by default, and can be turned on & off.

Their semantics, the same as kube-apiserver's, are in ``tests/kubeapi/test_sharded_lists.py`` (both servers).
"""
from typing import Any

import pytest

from kopf.testing.emulator import KubernetesEmulator
from kopf.testing.emulator.__main__ import main as emulator_main
from kopf.testing.emulator.sharding import fnv1a_64, parse_shard_selector

HALF = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"


async def test_the_gate_is_off_by_default_and_can_be_switched_later(
        api: Any, emulator: KubernetesEmulator,
) -> None:
    path = '/api/v1/namespaces?shardSelector=garbage'
    reply = await api.get(path)
    assert reply.status == 200 and 'shardInfo' not in reply.body['metadata']
    emulator.feature_gates['ShardedListAndWatch'] = True
    reply = await api.get(path)
    assert reply.status == 500
    assert reply.body['message'].startswith('invalid shard selector: unexpected expression kind 3')


def test_unknown_feature_gates_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r'^Unknown feature gates of the emulator: NoSuchGate; '
                                         r'it knows only: ShardedListAndWatch\.$'):
        KubernetesEmulator(feature_gates={'NoSuchGate': True})
    with pytest.raises(SystemExit, match=r'^Error: Unknown feature gates of the emulator: NoSuchGate;'):
        emulator_main(['--feature-gates', 'NoSuchGate=true'])


def test_the_hash_of_the_selectors_is_fnv1a_64_of_the_field() -> None:
    selector = parse_shard_selector(HALF)
    assert selector is not None
    assert fnv1a_64('a') == 0xaf63dc4c8601ec8c  # a published test vector of FNV-1a 64
    assert fnv1a_64('ab') == 0x089c4407b545986a
    assert not selector.matches({'metadata': {'uid': 'a'}})
    assert selector.matches({'metadata': {'uid': 'ab'}})
    assert parse_shard_selector('  ') is None
