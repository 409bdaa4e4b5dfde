"""
Daemons and timers: the background work that accompanies every object while it exists.

* The async daemon runs for as long as the object exists: it checks ``stopped`` between its steps
  and sleeps with ``stopped.wait()``, so that it exits at once when the object is deleted
  or the operator exits; its ``patch`` goes to the object when it exits.
* The sync daemon runs in a thread of the executor and does the same with the blocking calls.
* The timer runs every few seconds, but only while the object is not being changed (``idle``):
  its result is stored in the object's status under the timer's id, as the handlers' results are.

Our finalizer holds an object's deletion until its daemons have exited.

Run it with: kopf run examples/13-daemons-timers/example.py --verbose
"""
import asyncio
from typing import Any

import kopf


@kopf.daemon('kopfexamples', initial_delay=0.5, cancellation_backoff=1, cancellation_timeout=5)
async def monitor_async(stopped: kopf.DaemonStopped, patch: kopf.Patch, logger: kopf.Logger,
                        spec: kopf.Spec, **_: Any) -> None:
    rounds = 0
    while not stopped:
        rounds += 1
        logger.info(f'Monitoring the field {spec.get("field")!r} (round {rounds}).')
        await stopped.wait(2)
    logger.info(f'The async daemon is stopped ({stopped.reason}) after {rounds} rounds.')
    patch.status['monitored_rounds'] = rounds


@kopf.daemon('kopfexamples', cancellation_timeout=5)
def monitor_sync(stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any) -> None:
    logger.info('The sync daemon is started in a thread.')
    while not stopped:
        stopped.wait(2)  # a blocking sleep that wakes up as soon as the daemon is stopped
    logger.info('The sync daemon is stopped.')


@kopf.timer('kopfexamples', interval=1, idle=0.5)
async def tick(spec: kopf.Spec, logger: kopf.Logger, **_: Any) -> dict[str, Any]:
    await asyncio.sleep(0)  # anything async: a check of an external system, a call of an API
    logger.info(f'Tick: the field is {spec.get("field")!r}.')
    return {'field': spec.get('field')}
