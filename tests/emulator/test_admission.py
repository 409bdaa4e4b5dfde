"""Admission webhooks: the emulator calls them and honours their verdicts, patches and warnings."""

import base64
import json
import pathlib
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from .._pki import issue_via_intermediate

CMS = '/api/v1/namespaces/default/configmaps'
VALIDATING = '/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations'
MUTATING = '/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations'


class WebhookServer:
    """A fake admission webhook: records the reviews, answers as configured per URL path."""

    def __init__(self) -> None:
        self.reviews: list[tuple[str, dict[str, Any]]] = []
        self.url = ''

    async def handle(self, request: web.Request) -> web.Response:
        review = await request.json()
        path = request.path
        self.reviews.append((path, review))
        uid = review['request']['uid']
        response: dict[str, Any] = {'uid': uid, 'allowed': True}
        if path == '/deny':
            response = {'uid': uid, 'allowed': False, 'status': {'code': 403, 'message': 'not today'}}
        elif path == '/deny-plain':
            response = {'uid': uid, 'allowed': False}
        elif path == '/mutate':
            patch = [{'op': 'add', 'path': '/metadata/labels', 'value': {'mutated': 'yes'}}]
            response['patch'] = base64.b64encode(json.dumps(patch).encode()).decode()
            response['patchType'] = 'JSONPatch'
            response['warnings'] = ['mutated by the test']
        elif path == '/wrong-uid':
            response['uid'] = 'something-else'
        elif path == '/error':
            return web.Response(status=500, text='oops')
        return web.json_response(
            {'apiVersion': review['apiVersion'], 'kind': 'AdmissionReview', 'response': response}
        )


async def _serve(server: WebhookServer, ssl_context: ssl.SSLContext | None = None) -> web.AppRunner:
    app = web.Application()
    app.router.add_post('/{tail:.*}', server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, '127.0.0.1', 0, ssl_context=ssl_context)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f'{"https" if ssl_context else "http"}://127.0.0.1:{port}'
    return runner


@pytest.fixture
async def webhook() -> AsyncIterator[WebhookServer]:
    server = WebhookServer()
    runner = await _serve(server)
    yield server
    await runner.cleanup()


def configuration(
    url: str,
    *,
    name: str = 'hooks',
    rules: list[dict[str, Any]] | None = None,
    kind: str = 'ValidatingWebhookConfiguration',
    **extra: Any,
) -> dict[str, Any]:
    return {
        'apiVersion': 'admissionregistration.k8s.io/v1',
        'kind': kind,
        'metadata': {'name': name},
        'webhooks': [
            {
                'name': f'{name}.kopf.dev',
                'clientConfig': {'url': url},
                'rules': rules
                or [
                    {
                        'apiGroups': [''],
                        'apiVersions': ['v1'],
                        'operations': ['*'],
                        'resources': ['configmaps'],
                    }
                ],
                'sideEffects': 'None',
                'admissionReviewVersions': ['v1'],
                **extra,
            }
        ],
    }


def configmap(name: str, **metadata: Any) -> dict[str, Any]:
    return {
        'apiVersion': 'v1',
        'kind': 'ConfigMap',
        'metadata': {'name': name, **metadata},
        'data': {'a': 'b'},
    }


async def test_no_configurations_no_calls(api, webhook) -> None:
    assert (await api.post(CMS, configmap('cm1'))).status == 201
    assert webhook.reviews == []


async def test_validating_webhook_denies_with_its_message_and_code(api, webhook) -> None:
    assert (await api.post(VALIDATING, configuration(f'{webhook.url}/deny'))).status == 201
    reply = await api.post(CMS, configmap('cm1'))
    assert reply.status == 403
    assert reply.body['kind'] == 'Status'
    assert reply.body['message'] == 'admission webhook "hooks.kopf.dev" denied the request: not today'
    assert (await api.get(f'{CMS}/cm1')).status == 404

    _, review = webhook.reviews[0]
    request = review['request']
    assert review['apiVersion'] == 'admission.k8s.io/v1'
    assert request['operation'] == 'CREATE'
    assert request['kind'] == {'group': '', 'version': 'v1', 'kind': 'ConfigMap'}
    assert request['resource'] == {'group': '', 'version': 'v1', 'resource': 'configmaps'}
    assert request['namespace'] == 'default'
    assert request['name'] == 'cm1'
    assert request['object']['data'] == {'a': 'b'}
    assert request['oldObject'] is None
    assert request['dryRun'] is False


async def test_denial_without_explanation(api, webhook) -> None:
    await api.post(VALIDATING, configuration(f'{webhook.url}/deny-plain'))
    reply = await api.post(CMS, configmap('cm1'))
    assert reply.status == 400
    assert (
        reply.body['message'] == 'admission webhook "hooks.kopf.dev" denied the request without explanation'
    )


async def test_updates_and_deletions_are_reviewed(api, webhook) -> None:
    await api.post(CMS, configmap('cm1'))
    await api.post(VALIDATING, configuration(f'{webhook.url}/allow'))
    assert (await api.patch(f'{CMS}/cm1', {'data': {'a': 'c'}})).status == 200
    assert (await api.delete(f'{CMS}/cm1')).status == 200
    operations = [
        (
            review['request']['operation'],
            review['request']['object'] is not None,
            review['request']['oldObject'] is not None,
        )
        for _, review in webhook.reviews
    ]
    assert operations == [('UPDATE', True, True), ('DELETE', False, True)]
    assert webhook.reviews[0][1]['request']['object']['data'] == {'a': 'c'}
    assert webhook.reviews[0][1]['request']['oldObject']['data'] == {'a': 'b'}


async def test_mutating_webhook_patches_and_warns(api, webhook) -> None:
    await api.post(MUTATING, configuration(f'{webhook.url}/mutate', kind='MutatingWebhookConfiguration'))
    await api.post(VALIDATING, configuration(f'{webhook.url}/allow'))
    reply = await api.post(CMS, configmap('cm1'))
    assert reply.status == 201
    assert reply.body['metadata']['labels'] == {'mutated': 'yes'}
    assert reply.headers.getall('Warning') == ['299 - "mutated by the test"']
    assert (await api.get(f'{CMS}/cm1')).body['metadata']['labels'] == {'mutated': 'yes'}
    # The validating webhook sees the mutated object, after the mutating one.
    assert [path for path, _ in webhook.reviews] == ['/mutate', '/allow']
    assert webhook.reviews[1][1]['request']['object']['metadata']['labels'] == {'mutated': 'yes'}


@pytest.mark.parametrize(
    'rules',
    [
        [{'apiGroups': ['apps'], 'apiVersions': ['*'], 'operations': ['*'], 'resources': ['*']}],
        [{'apiGroups': [''], 'apiVersions': ['v1'], 'operations': ['DELETE'], 'resources': ['configmaps']}],
        [{'apiGroups': [''], 'apiVersions': ['v1'], 'operations': ['CREATE'], 'resources': ['secrets']}],
        [
            {
                'apiGroups': ['*'],
                'apiVersions': ['*'],
                'operations': ['*'],
                'resources': ['*'],
                'scope': 'Cluster',
            }
        ],
    ],
)
async def test_non_matching_rules_are_not_called(api, webhook, rules: list[dict[str, Any]]) -> None:
    await api.post(VALIDATING, configuration(f'{webhook.url}/deny', rules=rules))
    assert (await api.post(CMS, configmap('cm1'))).status == 201
    assert webhook.reviews == []


async def test_subresource_rules(api, webhook, crd) -> None:
    kexes = '/apis/kopf.dev/v1/namespaces/default/kopfexamples'
    rules = [
        {
            'apiGroups': ['kopf.dev'],
            'apiVersions': ['v1'],
            'operations': ['UPDATE'],
            'resources': ['kopfexamples/status'],
        }
    ]
    await api.post(kexes, {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex1'}})
    await api.post(VALIDATING, configuration(f'{webhook.url}/deny', rules=rules))
    assert (await api.patch(f'{kexes}/kex1', {'spec': {'a': 1}})).status == 200
    assert (await api.patch(f'{kexes}/kex1/status', {'status': {'a': 1}})).status == 403
    assert webhook.reviews[0][1]['request']['subResource'] == 'status'


async def test_object_and_namespace_selectors(api, webhook) -> None:
    await api.post(
        '/api/v1/namespaces',
        {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'guarded', 'labels': {'guard': 'on'}}},
    )
    await api.post(
        VALIDATING,
        configuration(
            f'{webhook.url}/deny',
            objectSelector={'matchExpressions': [{'key': 'skip', 'operator': 'DoesNotExist'}]},
            namespaceSelector={'matchLabels': {'guard': 'on'}},
        ),
    )
    assert (await api.post(CMS, configmap('cm1'))).status == 201  # another namespace
    guarded = '/api/v1/namespaces/guarded/configmaps'
    assert (await api.post(guarded, configmap('cm1', labels={'skip': 'yes'}))).status == 201
    assert (await api.post(guarded, configmap('cm2'))).status == 403


@pytest.mark.parametrize('path', ['/error', '/wrong-uid'])
async def test_failing_webhooks_obey_the_failure_policy(api, webhook, path: str) -> None:
    await api.post(VALIDATING, configuration(f'{webhook.url}{path}', name='strict'))
    reply = await api.post(CMS, configmap('cm1'))
    assert reply.status == 500
    assert reply.body['reason'] == 'InternalError'
    assert 'failed calling webhook "strict.kopf.dev"' in reply.body['message']

    await api.delete(f'{VALIDATING}/strict')
    await api.post(VALIDATING, configuration(f'{webhook.url}{path}', name='lenient', failurePolicy='Ignore'))
    assert (await api.post(CMS, configmap('cm1'))).status == 201


async def test_unreachable_webhooks(api) -> None:
    with socket.socket() as sock:  # a port that nobody listens on
        sock.bind(('127.0.0.1', 0))
        url = f'http://127.0.0.1:{sock.getsockname()[1]}/'
    await api.post(VALIDATING, configuration(url, timeoutSeconds=5))
    reply = await api.post(CMS, configmap('cm1'))
    assert reply.status == 500
    assert 'failed calling webhook' in reply.body['message']


@pytest.fixture
def certificate(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    if shutil.which('openssl') is None:
        pytest.skip('openssl is needed to make a certificate for the HTTPS webhook.')
    cert, key = tmp_path / 'cert.pem', tmp_path / 'key.pem'
    subprocess.run(
        [
            'openssl',
            'req',
            '-x509',
            '-newkey',
            'rsa:2048',
            '-nodes',
            '-days',
            '1',
            '-keyout',
            str(key),
            '-out',
            str(cert),
            '-subj',
            '/CN=127.0.0.1',
            '-addext',
            'subjectAltName=IP:127.0.0.1',
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_https_webhooks_with_ca_bundle(api, certificate) -> None:
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = WebhookServer()
    runner = await _serve(server, context)
    try:
        body = configuration(f'{server.url}/deny')
        body['webhooks'][0]['clientConfig']['caBundle'] = base64.b64encode(cert.read_bytes()).decode()
        await api.post(VALIDATING, body)
        reply = await api.post(CMS, configmap('cm1'))
        assert reply.status == 403
        assert len(server.reviews) == 1

        # Without the CA, the certificate is not trusted: the call fails, and so does the request.
        await api.delete(f'{VALIDATING}/hooks')
        await api.post(VALIDATING, configuration(f'{server.url}/allow'))
        reply = await api.post(CMS, configmap('cm1'))
        assert reply.status == 500
        assert len(server.reviews) == 1
    finally:
        await runner.cleanup()


async def test_https_webhooks_with_an_intermediate_ca_without_key_usage_as_the_bundle(
        api, tmp_path: pathlib.Path,
) -> None:
    # As kube-apiserver: the caBundle's CA is trusted as given (an intermediate one too), with no key usage
    # required (as many clusters' CAs have none), on every Python version.
    intermediate, serving = issue_via_intermediate('webhook', key_usage=False, server=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*serving.write(tmp_path, 'webhook', chain=(intermediate,)))
    server = WebhookServer()
    runner = await _serve(server, context)
    try:
        body = configuration(f'{server.url}/deny')
        body['webhooks'][0]['clientConfig']['caBundle'] = base64.b64encode(intermediate.cert_pem).decode()
        await api.post(VALIDATING, body)
        reply = await api.post(CMS, configmap('cm1'))
        assert reply.status == 403
        assert len(server.reviews) == 1
    finally:
        await runner.cleanup()

