"""
Observation of the cluster: which resources exist (for the handlers' selectors), which namespaces to serve.

The results are kept in :class:`Insights`, which the orchestrator follows to start & stop the watchers.

Resources: the cluster is scanned fully once at the start. Then, the custom resource definitions
are watched, and every change of them (a new CRD, a new version, a deleted CRD) leads to a rescan.
If ``settings.scanning.disabled`` is set, or the CRDs cannot be watched (HTTP 403), only the resources
found at the start are served.

Namespaces: in the cluster-wide mode, nothing is observed: the cluster-wide endpoints are used.
If the namespaces are given as plain names only, they are served as they are (even if they do not exist
yet: Kubernetes allows watching them anyway). If there are globs, negations, or regular expressions,
the namespaces of the cluster are watched, and those matching the patterns are served as they appear
and disappear. If the namespaces cannot be watched (HTTP 403) or the scanning is disabled, only the plain
names among the patterns are served, and the patterns themselves are ignored.

Other failures of the observation (after the API client's own retries of the network errors and 5xx)
are fatal for the operator: it cannot know what to serve, so it stops instead of serving it wrongly.
"""
import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Collection, Iterable

from kopf._clients import errors, scanning, watching
from kopf._clients.vault import Vault
from kopf._clients.watching import Bookmark
from kopf._cogs.structs.references import (
    NamespacePattern,
    Resource,
    Selector,
    are_specific_namespaces,
    match_namespaces,
    select_specific_namespaces,
)
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.registries import OperatorRegistry

logger = logging.getLogger(__name__)

CRDS = Resource('apiextensions.k8s.io', 'v1', 'customresourcedefinitions', kind='CustomResourceDefinition',
                singular='customresourcedefinition', shortcuts=frozenset({'crd', 'crds'}), namespaced=False,
                verbs=frozenset({'list', 'watch', 'get'}))
NAMESPACES = scanning.NAMESPACES

# What a resource must support to be served by watching.
WATCHING_VERBS = frozenset({'list', 'watch'})


@dataclasses.dataclass(eq=False)
class Insights:
    """
    What the operator knows about the cluster: the resources to watch and the namespaces to serve.

    ``namespaces`` contains ``None`` in the cluster-wide mode. The ``ready_*`` flags are set once
    the initial state is known; ``changed`` is set on every change (and cleared by its consumer);
    ``watching`` is set once the watch-streams for the initial state are started.
    ``webhook_resources`` are the cluster's resources of the admission handlers (not watched);
    ``webhooks_changed`` is set on their every change (for the managed webhook configurations).
    """

    resources: set[Resource] = dataclasses.field(default_factory=set)
    webhook_resources: set[Resource] = dataclasses.field(default_factory=set)
    webhooks_changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    namespaces: set[str | None] = dataclasses.field(default_factory=set)
    ready_resources: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    ready_namespaces: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    watching: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


async def _sleep_forever() -> None:
    await asyncio.Event().wait()


#
# Resources.
#

class _ResourcesPublisher:
    """Selects the served resources out of the scanned ones, and reports the unresolved selectors once."""

    def __init__(self, *, registry: OperatorRegistry, insights: Insights) -> None:
        super().__init__()
        self._registry = registry
        self._insights = insights
        self._unresolved: frozenset[Selector] = frozenset()
        self._unwatchable: frozenset[Resource] = frozenset()

    def publish(self, resources: Collection[Resource]) -> None:
        selectors = self._registry.get_selectors()
        selected = self._registry.select_resources(resources)
        watchable = {resource for resource in selected if resource.verbs >= WATCHING_VERBS}

        unresolved = frozenset(selector for selector in selectors
                               if selector.is_specific and not selector.select(resources))
        if unresolved and unresolved != self._unresolved:
            # A name of several API groups (none of them the core API) is ambiguous, not absent.
            ambiguous = {selector for selector in unresolved
                         if any(selector.check(resource) for resource in resources)}
            absent = unresolved - ambiguous
            if ambiguous:
                listed = ', '.join(sorted(repr(selector) for selector in ambiguous))
                logger.warning(f'Ambiguous resources will not be served (try specifying API groups): '
                               f'{listed}')
            if absent:
                listed = ', '.join(sorted(repr(selector) for selector in absent))
                logger.warning(f'Unresolved resources cannot be served (try creating their CRDs): {listed}')
            self._warn_on_empty_indices(unresolved)
        self._unresolved = unresolved

        unwatchable = frozenset(selected - watchable)
        if unwatchable and unwatchable != self._unwatchable:
            listed = ', '.join(sorted(resource.name for resource in unwatchable))
            logger.warning(f'Non-watchable resources will not be served: {listed}')
        self._unwatchable = unwatchable

        if watchable != self._insights.resources:
            self._insights.resources = set(watchable)
            self._insights.changed.set()
        webhooked = self._registry.webhooks.select_resources(resources)
        if webhooked != self._insights.webhook_resources:
            self._insights.webhook_resources = set(webhooked)
            self._insights.webhooks_changed.set()
        self._insights.ready_resources.set()

    def _warn_on_empty_indices(self, unresolved: frozenset[Selector]) -> None:
        # Nothing waits for the resources that are not in the cluster, so the indices are not filled silently.
        for handler in self._registry.indexing.get_all_handlers():
            if handler.selector in unresolved and handler.selector not in self._unresolved:
                logger.warning(f'Index {handler.id!r} stays empty while its resource is not in the cluster: '
                               f'{handler.selector!r}. The handlers do not wait for it; it is filled '
                               f'when the resource appears.')


async def resource_observer(
        *,
        settings: OperatorSettings,
        registry: OperatorRegistry,
        vault: Vault,
        insights: Insights,
) -> None:
    """
    Keep ``insights.resources`` up to date with the cluster's resources (runs forever, or fails).

    The full rescan happens after the CRDs are listed (so that no CRD is missed between the scan
    and the watching) and after every change of the CRDs; the changes that come while a rescan
    is running are served by one more rescan after it.
    """
    publisher = _ResourcesPublisher(registry=registry, insights=insights)

    async def rescan() -> None:
        resources = await scanning.scan_resources(settings=settings, vault=vault, logger=logger)
        publisher.publish(resources)

    if settings.scanning.disabled:
        await rescan()
        await _sleep_forever()

    rescan_needed = asyncio.Event()

    async def rescan_continuously() -> None:
        while True:
            await rescan_needed.wait()
            rescan_needed.clear()
            await rescan()

    async def watch_crds() -> None:
        logger.debug(f'Starting the watch-stream for {_describe(CRDS)} cluster-wide.')
        try:
            source = watching.infinite_watch(settings=settings, vault=vault, resource=CRDS, namespace=None,
                                             logger=logger)
            async with contextlib.aclosing(source) as crds:
                async for item in crds:
                    # The initial listing itself means nothing: only its end (and what comes after) does.
                    if item is Bookmark.LISTED or (isinstance(item, dict) and item.get('type') is not None):
                        rescan_needed.set()
        except (errors.APIForbiddenError, errors.APINotFoundError) as e:
            logger.warning(f'The custom resource definitions cannot be watched, so the resources are scanned '
                           f'only once; the CRDs created or deleted later will not be noticed: {e}')
            rescan_needed.set()  # if the initial scan has not happened yet, it must happen anyway.
            await _sleep_forever()
        finally:
            logger.debug(f'Stopping the watch-stream for {_describe(CRDS)} cluster-wide.')

    tasks = [
        asyncio.create_task(rescan_continuously(), name='resource rescanner'),
        asyncio.create_task(watch_crds(), name='CRD watcher'),
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # re-raise the failure, if any (they never exit normally).
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)


#
# Namespaces.
#

def _publish_namespaces(insights: Insights, namespaces: Iterable[str | None]) -> None:
    served = set(namespaces)
    if served != insights.namespaces:
        insights.namespaces = served
        insights.changed.set()
    insights.ready_namespaces.set()


async def namespace_observer(
        *,
        settings: OperatorSettings,
        vault: Vault,
        insights: Insights,
        clusterwide: bool,
        namespaces: Collection[NamespacePattern],
) -> None:
    """Keep ``insights.namespaces`` up to date with the cluster's namespaces (runs forever, or fails)."""
    if clusterwide:
        _publish_namespaces(insights, [None])
        await _sleep_forever()

    if are_specific_namespaces(namespaces):
        _publish_namespaces(insights, select_specific_namespaces(namespaces))
        await _sleep_forever()

    if settings.scanning.disabled:
        _warn_on_ignored_patterns(namespaces)
        _publish_namespaces(insights, select_specific_namespaces(namespaces))
        await _sleep_forever()

    existing: set[str] = set()
    listing: set[str] | None = None
    logger.debug(f'Starting the watch-stream for {_describe(NAMESPACES)} cluster-wide.')
    try:
        source = watching.infinite_watch(settings=settings, vault=vault, resource=NAMESPACES, namespace=None,
                                         logger=logger)
        async with contextlib.aclosing(source) as stream:
            async for item in stream:
                if item is Bookmark.LISTED:
                    existing, listing = listing or set(), None
                elif isinstance(item, dict):
                    name = (item.get('object', {}).get('metadata') or {}).get('name')
                    if not isinstance(name, str):
                        continue
                    if item.get('type') is None:
                        listing = (listing or set()) | {name}
                        continue  # published only when the listing is complete.
                    elif item.get('type') == 'DELETED':
                        existing.discard(name)
                    else:
                        existing.add(name)
                served = {name for name in existing if match_namespaces(name, namespaces)}
                _publish_namespaces(insights, served)
    except (errors.APIForbiddenError, errors.APINotFoundError):
        logger.warning('Not enough permissions to watch the namespaces: '
                       'serving the specific namespaces only (if any); the patterns are ignored.')
        _warn_on_ignored_patterns(namespaces)
        _publish_namespaces(insights, select_specific_namespaces(namespaces))
        await _sleep_forever()
    finally:
        logger.debug(f'Stopping the watch-stream for {_describe(NAMESPACES)} cluster-wide.')


def _warn_on_ignored_patterns(patterns: Collection[NamespacePattern]) -> None:
    ignored = [pattern for pattern in patterns if not are_specific_namespaces([pattern])]
    if ignored:
        logger.warning(f'Namespace patterns cannot be served without observing the namespaces; '
                       f'ignoring: {", ".join(repr(pattern) for pattern in ignored)}')


def _describe(resource: Resource) -> str:
    return '.'.join(part for part in (resource.plural, resource.version, resource.group) if part)
