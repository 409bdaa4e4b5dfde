"""
The tunnels and the auto-detecting servers.

ngrok itself is never started: pyngrok's API (``ngrok.connect``/``ngrok.disconnect``, which would launch
and talk to the ngrok process) is replaced by a stand-in that records the tunnels and hands out public URLs.
The local cluster is "detected" from a kubeconfig made by the test (as K3d/Minikube/Docker Desktop make them).
"""
import asyncio
import dataclasses
import json
import pathlib
import sys
from typing import Any

import aiohttp
import pytest

import kopf


@dataclasses.dataclass
class FakeTunnel:
    public_url: str
    addr: str


class FakeNgrok:
    """A stand-in for the ngrok process behind pyngrok's API: tunnels are "opened" and "closed" only."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, Any, Any]] = []
        self.closed: list[str] = []

    def connect(self, addr: str | None = None, proto: Any = None, name: Any = None,
                pyngrok_config: Any = None, **options: Any) -> FakeTunnel:
        self.opened.append((str(addr), proto, pyngrok_config))
        return FakeTunnel(public_url=f'https://tunnel-{len(self.opened)}.ngrok.example', addr=str(addr))

    def disconnect(self, public_url: str, pyngrok_config: Any = None) -> None:
        self.closed.append(public_url)


@pytest.fixture
def fake_ngrok(monkeypatch: pytest.MonkeyPatch) -> FakeNgrok:
    from pyngrok import ngrok
    fake = FakeNgrok()
    monkeypatch.setattr(ngrok, 'connect', fake.connect)
    monkeypatch.setattr(ngrok, 'disconnect', fake.disconnect)
    return fake


async def echo(request: Any, *, webhook: Any = None, headers: Any = None, sslpeer: Any = None) -> Any:
    return {'webhook': webhook, 'request': request}


async def test_ngrok_tunnel_exposes_a_local_http_server(fake_ngrok: FakeNgrok) -> None:
    tunnel = kopf.WebhookNgrokTunnel(addr='127.0.0.1', port=0, path='/hooks', token='tkn', region='eu',
                                     binary='/opt/ngrok')
    async with tunnel:
        config = await asyncio.wait_for(tunnel(echo).__anext__(), timeout=5)
        [(local_addr, proto, pyngrok_config)] = fake_ngrok.opened
        # What ngrok would forward to: the local server, plain HTTP, the full path.
        url = f'http://{local_addr}/hooks/fn'
        data = json.dumps({'x': 1})
        async with aiohttp.ClientSession() as session, session.post(url, data=data) as response:
            answer = await response.json()
        assert fake_ngrok.closed == []

    assert config == {'url': 'https://tunnel-1.ngrok.example/hooks'}
    assert proto == 'http'
    assert local_addr.startswith('127.0.0.1:')
    assert pyngrok_config.auth_token == 'tkn'
    assert pyngrok_config.region == 'eu'
    assert pyngrok_config.ngrok_path == '/opt/ngrok'
    assert answer == {'webhook': 'fn', 'request': {'x': 1}}
    assert fake_ngrok.closed == ['https://tunnel-1.ngrok.example']


async def test_ngrok_tunnel_without_pyngrok_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, 'pyngrok', None)
    tunnel = kopf.WebhookNgrokTunnel(port=0)
    with pytest.raises(ImportError, match=r'pip install kopf-webhooks\[ngrok\]'):
        await tunnel(echo).__anext__()


async def test_ngrok_tunnel_in_an_operator(registry, settings, operator, cluster, fake_ngrok) -> None:
    @kopf.on.validate('kopfexamples', registry=registry)
    def check(**_: Any) -> None:
        pass

    settings.admission.server = kopf.WebhookNgrokTunnel(addr='127.0.0.1', port=0)
    async with operator(registry, settings):
        webhook = (cluster.configuration('validating') or {})['webhooks'][0]
    assert webhook['clientConfig'] == {'url': 'https://tunnel-1.ngrok.example/check'}
    assert fake_ngrok.closed == ['https://tunnel-1.ngrok.example']


def write_kubeconfig(path: pathlib.Path, context: str, cluster: str) -> None:
    path.write_text(json.dumps({  # JSON is YAML too
        'apiVersion': 'v1', 'kind': 'Config', 'current-context': context,
        'contexts': [{'name': context, 'context': {'cluster': cluster, 'user': 'u'}}],
        'clusters': [{'name': cluster, 'cluster': {'server': 'https://127.0.0.1:6443'}}],
        'users': [{'name': 'u', 'user': {}}],
    }))


@pytest.mark.parametrize('context, cluster_name, host', [
    ('k3d-mycluster', 'k3d-mycluster', 'host.k3d.internal'),
    ('minikube', 'minikube', 'host.minikube.internal'),
    ('docker-desktop', 'docker-desktop', 'host.docker.internal'),
])
async def test_auto_server_and_tunnel_detect_local_clusters(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fake_ngrok: FakeNgrok,
        context: str, cluster_name: str, host: str,
) -> None:
    write_kubeconfig(tmp_path / 'config', context, cluster_name)
    monkeypatch.setenv('KUBECONFIG', str(tmp_path / 'config'))

    server = kopf.WebhookAutoServer(port=0)
    async with server:
        server_config = await asyncio.wait_for(server(echo).__anext__(), timeout=5)
    tunnel = kopf.WebhookAutoTunnel(port=0)
    async with tunnel:
        tunnel_config = await asyncio.wait_for(tunnel(echo).__anext__(), timeout=5)

    assert server_config['url'].startswith(f'https://{host}:')
    assert tunnel_config['url'].startswith(f'https://{host}:')
    assert fake_ngrok.opened == []


async def test_auto_server_and_tunnel_in_unknown_clusters(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fake_ngrok: FakeNgrok,
) -> None:
    write_kubeconfig(tmp_path / 'config', 'production', 'eks-cluster')
    monkeypatch.setenv('KUBECONFIG', str(tmp_path / 'config'))

    server = kopf.WebhookAutoServer(addr='127.0.0.1', port=0)
    async with server:
        server_config = await asyncio.wait_for(server(echo).__anext__(), timeout=5)
    tunnel = kopf.WebhookAutoTunnel(addr='127.0.0.1', port=0)
    async with tunnel:
        tunnel_config = await asyncio.wait_for(tunnel(echo).__anext__(), timeout=5)

    assert server_config['url'].startswith('https://127.0.0.1:')
    assert tunnel_config == {'url': 'https://tunnel-1.ngrok.example'}
    assert fake_ngrok.closed == ['https://tunnel-1.ngrok.example']
