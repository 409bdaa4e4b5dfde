import logging
from collections.abc import Iterator

import pytest

import kopf._core.actions.lifecycles as lifecycles
from kopf._core.actions.progression import HandlerState, State
from kopf._core.intents.handlers import ChangingHandler, HandlerId


def make_handler(id: str) -> ChangingHandler:
    return ChangingHandler(fn=lambda **_: None, id=HandlerId(id))


HANDLERS = [make_handler('a'), make_handler('b'), make_handler('c')]


@pytest.fixture(autouse=True)
def _restore_default_lifecycle() -> Iterator[None]:
    yield
    lifecycles.set_default_lifecycle(None)


def test_all_at_once() -> None:
    assert list(lifecycles.all_at_once(HANDLERS)) == HANDLERS
    assert list(lifecycles.all_at_once([])) == []


def test_one_by_one() -> None:
    assert list(lifecycles.one_by_one(HANDLERS, state=State())) == HANDLERS[:1]
    assert list(lifecycles.one_by_one([])) == []


def test_randomized_picks_one_of_them() -> None:
    picked = {handler.id for _ in range(100) for handler in lifecycles.randomized(HANDLERS)}
    assert picked == {'a', 'b', 'c'}  # all of them are picked eventually
    assert len(lifecycles.randomized(HANDLERS)) == 1
    assert list(lifecycles.randomized([])) == []


def test_shuffled_keeps_all_of_them() -> None:
    orders = {tuple(handler.id for handler in lifecycles.shuffled(HANDLERS)) for _ in range(100)}
    assert all(sorted(order) == ['a', 'b', 'c'] for order in orders)
    assert len(orders) > 1
    assert list(lifecycles.shuffled([])) == []


def test_asap_picks_the_least_retried_handler() -> None:
    state = State({HandlerId('a'): HandlerState(retries=2),
                   HandlerId('b'): HandlerState(retries=1),
                   HandlerId('c'): HandlerState(retries=1)})
    assert list(lifecycles.asap(HANDLERS, state=state)) == [HANDLERS[1]]


def test_asap_picks_the_first_one_among_equals_and_unknown_as_new() -> None:
    state = State({HandlerId('a'): HandlerState(retries=1)})
    assert list(lifecycles.asap(HANDLERS, state=state)) == [HANDLERS[1]]
    assert list(lifecycles.asap([], state=state)) == []


def test_default_lifecycle_is_asap() -> None:
    assert lifecycles.get_default_lifecycle() is lifecycles.asap


def test_default_lifecycle_can_be_replaced_and_restored(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    lifecycles.set_default_lifecycle(lifecycles.one_by_one)
    assert lifecycles.get_default_lifecycle() is lifecycles.one_by_one
    assert 'The default lifecycle is already set to' in caplog.text
    assert 'overriding it to <function one_by_one' in caplog.text

    lifecycles.set_default_lifecycle(None)
    assert lifecycles.get_default_lifecycle() is lifecycles.asap


def test_setting_the_same_lifecycle_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    lifecycles.set_default_lifecycle(lifecycles.asap)
    assert caplog.records == []
