"""
Try an example operator without a cluster: the built-in Kubernetes API emulator plays the cluster.

    python examples/try.py [examples/01-minimal/example.py]

It starts the emulator (from kopf-testing), applies examples/crd.yaml, runs the operator in a
background thread, then drives the sample object (examples/obj.yaml) through its life:
creation, a change of its spec, deletion. The operator's log shows the handlers firing.
When the object is gone, the operator is stopped and the script exits.
"""
import json
import logging
import os
import pathlib
import runpy
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import yaml

import kopf
from kopf.testing import KubernetesEmulator

EXAMPLES = pathlib.Path(__file__).resolve().parent
OBJECTS = '/apis/kopf.dev/v1/namespaces/default/kopfexamples'


def say(text: str) -> None:
    print(f'\n==> {text}', flush=True)


def call(emulator: KubernetesEmulator, method: str, path: str, body: Any = None,
         content_type: str = 'application/json') -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(emulator.url + path, data=data, method=method,
                                     headers={'Content-Type': content_type})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


def wait_for(what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f'Gave up waiting for {what}.')
        time.sleep(0.1)


def main() -> None:
    default_file = EXAMPLES / '01-minimal' / 'example.py'
    operator_file = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else default_file
    if not operator_file.is_file():
        known = sorted(str(path.relative_to(EXAMPLES.parent)) for path in EXAMPLES.glob('*/example.py'))
        sys.exit(f'examples/try.py: there is no operator file {str(operator_file)!r}; '
                 f'try one of: {", ".join(known)}')
    kopf.configure(verbose=False, log_format=kopf.LogFormat.PLAIN, log_prefix=True)
    logging.getLogger('aiohttp.access').setLevel(logging.WARNING)

    with KubernetesEmulator() as emulator:
        say(f'The Kubernetes API emulator serves at {emulator.url}')
        os.environ['KUBECONFIG'] = str(emulator.kubeconfig_path)  # the operator logs in with it
        call(emulator, 'POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions',
             yaml.safe_load((EXAMPLES / 'crd.yaml').read_text()))

        say(f'Starting the operator from {operator_file}')
        try:
            runpy.run_path(str(operator_file))
        except Exception as e:  # the user's file: one line, not the loading machinery's traceback
            sys.exit(f'examples/try.py: the operator file {str(operator_file)!r} cannot be loaded: '
                     f'{type(e).__name__}: {e}')
        stop_flag, ready_flag = threading.Event(), threading.Event()
        thread = threading.Thread(target=kopf.run, name='operator', kwargs={
            'standalone': True, 'namespaces': ['default'], 'settings': kopf.OperatorSettings(),
            'stop_flag': stop_flag, 'ready_flag': ready_flag,
        })
        thread.start()
        try:
            if not ready_flag.wait(30):
                raise TimeoutError('The operator did not get ready in 30 seconds.')
            if kopf.get_default_registry().webhooks:  # the admission webhooks must be in place first
                wait_for('the webhook configurations', lambda: _has_webhooks(emulator))

            say('Creating the object kopf-example-1 (examples/obj.yaml)')
            call(emulator, 'POST', OBJECTS, yaml.safe_load((EXAMPLES / 'obj.yaml').read_text()))
            wait_for('the creation to be handled', lambda: _is_handled(emulator, 'value'))

            say('Changing its spec.field to "changed"')
            call(emulator, 'PATCH', f'{OBJECTS}/kopf-example-1', {'spec': {'field': 'changed'}},
                 content_type='application/merge-patch+json')
            wait_for('the change to be handled', lambda: _is_handled(emulator, 'changed'))

            say('Deleting the object')
            call(emulator, 'DELETE', f'{OBJECTS}/kopf-example-1')
            wait_for('the deletion to be handled', lambda: _get(emulator) is None)
            say('The object is gone. Stopping the operator.')
        finally:
            stop_flag.set()
            thread.join(timeout=30)
    say('Done. Next: read examples/01-minimal/example.py, then try the other examples.')


def _get(emulator: KubernetesEmulator) -> dict[str, Any] | None:
    return emulator.get_object('kopfexamples.kopf.dev', 'kopf-example-1', namespace='default')


def _has_webhooks(emulator: KubernetesEmulator) -> bool:
    kinds = ['validatingwebhookconfigurations', 'mutatingwebhookconfigurations']
    return any(configuration.get('webhooks')
               for kind in kinds
               for configuration in emulator.list_objects(f'{kind}.admissionregistration.k8s.io'))


def _is_handled(emulator: KubernetesEmulator, field_value: str) -> bool:
    """
    Handled: the last-handled state (the diff-base) has the expected value of spec.field;
    or, for the operators without change handlers (e.g. timers only), a result in the status has it.
    """
    body = _get(emulator) or {}
    annotations = body.get('metadata', {}).get('annotations', {})
    diffbase = annotations.get('kopf.zalando.org/last-handled-configuration')
    if diffbase is not None:
        return bool(json.loads(diffbase).get('spec', {}).get('field') == field_value)
    results = body.get('status', {}).values()
    return any(isinstance(result, dict) and result.get('field') == field_value for result in results)


if __name__ == '__main__':
    main()
