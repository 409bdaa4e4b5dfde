"""
The sharding benchmark's operator (``benchmarks/sharding.py``): run by ``kopf run --shards``.

A create handler that waits on I/O (``BENCH_HANDLER_SECONDS``, 0.05 by default) and returns
a result, which the framework stores in the object's status (the benchmark watches for it);
the objects processed at once are bounded (``BENCH_WORKER_LIMIT``, 20 by default).
"""
import asyncio
import os
from typing import Any

import kopf

DELAY = float(os.environ.get('BENCH_HANDLER_SECONDS', '0.05'))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.queueing.worker_limit = int(os.environ.get('BENCH_WORKER_LIMIT', '20'))
    settings.posting.enabled = False  # no k8s events: only the handling and its status patches
    settings.sharding.lease_duration = 6  # shorter than the default 15 s: the replicas settle sooner
    settings.sharding.renew_deadline = 4
    settings.sharding.retry_period = 0.5


@kopf.on.create('kopfexamples')
async def create_fn(**_: Any) -> dict[str, int]:
    await asyncio.sleep(DELAY)
    return {'handled': 1}
