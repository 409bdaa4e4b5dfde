"""
Embedding: the operator as a part of an asyncio application, not as the ``kopf run`` command.

The application starts the operator as a task in its own event loop, does its own work meanwhile,
and stops the operator with a stop-flag when the application is done. The operator's memo is
the channel between them: the handlers put what they have seen, the application reads it.

Run it with: python examples/09-embedding/example.py   (Ctrl+C stops the operator and the app)
Against the emulator: python -m kopf.testing.emulator --kubeconfig /tmp/emulator.kubeconfig,
then KUBECONFIG=/tmp/emulator.kubeconfig python examples/09-embedding/example.py in another shell.
"""
import asyncio
import logging
from typing import Any

import kopf

# An own registry keeps these handlers away from other operators that may run in the same process.
registry = kopf.OperatorRegistry()
logger = logging.getLogger('app')


@kopf.on.create('kopfexamples', registry=registry)
async def create_fn(name: str | None, memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    await memo.created.put(name)  # the operator's memo, shallow-copied: the same queue as the app's
    return {'message': f'hello, {name}'}


async def main(stop_flag: asyncio.Event | None = None) -> None:
    """Run the application until the stop-flag is set (or Ctrl+C)."""
    stop_flag = stop_flag if stop_flag is not None else asyncio.Event()
    created: asyncio.Queue[str] = asyncio.Queue()
    operator = asyncio.create_task(kopf.operator(
        registry=registry,
        namespaces=['default'],
        standalone=True,  # a single instance: no peering with other operators
        stop_flag=stop_flag,
        memo=kopf.Memo(created=created),
    ))

    # The application's own work, until the operator exits (it also handles Ctrl+C & SIGTERM).
    # Note: the operator cancels the tasks that it has not started itself and that are left when it
    # exits; so this work is done right here, not in new tasks of the same event loop.
    while not operator.done():
        await asyncio.wait([operator], timeout=0.1)
        while not created.empty():
            logger.info(f'The application has noticed a new KopfExample: {created.get_nowait()!r}.')

    await operator  # re-raise the operator's failure, if any


if __name__ == '__main__':
    kopf.configure(log_prefix=True)  # the logs of the operator & of the app, with the objects' names
    asyncio.run(main())
