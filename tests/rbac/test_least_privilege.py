"""
Least privilege on the real API server: the operator runs as a user with only the RBAC rules of ``rbac.yaml``.

For every feature (the change handlers, the k8s-events, the peering, the Lease election, the sharding,
the managed admission configurations; namespaced and cluster-wide), a fresh user of the session's control
plane (``add_user``) gets the feature's rules (with those of the features it builds on) and runs an operator
(``KopfRunner`` with the user's kubeconfig), which must do its job: the rules are enough. Then, for every
verb of the feature's rules, another user gets all the rules but that one verb: the operator must say,
in one line without a traceback, which verb of which resource (and group) in which namespace
(or cluster-wide) it lacks: exactly the line of ``EXPECTED``. It neither stalls silently nor crashes;
if it gives up (e.g. on its lease), its last line is the ``Error:`` with the denial.

One control plane for the session; a user, a namespace and an operator per test (about a second each).
"""
import logging
import pathlib
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest
import yaml

import kopf
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import ApiError, Cluster, KopfRunner, eventually

pytestmark = pytest.mark.real_apiserver

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
RULES: dict[str, list[dict[str, Any]]] = yaml.safe_load((HERE / 'rbac.yaml').read_text())
WAIT = 30.0
KEX = 'kopf.dev/v1'


class Verb(NamedTuple):
    """One verb on one resource in one scope: the smallest part of a rule that can be taken away."""
    scope: str  # 'namespace' or 'cluster'
    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        return f'{self.scope}:{self.verb}:{self.resource}.{self.group}' if self.group else \
            f'{self.scope}:{self.verb}:{self.resource}'


def verbs_of(*features: str) -> list[Verb]:
    return [Verb(rule['scope'], group, resource, verb)
            for feature in features for rule in RULES[feature]
            for group in rule['apiGroups'] for resource in rule['resources'] for verb in rule['verbs']]


class Case(NamedTuple):
    feature: str  # the feature under test: its verbs are taken away one by one
    base: tuple[str, ...]  # the features it builds on, granted in full
    args: tuple[str, ...]  # of `kopf run`; NAMESPACE is replaced


CASES = {
    'handlers-namespaced': Case('handlers-namespaced', (), ('-n', 'NAMESPACE', '--standalone')),
    'handlers-cluster': Case('handlers-cluster', (), ('-A', '--standalone')),
    'peering-namespaced': Case('peering-namespaced', ('handlers-namespaced',),
                               ('-n', 'NAMESPACE', '--peering=NAMESPACE', '--priority=10')),
    'peering-cluster': Case('peering-cluster', ('handlers-cluster',),
                            ('-A', '--peering=NAMESPACE', '--priority=10')),
    'lease': Case('lease', ('handlers-namespaced',),
                  ('-n', 'NAMESPACE', '--standalone', '--lease=NAMESPACE/lead')),
    'sharding': Case('sharding', ('handlers-namespaced',),
                     ('-n', 'NAMESPACE', '--standalone', '--shards=NAMESPACE/split')),
    'admission-managed': Case('admission-managed', ('handlers-namespaced',),
                              ('-n', 'NAMESPACE', '--standalone')),
}


@pytest.fixture()
def admin(k8s_control_plane: Any) -> Iterator[Cluster]:
    yield Cluster(k8s_control_plane.kubeconfig_path)


@pytest.fixture()
def namespace(admin: Cluster) -> Iterator[str]:
    name = f'rbac-{uuid.uuid4().hex[:8]}'
    admin.create_namespace(name)
    yield name
    admin.delete(f'/api/v1/namespaces/{name}')
    admin.delete(f'/apis/kopf.dev/v1/clusterkopfpeerings/{name}')
    for kind in ('validatingwebhookconfigurations', 'mutatingwebhookconfigurations'):
        admin.delete(f'/apis/admissionregistration.k8s.io/v1/{kind}/{name}.auto.kopf.dev')


@pytest.fixture()
def crds(admin: Cluster) -> None:
    for path in [REPO / 'examples' / 'crd.yaml', REPO / 'peering.yaml']:
        for body in yaml.safe_load_all(path.read_text()):
            if body:
                admin.apply_crd(body)


@pytest.fixture(autouse=True)
def _isolated(restore_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv('KUBERNETES_SERVICE_HOST', raising=False)
    monkeypatch.delenv('KUBERNETES_SERVICE_PORT', raising=False)


def grant(admin: Cluster, namespace: str, user: str, verbs: list[Verb]) -> None:
    """A Role in the namespace and a ClusterRole with these verbs, bound to the user."""
    for scope in ('namespace', 'cluster'):
        rules = [{'apiGroups': [v.group], 'resources': [v.resource], 'verbs': [v.verb]}
                 for v in verbs if v.scope == scope]
        if not rules:
            continue
        role = {'metadata': {'name': user}, 'rules': rules}
        binding = {'metadata': {'name': user},
                   'subjects': [{'kind': 'User', 'name': user, 'apiGroup': 'rbac.authorization.k8s.io'}]}
        rbac = '/apis/rbac.authorization.k8s.io/v1'
        if scope == 'namespace':
            admin.create(f'{rbac}/namespaces/{namespace}/roles', {**role, 'kind': 'Role'})
            admin.create(f'{rbac}/namespaces/{namespace}/rolebindings', {
                **binding, 'kind': 'RoleBinding',
                'roleRef': {'kind': 'Role', 'name': user, 'apiGroup': 'rbac.authorization.k8s.io'}})
        else:
            admin.create(f'{rbac}/clusterroles', {**role, 'kind': 'ClusterRole'})
            admin.create(f'{rbac}/clusterrolebindings', {
                **binding, 'kind': 'ClusterRoleBinding',
                'roleRef': {'kind': 'ClusterRole', 'name': user, 'apiGroup': 'rbac.authorization.k8s.io'}})


def make_registry(case: Case, namespace: str) -> OperatorRegistry:
    registry = OperatorRegistry()

    if case.feature == 'admission-managed':
        @kopf.on.startup(registry=registry)
        def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.admission.server = kopf.WebhookServer(host='127.0.0.1', addr='127.0.0.1', port=0)
            settings.admission.managed = f'{namespace}.auto.kopf.dev'

        @kopf.on.validate('kopfexamples', registry=registry)
        def check(**_: Any) -> None:
            pass

    @kopf.on.create('kopfexamples', registry=registry)
    def created(body: kopf.Body, **_: Any) -> str:
        kopf.info(body, reason='Handled', message='By the least-privileged operator.')
        return 'done'

    @kopf.on.startup(registry=registry)
    def fast(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.networking.error_backoffs = [0.1]
        settings.watching.reconnect_backoff = 0.1

    return registry


class Run(NamedTuple):
    runner: KopfRunner
    user: str
    url: str


def run_operator(case: Case, verbs: list[Verb], admin: Cluster, namespace: str, k8s_control_plane: Any,
                 tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, *,
                 until: Callable[[], None]) -> Run:
    """Run the case's operator as a fresh user with these verbs until the condition is met; then stop it."""
    user = f'rbac-{uuid.uuid4().hex[:8]}'
    grant(admin, namespace, user, verbs)
    path = k8s_control_plane.add_user(user, kubeconfig_path=tmp_path / 'user.kubeconfig')
    monkeypatch.setenv('KUBECONFIG', str(path))
    peering = {'apiVersion': 'kopf.dev/v1', 'metadata': {'name': namespace}}
    if case.feature == 'peering-namespaced':
        admin.create(f'/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings',
                     {**peering, 'kind': 'KopfPeering'})
    if case.feature == 'peering-cluster':
        admin.create('/apis/kopf.dev/v1/clusterkopfpeerings', {**peering, 'kind': 'ClusterKopfPeering'})
    args = ['run', '--verbose', *[arg.replace('NAMESPACE', namespace) for arg in case.args]]
    def created() -> None:
        try:
            admin.create(f'/apis/{KEX}/namespaces/{namespace}/kopfexamples',
                         {'apiVersion': KEX, 'kind': 'KopfExample', 'metadata': {'name': 'kex1'}})
        except ApiError as e:
            # An operator that fails at its start (e.g. denied the patching of its mutating webhooks) has its
            # validating webhook configured (failurePolicy: Fail) until its exit's clean-up: meanwhile, the
            # server refuses the writes that the going server does not review (e.g. "EOF"). Retried then.
            assert e.status != 500 or 'failed calling webhook' not in e.message, e
            raise

    with KopfRunner(args, registry=make_registry(case, namespace), reraise=False, timeout=WAIT) as runner:
        eventually(created, within=WAIT)
        eventually(until, within=WAIT)
    return Run(runner, user, str(k8s_control_plane.url).rstrip('/'))


@pytest.mark.parametrize('name', list(CASES))
def test_the_rules_are_enough(name: str, admin: Cluster, namespace: str, crds: None, k8s_control_plane: Any,
                              tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                              caplog: pytest.LogCaptureFixture) -> None:
    case = CASES[name]
    verbs = verbs_of(*case.base, case.feature)
    leases = f'/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases'

    def worked() -> None:
        obj = admin.get(f'/apis/{KEX}/namespaces/{namespace}/kopfexamples/kex1')
        assert obj.get('status', {}).get('created') == 'done', obj
        events = admin.items(f'/api/v1/namespaces/{namespace}/events')
        assert any(event.get('reason') == 'Handled' for event in events), events
        if case.feature == 'peering-namespaced':  # the operator's own record in the peering object
            peering = admin.get(f'/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/{namespace}')
            assert peering.get('status'), peering
        if case.feature == 'peering-cluster':
            assert admin.get(f'/apis/kopf.dev/v1/clusterkopfpeerings/{namespace}').get('status')
        if case.feature == 'lease':
            assert admin.get(f'{leases}/lead')['spec'].get('holderIdentity')
        if case.feature == 'sharding':  # all the shards held (by the only replica), and its member lease
            held = [lease for lease in admin.items(leases, labelSelector='kopf.dev/sharding=split')
                    if lease['spec'].get('holderIdentity')]
            assert len(held) >= 32 + 1, held
        if case.feature == 'admission-managed':  # the webhooks of the handlers, for the API server to call
            configs = '/apis/admissionregistration.k8s.io/v1/{}/' + f'{namespace}.auto.kopf.dev'
            assert admin.get(configs.format('validatingwebhookconfigurations'))['webhooks']
            assert admin.get(configs.format('mutatingwebhookconfigurations')) is not None  # no webhooks

    run = run_operator(case, verbs, admin, namespace, k8s_control_plane, tmp_path, monkeypatch, until=worked)
    assert run.runner.exit_code == 0
    assert 'Traceback' not in run.runner.output
    assert not [record.getMessage() for record in caplog.records if '403 Forbidden' in record.getMessage()]


RBAC_FIX = ("grant the RBAC permissions to the operator's user or service account "
            "(see https://docs.kopf.dev/en/stable/deployment/)")
KEXES = '{url}/apis/kopf.dev/v1/namespaces/{ns}/kopfexamples'
CRDS = ('The custom resource definitions cannot be watched, so the resources are scanned only once; '
        'the CRDs created or deleted later will not be noticed: HTTP 403 Forbidden for GET '
        '{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions: '
        'customresourcedefinitions.apiextensions.k8s.io is forbidden: {cluster-denial}')
PATCH = ('Throttling for {*} seconds: the API has denied the access: HTTP 403 Forbidden for PATCH '
         + KEXES + '/kex1{status}: kopfexamples.kopf.dev "kex1" is forbidden: {denial}; ' + RBAC_FIX + '.')
EVENTS = ('Request attempt #1 failed; will retry: POST /api/v1/namespaces/{ns}/events -> HTTP 403 Forbidden '
          'for POST {url}/api/v1/namespaces/{ns}/events: events is forbidden: {denial}, retrying in {*} s')
WATCHER = ('Watcher for kopfexamples.v1.kopf.dev@{where} has failed: HTTP 403 Forbidden for GET {kexes}: '
           'kopfexamples.kopf.dev is forbidden: {denial}; ' + RBAC_FIX + '; restarting in {*} seconds.')
PEERINGS = '{url}/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings'
MANDATORY = ("Multidimensional multitasker has failed: The mandatory peering '{ns}' cannot be used: "
             'HTTP 403 Forbidden for GET ' + PEERINGS + '{path}: kopfpeerings.kopf.dev{name} is forbidden: '
             '{denial}; grant the operator "get, list, watch, patch" on kopfpeerings.kopf.dev in its RBAC.')
ADMISSION_CREATE = ('Admission webhook manager has failed: HTTP 403 Forbidden for POST '
                    '{url}/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations: '
                    '{kind}webhookconfigurations.admissionregistration.k8s.io is forbidden: {cluster-denial}')
ADMISSION_PATCH = ('Admission webhook manager has failed: HTTP 403 Forbidden for PATCH '
                   '{url}/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations/{ns}.auto.kopf.dev'
                   ': {kind}webhookconfigurations.admissionregistration.k8s.io "{ns}.auto.kopf.dev" '
                   'is forbidden: {cluster-denial}')
SHARDS = (' (and 31 more of 32 leases of the shards; '  # all of them held by the only replica
          'the other replicas take them over when they expire)')
CLUSTER_PEERINGS = '{url}/apis/kopf.dev/v1/clusterkopfpeerings'
LEASES = '{url}/apis/coordination.k8s.io/v1/namespaces/{ns}/leases'

# (The peering objects are named as the tests' namespaces, so that other tests' operators never use them.)
# The line that the operator must log when one verb of a feature's rules is missing: exactly this line
# ({*} is a part that varies: a delay, a generated name), with no traceback anywhere.
EXPECTED: dict[tuple[str, str], str] = {
    ('handlers-namespaced', 'namespace:list:kopfexamples.kopf.dev'):
        WATCHER.replace('{where}', '{ns}').replace('{kexes}', KEXES),
    ('handlers-namespaced', 'namespace:watch:kopfexamples.kopf.dev'):
        WATCHER.replace('{where}', '{ns}').replace('{kexes}', KEXES),
    ('handlers-namespaced', 'namespace:patch:kopfexamples.kopf.dev'): PATCH.replace('{status}', ''),
    ('handlers-namespaced', 'namespace:patch:kopfexamples/status.kopf.dev'):
        PATCH.replace('{status}', '/status'),
    ('handlers-namespaced', 'namespace:create:events'): EVENTS,
    ('handlers-namespaced', 'cluster:list:customresourcedefinitions.apiextensions.k8s.io'): CRDS,
    ('handlers-namespaced', 'cluster:watch:customresourcedefinitions.apiextensions.k8s.io'): CRDS,
    ('handlers-cluster', 'cluster:list:kopfexamples.kopf.dev'): WATCHER.replace('{where}', 'None')
        .replace('{kexes}', '{url}/apis/kopf.dev/v1/kopfexamples').replace('{denial}', '{cluster-denial}'),
    ('handlers-cluster', 'cluster:watch:kopfexamples.kopf.dev'): WATCHER.replace('{where}', 'None')
        .replace('{kexes}', '{url}/apis/kopf.dev/v1/kopfexamples').replace('{denial}', '{cluster-denial}'),
    ('handlers-cluster', 'cluster:patch:kopfexamples.kopf.dev'): PATCH.replace('{status}', ''),
    ('handlers-cluster', 'cluster:patch:kopfexamples/status.kopf.dev'): PATCH.replace('{status}', '/status'),
    ('handlers-cluster', 'cluster:create:events'): EVENTS,
    ('handlers-cluster', 'cluster:list:customresourcedefinitions.apiextensions.k8s.io'): CRDS,
    ('handlers-cluster', 'cluster:watch:customresourcedefinitions.apiextensions.k8s.io'): CRDS,
    ('peering-namespaced', 'namespace:list:kopfpeerings.kopf.dev'):
        MANDATORY.replace('{path}', '').replace('{name}', ''),
    ('peering-namespaced', 'namespace:get:kopfpeerings.kopf.dev'):
        MANDATORY.replace('{path}', '/{ns}').replace('{name}', ' "{ns}"'),
    ('peering-namespaced', 'namespace:watch:kopfpeerings.kopf.dev'):
        "Watching the peering '{ns}' in '{ns}' has failed: HTTP 403 Forbidden for GET " + PEERINGS +
        ': kopfpeerings.kopf.dev is forbidden: {denial}; retrying in {*}',
    ('peering-cluster', 'cluster:list:clusterkopfpeerings.kopf.dev'): MANDATORY
        .replace('{path}', '').replace('{name}', '').replace('{denial}', '{cluster-denial}')
        .replace(PEERINGS, CLUSTER_PEERINGS).replace('kopfpeerings.kopf.dev', 'clusterkopfpeerings.kopf.dev'),
    ('peering-cluster', 'cluster:get:clusterkopfpeerings.kopf.dev'): MANDATORY
        .replace('{path}', '/{ns}').replace('{name}', ' "{ns}"').replace('{denial}', '{cluster-denial}')
        .replace(PEERINGS, CLUSTER_PEERINGS).replace('kopfpeerings.kopf.dev', 'clusterkopfpeerings.kopf.dev'),
    ('peering-cluster', 'cluster:watch:clusterkopfpeerings.kopf.dev'):
        "Watching the peering '{ns}' cluster-wide has failed: HTTP 403 Forbidden for GET "
        + CLUSTER_PEERINGS +
        ': clusterkopfpeerings.kopf.dev is forbidden: {cluster-denial}; retrying in {*}',
    ('peering-cluster', 'cluster:patch:clusterkopfpeerings.kopf.dev'):
        "Keep-alive in '{ns}' cluster-wide has failed: HTTP 403 Forbidden for PATCH " + CLUSTER_PEERINGS +
        '/{ns}: clusterkopfpeerings.kopf.dev "{ns}" is forbidden: {cluster-denial}',
    ('peering-namespaced', 'namespace:patch:kopfpeerings.kopf.dev'):
        "Keep-alive in '{ns}' in '{ns}' has failed: HTTP 403 Forbidden for PATCH " + PEERINGS +
        '/{ns}: kopfpeerings.kopf.dev "{ns}" is forbidden: {denial}',
    ('lease', 'namespace:get:leases.coordination.k8s.io'):
        'Lease election has failed: HTTP 403 Forbidden for GET ' + LEASES +
        '/lead: leases.coordination.k8s.io "lead" is forbidden: {denial}',
    ('lease', 'namespace:create:leases.coordination.k8s.io'):
        'Lease election has failed: HTTP 403 Forbidden for POST ' + LEASES +
        ': leases.coordination.k8s.io is forbidden: {denial}',
    # At the renewal or at the exit (releasing the lease), whichever comes first:
    ('lease', 'namespace:update:leases.coordination.k8s.io'):
        'Failed to release the lease {ns}/lead: HTTP 403 Forbidden for PUT ' + LEASES +
        '/lead: leases.coordination.k8s.io "lead" is forbidden: {denial}',
    ('sharding', 'namespace:get:leases.coordination.k8s.io'):
        'Failed to release the lease {ns}/split-shard-{*}: HTTP 403 Forbidden for GET ' + LEASES +
        '/split-shard-{*}: leases.coordination.k8s.io "split-shard-{*}" is forbidden: {denial}' + SHARDS,
    ('sharding', 'namespace:list:leases.coordination.k8s.io'):
        'Sharding has failed: HTTP 403 Forbidden for GET ' + LEASES +
        ': leases.coordination.k8s.io is forbidden: {denial}',
    ('sharding', 'namespace:create:leases.coordination.k8s.io'):
        'Sharding has failed: HTTP 403 Forbidden for POST ' + LEASES +
        ': leases.coordination.k8s.io is forbidden: {denial}',
    ('sharding', 'namespace:update:leases.coordination.k8s.io'):  # at the renewal or at the exit
        'Failed to release the lease {ns}/split-shard-{*}: HTTP 403 Forbidden for PUT ' + LEASES +
        '/split-shard-{*}: leases.coordination.k8s.io "split-shard-{*}" is forbidden: {denial}' + SHARDS,
    ('admission-managed', 'cluster:create:validatingwebhookconfigurations.admissionregistration.k8s.io'):
        ADMISSION_CREATE.replace('{kind}', 'validating'),
    ('admission-managed', 'cluster:patch:validatingwebhookconfigurations.admissionregistration.k8s.io'):
        ADMISSION_PATCH.replace('{kind}', 'validating'),
    ('admission-managed', 'cluster:create:mutatingwebhookconfigurations.admissionregistration.k8s.io'):
        ADMISSION_CREATE.replace('{kind}', 'mutating'),
    ('admission-managed', 'cluster:patch:mutatingwebhookconfigurations.admissionregistration.k8s.io'):
        ADMISSION_PATCH.replace('{kind}', 'mutating'),
    ('sharding', 'namespace:delete:leases.coordination.k8s.io'):
        'Failed to delete the member lease {ns}/split-member-{*}: HTTP 403 Forbidden for DELETE ' + LEASES +
        '/split-member-{*}: leases.coordination.k8s.io "split-member-{*}" is forbidden: {denial}',
}
MISSING = [(name, verb) for name, case in CASES.items() for verb in verbs_of(case.feature)]


def test_every_missing_verb_has_its_expected_line() -> None:
    assert sorted((name, str(verb)) for name, verb in MISSING) == sorted(EXPECTED)


def expected_line(template: str, *, missing: Verb, user: str, namespace: str, url: str) -> re.Pattern[str]:
    # The denials name the namespace of the object or of the list (also for a missing verb of a ClusterRole).
    denial = (f'User "{user}" cannot {missing.verb} resource "{missing.resource}" '
              f'in API group "{missing.group}"')
    text = (template.replace('{url}', url).replace('{denial}', f'{denial} in the namespace "{namespace}"')
            .replace('{cluster-denial}', f'{denial} at the cluster scope').replace('{ns}', namespace))
    return re.compile(re.escape(text).replace(re.escape('{*}'), '[^ "/:]+'))


@pytest.mark.parametrize('name, missing', MISSING, ids=[f'{name}-{verb}' for name, verb in MISSING])
def test_a_missing_verb_is_named(name: str, missing: Verb, admin: Cluster, namespace: str, crds: None,
                                 k8s_control_plane: Any, tmp_path: pathlib.Path,
                                 monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    case = CASES[name]
    verbs = [verb for verb in verbs_of(*case.base, case.feature) if verb != missing]
    denied = f'cannot {missing.verb} resource "{missing.resource}"'

    def said_or_handled() -> None:  # some denials come only at the exit (e.g. releasing the leases)
        obj = admin.get(f'/apis/{KEX}/namespaces/{namespace}/kopfexamples/kex1') or {}
        assert denied in caplog.text or obj.get('status', {}).get('created') == 'done'

    run = run_operator(case, verbs, admin, namespace, k8s_control_plane, tmp_path, monkeypatch,
                       until=said_or_handled)
    pattern = expected_line(EXPECTED[name, str(missing)], missing=missing, user=run.user,
                            namespace=namespace, url=run.url)
    messages = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    named = [message for message in messages if denied in message]
    # The cluster-wide operators also see the objects of other tests (their namespaces go away slowly).
    assert any(pattern.fullmatch(message) for message in named), named or f'{missing} is not named.'
    if case.feature == 'sharding':  # e.g. the releasing of the shards' leases: not a line per lease
        assert len(named) <= 2, named
    assert not any(record.exc_info for record in caplog.records)
    assert 'Traceback' not in run.runner.output
    if run.runner.exit_code != 0:  # the operator has given up (e.g. on its lease): the last line says why
        last_line = run.runner.stderr.splitlines()[-1]
        assert last_line.startswith('Error: ') and denied in last_line, last_line
