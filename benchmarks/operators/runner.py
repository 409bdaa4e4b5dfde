"""
Run an operator file with `kopf.run()`: the same script works for Kopf and for this project.

Usage: python runner.py OPERATOR_FILE [--metrics] [--uvloop]
(KUBECONFIG must point to the cluster or the emulator).
With ``--metrics`` (this project only), the framework's metrics are on, served on a free port.
With ``--uvloop``, the event loop is uvloop's (both frameworks make their loop by the policy).
"""
import asyncio
import runpy
import sys
from typing import Any

import kopf

if '--uvloop' in sys.argv[2:]:
    import uvloop
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

runpy.run_path(sys.argv[1])
if '--metrics' in sys.argv[2:]:
    @kopf.on.startup()
    def metered(settings: Any, **_: Any) -> None:
        settings.metrics.endpoint = 'http://127.0.0.1:0/metrics'

kopf.run(standalone=True, namespaces=['default'])
