"""Every public name of Kopf 1.45.2 (shared/kopf-api-surface.txt) is there, or explains why not yet."""
import pathlib
import re

import pytest

import kopf

SURFACE = pathlib.Path(__file__).resolve().parents[3] / 'shared' / 'kopf-api-surface.txt'
NOT_YET: set[str] = set()  # every name is there


def _surface_names() -> list[str]:
    if not SURFACE.exists():
        return []
    names = {match.group(1) for line in SURFACE.read_text().splitlines()
             if (match := re.match(r'^kopf\.([A-Za-z_]\w*)\b', line))}
    return sorted(names - NOT_YET)


@pytest.mark.skipif(not SURFACE.exists(), reason='the shared API surface is not next to the repository')
@pytest.mark.parametrize('name', _surface_names())
def test_public_name_is_there_or_explains_itself(name: str) -> None:
    try:
        getattr(kopf, name)
    except ImportError as e:  # the upper distributions' names that are not implemented yet
        assert 'not available yet' in str(e) or 'is provided by the' in str(e)


def test_testing_is_reachable_as_an_attribute() -> None:
    assert kopf.testing.KopfRunner.__name__ == 'KopfRunner'


def test_star_import_brings_the_webhook_servers_and_tunnels() -> None:
    namespace: dict[str, object] = {}
    exec('from kopf import *', namespace)
    for name in ['WebhookServer', 'WebhookK3dServer', 'WebhookMinikubeServer', 'WebhookDockerDesktopServer',
                 'WebhookAutoServer', 'WebhookNgrokTunnel', 'WebhookAutoTunnel', 'AiohttpSession']:
        assert name in namespace, name
