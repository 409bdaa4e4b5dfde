"""
The in-memory state of the objects: what is remembered, for how long, and how much it costs.
"""
import gc
import tracemalloc
import uuid
from typing import Any

import kopf
from kopf._core.reactor.inventory import ResourceMemories, ResourceMemory


def body(name: str = 'kex1', uid: str | None = 'uid1', kind: str = 'KopfExample') -> dict[str, Any]:
    meta = {'name': name, 'namespace': 'default'} | ({'uid': uid} if uid else {})
    return {'apiVersion': 'kopf.dev/v1', 'kind': kind, 'metadata': meta}


def test_recalled_once_and_forgotten() -> None:
    memories = ResourceMemories()
    memory = memories.recall(body(), noticed_by_listing=True)
    assert isinstance(memory, ResourceMemory)
    assert memory.noticed_by_listing and not memory.fully_handled_once
    assert memories.recall(body(), noticed_by_listing=False) is memory
    assert memory.noticed_by_listing  # only the first sight matters
    assert len(memories) == 1 and body() in memories and list(memories) == [memory]

    memories.forget(body())
    memories.forget(body())  # no errors for the unknown ones
    assert len(memories) == 0
    assert memories.recall(body()) is not memory


def test_keys_by_uid_or_by_identity() -> None:
    memories = ResourceMemories()
    assert memories.recall(body('a', uid='x')) is memories.recall(body('b', uid='x'))
    assert memories.recall(body('a', uid=None)) is not memories.recall(body('b', uid=None))
    assert memories.recall(body('a', uid=None)) is not memories.recall(body('a', uid=None, kind='Other'))
    assert len(memories) == 4


def test_ephemeral_memories_are_not_kept() -> None:
    memories = ResourceMemories()
    memory = memories.recall(body(), ephemeral=True)
    assert len(memories) == 0
    assert memories.recall(body()) is not memory
    assert memories.recall(body(), ephemeral=True) is memories.recall(body())


def test_memos_are_shallow_copies_of_the_operators_memo() -> None:
    memories = ResourceMemories()
    memobase = kopf.Memo(things=[])
    memo1 = memories.recall(body(uid='1'), memo=memobase).memo
    memo2 = memories.recall(body(uid='2'), memo=memobase).memo
    memo1.own = 1
    assert memo1 is not memo2 and memo1 is not memobase
    assert memo1.things is memo2.things is memobase.things
    assert 'own' not in memo2 and 'own' not in memobase
    assert isinstance(memories.recall(body(uid='3')).memo, kopf.Memo)  # even with no operator's memo


def test_idle_objects_cost_little() -> None:
    count = 10_000
    memobase = kopf.Memo()
    bodies = [body(f'kex{index}', uid=str(uuid.uuid4())) for index in range(count)]
    memories = ResourceMemories()
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for raw_body in bodies:
            memories.recall(raw_body, memo=memobase)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The uids are shared with the bodies: the memories' own cost is the records, the memos, the index.
    assert (after - before) / count < 300
    assert not hasattr(memories.recall(bodies[0]), '__dict__')
