import contextvars
from collections.abc import Callable
from typing import Any

import pytest

import kopf.on
from kopf._core.actions.contexts import handler_var, subregistry_var
from kopf._core.intents.filters import PRESENT
from kopf._core.intents.handlers import ChangingHandler, ErrorsMode, HandlerId, Reason
from kopf._core.intents.registries import ChangingRegistry


def fn(**_: Any) -> None:
    pass


def run_in_handler(parent_id: str, body: Callable[[], Any]) -> ChangingRegistry:
    """Run the code as the execution of a handler would: with its own sub-registry in the context."""
    subregistry = ChangingRegistry()
    parent = ChangingHandler(fn=fn, id=HandlerId(parent_id), reason=Reason.CREATE)

    def executed() -> None:
        handler_var.set(parent)
        subregistry_var.set(subregistry)
        body()

    contextvars.copy_context().run(executed)
    return subregistry


@pytest.mark.parametrize('call', [
    lambda: kopf.on.subhandler(),
    lambda: kopf.on.subhandler(id='x'),
    lambda: kopf.on.register(fn),
])
def test_outside_of_handlers_it_fails_clearly(call):
    with pytest.raises(LookupError, match=r'can be used only inside of a handler being executed'):
        call()


def test_declarative_subhandlers_get_prefixed_ids():
    def create_fn() -> None:
        for item in ['item1', 'item2']:
            @kopf.on.subhandler(id=item)
            def handle_item(item: str = item, **_: Any) -> None:
                pass

    subregistry = run_in_handler('create_fn', create_fn)
    assert [h.id for h in subregistry.get_all_handlers()] == ['create_fn/item1', 'create_fn/item2']


def test_imperative_registration_is_the_same():
    def create_fn() -> None:
        assert kopf.on.register(fn, id='task1') is fn
        kopf.on.register(fn)

    subregistry = run_in_handler('create_fn', create_fn)
    assert [h.id for h in subregistry.get_all_handlers()] == ['create_fn/task1', 'create_fn/fn']


def test_subhandler_options():
    def when(**_: Any) -> bool:
        return True

    def create_fn() -> None:
        result = kopf.on.subhandler(
            id='sub', param=1, errors=ErrorsMode.PERMANENT, timeout=2, retries=3, backoff=4,
            labels={'l': 'v'}, annotations={'a': PRESENT}, when=when, field='spec.x', old='a', new='b',
        )(fn)
        assert result is fn

    [handler] = run_in_handler('parent', create_fn).get_all_handlers()
    assert handler == ChangingHandler(
        fn=fn, id='parent/sub/spec.x', param=1, errors=ErrorsMode.PERMANENT, timeout=2, retries=3, backoff=4,
        labels={'l': 'v'}, annotations={'a': PRESENT}, when=when, field=('spec', 'x'), old='a', new='b',
    )
    assert handler.selector is None and handler.reason is None and handler.initial is None


def test_subhandler_defaults():
    [handler] = run_in_handler('parent', lambda: kopf.on.subhandler()(fn)).get_all_handlers()
    assert handler == ChangingHandler(fn=fn, id='parent/fn', errors=ErrorsMode.TEMPORARY)


def test_nested_subhandlers_get_nested_ids():
    [handler] = run_in_handler('grand/parent', lambda: kopf.on.register(fn, id='child')).get_all_handlers()
    assert handler.id == 'grand/parent/child'


def test_subregistries_are_isolated_per_execution():
    first = run_in_handler('a', lambda: kopf.on.register(fn))
    second = run_in_handler('b', lambda: kopf.on.register(fn))
    assert [h.id for h in first.get_all_handlers()] == ['a/fn']
    assert [h.id for h in second.get_all_handlers()] == ['b/fn']


@pytest.mark.parametrize('kwargs, error, message', [
    ({'id': ''}, ValueError, r'@kopf\.subhandler\(\): id= cannot be empty'),
    ({'retries': -1}, ValueError, r'retries= must be non-negative'),
    ({'field': 'spec.x', 'value': 1, 'new': 2}, TypeError, r'value= cannot be combined with old=/new='),
    ({'value': 1}, TypeError, r'value= needs field='),
    ({'when': 'yes'}, TypeError, r'when= must be a callable'),
])
def test_invalid_subhandlers(kwargs, error, message):
    def create_fn() -> None:
        with pytest.raises(error, match=message):
            kopf.on.subhandler(**kwargs)

    assert not run_in_handler('parent', create_fn).get_all_handlers()


def test_invalid_registration():
    def create_fn() -> None:
        with pytest.raises(TypeError, match=r'decorates functions, got None'):
            kopf.on.register(None)  # type: ignore[arg-type]

    assert not run_in_handler('parent', create_fn).get_all_handlers()
