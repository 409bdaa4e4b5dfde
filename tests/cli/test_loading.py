"""
Loading the sources: files by path (their directory importable), modules by name (from the cwd too).
"""
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import pytest

import kopf
from kopf._cli.loading import LoadingError, import_module, load_file, load_sources
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import KopfRunner, KubernetesEmulator

STARTUP_OPERATOR = '''
    import kopf

    @kopf.on.startup()
    def {name}(logger, **_):
        logger.info('{name} has started.')
'''


def test_file_is_executed_with_its_directory_importable(write_source: Callable[..., pathlib.Path]) -> None:
    write_source('sibling_helper.py', 'VALUE = 42\n')
    path = write_source('uses_sibling.py', 'import sibling_helper\nVALUE = sibling_helper.VALUE\n')
    module = load_file(str(path))
    assert module.VALUE == 42
    assert sys.path[0] == str(path.parent)


def test_file_is_a_module_named_after_it(write_source: Callable[..., pathlib.Path]) -> None:
    path = write_source('named_after_file.py', 'NAME = __name__\n')
    module = load_file(str(path))
    assert module.NAME == 'named_after_file'
    assert sys.modules['named_after_file'] is module


def test_file_imported_by_its_sibling_is_not_executed_twice(
        write_source: Callable[..., pathlib.Path]) -> None:
    write_source('execution_counter.py', 'executions = 0\n')
    write_source('imports_main_back.py', 'import main_with_sibling\n')
    path = write_source('main_with_sibling.py', '''
        import execution_counter
        execution_counter.executions += 1
        import imports_main_back
    ''')
    load_file(str(path))
    assert sys.modules['execution_counter'].executions == 1


def test_file_is_executed_anew_on_every_loading(write_source: Callable[..., pathlib.Path]) -> None:
    write_source('reload_counter.py', 'executions = 0\n')
    path = write_source('reloaded.py', 'import reload_counter\nreload_counter.executions += 1\n')
    load_file(str(path))
    load_file(str(path))
    assert sys.modules['reload_counter'].executions == 2


def test_file_named_as_a_standard_module_does_not_shadow_it(
        write_source: Callable[..., pathlib.Path]) -> None:
    import operator
    path = write_source('operator.py', 'NAME = __name__\n')
    module = load_file(str(path))
    assert module.NAME != 'operator'
    assert sys.modules['operator'] is operator
    assert operator.add(1, 2) == 3


def test_file_without_py_extension(write_source: Callable[..., pathlib.Path]) -> None:
    path = write_source('operator-script', 'VALUE = "loaded"\n')
    module = load_file(str(path))
    assert module.VALUE == 'loaded'


def test_failed_file_leaves_no_module(write_source: Callable[..., pathlib.Path]) -> None:
    path = write_source('fails_to_load.py', 'raise RuntimeError("nope")\n')
    with pytest.raises(LoadingError, match=r"Cannot load .*fails_to_load\.py") as error:
        load_file(str(path))
    assert isinstance(error.value.__cause__, RuntimeError)
    assert 'fails_to_load' not in sys.modules


def test_missing_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(LoadingError, match='there is no such file'):
        load_file(str(tmp_path / 'absent.py'))


def test_directory_instead_of_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(LoadingError, match='it is a directory'):
        load_file(str(tmp_path))


def test_module_is_imported_from_the_current_directory(
        write_source: Callable[..., pathlib.Path], monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_source('cwd_package/cwd_module.py', 'VALUE = 7\n')
    write_source('cwd_package/__init__.py', '')
    monkeypatch.chdir(path.parent.parent)
    module = import_module('cwd_package.cwd_module')
    assert module.VALUE == 7


def test_module_is_imported_once(
        write_source: Callable[..., pathlib.Path], monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_source('imported_once.py', 'import random\nTOKEN = random.random()\n')
    monkeypatch.chdir(path.parent)
    assert import_module('imported_once').TOKEN == import_module('imported_once').TOKEN


def test_module_failing_inside_is_not_reported_as_missing(
        write_source: Callable[..., pathlib.Path], monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_source('missing_dependency.py', 'import kopf_test_no_such_dependency\n')
    monkeypatch.chdir(path.parent)
    with pytest.raises(LoadingError) as error:
        import_module('missing_dependency')
    assert "No module named 'kopf_test_no_such_dependency'" in str(error.value)
    assert 'missing_dependency.py", line 1, in <module>' in str(error.value)


def test_files_go_before_modules(
        write_source: Callable[..., pathlib.Path], monkeypatch: pytest.MonkeyPatch) -> None:
    write_source('load_order.py', 'order = []\n')
    write_source('ordered_module.py', 'import load_order\nload_order.order.append("module")\n')
    first = write_source('ordered_file1.py', 'import load_order\nload_order.order.append("file1")\n')
    second = write_source('ordered_file2.py', 'import load_order\nload_order.order.append("file2")\n')
    monkeypatch.chdir(first.parent)
    load_sources(paths=[str(first), str(second)], modules=['ordered_module'])
    assert sys.modules['load_order'].order == ['file1', 'file2', 'module']


#
# Via the command: the handlers go to the operator's registry and run.
#

def test_handlers_of_files_and_modules_run(
        write_source: Callable[..., pathlib.Path], monkeypatch: pytest.MonkeyPatch,
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry,
) -> None:
    file1 = write_source('first_file_operator.py', STARTUP_OPERATOR.format(name='from_first_file'))
    write_source('second_file_operator.py', STARTUP_OPERATOR.format(name='from_second_file'))
    write_source('pkg_operator/__init__.py', '')
    write_source('pkg_operator/handlers.py', STARTUP_OPERATOR.format(name='from_module'))
    monkeypatch.chdir(file1.parent)
    default_registry = kopf.get_default_registry()
    args = ['run', '-A', '--standalone', '--log-format=plain', str(file1), 'second_file_operator.py',
            '-m', 'pkg_operator.handlers']
    with KopfRunner(args, registry=registry) as runner:
        pass
    lines = runner.output.splitlines()
    assert 'from_first_file has started.' in lines
    assert 'from_second_file has started.' in lines
    assert 'from_module has started.' in lines
    assert {handler.id for handler in registry.activities.get_all_handlers()} == {
        'from_first_file', 'from_second_file', 'from_module',
    }
    assert kopf.get_default_registry() is default_registry  # restored after loading
    default_handlers = default_registry.activities.get_all_handlers()
    assert not any(handler.id.startswith('from_') for handler in default_handlers)


def test_module_given_several_times(
        write_source: Callable[..., pathlib.Path], monkeypatch: pytest.MonkeyPatch,
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry,
) -> None:
    path = write_source('repeated_module.py', STARTUP_OPERATOR.format(name='repeated'))
    monkeypatch.chdir(path.parent)
    with KopfRunner(['run', '-A', '--standalone', '--log-format=plain',
                     '-m', 'repeated_module', '--module', 'repeated_module'], registry=registry) as runner:
        pass
    assert runner.output.splitlines().count('repeated has started.') == 1


def test_no_sources_is_fine_with_handlers_in_the_registry(k8s_emulator: KubernetesEmulator,
                                                          registry: OperatorRegistry) -> None:
    started: list[Any] = []

    @kopf.on.startup(registry=registry)
    def declared_in_test(**_: Any) -> None:
        started.append(True)

    with KopfRunner(['run', '-A', '--standalone'], registry=registry) as runner:
        pass
    assert started == [True]
    assert 'No handlers are registered' not in runner.output
