"""
The benchmark operator: a timer on every object that stores a per-object tick counter in its status.

Every tick PATCHes the status with a new value (``status.tick``: 1, 2, 3, ...), so the emulator sees
every tick, and the sum of the stored counters is the number of ticks that reached the API.
Configured by the environment (the same file runs under both implementations):
``BENCH_TIMER_INTERVAL`` (seconds, default 1), ``BENCH_TIMER_INITIAL_DELAY`` (seconds, default none),
``BENCH_SYNC_HANDLERS=1`` for a sync handler (in the executor) instead of an async one.
"""
import os

import kopf

INTERVAL = float(os.environ.get('BENCH_TIMER_INTERVAL', '1'))
INITIAL_DELAY = float(os.environ.get('BENCH_TIMER_INITIAL_DELAY', '0')) or None
TICKS: dict[str, int] = {}


def tick(name: str, patch: kopf.Patch) -> None:
    TICKS[name] = TICKS.get(name, 0) + 1
    patch.status['tick'] = TICKS[name]


if os.environ.get('BENCH_SYNC_HANDLERS') == '1':
    @kopf.timer('kopfexamples', interval=INTERVAL, initial_delay=INITIAL_DELAY)
    def timer_fn(name: str, patch: kopf.Patch, **_: object) -> None:
        tick(name, patch)
else:
    @kopf.timer('kopfexamples', interval=INTERVAL, initial_delay=INITIAL_DELAY)
    async def timer_fn(name: str, patch: kopf.Patch, **_: object) -> None:
        tick(name, patch)
