"""
The operator-level activities: startup, cleanup, authentication (login), and probing.

The activity handlers are not related to any object, so they keep no state anywhere but
in memory: all handlers of an activity are executed together until each of them is done
(succeeded, failed permanently, or ignored its error); the failed ones are retried according
to their ``errors``, ``retries``, ``timeout``, ``backoff`` options, or to ``kopf.TemporaryError``
with its delay. If any of them fails for good, the whole activity fails with :class:`ActivityError`.

They get the kwargs: ``activity``, ``settings``, ``memo`` (the operator's one), ``logger``,
``param``, ``retry``, ``started``, ``runtime``, and the operator's indices (if any).
Synchronous handlers run in ``settings.execution.executor``; asynchronous ones in the event loop.

The authentication keeps the vault populated: once at the start (by the login handlers or,
if none are declared, by the default login functions as if they were login handlers whose
errors are ignored), then again every time the vault is depleted (e.g. when the API rejects all
the credentials with HTTP 401, or they expire). If the login brings nothing usable, the operator
cannot continue and fails with :class:`kopf.LoginError`.

This module runs the handlers with a small invocation cycle of its own. The resource handlers
have a richer one (with the progress storage, sub-handlers, and patches) in the actions layer.
"""
import asyncio
import contextvars
import dataclasses
import datetime
import functools
import inspect
import logging
from collections.abc import Callable, Collection, Mapping, MutableMapping
from typing import Any

from kopf._clients import logins
from kopf._clients.vault import Vault
from kopf._cogs.helpers.typedefs import Logger
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError, VaultKey
from kopf._core.actions.errors import (
    HandlerRetriesError,
    HandlerTimeoutError,
    PermanentError,
    TemporaryError,
)
from kopf._core.intents.causes import ActivityCause
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import Activity, ActivityHandler, ErrorsMode, HandlerId
from kopf._core.intents.registries import OperatorRegistry

logger = logging.getLogger(__name__)

# The loggers given to the handlers (and where their invocation is reported), by activity.
ACTIVITY_LOGGER_NAMES: Mapping[Activity, str] = {
    Activity.STARTUP: 'kopf.activities.startup',
    Activity.CLEANUP: 'kopf.activities.cleanup',
    Activity.AUTHENTICATION: 'kopf.activities.authentication',
    Activity.PROBE: 'kopf.activities.probe',
}

NO_CREDENTIALS_MESSAGE = (
    'Ran out of valid credentials. Consider installing an API client library or adding a login handler. '
    'See more: https://docs.kopf.dev/en/stable/authentication/'
)


class ActivityError(Exception):
    """
    Some handlers of an activity have failed for good (permanently, or out of retries/time).

    ``outcomes`` has the outcome of every handler by its id; the exception's ``__cause__``
    is the error of the first failed handler in the order of declaration.
    """

    outcomes: Mapping[HandlerId, 'ActivityOutcome']

    def __init__(self, message: str, *, outcomes: Mapping[HandlerId, 'ActivityOutcome']) -> None:
        super().__init__(message)
        self.outcomes = outcomes


@dataclasses.dataclass(frozen=True)
class ActivityOutcome:
    """How one attempt (or the whole execution) of an activity handler has ended."""

    final: bool
    result: Any = None
    exception: BaseException | None = None
    delay: float | None = None


@dataclasses.dataclass(eq=False)
class _HandlerState:
    """The in-memory progress of one handler: when it started, how many attempts, when the next one."""

    started: datetime.datetime
    started_at: float  # the event loop's time, for the runtime & the timeouts
    retries: int = 0
    next_attempt_at: float | None = None
    outcome: ActivityOutcome | None = None


def get_activity_logger(activity: Activity) -> logging.Logger:
    return logging.getLogger(ACTIVITY_LOGGER_NAMES.get(activity, f'kopf.activities.{activity}'))


def _is_async_fn(fn: Callable[..., Any]) -> bool:
    # Callable objects with ``async def __call__`` are coroutine functions in effect, too.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, '__call__', None))


async def invoke_fn(fn: Callable[..., Any], *, kwargs: Mapping[str, Any], settings: OperatorSettings) -> Any:
    """
    Call a handler (or any callback) with the kwargs: async ones directly, sync ones in the executor.

    The context variables are copied into the executor's thread, so that the helpers that rely
    on them (e.g. the current object for ``kopf.adopt()``) work in sync handlers too.
    Whatever awaitable a sync function returns (e.g. a partial of an async function) is awaited.
    """
    if _is_async_fn(fn):
        return await fn(**kwargs)
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    call = functools.partial(context.run, fn, **kwargs)
    result = await loop.run_in_executor(settings.execution.executor, call)
    if inspect.isawaitable(result):
        result = await result
    return result


async def run_activity(
        *,
        activity: Activity,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        memo: Any = None,
        indices: Mapping[str, Any] | None = None,
        handlers: Collection[ActivityHandler] | None = None,
) -> dict[HandlerId, Any]:
    """
    Execute all the handlers of an activity until each of them is done; return their results by id.

    The handlers are the ones registered for the activity unless given explicitly.
    Raises :class:`ActivityError` if any of them has failed for good (after the others are done).
    """
    actual_handlers = list(handlers) if handlers is not None else registry.activities.get_handlers(activity)
    outcomes = await execute_activity_handlers(
        handlers=actual_handlers, activity=activity, settings=settings, memo=memo, indices=indices)
    failures = [outcomes[handler.id].exception for handler in actual_handlers
                if outcomes[handler.id].exception is not None]
    if failures:
        raise ActivityError('One or more handlers failed.', outcomes=outcomes) from failures[0]
    return {handler_id: outcome.result for handler_id, outcome in outcomes.items()}


async def execute_activity_handlers(
        *,
        handlers: Collection[ActivityHandler],
        activity: Activity,
        settings: OperatorSettings,
        memo: Any = None,
        indices: Mapping[str, Any] | None = None,
) -> dict[HandlerId, ActivityOutcome]:
    """
    Run the handlers in rounds: every round invokes all the handlers that are due, in their order;
    between the rounds, sleep until the earliest retry is due. Stop when all of them are done.
    """
    loop = asyncio.get_running_loop()
    activity_logger = get_activity_logger(activity)
    ordered = list(handlers)
    states = [_HandlerState(started=datetime.datetime.now(datetime.UTC), started_at=loop.time())
              for _ in ordered]
    while True:
        pending = [(handler, state) for handler, state in zip(ordered, states, strict=True)
                   if state.outcome is None or not state.outcome.final]
        if not pending:
            break

        due = [(handler, state) for handler, state in pending
               if state.next_attempt_at is None or state.next_attempt_at <= loop.time()]
        for handler, state in due:
            cause = ActivityCause(logger=activity_logger, memo=memo, indices=dict(indices or {}),
                                  activity=activity, settings=settings)
            state.outcome = await _execute_once(handler=handler, state=state, cause=cause,
                                                settings=settings, logger=activity_logger)
            state.retries += 1
            if not state.outcome.final:
                state.next_attempt_at = loop.time() + (state.outcome.delay or 0)

        # Even an immediate retry yields to the event loop, so that the operator stays responsive.
        upcoming = [state.next_attempt_at for _, state in pending
                    if state.outcome is not None and not state.outcome.final and state.next_attempt_at is not None]
        delay = max(0.0, min(upcoming) - loop.time()) if upcoming else 0.0
        await asyncio.sleep(delay)

    outcomes: dict[HandlerId, ActivityOutcome] = {}
    for handler, state in zip(ordered, states, strict=True):
        assert state.outcome is not None
        outcomes[handler.id] = state.outcome
    return outcomes


async def _execute_once(
        *,
        handler: ActivityHandler,
        state: _HandlerState,
        cause: ActivityCause,
        settings: OperatorSettings,
        logger: Logger,
) -> ActivityOutcome:
    """One attempt of one handler, with the reporting and the decision on what is next."""
    loop = asyncio.get_running_loop()
    title = f'Activity {handler.id!r}'
    runtime = loop.time() - state.started_at

    # A long previous attempt or a long delay could have eaten the whole time of the handler.
    if handler.timeout is not None and runtime > handler.timeout:
        message = f'{title} has timed out after {runtime:.3f} seconds.'
        logger.error(message)
        return ActivityOutcome(final=True, exception=HandlerTimeoutError(message))

    kwargs: MutableMapping[str, Any] = {
        **cause.kwargs_for(handler),
        'retry': state.retries,
        'started': state.started,
        'runtime': datetime.timedelta(seconds=runtime),
    }
    kwargs.update(cause.indices)  # the indices win over the framework's own kwargs of the same names.

    logger.debug(f'{title} is invoked.')
    try:
        result = await invoke_fn(handler.fn, kwargs=kwargs, settings=settings)

    except asyncio.CancelledError:
        logger.warning(f'{title} is cancelled. Will escalate.')
        raise

    except PermanentError as e:
        logger.error(f'{title} failed permanently: {e}')
        return ActivityOutcome(final=True, exception=e)

    except TemporaryError as e:
        delay = e.delay or 0
        runtime_after = loop.time() - state.started_at + delay
        if handler.retries is not None and state.retries + 1 >= handler.retries:
            message = f'{title} failed temporarily but will exceed {handler.retries} retries: {e}'
            logger.error(message)
            return ActivityOutcome(final=True, exception=_chained(HandlerRetriesError(message), e))
        if handler.timeout is not None and runtime_after > handler.timeout:
            message = f'{title} failed temporarily but will time out after {handler.timeout} seconds: {e}'
            logger.error(message)
            return ActivityOutcome(final=True, exception=_chained(HandlerTimeoutError(message), e))
        logger.error(f'{title} failed temporarily: {e}')
        return ActivityOutcome(final=False, exception=e, delay=delay)

    except Exception as e:
        mode = handler.errors if handler.errors is not None else ErrorsMode.TEMPORARY
        if mode == ErrorsMode.IGNORED:
            logger.exception(f'{title} failed with an exception and will ignore it: {e}')
            return ActivityOutcome(final=True)
        if mode == ErrorsMode.PERMANENT:
            logger.exception(f'{title} failed with an exception and will stop now: {e}')
            return ActivityOutcome(final=True, exception=e)
        backoff = handler.backoff if handler.backoff is not None else settings.execution.default_backoff
        runtime_after = loop.time() - state.started_at + backoff
        if handler.retries is not None and state.retries + 1 >= handler.retries:
            message = (f'{title} failed with an exception and will stop now '
                       f'(it would exceed {handler.retries} retries on the next attempt): {e}')
            logger.exception(message)
            return ActivityOutcome(final=True, exception=_chained(HandlerRetriesError(message), e))
        if handler.timeout is not None and runtime_after > handler.timeout:
            message = (f'{title} failed with an exception and will stop now '
                       f'(it would time out in {handler.timeout} seconds on the next attempt): {e}')
            logger.exception(message)
            return ActivityOutcome(final=True, exception=_chained(HandlerTimeoutError(message), e))
        logger.exception(f'{title} failed with an exception and will try again in {backoff} seconds: {e}')
        return ActivityOutcome(final=False, exception=e, delay=backoff)

    else:
        logger.info(f'{title} succeeded.')
        return ActivityOutcome(final=True, result=result)


def _chained(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


#
# Probing.
#

async def run_probes(
        *,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        memo: Any = None,
        indices: Mapping[str, Any] | None = None,
) -> dict[HandlerId, Any]:
    """
    Collect the values of the probe handlers for a liveness report: ``{handler_id: result}``.

    The probes are executed as any other activity; a probe that fails for good fails the report.
    """
    return await run_activity(activity=Activity.PROBE, registry=registry, settings=settings,
                              memo=memo, indices=indices)


#
# Authentication.
#

def get_default_login_handlers() -> list[ActivityHandler]:
    """
    The login handlers to use when none are declared: the default login functions, errors ignored.

    Each of them is tried; all the credentials they bring are used (see ``kopf.login_via_*``).
    """
    return [
        ActivityHandler(fn=fn, id=HandlerId(getattr(fn, '__name__', repr(fn))),
                        activity=Activity.AUTHENTICATION, errors=ErrorsMode.IGNORED)
        for fn in logins.default_login_fns()
    ]


async def authenticate(
        *,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        vault: Vault,
        memo: Any = None,
        indices: Mapping[str, Any] | None = None,
        initial: bool = True,
) -> None:
    """
    Run the login handlers (or the default login functions) once and put their credentials into the vault.

    The results that are not :class:`kopf.ConnectionInfo` are ignored (``None`` means "nothing to offer").
    Handlers that have failed for good do not prevent the others from providing credentials.
    If nothing usable is in the vault afterwards, :class:`kopf.LoginError` is raised.
    """
    what = 'Initial authentication' if initial else 'Re-authentication'
    logger.info(f'{what} has been initiated.')

    handlers = registry.activities.get_handlers(Activity.AUTHENTICATION) or get_default_login_handlers()
    failure: ActivityError | None = None
    try:
        results = await run_activity(activity=Activity.AUTHENTICATION, registry=registry, handlers=handlers,
                                     settings=settings, memo=memo, indices=indices)
    except ActivityError as e:
        failure = e
        results = {handler_id: outcome.result for handler_id, outcome in e.outcomes.items()
                   if outcome.exception is None}

    credentials: dict[VaultKey, ConnectionInfo] = {}
    for handler_id, result in results.items():
        if isinstance(result, ConnectionInfo):
            credentials[VaultKey(handler_id)] = result
        elif result is not None:
            logger.warning(f'Login handler {handler_id!r} returned {type(result).__name__} instead of '
                           f'kopf.ConnectionInfo; ignoring it.')

    # Populate even with nothing: the API calls waiting for the credentials must fail, not hang.
    await vault.populate(credentials)
    if vault.is_empty():
        logger.warning(f'{what} has failed: no credentials were retrieved from the login handlers.')
        raise LoginError(NO_CREDENTIALS_MESSAGE) from failure
    logger.info(f'{what} has finished.')


async def authenticator(
        *,
        registry: OperatorRegistry,
        settings: OperatorSettings,
        vault: Vault,
        memo: Any = None,
        indices: Mapping[str, Any] | None = None,
) -> None:
    """
    Keep the vault populated for the whole life of the operator (runs forever, or fails).

    The API calls that find the vault depleted (all credentials rejected or expired) wait for
    new credentials; this task notices the depletion and logs in again. Previously rejected
    credentials are ignored by the vault, so broken credentials do not cause an endless re-login:
    if a re-login brings nothing new, the waiting calls and the operator fail with LoginError.
    """
    await authenticate(registry=registry, settings=settings, vault=vault, memo=memo,
                       indices=indices, initial=True)
    while True:
        await vault.wait_for_emptiness()
        await authenticate(registry=registry, settings=settings, vault=vault, memo=memo,
                           indices=indices, initial=False)
