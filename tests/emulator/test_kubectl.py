"""kubectl (as packaged in Debian's ``kubernetes-client``) works against the emulator unchanged."""

import asyncio
import json
import pathlib
import shutil
import subprocess
from typing import Any

import pytest
import yaml

KUBECTL = shutil.which('kubectl')
pytestmark = pytest.mark.skipif(KUBECTL is None, reason='kubectl is not installed')

CRD_YAML = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: kopfexamples.kopf.dev
spec:
  scope: Namespaced
  group: kopf.dev
  names:
    kind: KopfExample
    plural: kopfexamples
    singular: kopfexample
    shortNames: [kex]
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {status: {}}
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"""

OBJECT_YAML = """
apiVersion: kopf.dev/v1
kind: KopfExample
metadata:
  name: kex1
  labels: {app: demo}
spec:
  duration: 1m
  items: [a, b]
"""


class Kubectl:
    def __init__(self, kubeconfig: pathlib.Path, cache_dir: pathlib.Path, workdir: pathlib.Path) -> None:
        self.base = [
            str(KUBECTL),
            '--kubeconfig',
            str(kubeconfig),
            '--cache-dir',
            str(cache_dir),
            '--request-timeout',
            '30s',
        ]
        self.workdir = workdir

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=60)
        if check:
            assert result.returncode == 0, f'kubectl {" ".join(args)}:\n{result.stdout}\n{result.stderr}'
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, '-o', 'json').stdout)

    def apply(self, text: str) -> str:
        path = self.workdir / 'manifest.yaml'
        path.write_text(text)
        return self('apply', '-f', str(path)).stdout.strip()


@pytest.fixture
def kubectl(k8s_emulator, tmp_path: pathlib.Path) -> Kubectl:
    return Kubectl(k8s_emulator.kubeconfig_path, tmp_path / 'cache', tmp_path)


def test_apply_crd_then_custom_object(kubectl) -> None:
    assert (
        kubectl.apply(CRD_YAML)
        == 'customresourcedefinition.apiextensions.k8s.io/kopfexamples.kopf.dev created'
    )
    assert kubectl.apply(OBJECT_YAML) == 'kopfexample.kopf.dev/kex1 created'
    assert kubectl.apply(OBJECT_YAML) == 'kopfexample.kopf.dev/kex1 unchanged'
    assert kubectl.apply(OBJECT_YAML.replace('1m', '2m')) == 'kopfexample.kopf.dev/kex1 configured'

    obj = kubectl.json('get', 'kex', 'kex1')
    assert obj['spec'] == {'duration': '2m', 'items': ['a', 'b']}
    assert obj['metadata']['generation'] == 2
    assert 'kubectl.kubernetes.io/last-applied-configuration' in obj['metadata']['annotations']

    listed = kubectl.json('get', 'kopfexamples.kopf.dev', '-l', 'app=demo', '--all-namespaces')
    assert [item['metadata']['name'] for item in listed['items']] == ['kex1']
    assert 'kex1' in kubectl('get', 'kex').stdout


def test_apply_removes_fields_dropped_from_the_manifest(kubectl) -> None:
    kubectl.apply(CRD_YAML)
    kubectl.apply(OBJECT_YAML)
    kubectl.apply(OBJECT_YAML.replace('  items: [a, b]\n', ''))
    assert kubectl.json('get', 'kex', 'kex1')['spec'] == {'duration': '1m'}


def test_apply_builtin_objects(kubectl) -> None:
    manifest = yaml.safe_dump(
        {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1'}, 'data': {'a': 'b', 'c': 'd'}}
    )
    assert kubectl.apply(manifest) == 'configmap/cm1 created'
    assert kubectl.apply(manifest) == 'configmap/cm1 unchanged'
    changed = yaml.safe_dump(
        {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1'}, 'data': {'a': 'x'}}
    )
    assert kubectl.apply(changed) == 'configmap/cm1 configured'
    assert kubectl.json('get', 'configmap', 'cm1')['data'] == {'a': 'x'}


def test_patch_in_all_flavours(kubectl) -> None:
    kubectl.apply(CRD_YAML)
    kubectl.apply(OBJECT_YAML)
    kubectl('patch', 'kex', 'kex1', '--type=merge', '-p', '{"spec": {"duration": "5m"}}')
    kubectl('patch', 'kex', 'kex1', '--type=json', '-p', '[{"op": "add", "path": "/spec/new", "value": 1}]')
    kubectl('patch', 'kex', 'kex1', '--subresource=status', '--type=merge', '-p', '{"status": {"ok": true}}')
    obj = kubectl.json('get', 'kex', 'kex1')
    assert obj['spec'] == {'duration': '5m', 'items': ['a', 'b'], 'new': 1}
    assert obj['status'] == {'ok': True}

    failed = kubectl(
        'patch',
        'kex',
        'kex1',
        '--type=json',
        '-p',
        '[{"op": "test", "path": "/spec/duration", "value": "nope"}]',
        check=False,
    )
    assert failed.returncode != 0
    strategic = kubectl('patch', 'kex', 'kex1', '-p', '{"spec": {}}', check=False)
    assert strategic.returncode != 0
    assert 'strategic-merge-patch' in strategic.stderr

    kubectl.apply(yaml.safe_dump({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1'}}))
    kubectl('patch', 'configmap', 'cm1', '-p', '{"data": {"k": "v"}}')  # strategic by default
    assert kubectl.json('get', 'configmap', 'cm1')['data'] == {'k': 'v'}


def test_delete(kubectl, k8s_emulator) -> None:
    kubectl.apply(CRD_YAML)
    kubectl.apply(OBJECT_YAML)
    assert kubectl('delete', 'kex', 'kex1').stdout.strip() == 'kopfexample.kopf.dev "kex1" deleted'
    assert kubectl('get', 'kex', 'kex1', check=False).returncode != 0
    assert k8s_emulator.get_object('kopfexamples.kopf.dev', 'kex1', namespace='default') is None

    kubectl('delete', 'crd', 'kopfexamples.kopf.dev')
    missing = kubectl('get', 'kex', check=False)
    assert missing.returncode != 0


async def test_get_watch(kubectl) -> None:
    kubectl.apply(
        yaml.safe_dump(
            {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1'}, 'data': {'a': 'b'}}
        )
    )
    template = 'jsonpath={.type} {.object.metadata.name} {.object.data.a}{"\\n"}'
    process = await asyncio.create_subprocess_exec(
        *kubectl.base,
        'get',
        'configmaps',
        '--watch',
        '--output-watch-events',
        '-o',
        template,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None

        async def next_line() -> str:
            return (await asyncio.wait_for(process.stdout.readline(), timeout=30)).decode().strip()

        assert await next_line() == 'ADDED cm1 b'
        # The changes are made by other kubectl processes, without blocking this event loop.
        patcher = await asyncio.create_subprocess_exec(
            *kubectl.base,
            'patch',
            'configmap',
            'cm1',
            '--type=merge',
            '-p',
            '{"data": {"a": "c"}}',
            stdout=asyncio.subprocess.DEVNULL,
        )
        assert await patcher.wait() == 0
        assert await next_line() == 'MODIFIED cm1 c'
        deleter = await asyncio.create_subprocess_exec(
            *kubectl.base, 'delete', 'configmap', 'cm1', stdout=asyncio.subprocess.DEVNULL
        )
        assert await next_line() == 'DELETED cm1 c'
        assert await deleter.wait() == 0
    finally:
        process.kill()
        await process.wait()


def test_discovery_commands(kubectl) -> None:
    kubectl.apply(CRD_YAML)
    resources = kubectl('api-resources').stdout
    assert 'kopfexamples' in resources and 'configmaps' in resources
    versions = kubectl('api-versions').stdout.split()
    assert 'kopf.dev/v1' in versions and 'v1' in versions
    assert kubectl('version', '-o', 'json').returncode == 0


def test_the_peering_examples_commands_work_on_their_first_run(tmp_path: pathlib.Path) -> None:
    # The README's kubectl lines, as a user copies them, against a fresh API server (no CRDs yet).
    from kopf.testing import KubernetesEmulator

    repo = pathlib.Path(__file__).resolve().parents[2]
    readme = (repo / 'examples' / '15-peering' / 'README.md').read_text()
    section = readme.split('**Kopf-compatible peering**')[1].split('kopf run')[0]
    commands = [line.strip().split() for line in section.splitlines() if line.strip().startswith('kubectl ')]
    assert len(commands) >= 2
    with KubernetesEmulator(kubeconfig_path=tmp_path / 'kubeconfig') as emulator:
        for command in commands:
            result = subprocess.run([str(KUBECTL), '--kubeconfig', str(emulator.kubeconfig_path),
                                     '--cache-dir', str(tmp_path / 'cache'), *command[1:]],
                                    cwd=repo, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, f'{" ".join(command)}: {result.stderr}'
        assert emulator.get_object('kopfpeerings.kopf.dev', 'example', namespace='default') is not None
        assert emulator.get_object('clusterkopfpeerings.kopf.dev', 'example') is not None
