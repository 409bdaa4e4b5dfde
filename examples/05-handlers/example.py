"""
Several handlers for one resource: the creation, resuming, updates of specific fields, deletion.

All the handlers for the same change run one after another, each at most once successfully;
their results are stored separately (``status.<handler-id>``).

Run it with: kopf run examples/05-handlers/example.py --verbose
Then restart the operator: the resuming handler runs for the objects that already exist.
"""
from typing import Any

import kopf


@kopf.on.create('kopfexamples')
def create_fn(name: str | None, logger: kopf.Logger, **_: Any) -> dict[str, Any]:
    logger.info(f'{name!r} is created.')
    return {'message': 'created'}


@kopf.on.resume('kopfexamples')
def resume_fn(name: str | None, logger: kopf.Logger, **_: Any) -> dict[str, Any]:
    # Called once per object when the operator starts (or restarts) and finds the object existing.
    # A typical use: re-create the in-memory state (tasks, caches) that was lost with the restart.
    logger.info(f'{name!r} is resumed after the operator has started.')
    return {'message': 'resumed'}


@kopf.on.update('kopfexamples')
def update_fn(diff: kopf.Diff, logger: kopf.Logger, **_: Any) -> None:
    # Any change of the object's essence: spec, labels, annotations (not the status).
    fields = ', '.join('.'.join(change.field) for change in diff)
    logger.info(f'Updated fields: {fields}.')


@kopf.on.field('kopfexamples', field='spec.field')
def field_fn(old: Any, new: Any, logger: kopf.Logger, **_: Any) -> None:
    # Whenever spec.field is affected (also when it appears on creation: then old is None).
    # old & new are the values of that field, not of the whole object.
    logger.info(f'spec.field: {old!r} -> {new!r}')


@kopf.on.delete('kopfexamples')
def delete_fn(name: str | None, logger: kopf.Logger, **_: Any) -> None:
    logger.info(f'{name!r} is deleted.')
