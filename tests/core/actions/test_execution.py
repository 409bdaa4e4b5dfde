import asyncio
import dataclasses
import datetime
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from kopf._cogs.structs.patches import Patch
from kopf._core.actions.contexts import cause_var, handler_var, owner_var, subregistry_var
from kopf._core.actions.errors import (
    HandlerChildrenRetry,
    HandlerRetriesError,
    HandlerTimeoutError,
    PermanentError,
    TemporaryError,
)
from kopf._core.actions.execution import (
    deliver_results,
    execute,
    execute_handler_once,
    execute_handlers_once,
)
from kopf._core.actions.lifecycles import all_at_once
from kopf._core.actions.progression import HandlerState, Outcome, State
from kopf._core.intents.causes import ActivityCause
from kopf._core.intents.handlers import (
    Activity,
    ActivityHandler,
    BaseHandler,
    ChangingHandler,
    ErrorsMode,
    HandlerId,
    Reason,
)
from kopf.on import register, subhandler


def make_handler(fn: Callable[..., Any], id: str | None = None, **kwargs: Any) -> ChangingHandler:
    return ChangingHandler(fn=fn, id=HandlerId(id or fn.__name__), **kwargs)


def fresh() -> HandlerState:
    return HandlerState.from_scratch(purpose='create')


def messages(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(record.levelno, record.getMessage())
            for record in caplog.records if record.name == 'tests.actions']


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)


@pytest.fixture
def execute_once(settings: Any, logger: logging.Logger, make_cause: Any) -> Callable[..., Any]:
    async def execute_once(handler: BaseHandler, state: HandlerState | None = None, **kwargs: Any) -> Outcome:
        cause = kwargs.pop('cause', None) or make_cause()
        return await execute_handler_once(settings=settings, handler=handler, cause=cause,
                                          state=state if state is not None else fresh(), logger=logger)
    return execute_once


#
# Single handlers: the results and the errors.
#

@pytest.mark.parametrize('is_async', [False, True])
async def test_success(execute_once: Any, caplog: pytest.LogCaptureFixture, is_async: bool) -> None:
    def sync_fn(**_: Any) -> Any:
        return {'x': 1}

    async def async_fn(**_: Any) -> Any:
        return {'x': 1}

    outcome = await execute_once(make_handler(async_fn if is_async else sync_fn, id='fn'))
    assert outcome == Outcome(final=True, result={'x': 1})
    assert messages(caplog) == [
        (logging.DEBUG, "Handler 'fn' is invoked."),
        (logging.INFO, "Handler 'fn' succeeded."),
    ]


async def test_kwargs(execute_once: Any, make_cause: Any) -> None:
    seen: dict[str, Any] = {}

    def fn(**kwargs: Any) -> None:
        seen.update(kwargs)

    started = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=30)
    cause = make_cause({'metadata': {'name': 'kex1'}, 'spec': {'a': 1}}, reason=Reason.UPDATE)
    state = HandlerState(started=started, retries=2)
    await execute_once(make_handler(fn, param=123), state=state, cause=cause)
    assert seen['retry'] == 2
    assert seen['started'] == started
    assert datetime.timedelta(seconds=30) <= seen['runtime'] < datetime.timedelta(seconds=31)
    assert seen['param'] == 123
    assert seen['reason'] == 'update'
    assert seen['spec'] == {'a': 1}
    assert seen['name'] == 'kex1'
    assert seen['body'] is cause.body
    assert seen['patch'] is cause.patch


async def test_indices_override_the_retrying_kwargs(execute_once: Any, make_cause: Any) -> None:
    seen: dict[str, Any] = {}

    def fn(**kwargs: Any) -> None:
        seen.update(kwargs)

    await execute_once(make_handler(fn), cause=make_cause(indices={'retry': 'an index'}))
    assert seen['retry'] == 'an index'


async def test_temporary_error(
        execute_once: Any, caplog: pytest.LogCaptureFixture) -> None:
    error = TemporaryError('not yet', delay=12.5)

    def fn(**_: Any) -> None:
        raise error

    outcome = await execute_once(make_handler(fn))
    assert outcome == Outcome(final=False, delay=12.5, exception=error)
    assert messages(caplog)[-1] == (logging.ERROR, "Handler 'fn' failed temporarily: not yet")


async def test_temporary_error_exceeding_the_retries(
        execute_once: Any, caplog: pytest.LogCaptureFixture) -> None:
    def fn(**_: Any) -> None:
        raise TemporaryError('later', delay=1)

    outcome = await execute_once(make_handler(fn, retries=2), state=HandlerState(retries=1))
    message = "Handler 'fn' failed temporarily but will exceed 2 retries: later"
    assert outcome.final
    assert isinstance(outcome.exception, HandlerRetriesError)
    assert str(outcome.exception) == message
    assert messages(caplog)[-1] == (logging.ERROR, message)


async def test_permanent_error(
        execute_once: Any, caplog: pytest.LogCaptureFixture) -> None:
    error = PermanentError('boom')

    def fn(**_: Any) -> None:
        raise error

    outcome = await execute_once(make_handler(fn, retries=100))
    assert outcome == Outcome(final=True, exception=error)
    assert messages(caplog)[-1] == (logging.ERROR, "Handler 'fn' failed permanently: boom")
    assert caplog.records[-1].exc_info is None


@pytest.mark.parametrize('errors', [None, ErrorsMode.TEMPORARY])
async def test_arbitrary_error_is_retried_with_the_default_backoff(
        execute_once: Any, settings: Any, caplog: pytest.LogCaptureFixture, errors: ErrorsMode | None,
) -> None:
    error = ValueError('oops')

    def fn(**_: Any) -> None:
        raise error

    settings.execution.default_backoff = 42
    outcome = await execute_once(make_handler(fn, errors=errors))
    assert outcome == Outcome(final=False, delay=42, exception=error)
    assert messages(caplog)[-1] == (
        logging.ERROR, "Handler 'fn' failed with an exception and will try again in 42 seconds: oops")
    assert caplog.records[-1].exc_info is not None  # with the traceback


async def test_arbitrary_error_is_retried_with_the_handlers_backoff(
        execute_once: Any, caplog: pytest.LogCaptureFixture) -> None:
    def fn(**_: Any) -> None:
        raise ValueError('oops')

    outcome = await execute_once(make_handler(fn, backoff=1.5))
    assert not outcome.final
    assert outcome.delay == 1.5
    assert messages(caplog)[-1][1] == (
        "Handler 'fn' failed with an exception and will try again in 1.5 seconds: oops")


async def test_arbitrary_error_exceeding_the_retries(
        execute_once: Any, caplog: pytest.LogCaptureFixture) -> None:
    def fn(**_: Any) -> None:
        raise ValueError('oops')

    outcome = await execute_once(make_handler(fn, retries=2, backoff=1), state=HandlerState(retries=1))
    message = ("Handler 'fn' failed with an exception and will stop now "
               "(it would exceed 2 retries on the next attempt): oops")
    assert outcome.final
    assert isinstance(outcome.exception, HandlerRetriesError)
    assert str(outcome.exception) == message
    assert messages(caplog)[-1] == (logging.ERROR, message)


async def test_arbitrary_error_in_permanent_mode(
        execute_once: Any, caplog: pytest.LogCaptureFixture) -> None:
    error = ValueError('x')

    def fn(**_: Any) -> None:
        raise error

    outcome = await execute_once(make_handler(fn, errors=ErrorsMode.PERMANENT))
    assert outcome == Outcome(final=True, exception=error)
    assert messages(caplog)[-1] == (
        logging.ERROR, "Handler 'fn' failed with an exception and will stop now: x")


async def test_arbitrary_error_in_ignored_mode(
        execute_once: Any, caplog: pytest.LogCaptureFixture) -> None:
    def fn(**_: Any) -> None:
        raise ValueError('y')

    outcome = await execute_once(make_handler(fn, errors=ErrorsMode.IGNORED))
    assert outcome == Outcome(final=True)  # a success, with no result
    assert HandlerState().with_outcome(outcome).success
    assert messages(caplog)[-1] == (
        logging.ERROR, "Handler 'fn' failed with an exception and will ignore it: y")


async def test_timeout_is_checked_before_the_call(
        execute_once: Any, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def fn(**_: Any) -> None:
        calls.append(1)

    started = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=100)
    outcome = await execute_once(make_handler(fn, timeout=60), state=HandlerState(started=started, retries=3))
    assert calls == []
    assert outcome.final
    assert isinstance(outcome.exception, HandlerTimeoutError)
    assert str(outcome.exception).startswith("Handler 'fn' has timed out after 0:01:40.")
    assert messages(caplog)[0] == (logging.DEBUG, "Handler 'fn' is invoked.")
    assert messages(caplog)[1] == (logging.ERROR, str(outcome.exception))


async def test_retries_are_checked_before_the_call(
        execute_once: Any, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def fn(**_: Any) -> None:
        calls.append(1)

    outcome = await execute_once(make_handler(fn, retries=3), state=HandlerState(retries=3))
    assert calls == []
    assert outcome.final
    assert isinstance(outcome.exception, HandlerRetriesError)
    assert messages(caplog)[-1] == (logging.ERROR, "Handler 'fn' has exceeded 3 retries.")


@pytest.mark.looptime
async def test_timeout_interrupts_a_running_coroutine(execute_once: Any) -> None:
    cancelled: list[bool] = []

    async def fn(**_: Any) -> None:
        try:
            await asyncio.sleep(100)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    loop = asyncio.get_running_loop()
    outcome = await execute_once(make_handler(fn, timeout=10))
    assert loop.time() == pytest.approx(10, abs=0.1)
    assert cancelled == [True]
    assert outcome.final
    assert isinstance(outcome.exception, HandlerTimeoutError)
    assert str(outcome.exception).startswith("Handler 'fn' has timed out after ")


@pytest.mark.looptime
async def test_timeout_counts_from_the_first_attempt(execute_once: Any) -> None:
    async def fn(**_: Any) -> None:
        await asyncio.sleep(100)

    started = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=7)
    loop = asyncio.get_running_loop()
    outcome = await execute_once(make_handler(fn, timeout=10), state=HandlerState(started=started))
    assert loop.time() == pytest.approx(3, abs=0.1)
    assert isinstance(outcome.exception, HandlerTimeoutError)


async def test_own_timeout_errors_of_handlers_are_ordinary_errors(execute_once: Any) -> None:
    async def fn(**_: Any) -> None:
        raise TimeoutError('my own')

    outcome = await execute_once(make_handler(fn, timeout=1000, backoff=5))
    assert outcome.delay == 5
    assert not outcome.final
    assert isinstance(outcome.exception, TimeoutError)
    assert not isinstance(outcome.exception, HandlerTimeoutError)


async def test_cancellation_propagates(execute_once: Any) -> None:
    started = asyncio.Event()

    async def fn(**_: Any) -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(execute_once(make_handler(fn)))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_activities_are_named_so(settings: Any, logger: logging.Logger,
                                       caplog: pytest.LogCaptureFixture) -> None:
    seen: dict[str, Any] = {}

    def cfg(**kwargs: Any) -> None:
        seen.update(kwargs)

    handler = ActivityHandler(fn=cfg, id=HandlerId('cfg'), activity=Activity.STARTUP)
    cause = ActivityCause(logger=logger, activity=Activity.STARTUP, settings=settings)
    outcome = await execute_handler_once(settings=settings, handler=handler, cause=cause,
                                         state=HandlerState.from_scratch(), logger=logger)
    assert outcome.final and outcome.exception is None
    assert seen['settings'] is settings
    assert seen['retry'] == 0
    assert messages(caplog) == [(logging.DEBUG, "Activity 'cfg' is invoked."),
                                (logging.INFO, "Activity 'cfg' succeeded.")]


#
# The context of the handlers.
#

@pytest.mark.parametrize('is_async', [False, True])
async def test_context_variables(execute_once: Any, make_cause: Any, is_async: bool) -> None:
    seen: dict[str, Any] = {}

    def sync_fn(**_: Any) -> None:
        seen.update(owner=owner_var.get(), handler=handler_var.get(), cause=cause_var.get(),
                    subregistry=subregistry_var.get(), thread=threading.get_ident())

    async def async_fn(**_: Any) -> None:
        sync_fn()

    cause = make_cause()
    handler = make_handler(async_fn if is_async else sync_fn, id='fn')
    await execute_once(handler, cause=cause)
    assert seen['owner'] is cause.body
    assert seen['handler'] is handler
    assert seen['cause'] is cause
    assert (seen['thread'] == threading.get_ident()) == is_async
    with pytest.raises(LookupError):
        handler_var.get()
    with pytest.raises(LookupError):
        owner_var.get()


#
# Several handlers per cycle, by the lifecycles.
#

async def test_lifecycle_gets_the_pending_handlers_only(settings: Any, logger: logging.Logger,
                                                        make_cause: Any) -> None:
    calls: list[str] = []
    lifecycle_calls: list[tuple[list[str], dict[str, Any]]] = []

    def fn(**kwargs: Any) -> None:
        calls.append(kwargs['param'])

    def lifecycle(handlers: Sequence[BaseHandler], **kwargs: Any) -> Sequence[BaseHandler]:
        lifecycle_calls.append(([handler.id for handler in handlers], kwargs))
        return list(reversed(handlers))

    now = datetime.datetime.now(datetime.UTC)
    handlers = [make_handler(fn, id=id, param=id) for id in ['done', 'sleeping', 'due', 'new']]
    state = State({
        HandlerId('done'): HandlerState(started=now, success=True),
        HandlerId('sleeping'): HandlerState(started=now, delayed=now + datetime.timedelta(hours=1)),
        HandlerId('due'): HandlerState(started=now, delayed=now - datetime.timedelta(hours=1)),
    }, purpose='create')
    cause = make_cause()
    outcomes = await execute_handlers_once(lifecycle=lifecycle, settings=settings, handlers=handlers,
                                           cause=cause, state=state, logger=logger)
    assert calls == ['new', 'due']
    assert list(outcomes) == ['new', 'due']
    assert lifecycle_calls[0][0] == ['due', 'new']
    assert lifecycle_calls[0][1]['state'] is state
    assert lifecycle_calls[0][1]['body'] is cause.body
    assert lifecycle_calls[0][1]['reason'] == 'create'


async def test_lifecycle_as_an_unhashable_callable_object_gets_the_cause_kwargs(
        settings: Any, logger: logging.Logger, make_cause: Any) -> None:
    # The built-in lifecycles are recognised (to skip their unused kwargs); other callables are not
    # assumed to be hashable for that: e.g. a dataclass instance with the default eq=True.
    calls: list[str] = []

    def fn(**kwargs: Any) -> None:
        calls.append(kwargs['param'])

    @dataclasses.dataclass
    class Lifecycle:
        seen: list[dict[str, Any]] = dataclasses.field(default_factory=list)

        def __call__(self, handlers: Sequence[BaseHandler], **kwargs: Any) -> Sequence[BaseHandler]:
            self.seen.append(kwargs)
            return handlers[-1:]

    lifecycle = Lifecycle()
    with pytest.raises(TypeError):
        hash(lifecycle)
    handlers = [make_handler(fn, id=id, param=id) for id in ['a', 'b']]
    cause = make_cause()
    state = State(purpose='create')
    outcomes = await execute_handlers_once(lifecycle=lifecycle, settings=settings, handlers=handlers,
                                           cause=cause, state=state, logger=logger)
    assert calls == ['b']
    assert list(outcomes) == ['b']
    assert lifecycle.seen[0]['state'] is state
    assert lifecycle.seen[0]['body'] is cause.body


async def test_lifecycle_cannot_revive_finished_handlers(settings: Any, logger: logging.Logger,
                                                         make_cause: Any) -> None:
    calls: list[str] = []

    def fn(**kwargs: Any) -> None:
        calls.append(kwargs['param'])

    handlers = [make_handler(fn, id='a', param='a'), make_handler(fn, id='b', param='b')]
    state = State({HandlerId('a'): HandlerState(success=True)})
    outcomes = await execute_handlers_once(lifecycle=lambda hs, **_: list(handlers) + list(handlers),
                                           settings=settings, handlers=handlers, cause=make_cause(),
                                           state=state, logger=logger)
    assert calls == ['b']
    assert list(outcomes) == ['b']


async def test_asap_cycles_like_kopf(run_cycle: Any, make_body: Any) -> None:
    # One handler per cycle; a failed one waits until the others have been tried as many times.
    calls: list[tuple[str, int]] = []

    def fn_a(retry: int, **_: Any) -> str:
        calls.append(('a', retry))
        if retry < 1:
            raise TemporaryError('a', delay=None)
        return 'a-result'

    def fn_b(retry: int, **_: Any) -> None:
        calls.append(('b', retry))

    from kopf._core.actions.lifecycles import asap
    handlers = [make_handler(fn_a), make_handler(fn_b)]
    raw = make_body()
    states: list[State] = []
    for _ in range(5):
        raw, _, state, _ = await run_cycle(raw, handlers, lifecycle=asap)
        states.append(state)
        if state.done:
            break
    assert calls == [('a', 0), ('b', 0), ('a', 1)]
    assert states[-1].done
    assert states[-1].counts == (2, 0, 0)
    assert raw['status'] == {'fn_a': 'a-result'}
    assert raw['metadata']['annotations'] == {}  # all purged at the end


#
# Sub-handlers, declarative.
#

async def test_declared_subhandlers_run_after_the_parent(run_cycle: Any, make_body: Any,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def parent(**_: Any) -> str:
        calls.append('parent')

        @subhandler(id='child1')
        def child1(**_: Any) -> int:
            calls.append('child1')
            return 1

        def child2(**_: Any) -> None:
            calls.append('child2')

        register(child2)
        return 'parent-result'

    raw, outcomes, state, patch = await run_cycle(make_body(), [make_handler(parent)])
    assert calls == ['parent', 'child1', 'child2']
    assert outcomes['parent'] == Outcome(final=True, result='parent-result',
                                         subrefs=('parent/child1', 'parent/child2'))
    assert state.done
    assert messages(caplog) == [
        (logging.DEBUG, "Handler 'parent' is invoked."),
        (logging.DEBUG, "Handler 'parent/child1' is invoked."),
        (logging.INFO, "Handler 'parent/child1' succeeded."),
        (logging.DEBUG, "Handler 'parent/child2' is invoked."),
        (logging.INFO, "Handler 'parent/child2' succeeded."),
        (logging.INFO, "Handler 'parent' succeeded."),
    ]
    # The children go first, both to the progress and to the results:
    assert list(patch['status']) == ['parent/child1', 'parent']
    assert raw['status'] == {'parent/child1': 1, 'parent': 'parent-result'}


async def test_unfinished_subhandlers_retry_the_parent(run_cycle: Any, make_body: Any, storage: Any,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    async def parent(**_: Any) -> str:
        @subhandler(id='slow')
        def slow(**_: Any) -> None:
            raise TemporaryError('slow', delay=20)

        @subhandler(id='slower')
        def slower(**_: Any) -> None:
            raise TemporaryError('slower', delay=30)

        @subhandler(id='fast')
        def fast(**_: Any) -> str:
            return 'fast-result'

        return 'parent-result'

    raw, outcomes, state, patch = await run_cycle(make_body(), [make_handler(parent)])
    outcome = outcomes['parent']
    assert not outcome.final
    assert isinstance(outcome.exception, HandlerChildrenRetry)
    assert outcome.delay is not None and 19 < outcome.delay <= 20
    assert outcome.subrefs == ('parent/fast', 'parent/slow', 'parent/slower')
    message = "Handler 'parent' has unfinished sub-handlers. Will retry soon."
    assert (logging.DEBUG, message) in messages(caplog)
    assert raw['status'] == {'parent/fast': 'fast-result'}  # not the parent's result yet

    annotations = patch['metadata']['annotations']
    assert list(annotations) == ['kopf.zalando.org/parent.slow', 'kopf.zalando.org/parent.slower',
                                 'kopf.zalando.org/parent.fast', 'kopf.zalando.org/parent']
    parent_record = storage.fetch(key='parent', body=raw)
    assert parent_record['retries'] == 1
    assert parent_record['subrefs'] == ['parent/fast', 'parent/slow', 'parent/slower']
    assert not state.done
    assert 19 < state.delays[0] <= 20


async def test_subhandlers_across_cycles_like_kopf(run_cycle: Any, make_body: Any) -> None:
    # The same scenario as observed with Kopf (minus the delays): the parent is re-invoked
    # in every cycle, the finished children are not, the grandchildren are tracked too.
    calls: list[str] = []

    def parent(retry: int, **_: Any) -> str:
        calls.append(f'parent#{retry}')

        @subhandler(id='c1')
        def c1(retry: int, **_: Any) -> str:
            calls.append(f'c1#{retry}')
            if retry < 2:
                raise TemporaryError('c1 wait', delay=None)
            return 'c1 done'

        @subhandler(id='c2')
        def c2(**_: Any) -> str:
            calls.append('c2')

            @subhandler(id='g1')
            def g1(retry: int, **_: Any) -> str:
                calls.append(f'g1#{retry}')
                if retry < 1:
                    raise TemporaryError('g1 wait', delay=None)
                return 'g'

            return 'c2res'

        return 'parent-result'

    from kopf._core.actions.lifecycles import asap
    raw = make_body()
    handlers = [make_handler(parent)]
    for _ in range(10):
        raw, outcomes, state, _ = await run_cycle(raw, handlers, lifecycle=asap)
        if state.done:
            break
    assert calls == [
        'parent#0', 'c1#0',
        'parent#1', 'c2', 'g1#0',
        'parent#2', 'c1#1',
        'parent#3', 'c2', 'g1#1',
        'parent#4', 'c1#2',
    ]
    assert state.done
    assert state.counts == (1, 0, 0)
    assert outcomes['parent'].subrefs == ('parent/c1', 'parent/c2', 'parent/c2/g1')
    assert raw['status'] == {'parent/c2/g1': 'g', 'parent/c2': 'c2res', 'parent/c1': 'c1 done',
                             'parent': 'parent-result'}
    assert raw['metadata']['annotations'] == {}  # all purged, incl. the sub-handlers of all depths


async def test_failed_subhandlers_do_not_fail_the_parent(run_cycle: Any, make_body: Any) -> None:
    def parent(**_: Any) -> str:
        @subhandler(id='bad')
        def bad(**_: Any) -> None:
            raise PermanentError('bad')

        return 'ok'

    _, outcomes, state, _ = await run_cycle(make_body(), [make_handler(parent)])
    assert outcomes['parent'] == Outcome(final=True, result='ok', subrefs=('parent/bad',))
    assert state.done


async def test_subhandlers_filters_apply(run_cycle: Any, make_body: Any) -> None:
    calls: list[str] = []

    def parent(**_: Any) -> None:
        @subhandler(id='no', when=lambda **_: False)
        def no(**_: Any) -> None:
            calls.append('no')

        @subhandler(id='yes', labels={'a': 'b'})
        def yes(**_: Any) -> None:
            calls.append('yes')

    raw = make_body()
    raw['metadata']['labels'] = {'a': 'b'}
    _, outcomes, _, _ = await run_cycle(raw, [make_handler(parent)])
    assert calls == ['yes']
    assert outcomes['parent'].subrefs == ('parent/yes',)


async def test_subhandlers_of_a_failed_parent_are_not_executed(run_cycle: Any, make_body: Any) -> None:
    calls: list[str] = []

    def parent(**_: Any) -> None:
        @subhandler(id='child')
        def child(**_: Any) -> None:
            calls.append('child')

        raise TemporaryError('not now', delay=None)

    _, outcomes, _, _ = await run_cycle(make_body(), [make_handler(parent)])
    assert calls == []
    assert not outcomes['parent'].final


#
# Sub-handlers, imperative.
#

async def test_execute_with_a_mapping_of_functions(run_cycle: Any, make_body: Any) -> None:
    log: list[str] = []

    async def fa(retry: int, **_: Any) -> str:
        log.append(f'a#{retry}')
        if retry < 1:
            raise TemporaryError('fa wait', delay=None)
        return 'fa'

    def fc(**_: Any) -> str:
        log.append('c')
        return 'fc'

    async def p1(retry: int, **_: Any) -> str:
        log.append(f'enter#{retry}')
        try:
            await execute(fns={'a': fa, 'c': fc})
        except HandlerChildrenRetry as e:
            log.append(f'retry-after-{e.delay}')
            raise
        log.append(f'leave#{retry}')
        return 'p1'

    raw = make_body()
    for _ in range(5):
        raw, outcomes, state, _ = await run_cycle(raw, [make_handler(p1)])
        if state.done:
            break
    assert log == ['enter#0', 'a#0', 'c', 'retry-after-0',
                   'enter#1', 'a#1', 'leave#1']
    assert outcomes['p1'] == Outcome(final=True, result='p1', subrefs=('p1/a', 'p1/c'))
    assert raw['status'] == {'p1/a': 'fa', 'p1/c': 'fc', 'p1': 'p1'}


async def test_execute_with_functions_handlers_and_registries(settings: Any, logger: logging.Logger,
                                                              make_cause: Any) -> None:
    from kopf._core.intents.registries import ChangingRegistry

    ids: list[str] = []

    def child_fn(**_: Any) -> None:
        ids.append(handler_var.get().id)

    registry = ChangingRegistry()
    registry.append(make_handler(child_fn, id='parent/from-registry'))

    async def parent(**_: Any) -> None:
        await execute(fns=[child_fn])
        await execute(handlers=[make_handler(child_fn, id='parent/from-handlers')])
        await execute(registry=registry)
        with pytest.raises(TypeError, match='only one of'):
            await execute(fns=[child_fn], registry=registry)

    outcome = await execute_handler_once(settings=settings, handler=make_handler(parent), cause=make_cause(),
                                         state=fresh(), lifecycle=all_at_once, logger=logger)
    assert ids == ['parent/child_fn', 'parent/from-handlers', 'parent/from-registry']
    assert outcome.final and outcome.exception is None
    assert outcome.subrefs == ('parent/child_fn', 'parent/from-handlers', 'parent/from-registry')


async def test_explicit_execution_of_the_declared_subhandlers_is_not_repeated(
        settings: Any, logger: logging.Logger, make_cause: Any) -> None:
    calls: list[str] = []

    async def parent(**_: Any) -> None:
        @subhandler(id='child')
        def child(**_: Any) -> None:
            calls.append('child')

        await execute()
        calls.append('after')

    outcome = await execute_handler_once(settings=settings, handler=make_handler(parent), cause=make_cause(),
                                         state=fresh(), logger=logger)
    assert calls == ['child', 'after']
    assert outcome.final and outcome.exception is None


async def test_execute_twice_does_not_repeat_the_finished_ones(
        settings: Any, logger: logging.Logger, make_cause: Any) -> None:
    calls: list[str] = []

    def child(**_: Any) -> None:
        calls.append('child')

    async def parent(**_: Any) -> None:
        await execute(fns={'x': child})
        await execute(fns={'x': child})

    await execute_handler_once(settings=settings, handler=make_handler(parent), cause=make_cause(),
                               state=fresh(), logger=logger)
    assert calls == ['child']


async def test_nested_execute(run_cycle: Any, make_body: Any) -> None:
    async def grandchild(**_: Any) -> str:
        return 'deep'

    async def child(**_: Any) -> None:
        await execute(fns={'gc': grandchild})

    async def parent(**_: Any) -> None:
        await execute(fns={'c': child})

    raw, outcomes, state, _ = await run_cycle(make_body(), [make_handler(parent)])
    assert state.done
    assert outcomes['parent'].subrefs == ('parent/c', 'parent/c/gc')
    assert raw['status'] == {'parent/c/gc': 'deep'}


async def test_execute_outside_of_handlers(make_cause: Any, storage: Any, settings: Any) -> None:
    def fn(**_: Any) -> None:
        raise TemporaryError('later', delay=None)

    with pytest.raises(LookupError, match='only inside of a handler'):
        await execute(fns={'x': fn})

    cause = make_cause()
    with pytest.raises(HandlerChildrenRetry):
        await execute(fns={'x': fn}, cause=cause)
    # No parent: the id is as given; the default settings use the default storage, not ours.
    assert cause.patch.status == {}


#
# Results.
#

def test_deliver_results() -> None:
    patch = Patch()
    deliver_results(outcomes={
        HandlerId('a'): Outcome(final=True, result={'x': 1}),
        HandlerId('b'): Outcome(final=True, result=None),
        HandlerId('c/d'): Outcome(final=True, result=0),
        HandlerId('e'): Outcome(final=False, exception=TemporaryError()),
    }, patch=patch)
    assert patch == {'status': {'a': {'x': 1}, 'c/d': 0}}


def test_deliver_no_results() -> None:
    patch = Patch()
    deliver_results(outcomes={HandlerId('a'): Outcome(final=True)}, patch=patch)
    assert not patch


async def test_everything_done_in_one_cycle_leaves_no_records(run_cycle: Any, make_body: Any) -> None:
    # As observed with Kopf: the records stored during the cycle are purged from the patch itself.
    def parent(**_: Any) -> None:
        @subhandler(id='ch')
        def ch(**_: Any) -> int:
            return 5

    raw, _, state, patch = await run_cycle(make_body(), [make_handler(parent)])
    assert state.done
    assert patch == {'status': {'parent/ch': 5}}
    assert raw['status'] == {'parent/ch': 5}


async def test_no_implicit_execution_after_an_explicit_one(settings: Any, logger: logging.Logger,
                                                           make_cause: Any) -> None:
    from kopf._core.actions.lifecycles import one_by_one
    calls: list[str] = []

    async def parent(**_: Any) -> None:
        @subhandler(id='a')
        def a(**_: Any) -> None:
            calls.append('a')

        @subhandler(id='b')
        def b(**_: Any) -> None:
            calls.append('b')

        with pytest.raises(HandlerChildrenRetry):
            await execute()  # only one child per execution by the lifecycle
        # Suppressed (which is not advised): the parent is still retried, but nothing runs implicitly.

    outcome = await execute_handler_once(settings=settings, handler=make_handler(parent), cause=make_cause(),
                                         state=fresh(), lifecycle=one_by_one, logger=logger)
    assert calls == ['a']
    assert not outcome.final
    assert outcome.delay == 0
    assert isinstance(outcome.exception, HandlerChildrenRetry)
