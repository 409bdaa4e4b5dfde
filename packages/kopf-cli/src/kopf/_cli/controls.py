"""
What an embedding caller hands to the ``kopf`` command besides its arguments.

The command line cannot carry Python objects: a registry, settings, or flags to stop the operator
from another thread. A caller that invokes the command in-process (``kopf.testing.KopfRunner``
does it via click's test runner) passes a :class:`RunControls` as click's context object
(``obj=``); the command uses whatever is set there and reports back what it could not return.
"""
import asyncio
import concurrent.futures
import dataclasses
import threading
from typing import Any

from kopf._clients.vault import Vault
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.registries import OperatorRegistry

# The kinds of flags that the operator accepts for stopping and for signalling its readiness.
Flag = asyncio.Future[Any] | asyncio.Event | concurrent.futures.Future[Any] | threading.Event


@dataclasses.dataclass
class RunControls:
    """
    In-process extras for ``kopf run``: all optional; ``None`` means "as in a real CLI run".

    ``registry``: where the loaded files & modules register their handlers, and what the
    operator serves; it is made the default registry while the sources are being loaded.
    ``settings``, ``vault``, ``memo``: passed to the operator as they are.
    ``stop_flag``: when set, the operator stops gracefully (instead of waiting for OS signals).
    ``ready_flag``: set by the operator once it has started up.
    ``loop``: the event loop to run the operator in (the caller keeps its ownership).
    ``failure``: filled by the command, not by the caller: the original exception behind
    a failure that the command has reported as a short message with a non-zero exit code.
    """

    registry: OperatorRegistry | None = None
    settings: OperatorSettings | None = None
    vault: Vault | None = None
    memo: object | None = None
    stop_flag: Flag | None = None
    ready_flag: Flag | None = None
    loop: asyncio.AbstractEventLoop | None = None
    failure: BaseException | None = None
