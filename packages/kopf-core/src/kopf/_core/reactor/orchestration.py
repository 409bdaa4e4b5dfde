"""
Orchestration of the watchers: one task per (resource, namespace) that needs watching, no more, no less.

The orchestrator follows the :class:`~kopf._core.reactor.observation.Insights`: when a resource
or a served namespace appears, it starts a watcher; when it disappears, it stops the watcher
(which lets its objects' workers finish gracefully). Cluster-scoped resources, and all resources
in the cluster-wide mode, are watched with one cluster-wide stream each; namespaced resources
are watched in every served namespace separately.
"""
import asyncio
import logging
from collections.abc import Callable, Collection, Coroutine
from typing import Any

from kopf._cogs.structs.references import Resource
from kopf._core.reactor.observation import Insights

logger = logging.getLogger(__name__)

# Where to watch: a resource in a namespace, or cluster-wide (None).
WatchingKey = tuple[Resource, str | None]

# How to watch: a coroutine to run for a resource in a namespace (until cancelled).
WatcherFactory = Callable[[Resource, str | None], Coroutine[Any, Any, None]]


def get_desired_keys(resources: Collection[Resource], namespaces: Collection[str | None]) -> set[WatchingKey]:
    """All the combinations of resources and namespaces that need their own watch-stream."""
    keys: set[WatchingKey] = set()
    for resource in resources:
        if not resource.namespaced or None in namespaces:
            keys.add((resource, None))
        else:
            keys.update((resource, namespace) for namespace in namespaces if namespace is not None)
    return keys


async def orchestrator(
        *,
        insights: Insights,
        watcher_factory: WatcherFactory,
) -> None:
    """
    Start & stop the watchers as the insights change (runs forever; stops all the watchers on exit).

    ``insights.watching`` is set once the watchers of the initial insights are started.
    """
    watchers: dict[WatchingKey, asyncio.Task[None]] = {}
    try:
        await insights.ready_resources.wait()
        await insights.ready_namespaces.wait()
        while True:
            insights.changed.clear()
            desired = get_desired_keys(insights.resources, insights.namespaces)

            obsolete = {key: task for key, task in watchers.items() if key not in desired}
            for key in obsolete:
                del watchers[key]
            await _stop_watchers(obsolete.values())

            for key in sorted(desired - watchers.keys(), key=_sorting_key):
                resource, namespace = key
                watchers[key] = asyncio.create_task(watcher_factory(resource, namespace),
                                                    name=f'watcher for {resource!r}@{namespace}')

            insights.watching.set()
            await insights.changed.wait()
    finally:
        await _stop_watchers(watchers.values())
        logger.debug(f'Streaming tasks are stopped: {len(watchers)} watch-streams in total.')


async def _stop_watchers(tasks: Collection[asyncio.Task[None]]) -> None:
    """Cancel the watchers and wait until they exit (which includes their workers' graceful exit)."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            logger.error(f'A watcher has failed while stopping: {task.exception()!r}')


def _sorting_key(key: WatchingKey) -> tuple[str, str, str, str]:
    # Only for the stable order of starting (and of the logs), nothing more.
    resource, namespace = key
    return resource.group, resource.version, resource.plural, namespace or ''
