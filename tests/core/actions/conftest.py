"""
Shared fixtures of the actions' tests: the progress storage, settings, causes, handling cycles.

The helpers are given as fixtures (factories), since the test modules cannot import each other
(pytest runs in the importlib mode, without the tests' directories on sys.path).
"""
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest

from kopf._cogs.structs.bodies import Body
from kopf._cogs.structs.patches import Patch, apply_merge_patch
from kopf._cogs.structs.references import Resource
from kopf._core.actions.execution import deliver_results, execute_handlers_once
from kopf._core.actions.lifecycles import LifeCycleFn, all_at_once
from kopf._core.actions.progression import Outcome, State
from kopf._core.intents.causes import ResourceChangingCause
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import BaseHandler, HandlerId, Reason
from kopf._core.persistence.progress import SmartProgressStorage

KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', singular='kopfexample',
               namespaced=True, subresources=frozenset({'status'}))


@pytest.fixture
def storage() -> SmartProgressStorage:
    # The default storage: Kopf's annotations (and Kopf's older status records, read-only).
    return SmartProgressStorage()


@pytest.fixture
def settings(storage: SmartProgressStorage) -> OperatorSettings:
    settings = OperatorSettings()
    settings.persistence.progress_storage = storage
    return settings


@pytest.fixture
def logger() -> logging.Logger:
    return logging.getLogger('tests.actions')


@pytest.fixture
def make_body() -> Callable[..., dict[str, Any]]:
    def make_body(*, annotations: Mapping[str, str] | None = None, **fields: Any) -> dict[str, Any]:
        meta: dict[str, Any] = {'name': 'kex1', 'namespace': 'default', 'uid': 'uid1'}
        if annotations is not None:
            meta['annotations'] = dict(annotations)
        return {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': meta, **fields}
    return make_body


@pytest.fixture
def make_cause(logger: logging.Logger) -> Callable[..., ResourceChangingCause]:
    def make_cause(raw: Mapping[str, Any] | None = None, *, reason: Reason = Reason.CREATE,
                   **kwargs: Any) -> ResourceChangingCause:
        body = Body(dict(raw) if raw is not None else {'metadata': {'name': 'kex1'}})
        return ResourceChangingCause(reason=reason, resource=KEX, body=body, patch=Patch(body=body),
                                     logger=logger, **kwargs)
    return make_cause


# One handling cycle as the reactor does it: returns the new body (the patch applied locally),
# the outcomes, the advanced state, and the patch that was made.
CycleFn = Callable[..., Awaitable[tuple[dict[str, Any], Mapping[HandlerId, Outcome], State, Patch]]]


@pytest.fixture
def run_cycle(
        settings: OperatorSettings,
        storage: SmartProgressStorage,
        logger: logging.Logger,
        make_cause: Callable[..., ResourceChangingCause],
) -> CycleFn:
    async def run_cycle(
            raw: dict[str, Any],
            handlers: Sequence[BaseHandler],
            *,
            reason: Reason = Reason.CREATE,
            lifecycle: LifeCycleFn = all_at_once,
    ) -> tuple[dict[str, Any], Mapping[HandlerId, Outcome], State, Patch]:
        cause = make_cause(raw, reason=reason)
        state = State.from_storage(body=cause.body, storage=storage, handlers=handlers)
        state = state.with_purpose(reason).with_handlers(handlers)
        outcomes = await execute_handlers_once(lifecycle=lifecycle, settings=settings, handlers=handlers,
                                               cause=cause, state=state, logger=logger)
        state = state.with_outcomes(outcomes)
        state.store(body=cause.body, patch=cause.patch, storage=storage)
        deliver_results(outcomes=outcomes, patch=cause.patch)
        if state.done:
            state.purge(body=cause.body, patch=cause.patch, storage=storage, handlers=handlers)
        return apply_merge_patch(raw, cause.patch), outcomes, state, cause.patch
    return run_cycle
