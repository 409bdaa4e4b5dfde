"""
The resources the emulator serves: the built-in ones and those registered by CRDs; API discovery.

A :class:`ResourceInfo` describes one resource in one API version. Several versions of the same
group and plural (as multi-version CRDs have) share one storage: :attr:`ResourceInfo.storage_key`.
"""

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kopf.testing.emulator import builtins, schemachecks, schemas
from kopf.testing.emulator.errors import Cause
from kopf.testing.emulator.validation import PLAIN_META, NameRule

StorageKey = tuple[str, str]  # (group, plural)

ALL_VERBS = ('create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch')
SUBRESOURCE_VERBS = ('get', 'patch', 'update')
_METADATA_FIELDS = ('metadata.name', 'metadata.namespace')


@dataclasses.dataclass(frozen=True)
class ResourceInfo:
    """One resource as served in one API version, with everything discovery tells about it."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    has_status: bool = False
    custom: bool = False  # served from a CRD: no strategic-merge-patch, resourceVersion required on PUT
    has_generation: bool = True  # metadata.generation: kinds without a spec (ConfigMaps...) have none
    name_rule: NameRule = 'subdomain'
    selectable_fields: tuple[str, ...] = ()
    printer_columns: tuple[Mapping[str, Any], ...] = ()
    # The CRD version's openAPIV3Schema, if it does anything (see schemas.effective); not compared.
    schema: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)
    # A built-in kind's top-level fields (the others are pruned, see builtins.prune); None: any.
    top_fields: frozenset[str] | None = dataclasses.field(default=None, compare=False, repr=False)

    def prunes_nothing_in(self, body: Mapping[str, Any]) -> bool:
        """Whether writing the object prunes nothing (a quick look; the pruning itself would tell so too)."""
        return (self.schema is None and (self.top_fields is None or body.keys() <= self.top_fields)
                and (body.get('metadata') or {}).keys() <= PLAIN_META)

    @property
    def api_version(self) -> str:
        return f'{self.group}/{self.version}' if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def storage_key(self) -> StorageKey:
        return (self.group, self.plural)

    @property
    def list_kind(self) -> str:
        return f'{self.kind}List'

    @property
    def field_selector_paths(self) -> tuple[str, ...]:
        return _METADATA_FIELDS + self.selectable_fields

    def discovery_entries(self) -> list[dict[str, Any]]:
        entry: dict[str, Any] = {
            'name': self.plural,
            'singularName': self.singular,
            'namespaced': self.namespaced,
            'kind': self.kind,
            'verbs': list(ALL_VERBS),
            'storageVersionHash': _short_hash(f'{self.group}/{self.plural}/{self.kind}'),
        }
        if self.short_names:
            entry['shortNames'] = list(self.short_names)
        if self.categories:
            entry['categories'] = list(self.categories)
        entries = [entry]
        if self.has_status:
            entries.append(
                {
                    'name': f'{self.plural}/status',
                    'singularName': '',
                    'namespaced': self.namespaced,
                    'kind': self.kind,
                    'verbs': list(SUBRESOURCE_VERBS),
                }
            )
        return entries


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _builtin(
    group: str,
    version: str,
    plural: str,
    kind: str,
    *,
    namespaced: bool = True,
    short_names: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
    has_status: bool = False,
    name_rule: NameRule = 'subdomain',
    selectable_fields: tuple[str, ...] = (),
    has_generation: bool = True,
) -> ResourceInfo:
    return ResourceInfo(
        group=group,
        version=version,
        plural=plural,
        singular=kind.lower(),
        kind=kind,
        namespaced=namespaced,
        short_names=short_names,
        categories=categories,
        has_status=has_status,
        name_rule=name_rule,
        selectable_fields=selectable_fields,
        has_generation=has_generation,
        top_fields=builtins.top_fields(group, plural),
    )


NAMESPACES = _builtin(
    '',
    'v1',
    'namespaces',
    'Namespace',
    namespaced=False,
    short_names=('ns',),
    has_status=True,
    name_rule='label',
    selectable_fields=('status.phase',),
    has_generation=False,
)
CUSTOM_RESOURCE_DEFINITIONS = _builtin(
    'apiextensions.k8s.io',
    'v1',
    'customresourcedefinitions',
    'CustomResourceDefinition',
    namespaced=False,
    short_names=('crd', 'crds'),
    categories=('api-extensions',),
    has_status=True,
)
VALIDATING_WEBHOOK_CONFIGURATIONS = _builtin(
    'admissionregistration.k8s.io',
    'v1',
    'validatingwebhookconfigurations',
    'ValidatingWebhookConfiguration',
    namespaced=False,
    categories=('api-extensions',),
)
MUTATING_WEBHOOK_CONFIGURATIONS = _builtin(
    'admissionregistration.k8s.io',
    'v1',
    'mutatingwebhookconfigurations',
    'MutatingWebhookConfiguration',
    namespaced=False,
    categories=('api-extensions',),
)

BUILTIN_RESOURCES: tuple[ResourceInfo, ...] = (
    NAMESPACES,
    _builtin(
        '',
        'v1',
        'pods',
        'Pod',
        short_names=('po',),
        categories=('all',),
        has_status=True,
        selectable_fields=(
            'spec.nodeName',
            'spec.restartPolicy',
            'spec.schedulerName',
            'spec.serviceAccountName',
            'spec.hostNetwork',
            'status.phase',
            'status.podIP',
            'status.nominatedNodeName',
        ),
    ),
    _builtin('', 'v1', 'configmaps', 'ConfigMap', short_names=('cm',), has_generation=False),
    _builtin('', 'v1', 'secrets', 'Secret', selectable_fields=('type',), has_generation=False),
    _builtin(
        '',
        'v1',
        'services',
        'Service',
        short_names=('svc',),
        categories=('all',),
        has_status=True,
        name_rule='dns1035',
    ),
    _builtin('', 'v1', 'serviceaccounts', 'ServiceAccount', short_names=('sa',), has_generation=False),
    _builtin(
        '', 'v1', 'persistentvolumeclaims', 'PersistentVolumeClaim', short_names=('pvc',), has_status=True
    ),
    _builtin(
        '',
        'v1',
        'persistentvolumes',
        'PersistentVolume',
        namespaced=False,
        short_names=('pv',),
        has_status=True,
    ),
    _builtin(
        '',
        'v1',
        'nodes',
        'Node',
        namespaced=False,
        short_names=('no',),
        has_status=True,
        selectable_fields=('spec.unschedulable',),
    ),
    _builtin(
        '',
        'v1',
        'events',
        'Event',
        short_names=('ev',),
        name_rule='path-segment',
        has_generation=False,
        selectable_fields=(
            'involvedObject.kind',
            'involvedObject.namespace',
            'involvedObject.name',
            'involvedObject.uid',
            'involvedObject.apiVersion',
            'involvedObject.resourceVersion',
            'involvedObject.fieldPath',
            'reason',
            'reportingComponent',
            'source',
            'type',
        ),
    ),
    _builtin(
        'events.k8s.io',
        'v1',
        'events',
        'Event',
        short_names=('ev',),
        name_rule='path-segment',
        has_generation=False,
        selectable_fields=(
            'regarding.kind',
            'regarding.namespace',
            'regarding.name',
            'regarding.uid',
            'reason',
            'reportingController',
            'type',
        ),
    ),
    CUSTOM_RESOURCE_DEFINITIONS,
    _builtin('coordination.k8s.io', 'v1', 'leases', 'Lease', has_generation=False),
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    _builtin(
        'apps',
        'v1',
        'deployments',
        'Deployment',
        short_names=('deploy',),
        categories=('all',),
        has_status=True,
    ),
    _builtin(
        'apps',
        'v1',
        'statefulsets',
        'StatefulSet',
        short_names=('sts',),
        categories=('all',),
        has_status=True,
    ),
    _builtin(
        'apps', 'v1', 'daemonsets', 'DaemonSet', short_names=('ds',), categories=('all',), has_status=True
    ),
    _builtin(
        'apps', 'v1', 'replicasets', 'ReplicaSet', short_names=('rs',), categories=('all',), has_status=True
    ),
    _builtin('batch', 'v1', 'jobs', 'Job', categories=('all',), has_status=True),
)

_VERSION_PATTERN = re.compile(r'^v(\d+)(?:(alpha|beta)(\d+))?$')


def version_priority(version: str) -> tuple[int, int, int, str]:
    """A sorting key that puts the preferred versions first: GA, then beta, then alpha; newer first."""
    match = _VERSION_PATTERN.match(version)
    if not match:
        return (3, 0, 0, version)
    major = int(match[1])
    stability = {None: 0, 'beta': 1, 'alpha': 2}[match[2]]
    minor = int(match[3]) if match[3] else 0
    return (stability, -major, -minor, version)


class CrdError(ValueError):
    """A CRD that cannot be served; carries (field, message) pairs (or causes) for a 422 response."""

    def __init__(self, problems: list[tuple[str, str]], causes: Sequence[Cause] = ()) -> None:
        texts = [f'{field}: {message}' for field, message in problems] + [str(cause) for cause in causes]
        super().__init__('; '.join(texts))
        self.problems = problems
        self.causes = list(causes)


def resources_from_crd(crd: Mapping[str, Any]) -> list[ResourceInfo]:
    """The resources that a CRD object defines: one per served version."""
    problems: list[tuple[str, str]] = []
    spec = crd.get('spec')
    if not isinstance(spec, dict):
        raise CrdError([('spec', 'Required value')])
    group = spec.get('group')
    names: dict[str, Any] = spec['names'] if isinstance(spec.get('names'), dict) else {}
    plural = names.get('plural')
    kind = names.get('kind')
    singular = names.get('singular') or (kind.lower() if isinstance(kind, str) else None)
    scope = spec.get('scope')
    versions = spec.get('versions')
    if not isinstance(group, str) or not group:
        problems.append(('spec.group', 'Required value'))
    elif '.' not in group:
        problems.append(('spec.group', f'Invalid value: "{group}": should be a domain with at least one dot'))
    if not isinstance(plural, str) or not re.fullmatch(r'[a-z0-9]([-a-z0-9]*[a-z0-9])?', plural):
        problems.append(
            ('spec.names.plural', f'Invalid value: {plural!r}: must be a lowercase DNS-1035 label')
        )
    if not isinstance(singular, str) or not re.fullmatch(r'[a-z0-9]([-a-z0-9]*[a-z0-9])?', singular):
        problems.append(('spec.names.singular', f'Invalid value: {singular!r}: must be a lowercase label'))
    if not isinstance(kind, str) or not kind:
        problems.append(('spec.names.kind', 'Required value'))
    if scope not in ('Namespaced', 'Cluster'):
        problems.append(
            ('spec.scope', f'Unsupported value: {scope!r}: supported values: "Cluster", "Namespaced"')
        )
    if not isinstance(versions, list) or not versions or not all(isinstance(v, dict) for v in versions):
        problems.append(
            ('spec.versions', 'Invalid value: must have exactly one version marked as storage version')
        )
    else:
        storage_count = sum(1 for v in versions if v.get('storage'))
        if storage_count != 1:
            problems.append(
                ('spec.versions', 'Invalid value: must have exactly one version marked as storage version')
            )
        for index, version in enumerate(versions):
            if not isinstance(version.get('name'), str) or not _is_dns_label(version['name']):
                problems.append((f'spec.versions[{index}].name', 'Invalid value: must be a DNS-1035 label'))
            schema = version.get('schema')
            if not isinstance(schema, dict) or not isinstance(schema.get('openAPIV3Schema'), dict):
                # Like real servers: the schemas are required in apiextensions.k8s.io/v1 (the emulator
                # does not use them, but a CRD that a real server rejects must not work here).
                problems.append((f'spec.versions[{index}].schema.openAPIV3Schema', 'Required value'))
    if not problems:
        expected_name = f'{plural}.{group}'
        if crd.get('metadata', {}).get('name') != expected_name:
            problems.append(
                (
                    'metadata.name',
                    f'Invalid value: "{crd.get("metadata", {}).get("name")}": '
                    f'must be spec.names.plural+"."+spec.group',
                )
            )
    if problems:
        raise CrdError(problems)
    invalid_schemas = schemachecks.problems(spec)
    if invalid_schemas:
        raise CrdError([], invalid_schemas)

    assert isinstance(versions, list) and isinstance(plural, str) and isinstance(kind, str)
    assert isinstance(group, str) and isinstance(singular, str)
    resources: list[ResourceInfo] = []
    for version in versions:
        if not version.get('served', False):
            continue
        subresources = version.get('subresources') or spec.get('subresources') or {}
        selectable = tuple(
            str(field.get('jsonPath', '')).lstrip('.')
            for field in (version.get('selectableFields') or spec.get('selectableFields') or [])
            if isinstance(field, dict) and field.get('jsonPath')
        )
        columns = version.get('additionalPrinterColumns') or spec.get('additionalPrinterColumns') or []
        resources.append(
            ResourceInfo(
                group=group,
                version=version['name'],
                plural=plural,
                singular=singular,
                kind=kind,
                namespaced=scope == 'Namespaced',
                short_names=tuple(str(name) for name in names.get('shortNames') or ()),
                categories=tuple(str(name) for name in names.get('categories') or ()),
                has_status=isinstance(subresources, dict) and 'status' in subresources,
                custom=True,
                selectable_fields=selectable,
                printer_columns=tuple(column for column in columns if isinstance(column, dict)),
                schema=schemas.effective(version['schema']['openAPIV3Schema']),
            )
        )
    return resources


def _is_dns_label(text: str) -> bool:
    return bool(re.fullmatch(r'[a-z]([-a-z0-9]*[a-z0-9])?', text)) and len(text) <= 63


class ResourceRegistry:
    """All resources currently served: the built-ins plus those of the established CRDs."""

    def __init__(self, builtins: Iterable[ResourceInfo] = BUILTIN_RESOURCES) -> None:
        self._resources: dict[tuple[str, str, str], ResourceInfo] = {}
        self._by_crd: dict[str, list[ResourceInfo]] = {}
        self.generation = 0  # changes whenever the served resources change: for caching of documents
        for info in builtins:
            self._add(info)

    def _add(self, info: ResourceInfo) -> None:
        self._resources[(info.group, info.version, info.plural)] = info

    def lookup(self, group: str, version: str, plural: str) -> ResourceInfo | None:
        return self._resources.get((group, version, plural))

    def find(self, api_version: str, kind: str) -> ResourceInfo | None:
        group, _, version = api_version.rpartition('/')
        for info in self._resources.values():
            if info.group == group and info.version == version and info.kind == kind:
                return info
        return None

    def all(self) -> list[ResourceInfo]:
        return list(self._resources.values())

    def versions_of(self, key: StorageKey) -> list[ResourceInfo]:
        return [info for info in self._resources.values() if info.storage_key == key]

    def register_crd(self, crd_name: str, resources: list[ResourceInfo]) -> None:
        self.unregister_crd(crd_name)
        for info in resources:
            self._add(info)
        self._by_crd[crd_name] = resources
        self.generation += 1

    def unregister_crd(self, crd_name: str) -> list[ResourceInfo]:
        removed = self._by_crd.pop(crd_name, [])
        for info in removed:
            self._resources.pop((info.group, info.version, info.plural), None)
        if removed:
            self.generation += 1
        return removed

    def crd_name_for(self, info: ResourceInfo) -> str | None:
        return f'{info.plural}.{info.group}' if info.custom else None

    # ----------------------------------------------------------------------------------------
    # Discovery documents.

    def group_versions(self) -> dict[str, list[str]]:
        """Served versions per group, the preferred version first."""
        versions: dict[str, set[str]] = {}
        for info in self._resources.values():
            versions.setdefault(info.group, set()).add(info.version)
        return {group: sorted(found, key=version_priority) for group, found in versions.items()}

    def core_versions(self) -> dict[str, Any]:
        return {'kind': 'APIVersions', 'versions': self.group_versions().get('', ['v1'])}

    def group_document(self, group: str) -> dict[str, Any] | None:
        versions = self.group_versions().get(group)
        if not group or not versions:
            return None
        entries = [{'groupVersion': f'{group}/{version}', 'version': version} for version in versions]
        return {
            'kind': 'APIGroup',
            'apiVersion': 'v1',
            'name': group,
            'versions': entries,
            'preferredVersion': entries[0],
        }

    def group_list(self) -> dict[str, Any]:
        groups = []
        for group in sorted(self.group_versions()):
            document = self.group_document(group)
            if document is not None:
                document.pop('kind')
                document.pop('apiVersion')
                groups.append(document)
        return {'kind': 'APIGroupList', 'apiVersion': 'v1', 'groups': groups}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        infos = [info for info in self._resources.values() if info.group == group and info.version == version]
        if not infos:
            return None
        entries: list[dict[str, Any]] = []
        for info in sorted(infos, key=lambda info: info.plural):
            entries.extend(info.discovery_entries())
        return {
            'kind': 'APIResourceList',
            'apiVersion': 'v1',
            'groupVersion': f'{group}/{version}' if group else version,
            'resources': entries,
        }

    # ----------------------------------------------------------------------------------------
    # OpenAPI v3, only as much of it as kubectl needs: which operations each kind supports,
    # so that it sends field validation to the server instead of validating schemas itself.

    def openapi_document(self, group: str, version: str) -> dict[str, Any] | None:
        infos = [info for info in self._resources.values() if info.group == group and info.version == version]
        if not infos:
            return None
        paths: dict[str, Any] = {}
        prefix = f'/apis/{group}/{version}' if group else f'/api/{version}'
        for info in sorted(infos, key=lambda info: info.plural):
            gvk = {'group': group, 'version': version, 'kind': info.kind}
            item_path = (
                f'{prefix}/namespaces/{{namespace}}/{info.plural}/{{name}}'
                if info.namespaced
                else f'{prefix}/{info.plural}/{{name}}'
            )
            # Strategic merge-patch is deliberately not advertised even for built-ins: kubectl would
            # then need full schemas to compute such patches; without it, kubectl falls back to
            # the patch strategies compiled into it, which the emulator understands.
            content_types = [
                'application/json-patch+json',
                'application/merge-patch+json',
                'application/apply-patch+yaml',
            ]
            parameters = [
                {'name': name, 'in': 'query', 'schema': {'type': 'string', 'uniqueItems': True}}
                for name in ('dryRun', 'fieldManager', 'fieldValidation', 'force')
            ]
            reference = {'$ref': f'#/components/schemas/{_schema_name(info)}'}
            operation_base = {
                'tags': [f'{group or "core"}_{version}'],
                'parameters': parameters,
                'x-kubernetes-group-version-kind': gvk,
            }
            paths[item_path] = {
                'get': {
                    **operation_base,
                    'operationId': f'read{info.kind}',
                    'parameters': [],
                    'x-kubernetes-action': 'get',
                    'responses': {
                        '200': {'description': 'OK', 'content': {'application/json': {'schema': reference}}}
                    },
                },
                'put': {
                    **operation_base,
                    'operationId': f'replace{info.kind}',
                    'x-kubernetes-action': 'put',
                    'requestBody': {'content': {'*/*': {'schema': reference}}},
                    'responses': {'200': {'description': 'OK'}},
                },
                'patch': {
                    **operation_base,
                    'operationId': f'patch{info.kind}',
                    'x-kubernetes-action': 'patch',
                    'requestBody': {'content': {ct: {'schema': {'type': 'object'}} for ct in content_types}},
                    'responses': {'200': {'description': 'OK'}},
                },
                'delete': {
                    **operation_base,
                    'operationId': f'delete{info.kind}',
                    'x-kubernetes-action': 'delete',
                    'responses': {'200': {'description': 'OK'}},
                },
                'parameters': [
                    {'name': 'name', 'in': 'path', 'required': True, 'schema': {'type': 'string'}}
                ],
            }
        schemas = {
            _schema_name(info): {
                'type': 'object',
                'x-kubernetes-preserve-unknown-fields': True,
                'x-kubernetes-group-version-kind': [{'group': group, 'version': version, 'kind': info.kind}],
            }
            for info in infos
        }
        return {
            'openapi': '3.0.0',
            'info': {'title': 'Kubernetes API emulator', 'version': 'v1.32.0'},
            'paths': paths,
            'components': {'schemas': schemas},
        }

    def openapi_root(self) -> dict[str, Any]:
        paths: dict[str, Any] = {}
        for group, versions in sorted(self.group_versions().items()):
            for version in versions:
                prefix = f'apis/{group}/{version}' if group else f'api/{version}'
                document = self.openapi_document(group, version)
                digest = (
                    hashlib.sha512(json.dumps(document, sort_keys=True).encode()).hexdigest()[:32].upper()
                )
                paths[prefix] = {'serverRelativeURL': f'/openapi/v3/{prefix}?hash={digest}'}
        return {'paths': paths}


def _schema_name(info: ResourceInfo) -> str:
    reversed_group = '.'.join(reversed(info.group.split('.'))) if info.group else 'io.k8s.api.core'
    return f'{reversed_group}.{info.version}.{info.kind}'
