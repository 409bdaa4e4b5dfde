"""
The usage shown in the docs ("Operator testing"): the example operator with KopfRunner,
an object created and deleted while it runs; but against the emulator instead of a cluster,
and waiting for the effects instead of sleeping.
"""
import importlib.util
import json
import pathlib
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import KopfRunner, KubernetesEmulator

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / 'examples'
OBJECTS = '/apis/kopf.dev/v1/namespaces/default/kopfexamples'

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec('kopf._core.reactor.processing') is None,
    reason='the create/update/delete handling is not implemented yet (kopf._core.reactor.processing)',
)


def call(emulator: KubernetesEmulator, method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        emulator.url + path, method=method, headers={'Content-Type': 'application/json'},
        data=json.dumps(body).encode() if body is not None else None,
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_example_operator_with_the_emulator(
        k8s_emulator: KubernetesEmulator, registry: OperatorRegistry, wait_for: Callable[..., Any],
) -> None:
    call(k8s_emulator, 'POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions',
         yaml.safe_load((EXAMPLES / 'crd.yaml').read_text()))
    args = ['run', '-A', '--verbose', str(EXAMPLES / '01-minimal' / 'example.py')]
    def get_example() -> dict[str, Any] | None:
        return k8s_emulator.get_object('kopfexamples.kopf.dev', 'kopf-example-1', namespace='default')

    with KopfRunner(args, registry=registry, emulator=k8s_emulator) as runner:
        call(k8s_emulator, 'POST', OBJECTS, yaml.safe_load((EXAMPLES / 'obj.yaml').read_text()))
        wait_for(lambda: bool((get_example() or {}).get('status', {}).get('create_fn')))
        call(k8s_emulator, 'DELETE', f'{OBJECTS}/kopf-example-1')
        wait_for(lambda: get_example() is None)
    assert runner.exit_code == 0
    assert runner.exception is None
    assert "A KopfExample 'kopf-example-1' is created with spec:" in runner.output
    assert "A KopfExample 'kopf-example-1' is being deleted: cleaning up." in runner.output
