"""
Admission end to end: operators with validating/mutating handlers and a webhook server, against the emulator.

The emulator calls the webhooks of the stored webhook configurations over TLS, verifying the server's
certificate with the configurations' ``caBundle``, as real apiservers do. The users' requests go
to the emulator via raw HTTP; the answers (codes, messages, ``Warning`` headers) are what users see.
The helpers are fixtures, since the test modules cannot import each other (importlib mode);
the user of the emulator (``cluster``) is shared with other areas: see ``tests/_cluster.py``.
"""
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import kopf
from kopf.testing.emulator import KubernetesEmulator

from .._cluster import CRD, CRDS, MANAGED, NAMESPACE, EmulatorUser


@pytest.fixture
async def cluster(emulator: KubernetesEmulator) -> AsyncIterator[EmulatorUser]:
    """The user of the emulator; the tests look at its answers: the denials are not errors here."""
    async with EmulatorUser(emulator, checked=False) as cluster:
        answer = await cluster.request('POST', CRDS, CRD)
        assert answer.status < 400, answer.body
        yield cluster


@pytest.fixture
def registry(make_registry: Callable[[], kopf.OperatorRegistry]) -> kopf.OperatorRegistry:
    return make_registry()


@pytest.fixture
def settings() -> kopf.OperatorSettings:
    """A local self-signed HTTPS server on a free port, with the managed configurations."""
    settings = kopf.OperatorSettings()
    settings.networking.error_backoffs = [0.05, 0.05, 0.05]
    settings.watching.reconnect_backoff = 0.01
    settings.queueing.exit_timeout = 2.0
    settings.process.ultimate_exiting_timeout = 5
    settings.posting.enabled = False
    settings.admission.server = kopf.WebhookServer(addr='127.0.0.1', port=0)
    settings.admission.managed = MANAGED
    return settings


OperatorFactory = Callable[..., contextlib.AbstractAsyncContextManager[asyncio.Task[None]]]


@pytest.fixture
def operator(cluster: EmulatorUser, eventually: Callable[..., Awaitable[Any]]) -> OperatorFactory:
    """
    Run an operator while in the context; wait until it is ready and its webhooks are configured.

    ``configured`` is the number of webhooks to wait for in the managed configurations (both together).
    The operator is stopped at the exit of the context, and its failures are re-raised.
    """

    @contextlib.asynccontextmanager
    async def run(registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, *,
                  configured: int | None = None, **kwargs: Any) -> AsyncIterator[asyncio.Task[None]]:
        stop_flag, ready_flag = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(kopf.operator(
            registry=registry, settings=settings, standalone=True, namespaces=[NAMESPACE],
            stop_flag=stop_flag, ready_flag=ready_flag, **kwargs))
        try:
            await asyncio.wait_for(ready_flag.wait(), timeout=5)
            expected = configured if configured is not None else len(registry.webhooks)
            if settings.admission.managed:
                await eventually(lambda: task.done() or len(cluster.webhook_names('validating')) +
                                 len(cluster.webhook_names('mutating')) == expected,
                                 message='The webhook configurations are not managed.')
            yield task
        finally:
            stop_flag.set()
            await asyncio.wait_for(task, timeout=10)

    return run


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
