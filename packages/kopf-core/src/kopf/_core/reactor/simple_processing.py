"""
A stopgap processor of the watch-events: only the event-watching handlers (``@kopf.on.event``).

It invokes the matching handlers for every (batched) event with their usual kwargs and ignores
their errors (as documented for these handlers). It neither applies the patches nor stores
the results, and it gives the handlers the operator's memo instead of a per-object one.
The full per-object processing cycle (changes, daemons, timers, indices) replaces it.
"""
import asyncio
import datetime
from typing import Any

from kopf._cogs.structs.bodies import Body, RawEvent
from kopf._cogs.structs.patches import Patch
from kopf._cogs.structs.references import Resource
from kopf._core.actions import invocation, loggers
from kopf._core.intents.causes import ResourceWatchingCause
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.registries import OperatorRegistry


async def process_watching_handlers(
        *,
        raw_event: RawEvent,
        stream_pressure: asyncio.Event,
        resource: Resource,
        namespace: str | None,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        memo: Any = None,
) -> None:
    """Invoke the ``@kopf.on.event`` handlers of the resource that match the event; log their errors."""
    body = Body(raw_event['object'])
    logger = loggers.ObjectLogger(body=raw_event['object'], settings=settings)
    cause = ResourceWatchingCause(logger=logger, memo=memo, resource=resource, body=body, patch=Patch(),
                                  type=raw_event['type'], event=raw_event)
    for handler in registry.watching.iter_handlers(cause):
        title = f'Handler {handler.id!r}'
        kwargs = {**cause.kwargs_for(handler), 'retry': 0, 'runtime': datetime.timedelta(0),
                  'started': datetime.datetime.now(datetime.UTC)}
        logger.debug(f'{title} is invoked.')
        try:
            await invocation.invoke(handler.fn, kwargs=kwargs, executor=settings.execution.executor)
        except Exception as e:
            logger.exception(f'{title} failed with an exception and will ignore it: {e}')
        else:
            logger.info(f'{title} succeeded.')
