"""
The logs about the objects: the messages, their levels, and which of them can become k8s-events.

Kopf posts (if configured so) the messages about the handling of the changes, but not the technical
ones (the finalizers, the patches, the end of the cycles) nor anything of the event-watching handlers.
The exact texts are compared with Kopf's logs in the compatibility tests; these are the key ones.
"""
from typing import Any

import pytest

import kopf
from kopf._cogs.structs.references import Resource
from kopf._core.intents.registries import OperatorRegistry


async def test_levels_and_locality(
        registry: OperatorRegistry, operator: Any, cluster: Any, kex: Resource,
        caplog: pytest.LogCaptureFixture) -> None:

    @kopf.on.event(kex.plural, registry=registry)
    def event_fn(logger: Any, **_: Any) -> None:
        logger.info('EVENT')

    @kopf.on.create(kex.plural, registry=registry)
    def create_fn(logger: Any, **_: Any) -> None:
        logger.info('CREATE')

    @kopf.on.delete(kex.plural, registry=registry)
    def delete_fn(**_: Any) -> None:
        pass

    await cluster.create()
    await operator.settle(first=None)
    await cluster.patch('kex1', {'spec': {'field': 'changed'}})
    await operator.settle(first='MODIFIED')
    await cluster.delete('kex1')
    await operator.settle(first='MODIFIED')

    logged = [(record.levelname, record.getMessage().split(':')[0], bool(getattr(record, 'kopf_local_only')))  # noqa: B009
              for record in caplog.records if record.name == 'kopf.objects'
              and not record.getMessage().startswith(("Handler 'event_fn'", 'EVENT'))]
    assert logged == [
        ('DEBUG', 'Adding the finalizer, thus preventing the actual deletion.', True),
        ('DEBUG', 'Merge-patching the resource with', True),  # the finalizer, before the handlers
        ('DEBUG', 'Creation is in progress', False),
        ('DEBUG', "Handler 'create_fn' is invoked.", False),
        ('INFO', 'CREATE', False),
        ('INFO', "Handler 'create_fn' succeeded.", False),
        ('INFO', 'Creation is processed', False),
        ('DEBUG', 'Merge-patching the resource with', True),
        ('DEBUG', 'Something has changed, but we are not interested (the essence is the same).', False),
        ('DEBUG', 'Handling cycle is finished, waiting for new changes.', True),
        ('DEBUG', 'Updating is in progress', False),
        ('DEBUG', 'Updating diff', False),
        ('DEBUG', 'Merge-patching the resource with', True),
        ('DEBUG', 'Something has changed, but we are not interested (the essence is the same).', False),
        ('DEBUG', 'Handling cycle is finished, waiting for new changes.', True),
        ('DEBUG', 'Deletion is in progress', False),
        ('DEBUG', "Handler 'delete_fn' is invoked.", False),
        ('INFO', "Handler 'delete_fn' succeeded.", False),
        ('INFO', 'Deletion is processed', False),
        ('DEBUG', 'Removing the finalizer, thus allowing the actual deletion.', True),
        ('DEBUG', 'Merge-patching the resource with', True),
        ('DEBUG', 'Deleted, really deleted, and we are notified.', False),
    ]
    events = [record for record in caplog.records
              if record.getMessage().startswith(("Handler 'event_fn'", 'EVENT'))]
    assert events and all(getattr(record, 'kopf_local_only') for record in events)  # noqa: B009
