"""
Activities: the operator's startup and cleanup, the settings, and the operator-wide memo.

* The startup handlers run before the operator watches anything: the place to adjust the settings
  and to prepare what the other handlers need.
* The cleanup handlers run when the operator exits (e.g. on Ctrl+C or SIGTERM).
* The operator's ``memo`` is shallow-copied into every object's own ``memo``: the mutable values
  put there on startup (a set here) are shared by all the handlers of all the objects.

Run it with: kopf run examples/10-activities/example.py --verbose
"""
from typing import Any

import kopf


@kopf.on.startup()
def startup_fn(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    settings.persistence.finalizer = 'kopf.dev/example-finalizer'  # instead of Kopf's default one
    settings.execution.max_workers = 4  # threads for the synchronous handlers
    memo.names = set()
    logger.info('The operator is configured.')


@kopf.on.create('kopfexamples')
@kopf.on.resume('kopfexamples')  # after a restart, the memo is empty: fill it for the existing objects
def register_fn(name: str, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    memo.names.add(name)
    logger.info(f'Served objects: {sorted(memo.names)}')


@kopf.on.delete('kopfexamples')
def delete_fn(name: str, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    memo.names.discard(name)
    logger.info(f'Served objects: {sorted(memo.names)}')


@kopf.on.cleanup()
def cleanup_fn(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    logger.info(f'The operator exits; the objects still served: {sorted(memo.names)}')
