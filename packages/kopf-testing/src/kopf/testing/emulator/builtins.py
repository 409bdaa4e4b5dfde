"""
What real API servers do to the objects of the common built-in kinds when they are written.

Operators create Pods, Deployments, Services, Secrets & co. as children, and often compare them with
what they want: on a real server, the stored objects have the server's defaults (and a Secret's
``stringData`` is in its ``data``), so such comparisons must allow for them. The emulator does the same
as kube-apiserver v1.37 (as started by ``kopf.testing.KubernetesControlPlane``, with its default
admission plugins), for these kinds only:

* **defaults**: the pods' and the pod templates' specs (the restart & DNS policies, the scheduler,
  the grace period; the containers' pull policy by the image's tag, termination message, ports'
  protocols; for Pods also the priority, the service links, the not-ready/unreachable tolerations and
  their resource requests from the limits); the workloads' replicas, strategies and history limits;
  the Jobs' completions, parallelism, backoff limit and their own selector and labels; the Services'
  types, ports, policies, IP families, a cluster IP (from 10.96.0.0/16) and node ports (30000-32767);
  the PersistentVolumeClaims' volume mode; the Secrets' type;
* **conversions**: a Secret's ``stringData`` merged into its ``data`` (base64);
* **statuses**: the initial status of a new object (e.g. a Pod ``Pending``, with its QoS class);
* **checks**: the fields without which these kinds are invalid (422, in the servers' wording), the
  values that do not decode (400: non-string data of ConfigMaps, non-base64 data of Secrets), the data
  that a Secret's type requires (e.g. ``tls.key``), and an Event's namespace (its object's);
* **updates**: what cannot change once set (422): the data of immutable ConfigMaps and Secrets, a
  Secret's type, the workloads' selectors, a StatefulSet's service name, pod management policy and
  claim templates, a Job's template, a Service's cluster IP, a Pod's spec beyond its images, deadline
  and new tolerations, a claim's spec (a bound claim's requests: 403, as no StorageClass allows it);
* **pruning**: the unknown top-level fields of all the emulated built-in kinds (and of ``metadata``).

The rest of the built-in kinds' fields are stored as given (no full Go-type validation).
"""
import base64
import binascii
import ipaddress
import itertools
import json
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kopf.testing.emulator import selectors
from kopf.testing.emulator.errors import Cause, undecodable
from kopf.testing.emulator.validation import go_value, json_type_name, prune_metadata

Body = dict[str, Any]

_POD_TOLERATIONS = [
    {'key': f'node.kubernetes.io/{condition}', 'operator': 'Exists', 'effect': 'NoExecute',
     'tolerationSeconds': 300}
    for condition in ('not-ready', 'unreachable')
]
_NODE_PORTS = (30000, 32767)


class Allocator:
    """The cluster IPs and node ports of Services, unique while the emulator runs."""

    def __init__(self) -> None:
        self._addresses = (str(ipaddress.ip_address('10.96.0.0') + offset) for offset in itertools.count(10))
        self._node_ports: set[int] = set()

    def cluster_ip(self) -> str:
        return next(self._addresses)

    def node_port(self) -> int:
        while True:  # a random one, as real servers pick them
            port = random.randint(*_NODE_PORTS)
            if port not in self._node_ports:
                self._node_ports.add(port)
                return port


# ----------------------------------------------------------------------------------------------------
# Decoding: the values that real servers cannot decode into the Go types (400).

# The kinds' own top-level fields (besides apiVersion, kind, metadata): the others are pruned.
_SPEC_AND_STATUS = frozenset({'spec', 'status'})
_FIELDS: dict[tuple[str, str], frozenset[str]] = {
    **{('', plural): _SPEC_AND_STATUS for plural in (
        'namespaces', 'pods', 'services', 'persistentvolumeclaims', 'persistentvolumes', 'nodes')},
    **{('apps', plural): _SPEC_AND_STATUS for plural in (
        'deployments', 'statefulsets', 'daemonsets', 'replicasets')},
    ('batch', 'jobs'): _SPEC_AND_STATUS,
    ('apiextensions.k8s.io', 'customresourcedefinitions'): _SPEC_AND_STATUS,
    ('coordination.k8s.io', 'leases'): frozenset({'spec'}),
    ('', 'configmaps'): frozenset({'data', 'binaryData', 'immutable'}),
    ('', 'secrets'): frozenset({'data', 'stringData', 'type', 'immutable'}),
    ('', 'serviceaccounts'): frozenset({'secrets', 'imagePullSecrets', 'automountServiceAccountToken'}),
    ('', 'events'): frozenset({
        'involvedObject', 'reason', 'message', 'source', 'firstTimestamp', 'lastTimestamp', 'count', 'type',
        'eventTime', 'series', 'action', 'related', 'reportingComponent', 'reportingInstance'}),
    ('events.k8s.io', 'events'): frozenset({
        'eventTime', 'series', 'reportingController', 'reportingInstance', 'action', 'reason', 'regarding',
        'related', 'note', 'type', 'deprecatedSource', 'deprecatedFirstTimestamp', 'deprecatedLastTimestamp',
        'deprecatedCount'}),
    ('admissionregistration.k8s.io', 'validatingwebhookconfigurations'): frozenset({'webhooks'}),
    ('admissionregistration.k8s.io', 'mutatingwebhookconfigurations'): frozenset({'webhooks'}),
}
_ROOT = frozenset({'apiVersion', 'kind', 'metadata'})


_KNOWN = {key: fields | _ROOT for key, fields in _FIELDS.items()}


def top_fields(group: str, plural: str) -> frozenset[str] | None:
    """The kind's top-level fields (incl. apiVersion, kind, metadata), if known here."""
    return _KNOWN.get((group, plural))


def prune(plural: str, group: str, body: Body) -> tuple[Body, list[str]]:
    """
    The object with its kind's top-level fields and ObjectMeta's only, and the others' paths.

    As real servers decode the built-in kinds: the unknown fields in the order of the body (the
    kinds' deeper fields are not checked here).
    """
    known = _KNOWN.get((group, plural))
    unknown: list[str] = []
    result: Body | None = None
    for key, value in body.items():
        if key == 'metadata' and isinstance(value, dict):
            metadata = prune_metadata(value, unknown)
            if metadata is not value:
                result = dict(body) if result is None else result
                result['metadata'] = metadata
        elif known is not None and key not in known:
            unknown.append(key)
            result = dict(body) if result is None else result
            del result[key]
    return body if result is None else result, unknown


def check_decodable(plural: str, group: str, kind: str, version: str, body: Mapping[str, Any]) -> None:
    if group == '' and plural == 'configmaps':
        for field in ('data', 'binaryData'):
            values = body.get(field)
            for value in (values.values() if isinstance(values, dict) else ()):
                if value is not None and not isinstance(value, str):
                    go_type = 'string' if field == 'data' else '[]uint8'
                    given = json_type_name(value)
                    raise undecodable(kind, version, f'json: cannot unmarshal {given} into Go struct field '
                                                     f'ConfigMap.{field} of type {go_type}')
    elif group == '' and plural == 'secrets':
        values = body.get('data')
        for value in (values.values() if isinstance(values, dict) else ()):
            if isinstance(value, str):
                problem = _base64_problem(value)
                if problem is not None:
                    raise undecodable(kind, version, problem)


def _base64_problem(value: str) -> str | None:
    try:
        base64.b64decode(value.encode('ascii'), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        position = next((index for index, char in enumerate(value)
                         if not (char.isascii() and (char.isalnum() or char in '+/='))), 0)
        return f'illegal base64 data at input byte {position}'
    return None


# ----------------------------------------------------------------------------------------------------
# Defaults and conversions: on every creation and update, as real servers do (copies, never in place).

def prepare(plural: str, group: str, body: Body, *, allocator: Allocator, creating: bool,
            old: Mapping[str, Any] | None = None) -> Body:
    """The object with the server's defaults and conversions (a new dict if anything changes)."""
    preparer = _PREPARERS.get((group, plural))
    if preparer is None:
        return body
    body = json.loads(json.dumps(body))  # deep: the defaults go deep into the objects
    preparer(body, allocator, creating, old)
    return body


def _pod(body: Body, allocator: Allocator, creating: bool, old: Mapping[str, Any] | None) -> None:
    spec = _dict(body, 'spec')
    _pod_spec(spec)
    spec.setdefault('enableServiceLinks', True)
    for container in _containers(spec):
        resources = container.get('resources')
        if isinstance(resources, dict) and isinstance(resources.get('limits'), dict):
            requests = resources.setdefault('requests', {})
            if isinstance(requests, dict):
                for name, value in resources['limits'].items():
                    requests.setdefault(name, value)
    if creating:  # by the admission plugins (Priority, DefaultTolerationSeconds): only for new pods
        spec.setdefault('priority', 0)
        spec.setdefault('preemptionPolicy', 'PreemptLowerPriority')
        tolerations = spec.setdefault('tolerations', [])
        if isinstance(tolerations, list):
            keys = {t.get('key') for t in tolerations if isinstance(t, dict)}
            tolerations.extend(dict(t) for t in _POD_TOLERATIONS if t['key'] not in keys)


def _pod_spec(spec: Body) -> None:
    spec.setdefault('restartPolicy', 'Always')
    spec.setdefault('terminationGracePeriodSeconds', 30)
    spec.setdefault('dnsPolicy', 'ClusterFirst')
    spec.setdefault('securityContext', {})
    spec.setdefault('schedulerName', 'default-scheduler')
    for container in _containers(spec):
        image = container.get('image')
        if isinstance(image, str) and image:
            container.setdefault('imagePullPolicy', 'Always' if _is_latest(image) else 'IfNotPresent')
        container.setdefault('terminationMessagePath', '/dev/termination-log')
        container.setdefault('terminationMessagePolicy', 'File')
        container.setdefault('resources', {})
        for port in container.get('ports') or ():
            if isinstance(port, dict):
                port.setdefault('protocol', 'TCP')


def _is_latest(image: str) -> bool:
    """Whether an image reference means the latest (no tag, or ``:latest``; a digest is not)."""
    if '@' in image:
        return False
    name = image.rsplit('/', 1)[-1]
    return ':' not in name or name.rsplit(':', 1)[1] == 'latest'


def _containers(spec: Mapping[str, Any]) -> Iterator[Body]:
    for field in ('initContainers', 'containers', 'ephemeralContainers'):
        for container in spec.get(field) or ():
            if isinstance(container, dict):
                yield container


def _template(body: Body) -> None:
    spec = _dict(body, 'spec')
    template = spec.get('template')
    if isinstance(template, dict):
        _pod_spec(_dict(template, 'spec'))


def _deployment(body: Body, allocator: Allocator, creating: bool, old: Mapping[str, Any] | None) -> None:
    spec = _dict(body, 'spec')
    spec.setdefault('replicas', 1)
    _rolling_update(spec, 'strategy', maxUnavailable='25%', maxSurge='25%')
    spec.setdefault('revisionHistoryLimit', 10)
    spec.setdefault('progressDeadlineSeconds', 600)
    _template(body)


def _stateful_set(body: Body, allocator: Allocator, creating: bool, old: Mapping[str, Any] | None) -> None:
    spec = _dict(body, 'spec')
    spec.setdefault('replicas', 1)
    spec.setdefault('podManagementPolicy', 'OrderedReady')
    spec.setdefault('serviceName', '')
    _rolling_update(spec, 'updateStrategy', partition=0, maxUnavailable=1)
    spec.setdefault('revisionHistoryLimit', 10)
    spec.setdefault('persistentVolumeClaimRetentionPolicy', {'whenDeleted': 'Retain', 'whenScaled': 'Retain'})
    _template(body)


def _daemon_set(body: Body, allocator: Allocator, creating: bool, old: Mapping[str, Any] | None) -> None:
    spec = _dict(body, 'spec')
    _rolling_update(spec, 'updateStrategy', maxUnavailable=1, maxSurge=0)
    spec.setdefault('revisionHistoryLimit', 10)
    _template(body)


def _rolling_update(spec: Body, field: str, **defaults: Any) -> None:
    """The workloads' update strategy: rolling by default, with the defaults of the rolling updates."""
    strategy = spec.setdefault(field, {})
    if isinstance(strategy, dict):
        strategy.setdefault('type', 'RollingUpdate')
        rolling = strategy.setdefault('rollingUpdate', {}) if strategy['type'] == 'RollingUpdate' else None
        if isinstance(rolling, dict):
            for key, value in defaults.items():
                rolling.setdefault(key, value)


def _replica_set(body: Body, allocator: Allocator, creating: bool, old: Mapping[str, Any] | None) -> None:
    _dict(body, 'spec').setdefault('replicas', 1)
    _template(body)


def _job(body: Body, allocator: Allocator, creating: bool, old: Mapping[str, Any] | None) -> None:
    spec = _dict(body, 'spec')
    spec.setdefault('parallelism', 1)
    spec.setdefault('completions', 1)
    spec.setdefault('backoffLimit', 6)
    spec.setdefault('completionMode', 'NonIndexed')
    spec.setdefault('suspend', False)
    spec.setdefault('podReplacementPolicy', 'TerminatingOrFailed')
    spec.setdefault('manualSelector', False)
    _template(body)


def _service(body: Body, allocator: Allocator, creating: bool, old: Mapping[str, Any] | None) -> None:
    spec = _dict(body, 'spec')
    kind = spec.setdefault('type', 'ClusterIP')
    spec.setdefault('sessionAffinity', 'None')
    if kind == 'ExternalName':
        return
    for port in spec.get('ports') or ():
        if isinstance(port, dict):
            port.setdefault('protocol', 'TCP')
            if 'port' in port:
                port.setdefault('targetPort', port['port'])
    old_spec = _mapping(old.get('spec')) if old is not None else {}
    if spec.get('clusterIP') in (None, ''):
        spec['clusterIP'] = old_spec.get('clusterIP') or allocator.cluster_ip()
    headless = spec['clusterIP'] == 'None'
    spec.setdefault('clusterIPs', [spec['clusterIP']])
    if headless and not spec.get('selector'):
        spec.setdefault('ipFamilyPolicy', 'RequireDualStack')
        spec.setdefault('ipFamilies', ['IPv4', 'IPv6'])
    else:
        spec.setdefault('ipFamilyPolicy', 'SingleStack')
        spec.setdefault('ipFamilies', ['IPv4'])
    spec.setdefault('internalTrafficPolicy', 'Cluster')
    if kind in ('NodePort', 'LoadBalancer'):
        spec.setdefault('externalTrafficPolicy', 'Cluster')
        old_ports = {p.get('port'): p.get('nodePort') for p in old_spec.get('ports') or ()
                     if isinstance(p, dict)}
        for port in spec.get('ports') or ():
            if isinstance(port, dict) and not port.get('nodePort'):
                port['nodePort'] = old_ports.get(port.get('port')) or allocator.node_port()
    if kind == 'LoadBalancer':
        spec.setdefault('allocateLoadBalancerNodePorts', True)


def _secret(body: Body, allocator: Allocator, creating: bool, old: Mapping[str, Any] | None) -> None:
    body.setdefault('type', 'Opaque')
    strings = body.pop('stringData', None)
    if isinstance(strings, dict) and strings:
        data = _mapping(body.get('data'))
        body['data'] = {**data, **{key: base64.b64encode(str(value).encode('utf-8')).decode('ascii')
                                   for key, value in strings.items()}}


def _claim(body: Body, allocator: Allocator, creating: bool, old: Mapping[str, Any] | None) -> None:
    _dict(body, 'spec').setdefault('volumeMode', 'Filesystem')


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _dict(parent: Body, key: str) -> Body:
    """The child object, made if absent (or if not an object: then, left to the checks to complain)."""
    child = parent.get(key)
    if child is None:
        child = parent[key] = {}
    return child if isinstance(child, dict) else {}


_Preparer = Callable[[Body, Allocator, bool, Mapping[str, Any] | None], None]
_PREPARERS: Mapping[tuple[str, str], _Preparer] = {
    ('', 'pods'): _pod,
    ('', 'services'): _service,
    ('', 'secrets'): _secret,
    ('', 'persistentvolumeclaims'): _claim,
    ('apps', 'deployments'): _deployment,
    ('apps', 'statefulsets'): _stateful_set,
    ('apps', 'daemonsets'): _daemon_set,
    ('apps', 'replicasets'): _replica_set,
    ('batch', 'jobs'): _job,
}


# ----------------------------------------------------------------------------------------------------
# New objects: what depends on their uid, and their initial status (whatever status is given).

def created(plural: str, group: str, body: Body) -> Body:
    """The new object (with its uid) as real servers store it (a new dict if anything changes)."""
    key = (group, plural)
    status = _initial_status(key, body)
    spec = _mapping(body.get('spec'))
    if key == ('batch', 'jobs') and isinstance(spec.get('template'), dict) and not spec.get('manualSelector'):
        # The Job's own selector & labels, by its uid.
        body = json.loads(json.dumps(body))
        uid, name = body['metadata'].get('uid', ''), body['metadata'].get('name', '')
        body['spec']['selector'] = {'matchLabels': {'batch.kubernetes.io/controller-uid': uid}}
        labels = _dict(_dict(body['spec']['template'], 'metadata'), 'labels')
        labels.update({'batch.kubernetes.io/controller-uid': uid, 'batch.kubernetes.io/job-name': name,
                       'controller-uid': uid, 'job-name': name})
    return body if status is None else {**body, 'status': status}


def _initial_status(key: tuple[str, str], body: Mapping[str, Any]) -> dict[str, Any] | None:
    if key == ('', 'pods'):
        return {'phase': 'Pending', 'qosClass': _qos_class(body.get('spec') or {})}
    if key == ('', 'services'):
        return {'loadBalancer': {}}
    if key == ('', 'persistentvolumeclaims'):
        return {'phase': 'Pending'}
    return dict(_INITIAL_STATUSES[key]) if key in _INITIAL_STATUSES else None


_INITIAL_STATUSES: Mapping[tuple[str, str], Mapping[str, Any]] = {
    ('apps', 'deployments'): {},
    ('apps', 'statefulsets'): {'availableReplicas': 0, 'replicas': 0},
    ('apps', 'daemonsets'): {'currentNumberScheduled': 0, 'desiredNumberScheduled': 0,
                             'numberMisscheduled': 0, 'numberReady': 0},
    ('apps', 'replicasets'): {'replicas': 0},
    ('batch', 'jobs'): {},
}


def _qos_class(spec: Mapping[str, Any]) -> str:
    """
    The Pod's QoS class: BestEffort with no requests or limits at all; Guaranteed if all containers have
    CPU & memory limits equal to their requests; Burstable otherwise.
    """
    any_set = False
    guaranteed = True
    for container in _containers(spec):
        resources = _mapping(container.get('resources'))
        requests = _mapping(resources.get('requests'))
        limits = _mapping(resources.get('limits'))
        any_set = any_set or bool(requests) or bool(limits)
        for name in ('cpu', 'memory'):
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                guaranteed = False
    return 'BestEffort' if not any_set else 'Guaranteed' if guaranteed else 'Burstable'


# ----------------------------------------------------------------------------------------------------
# Checks: the fields without which these kinds are invalid (422).

def validate(plural: str, group: str, body: Mapping[str, Any]) -> list[Cause]:
    check = _CHECKS.get((group, plural))
    return check(body) if check is not None else []


def _check_pod(body: Mapping[str, Any]) -> list[Cause]:
    return _check_pod_spec(body.get('spec'), 'spec')


def _check_pod_spec(spec: Any, path: str, *, restart_policies: tuple[str, ...] = ()) -> list[Cause]:
    spec = _mapping(spec)
    causes: list[Cause] = []
    containers = spec.get('containers')
    if not containers:
        causes.append(Cause(f'{path}.containers', 'Required value', 'FieldValueRequired'))
    containers = containers if isinstance(containers, list) else []
    names = {container.get('name') for container in containers if isinstance(container, Mapping)}
    for index, container in enumerate(spec.get('initContainers') or ()):
        if isinstance(container, Mapping) and container.get('name') in names:
            duplicate = json.dumps(container.get('name'))
            causes.append(Cause(f'{path}.initContainers[{index}].name', f'Duplicate value: {duplicate}',
                                'FieldValueDuplicate'))
    for index, container in enumerate(containers):
        if isinstance(container, Mapping) and not container.get('image'):
            causes.append(Cause(f'{path}.containers[{index}].image', 'Required value', 'FieldValueRequired'))
    if restart_policies and spec.get('restartPolicy') not in restart_policies:
        supported = ', '.join(f'"{policy}"' for policy in restart_policies)
        causes.append(Cause(f'{path}.restartPolicy', f'Required value: valid values: {supported}',
                            'FieldValueRequired'))
    return causes


def _check_workload(body: Mapping[str, Any]) -> list[Cause]:
    spec = _mapping(body.get('spec'))
    template = _mapping(spec.get('template'))
    labels = _mapping(template.get('metadata')).get('labels')
    causes: list[Cause] = []
    selector = spec.get('selector')
    if not selector:
        causes.append(Cause('spec.selector', 'Required value', 'FieldValueRequired'))
    if not _selects(selector, labels):
        shown = json.dumps(labels) if labels else 'null'
        causes.append(Cause('spec.template.metadata.labels',
                            f'Invalid value: {shown}: `selector` does not match template `labels`'))
    causes.extend(_check_pod_spec(template.get('spec'), 'spec.template.spec'))
    return causes


def _selects(selector: Any, labels: Any) -> bool:
    """Whether the workload's selector selects its template's labels (an empty one selects nothing here)."""
    requirements = selectors.label_selector_from_struct(selector)
    if not requirements or not isinstance(labels, Mapping) or not labels:
        return False
    return selectors.labels_match(requirements, labels)


def _check_job(body: Mapping[str, Any]) -> list[Cause]:
    spec = _mapping(body.get('spec'))
    template = _mapping(spec.get('template'))
    return _check_pod_spec(template.get('spec'), 'spec.template.spec',
                           restart_policies=('OnFailure', 'Never'))


def _check_service(body: Mapping[str, Any]) -> list[Cause]:
    spec = _mapping(body.get('spec'))
    if spec.get('type') != 'ExternalName' and spec.get('clusterIP') != 'None' and not spec.get('ports'):
        return [Cause('spec.ports', 'Required value', 'FieldValueRequired')]
    return []


def _check_event(body: Mapping[str, Any]) -> list[Cause]:
    """The namespaces of an event and of its object agree (a cluster object's events in "default" or none)."""
    involved_object, metadata = body.get('involvedObject'), body.get('metadata')
    involved = (involved_object.get('namespace') if isinstance(involved_object, dict) else None) or ''
    namespace = (metadata.get('namespace') if isinstance(metadata, dict) else None) or ''
    if (involved or namespace not in ('', 'default')) and involved != namespace:
        return [Cause('involvedObject.namespace', f'Invalid value: {json.dumps(involved)}: does not match '
                                                  'event.namespace')]
    return []


_SECRET_KEYS = {  # the data that the secrets of these types must have
    'kubernetes.io/tls': ('tls.crt', 'tls.key'),
    'kubernetes.io/dockerconfigjson': ('.dockerconfigjson',),
    'kubernetes.io/dockercfg': ('.dockercfg',),
    'kubernetes.io/ssh-auth': ('ssh-privatekey',),
}


_DOCKER_CONFIGS = {'kubernetes.io/dockerconfigjson': '.dockerconfigjson',
                   'kubernetes.io/dockercfg': '.dockercfg'}


def _check_secret(body: Mapping[str, Any]) -> list[Cause]:
    """The data (or the annotation) that a secret's type requires; its contents never shown."""
    kind, data = str(body.get('type')), _mapping(body.get('data'))
    required = list(_SECRET_KEYS.get(kind, ()))
    if kind == 'kubernetes.io/basic-auth' and 'username' not in data and 'password' not in data:
        required += ['username', 'password']
    causes = [Cause(f'data[{key}]', 'Required value', 'FieldValueRequired')
              for key in required if key not in data]
    annotations = _mapping(_mapping(body.get('metadata')).get('annotations'))
    account = 'kubernetes.io/service-account.name'
    if kind == 'kubernetes.io/service-account-token' and account not in annotations:
        causes.append(Cause(f'metadata.annotations[{account}]', 'Required value', 'FieldValueRequired'))
    key = _DOCKER_CONFIGS.get(kind)
    if key is not None and isinstance(data.get(key), str):
        try:
            json.loads(base64.b64decode(data[key]))
        except ValueError as e:
            causes.append(Cause(f'data[{key}]', f'Invalid value: "<secret contents redacted>": {e}'))
    return causes


_CHECKS: Mapping[tuple[str, str], Callable[[Mapping[str, Any]], list[Cause]]] = {
    ('', 'events'): _check_event,
    ('', 'secrets'): _check_secret,
    ('', 'pods'): _check_pod,
    ('', 'services'): _check_service,
    ('apps', 'deployments'): _check_workload,
    ('apps', 'statefulsets'): _check_workload,
    ('apps', 'daemonsets'): _check_workload,
    ('apps', 'replicasets'): _check_workload,
    ('batch', 'jobs'): _check_job,
}



# ----------------------------------------------------------------------------------------------------
# Updates: what real servers do not let change once set (422, in their wording).

_POD_UPDATES = ('Forbidden: pod updates may not change fields other than `spec.containers[*].image`,'
                '`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only '
                'additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set '
                'to 1 if it was previously negative)')
_CLAIM_UPDATES = ('Forbidden: spec is immutable after creation except resources.requests and '
                  'volumeAttributesClassName for bound claims')
_IMMUTABLE_WHEN_SET = 'Forbidden: field is immutable when `immutable` is set'


def validate_update(plural: str, group: str, new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    """The changes that real servers refuse in an update of an object (after its defaults)."""
    check = _UPDATE_CHECKS.get((group, plural))
    return check(new, old) if check is not None else []



def _immutable(field: str, new: Any, old: Any, shown: Any = None) -> list[Cause]:
    if new == old:
        return []
    return [Cause(field, f'Invalid value: {go_value(new if shown is None else shown)}: field is immutable')]


def _check_data_update(new: Mapping[str, Any], old: Mapping[str, Any],
                       fields: tuple[str, ...]) -> list[Cause]:
    if old.get('immutable') is not True:
        return []
    causes = [Cause(field, _IMMUTABLE_WHEN_SET, 'FieldValueForbidden') for field in fields
              if (new.get(field) or {}) != (old.get(field) or {})]
    if new.get('immutable') is not True:
        causes.append(Cause('immutable', _IMMUTABLE_WHEN_SET, 'FieldValueForbidden'))
    return causes


def _check_secret_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    return [*_immutable('type', new.get('type'), old.get('type')), *_check_data_update(new, old, ('data',))]


def _selector(value: Any) -> Any:
    """A label selector as Go's JSON shows it: matchLabels, then matchExpressions."""
    selector = _mapping(value)
    shown: dict[str, Any] = {}
    if selector.get('matchLabels'):
        shown['matchLabels'] = selector['matchLabels']
    if selector.get('matchExpressions'):
        shown['matchExpressions'] = [
            {key: requirement[key] for key in ('key', 'operator', 'values') if key in requirement}
            for requirement in selector['matchExpressions'] if isinstance(requirement, dict)]
    return shown


def _check_workload_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    selector = _selector(_mapping(new.get('spec')).get('selector'))
    return _immutable('spec.selector', selector, _selector(_mapping(old.get('spec')).get('selector')))


def _check_stateful_set_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    new_spec, old_spec = _mapping(new.get('spec')), _mapping(old.get('spec'))
    causes = _check_workload_update(new, old)
    for field in ('serviceName', 'podManagementPolicy', 'volumeClaimTemplates'):
        causes.extend(_immutable(f'spec.{field}', new_spec.get(field), old_spec.get(field)))
    return causes


def _check_job_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    new_spec, old_spec = _mapping(new.get('spec')), _mapping(old.get('spec'))
    return [*_check_workload_update(new, old),
            *_immutable('spec.template', new_spec.get('template'), old_spec.get('template'))]


def _check_service_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    new_ips = _mapping(new.get('spec')).get('clusterIPs') or []
    old_ips = _mapping(old.get('spec')).get('clusterIPs') or []
    if old_ips and new_ips and new_ips[0] != old_ips[0] and old_ips[0] != 'None':
        return [Cause('spec.clusterIPs[0]', f'Invalid value: {go_value(new_ips)}: may not change once set')]
    return []


def _check_pod_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    """Only the images, the deadline and new tolerations may change (the diff is not in the message)."""
    new_spec, old_spec = dict(_mapping(new.get('spec'))), dict(_mapping(old.get('spec')))
    for field in ('containers', 'initContainers'):  # the images may change: compared as the old ones
        items, old_items = new_spec.get(field), old_spec.get(field)
        if isinstance(items, list) and isinstance(old_items, list) and len(items) == len(old_items):
            new_spec[field] = [{**item, 'image': _mapping(old_item).get('image')} if isinstance(item, dict)
                               else item for item, old_item in zip(items, old_items, strict=True)]
    tolerations, old_tolerations = new_spec.get('tolerations') or [], old_spec.get('tolerations') or []
    if isinstance(tolerations, list) and tolerations[:len(old_tolerations)] == old_tolerations:
        new_spec['tolerations'] = old_spec.get('tolerations')  # only additions: allowed
    for spec in (new_spec, old_spec):
        spec.pop('activeDeadlineSeconds', None)
        if spec.get('tolerations') is None:
            spec.pop('tolerations', None)
    return [] if new_spec == old_spec else [Cause('spec', _POD_UPDATES, 'FieldValueForbidden')]


def _check_claim_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    new_spec, old_spec = dict(_mapping(new.get('spec'))), dict(_mapping(old.get('spec')))
    if _mapping(old.get('status')).get('phase') == 'Bound':  # the requests & class may change then
        for spec in (new_spec, old_spec):
            spec.pop('volumeAttributesClassName', None)
            spec['resources'] = {**_mapping(spec.get('resources')), 'requests': None}
    return [] if new_spec == old_spec else [Cause('spec', _CLAIM_UPDATES, 'FieldValueForbidden')]


def forbidden_update(plural: str, group: str, new: Mapping[str, Any], old: Mapping[str, Any]) -> str | None:
    """Why the default admission plugins refuse a valid update (403), if they do."""
    if (group, plural) == ('', 'persistentvolumeclaims'):
        requests = _mapping(_mapping(_mapping(new.get('spec')).get('resources')).get('requests'))
        old_requests = _mapping(_mapping(_mapping(old.get('spec')).get('resources')).get('requests'))
        if requests != old_requests:  # the emulator serves no StorageClasses, so none allows the expansion
            return ('only dynamically provisioned pvc can be resized and the storageclass that provisions '
                    'the pvc must support resize')
    return None


_UpdateCheck = Callable[[Mapping[str, Any], Mapping[str, Any]], list[Cause]]
_UPDATE_CHECKS: Mapping[tuple[str, str], _UpdateCheck] = {
    ('', 'configmaps'): lambda new, old: _check_data_update(new, old, ('data', 'binaryData')),
    ('', 'secrets'): _check_secret_update,
    ('', 'services'): _check_service_update,
    ('', 'pods'): _check_pod_update,
    ('', 'persistentvolumeclaims'): _check_claim_update,
    ('apps', 'deployments'): _check_workload_update,
    ('apps', 'daemonsets'): _check_workload_update,
    ('apps', 'replicasets'): _check_workload_update,
    ('apps', 'statefulsets'): _check_stateful_set_update,
    ('batch', 'jobs'): _check_job_update,
}
