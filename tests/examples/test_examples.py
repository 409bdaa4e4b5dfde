"""
The examples, end to end: every example operator runs as ``kopf run`` (via ``KopfRunner``) against
an API server (the ``k8s_api`` switch: the emulator by default, the real control plane in tox's
``realapi`` env), and its sample object goes through its whole life: creation, a change of its spec,
deletion. At every stage, the test waits until the example's effects are visible (in the object, its
children, its events), or fails with the last unmet assertion if they never are. After the operator
exits, its output is checked for the documented log lines.

Every test has a namespace of its own (a real server is shared by the session's tests); the expected
log lines are written for the namespace "default" and are checked for the test's namespace. The checks
that need the garbage collector are skipped where there is none (the control plane has no
kube-controller-manager, as with envtest).

Every example is a class below: how to create & change its object, and what to expect after that.
The embedding example is run by its own ``main()`` instead of ``kopf run``.
"""
import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import pathlib
import runpy
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, ClassVar, TypeVar

import pytest
import yaml

import kopf
from kopf.testing import ApiError, KopfRunner, eventually, eventually_async
from kopf.testing import Cluster as ApiUser
from kopf.testing.plugin import KubeAPI

pytestmark = pytest.mark.kube_api

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / 'examples'
CRDS = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions'
NAME = 'kopf-example-1'  # of the sample objects
DIFFBASE = 'kopf.zalando.org/last-handled-configuration'
DEFAULT_FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'
DELETION_NOTICE = 'Deleted, really deleted, and we are notified.'
WAIT_TIMEOUT = 20.0  # only reached when something is wrong: a real server on a busy machine is slower
ROOT_CA_CONFIGMAP = 'kube-root-ca.crt'  # put into every namespace by a cluster's controller-manager

_T = TypeVar('_T')


class Cluster:
    """The API server as the test sees it, in the test's namespace: requests as any client makes them."""

    def __init__(self, api: KubeAPI, namespace: str) -> None:
        self.user = ApiUser(api.kubeconfig_path, timeout=WAIT_TIMEOUT)
        self.namespace = namespace
        self.collects_garbage = api.collects_garbage

    def path(self, plural: str, name: str | None = None) -> str:
        """The API path of the namespace's objects (KopfExamples, or core ones) or of one of them."""
        base = '/apis/kopf.dev/v1' if plural == 'kopfexamples' else '/api/v1'
        return f'{base}/namespaces/{self.namespace}/{plural}' + (f'/{name}' if name else '')

    def get(self, plural: str, name: str = NAME) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.user.get(self.path(plural, name))
        return result

    def kopfexample(self) -> dict[str, Any]:
        return self.get('kopfexamples') or {}

    def status(self) -> dict[str, Any]:
        """The sample KopfExample's status (empty if none, or if there is no such object)."""
        return dict(self.kopfexample().get('status', {}))

    def configmaps(self) -> list[dict[str, Any]]:
        return [obj for obj in self.user.items(self.path('configmaps'))
                if obj['metadata']['name'] != ROOT_CA_CONFIGMAP]

    def pods(self) -> list[dict[str, Any]]:
        return self.user.items(self.path('pods'))

    def events(self) -> list[tuple[str, str, str]]:
        """The events about the sample object: (type, reason, message) in the order of their times."""
        # Posted concurrently by the poster's workers: their times keep the messages' order, not the versions.
        events = [event for event in self.user.items(self.path('events'))
                  if event['involvedObject'].get('name') == NAME]
        events.sort(key=lambda event: (event.get('eventTime') or '',  # the same microsecond: the versions
                                       int(event['metadata']['resourceVersion'])))
        return [(event['type'], event['reason'], event['message']) for event in events]

    def sample(self, path: pathlib.Path, name: str = NAME) -> dict[str, Any]:
        """A sample object from a file, for the test's namespace."""
        body: dict[str, Any] = yaml.safe_load(path.read_text())
        body['metadata'].update(name=name, namespace=self.namespace)
        return body


def handled(obj: dict[str, Any] | None, *path: str) -> Any:
    """The value of a field as of the last handling (in the diff-base), or None if not handled yet."""
    annotations = (obj or {}).get('metadata', {}).get('annotations', {})
    value: Any = json.loads(annotations[DIFFBASE]) if DIFFBASE in annotations else None
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def the_only(objs: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(objs) == 1
    return objs[0]


def owner_reference_to(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        'apiVersion': owner['apiVersion'],
        'kind': owner['kind'],
        'name': owner['metadata']['name'],
        'uid': owner['metadata']['uid'],
        'controller': True,
        'blockOwnerDeletion': True,
    }


#
# The examples' scenarios.
#

class Example:
    """An example with the sample KopfExample (examples/obj.yaml): its defaults and expectations."""
    name: ClassVar[str]
    crd: ClassVar[bool] = True  # whether the example needs the KopfExample's CRD
    plural: ClassVar[str] = 'kopfexamples'
    sample: ClassVar[pathlib.Path] = EXAMPLES / 'obj.yaml'
    change: ClassVar[dict[str, Any]] = {'spec': {'field': 'changed'}}
    restarts: ClassVar[bool] = False  # whether to restart the operator after the creation
    logs: ClassVar[tuple[str, ...]] = ()  # the lines expected in the output, besides the common ones
    tracebacks: ClassVar[int] = 0
    change_handlers: ClassVar[bool] = True  # whether it has change handlers (and so their debug messages)
    env: ClassVar[dict[str, str]] = {}  # the environment variables for the operator

    def __repr__(self) -> str:
        return self.name

    def get(self, cluster: Cluster) -> dict[str, Any] | None:
        return cluster.get(self.plural)

    def before_creation(self, cluster: Cluster) -> None:
        pass

    def after_creation(self, cluster: Cluster) -> None:
        assert handled(self.get(cluster), 'spec', 'field') == 'value'

    def after_restart(self, cluster: Cluster) -> None:
        pass

    def after_update(self, cluster: Cluster) -> None:
        assert handled(self.get(cluster), 'spec', 'field') == 'changed'

    def after_deletion(self, cluster: Cluster) -> None:
        assert self.get(cluster) is None

    def check_outputs(self, outputs: list[str]) -> None:
        pass


class Minimal(Example):
    name = '01-minimal'
    logs = (
        "[default/kopf-example-1] Handler 'create_fn' succeeded.",
        "[default/kopf-example-1] Changed: change spec.field: 'value' -> 'changed'",
        "[default/kopf-example-1] Handler 'update_fn' succeeded.",
        "[default/kopf-example-1] Deletion is in progress:",
        "[default/kopf-example-1] A KopfExample 'kopf-example-1' is being deleted: cleaning up.",
        "[default/kopf-example-1] Handler 'delete_fn' succeeded.",
    )

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        obj = cluster.kopfexample()
        assert cluster.status().get('create_fn') == {'message': 'hello, kopf-example-1'}
        assert obj['metadata'].get('finalizers') == [DEFAULT_FINALIZER]  # because of the deletion handler


class Children(Example):
    name = '02-children'
    logs = (
        "[default/kopf-example-1] ConfigMap 'kopf-example-1' is created for 'kopf-example-1'.",
        "[default/kopf-example-1] Handler 'create_fn' succeeded.",
        "[default/kopf-example-1] ConfigMap 'kopf-example-1' now has field='changed'.",
        "[default/kopf-example-1] Handler 'update_fn/spec.field' succeeded.",
    )

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        parent = cluster.kopfexample()
        assert cluster.status().get('create_fn') == {'children': [NAME]}
        assert 'finalizers' not in parent['metadata']  # no deletion handlers: nothing to block
        child = the_only(cluster.configmaps())
        assert child['metadata']['name'] == NAME
        assert child['metadata']['labels'] == {'somelabel': 'somevalue'}
        assert child['metadata']['ownerReferences'] == [owner_reference_to(parent)]
        assert child['data'] == {'field': 'value', 'items': 'item1,item2'}

    def after_update(self, cluster: Cluster) -> None:
        super().after_update(cluster)
        child = the_only(cluster.configmaps())
        assert child['data'] == {'field': 'changed', 'items': 'item1,item2'}

    def after_deletion(self, cluster: Cluster) -> None:
        super().after_deletion(cluster)
        if cluster.collects_garbage:
            assert cluster.configmaps() == []  # garbage-collected with its owner


class Errors(Example):
    name = '03-errors'
    tracebacks = 2  # of the arbitrary exceptions (not of the temporary & permanent errors)
    logs = (
        "[default/kopf-example-1] Handler 'wait_for_data' failed temporarily: The data is not ready yet.",
        "[default/kopf-example-1] The data is ready at the attempt #2.",
        "[default/kopf-example-1] Handler 'wait_for_data' succeeded.",
        "[default/kopf-example-1] Handler 'call_flaky_service' failed with an exception",
        "\nConnectionError: The service is unavailable.\n",
        "[default/kopf-example-1] Handler 'call_flaky_service' succeeded.",
        "[default/kopf-example-1] Handler 'send_notification' failed with an exception",
        "\nRuntimeError: The notification service is down.\n",
        "[default/kopf-example-1] Creation is processed: 3 succeeded; 0 failed.",
        "[default/kopf-example-1] Handler 'forbid_changes/spec.field' failed permanently: "
        "spec.field cannot be changed from 'value' to 'changed'.",
        "[default/kopf-example-1] Updating is processed: 0 succeeded; 1 failed.",
    )

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        status = cluster.status()
        assert status.get('wait_for_data') == {'attempts': 2}
        assert status.get('call_flaky_service') == {'attempts': 2}
        assert 'send_notification' not in status  # no result: it has failed

    def check_outputs(self, outputs: list[str]) -> None:
        [output] = outputs
        assert output.count("Handler 'send_notification' is invoked.") == 1  # the error is ignored
        assert output.count("Handler 'forbid_changes/spec.field' is invoked.") == 1  # not retried


class Events(Example):
    name = '04-events'
    logs = (
        "Activity 'configure' succeeded.",
        "[default/kopf-example-1] Handler 'create_fn' succeeded.",
        "[default/kopf-example-1] Handler 'update_fn/spec.field' succeeded.",
        "[default/kopf-example-1] Handler 'delete_fn' succeeded.",
    )

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        assert ('Normal', 'Provisioned', "Provisioned with field='value'.") in cluster.events()
        # The log messages too (settings.posting.loggers), but not the debug ones.
        assert ('Normal', 'Logging', "Handler 'create_fn' succeeded.") in cluster.events()
        assert not [event for event in cluster.events() if 'is in progress' in event[2]]

    def after_update(self, cluster: Cluster) -> None:
        super().after_update(cluster)
        expected = ('Warning', 'FieldChanged', "spec.field changed from 'value' to 'changed'.")
        assert expected in cluster.events()

    def after_deletion(self, cluster: Cluster) -> None:
        super().after_deletion(cluster)
        expected = ('Error', 'CleanupFailed',
                    'The external resources are not released: The external system is unreachable.')
        assert expected in cluster.events()


class Handlers(Example):
    name = '05-handlers'
    restarts = True
    logs = (
        "[default/kopf-example-1] 'kopf-example-1' is created.",
        "[default/kopf-example-1] 'kopf-example-1' is resumed after the operator has started.",
        "[default/kopf-example-1] Updated fields: spec.field.",
        "[default/kopf-example-1] spec.field: 'value' -> 'changed'",
        "[default/kopf-example-1] Handler 'field_fn/spec.field' succeeded.",
        "[default/kopf-example-1] 'kopf-example-1' is deleted.",
    )

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        status = cluster.status()
        assert status.get('create_fn') == {'message': 'created'}
        assert 'resume_fn' not in status  # the objects are not resumed when created

    def after_restart(self, cluster: Cluster) -> None:
        assert cluster.status().get('resume_fn') == {'message': 'resumed'}

    def check_outputs(self, outputs: list[str]) -> None:
        first, second = outputs
        assert "Handler 'create_fn' succeeded." in first
        assert "spec.field: None -> 'value'" in first  # the field handlers run on creation too
        assert "Handler 'resume_fn'" not in first
        assert "Handler 'resume_fn' succeeded." in second
        assert "Handler 'create_fn'" not in second
        assert "spec.field: 'value' -> 'changed'" in second


class Subhandlers(Example):
    name = '06-subhandlers'
    logs = (
        "[default/kopf-example-1] Creating 'item1'.",
        "[default/kopf-example-1] Handler 'create_fn/item1' succeeded.",
        "[default/kopf-example-1] Creating 'item2'.",
        "[default/kopf-example-1] Handler 'create_fn/item2' succeeded.",
        "[default/kopf-example-1] Handler 'create_fn' succeeded.",
        "[default/kopf-example-1] Updating 'item1' with 'changed'.",
        "[default/kopf-example-1] Handler 'update_fn/spec.field/item1' succeeded.",
        "[default/kopf-example-1] Updating 'item2' with 'changed'.",
        "[default/kopf-example-1] Handler 'update_fn/spec.field/item2' succeeded.",
        "[default/kopf-example-1] Handler 'update_fn/spec.field' succeeded.",
    )

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        status = cluster.status()
        assert status.get('create_fn/item1') == {'created': 'item1'}
        assert status.get('create_fn/item2') == {'created': 'item2'}

    def after_update(self, cluster: Cluster) -> None:
        super().after_update(cluster)
        status = cluster.status()
        assert status.get('update_fn/spec.field/item1') == {'updated': 'item1', 'value': 'changed'}
        assert status.get('update_fn/spec.field/item2') == {'updated': 'item2', 'value': 'changed'}


class Builtins(Example):
    name = '07-builtins'
    crd = False
    plural = 'configmaps'
    sample = EXAMPLES / '07-builtins' / 'configmap.yaml'
    change = {'data': {'field': 'changed'}}
    logs = (
        "[default/kopf-example-1] Handler 'checksum_fn' succeeded.",
        "[default/kopf-example-1] Handler 'checksum_fn/data' succeeded.",
    )

    @staticmethod
    def checksum(obj: dict[str, Any] | None) -> Any:
        return (obj or {}).get('metadata', {}).get('annotations', {}).get('kopf.dev/data-checksum')

    def after_creation(self, cluster: Cluster) -> None:
        obj = self.get(cluster)
        assert handled(obj, 'data', 'field') == 'value'
        assert self.checksum(obj) == hashlib.sha256(b'{"field": "value"}').hexdigest()

    def after_update(self, cluster: Cluster) -> None:
        obj = self.get(cluster)
        assert handled(obj, 'data', 'field') == 'changed'
        assert self.checksum(obj) == hashlib.sha256(b'{"field": "changed"}').hexdigest()


class Filters(Example):
    name = '08-filters'

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        results = {key: value for key, value in cluster.status().items() if key != 'kopf'}
        assert results == {
            'by_metadata': True,
            'without_label': True,
            'by_field/spec.field': True,
            'by_callbacks': True,
            'by_combined_callbacks': True,
        }

    def after_update(self, cluster: Cluster) -> None:
        super().after_update(cluster)
        assert cluster.status().get('field_changed/spec.field') is True

    def check_outputs(self, outputs: list[str]) -> None:
        [output] = outputs
        assert "Handler 'by_other_label'" not in output
        assert "Handler 'without_items'" not in output


class Activities(Example):
    name = '10-activities'
    logs = (
        "The operator is configured.",
        "Activity 'startup_fn' succeeded.",
        "[default/kopf-example-1] Served objects: ['kopf-example-1']",
        "[default/kopf-example-1] Handler 'register_fn' succeeded.",
        "[default/kopf-example-1] Served objects: []",
        "[default/kopf-example-1] Handler 'delete_fn' succeeded.",
        "The operator exits; the objects still served: []",
        "Activity 'cleanup_fn' succeeded.",
    )

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        assert cluster.kopfexample()['metadata'].get('finalizers') == ['kopf.dev/example-finalizer']


class KubernetesClient(Example):
    name = '11-kubernetes-client'
    logs = (
        "The kubernetes client is configured.",
        "[default/kopf-example-1] Handler 'create_fn' succeeded.",
        "[default/kopf-example-1] Handler 'update_fn/spec.field' succeeded.",
    )

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        parent = cluster.kopfexample()
        pod = the_only(cluster.pods())
        assert cluster.status().get('create_fn') == {'children': [pod['metadata']['name']]}
        assert pod['metadata']['name'].startswith('kopf-example-1-')  # a generated name
        assert pod['metadata']['labels'] == {'somelabel': 'somevalue'}
        assert pod['metadata'].get('annotations') == {'kopf.dev/field': 'value'}
        assert pod['metadata']['ownerReferences'] == [owner_reference_to(parent)]
        assert pod['spec']['containers'][0]['image'] == 'busybox'

    def after_update(self, cluster: Cluster) -> None:
        super().after_update(cluster)
        pod = the_only(cluster.pods())
        assert pod['metadata'].get('annotations') == {'kopf.dev/field': 'changed'}

    def after_deletion(self, cluster: Cluster) -> None:
        super().after_deletion(cluster)
        if cluster.collects_garbage:
            assert cluster.pods() == []  # garbage-collected with its owner


class Indexing(Example):
    name = '12-indexing'
    logs = (
        "[default/kopf-example-1] KopfExamples with field='value': ['kopf-example-1']; "
        "pods in the namespace: 0.",
        "[default/kopf-example-1] Handler 'report_fn' succeeded.",
        "[default/kopf-example-1] KopfExamples with field='changed': ['kopf-example-1']; "
        "pods in the namespace: 0.",
        "[default/kopf-example-1] Handler 'report_fn/spec.field' succeeded.",
    )

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        assert cluster.status().get('report_fn') == {'same_field': [NAME], 'pods': 0}

    def after_update(self, cluster: Cluster) -> None:
        super().after_update(cluster)
        assert cluster.status().get('report_fn/spec.field') == {'same_field': [NAME], 'pods': 0}


class DaemonsTimers(Example):
    name = '13-daemons-timers'
    change_handlers = False
    logs = (
        "[default/kopf-example-1] The sync daemon is started in a thread.",
        "[default/kopf-example-1] Monitoring the field 'value' (round 1).",
        "[default/kopf-example-1] Tick: the field is 'value'.",
        "[default/kopf-example-1] Tick: the field is 'changed'.",
        "[default/kopf-example-1] The sync daemon is stopped.",
        "[default/kopf-example-1] The async daemon is stopped",
    )

    def after_creation(self, cluster: Cluster) -> None:
        # No change handlers: no diff-base; the timer's result and our finalizer (for the daemons) instead.
        obj = cluster.kopfexample()
        assert obj['metadata'].get('finalizers') == [DEFAULT_FINALIZER]
        assert cluster.status().get('tick') == {'field': 'value'}

    def after_update(self, cluster: Cluster) -> None:
        assert cluster.status().get('tick') == {'field': 'changed'}


class Admission(Example):
    name = '14-admission'
    logs = (
        "[default/kopf-example-1] The admitted numbers are: [1, 2, 3]",
        "[default/kopf-example-1] Handler 'report_fn' succeeded.",
        "[default/kopf-example-1] The admitted numbers are: [1, 2.5]",  # 1.0 is stored as 1 (Go's float64)
        "[default/kopf-example-1] Handler 'report_fn/spec' succeeded.",
    )
    change = {'spec': {'field': 'changed', 'numbers': ['1', '2.5']}}

    def before_creation(self, cluster: Cluster) -> None:
        # The webhooks are configured by the operator shortly after its start.
        validating = cluster.user.get(
            '/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/auto.kopf.dev')
        mutating = cluster.user.get(
            '/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/auto.kopf.dev')
        assert validating is not None and len(validating['webhooks']) == 3
        assert mutating is not None and len(mutating['webhooks']) == 2

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        assert cluster.kopfexample()['spec']['numbers'] == [1, 2, 3]  # mutated: the default
        bad = cluster.sample(self.sample, name='kopf-example-bad')
        bad['spec']['numbers'] = [1, 200]
        with pytest.raises(ApiError) as error:
            cluster.user.create(cluster.path('kopfexamples'), bad)
        assert error.value.status == 422
        assert 'denied the request: Numbers must be within 0..100.' in error.value.message
        assert cluster.get('kopfexamples', 'kopf-example-bad') is None

    def after_update(self, cluster: Cluster) -> None:
        super().after_update(cluster)
        numbers = cluster.kopfexample()['spec']['numbers']
        assert numbers == [1, 2.5] and isinstance(numbers[0], int)  # mutated: converted, 1.0 stored as 1


class Peering(Example):
    name = '15-peering'
    logs = (
        "[default/kopf-example-1] Handled by the replica ",
        "[default/kopf-example-1] Updated by the replica ",
    )

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        assert 'replica' in cluster.status().get('create_fn', {})


class Sharding(Example):
    name = '17-sharding'
    logs = (
        "Replica ",  # handles everything: one replica, run without --shards
        "[default/kopf-example-1] Handled by the replica ",
        "[default/kopf-example-1] Monitored by the replica ",
        "[default/kopf-example-1] Updated by the replica ",
    )

    def after_creation(self, cluster: Cluster) -> None:
        super().after_creation(cluster)
        assert 'replica' in cluster.status().get('create_fn', {})


class Metrics(Example):
    name = '16-metrics'
    env = {'EXAMPLE_METRICS_URL': 'http://127.0.0.1:0/metrics'}  # any free port (the URL is logged)
    logs = (
        "Serving the metrics at http://127.0.0.1:",
        "[default/kopf-example-1] Handler 'provision' succeeded.",
        "[default/kopf-example-1] Handler 'provision/spec' succeeded.",
        "[default/kopf-example-1] Handler 'deprovision' succeeded.",
    )

    def check_outputs(self, outputs: list[str]) -> None:
        [output] = outputs
        url = output.split('Serving the metrics at ', 1)[1].split()[0]
        assert url.endswith('/metrics')  # served while it ran (scraped in tests/metrics); released since


EXAMPLES_RUN_BY_KOPF = [
    Minimal(), Children(), Errors(), Events(), Handlers(), Subhandlers(), Builtins(), Filters(),
    Activities(), KubernetesClient(), Indexing(), DaemonsTimers(), Admission(), Peering(), Metrics(),
    Sharding(),
]
EXAMPLES_RUN_BY_THEMSELVES = ['09-embedding']


def test_all_examples_are_tested() -> None:
    directories = {path.parent.name for path in EXAMPLES.glob('*/example.py')}
    tested = {example.name for example in EXAMPLES_RUN_BY_KOPF} | set(EXAMPLES_RUN_BY_THEMSELVES)
    assert directories == tested


@pytest.fixture()
def namespace(k8s_api: KubeAPI) -> Iterator[str]:
    """A namespace of the test's own; on a real server, it stays (as Terminating) with what is left in it."""
    user = ApiUser(k8s_api.kubeconfig_path)
    name = f'example-{uuid.uuid4().hex[:8]}'
    user.create_namespace(name)
    yield name
    user.delete(f'/api/v1/namespaces/{name}')


@pytest.fixture()
def cluster(k8s_api: KubeAPI, namespace: str) -> Cluster:
    return Cluster(k8s_api, namespace)


def until(check: Callable[[], _T]) -> _T:
    return eventually(check, within=WAIT_TIMEOUT)


@contextlib.contextmanager
def running(example: Example, outputs: list[str]) -> Iterator[KopfRunner]:
    """Run the example's operator as ``kopf run`` would; remember its output when it exits."""
    args = ['run', '--all-namespaces', '--verbose', str(EXAMPLES / example.name / 'example.py')]
    registry = kopf.OperatorRegistry()  # not the default one: the handlers of the examples would pile up
    with KopfRunner(args, registry=registry, timeout=WAIT_TIMEOUT) as runner:  # to $KUBECONFIG
        yield runner
    assert runner.exit_code == 0
    assert runner.exception is None
    outputs.append(runner.output)


@pytest.mark.parametrize('example', EXAMPLES_RUN_BY_KOPF, ids=repr)
def test_example(example: Example, cluster: Cluster, caplog: pytest.LogCaptureFixture,
                 monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in example.env.items():
        monkeypatch.setenv(key, value)
    if example.crd:
        cluster.user.apply_crd(yaml.safe_load((EXAMPLES / 'crd.yaml').read_text()))

    outputs: list[str] = []
    path = cluster.path(example.plural)
    with contextlib.ExitStack() as operator:
        operator.enter_context(running(example, outputs))
        until(lambda: example.before_creation(cluster))
        cluster.user.create(path, cluster.sample(example.sample))
        until(lambda: example.after_creation(cluster))

        if example.restarts:  # everything the operator needs is stored in the objects
            operator.close()
            operator.enter_context(running(example, outputs))
            until(lambda: example.after_restart(cluster))

        cluster.user.patch(f'{path}/{NAME}', example.change)
        until(lambda: example.after_update(cluster))

        cluster.user.delete(f'{path}/{NAME}')
        until(lambda: example.after_deletion(cluster))
        if example.change_handlers:
            until(lambda: _assert_in(DELETION_NOTICE, caplog.messages))  # the last words of the object

    output = ''.join(outputs)
    prefix = f'[{cluster.namespace}/'
    assert output.count('Traceback (most recent call last)') == example.tracebacks
    if example.change_handlers:
        assert f'{prefix}kopf-example-1] Creation is in progress:' in output  # a debug message
        assert f'{prefix}kopf-example-1] {DELETION_NOTICE}' in output
    for line in example.logs:
        assert line.replace('[default/', prefix) in output
    example.check_outputs(outputs)


def _assert_in(item: Any, collection: Any) -> None:
    assert item in collection


async def test_embedding(k8s_api: KubeAPI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # nobody configures the logging here: it is up to the application
    main: Callable[[asyncio.Event], Coroutine[Any, Any, None]] = runpy.run_path(
        str(EXAMPLES / '09-embedding' / 'example.py'))['main']
    cluster = Cluster(k8s_api, 'default')  # the example serves this namespace only
    await asyncio.to_thread(cluster.user.apply_crd, yaml.safe_load((EXAMPLES / 'crd.yaml').read_text()))

    stop_flag = asyncio.Event()
    app = asyncio.create_task(main(stop_flag))
    try:
        path = cluster.path('kopfexamples')
        await asyncio.to_thread(cluster.user.create, path, cluster.sample(EXAMPLES / 'obj.yaml'))

        def created() -> None:
            assert cluster.status().get('create_fn') == {'message': 'hello, kopf-example-1'}
            assert "The application has noticed a new KopfExample: 'kopf-example-1'." in caplog.messages

        await eventually_async(lambda: asyncio.to_thread(created), within=WAIT_TIMEOUT)  # blocking requests
        await asyncio.to_thread(cluster.user.delete, f'{path}/{NAME}')
        await eventually_async(lambda: _assert_in(DELETION_NOTICE, caplog.messages), within=WAIT_TIMEOUT)
        assert not app.done()  # the application runs until it is told to stop
    finally:
        stop_flag.set()
        await asyncio.wait_for(app, timeout=WAIT_TIMEOUT)  # and then it exits, with no errors

    assert "Handler 'create_fn' succeeded." in caplog.messages
    assert not [record for record in caplog.records if record.exc_info is not None]


@pytest.mark.parametrize('replicas', [2, 3])
@pytest.mark.parametrize('mode', ['peering', 'lease'])
def test_replicas_of_the_peering_example_handle_every_object_exactly_once(
        mode: str, replicas: int, cluster: Cluster,
) -> None:
    cluster.user.apply_crd(yaml.safe_load((EXAMPLES / 'crd.yaml').read_text()))
    for doc in yaml.safe_load_all((EXAMPLES.parent / 'peering.yaml').read_text()):
        cluster.user.apply_crd(doc)
    name = cluster.namespace  # unique: for the cluster-wide peering object too
    if mode == 'peering':
        peering = {'apiVersion': 'kopf.dev/v1', 'kind': 'ClusterKopfPeering', 'metadata': {'name': name}}
        cluster.user.create('/apis/kopf.dev/v1/clusterkopfpeerings', peering)

    names = [f'kex{index}' for index in range(5)]
    runners = []
    with contextlib.ExitStack() as stack:
        for priority in range(10, 10 * (replicas + 1), 10):  # a distinct priority per replica
            options = (['--peering', name, '--priority', str(priority)] if mode == 'peering' else
                       ['--lease', f'{cluster.namespace}/{name}'])
            args = ['run', '-A', '--verbose', *options, str(EXAMPLES / '15-peering' / 'example.py')]
            runners.append(stack.enter_context(KopfRunner(args, registry=kopf.OperatorRegistry(),
                                                          timeout=WAIT_TIMEOUT)))
        # All replicas know of each other (or the lease is taken) before the objects appear.
        until(lambda: _assert_coordinated(cluster, name, mode=mode, replicas=replicas))
        time.sleep(0.5)  # the lower ones pause on seeing the higher one: not observable in the cluster
        for obj_name in names:
            cluster.user.create(cluster.path('kopfexamples'), cluster.sample(EXAMPLES / 'obj.yaml', obj_name))
        until(lambda: _assert_handled(cluster, names))
        time.sleep(0.5)  # anything handled twice would show up by now
    output = ''.join(runner.output for runner in runners)
    for obj_name in names:
        assert output.count(f'[{cluster.namespace}/{obj_name}] Handled by the replica') == 1, obj_name
    replica_names = {(cluster.get('kopfexamples', obj_name) or {})['status']['create_fn']['replica']
                     for obj_name in names}
    assert len(replica_names) == 1  # all by one replica: the highest priority, or the leader


@pytest.mark.parametrize('replicas', [2, 3])
def test_replicas_of_the_sharding_example_split_the_objects_and_handle_each_once(
        replicas: int, cluster: Cluster,
) -> None:
    cluster.user.apply_crd(yaml.safe_load((EXAMPLES / 'crd.yaml').read_text()))
    name = 'example'
    names = [f'kex{index}' for index in range(30)]
    runners = []
    with contextlib.ExitStack() as stack:
        for _ in range(replicas):
            settings = kopf.OperatorSettings()  # the sharding's timings shortened: a quick test
            settings.sharding.count = 8
            settings.sharding.lease_duration, settings.sharding.renew_deadline = 3, 2
            settings.sharding.retry_period = 0.2
            args = ['run', '-A', '--verbose', '--shards', f'{cluster.namespace}/{name}',
                    str(EXAMPLES / '17-sharding' / 'example.py')]
            runners.append(stack.enter_context(KopfRunner(args, registry=kopf.OperatorRegistry(),
                                                          settings=settings, timeout=WAIT_TIMEOUT)))
        until(lambda: _assert_sharded(cluster, name, replicas=replicas))
        for obj_name in names:
            cluster.user.create(cluster.path('kopfexamples'), cluster.sample(EXAMPLES / 'obj.yaml', obj_name))
        until(lambda: _assert_handled(cluster, names))
    # All that the replicas have done while they ran (and finished on exit) is in their outputs by now.
    output = ''.join(runner.output for runner in runners)
    for obj_name in names:
        assert output.count(f'[{cluster.namespace}/{obj_name}] Handled by the replica') == 1, obj_name
    replica_names = {(cluster.get('kopfexamples', obj_name) or {})['status']['create_fn']['replica']
                     for obj_name in names}
    assert len(replica_names) == replicas  # every replica has its part
    assert 'Took the shards ' in output and 'Released the shards ' in output


def _assert_sharded(cluster: Cluster, name: str, *, replicas: int) -> None:
    path = f'/apis/coordination.k8s.io/v1/namespaces/{cluster.namespace}/leases'
    items = (cluster.user.get(f'{path}?labelSelector=kopf.dev/sharding={name}') or {}).get('items') or []
    holders = collections.Counter(item['spec'].get('holderIdentity') for item in items
                                  if item['metadata']['name'].startswith(f'{name}-shard-'))
    assert sum(holders.values()) == 8 and '' not in holders and len(holders) == replicas
    assert max(holders.values()) - min(holders.values()) <= 1


def _assert_handled(cluster: Cluster, names: list[str]) -> None:
    for name in names:
        assert 'create_fn' in ((cluster.get('kopfexamples', name) or {}).get('status') or {})


def _assert_coordinated(cluster: Cluster, name: str, *, mode: str, replicas: int) -> None:
    if mode == 'peering':
        body = cluster.user.get(f'/apis/kopf.dev/v1/clusterkopfpeerings/{name}') or {}
        assert len(body.get('status') or {}) == replicas
    else:
        path = f'/apis/coordination.k8s.io/v1/namespaces/{cluster.namespace}/leases/{name}'
        body = cluster.user.get(path) or {}
        assert (body.get('spec') or {}).get('holderIdentity')
