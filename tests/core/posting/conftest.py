"""
Fixtures of the event-posting tests: an operator's queue and poster, talking to an API server.

By default, the API server is the Kubernetes API emulator (in its own thread), so that the events
are really stored and can be inspected. The tests of exact request contracts & timing use kmock
in the test's loop instead (with looptime), by overriding the ``server_url`` fixture.
"""
import asyncio
import copy
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import pytest

from kopf._clients.vault import Vault
from kopf._cogs.structs.credentials import ConnectionInfo, VaultKey
from kopf._core.engines.posting import EventQueue, event_queue_var, poster
from kopf._core.intents.configuration import OperatorSettings

if TYPE_CHECKING:
    from kopf.testing.emulator import KubernetesEmulator

BODY: dict[str, Any] = {
    'apiVersion': 'kopf.dev/v1',
    'kind': 'KopfExample',
    'metadata': {'name': 'kex1', 'namespace': 'default', 'uid': 'uid1'},
    'spec': {'field': 'value'},
}


@dataclasses.dataclass
class Operator:
    """What an operator has for posting: its settings, queue, poster task, and credentials."""
    settings: OperatorSettings
    event_queue: EventQueue
    task: asyncio.Task[None] | None
    vault: Vault

    async def settle(self) -> None:
        """Wait until all the events queued so far are posted or given up (bounded in time)."""
        await asyncio.wait_for(self.event_queue.join(), timeout=60)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None


@pytest.fixture()
def body() -> dict[str, Any]:
    return copy.deepcopy(BODY)


@pytest.fixture()
def settings() -> OperatorSettings:
    return OperatorSettings()


@pytest.fixture()
def server_url(k8s_emulator: 'KubernetesEmulator') -> str:
    return k8s_emulator.url


@pytest.fixture()
async def vault(server_url: str) -> AsyncIterator[Vault]:
    vault = Vault({VaultKey('main'): ConnectionInfo(server=server_url)})
    yield vault
    await vault.close()


@pytest.fixture()
async def make_operator(vault: Vault) -> AsyncIterator[Callable[..., Operator]]:
    """Create operators (with their posters started unless told otherwise); stop them all at the end."""
    operators: list[Operator] = []

    def factory(settings: OperatorSettings, *, started: bool = True, maxsize: int = 100) -> Operator:
        event_queue = EventQueue(settings=settings, maxsize=maxsize)
        task = asyncio.create_task(poster(event_queue=event_queue, vault=vault)) if started else None
        operator = Operator(settings=settings, event_queue=event_queue, task=task, vault=vault)
        operators.append(operator)
        return operator

    yield factory
    for operator in operators:
        await operator.stop()


@pytest.fixture()
async def operator(make_operator: Callable[..., Operator], settings: OperatorSettings) -> Operator:
    """The only operator of the test, in whose context the test runs (as its handlers do)."""
    operator = make_operator(settings)
    event_queue_var.set(operator.event_queue)
    await asyncio.sleep(0)  # let the poster start, as it does in the reactor before the handlers
    return operator
