"""
The operator-level activities: startup, cleanup, authentication (login), and probing.

The activity handlers are not related to any object, so their progress is kept only in memory:
all handlers of an activity are executed in rounds (all the due ones in every round, in the order
of declaration) until each of them is done --- succeeded, failed for good, or ignored its error.
The errors, retries, timeouts, and back-offs are applied by the same execution rules as for any
other handlers (see ``kopf._core.actions.execution``). If any handler fails for good, the whole
activity fails with :class:`ActivityError` once the others are done.

The handlers get the kwargs: ``activity``, ``settings``, ``memo`` (the operator's one), ``logger``,
``param``, ``retry``, ``started``, ``runtime``, and the operator's indices (if any).

The authentication keeps the vault populated: once at the start (by the login handlers or,
if none are declared, by the default login functions as if they were login handlers whose
errors are ignored), then again every time the vault is depleted (e.g. when the API rejects all
the credentials with HTTP 401, or they expire). If the login brings nothing usable, the operator
cannot continue and fails with :class:`kopf.LoginError`.
"""
import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

from kopf._clients import logins
from kopf._clients.logins import piggybacking
from kopf._clients.vault import Vault
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError, VaultKey
from kopf._core.actions import execution, invocation, lifecycles
from kopf._core.actions.errors import PermanentError
from kopf._core.actions.progression import Outcome, State
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

AUTHENTICATION_DOCS = 'https://docs.kopf.dev/en/stable/authentication/'


class ActivityError(Exception):
    """
    Some handlers of an activity have failed for good (permanently, or out of retries/time).

    ``outcomes`` has the final outcome of every handler by its id; the exception's ``__cause__``
    is the error of the first failed handler in the order of declaration.
    """

    outcomes: Mapping[HandlerId, Outcome]

    def __init__(self, message: str, *, outcomes: Mapping[HandlerId, Outcome]) -> None:
        super().__init__(message)
        self.outcomes = outcomes


def get_activity_logger(activity: Activity) -> logging.Logger:
    return logging.getLogger(ACTIVITY_LOGGER_NAMES.get(activity, f'kopf.activities.{activity}'))


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
    activity_logger = get_activity_logger(activity)
    cause = ActivityCause(logger=activity_logger, memo=memo, indices=dict(indices or {}),
                          activity=activity, settings=settings)

    state = State.from_scratch().with_handlers(actual_handlers)
    outcomes: dict[HandlerId, Outcome] = {}
    while not state.done:
        latest = await execution.execute_handlers_once(
            lifecycle=lifecycles.all_at_once, settings=settings, handlers=actual_handlers,
            cause=cause, state=state, logger=activity_logger,
        )
        outcomes.update(latest)
        state = state.with_outcomes(latest)
        # Even an immediate retry yields to the event loop, so that the operator stays responsive.
        await asyncio.sleep(state.delay or 0)

    failures = [outcomes[handler.id].exception for handler in actual_handlers
                if outcomes[handler.id].exception is not None]
    if failures:
        raise ActivityError('One or more handlers failed.', outcomes=outcomes) from failures[0]
    return {handler_id: outcome.result for handler_id, outcome in outcomes.items()}


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

    Unlike other activities, every probe is attempted exactly once per call: a liveness report
    cannot wait for the retries and back-offs (the prober would time out long before that).
    A probe that fails in any way --- an exception, a temporary or permanent error, its ``timeout=``
    exceeded --- fails the report with :class:`ActivityError` (after the other probes are done);
    the next report tries it again. Only ``errors=IGNORED`` makes a failing probe harmless
    (its value is then ``None``). ``retries=`` and ``backoff=`` have no effect on the probes.
    """
    # For this single attempt, a failure is final: so the logs do not promise a retry that never comes.
    declared = registry.activities.get_handlers(Activity.PROBE)
    handlers = [handler if handler.errors == ErrorsMode.IGNORED else
                dataclasses.replace(handler, errors=ErrorsMode.PERMANENT, retries=None, backoff=None)
                for handler in declared]
    activity_logger = get_activity_logger(Activity.PROBE)
    cause = ActivityCause(logger=activity_logger, memo=memo, indices=dict(indices or {}),
                          activity=Activity.PROBE, settings=settings)
    outcomes = await execution.execute_handlers_once(
        lifecycle=lifecycles.all_at_once, settings=settings, handlers=handlers, cause=cause,
        state=State.from_scratch().with_handlers(handlers), logger=activity_logger,
    )
    failures = [outcomes[handler.id].exception for handler in handlers
                if outcomes[handler.id].exception is not None]
    if failures:
        raise ActivityError('One or more probes failed.', outcomes=outcomes) from failures[0]
    return {handler.id: outcomes[handler.id].result for handler in handlers}


#
# Authentication.
#

def get_default_login_handlers() -> list[ActivityHandler]:
    """
    The login handlers to use when none are declared: the default login functions, errors ignored.

    Each of them is tried; all the credentials they bring are used (see ``kopf.login_via_*``).
    """
    return [
        ActivityHandler(fn=_explained(fn), id=HandlerId(getattr(fn, '__name__', repr(fn))),
                        activity=Activity.AUTHENTICATION, errors=ErrorsMode.IGNORED)
        for fn in logins.default_login_fns()
    ]


def _explained(fn: Callable[..., Any]) -> Callable[..., Any]:
    """
    Make a built-in login function fail permanently with its own explanation, without a traceback.

    Its :class:`kopf.LoginError` already says what is wrong and how to fix it (e.g. which field of
    which kubeconfig file): a traceback of the framework's internals would only bury that line.
    """
    if invocation.is_async_fn(fn):
        @functools.wraps(fn)
        async def explained_async(**kwargs: Any) -> Any:
            try:
                return await fn(**kwargs)
            except LoginError as e:
                raise PermanentError(str(e)) from e
        return explained_async

    @functools.wraps(fn)
    def explained(**kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except LoginError as e:
            raise PermanentError(str(e)) from e
    return explained


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

    declared = registry.activities.get_handlers(Activity.AUTHENTICATION)
    handlers = declared or get_default_login_handlers()
    failure: ActivityError | None = None
    # The login functions that read the same broken kubeconfig report it once per round, not each.
    reported = piggybacking.reported_problems.set(set())
    try:
        results = await run_activity(activity=Activity.AUTHENTICATION, registry=registry, handlers=handlers,
                                     settings=settings, memo=memo, indices=indices)
    except ActivityError as e:
        failure = e
        results = {handler_id: outcome.result for handler_id, outcome in e.outcomes.items()
                   if outcome.exception is None}
    finally:
        piggybacking.reported_problems.reset(reported)

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
        if credentials and vault.rejection:
            logger.warning(f'{what} has failed: the login handlers brought only the credentials '
                           f'that were rejected before.')
        else:
            logger.warning(f'{what} has failed: no credentials were retrieved from the login handlers.')
        message = _explain_no_credentials(failure=failure, brought=bool(credentials), vault=vault,
                                          handlers=handlers, defaults=not declared)
        raise LoginError(message) from failure
    logger.info(f'{what} has finished.')


def _explain_no_credentials(
        *,
        failure: ActivityError | None,
        brought: bool,
        vault: Vault,
        handlers: Collection[ActivityHandler],
        defaults: bool,
) -> str:
    """Why the vault is empty after a login, and what to do: one line (with no secrets in it)."""
    # The first failure explains it best (e.g. a broken kubeconfig), unless the server's rejection does.
    if failure is not None and not (brought and vault.rejection):
        for handler in handlers:
            outcome = failure.outcomes.get(handler.id)
            if outcome is not None and outcome.exception is not None:
                if defaults:  # the built-in logins' own explanations are complete.
                    return str(outcome.exception)
                return f'Ran out of valid credentials: the login handler {handler.id!r} has failed: ' \
                       f'{outcome.exception}'
    if vault.rejection:
        return (f'Ran out of valid credentials: {vault.rejection}, and the login handlers have brought '
                f'no new ones; fix or renew the token or the client certificate (in the kubeconfig '
                f'or in the login handlers). See more: {AUTHENTICATION_DOCS}')
    if defaults:
        names = ', '.join(handler.id for handler in handlers)
        return (f'Ran out of valid credentials: the default logins ({names}) have found '
                f'neither a kubeconfig ($KUBECONFIG or ~/.kube/config) nor a service account '
                f'(not in a cluster); create a kubeconfig or add a login handler (@kopf.on.login). '
                f'See more: {AUTHENTICATION_DOCS}')
    names = ', '.join(repr(handler.id) for handler in handlers)
    return (f'Ran out of valid credentials: the login handlers ({names}) have returned none; '
            f'make them return kopf.ConnectionInfo. See more: {AUTHENTICATION_DOCS}')


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
