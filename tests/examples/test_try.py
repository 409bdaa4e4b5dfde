"""
``examples/try.py`` with a missing or broken operator file: one line that says what is wrong, no traceback.
"""
import pathlib
import subprocess
import sys

import pytest

TRY = pathlib.Path(__file__).resolve().parents[2] / 'examples' / 'try.py'


def run_try(path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TRY), str(path)], capture_output=True, text=True, timeout=60)


def test_missing_operator_file(tmp_path: pathlib.Path) -> None:
    result = run_try(tmp_path / 'absent.py')
    assert result.returncode == 1
    assert result.stderr.count('\n') == 1
    assert result.stderr.startswith(f"examples/try.py: there is no operator file '{tmp_path / 'absent.py'}'; "
                                    f"try one of: examples/01-minimal/example.py, ")


@pytest.mark.parametrize('source, error', [
    ('import kopf\nthis is broken(\n', "SyntaxError: '(' was never closed (broken.py, line 2)"),
    ('raise RuntimeError("boom")\n', 'RuntimeError: boom'),
])
def test_broken_operator_file(tmp_path: pathlib.Path, source: str, error: str) -> None:
    path = tmp_path / 'broken.py'
    path.write_text(source)
    result = run_try(path)
    assert result.returncode == 1
    assert result.stderr == f"examples/try.py: the operator file '{path}' cannot be loaded: {error}\n"
