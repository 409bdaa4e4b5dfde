"""
The event loops: `kopf run` uses uvloop whenever it is installed (as Kopf does); the tests' own loops
(of pytest-asyncio, of KopfRunner) are uvloop's in tox's ``uvloop`` env (``KOPF_TEST_LOOP=uvloop``),
asyncio's otherwise.
"""
import asyncio
import importlib.util
import os
import signal
import sys
import textwrap
from typing import Any

import kopf
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import KopfRunner
from kopf.testing.emulator import KubernetesEmulator

CHOSEN = os.environ.get('KOPF_TEST_LOOP', 'asyncio')
INSTALLED = 'uvloop' if importlib.util.find_spec('uvloop') is not None else 'asyncio'

OPERATOR = '''
    import asyncio, kopf

    @kopf.on.startup()
    async def tell(logger, **_):
        logger.info(f'The loop is of {type(asyncio.get_running_loop()).__module__.split(".")[0]}.')
'''


def loop_family() -> str:
    """uvloop or asyncio, also under looptime (it wraps the loop's class into a subclass of its own)."""
    modules = {cls.__module__.split('.')[0] for cls in type(asyncio.get_running_loop()).__mro__}
    return 'uvloop' if 'uvloop' in modules else 'asyncio'



async def test_the_tests_loops_are_the_chosen_ones() -> None:
    assert loop_family() == CHOSEN


def test_kopf_runner_runs_in_the_chosen_loop(k8s_emulator: KubernetesEmulator) -> None:
    registry = OperatorRegistry()
    seen: list[str] = []

    @kopf.on.startup(registry=registry)
    async def tell(**_: Any) -> None:
        seen.append(loop_family())

    with KopfRunner(['run', '-A', '--standalone'], registry=registry):
        pass
    assert seen == [CHOSEN]


def test_kopf_run_uses_uvloop_when_installed(k8s_emulator: KubernetesEmulator, tmp_path: Any,
                                             kopf_process: Any) -> None:
    source = tmp_path / 'operator.py'
    source.write_text(textwrap.dedent(OPERATOR))
    env = {**os.environ, 'KUBECONFIG': str(k8s_emulator.kubeconfig_path)}
    process = kopf_process([sys.executable, '-m', 'kopf', 'run', '--standalone', '-A', str(source)], env)
    try:
        process.wait_for(rf'The loop is of {INSTALLED}\.')
    finally:
        process.popen.send_signal(signal.SIGINT)
        assert process.wait() == 0
