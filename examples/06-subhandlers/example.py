"""
Sub-handlers: one handler's work split into smaller steps, each with its own retries and results.

Here, every item of ``spec.items`` is handled separately: if one item fails, only that item is
retried later, while the items that have succeeded are not handled again.

* Declaratively: ``@kopf.subhandler`` inside a handler, for a function defined there.
* Imperatively: ``await kopf.execute(fns=...)`` in an async handler, for any functions.

The sub-handlers get ids like ``create_fn/item1``: that is also where their results are stored.
The parent handler is called again until all its sub-handlers are done, so it must only declare
them (no side effects of its own).

Run it with: kopf run examples/06-subhandlers/example.py --verbose
"""
import functools
from typing import Any

import kopf


@kopf.on.create('kopfexamples')
def create_fn(spec: kopf.Spec, **_: Any) -> None:
    for item in spec.get('items', []):

        # The default value binds the current item: the function is called later, after the loop.
        @kopf.subhandler(id=item)
        def create_item(item: str = item, *, logger: kopf.Logger, **_: Any) -> dict[str, Any]:
            logger.info(f'Creating {item!r}.')
            return {'created': item}


@kopf.on.update('kopfexamples', field='spec.field')
async def update_fn(spec: kopf.Spec, new: Any, **_: Any) -> None:
    fns = {item: functools.partial(update_item, item=item, value=new) for item in spec.get('items', [])}
    await kopf.execute(fns=fns)


def update_item(item: str, value: Any, logger: kopf.Logger, **_: Any) -> dict[str, Any]:
    logger.info(f'Updating {item!r} with {value!r}.')
    return {'updated': item, 'value': value}
