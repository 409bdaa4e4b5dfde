"""
The implicit owner inside a running handler: a real operator against the emulator.

``kopf.adopt(child)`` without ``owner=`` takes the object being handled; sync handlers run
in a thread with the context copied, async ones in the loop: both must see their own object.
"""
import asyncio
import json
import threading
import urllib.request
from typing import Any

import kopf
from kopf.testing import KubernetesEmulator

CRD = {
    'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
    'metadata': {'name': 'kopfexamples.kopf.dev'},
    'spec': {
        'group': 'kopf.dev', 'scope': 'Namespaced',
        'names': {'kind': 'KopfExample', 'plural': 'kopfexamples', 'singular': 'kopfexample'},
        'versions': [{'name': 'v1', 'served': True, 'storage': True, 'subresources': {'status': {}},
                      'schema': {'openAPIV3Schema': {'type': 'object',
                                                     'x-kubernetes-preserve-unknown-fields': True}}}],
    },
}


def post(emulator: KubernetesEmulator, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(emulator.url + path, data=json.dumps(body).encode(), method='POST',
                                     headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(request, timeout=10) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


async def test_adopt_takes_the_handled_object_as_the_owner(k8s_emulator: KubernetesEmulator) -> None:
    post(k8s_emulator, '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', CRD)
    registry = kopf.OperatorRegistry()
    children: dict[str, dict[str, Any]] = {}
    done = threading.Event()

    @kopf.on.create('kopfexamples', registry=registry)
    def sync_fn(name: str, **_: Any) -> None:
        child: dict[str, Any] = {'kind': 'ConfigMap'}
        kopf.adopt(child)  # no owner: the object of this handler
        children[f'sync-{name}'] = child

    @kopf.on.create('kopfexamples', registry=registry)
    async def async_fn(name: str, **_: Any) -> None:
        child: dict[str, Any] = {'kind': 'ConfigMap'}
        kopf.adopt(child)
        children[f'async-{name}'] = child
        if len(children) == 4:
            done.set()

    created = {
        name: post(k8s_emulator, '/apis/kopf.dev/v1/namespaces/default/kopfexamples',
                   {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
                    'metadata': {'name': name, 'labels': {'app': name}}})
        for name in ['kex-1', 'kex-2']
    }
    stop_flag = asyncio.Event()
    operator = asyncio.create_task(kopf.operator(
        registry=registry, standalone=True, namespaces=['default'], stop_flag=stop_flag))
    try:
        assert await asyncio.to_thread(done.wait, 20)
    finally:
        stop_flag.set()
        await asyncio.wait_for(operator, 20)

    for kind in ['sync', 'async']:
        for name, owner in created.items():
            child = children[f'{kind}-{name}']
            [reference] = child['metadata']['ownerReferences']
            assert reference['uid'] == owner['metadata']['uid']
            assert reference['name'] == name
            assert reference['kind'] == 'KopfExample'
            assert child['metadata']['namespace'] == 'default'
            assert child['metadata']['labels'] == {'app': name}
            assert child['metadata']['generateName'] == f'{name}-'
