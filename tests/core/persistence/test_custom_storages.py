"""
Custom storages, written against Kopf's documented interface (e.g. keeping the state in a database).
"""
import json
from typing import Any

import pytest

from kopf._cogs.structs.bodies import Body, BodyEssence
from kopf._cogs.structs.patches import Patch
from kopf._core.persistence import (
    AnnotationsDiffBaseStorage,
    AnnotationsProgressStorage,
    DiffBaseStorage,
    MultiDiffBaseStorage,
    MultiProgressStorage,
    ProgressRecord,
    ProgressStorage,
)


class ExternalProgressStorage(ProgressStorage):
    """As in the docs: only fetch(), store(), purge() are implemented, and flush() optionally."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, str], ProgressRecord | None] = {}
        self.database: dict[tuple[str, str], ProgressRecord] = {}

    def fetch(self, *, key: str, body: Body) -> ProgressRecord | None:
        return self.database.get((body['metadata']['uid'], key))

    def store(self, *, key: str, record: ProgressRecord, body: Body, patch: Patch) -> None:
        self.pending[(body['metadata']['uid'], key)] = record

    def purge(self, *, key: str, body: Body, patch: Patch) -> None:
        self.pending[(body['metadata']['uid'], key)] = None

    def flush(self) -> None:
        for db_key, record in self.pending.items():
            if record is None:
                self.database.pop(db_key, None)
            else:
                self.database[db_key] = record
        self.pending.clear()


class ExternalDiffBaseStorage(DiffBaseStorage):
    def __init__(self) -> None:
        super().__init__()
        self.database: dict[str, BodyEssence] = {}

    def fetch(self, *, body: Body) -> BodyEssence | None:
        return self.database.get(body['metadata']['uid'])

    def store(self, *, body: Body, patch: Patch, essence: BodyEssence) -> None:
        self.database[body['metadata']['uid']] = essence


class CustomEssenceStorage(AnnotationsDiffBaseStorage):
    """A changed definition of the essence: the labels do not matter."""

    def build(self, *, body: Body, extra_fields: Any = None) -> BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        essence.get('metadata', {}).pop('labels', None)
        self.remove_empty_stanzas(essence)
        return essence


BODY = Body({'metadata': {'uid': 'uid1', 'labels': {'a': 'b'}}, 'spec': {'x': 1}})


def test_documented_minimal_progress_storage_works() -> None:
    storage = ExternalProgressStorage()
    patch = Patch()
    storage.store(key='fn', record={'started': 'now'}, body=BODY, patch=patch)
    assert storage.fetch(key='fn', body=BODY) is None  # not flushed yet
    storage.flush()
    assert storage.fetch(key='fn', body=BODY) == {'started': 'now'}
    storage.touch(body=BODY, patch=patch, value='x')  # nothing to touch in the object: fine
    assert not patch  # nothing goes to the object itself
    assert storage.clear(essence={'spec': {'x': 1}}) == {'spec': {'x': 1}}
    storage.purge(key='fn', body=BODY, patch=patch)
    storage.flush()
    assert storage.fetch(key='fn', body=BODY) is None


def test_custom_storage_combines_with_the_builtin_ones() -> None:
    external = ExternalProgressStorage()
    storage = MultiProgressStorage([external, AnnotationsProgressStorage()])
    patch = Patch()
    storage.store(key='fn', record={'started': 'now'}, body=BODY, patch=patch)
    storage.flush()
    assert external.database == {('uid1', 'fn'): {'started': 'now'}}
    assert json.loads(json.dumps(patch)) == {'metadata': {'annotations': {
        'kopf.zalando.org/fn': '{"started":"now"}'}}}
    assert storage.fetch(key='fn', body=BODY) == {'started': 'now'}


def test_documented_minimal_diffbase_storage_works() -> None:
    storage = ExternalDiffBaseStorage()
    essence = storage.build(body=BODY)
    assert essence == {'spec': {'x': 1}, 'metadata': {'labels': {'a': 'b'}}}
    storage.store(body=BODY, patch=Patch(), essence=essence)
    assert storage.fetch(body=BODY) == essence


def test_custom_essence_is_used_by_the_multi_storage() -> None:
    storage = MultiDiffBaseStorage([CustomEssenceStorage(), ExternalDiffBaseStorage()])
    assert storage.build(body=BODY) == {'spec': {'x': 1}}


class NoFetch(ProgressStorage):
    def store(self, *, key: str, record: ProgressRecord, body: Body, patch: Patch) -> None:
        pass

    def purge(self, *, key: str, body: Body, patch: Patch) -> None:
        pass


class NoStore(DiffBaseStorage):
    def fetch(self, *, body: Body) -> BodyEssence | None:
        return None


@pytest.mark.parametrize('cls', [ProgressStorage, DiffBaseStorage, NoFetch, NoStore])
def test_incomplete_storages_cannot_be_created(cls: type) -> None:
    with pytest.raises(TypeError):
        cls()
