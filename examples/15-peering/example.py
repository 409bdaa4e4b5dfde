"""
Several replicas of one operator: only one of them handles the objects at a time.

Run two or more replicas in one of the two modes (see the README):

    kopf run example.py -A --peering=example --priority=$RANDOM    # Kopf-compatible peering (CRDs)
    kopf run example.py -A --lease=default/example                 # a Lease (no CRDs)
"""
import random
import socket
from typing import Any

import kopf


@kopf.on.startup()
def name_the_replica(memo: kopf.Memo, settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
    # Only to see in the logs & the objects which replica has handled what; not needed for the peering.
    memo.replica = f'{socket.gethostname()}-{random.randint(0, 99999)}'
    if settings.election.lease_name:
        logger.info(f'Replica {memo.replica} elects the leader with the Lease '
                    f'{settings.election.lease_namespace or "default"}/{settings.election.lease_name}.')
    elif settings.peering.standalone:
        logger.info(f'Replica {memo.replica} runs standalone: '
                    f'it handles everything regardless of the others.')
    else:
        logger.info(f'Replica {memo.replica} peers via {settings.peering.name!r} '
                    f'with the priority {settings.peering.priority}.')


@kopf.on.create('kopfexamples')
def create_fn(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> dict[str, str]:
    logger.info(f'Handled by the replica {memo.replica}.')
    return {'replica': memo.replica}


@kopf.on.update('kopfexamples')
def update_fn(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> dict[str, str]:
    logger.info(f'Updated by the replica {memo.replica}.')
    return {'replica': memo.replica}
