"""
The common built-in kinds as real kube-apiservers store them: defaults, conversions, initial statuses.

Shared by the emulator's own tests (``tests/emulator/test_builtins.py``) and the fidelity tests
(``tests/kubeapi/test_fidelity.py``, on both the emulator and a real kube-apiserver v1.37, as
``kopf.testing.KubernetesControlPlane`` starts it), so that the former's expectations are the real
server's. What the servers allocate (cluster IPs, node ports, the Jobs' uids) is normalised away.
"""
import re
from typing import Any, NamedTuple

_IP = re.compile(r'^(\d+\.){3}\d+$')


class Case(NamedTuple):
    id: str
    path: str  # under the namespace, e.g. "pods" or "apps/deployments" (group/plural)
    body: dict[str, Any]
    code: int
    expected: dict[str, Any]  # the stored object without its metadata, or the Status's message


def url(namespace: str, path: str, name: str = '') -> str:
    group, _, plural = path.rpartition('/')
    base = f'/apis/{group}/v1' if group else '/api/v1'
    return f'{base}/namespaces/{namespace}/{plural}' + (f'/{name}' if name else '')


def normalised(body: Any) -> Any:
    """The object without its metadata (and apiVersion/kind); allocated IPs, ports & uids as markers."""
    def walk(value: Any, key: str = '') -> Any:
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, key) for v in value]
        if key in ('clusterIP', 'clusterIPs') and isinstance(value, str) and _IP.match(value):
            return '<ip>'
        if key == 'nodePort':
            return '<port>'
        if key.endswith('controller-uid'):
            return '<uid>'
        return value
    return {k: walk(v) for k, v in body.items() if k not in ('metadata', 'apiVersion', 'kind')}


def check(case: Case, code: int, body: Any) -> None:
    if case.code < 300:
        assert (code, normalised(body)) == (case.code, case.expected), body
    else:
        assert (code, body.get('message')) == (case.code, case.expected['message']), body


_CONTAINER_DEFAULTS = {'resources': {}, 'terminationMessagePath': '/dev/termination-log',
                       'terminationMessagePolicy': 'File'}
_POD_SPEC_DEFAULTS = {'dnsPolicy': 'ClusterFirst', 'restartPolicy': 'Always',
                      'schedulerName': 'default-scheduler', 'securityContext': {},
                      'terminationGracePeriodSeconds': 30}
_POD_ONLY_DEFAULTS = {
    'enableServiceLinks': True, 'preemptionPolicy': 'PreemptLowerPriority', 'priority': 0,
    'tolerations': [{'effect': 'NoExecute', 'key': f'node.kubernetes.io/{condition}', 'operator': 'Exists',
                     'tolerationSeconds': 300} for condition in ('not-ready', 'unreachable')],
}
_CONTAINER = {'name': 'c', 'image': 'nginx:1.25', 'ports': [{'containerPort': 80}]}
_TEMPLATE = {'metadata': {'labels': {'a': 'b'}}, 'spec': {'containers': [_CONTAINER]}}
_TEMPLATE_STORED = {'metadata': {'labels': {'a': 'b'}}, 'spec': {**_POD_SPEC_DEFAULTS, 'containers': [{
    **_CONTAINER, 'imagePullPolicy': 'IfNotPresent', 'ports': [{'containerPort': 80, 'protocol': 'TCP'}],
    **_CONTAINER_DEFAULTS}]}}
_SELECTOR = {'matchLabels': {'a': 'b'}}
_LIMITS = {'cpu': '1', 'memory': '1Gi'}
_DIGEST = 'busybox@sha256:' + 'a' * 64


def _obj(api_version: str, kind: str, name: str, **fields: Any) -> dict[str, Any]:
    return {'apiVersion': api_version, 'kind': kind, 'metadata': {'name': name}, **fields}


def _pod(name: str, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return _obj('v1', 'Pod', name, spec={'containers': list(containers), **spec})


def _stored_pod(*containers: dict[str, Any], qos: str = 'BestEffort', **spec: Any) -> dict[str, Any]:
    return {'spec': {**_POD_SPEC_DEFAULTS, **_POD_ONLY_DEFAULTS, 'containers': list(containers), **spec},
            'status': {'phase': 'Pending', 'qosClass': qos}}


def _stored_container(image: str, pull: str, name: str = 'c', **fields: Any) -> dict[str, Any]:
    return {'name': name, 'image': image, 'imagePullPolicy': pull, **_CONTAINER_DEFAULTS, **fields}


def _workload(kind: str, name: str) -> dict[str, Any]:
    return _obj('apps/v1', kind, name, spec={'selector': _SELECTOR, 'template': _TEMPLATE})


def _service(name: str, **spec: Any) -> dict[str, Any]:
    return _obj('v1', 'Service', name, spec=spec)


def _stored_service(kind: str, *ports: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {'spec': {**_SERVICE_DEFAULTS, 'type': kind, 'ports': list(ports), **spec},
            'status': {'loadBalancer': {}}}


def _invalid(message: str) -> dict[str, Any]:
    return {'message': message}


def _undecodable(kind: str, problem: str) -> dict[str, Any]:
    return {'message': f'{kind} in version "v1" cannot be handled as a {kind}: {problem}'}


_SERVICE_DEFAULTS = {'sessionAffinity': 'None', 'internalTrafficPolicy': 'Cluster', 'clusterIP': '<ip>',
                     'clusterIPs': ['<ip>'], 'ipFamilies': ['IPv4'], 'ipFamilyPolicy': 'SingleStack'}
_ROLLING = {'type': 'RollingUpdate'}
_JOB_LABELS = {'batch.kubernetes.io/controller-uid': '<uid>', 'batch.kubernetes.io/job-name': 'j1',
               'controller-uid': '<uid>', 'job-name': 'j1'}
_JOB_DEFAULTS = {'backoffLimit': 6, 'completionMode': 'NonIndexed', 'completions': 1, 'manualSelector': False,
                 'parallelism': 1, 'podReplacementPolicy': 'TerminatingOrFailed', 'suspend': False}
_UID = '<uid>'
_PORT_80 = {'port': 80, 'protocol': 'TCP', 'targetPort': 80}
_JOB_POD = {'restartPolicy': 'Never', 'containers': [{'name': 'c', 'image': 'busybox'}]}

CASES: list[Case] = [
    Case('pod', 'pods', _pod('p1', {'name': 'c', 'image': 'nginx'}), 201,
         _stored_pod(_stored_container('nginx', 'Always'))),
    Case('pod-resources', 'pods', _pod(
        'p2', {'name': 'c', 'image': 'nginx:latest', 'resources': {'limits': _LIMITS}},
        initContainers=[{'name': 'i', 'image': _DIGEST}]), 201, _stored_pod(
        _stored_container('nginx:latest', 'Always', resources={'limits': _LIMITS, 'requests': _LIMITS}),
        initContainers=[_stored_container(_DIGEST, 'IfNotPresent', 'i')], qos='Burstable')),
    Case('pod-guaranteed', 'pods', _pod(
        'p3', {'name': 'c', 'image': 'reg:5000/nginx', 'resources': {'limits': _LIMITS}}), 201, _stored_pod(
        _stored_container('reg:5000/nginx', 'Always', resources={'limits': _LIMITS, 'requests': _LIMITS}),
        qos='Guaranteed')),
    Case('event-elsewhere', 'events', _obj('v1', 'Event', 'e1', involvedObject={
        'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': 'x', 'namespace': 'elsewhere'}), 422, {
        'message': 'Event "e1" is invalid: involvedObject.namespace: Invalid value: "elsewhere": '
                   'does not match event.namespace'}),
    Case('secret-tls-incomplete', 'secrets', _obj('v1', 'Secret', 's1', type='kubernetes.io/tls', data={
        'tls.crt': 'eA=='}), 422, {'message': 'Secret "s1" is invalid: data[tls.key]: Required value'}),
    Case('secret-basic-auth-empty', 'secrets', _obj('v1', 'Secret', 's2', type='kubernetes.io/basic-auth'),
         422, {'message': 'Secret "s2" is invalid: [data[username]: Required value, '
                          'data[password]: Required value]'}),
    Case('secret-docker-config', 'secrets', _obj('v1', 'Secret', 's3', type='kubernetes.io/dockerconfigjson'),
         422, {'message': 'Secret "s3" is invalid: data[.dockerconfigjson]: Required value'}),
    Case('secret-ssh-auth', 'secrets', _obj('v1', 'Secret', 's4', type='kubernetes.io/ssh-auth', data={}),
         422, {'message': 'Secret "s4" is invalid: data[ssh-privatekey]: Required value'}),
    Case('pod-without-containers', 'pods', _obj('v1', 'Pod', 'p4', spec={}), 422,
         _invalid('Pod "p4" is invalid: spec.containers: Required value')),
    Case('pod-without-image', 'pods', _pod('p5', {'name': 'c'}), 422,
         _invalid('Pod "p5" is invalid: spec.containers[0].image: Required value')),
    Case('pod-duplicate-names', 'pods', _pod('p6', {'name': 'c', 'image': 'x'},
                                             initContainers=[{'name': 'c', 'image': 'y'}]), 422,
         _invalid('Pod "p6" is invalid: spec.initContainers[0].name: Duplicate value: "c"')),
    Case('deployment', 'apps/deployments', _workload('Deployment', 'd1'), 201, {
        'spec': {'progressDeadlineSeconds': 600, 'replicas': 1, 'revisionHistoryLimit': 10,
                 'selector': _SELECTOR, 'template': _TEMPLATE_STORED,
                 'strategy': {**_ROLLING, 'rollingUpdate': {'maxSurge': '25%', 'maxUnavailable': '25%'}}},
        'status': {}}),
    Case('deployment-invalid', 'apps/deployments', _obj('apps/v1', 'Deployment', 'd2', spec={}), 422,
         _invalid(
             'Deployment.apps "d2" is invalid: [spec.selector: Required value, '
             'spec.template.metadata.labels: Invalid value: null: '
             '`selector` does not match template `labels`, '
             'spec.template.spec.containers: Required value]')),
    Case('statefulset', 'apps/statefulsets', _workload('StatefulSet', 's1'), 201, {
        'spec': {'persistentVolumeClaimRetentionPolicy': {'whenDeleted': 'Retain', 'whenScaled': 'Retain'},
                 'podManagementPolicy': 'OrderedReady', 'replicas': 1, 'revisionHistoryLimit': 10,
                 'selector': _SELECTOR, 'serviceName': '', 'template': _TEMPLATE_STORED,
                 'updateStrategy': {**_ROLLING, 'rollingUpdate': {'maxUnavailable': 1, 'partition': 0}}},
        'status': {'availableReplicas': 0, 'replicas': 0}}),
    Case('daemonset', 'apps/daemonsets', _workload('DaemonSet', 'ds1'), 201, {
        'spec': {'revisionHistoryLimit': 10, 'selector': _SELECTOR, 'template': _TEMPLATE_STORED,
                 'updateStrategy': {**_ROLLING, 'rollingUpdate': {'maxSurge': 0, 'maxUnavailable': 1}}},
        'status': {'currentNumberScheduled': 0, 'desiredNumberScheduled': 0, 'numberMisscheduled': 0,
                   'numberReady': 0}}),
    Case('replicaset', 'apps/replicasets', _workload('ReplicaSet', 'rs1'), 201, {
        'spec': {'replicas': 1, 'selector': _SELECTOR, 'template': _TEMPLATE_STORED},
        'status': {'replicas': 0}}),
    Case('job', 'batch/jobs', _obj('batch/v1', 'Job', 'j1', spec={'template': {'spec': _JOB_POD}}), 201, {
        'spec': {**_JOB_DEFAULTS, 'selector': {'matchLabels': {'batch.kubernetes.io/controller-uid': _UID}},
                 'template': {'metadata': {'labels': _JOB_LABELS}, 'spec': {
                     **_POD_SPEC_DEFAULTS, 'restartPolicy': 'Never',
                     'containers': [_stored_container('busybox', 'Always')]}}},
        'status': {}}),
    Case('job-restart-policy', 'batch/jobs', _obj('batch/v1', 'Job', 'j2', spec={'template': {'spec': {
        'containers': [{'name': 'c', 'image': 'busybox'}]}}}), 422, _invalid(
        'Job.batch "j2" is invalid: spec.template.spec.restartPolicy: Required value: '
        'valid values: "OnFailure", "Never"')),
    Case('service', 'services', _service('svc1', selector={'a': 'b'}, ports=[{'port': 80}]), 201,
         _stored_service('ClusterIP', _PORT_80, selector={'a': 'b'})),
    Case('service-node-port', 'services', _service(
        'svc2', type='NodePort', ports=[{'port': 80, 'targetPort': 'http', 'name': 'h'}]), 201,
        _stored_service(
        'NodePort', {'name': 'h', 'nodePort': '<port>', 'port': 80, 'protocol': 'TCP', 'targetPort': 'http'},
        externalTrafficPolicy='Cluster')),
    Case('service-load-balancer', 'services', _service(
        'svc3', type='LoadBalancer', ports=[{'port': 53, 'protocol': 'UDP'}]), 201, _stored_service(
        'LoadBalancer', {'nodePort': '<port>', 'port': 53, 'protocol': 'UDP', 'targetPort': 53},
        externalTrafficPolicy='Cluster', allocateLoadBalancerNodePorts=True)),
    Case('service-headless', 'services', _service('svc4', clusterIP='None', ports=[{'port': 80}]), 201,
         _stored_service('ClusterIP', _PORT_80, clusterIP='None', clusterIPs=['None'],
                         ipFamilies=['IPv4', 'IPv6'], ipFamilyPolicy='RequireDualStack')),
    Case('service-external-name', 'services', _service(
        'svc5', type='ExternalName', externalName='example.com'), 201, {
        'spec': {'externalName': 'example.com', 'sessionAffinity': 'None', 'type': 'ExternalName'},
        'status': {'loadBalancer': {}}}),
    Case('service-without-ports', 'services', _service('svc6', selector={'a': 'b'}), 422,
         _invalid('Service "svc6" is invalid: spec.ports: Required value')),
    Case('secret', 'secrets', _obj('v1', 'Secret', 'sec1', type='kubernetes.io/basic-auth',
                                   data={'username': 'YQ==', 'password': 'eA=='},
                                   stringData={'password': 'y'}), 201, {
        'type': 'kubernetes.io/basic-auth', 'data': {'username': 'YQ==', 'password': 'eQ=='}}),
    Case('secret-opaque', 'secrets', _obj('v1', 'Secret', 'sec2', stringData={'a': 'b'}), 201, {
        'type': 'Opaque', 'data': {'a': 'Yg=='}}),
    Case('secret-not-base64', 'secrets', _obj('v1', 'Secret', 'sec3', data={'a': '***'}), 400,
         _undecodable('Secret', 'illegal base64 data at input byte 0')),
    Case('configmap-not-strings', 'configmaps', _obj('v1', 'ConfigMap', 'cm1', data={'a': 1}), 400,
         _undecodable('ConfigMap', 'json: cannot unmarshal number into Go struct field ConfigMap.data '
                                   'of type string')),
    Case('claim', 'persistentvolumeclaims', _obj('v1', 'PersistentVolumeClaim', 'pvc1', spec={
        'accessModes': ['ReadWriteOnce'], 'resources': {'requests': {'storage': '1Gi'}}}), 201, {
        'spec': {'accessModes': ['ReadWriteOnce'], 'resources': {'requests': {'storage': '1Gi'}},
                 'volumeMode': 'Filesystem'},
        'status': {'phase': 'Pending'}}),
]


def _stripped_deployment(created: dict[str, Any]) -> tuple[str, Any, str]:
    spec = {k: v for k, v in created['spec'].items() if k not in ('strategy', 'replicas')}
    template = {**spec['template'], 'spec': {'containers': [{'name': 'c', 'image': 'x'}]}}
    return 'PUT', {**created, 'spec': {**spec, 'template': template}}, 'application/json'


# The changes of created objects (by the ids of the cases above), and what the servers make of them.
UPDATES = [
    ('deployment', _stripped_deployment),
    ('secret-opaque', lambda created: ('PATCH', {'stringData': {'z': 'q'}}, 'application/merge-patch+json')),
    ('service-node-port', lambda created: ('PATCH', {'spec': {'selector': {'x': 'y'}}},
                                           'application/merge-patch+json')),
]


def check_update(case_id: str, created: dict[str, Any], code: int, body: Any) -> None:
    assert code == 200, body
    if case_id == 'deployment':
        assert body['spec']['replicas'] == 1
        assert body['spec']['strategy'] == {'rollingUpdate': {'maxSurge': '25%', 'maxUnavailable': '25%'},
                                            'type': 'RollingUpdate'}
        assert body['spec']['template']['spec'] == {**_POD_SPEC_DEFAULTS, 'containers': [
            {'name': 'c', 'image': 'x', 'imagePullPolicy': 'Always', **_CONTAINER_DEFAULTS}]}
    elif case_id == 'secret-opaque':
        assert (body['data'], 'stringData' in body) == ({'a': 'Yg==', 'z': 'cQ=='}, False)
    elif case_id == 'service-node-port':
        assert body['spec']['selector'] == {'x': 'y'}
        assert body['spec']['clusterIP'] == created['spec']['clusterIP']
        assert body['spec']['ports'] == created['spec']['ports']


class Change(NamedTuple):
    """A merge-patch of a new object, and what a real server answers: 200, or 422 with these causes."""
    id: str
    path: str
    body: dict[str, Any]
    patch: dict[str, Any]
    causes: list[tuple[str, str, str]]  # the field, the reason, the message (``*``: Go's internals, any text)


_IMMUTABLE_WHEN_SET = 'Forbidden: field is immutable when `immutable` is set'
_POD_UPDATES = ('Forbidden: pod updates may not change fields other than `spec.containers[*].image`,'
                '`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only '
                'additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be '
                'set to 1 if it was previously negative)*')
_CLAIM_UPDATES = ('Forbidden: spec is immutable after creation except resources.requests and '
                  'volumeAttributesClassName for bound claims*')
_TEMPLATE = {'metadata': {'labels': {'app': 'a', 'x': 'y'}},
             'spec': {'containers': [{'name': 'c', 'image': 'x'}]}}
_WORKLOAD_SPEC = {'selector': {'matchLabels': {'app': 'a'}}, 'template': _TEMPLATE}
_CLAIM_SPEC = {'accessModes': ['ReadWriteOnce'], 'resources': {'requests': {'storage': '1Gi'}}}
_FORBIDDEN, _INVALID = 'FieldValueForbidden', 'FieldValueInvalid'

CHANGES: list[Change] = [
    Change('configmap-data', 'configmaps', _obj('v1', 'ConfigMap', 'c1', data={'a': '1'}, immutable=True),
           {'data': {'a': '2'}}, [('data', _FORBIDDEN, _IMMUTABLE_WHEN_SET)]),
    Change('configmap-binary-data', 'configmaps', _obj('v1', 'ConfigMap', 'c2', immutable=True),
           {'binaryData': {'b': 'AA=='}}, [('binaryData', _FORBIDDEN, _IMMUTABLE_WHEN_SET)]),
    Change('configmap-mutable-again', 'configmaps', _obj('v1', 'ConfigMap', 'c3', immutable=True),
           {'immutable': False}, [('immutable', _FORBIDDEN, _IMMUTABLE_WHEN_SET)]),
    Change('configmap-labels', 'configmaps', _obj('v1', 'ConfigMap', 'c4', data={'a': '1'}, immutable=True),
           {'metadata': {'labels': {'a': 'b'}}}, []),
    Change('secret-type', 'secrets', _obj('v1', 'Secret', 's1', data={'a': 'AA=='}),
           {'type': 'example.com/other'},
           [('type', _INVALID, 'Invalid value: "example.com/other": field is immutable')]),
    Change('secret-string-data', 'secrets', _obj('v1', 'Secret', 's2', data={'a': 'AA=='}, immutable=True),
           {'stringData': {'z': 'x'}}, [('data', _FORBIDDEN, _IMMUTABLE_WHEN_SET)]),
    Change('deployment-selector', 'apps/deployments',
           _obj('apps/v1', 'Deployment', 'd1', spec=_WORKLOAD_SPEC),
           {'spec': {'selector': {'matchLabels': {'app': 'a', 'x': 'y'}}}}, [(
               'spec.selector', _INVALID,
               'Invalid value: {"matchLabels":{"app":"a","x":"y"}}: field is immutable')]),
    Change('deployment-replicas', 'apps/deployments',
           _obj('apps/v1', 'Deployment', 'd2', spec=_WORKLOAD_SPEC), {'spec': {'replicas': 3}}, []),
    Change('statefulset-service', 'apps/statefulsets', _obj('apps/v1', 'StatefulSet', 'ss1', spec={
        **_WORKLOAD_SPEC, 'serviceName': 's'}), {'spec': {'serviceName': 't'}},
           [('spec.serviceName', _INVALID, 'Invalid value: "t": field is immutable')]),
    Change('statefulset-claims', 'apps/statefulsets', _obj('apps/v1', 'StatefulSet', 'ss2', spec={
        **_WORKLOAD_SPEC, 'serviceName': 's'}), {'spec': {'volumeClaimTemplates': [
            {'metadata': {'name': 'v'}, 'spec': _CLAIM_SPEC}]}},
           [('spec.volumeClaimTemplates', _INVALID, 'Invalid value: [*]: field is immutable')]),
    Change('statefulset-template', 'apps/statefulsets', _obj('apps/v1', 'StatefulSet', 'ss3', spec={
        **_WORKLOAD_SPEC, 'serviceName': 's'}), {'spec': {'replicas': 2, 'template': {'metadata': {
            'annotations': {'a': 'b'}}}}}, []),
    Change('job-template', 'batch/jobs', _obj('batch/v1', 'Job', 'j1', spec={'template': {'spec': {
        'containers': [{'name': 'c', 'image': 'x'}], 'restartPolicy': 'Never'}}}),
           {'spec': {'template': {'metadata': {'annotations': {'a': 'b'}}}}},
           [('spec.template', _INVALID, 'Invalid value: {*}: field is immutable')]),
    Change('job-parallelism', 'batch/jobs', _obj('batch/v1', 'Job', 'j2', spec={'template': {'spec': {
        'containers': [{'name': 'c', 'image': 'x'}], 'restartPolicy': 'Never'}}}),
           {'spec': {'parallelism': 2}}, []),
    Change('service-cluster-ip', 'services', _obj('v1', 'Service', 'svc1', spec={'ports': [{'port': 80}]}),
           {'spec': {'clusterIP': '10.96.255.250', 'clusterIPs': ['10.96.255.250']}},
           [('spec.clusterIPs[0]', _INVALID, 'Invalid value: ["10.96.255.250"]: may not change once set')]),
    Change('pod-image', 'pods', _pod('p1', {'name': 'c', 'image': 'nginx'}),
           {'spec': {'containers': [{'name': 'c', 'image': 'alpine'}]}}, []),
    Change('pod-env', 'pods', _pod('p2', {'name': 'c', 'image': 'nginx'}),
           {'spec': {'containers': [{'name': 'c', 'image': 'nginx', 'env': [{'name': 'A', 'value': 'b'}]}]}},
           [('spec', _FORBIDDEN, _POD_UPDATES)]),
    Change('pvc-modes', 'persistentvolumeclaims',
           _obj('v1', 'PersistentVolumeClaim', 'pvc1', spec=_CLAIM_SPEC),
           {'spec': {'accessModes': ['ReadWriteMany']}}, [('spec', _FORBIDDEN, _CLAIM_UPDATES)]),
    Change('pvc-size-unbound', 'persistentvolumeclaims',
           _obj('v1', 'PersistentVolumeClaim', 'pvc2', spec=_CLAIM_SPEC),
           {'spec': {'resources': {'requests': {'storage': '2Gi'}}}}, [('spec', _FORBIDDEN, _CLAIM_UPDATES)]),
]


def check_change(change: Change, code: int, body: Any) -> None:
    if not change.causes:
        assert code == 200, body
        return
    causes = [(cause['field'], cause['reason'], cause['message']) for cause in body['details']['causes']]
    assert (code, [(field, reason) for field, reason, _ in causes]) == \
        (422, [(field, reason) for field, reason, _ in change.causes]), body
    for (_, _, message), (_, _, pattern) in zip(causes, change.causes, strict=True):
        regex = '.*'.join(re.escape(part) for part in pattern.split('*'))
        assert re.fullmatch(regex, message, re.DOTALL), (message, pattern)
