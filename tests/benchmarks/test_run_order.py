"""
The benchmarks' order of the implementations' runs (``benchmarks/_harness.py``: ``run_order()``).

The medians compare implementations measured one after another on a machine whose caches and clock
keep the state of the run before: the order must not favour anyone (see ``benchmarks/README.md``).
"""
import collections
import importlib.util
import itertools
import pathlib
import sys
from types import ModuleType

import pytest

HARNESS = pathlib.Path(__file__).resolve().parents[2] / 'benchmarks' / '_harness.py'


@pytest.fixture(scope='module')
def harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location('_bench_harness', HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the dataclasses of the module look themselves up there
    spec.loader.exec_module(module)
    return module


def cycle_length(count: int) -> int:
    return count if count % 2 == 0 else 2 * count


@pytest.mark.parametrize('count', [1, 2, 3, 4, 5, 6])
def test_every_repeat_runs_every_implementation_once(harness: ModuleType, count: int) -> None:
    items = [f'impl{i}' for i in range(count)]
    for repeat in range(2 * cycle_length(count)):
        assert sorted(harness.run_order(items, repeat)) == sorted(items)


@pytest.mark.parametrize('count', [2, 3, 4, 5, 6])
def test_each_one_runs_after_every_other_one_equally_often(harness: ModuleType, count: int) -> None:
    items = [f'impl{i}' for i in range(count)]
    orders = [harness.run_order(items, repeat) for repeat in range(cycle_length(count))]
    pairs = collections.Counter(pair for order in orders for pair in itertools.pairwise(order))
    expected = {(before, after) for before in items for after in items if before != after}
    assert set(pairs) == expected
    assert len(set(pairs.values())) == 1


@pytest.mark.parametrize('count', [2, 3, 4, 5, 6])
def test_each_one_runs_first_equally_often(harness: ModuleType, count: int) -> None:
    items = [f'impl{i}' for i in range(count)]
    firsts = collections.Counter(harness.run_order(items, repeat)[0] for repeat in range(cycle_length(count)))
    assert set(firsts) == set(items)
    assert len(set(firsts.values())) == 1


def test_the_orders_repeat_after_a_full_cycle(harness: ModuleType) -> None:
    items = ['kopf', 'ours', 'floor', 'lean', 'before']
    orders = [harness.run_order(items, repeat) for repeat in range(20)]
    assert orders[:10] == orders[10:]
