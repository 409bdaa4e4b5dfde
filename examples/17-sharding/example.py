"""
Several replicas of one operator split the objects among themselves: each handles only its own shards.

Run two or more replicas (see the README):

    kopf run example.py -A --shards=default/example
"""
import random
import socket
from typing import Any

import kopf


@kopf.on.startup()
def name_the_replica(memo: kopf.Memo, settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
    # Only to see in the logs & the objects which replica has handled what; not needed for the sharding.
    memo.replica = f'{socket.gethostname()}-{random.randint(0, 99999)}'
    sharding = settings.sharding
    if sharding.name:
        logger.info(f'Replica {memo.replica} shares {sharding.count} shards with the others via the Leases '
                    f'{sharding.namespace or "default"}/{sharding.name}-shard-*.')
    else:
        logger.info(f'Replica {memo.replica} handles everything: run it with --shards=NAME to share.')


@kopf.on.create('kopfexamples')
def create_fn(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> dict[str, str]:
    logger.info(f'Handled by the replica {memo.replica}.')
    return {'replica': memo.replica}


@kopf.on.update('kopfexamples')
def update_fn(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> dict[str, str]:
    logger.info(f'Updated by the replica {memo.replica}.')
    return {'replica': memo.replica}


@kopf.daemon('kopfexamples')
async def monitor(memo: kopf.Memo, logger: kopf.Logger, stopped: kopf.DaemonStopped, **_: Any) -> None:
    # Runs in the replica that holds the object's shard; moves with the shard to another replica.
    logger.info(f'Monitored by the replica {memo.replica}.')
    await stopped.wait()
    logger.info(f'Not monitored by the replica {memo.replica} anymore: {stopped.reason!r}.')
