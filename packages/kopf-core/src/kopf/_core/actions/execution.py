"""
Executing the handlers: once per handling cycle, with the errors, timeouts, retries, and back-offs applied.

One call of :func:`execute_handlers_once` is one step of an object's handling: the lifecycle
selects some of the pending handlers (not finished, not sleeping), each of them is attempted once,
and the outcomes are returned for the caller to advance the state, store it, and deliver the results.
The caller then repeats the cycle (on the next event of the object) until the state is done.

An attempt (:func:`execute_handler_once`) ends in one of these ways:

* success: the result is kept for the status; the handler is finished. A result that cannot be stored
  in the status as JSON (e.g. a datetime, a set, an arbitrary object) fails the handler permanently
  instead (a retry would repeat the handler's side effects and fail the same way); the indexers'
  and the activities' results are not stored, and so can be anything.
* :class:`kopf.TemporaryError`: retried after its ``delay`` (unless the ``retries=`` limit is reached).
* :class:`kopf.PermanentError`: the handler is failed for good (for this cycle).
* any other exception: treated per the handler's ``errors=`` mode: retried after ``backoff=`` seconds
  (or ``settings.execution.default_backoff``), failed for good, or ignored (i.e. a success).
* the ``timeout=`` (seconds since the first attempt) or the ``retries=`` limit is exceeded:
  the handler is failed for good, without calling it. An async handler that is still running
  when its timeout expires is cancelled (sync ones cannot be interrupted and run to their end).

Sub-handlers: a handler can declare them (``@kopf.subhandler``, ``kopf.register()``) or execute them
(``await kopf.execute(...)``) while it runs. The declared ones are executed right after the handler
returns, in the same call, with the same rules, recursively; their ids are ``parent/child``.
The parent is finished only when all its sub-handlers are finished (either way); until then,
it is retried (and it declares its sub-handlers again), but its own result is not delivered.
The sub-handlers' progress and results go directly into the cause's patch.
"""
import asyncio
import contextvars
import functools
import json
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from kopf._cogs.helpers import metering, tracing
from kopf._cogs.helpers.typedefs import Logger
from kopf._cogs.structs.patches import Patch
from kopf._core.actions import invocation
from kopf._core.actions.contexts import cause_var, handler_var, owner_var, subregistry_var
from kopf._core.actions.errors import (
    HandlerChildrenRetry,
    HandlerRetriesError,
    HandlerTimeoutError,
    PermanentError,
    TemporaryError,
)
from kopf._core.actions.lifecycles import CAUSE_BLIND, LifeCycleFn, get_default_lifecycle
from kopf._core.actions.progression import HandlerState, Outcome, State, handler_kwargs
from kopf._core.intents.callbacks import ChangingFn
from kopf._core.intents.causes import BaseCause, ResourceCause, ResourceChangingCause
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import (
    ActivityHandler,
    BaseHandler,
    ChangingHandler,
    DaemonHandler,
    ErrorsMode,
    HandlerId,
    IndexingHandler,
    SpawningHandler,
    TimerHandler,
    WatchingHandler,
)
from kopf._core.intents.registries import ChangingRegistry, generate_id

__all__ = [
    'Cause',
    'Outcome',
    'deliver_results',
    'execute',
    'execute_handler_once',
    'execute_handlers_once',
]

# Any cause can be given to the execution: the resource changes, the activities, etc.
Cause = BaseCause

_HandlerT = TypeVar('_HandlerT', bound=BaseHandler)


def _title(handler: BaseHandler) -> str:
    # The activities, daemons, timers, indexers are named so in the logs ("Timer 'x' succeeded."),
    # others are handlers. Needed on every call (e.g. on every tick): the kind is looked up by the class.
    cls = type(handler)
    kind = _KINDS.get(cls)
    if kind is None:
        kind = next((name for base, name in _KINDS.items() if isinstance(handler, base)), 'Handler')
        _KINDS[cls] = kind
    return f'{kind} {handler.id!r}'


_KINDS: dict[type[BaseHandler], str] = {
    ActivityHandler: 'Activity',
    IndexingHandler: 'Indexer',
    DaemonHandler: 'Daemon',
    TimerHandler: 'Timer',
}


async def execute_handlers_once(
        *,
        lifecycle: LifeCycleFn,
        settings: OperatorSettings,
        handlers: Sequence[_HandlerT],
        cause: BaseCause,
        state: State,
        logger: Logger,
) -> Mapping[HandlerId, Outcome]:
    """
    Attempt those of the pending handlers that the lifecycle selects, once each, one after another.

    The pending handlers are those neither finished nor sleeping in the state (a handler absent
    from the state counts as new). The lifecycle gets them positionally, plus ``state=`` and the cause's
    kwargs. Only the outcomes of these handlers are returned (in the order of execution); the outcomes
    of their sub-handlers are already stored into the cause's patch by the time this returns.
    """
    states: dict[HandlerId, HandlerState] = {}
    pending: list[_HandlerT] = []
    pending_by_id: dict[HandlerId, _HandlerT] = {}
    for given in handlers:  # one loop, not three comprehensions: this is done for every cycle
        given_state = states[given.id] = _state_of(state, given)
        if not given_state.finished and (given_state.delayed is None or given_state.awakened):
            pending.append(given)
            pending_by_id[given.id] = given
    try:
        blind = lifecycle in CAUSE_BLIND
    except TypeError:  # an unhashable callable object: surely not a built-in lifecycle
        blind = False
    if blind:
        selected = lifecycle(pending, state=state)
    else:
        lifecycle_kwargs = cause.kwargs  # a new dict every time: it is safe to extend it
        lifecycle_kwargs['state'] = state
        selected = lifecycle(pending, **lifecycle_kwargs)

    outcomes: dict[HandlerId, Outcome] = {}
    meters = metering.meters
    for candidate in selected:
        # Only the pending ones: a lifecycle cannot revive the finished or sleeping handlers.
        handler = pending_by_id.get(candidate.id)
        if handler is None or handler.id in outcomes:
            continue
        started = time.monotonic() if meters is not None else 0.0
        if tracing.tracer is None:
            outcome = outcomes[handler.id] = await execute_handler_once(
                settings=settings,
                handler=handler,
                cause=cause,
                state=states[handler.id],
                lifecycle=lifecycle,
                logger=logger,
            )
        else:
            with tracing.tracer.start_as_current_span('kopf.handler', attributes={
                    'kopf.handler.id': str(handler.id), 'kopf.handler.retry': states[handler.id].retries,
            }) as span:
                outcome = outcomes[handler.id] = await execute_handler_once(
                    settings=settings,
                    handler=handler,
                    cause=cause,
                    state=states[handler.id],
                    lifecycle=lifecycle,
                    logger=logger,
                )
                span.set_attribute('kopf.handler.outcome', _outcome_kind(outcome))
                if outcome.exception is not None:
                    span.record_exception(outcome.exception)
        if meters is not None:
            _measure(meters, handler, cause, states[handler.id], outcome, time.monotonic() - started)
    return outcomes


def _outcome_kind(outcome: Outcome) -> str:
    """The outcome as the metrics and the traces name it: success, temporary, permanent, timeout."""
    exception = outcome.exception
    if exception is None:
        return 'success'
    if isinstance(exception, HandlerTimeoutError):
        return 'timeout'
    return 'permanent' if outcome.final else 'temporary'


def _measure(meters: metering.Meters, handler: BaseHandler, cause: BaseCause, state: HandlerState,
             outcome: Outcome, duration: float) -> None:
    """Count the handler's call by its outcome (see :mod:`kopf._cogs.helpers.metering`)."""
    resource = cause.resource if isinstance(cause, ResourceCause) else None
    resource_label = (f'{resource.plural}.{resource.group}' if resource.group else resource.plural
                      ) if resource is not None else ''
    handler_label = meters.capped('handler', str(handler.id))
    kind = _outcome_kind(outcome)
    meters.child(meters.handler_calls, resource_label, handler_label, kind).inc()
    meters.child(meters.handler_duration, resource_label, handler_label).observe(duration)
    if state.retries:
        meters.child(meters.handler_retries, resource_label, handler_label).inc()


def _state_of(state: State, handler: BaseHandler) -> HandlerState:
    known = state.get(handler.id)
    return known if known is not None else HandlerState.from_scratch(purpose=state.purpose)


async def execute_handler_once(
        *,
        settings: OperatorSettings,
        handler: BaseHandler,
        cause: BaseCause,
        state: HandlerState,
        lifecycle: LifeCycleFn | None = None,
        logger: Logger,
) -> Outcome:
    """
    Attempt one handler once (with its sub-handlers, if any) and tell what came out of it.

    Never raises for the handler's errors (they become outcomes); only the cancellation
    (and the non-``Exception`` errors, such as ``KeyboardInterrupt``) propagate.
    """
    title = _title(handler)
    logger.debug('%s is invoked.', title)

    # The limits are checked before the call: they could be exceeded while the handler was sleeping
    # (the timeout), or by the sub-handlers' retries (which count as the parent's retries too).
    if handler.timeout is not None and (runtime := state.runtime).total_seconds() > handler.timeout:
        timeout_error = HandlerTimeoutError(f'{title} has timed out after {runtime}.')
        logger.error(str(timeout_error))
        return Outcome(final=True, exception=timeout_error, subrefs=state.subrefs)
    if handler.retries is not None and state.retries >= handler.retries:
        retries_error = HandlerRetriesError(f'{title} has exceeded {handler.retries} retries.')
        logger.error(str(retries_error))
        return Outcome(final=True, exception=retries_error, subrefs=state.subrefs)

    subexecution = _SubExecution(
        settings=settings,
        lifecycle=lifecycle if lifecycle is not None else get_default_lifecycle(),
        cause=cause,
        parent=handler,
        logger=logger,
    )
    # Whether this attempt is the last allowed one, so that a failure now is final.
    exhausted = handler.retries is not None and state.retries + 1 >= handler.retries
    try:
        tokens = _set_handler_context(handler=handler, cause=cause, subexecution=subexecution)
        try:
            result = await _call(handler=handler, cause=cause, state=state, settings=settings, title=title)
            if subexecution.registry:  # the usual case is none: no coroutine is made then
                await subexecution.execute_declared()
        finally:
            _reset_handler_context(tokens)
        if subexecution.states:  # the usual case is none: nothing to check
            subexecution.raise_if_unfinished()

    except HandlerChildrenRetry as e:
        logger.debug(f'{title} has unfinished sub-handlers. Will retry soon.')
        return Outcome(final=False, delay=e.delay, exception=e, subrefs=subexecution.subrefs)

    except HandlerTimeoutError as e:
        logger.error(str(e))
        return Outcome(final=True, exception=e, subrefs=subexecution.subrefs)

    except PermanentError as e:
        logger.error(f'{title} failed permanently: {e}')
        return Outcome(final=True, exception=e, subrefs=subexecution.subrefs)

    except TemporaryError as e:
        if exhausted:
            message = f'{title} failed temporarily but will exceed {handler.retries} retries: {e}'
            logger.error(message)
            return Outcome(final=True, exception=HandlerRetriesError(message), subrefs=subexecution.subrefs)
        logger.error(f'{title} failed temporarily: {e}')
        return Outcome(final=False, delay=e.delay, exception=e, subrefs=subexecution.subrefs)

    except Exception as e:
        errors = handler.errors if handler.errors is not None else ErrorsMode.TEMPORARY
        if errors == ErrorsMode.IGNORED:
            logger.exception(f'{title} failed with an exception and will ignore it: {e}')
            return Outcome(final=True, subrefs=subexecution.subrefs)
        if errors == ErrorsMode.PERMANENT:
            logger.exception(f'{title} failed with an exception and will stop now: {e}')
            return Outcome(final=True, exception=e, subrefs=subexecution.subrefs)
        if exhausted:
            message = (f'{title} failed with an exception and will stop now '
                       f'(it would exceed {handler.retries} retries on the next attempt): {e}')
            logger.exception(message)
            return Outcome(final=True, exception=HandlerRetriesError(message), subrefs=subexecution.subrefs)
        backoff = handler.backoff if handler.backoff is not None else settings.execution.default_backoff
        logger.exception(f'{title} failed with an exception and will try again in {backoff} seconds: {e}')
        return Outcome(final=False, delay=backoff, exception=e, subrefs=subexecution.subrefs)

    else:
        unstorable = _why_unstorable(handler, result) if result is not None else None
        if unstorable is not None:
            # A retry would repeat the handler's side effects and fail the same way: a bug to fix.
            message = (f'The result cannot be stored in the status as JSON: {unstorable}. '
                       f'Return only dicts, lists, strings, numbers, booleans, or None.')
            logger.error(f'{title} failed permanently: {message}')
            return Outcome(final=True, exception=PermanentError(message), subrefs=subexecution.subrefs)

        # The indexers run on every event of every object (e.g. 10,000 at startup): not worth a line each
        # at the usual level, as in Kopf, where they are seen only with the verbose logs.
        if isinstance(handler, IndexingHandler):
            logger.debug('%s succeeded.', title)
        else:
            logger.info('%s succeeded.', title)
        return Outcome(final=True, result=result, subrefs=subexecution.subrefs if subexecution.states else ())


# The handlers whose results go to the object's status (the indexers' & activities' results stay in memory).
_STATUS_RESULTS = (ChangingHandler, WatchingHandler, SpawningHandler)

# The results that are always storable: checked without serialising them.
_SCALARS = (str, int, bool)


def _why_unstorable(handler: BaseHandler, result: Any) -> str | None:
    """Why the result cannot go to the status (as JSON), or None if it can (or does not go there)."""
    if result is None or isinstance(result, _SCALARS) or not isinstance(handler, _STATUS_RESULTS):
        return None
    try:
        # As strict as the API servers are: NaN & Infinity are not JSON and would fail the whole patch.
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        return str(e) or type(e).__name__
    return None


async def _call(
        *,
        handler: BaseHandler,
        cause: BaseCause,
        state: HandlerState,
        settings: OperatorSettings,
        title: str,
) -> Any:
    # The retrying kwargs go first: the cause's kwargs end with the operator's indices, which must win.
    kwargs = handler_kwargs(state)  # a new dict: the cause's kwargs go over it (as in {**a, **b})
    kwargs.update(cause.kwargs_for(handler))
    executor = settings.execution.executor
    if not invocation.is_async_fn(handler.fn):
        # Named, so that the operator's exit can say which handlers it waits for (threads cannot be stopped).
        description = functools.partial(_describe_call, title, cause)  # only made into text if needed
        return await invocation.invoke(handler.fn, kwargs=kwargs, executor=executor, description=description,
                                       sync=True)
    if handler.timeout is None:
        return await invocation.invoke(handler.fn, kwargs=kwargs, executor=executor, sync=False)

    # Only the coroutines can be interrupted when the time is over; the threads cannot.
    scope = asyncio.timeout(handler.timeout - state.runtime.total_seconds())
    try:
        async with scope:
            return await invocation.invoke(handler.fn, kwargs=kwargs, executor=executor)
    except TimeoutError:
        if scope.expired():
            raise HandlerTimeoutError(f'{title} has timed out after {state.runtime}.') from None
        raise  # the handler's own timeout, not ours: an ordinary error.


def _describe_call(title: str, cause: Cause) -> str:
    if not isinstance(cause, ResourceCause):
        return title
    namespace, name = cause.body.metadata.get('namespace'), cause.body.metadata.get('name')
    return f'{title} of {namespace}/{name}' if namespace else f'{title} of {name}'


# The tokens of the owner (None if the cause has no object), handler, cause, sub-registry, sub-execution.
_ContextTokens = tuple[contextvars.Token[Mapping[str, Any]] | None, contextvars.Token[BaseHandler],
                       contextvars.Token[BaseCause], contextvars.Token[ChangingRegistry],
                       contextvars.Token['_SubExecution']]


def _set_handler_context(
        *,
        handler: BaseHandler,
        cause: BaseCause,
        subexecution: '_SubExecution',
) -> _ContextTokens:
    """Set the context variables for the handler (and the helpers it calls); reset them with the tokens."""
    # Not a context manager: this is done for every handler call, and a generator costs more than this.
    return (owner_var.set(cause.body) if isinstance(cause, ResourceCause) else None,
            handler_var.set(handler),
            cause_var.set(cause),
            subregistry_var.set(subexecution.registry),
            _subexecution_var.set(subexecution))


def _reset_handler_context(tokens: _ContextTokens) -> None:
    owner_token, handler_token, cause_token, subregistry_token, subexecution_token = tokens
    _subexecution_var.reset(subexecution_token)
    subregistry_var.reset(subregistry_token)
    cause_var.reset(cause_token)
    handler_var.reset(handler_token)
    if owner_token is not None:
        owner_var.reset(owner_token)


class _SubExecution:
    """
    The sub-handlers of one attempt of one handler: their registry, states, and execution.

    The states are kept here for the duration of the attempt, so that executing the same
    sub-handlers again within it (explicitly and implicitly) does not repeat the finished ones:
    the storage still has the states as of the beginning of the cycle (the patch is not applied yet).
    """

    def __init__(
            self,
            *,
            settings: OperatorSettings,
            lifecycle: LifeCycleFn,
            cause: BaseCause,
            parent: BaseHandler | None,
            logger: Logger,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.lifecycle = lifecycle
        self.cause = cause
        self.parent = parent
        self.logger = logger
        self.registry = ChangingRegistry()  # for @kopf.subhandler & kopf.register() inside the handler
        self.registry_executed = False  # by an explicit `await kopf.execute()` with no arguments
        self.states: dict[HandlerId, HandlerState] = {}

    @property
    def subrefs(self) -> tuple[HandlerId, ...]:
        """The ids of all the sub-handlers seen, and of their own sub-handlers (of all depths)."""
        if not self.states:  # the usual case: no sub-handlers
            return ()
        refs: set[HandlerId] = set(self.states)
        for state in self.states.values():
            refs.update(state.subrefs)
        return tuple(sorted(refs))

    def make_handlers(self, fns: Iterable[ChangingFn] | Mapping[str, ChangingFn]) -> list[ChangingHandler]:
        """Sub-handlers from plain functions: named after the keys of a mapping, or after the functions."""
        prefix = self.parent.id if self.parent is not None else None
        items: Iterable[tuple[str | None, ChangingFn]]
        items = fns.items() if isinstance(fns, Mapping) else ((None, fn) for fn in fns)
        return [ChangingHandler(fn=fn, id=generate_id(fn, id=key, prefix=prefix)) for key, fn in items]

    def registry_handlers(self, registry: ChangingRegistry, cause: BaseCause) -> list[ChangingHandler]:
        """The handlers of a registry that match the cause (all of them if the cause is not a change)."""
        if isinstance(cause, ResourceChangingCause):
            return registry.get_handlers(cause)
        return registry.get_all_handlers()

    async def execute_declared(self) -> None:
        """Execute the sub-handlers declared by the handler, unless it has done that explicitly."""
        if not self.registry_executed and self.registry:
            await self.execute(self.registry_handlers(self.registry, self.cause))

    def raise_if_unfinished(self) -> None:
        """Signal that the parent must be retried if some of its sub-handlers are not finished yet."""
        unfinished = [state for state in self.states.values() if not state.finished]
        if unfinished:
            raise HandlerChildrenRetry(delay=min(state.delay for state in unfinished))

    async def execute(
            self,
            handlers: Sequence[BaseHandler],
            *,
            lifecycle: LifeCycleFn | None = None,
            cause: BaseCause | None = None,
    ) -> None:
        """Run the sub-handlers once (per the lifecycle); put their progress & results into the patch."""
        cause = cause if cause is not None else self.cause
        storage = self.settings.persistence.progress_storage
        body = cause.body if isinstance(cause, ResourceCause) else None
        patch: Patch | None = cause.patch if isinstance(cause, ResourceCause) else None
        purpose = str(cause.reason) if isinstance(cause, ResourceChangingCause) else None

        # The states known in this attempt are fresher than the stored ones.
        unknown = [handler for handler in handlers if handler.id not in self.states]
        stored = State()
        if storage is not None and body is not None and unknown:
            stored = State.from_storage(body=body, storage=storage, handlers=unknown, logger=self.logger)
        known = {handler.id: self.states[handler.id] for handler in handlers if handler.id in self.states}
        state = State({**stored, **known}, purpose=purpose).with_purpose(purpose).with_handlers(handlers)

        outcomes = await execute_handlers_once(
            lifecycle=lifecycle if lifecycle is not None else self.lifecycle,
            settings=self.settings,
            handlers=handlers,
            cause=cause,
            state=state,
            logger=self.logger,
        )
        state = state.with_outcomes(outcomes)
        self.states.update(state)
        if storage is not None and body is not None and patch is not None:
            state.store(body=body, patch=patch, storage=storage)
        if patch is not None:
            deliver_results(outcomes=outcomes, patch=patch)


_subexecution_var: contextvars.ContextVar[_SubExecution] = contextvars.ContextVar('_subexecution_var')


async def execute(
        *,
        fns: Iterable[ChangingFn] | Mapping[str, ChangingFn] | None = None,
        handlers: Iterable[ChangingHandler] | None = None,
        registry: ChangingRegistry | None = None,
        lifecycle: LifeCycleFn | None = None,
        cause: Cause | None = None,
) -> None:
    """
    Execute sub-handlers of the current handler right here, and return when all of them are finished.

    The sub-handlers can be given as plain functions (a mapping of ids to functions, or an iterable
    of functions named by their names), as ready handlers, or as a registry. With none of them,
    the sub-handlers declared so far by the current handler (``@kopf.subhandler``) are executed
    (otherwise, they are executed implicitly after the handler returns).

    The sub-handlers are executed once per call, as a handling cycle does it (per the lifecycle).
    If some of them are not finished yet (e.g. they will be retried later), this raises
    an internal retriable error, so that the current handler is retried too (and calls this again);
    do not suppress it. The sub-handlers that have failed for good do not fail the current handler.

    Outside of a handler, ``cause=`` must be given; the default settings are used then.
    """
    if sum(arg is not None for arg in (fns, handlers, registry)) > 1:
        raise TypeError('kopf.execute() accepts only one of fns=, handlers=, registry=.')

    try:
        subexecution = _subexecution_var.get()
    except LookupError:
        if cause is None:
            raise LookupError('kopf.execute() can be used only inside of a handler being executed, '
                              'or with an explicit cause=.') from None
        subexecution = _SubExecution(settings=OperatorSettings(), lifecycle=get_default_lifecycle(),
                                     cause=cause, parent=None, logger=cause.logger)

    real_cause = cause if cause is not None else subexecution.cause
    selected: Collection[BaseHandler]
    if fns is not None:
        selected = subexecution.make_handlers(fns)
    elif handlers is not None:
        selected = list(handlers)
    elif registry is not None:
        selected = subexecution.registry_handlers(registry, real_cause)
    else:
        subexecution.registry_executed = True
        selected = subexecution.registry_handlers(subexecution.registry, real_cause)

    await subexecution.execute(list(selected), lifecycle=lifecycle, cause=real_cause)
    subexecution.raise_if_unfinished()


def deliver_results(*, outcomes: Mapping[HandlerId, Outcome], patch: Patch) -> None:
    """
    Put the handlers' results into the patch: into ``status`` under the handlers' full ids.

    ``None`` results deliver nothing (not even a removal of an older result).
    """
    for handler_id, outcome in outcomes.items():
        if outcome.result is not None:
            patch.status[handler_id] = outcome.result
