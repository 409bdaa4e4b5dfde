"""
Fixtures for the emulator's own tests: an emulator in the test's event loop and a raw HTTP client.

The raw client deliberately knows nothing about Kubernetes: the tests state the exact URLs,
content types and bodies, and check the exact codes and Status objects that come back.
"""

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest

from kopf.testing.emulator import KubernetesEmulator

CRD_BODY: dict[str, Any] = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': 'kopfexamples.kopf.dev'},
    'spec': {
        'group': 'kopf.dev',
        'scope': 'Namespaced',
        'names': {
            'plural': 'kopfexamples',
            'singular': 'kopfexample',
            'kind': 'KopfExample',
            'shortNames': ['kex'],
            'categories': ['kopf'],
        },
        'versions': [
            {
                'name': 'v1',
                'served': True,
                'storage': True,
                'subresources': {'status': {}},
                'schema': {
                    'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}
                },
            },
            {
                'name': 'v1beta1',
                'served': True,
                'storage': False,
                'schema': {
                    'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}
                },
            },
        ],
    },
}


class Reply:
    """A response: the code, the decoded JSON body (if any), the headers."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str], raw: bytes) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.raw = raw

    def __repr__(self) -> str:
        return f'<Reply {self.status} {self.raw[:300]!r}>'


class RawApi:
    """A minimal HTTP client for the emulator: sends exactly what it is told to send."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str | None = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        all_headers = dict(headers or {})
        if body is not None:
            data = json.dumps(body).encode()
            content_type = content_type or 'application/json'
        if content_type is not None:
            all_headers['Content-Type'] = content_type
        # Without a content type, send none at all (aiohttp would add application/octet-stream).
        skipped = () if content_type is not None else ('Content-Type',)
        async with self.session.request(
            method, path, data=data, headers=all_headers, skip_auto_headers=skipped
        ) as response:
            raw = await response.read()
            try:
                decoded = json.loads(raw) if raw else None
            except ValueError:
                decoded = None
            return Reply(response.status, decoded, response.headers, raw)

    async def get(self, path: str, **kwargs: Any) -> Reply:
        return await self.request('GET', path, **kwargs)

    async def post(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return await self.request('POST', path, body, **kwargs)

    async def put(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return await self.request('PUT', path, body, **kwargs)

    async def patch(
        self,
        path: str,
        body: Any = None,
        *,
        content_type: str = 'application/merge-patch+json',
        **kwargs: Any,
    ) -> Reply:
        return await self.request('PATCH', path, body, content_type=content_type, **kwargs)

    async def delete(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return await self.request('DELETE', path, body, **kwargs)

    async def watch_events(self, path: str, *, until: str | None = None) -> list[dict[str, Any]]:
        """
        Read the events of a watch until the stream ends, or until an object named ``until`` shows up.

        The marker object lets tests see "all events so far" without waiting for a timeout:
        the events come in order, so everything before the marker's event has arrived.
        """
        events: list[dict[str, Any]] = []
        async with self.session.get(path) as response:
            assert response.status == 200, await response.text()
            async for line in response.content:
                if line.strip():
                    event = json.loads(line)
                    if until is not None and event['object'].get('metadata', {}).get('name') == until:
                        break
                    events.append(event)
        return events


@pytest.fixture
async def emulator() -> AsyncIterator[KubernetesEmulator]:
    async with KubernetesEmulator() as running:
        yield running


@pytest.fixture
async def api(emulator: KubernetesEmulator) -> AsyncIterator[RawApi]:
    async with aiohttp.ClientSession(emulator.url, timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield RawApi(session)


@pytest.fixture
async def crd(api: RawApi) -> dict[str, Any]:
    reply = await api.post('/apis/apiextensions.k8s.io/v1/customresourcedefinitions', CRD_BODY)
    assert reply.status == 201, reply
    assert isinstance(reply.body, dict)
    return reply.body
