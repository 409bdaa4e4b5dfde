"""
Continuity: the handling continues after restarts from what is stored on the objects, ours or Kopf's.
"""
import json
import pathlib
from collections.abc import Callable
from typing import Any

import kopf
from kopf._cogs.structs.references import Resource
from kopf._core.intents.registries import OperatorRegistry

FIXTURES = pathlib.Path(__file__).parents[2] / 'persistence' / 'fixtures' / 'kopf-1.45.2'
SYSTEM_FIELDS = ('uid', 'creationTimestamp', 'generation', 'resourceVersion')


async def test_restart_in_the_middle_of_handling(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        messages: Callable[[], list[str]]) -> None:
    calls: list[tuple[str, int]] = []

    @kopf.on.create(kex.plural, registry=registry)
    def create_ok(retry: int, **_: Any) -> Any:
        calls.append(('create_ok', retry))
        return 'ok'

    @kopf.on.create(kex.plural, registry=registry)
    def create_retried(retry: int, **_: Any) -> Any:
        calls.append(('create_retried', retry))
        if retry < 1:
            raise kopf.TemporaryError('not yet', delay=0)
        return 'retried'

    await cluster.create()
    await operator.process(type='ADDED')
    await operator.process()
    assert calls == [('create_ok', 0), ('create_retried', 0)]
    annotations = cluster.get()['metadata']['annotations']
    assert json.loads(annotations['kopf.zalando.org/create_ok'])['success'] is True
    assert json.loads(annotations['kopf.zalando.org/create_retried'])['retries'] == 1

    # A new operator process continues: the succeeded handler is not called again.
    operator.restart()
    await operator.settle(first=None)
    assert calls == [('create_ok', 0), ('create_retried', 0), ('create_retried', 1)]
    obj = cluster.get()
    assert obj['status'] == {'create_ok': 'ok', 'create_retried': 'retried'}
    assert not any(key.startswith('kopf.zalando.org/create') for key in obj['metadata']['annotations'])
    assert 'Creation is processed: 2 succeeded; 0 failed.' in messages()


async def test_continuing_what_kopf_has_started(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource) -> None:
    calls: list[tuple[str, int]] = []

    @kopf.on.create(kex.plural, registry=registry)
    def create_a(**_: Any) -> None:
        raise AssertionError('Must not be called: Kopf has called it already.')

    @kopf.on.create(kex.plural, registry=registry)
    def create_retry(retry: int, **_: Any) -> Any:
        calls.append(('create_retry', retry))
        return 'done'

    @kopf.on.create(kex.plural, registry=registry)
    def create_b(retry: int, **_: Any) -> None:
        calls.append(('create_b', retry))

    # The object as Kopf has left it after its first 3 patches: create_a done, create_retry delayed.
    fixture = json.loads((FIXTURES / 'create-several.json').read_text())
    before = fixture['objects']['kex1']['before']
    metadata = {key: value for key, value in before['metadata'].items() if key not in SYSTEM_FIELDS}
    await cluster.create(metadata=metadata, spec=before['spec'])
    for request in fixture['requests'][:3]:
        await cluster.request(request['method'], request['path'], request['body'],
                              content_type=request['content_type'])
    record = json.loads(cluster.get()['metadata']['annotations']['kopf.zalando.org/create_retry'])
    assert record['retries'] == 1 and record['delayed'] < '2001'  # long overdue (fake timestamps)

    await operator.settle(first=None)
    assert calls == [('create_b', 0), ('create_retry', 1)]  # the least retried ones first
    obj = cluster.get()
    assert obj['status'] == {'create_a': {'message': 'hello'}, 'create_retry': 'done'}
    assert obj['metadata']['annotations'] == fixture['objects']['kex1']['after']['metadata']['annotations']


async def test_no_stalling_with_the_verbose_storage(
        registry: OperatorRegistry, operator: Any, cluster: Any, settings: Any, kex: Resource) -> None:

    # Kopf re-sends the unchanged records of this storage, and takes the no-op patch (which causes
    # no new event) for a reason not to sleep: it stalls. We send only the changed records,
    # and skip the sleep only if the patch has made a new version of the object.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(verbose=True)

    @kopf.on.create(kex.plural, registry=registry)
    def create_a(**_: Any) -> Any:
        return 'a'

    @kopf.on.create(kex.plural, registry=registry)
    def create_retry(retry: int, **_: Any) -> Any:
        if retry < 1:
            raise kopf.TemporaryError('not yet', delay=0.1)
        return 'retried'

    await cluster.create()
    await operator.settle(first=None)
    obj = cluster.get()
    assert obj['status'] == {'create_a': 'a', 'create_retry': 'retried'}
    assert not any(key.startswith('kopf.zalando.org/create') for key in obj['metadata']['annotations'])
