"""
Errors and retries: what happens when the handlers fail, and how to control it.

* ``kopf.TemporaryError``: "not yet, try again later" -- the handler is retried after ``delay``.
* ``kopf.PermanentError``: "this will never work" -- the handler is not retried at all.
* Any other exception: an unexpected failure -- retried after ``backoff`` seconds, forever unless
  limited by ``retries=`` (or ``timeout=``), or not retried at all with other ``errors=`` modes.

The failures are logged; the handlers' retries and errors are kept on the object meanwhile.
The delays here are short to make the demo quick; real operators often wait for longer.

Run it with: kopf run examples/03-errors/example.py --verbose
"""
from typing import Any

import kopf


@kopf.on.create('kopfexamples')
def wait_for_data(retry: int, logger: kopf.Logger, **_: Any) -> dict[str, Any]:
    # Imagine some data that is not ready yet. Do not sleep in the handler: ask Kopf to come back
    # later, which keeps the other handlers and the deletion of this object responsive meanwhile.
    if retry < 1:
        raise kopf.TemporaryError('The data is not ready yet.', delay=1)
    logger.info(f'The data is ready at the attempt #{retry + 1}.')
    return {'attempts': retry + 1}


@kopf.on.create('kopfexamples', retries=3, backoff=1)
def call_flaky_service(retry: int, **_: Any) -> dict[str, Any]:
    # An arbitrary exception (e.g. from a client library) is retried after the backoff,
    # here for at most 3 attempts in total; after that, the handler fails for good.
    if retry < 1:
        raise ConnectionError('The service is unavailable.')
    return {'attempts': retry + 1}


@kopf.on.create('kopfexamples', errors=kopf.ErrorsMode.IGNORED)
def send_notification(**_: Any) -> None:
    # Nice to have, but not important: the failure is logged, not retried, and not a failure of the object.
    raise RuntimeError('The notification service is down.')


@kopf.on.update('kopfexamples', field='spec.field')
def forbid_changes(old: Any, new: Any, **_: Any) -> None:
    # Retrying will never make this change acceptable: fail permanently.
    raise kopf.PermanentError(f'spec.field cannot be changed from {old!r} to {new!r}.')
