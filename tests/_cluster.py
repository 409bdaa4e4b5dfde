"""
The tests' user of the emulator: it arranges the objects via the API, as users do, and reads them directly.

Shared by the tests of whole operators (``tests/core/integration``), of the processing of events
(``tests/core/reactor/processing``) and of the admission webhooks (``tests/webhooks``); their conftests
give it as the ``cluster`` fixture. The requests go over HTTP (:class:`kopf.testing.AsyncCluster`),
so the emulator counts them. The reads (:meth:`EmulatorUser.get` and the others of the stored state)
are the emulator's own (``emulator.get_object``): no request is made or counted, so that the tests
that count the operator's requests see only the operator's, and nothing wakes it up.

By default, the example resource of ``examples/crd.yaml``: ``KopfExample`` in ``kopf.dev``, with the
status subresource (:data:`KEX`). The test modules import nothing from here: they get the fixtures.
"""
import json
from types import TracebackType
from typing import Any

from kopf._cogs.structs.references import Resource
from kopf.testing import Answer, ApiError, AsyncCluster
from kopf.testing.emulator import KubernetesEmulator

GROUP = 'kopf.dev'
NAMESPACE = 'default'
FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'
DIFFBASE = 'kopf.zalando.org/last-handled-configuration'
CRDS = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions'
MANAGED = 'auto.kopf.dev'  # the tests' managed webhook configurations (settings.admission.managed)
VALIDATING = 'validatingwebhookconfigurations.admissionregistration.k8s.io'
MUTATING = 'mutatingwebhookconfigurations.admissionregistration.k8s.io'

KEX = Resource(GROUP, 'v1', 'kopfexamples', kind='KopfExample', singular='kopfexample',
               namespaced=True, subresources=frozenset({'status'}))


def crd_of(resource: Resource, *, short_names: list[str] | None = None) -> dict[str, Any]:
    """The CRD of a namespaced resource, with no schema (the objects keep any fields)."""
    version: dict[str, Any] = {
        'name': resource.version, 'served': True, 'storage': True,
        'schema': {'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}},
    }
    if 'status' in resource.subresources:
        version['subresources'] = {'status': {}}
    names = {'kind': resource.kind, 'plural': resource.plural, 'singular': resource.singular,
             **({'shortNames': short_names} if short_names else {})}
    return {
        'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
        'metadata': {'name': f'{resource.plural}.{resource.group}'},
        'spec': {'scope': 'Namespaced', 'group': resource.group, 'names': names, 'versions': [version]},
    }


# As examples/crd.yaml (without the printer columns).
CRD = crd_of(KEX, short_names=['kopfexes', 'kopfex', 'kexes', 'kex'])


class EmulatorUser:
    """
    A user of the emulator: makes the API requests (counted), reads the stored objects (not counted).

    With ``checked`` (the default), a request answered with an HTTP error raises
    :class:`kopf.testing.ApiError` (the arrangements must not fail silently); without it, the errors
    are answers like any other, e.g. the admission's denials. The objects are created with ``spec``
    unless a test gives its own.
    """

    def __init__(self, emulator: KubernetesEmulator, *, checked: bool = True, spec: Any = None) -> None:
        self.emulator = emulator
        self.api = AsyncCluster(emulator.kubeconfig_path)
        self.checked = checked
        self.spec = spec if spec is not None else {}

    async def __aenter__(self) -> 'EmulatorUser':
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.api.close()

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = 'application/json') -> Answer:
        answer = await self.api.send(method, path, body, content_type=content_type)
        if self.checked and answer.status >= 400:
            raise ApiError(method, path, answer.status, answer.body, answer.warnings)
        return answer

    @staticmethod
    def path(name: str | None = None, *, namespace: str = NAMESPACE, resource: Resource = KEX,
             subresource: str | None = None, dry_run: bool = False) -> str:
        path = f'/apis/{resource.group}/{resource.version}/namespaces/{namespace}/{resource.plural}'
        path += (f'/{name}' if name else '') + (f'/{subresource}' if subresource else '')
        return path + ('?dryRun=All' if dry_run else '')

    # The arrangements: the requests of a user (or of another controller).

    async def create_namespace(self, name: str) -> Answer:
        return await self.request('POST', '/api/v1/namespaces',
                                  {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}})

    async def create(self, name: str = 'kex1', spec: Any = None, *, namespace: str = NAMESPACE,
                     resource: Resource = KEX, metadata: dict[str, Any] | None = None,
                     labels: dict[str, str] | None = None, status: Any = None, dry_run: bool = False,
                     **fields: Any) -> Answer:
        """An object with the given fields; the status goes separately, as the API ignores it at creation."""
        metadata = {**(metadata or {}), **({'labels': labels} if labels else {})}
        body = {'apiVersion': resource.api_version, 'kind': resource.kind,
                'metadata': {**metadata, 'name': name, 'namespace': namespace},
                'spec': spec if spec is not None else self.spec, **fields}
        path = self.path(namespace=namespace, resource=resource, dry_run=dry_run)
        answer = await self.request('POST', path, body)
        if status is not None:
            subresource = 'status' if 'status' in resource.subresources else None
            answer = await self.patch(name, {'status': status}, namespace=namespace, resource=resource,
                                      subresource=subresource)
        return answer

    async def patch(self, name: str, patch: Any, *, namespace: str = NAMESPACE, resource: Resource = KEX,
                    subresource: str | None = None, dry_run: bool = False) -> Answer:
        path = self.path(name, namespace=namespace, resource=resource, subresource=subresource,
                         dry_run=dry_run)
        return await self.request('PATCH', path, patch, content_type='application/merge-patch+json')

    async def delete(self, name: str = 'kex1', *, namespace: str = NAMESPACE, resource: Resource = KEX,
                     dry_run: bool = False) -> Answer:
        return await self.request('DELETE', self.path(name, namespace=namespace, resource=resource,
                                                      dry_run=dry_run))

    # The inspections: the emulator's stored state, with no requests.

    def get(self, name: str = 'kex1', *, namespace: str = NAMESPACE,
            resource: Resource = KEX) -> dict[str, Any] | None:
        """The object as it is now (read directly from the emulator: no request is made or counted)."""
        return self.emulator.get_object(f'{resource.plural}.{resource.group}', name, namespace=namespace)

    def finalizers(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> list[str]:
        metadata = (self.get(name, namespace=namespace) or {}).get('metadata') or {}
        return list(metadata.get('finalizers') or [])

    def status(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> dict[str, Any]:
        return dict((self.get(name, namespace=namespace) or {}).get('status') or {})

    def annotations(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> dict[str, str]:
        body = self.get(name, namespace=namespace) or {}
        return dict(body.get('metadata', {}).get('annotations', {}))

    def progress_annotations(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> dict[str, str]:
        """Kopf's annotations other than the diff-base: the handlers' progress, the touch-markers."""
        return {key: value for key, value in self.annotations(name, namespace=namespace).items()
                if key.startswith('kopf.zalando.org/') and key != DIFFBASE}

    def diffbase(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> Any:
        encoded = self.annotations(name, namespace=namespace).get(DIFFBASE)
        return json.loads(encoded) if encoded is not None else None

    def events(self, name: str = 'kex1', *, namespace: str = NAMESPACE) -> list[tuple[str, str, str]]:
        """
        The k8s-events (core/v1) of an object: (type, reason, message) in the order of their times.

        The poster's workers post them concurrently, so the order of posting may differ from the order of
        the messages; their ``eventTime`` (the log record's time, in microseconds) keeps the latter.
        """
        events = [event for event in self.emulator.list_objects('events', namespace=namespace)
                  if event.get('involvedObject', {}).get('name') == name]
        events.sort(key=lambda event: (event.get('eventTime') or '',  # the same microsecond: the versions
                                       int(event['metadata']['resourceVersion'])))
        return [(event['type'], event['reason'], event['message']) for event in events]

    def count(self, verb: str, name: str | None = None, *, subresource: str | None = None,
              namespace: str | None = NAMESPACE) -> int:
        """How many requests have been made to the objects (not the CRD) with this verb."""
        return self.emulator.requests.count(verb, KEX.plural, group=GROUP, namespace=namespace, name=name,
                                            subresource=subresource)

    def configuration(self, kind: str, name: str = MANAGED) -> dict[str, Any] | None:
        """A stored webhook configuration: ``validating`` or ``mutating``."""
        return self.emulator.get_object(VALIDATING if kind == 'validating' else MUTATING, name)

    def webhook_names(self, kind: str, name: str = MANAGED) -> list[str]:
        configuration = self.configuration(kind, name) or {}
        return [webhook['name'] for webhook in configuration.get('webhooks') or []]
