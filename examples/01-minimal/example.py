"""
The smallest useful operator: react to the creation, change and deletion of KopfExamples.

Run it against a cluster (or the emulator) with: kopf run examples/01-minimal/example.py --verbose
"""
from typing import Any

import kopf


@kopf.on.create('kopfexamples')
def create_fn(spec: kopf.Spec, name: str | None, logger: kopf.Logger, **_: Any) -> dict[str, Any]:
    logger.info(f'A KopfExample {name!r} is created with spec: {dict(spec)}')
    return {'message': f'hello, {name}'}  # stored in the object's status.create_fn


@kopf.on.update('kopfexamples')
def update_fn(diff: kopf.Diff, logger: kopf.Logger, **_: Any) -> None:
    for change in diff:
        logger.info(f'Changed: {change.op} {".".join(change.field)}: {change.old!r} -> {change.new!r}')


@kopf.on.delete('kopfexamples')
def delete_fn(name: str | None, logger: kopf.Logger, **_: Any) -> None:
    logger.info(f'A KopfExample {name!r} is being deleted: cleaning up.')
