"""
The same tests on any API server (the ``k8s_api`` switch): the emulator by default, the real control plane
(``--kube-api=control-plane``, in tox's ``realapi`` env), or a cluster (``--kube-api=kubeconfig``).

They talk to the server only through ``KUBECONFIG`` (kubectl, the ``kubernetes`` client, operators), so
where the emulator's reading of Kubernetes is wrong, the real server shows it.
"""
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import yaml

import kopf
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import KopfRunner

from .._waiting import wait_until

pytestmark = pytest.mark.kube_api

REPO = pathlib.Path(__file__).resolve().parents[2]
KUBECTL = shutil.which('kubectl')
WAIT = 30.0
RUN = ['run', '--standalone', '--verbose']


@pytest.fixture()
def api(k8s_api: Any) -> Iterator[kubernetes.client.ApiClient]:
    client = kubernetes.config.new_client_from_config(config_file=str(k8s_api.kubeconfig_path))
    yield client
    client.close()


@pytest.fixture()
def namespace(api: kubernetes.client.ApiClient) -> Iterator[str]:
    name = f'test-{uuid.uuid4().hex[:8]}'
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}})
    yield name
    core.delete_namespace(name)


@pytest.fixture()
def kex_crd(api: kubernetes.client.ApiClient) -> None:
    body = yaml.safe_load((REPO / 'examples' / 'crd.yaml').read_text())
    crds = kubernetes.client.ApiextensionsV1Api(api)
    try:
        crds.create_custom_resource_definition(body)
    except kubernetes.client.ApiException as e:
        if e.status != 409:  # shared by the tests of a session's control plane
            raise
    wait_until(lambda: any(c.type == 'Established' and c.status == 'True'
                           for c in (crds.read_custom_resource_definition(body['metadata']['name'])
                                     .status.conditions or [])))


def kex(api: kubernetes.client.ApiClient, namespace: str) -> Any:
    custom = kubernetes.client.CustomObjectsApi(api)
    return custom, {'group': 'kopf.dev', 'version': 'v1', 'namespace': namespace, 'plural': 'kopfexamples'}


def test_the_minimal_example_end_to_end(
        api: kubernetes.client.ApiClient, kex_crd: None, namespace: str) -> None:
    custom, where = kex(api, namespace)
    args = [*RUN, '-n', namespace, str(REPO / 'examples' / '01-minimal' / 'example.py')]
    with KopfRunner(args, timeout=WAIT) as runner:
        custom.create_namespaced_custom_object(**where, body={
            'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
            'metadata': {'name': 'kex1'}, 'spec': {'duration': '1m'}})
        obj = wait_until(lambda: (o := custom.get_namespaced_custom_object(**where, name='kex1'))
                         .get('status', {}).get('create_fn') and o)
        assert obj['status']['create_fn'] == {'message': 'hello, kex1'}
        assert 'kopf.zalando.org/KopfFinalizerMarker' in obj['metadata']['finalizers']
        custom.patch_namespaced_custom_object(**where, name='kex1', body={'spec': {'duration': '2m'}})
        wait_until(lambda: '"2m"' in custom.get_namespaced_custom_object(**where, name='kex1')['metadata']
                   .get('annotations', {}).get('kopf.zalando.org/last-handled-configuration', ''))
        custom.delete_namespaced_custom_object(**where, name='kex1')

        def gone() -> bool:
            try:
                custom.get_namespaced_custom_object(**where, name='kex1')
            except kubernetes.client.ApiException as e:
                return e.status == 404
            return False
        wait_until(gone)
    assert runner.exit_code == 0, runner.output
    assert "Handler 'create_fn' succeeded." in runner.output
    assert "Changed: change spec.duration: '1m' -> '2m'" in runner.output
    assert "Handler 'delete_fn' succeeded." in runner.output


@pytest.mark.parametrize('setting', [
    # settings.watching.initial_streaming: the objects are listed by the watch request itself
    # (sendInitialEvents, then the bookmark of the initial events' end), not by a LIST: those made
    # before the start, then the new ones; with no fallback to list-then-watch (the server supports it).
    pytest.param('initial_streaming = True', id='streamed'),
    # settings.watching.chunk_size: the listing in pages (limit & continue), each next page requested while
    # the previous one is processed: the server's continuation tokens work whenever they come.
    pytest.param('chunk_size = 3', id='paginated'),
])
def test_the_listing_sees_the_existing_objects_once_then_the_changes(
        api: kubernetes.client.ApiClient, kex_crd: None, namespace: str, tmp_path: pathlib.Path,
        setting: str) -> None:
    custom, where = kex(api, namespace)
    names = [f'kex{index}' for index in range(20)]
    for name in names:
        custom.create_namespaced_custom_object(**where, body={
            'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': name}, 'spec': {}})
    operator = tmp_path / 'listing.py'
    operator.write_text(textwrap.dedent(f"""
        import kopf

        @kopf.on.startup()
        def configure(settings, **_):
            settings.watching.{setting}

        @kopf.on.create('kopfexamples')
        def create_fn(name, **_):
            print(f'SEEN {{name}}', flush=True)
            return {{'seen': name}}
    """))

    def seen(name: str) -> bool:
        obj = custom.get_namespaced_custom_object(**where, name=name)
        return bool(obj.get('status', {}).get('create_fn') == {'seen': name})

    with KopfRunner([*RUN, '-n', namespace, str(operator)], timeout=WAIT) as runner:
        wait_until(lambda: all(seen(name) for name in names))
        custom.create_namespaced_custom_object(**where, body={
            'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex-new'}, 'spec': {}})
        wait_until(lambda: seen('kex-new'))
    assert runner.exit_code == 0, runner.output
    assert sorted(line for line in runner.output.splitlines() if line.startswith('SEEN ')) == \
        sorted(f'SEEN {name}' for name in [*names, 'kex-new'])  # each once
    streamed = 'The listing of kopfexamples.kopf.dev is streamed: 20 objects.' in runner.output
    assert streamed == setting.startswith('initial_streaming')
    assert 'not supported by the server' not in runner.output


def test_a_change_under_the_handlers_patch_is_handled(
        api: kubernetes.client.ApiClient, kex_crd: None, namespace: str, tmp_path: pathlib.Path) -> None:
    # The API applies a merge-patch on top of whatever the object is now (no precondition): the framework's
    # patch of a handled object goes over a change made while the handler ran, so its echo has that change.
    # With the usual logs (no --verbose), the echoes of only our own writes are skipped: not this.
    custom, where = kex(api, namespace)
    operator = tmp_path / 'changing.py'
    operator.write_text(textwrap.dedent(f"""
        import kopf, kubernetes

        @kopf.on.create('kopfexamples')
        def create_fn(name, spec, **_):
            with kubernetes.config.new_client_from_config() as api:  # the KUBECONFIG of the test
                kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
                    'kopf.dev', 'v1', {namespace!r}, 'kopfexamples', name, {{'spec': {{'field': 'changed'}}}})
            return spec['field']

        @kopf.on.update('kopfexamples')
        def update_fn(new, **_):
            print(f'UPDATED TO {{new["spec"]["field"]}}', flush=True)
            return new['spec']['field']
    """))
    with KopfRunner(['run', '--standalone', '-n', namespace, str(operator)], timeout=WAIT) as runner:
        custom.create_namespaced_custom_object(**where, body={
            'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex1'},
            'spec': {'field': 'original'}})
        obj = wait_until(lambda: (o := custom.get_namespaced_custom_object(**where, name='kex1'))
                         .get('status', {}).get('update_fn') and o)
    assert runner.exit_code == 0, runner.output
    assert obj['status'] == {'create_fn': 'original', 'update_fn': 'changed'}
    assert runner.output.count('UPDATED TO changed') == 1
    assert '"changed"' in obj['metadata']['annotations']['kopf.zalando.org/last-handled-configuration']


def test_a_handlers_result_pruned_by_the_schema_is_reported_not_retried(
        api: kubernetes.client.ApiClient, namespace: str, tmp_path: pathlib.Path) -> None:
    # Kopf's docs: without x-kubernetes-preserve-unknown-fields on the status, the API prunes the results
    # stored there; the framework says so ("Patching failed with inconsistencies") and goes on.
    group = f'p{uuid.uuid4().hex[:8]}.kopf.dev'
    crds = kubernetes.client.ApiextensionsV1Api(api)
    crds.create_custom_resource_definition({
        'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
        'metadata': {'name': f'prunables.{group}'},
        'spec': {'group': group, 'scope': 'Namespaced',
                 'names': {'plural': 'prunables', 'singular': 'prunable', 'kind': 'Prunable'},
                 'versions': [{'name': 'v1', 'served': True, 'storage': True, 'subresources': {'status': {}},
                               'schema': {'openAPIV3Schema': {'type': 'object', 'properties': {
                                   'spec': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
                                   'status': {'type': 'object', 'properties': {'phase': {'type': 'string'}}},
                               }}}}]}})
    custom = kubernetes.client.CustomObjectsApi(api)
    where = {'group': group, 'version': 'v1', 'namespace': namespace, 'plural': 'prunables'}
    def served() -> bool:
        try:
            custom.list_namespaced_custom_object(**where)
        except kubernetes.client.ApiException as e:
            if e.status != 404:  # "404 page not found" until the new resource is served
                raise
            return False
        return True

    try:
        wait_until(served)
        operator = tmp_path / 'pruned.py'
        operator.write_text(textwrap.dedent(f"""
            import kopf

            @kopf.on.create({group!r}, 'prunables')
            def create_fn(patch, **_):
                print('CREATE_FN CALLED', flush=True)
                patch.status['phase'] = 'done'
                return {{'message': 'pruned'}}
        """))
        with KopfRunner([*RUN, '-n', namespace, str(operator)], timeout=WAIT) as runner:
            custom.create_namespaced_custom_object(**where, body={
                'apiVersion': f'{group}/v1', 'kind': 'Prunable', 'metadata': {'name': 'p1'}, 'spec': {}})
            obj = wait_until(lambda: (o := custom.get_namespaced_custom_object(**where, name='p1'))
                             .get('status', {}).get('phase') and o)
    finally:
        crds.delete_custom_resource_definition(f'prunables.{group}')
    assert runner.exit_code == 0, runner.output
    assert obj['status'] == {'phase': 'done'}  # the declared field is stored, the result is pruned
    assert runner.output.count('CREATE_FN CALLED') == 1
    assert 'Creation is processed: 1 succeeded; 0 failed.' in runner.output
    assert "Patching failed with inconsistencies: (('add', ('status', 'create_fn'), None, {'message': " \
           "'pruned'}),)" in runner.output


@pytest.mark.parametrize('token', [False, True], ids=['current-context', 'token-context'])
def test_the_benchmarks_floor_logs_in_by_the_kubeconfig(
        k8s_api: Any, api: kubernetes.client.ApiClient, kex_crd: None, namespace: str,
        tmp_path: pathlib.Path, token: bool) -> None:
    # benchmarks/floor_client.py --kubeconfig: the server, its CA, the user's client certificate or token.
    kubeconfig = k8s_api.kubeconfig_path
    if token:
        config = yaml.safe_load(kubeconfig.read_text())
        users = {u['name']: u.get('user') or {} for u in config.get('users') or []}
        found = [c['name'] for c in config.get('contexts') or []
                 if users.get(c['context'].get('user'), {}).get('token')]
        if not found:
            pytest.skip('The kubeconfig has no context with a bearer token.')
        config['current-context'] = found[0]
        kubeconfig = tmp_path / 'kubeconfig'
        kubeconfig.write_text(yaml.safe_dump(config))
    custom, where = kex(api, namespace)
    floor = subprocess.Popen([sys.executable, str(REPO / 'benchmarks' / 'floor_client.py'),
                              '--kubeconfig', str(kubeconfig), '--namespace', namespace],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        custom.create_namespaced_custom_object(**where, body={
            'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex1'}, 'spec': {}})

        def handled() -> Any:
            if floor.poll() is not None:
                return True  # it has exited: its output says why
            obj = custom.get_namespaced_custom_object(**where, name='kex1')
            return obj if obj.get('status', {}).get('create_fn') else None

        obj = wait_until(handled)
    finally:
        if floor.poll() is None:
            floor.send_signal(signal.SIGINT)
        output, _ = floor.communicate(timeout=WAIT)
    assert floor.returncode == 0, output
    assert isinstance(obj, dict), output
    assert obj['status']['create_fn'] == {'message': 'hello'}
    assert 'kopf.zalando.org/last-handled-configuration' in obj['metadata']['annotations']


@pytest.mark.skipif(KUBECTL is None, reason='kubectl is not installed')
def test_kubectl_applies_and_reads(
        k8s_api: Any, kex_crd: None, namespace: str, tmp_path: pathlib.Path) -> None:
    def kubectl(*args: str) -> str:
        result = subprocess.run([str(KUBECTL), '--kubeconfig', str(k8s_api.kubeconfig_path),
                                 '--cache-dir', str(tmp_path), '-n', namespace, *args],
                                capture_output=True, text=True, timeout=WAIT, cwd=REPO)
        assert result.returncode == 0, result.stderr
        return result.stdout

    kubectl('apply', '-f', 'examples/obj.yaml')
    assert 'kopf-example-1' in kubectl('get', 'kopfexamples')
    assert kubectl('get', 'kex', 'kopf-example-1', '-o', 'jsonpath={.spec.duration}') == '1m'
    kubectl('delete', '-f', 'examples/obj.yaml')


def test_admission_webhooks_are_called_by_the_api_server_over_tls(
        api: kubernetes.client.ApiClient, kex_crd: None, namespace: str) -> None:
    # The managed configuration with the self-signed certificate's caBundle: the API server verifies
    # the webhook server's certificate and calls it; a denial reaches the client; a mutation is stored.
    registry = OperatorRegistry()
    managed = f'{namespace}.auto.kopf.dev'

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.admission.server = kopf.WebhookServer(host='127.0.0.1', addr='127.0.0.1', port=0)
        settings.admission.managed = managed

    @kopf.on.validate('kopfexamples', registry=registry)
    def check(spec: kopf.Spec, **_: Any) -> None:
        if spec.get('forbidden'):
            raise kopf.AdmissionError('Forbidden by the webhook.', code=422)

    @kopf.on.mutate('kopfexamples', registry=registry)
    def default(spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
        if 'duration' not in spec:
            patch.spec['duration'] = '5m'

    custom, where = kex(api, namespace)
    admission = kubernetes.client.AdmissionregistrationV1Api(api)
    with KopfRunner([*RUN, '-n', namespace], registry=registry, timeout=WAIT) as runner:
        wait_until(lambda: admission.read_validating_webhook_configuration(managed).webhooks
                   if managed in [c.metadata.name for c in
                                  admission.list_validating_webhook_configuration().items] else None)
        wait_until(lambda: admission.read_mutating_webhook_configuration(managed).webhooks
                   if managed in [c.metadata.name for c in
                                  admission.list_mutating_webhook_configuration().items] else None)
        with pytest.raises(kubernetes.client.ApiException) as denied:
            custom.create_namespaced_custom_object(**where, body={
                'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
                'metadata': {'name': 'kex-denied'}, 'spec': {'forbidden': True}})
        created = custom.create_namespaced_custom_object(**where, body={
            'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex-mutated'}})
    assert runner.exit_code == 0, runner.output
    assert denied.value.status == 422
    assert 'Forbidden by the webhook.' in (denied.value.body or '')
    assert created['spec'] == {'duration': '5m'}
    assert "Webhook 'default' succeeded." in runner.output
    webhooks = [w for c in admission.list_validating_webhook_configuration().items
                if c.metadata.name == managed for w in (c.webhooks or [])]
    assert webhooks == []  # the non-persistent webhooks are removed at exit


def test_lease_election_with_two_replicas(
        api: kubernetes.client.ApiClient, kex_crd: None, namespace: str) -> None:
    # Two replicas with one Lease: only the leader handles; its graceful exit hands over at once.
    handled: list[tuple[str, str]] = []
    lock = threading.Lock()

    def replica(name: str) -> OperatorRegistry:
        registry = OperatorRegistry()

        @kopf.on.startup(registry=registry)
        def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.election.lease_duration = 4
            settings.election.renew_deadline = 2
            settings.election.retry_period = 0.2
            settings.posting.enabled = False

        @kopf.on.create('kopfexamples', registry=registry)
        def created(name: str, **_: Any) -> None:
            with lock:
                handled.append((replica_name, name))

        replica_name = name
        return registry

    custom, where = kex(api, namespace)
    leases = kubernetes.client.CoordinationV1Api(api)
    args = ['run', '-n', namespace, '--lease', f'{namespace}/election']
    first = KopfRunner(args, registry=replica('first'), timeout=WAIT)
    second = KopfRunner(args, registry=replica('second'), timeout=WAIT)
    first.__enter__()
    try:
        holder = wait_until(lambda: leases.read_namespaced_lease('election', namespace).spec.holder_identity)
        with second:
            custom.create_namespaced_custom_object(**where, body={
                'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex1'}})
            wait_until(lambda: handled)
            assert [who for who, _ in handled] == ['first']
            assert leases.read_namespaced_lease('election', namespace).spec.holder_identity == holder
            first.__exit__(None, None, None)  # the leader exits gracefully: the follower takes over at once
            wait_until(lambda: leases.read_namespaced_lease('election', namespace).spec.holder_identity
                       not in ('', holder), within=3.0)
            custom.create_namespaced_custom_object(**where, body={
                'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex2'}})
            wait_until(lambda: len(handled) == 2)
    finally:
        if not first.finished:
            first.__exit__(None, None, None)
    assert handled == [('first', 'kex1'), ('second', 'kex2')]
