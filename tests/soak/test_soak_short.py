"""
The short profile of the chaos soak (``tools/soak``): about a minute of churn, API faults, operator
kills & restarts and an emulator restart, with a fixed seed; every invariant must hold.

The soak runs as a subprocess (as in CI by hand: ``python -m tools.soak --profile short``), so that
its printout of the invariants with their figures shows up in the failure's message. Marked ``soak``:
it runs in tox's own ``soak`` env (``tox -e soak``), not in the default suite.
"""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = 16


@pytest.mark.soak
@pytest.mark.timeout(300)
def test_short_soak_keeps_all_invariants(tmp_path: pathlib.Path) -> None:
    args = [sys.executable, '-m', 'tools.soak', '--profile', 'short', '--seed', str(SEED),
            '--workdir', str(tmp_path)]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=270)
    output = result.stdout + result.stderr
    assert 'Invariants (seed 16):' in output, output
    assert result.returncode == 0, output
