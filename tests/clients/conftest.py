import dataclasses
from collections.abc import AsyncIterator

import kmock
import pytest

from kopf._clients.vault import Vault
from kopf._cogs.configs.networking import StandaloneClientSettings
from kopf._cogs.structs.credentials import ConnectionInfo, VaultKey

SECRET_TOKEN = 'sEcReT-tOkEn-123'


@pytest.fixture
def kmock_options(kmock_options: dict[str, object]) -> dict[str, object]:
    # A plain HTTP mock, not a Kubernetes emulator: every request must match a declared reaction,
    # and unmatched requests fail the test (instead of being served by the emulator's defaults).
    return dict(kmock_options, cls=kmock.RawHandler, strict=True)


@pytest.fixture
def server(kmock: kmock.RawHandler) -> str:
    return str(kmock.url).rstrip('/')


@pytest.fixture
def settings() -> StandaloneClientSettings:
    settings = StandaloneClientSettings()
    settings.networking.error_backoffs = [1, 2, 3]
    return settings


@pytest.fixture
def info(server: str) -> ConnectionInfo:
    return ConnectionInfo(server=server, token=SECRET_TOKEN)


@pytest.fixture
async def vault(info: ConnectionInfo) -> AsyncIterator[Vault]:
    vault = Vault({VaultKey('main'): info})
    yield vault
    await vault.close()


def with_token(info: ConnectionInfo, token: str, **kwargs: object) -> ConnectionInfo:
    return dataclasses.replace(info, token=token, **kwargs)  # type: ignore[arg-type]
