"""
One peering, two implementations: a replica of the original Kopf 1.45.2 and a replica of ours obey each other.

A developer's tool, not run in CI: it needs Kopf installed in a separate virtualenv (as ``capture_kopf.py``).
It starts our Kubernetes API emulator (in this process), creates the peering CRDs (``peering.yaml``), the
``default`` KopfPeering and the example CRD, and runs both operators as black boxes (``kopf run``
subprocesses, each printing ``HANDLED <name> BY <who>`` from its creation handler). Then, step by step:

1. Kopf with priority 10, ours with 20: ours handles the new objects; Kopf pauses in favour of ours.
2. Ours exits gracefully: Kopf resumes at once (our record is removed) and handles the new objects.
3. Ours starts again with priority 5: it pauses in favour of Kopf; Kopf keeps handling.
4. ``kopf freeze`` of Kopf's CLI (priority 100): both pause; ``kopf resume`` of ours: Kopf handles again.

Every object must be handled exactly once overall, by the expected operator. Exits with 1 on any mismatch.

Usage (from the repository root)::

    .venv/bin/python tools/compat/peering_with_kopf.py [--kopf-venv /tmp/kopf-venv]
"""
import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from typing import Any

import yaml

from kopf.testing import Cluster, eventually
from kopf.testing.emulator import KubernetesEmulator

REPO = pathlib.Path(__file__).resolve().parents[2]
NAMESPACE = 'default'
PEERING_PATH = f'/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings'
KEX_PATH = f'/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfexamples'

OPERATOR = '''
import os
import kopf

@kopf.on.startup()
def configure(settings, **_):
    settings.peering.lifetime = 10
    settings.posting.enabled = False

@kopf.on.create('kopfexamples')
def created(name, **_):
    print(f'HANDLED {name} BY {os.environ["WHO"]}', flush=True)
'''


def peers(cluster: Cluster) -> dict[str, Any]:
    body = cluster.get(f'{PEERING_PATH}/default') or {}
    return dict(body.get('status') or {})


class Operator:
    """``kopf run`` of one implementation as a subprocess; its output is collected in a file."""

    def __init__(self, who: str, kopf: list[str], priority: int, source: pathlib.Path, env: dict[str, str],
                 workdir: pathlib.Path) -> None:
        self.who = who
        self.output = workdir / f'{who}.log'
        with open(self.output, 'a') as stdout:
            self.process = subprocess.Popen(
                [*kopf, 'run', '--verbose', '-n', NAMESPACE, '--priority', str(priority), str(source)],
                env=dict(env, WHO=who), stdout=stdout, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.output.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)


def wait_for(condition: Callable[[], bool], what: str, within: float = 20) -> None:
    eventually(condition, within=within, interval=0.05, message=f'Timed out waiting for: {what}')


def handled(*operators: Operator) -> list[tuple[str, str]]:
    pairs = []
    for operator in operators:
        pairs.extend(re.findall(r'^HANDLED (\S+) BY (\S+)$', operator.log(), flags=re.MULTILINE))
    return pairs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--kopf-venv', default=os.environ.get('KOPF_VENV', '/tmp/kopf-venv'),
                        help='the virtualenv with kopf==1.45.2 installed (default: %(default)s)')
    args = parser.parse_args()
    theirs = [str(pathlib.Path(args.kopf_venv) / 'bin' / 'kopf')]
    ours = [sys.executable, '-m', 'kopf']
    if not pathlib.Path(theirs[0]).exists():
        print(f'Kopf is not found in {args.kopf_venv}: python -m venv {args.kopf_venv} && '
              f'{args.kopf_venv}/bin/pip install kopf==1.45.2', file=sys.stderr)
        return 2

    failures: list[str] = []

    def check(condition: bool, message: str) -> None:
        print(('ok    ' if condition else 'FAIL  ') + message)
        if not condition:
            failures.append(message)

    with tempfile.TemporaryDirectory() as tmp, KubernetesEmulator() as emulator:
        workdir = pathlib.Path(tmp)
        source = workdir / 'operator.py'
        source.write_text(textwrap.dedent(OPERATOR))
        env = dict(os.environ, KUBECONFIG=str(emulator.kubeconfig_path))
        cluster = Cluster(emulator.kubeconfig_path)
        for doc in yaml.safe_load_all((REPO / 'peering.yaml').read_text()):
            if doc:
                cluster.create('/apis/apiextensions.k8s.io/v1/customresourcedefinitions', doc)
        crd = yaml.safe_load((REPO / 'examples' / 'crd.yaml').read_text())
        cluster.create('/apis/apiextensions.k8s.io/v1/customresourcedefinitions', crd)
        cluster.create(PEERING_PATH, {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfPeering',
                                      'metadata': {'name': 'default', 'namespace': NAMESPACE}})

        def create(name: str) -> None:
            cluster.create(KEX_PATH, {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
                                      'metadata': {'name': name}, 'spec': {}})

        kopf_replica = Operator('kopf', theirs, 10, source, env, workdir)
        our_replica = Operator('ours', ours, 20, source, env, workdir)
        operators = [kopf_replica, our_replica]
        try:
            print('1. Kopf with priority 10, ours with priority 20 in one peering.')
            wait_for(lambda: len(peers(cluster)) == 2, 'both replicas in the peering')
            wait_for(lambda: 'Pausing operations in favour of' in kopf_replica.log(), 'Kopf pausing')
            create('kex1')
            wait_for(lambda: ('kex1', 'ours') in handled(*operators), 'kex1 handled by ours')
            check(handled(*operators) == [('kex1', 'ours')],
                  'ours (the higher priority) handles; Kopf pauses')

            print('2. Ours exits gracefully: Kopf resumes at once.')
            our_replica.stop()
            check(len(peers(cluster)) == 1, 'ours has removed its record on exit')
            wait_for(lambda: 'Resuming operations after the pause' in kopf_replica.log(), 'Kopf resuming',
                     within=5)
            create('kex2')
            wait_for(lambda: ('kex2', 'kopf') in handled(*operators), 'kex2 handled by Kopf')
            check(sorted(handled(*operators)) == [('kex1', 'ours'), ('kex2', 'kopf')],
                  'Kopf handles the new object, and not the old one again')

            print('3. Ours starts again with priority 5: it pauses in favour of Kopf.')
            our_replica = Operator('ours', ours, 5, source, env, workdir)
            operators = [kopf_replica, our_replica]
            wait_for(lambda: 'Pausing operations in favour of [<Peer ' in our_replica.log(), 'ours pausing')
            create('kex3')
            wait_for(lambda: ('kex3', 'kopf') in handled(*operators), 'kex3 handled by Kopf')
            check(sorted(handled(*operators)) == [('kex1', 'ours'), ('kex2', 'kopf'), ('kex3', 'kopf')],
                  'Kopf (the higher priority) handles; ours pauses')

            print("4. Kopf's kopf freeze pauses both; our kopf resume resumes them.")
            freeze = ['freeze', '-n', NAMESPACE, '-P', 'default', '-p', '100', '-t', '60',
                      '-i', 'admin@console']
            result = subprocess.run([*theirs, *freeze], env=env, capture_output=True, text=True)
            check(result.returncode == 0, "Kopf's freeze has succeeded")
            wait_for(lambda: our_replica.log().count('Pausing operations in favour of') >= 2
                     and kopf_replica.log().count('Pausing operations in favour of') >= 2, 'both pausing')
            create('kex4')
            time.sleep(2)  # a negative check: nobody must handle it while frozen
            check(('kex4', 'kopf') not in handled(*operators) and ('kex4', 'ours') not in handled(*operators),
                  'nobody handles while frozen')
            resume = ['resume', '-n', NAMESPACE, '-P', 'default', '-i', 'admin@console']
            result = subprocess.run([*ours, *resume], env=env, capture_output=True, text=True)
            check(result.returncode == 0, 'our resume has succeeded')
            wait_for(lambda: ('kex4', 'kopf') in handled(*operators), 'kex4 handled by Kopf')
            final = sorted(handled(*operators))
            check(final == [('kex1', 'ours'), ('kex2', 'kopf'), ('kex3', 'kopf'), ('kex4', 'kopf')],
                  f'every object is handled exactly once overall: {final}')
        finally:
            for operator in operators:
                operator.stop()
        check(peers(cluster) == {}, 'both have removed their records on exit')

    print(f'\n{"FAILED" if failures else "PASSED"}: one Kopf 1.45.2 replica and one of ours share a peering.')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
