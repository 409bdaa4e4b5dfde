"""
Loading the operator's sources: script files by their paths, importable modules by their names.

Both mimic the Python interpreter. A file runs like ``python file.py``: its directory becomes
importable (so it can import its siblings), and its code is executed anew on every loading.
A module is imported like ``python -m package.module``: the current directory is importable,
and an already imported module is not executed again. The handlers get registered by the
decorators while the code is executed; nothing else is expected from the sources.

A source that cannot be loaded raises :class:`LoadingError` with a message for humans: which
source failed and why, with the traceback of the user's code only (not of the import machinery
or of the framework), while the original exception stays available as ``__cause__``.
"""
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import traceback
import types
from collections.abc import Iterable


class LoadingError(Exception):
    """A source file or module could not be loaded; the message says which one and why."""


def load_sources(*, paths: Iterable[str], modules: Iterable[str]) -> None:
    """Execute the files (in the given order), then import the modules (in the given order)."""
    for path in paths:
        load_file(path)
    for name in modules:
        import_module(name)


def load_file(path: str) -> types.ModuleType:
    """Execute a Python file as a module, with its directory importable; return the module."""
    absolute_path = os.path.abspath(path)
    if not os.path.exists(absolute_path):
        raise LoadingError(f'Cannot load {path!r}: there is no such file.')
    if os.path.isdir(absolute_path):
        raise LoadingError(
            f'Cannot load {path!r}: it is a directory. '
            f'To load a package, make it importable and use: -m <package name>'
        )

    _make_importable(os.path.dirname(absolute_path))
    module_name = _module_name_for_file(absolute_path)
    loader = importlib.machinery.SourceFileLoader(module_name, absolute_path)  # any file extension
    spec = importlib.util.spec_from_file_location(module_name, absolute_path, loader=loader)
    if spec is None:  # pragma: no cover  # only for the paths that the loader rejects
        raise LoadingError(f'Cannot load {path!r}: it is not a Python source file.')
    module = importlib.util.module_from_spec(spec)

    # Registered before the execution, as imports do: so that the code that imports this file
    # by its name (a sibling, or the file itself) gets this module instead of executing it again.
    previous_module = sys.modules.get(module_name)
    sys.modules[module_name] = module
    try:
        loader.exec_module(module)
    except Exception as e:
        if previous_module is None:
            sys.modules.pop(module_name, None)
        else:
            sys.modules[module_name] = previous_module
        raise LoadingError(f'Cannot load {path!r}:\n{describe_user_error(e)}') from e
    return module


def import_module(name: str) -> types.ModuleType:
    """Import a module by its name, as ``python -m`` finds it (the current directory included)."""
    _make_importable(os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + '.')):
            hint = ''
            if name.endswith('.py') or os.sep in name or os.path.isfile(name):
                hint = f' It looks like a file path: to load a file, pass it without -m: kopf run {name}'
            raise LoadingError(f'Cannot import the module {name!r}: {e}.{hint}') from e
        raise LoadingError(f'Cannot import the module {name!r}:\n{describe_user_error(e)}') from e
    except Exception as e:
        raise LoadingError(f'Cannot import the module {name!r}:\n{describe_user_error(e)}') from e


def describe_user_error(exception: BaseException) -> str:
    """
    The traceback of an error in the user's code, without the frames of the import machinery
    and of the framework, which tell nothing about the user's mistake. Errors that have no
    frames of the user's code (e.g. syntax errors) are shown by their location only.
    """
    details = traceback.TracebackException.from_exception(exception)
    user_frames = [frame for frame in details.stack if not _is_framework_file(frame.filename)]
    details.stack = traceback.StackSummary.from_list(user_frames)
    return ''.join(details.format()).rstrip('\n')


def _is_framework_file(filename: str) -> bool:
    if filename.startswith('<frozen'):  # the frozen import machinery: <frozen importlib._bootstrap>
        return True
    absolute = os.path.abspath(filename)
    return any(_is_within(absolute, directory) for directory in _framework_directories())


def _framework_directories() -> list[str]:
    # Every portion of the kopf package (its distributions may be installed in different places),
    # and the standard importlib, whose frames wrap every import.
    kopf_package = sys.modules['kopf']  # always imported as the parent of this module; not the facade's API
    directories = [os.path.abspath(directory) for directory in kopf_package.__path__]
    directories.append(os.path.dirname(os.path.abspath(importlib.__file__ or '')))
    return directories


def _is_within(path: str, directory: str) -> bool:
    try:
        return os.path.commonpath([path, directory]) == directory
    except ValueError:  # different drives on Windows
        return False


def _make_importable(directory: str) -> None:
    # An empty string in sys.path means the current directory: it counts as present too.
    present = {os.path.abspath(entry or os.curdir) for entry in sys.path}
    if os.path.abspath(directory) not in present:
        sys.path.insert(0, directory)


def _module_name_for_file(absolute_path: str) -> str:
    """
    The module name to execute a file under: the file's own name if importing that name
    would find this very file (then ``import thatname`` elsewhere does not execute it twice);
    otherwise (e.g. ``operator.py`` is also a standard module), a name unique for the path.
    """
    stem = os.path.splitext(os.path.basename(absolute_path))[0]
    if stem.isidentifier() and _finds_this_file(stem, absolute_path):
        return stem
    safe_stem = re.sub(r'\W', '_', stem)
    digest = hashlib.sha256(absolute_path.encode('utf-8', 'surrogateescape')).hexdigest()[:12]
    return f'_kopf_source_{safe_stem}_{digest}'


def _finds_this_file(name: str, absolute_path: str) -> bool:
    existing = sys.modules.get(name)
    if existing is not None:
        existing_file = getattr(existing, '__file__', None)
        return existing_file is not None and _same_file(existing_file, absolute_path)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None and _same_file(spec.origin, absolute_path)


def _same_file(path1: str, path2: str) -> bool:
    try:
        return os.path.samefile(path1, path2)
    except OSError:
        return False
