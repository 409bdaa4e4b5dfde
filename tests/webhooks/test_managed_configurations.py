"""The managed webhook configurations: created, overwritten with the current handlers, cleaned up at exit."""
import base64
import ssl
from typing import Any

import kopf

from .conftest import MANAGED


async def test_configurations_are_created_with_the_handlers(registry, settings, operator, cluster) -> None:
    @kopf.on.validate('kopfexamples', registry=registry, id='check', persistent=True)
    def check(**_: Any) -> None:
        pass

    @kopf.on.mutate('kopfexamples', registry=registry, ignore_failures=True)
    def default(**_: Any) -> None:
        pass

    async with operator(registry, settings):
        validating = cluster.configuration('validating')
        mutating = cluster.configuration('mutating')

    assert validating is not None and mutating is not None
    [check_webhook] = validating['webhooks']
    [default_webhook] = mutating['webhooks']
    assert check_webhook['name'] == f'check.{MANAGED}'
    assert check_webhook['failurePolicy'] == 'Fail'
    assert default_webhook['failurePolicy'] == 'Ignore'
    assert check_webhook['rules'] == [{
        'apiGroups': ['kopf.dev'], 'apiVersions': ['v1'], 'resources': ['kopfexamples'],
        'operations': ['*'], 'scope': '*',
    }]
    assert check_webhook['admissionReviewVersions'] == ['v1', 'v1beta1']
    url = check_webhook['clientConfig']['url']
    assert url.startswith('https://127.0.0.1:') and url.endswith('/check')
    assert default_webhook['clientConfig']['url'].endswith('/default')

    # The CA bundle is what verifies the server: the self-signed certificate itself.
    ca_pem = base64.b64decode(check_webhook['clientConfig']['caBundle']).decode()
    assert ca_pem.startswith('-----BEGIN CERTIFICATE-----')
    ssl.create_default_context(cadata=ca_pem)  # a valid CA for the clients


async def test_stale_webhooks_are_replaced_and_non_persistent_ones_removed_at_exit(
        make_registry, settings, operator, cluster,
) -> None:
    old_registry = make_registry()

    @kopf.on.validate('kopfexamples', registry=old_registry)
    def obsolete(**_: Any) -> None:
        raise kopf.AdmissionError('the old operator denies everything')

    @kopf.on.validate('kopfexamples', registry=old_registry, persistent=True)
    def kept(**_: Any) -> None:
        pass

    async with operator(old_registry, settings):
        assert sorted(cluster.webhook_names('validating')) == [f'kept.{MANAGED}', f'obsolete.{MANAGED}']

    # Only the persistent webhook stays after a graceful exit (still pointing to the stopped server).
    assert cluster.webhook_names('validating') == [f'kept.{MANAGED}']
    assert cluster.webhook_names('mutating') == []

    new_registry = make_registry()

    @kopf.on.validate('kopfexamples', registry=new_registry)
    def current(**_: Any) -> None:
        pass

    @kopf.on.mutate('kopfexamples', registry=new_registry)
    def mutator(patch: kopf.Patch, **_: Any) -> None:
        patch.spec['mutated'] = True

    settings.admission.server = kopf.WebhookServer(addr='127.0.0.1', port=0)
    async with operator(new_registry, settings):
        assert cluster.webhook_names('validating') == [f'current.{MANAGED}']
        assert cluster.webhook_names('mutating') == [f'mutator.{MANAGED}']
        answer = await cluster.create('kex1', {})
        assert answer.status == 201
        assert (cluster.get('kex1') or {})['spec'] == {'mutated': True}


async def test_configurations_follow_the_resources_as_they_appear(registry, settings, operator, cluster,
                                                                  eventually) -> None:
    @kopf.on.validate('kopf.dev', 'v1', 'latecomers', registry=registry)
    def late(**_: Any) -> None:
        raise kopf.AdmissionError('too late', code=403)

    crd = {
        'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
        'metadata': {'name': 'latecomers.kopf.dev'},
        'spec': {
            'scope': 'Namespaced', 'group': 'kopf.dev',
            'names': {'kind': 'Latecomer', 'plural': 'latecomers', 'singular': 'latecomer'},
            'versions': [{'name': 'v1', 'served': True, 'storage': True, 'schema': {
                'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}}}],
        },
    }
    async with operator(registry, settings, configured=0):
        assert cluster.webhook_names('validating') == []
        await cluster.request('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', crd)
        await eventually(lambda: cluster.webhook_names('validating') == [f'late.{MANAGED}'])
        answer = await cluster.request('POST', '/apis/kopf.dev/v1/namespaces/default/latecomers', {
            'apiVersion': 'kopf.dev/v1', 'kind': 'Latecomer', 'metadata': {'name': 'x'}})
    assert answer.status == 403
    assert 'too late' in answer.message


async def test_unmanaged_server_leaves_configurations_alone(registry, settings, operator, cluster) -> None:
    @kopf.on.validate('kopfexamples', registry=registry)
    def check(**_: Any) -> None:
        pass

    settings.admission.managed = None
    async with operator(registry, settings):
        pass
    assert cluster.configuration('validating') is None
    assert cluster.configuration('mutating') is None
