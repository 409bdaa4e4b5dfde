"""The webhook servers: HTTP answers to bad reviews, certificates, client certificates, custom servers."""
import asyncio
import base64
import datetime
import json
import pathlib
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from cryptography import x509

import kopf

from .._pki import issue_via_intermediate
from .conftest import MANAGED

REVIEW: dict[str, Any] = {
    'kind': 'AdmissionReview',
    'apiVersion': 'admission.k8s.io/v1',
    'request': {
        'uid': '1ca13837-ad60-4c9e-abb8-86f29d6c0e84',
        'kind': {'group': 'kopf.dev', 'version': 'v1', 'kind': 'KopfExample'},
        'resource': {'group': 'kopf.dev', 'version': 'v1', 'resource': 'kopfexamples'},
        'name': 'kopf-example-1',
        'namespace': 'default',
        'operation': 'CREATE',
        'userInfo': {'username': 'admin', 'uid': 'admin', 'groups': ['system:masters']},
        'object': {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample',
                   'metadata': {'name': 'kopf-example-1', 'namespace': 'default'}, 'spec': {'x': 1}},
        'oldObject': None,
        'dryRun': True,
    },
}


def webhook_url(cluster: Any, kind: str = 'validating') -> tuple[str, ssl.SSLContext]:
    """The URL of the first managed webhook and the SSL context that trusts its server (by the caBundle)."""
    webhook = (cluster.configuration(kind) or {})['webhooks'][0]
    config = webhook['clientConfig']
    context = ssl.create_default_context(cadata=base64.b64decode(config['caBundle']).decode())
    return config['url'], context


async def post(url: str, data: Any, *, ssl_context: ssl.SSLContext | bool = True,
               raw: bool = False) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        body = data if raw else json.dumps(data).encode()
        async with session.post(url, data=body, ssl=ssl_context) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text


@pytest.fixture
def check_registry(registry: kopf.OperatorRegistry) -> kopf.OperatorRegistry:
    @kopf.on.validate('kopfexamples', registry=registry, id='check')
    def check(spec: Any, warnings: list[str], **_: Any) -> None:
        warnings.append(f'x={spec.get("x")}')
        if spec.get('x') == 'bad':
            raise kopf.AdmissionError('x is bad', code=422)

    return registry


async def test_reviews_posted_directly(check_registry, settings, operator, cluster) -> None:
    async with operator(check_registry, settings):
        url, context = webhook_url(cluster)
        status, answer = await post(url, REVIEW, ssl_context=context)
        minimal = {**REVIEW, 'request': {**REVIEW['request'], 'object': {}, 'userInfo': None}}
        minimal_status, minimal_answer = await post(url, minimal, ssl_context=context)
        bad = json.loads(json.dumps(REVIEW))
        bad['request']['object']['spec']['x'] = 'bad'
        bad_status, bad_answer = await post(url, bad, ssl_context=context)
        unaddressed_status, unaddressed = await post(url.rsplit('/', 1)[0], REVIEW, ssl_context=context)

    assert status == 200
    assert answer == {'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview', 'response': {
        'uid': REVIEW['request']['uid'], 'allowed': True, 'warnings': ['x=1']}}
    assert minimal_status == 200  # no metadata, no spec, no user: still a review
    assert minimal_answer['response']['allowed'] is True
    assert bad_status == 200
    assert bad_answer['response']['allowed'] is False
    assert bad_answer['response']['status'] == {'message': 'x is bad', 'code': 422}
    assert unaddressed_status == 200
    assert unaddressed['response']['allowed'] is True


async def test_v1beta1_reviews_are_answered_as_v1beta1(check_registry, settings, operator, cluster) -> None:
    async with operator(check_registry, settings):
        url, context = webhook_url(cluster)
        status, answer = await post(url, {**REVIEW, 'apiVersion': 'admission.k8s.io/v1beta1'},
                                    ssl_context=context)
    assert status == 200
    assert answer['apiVersion'] == 'admission.k8s.io/v1beta1'
    assert answer['response']['allowed'] is True


def _without(path: tuple[str, ...]) -> dict[str, Any]:
    review = json.loads(json.dumps(REVIEW))
    target = review
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return review


@pytest.mark.parametrize('payload, raw, expected', [
    pytest.param(b'{not json', True, 'not a JSON admission review', id='bad-json'),
    pytest.param([1, 2], False, 'must be a JSON object', id='not-an-object'),
    pytest.param({**REVIEW, 'kind': 'Pod'}, False, "got kind='Pod'", id='wrong-kind'),
    pytest.param({**REVIEW, 'apiVersion': 'v1'}, False, "apiVersion='v1'", id='wrong-api-version'),
    pytest.param(_without(('request',)), False, 'no "request" object', id='no-request'),
    pytest.param(_without(('request', 'uid')), False, 'no "request.uid"', id='no-uid'),
    pytest.param(_without(('request', 'resource')), False, 'no valid "request.resource"', id='no-resource'),
    pytest.param({**REVIEW, 'request': {**REVIEW['request'], 'operation': 'EXPLODE'}}, False,
                 "Unknown \"request.operation\": 'EXPLODE'", id='bad-operation'),
    pytest.param({**REVIEW, 'request': {**REVIEW['request'], 'object': None}}, False,
                 'neither "request.object" nor "request.oldObject"', id='no-object'),
    pytest.param({**REVIEW, 'request': {**REVIEW['request'], 'object': 'str'}}, False,
                 '"request.object" must be an object', id='bad-object'),
    pytest.param({**REVIEW, 'request': {**REVIEW['request'], 'object': {'metadata': []}}}, False,
                 '"request.object.metadata" must be an object', id='bad-metadata'),
    pytest.param({**REVIEW, 'request': {**REVIEW['request'],
                                        'resource': {'group': 'x', 'version': 'v1', 'resource': 'pods'}}},
                 False, "The resource 'pods.x' (version 'v1') has no admission handlers",
                 id='unknown-resource'),
])
async def test_malformed_reviews_get_400(check_registry, settings, operator, cluster, caplog,
                                         payload, raw, expected) -> None:
    async with operator(check_registry, settings):
        url, context = webhook_url(cluster)
        status, answer = await post(url, payload, ssl_context=context, raw=raw)
    assert status == 400
    assert expected in answer
    assert not [record for record in caplog.records if record.exc_info]  # no tracebacks in the logs


async def test_unknown_webhooks_and_paths(check_registry, settings, operator, cluster) -> None:
    settings.admission.server = kopf.WebhookServer(addr='127.0.0.1', port=0, path='/hooks/')
    async with operator(check_registry, settings):
        url, context = webhook_url(cluster)
        root = url.rsplit('/', 2)[0]
        unknown_status, unknown = await post(f'{root}/hooks/nonexistent', REVIEW, ssl_context=context)
        outside_status, _ = await post(f'{root}/elsewhere/check', REVIEW, ssl_context=context)
        async with aiohttp.ClientSession() as session, session.get(url, ssl=context) as response:
            get_status = response.status
    assert url.endswith('/hooks/check')
    assert unknown_status == 400
    assert "Unknown webhook 'nonexistent'" in unknown
    assert outside_status == 404
    assert get_status == 405


async def test_handlers_exceptions_are_denials_not_http_errors(registry, settings, operator, cluster) -> None:
    @kopf.on.mutate('kopfexamples', registry=registry)
    def broken(**_: Any) -> None:
        raise kopf.TemporaryError('try later')

    async with operator(registry, settings):
        url, context = webhook_url(cluster, 'mutating')
        status, answer = await post(url, REVIEW, ssl_context=context)
    assert status == 200
    assert answer['response'] == {'uid': REVIEW['request']['uid'], 'allowed': False,
                                  'status': {'message': 'try later', 'code': 500}}


#
# Certificates.
#

def test_self_signed_certificate_has_the_sans() -> None:
    hostnames = ['localhost', '127.0.0.1', '0.0.0.0', 'example.com', '::1']
    cert_pem, pkey_pem = kopf.WebhookServer.build_certificate(hostnames)
    cert = x509.load_pem_x509_certificate(cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ['localhost', 'example.com']
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ['127.0.0.1', '::1']
    assert cert.subject.rfc4514_string() == 'CN=localhost'
    assert pkey_pem.startswith(b'-----BEGIN PRIVATE KEY-----')


def test_self_signed_certificate_without_hosts_is_an_error() -> None:
    with pytest.raises(ValueError, match='No host names or IP addresses'):
        kopf.WebhookServer.build_certificate(['0.0.0.0'])


async def serve(server: Any, fn: Any) -> Any:
    """Start a server in the background; return its first config and the generator (to close it)."""
    generator = server(fn)
    config = await asyncio.wait_for(generator.__anext__(), timeout=5)
    return config, generator


async def echo(request: Any, *, webhook: Any = None, headers: Any = None, sslpeer: Any = None) -> Any:
    auth = (headers or {}).get('Authorization')
    return {'webhook': webhook, 'sslpeer': sslpeer, 'auth': auth, 'request': request}


async def test_given_certificate_with_password_and_cadump(tmp_path: pathlib.Path) -> None:
    cert_pem, pkey_pem = kopf.WebhookServer.build_certificate(['localhost'], password='secret')
    (tmp_path / 'cert.pem').write_bytes(cert_pem)
    (tmp_path / 'pkey.pem').write_bytes(pkey_pem)
    server = kopf.WebhookServer(port=0, certfile=tmp_path / 'cert.pem', pkeyfile=tmp_path / 'pkey.pem',
                                password='secret', cafile=tmp_path / 'cert.pem', cadump=tmp_path / 'dump.pem')
    async with server:
        config, _ = await serve(server, echo)
        context = ssl.create_default_context(cafile=str(tmp_path / 'dump.pem'))
        status, answer = await post(config['url'] + '/hook%2Fid', {'x': 1}, ssl_context=context)
    assert config['url'].startswith('https://localhost:')
    assert base64.b64decode(config['caBundle']) == cert_pem
    assert (tmp_path / 'dump.pem').read_bytes() == cert_pem
    assert status == 200
    assert answer == {'webhook': 'hook/id', 'sslpeer': None, 'auth': None, 'request': {'x': 1}}


def make_client_certificate(name: str) -> tuple[bytes, bytes]:
    """A self-signed client certificate (as in the docs' example with openssl)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


async def test_client_certificates_are_passed_as_sslpeer(tmp_path: pathlib.Path) -> None:
    client_cert, client_key = make_client_certificate('client.example.com')
    (tmp_path / 'client.pem').write_bytes(client_cert)
    (tmp_path / 'client-key.pem').write_bytes(client_key)
    server = kopf.WebhookServer(port=0, verify_cafile=tmp_path / 'client.pem', cadump=tmp_path / 'ca.pem')
    async with server:
        config, _ = await serve(server, echo)
        context = ssl.create_default_context(cafile=str(tmp_path / 'ca.pem'))
        context.load_cert_chain(tmp_path / 'client.pem', tmp_path / 'client-key.pem')
        url = config['url'].replace('https://', 'https://user:pass@')
        status, answer = await post(url, {}, ssl_context=context)
    assert status == 200
    assert answer['sslpeer']['subject'] == [[['commonName', 'client.example.com']]]
    assert answer['auth'] == 'Basic ' + base64.b64encode(b'user:pass').decode()


async def test_client_certificates_verified_by_an_intermediate_ca_without_key_usage(
        tmp_path: pathlib.Path,
) -> None:
    # As kube-apiserver verifies its clients: the given CA is trusted as it is (not only a self-signed root),
    # and its key usage is not required (many clusters' CAs have none), on every Python version.
    intermediate, client = issue_via_intermediate('client.example.com', key_usage=False, client=True)
    server = kopf.WebhookServer(addr='127.0.0.1', port=0, verify_cadata=intermediate.cert_pem,
                                verify_mode=ssl.CERT_REQUIRED, cadump=tmp_path / 'ca.pem')
    async with server:
        config, _ = await serve(server, echo)
        context = ssl.create_default_context(cafile=str(tmp_path / 'ca.pem'))
        context.check_hostname = False
        context.load_cert_chain(*client.write(tmp_path, 'client', chain=(intermediate,)))
        status, answer = await post(config['url'], {}, ssl_context=context)
    assert status == 200
    assert answer['sslpeer']['subject'] == [[['commonName', 'client.example.com']]]


async def test_docs_example_of_authentication_with_a_client_certificate_as_ca(
        tmp_path: pathlib.Path,
) -> None:
    client_cert, client_key = make_client_certificate('Example Common Name')
    (tmp_path / 'client-cert.pem').write_bytes(client_cert)
    (tmp_path / 'client-key.pem').write_bytes(client_key)
    server = kopf.WebhookServer(addr='127.0.0.1', port=0, cafile=tmp_path / 'client-cert.pem')
    async with server:
        config, _ = await serve(server, echo)
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # as "curl --insecure" in the docs
        context.load_cert_chain(tmp_path / 'client-cert.pem', tmp_path / 'client-key.pem')
        with_cert_status, with_cert = await post(config['url'], {}, ssl_context=context)
        without_cert_status, without_cert = await post(config['url'], {}, ssl_context=False)
    assert with_cert_status == 200
    assert with_cert['sslpeer']['subject'] == [[['commonName', 'Example Common Name']]]
    assert without_cert_status == 200
    assert without_cert['sslpeer'] is None


async def test_insecure_server_serves_http_without_ca() -> None:
    server = kopf.WebhookServer(addr='127.0.0.1', port=0, insecure=True)
    async with server:
        config, _ = await serve(server, echo)
        status, _ = await post(config['url'], {})
    assert config == {'url': config['url']}
    assert config['url'].startswith('http://127.0.0.1:')
    assert status == 200


async def test_exiting_the_context_stops_the_server() -> None:
    server = kopf.WebhookServer(addr='127.0.0.1', port=0, insecure=True)
    async with server:
        config, _ = await serve(server, echo)
    with pytest.raises(aiohttp.ClientConnectionError):
        await post(config['url'], {})


@pytest.mark.parametrize('kwargs, message', [
    ({'certfile': 'x.pem'}, 'give both certfile= and pkeyfile='),
    ({'insecure': True, 'certfile': 'x.pem', 'pkeyfile': 'y.pem'}, 'insecure=True serves plain HTTP'),
    ({'port': 70000}, 'port= must be an integer'),
])
def test_bad_server_options(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kopf.WebhookServer(**kwargs)


@pytest.mark.parametrize('cls, host', [
    ('WebhookK3dServer', 'host.k3d.internal'),
    ('WebhookMinikubeServer', 'host.minikube.internal'),
    ('WebhookDockerDesktopServer', 'host.docker.internal'),
])
async def test_cluster_specific_servers_use_their_host_names(cls: str, host: str) -> None:
    server = getattr(kopf, cls)(port=0)
    async with server:
        config, _ = await serve(server, echo)
    assert config['url'].startswith(f'https://{host}:')
    cert = x509.load_pem_x509_certificate(base64.b64decode(config['caBundle']))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [host]


#
# Custom servers: the documented protocol (a callable yielding client configs), with the operator.
#

async def test_custom_server_function(registry, settings, operator, cluster) -> None:
    calls: list[Any] = []

    @kopf.on.validate('kopfexamples', registry=registry, id='check')
    def check(spec: Any, headers: Any, **_: Any) -> None:
        calls.append((spec, dict(headers)))

    async def mytunnel(fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        response = await fn(REVIEW, webhook='check', headers={'X-Test': 'yes'})
        calls.append(response['response'])
        yield {'url': 'https://example.com/hooks'}
        await asyncio.Event().wait()

    settings.admission.server = mytunnel
    async with operator(registry, settings):
        webhook = (cluster.configuration('validating') or {})['webhooks'][0]

    assert webhook['clientConfig'] == {'url': 'https://example.com/hooks/check'}
    assert calls == [({'x': 1}, {'X-Test': 'yes'}), {'uid': REVIEW['request']['uid'], 'allowed': True}]


async def test_custom_server_with_service_config(registry, settings, operator, cluster) -> None:
    @kopf.on.mutate('kopfexamples', registry=registry, id='fn/x')
    def fn(**_: Any) -> None:
        pass

    class MyServer:
        async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
            service: kopf.WebhookClientConfigService = {
                'namespace': 'ns', 'name': 'svc', 'port': 443, 'path': '/root'}
            yield {'service': service, 'caBundle': 'Q0E='}
            await asyncio.Event().wait()

    settings.admission.server = MyServer()
    async with operator(registry, settings):
        webhook = (cluster.configuration('mutating') or {})['webhooks'][0]

    assert webhook['name'] == f'fn-x.{MANAGED}'
    assert webhook['clientConfig'] == {'service': {'namespace': 'ns', 'name': 'svc', 'port': 443,
                                                   'path': '/root/fn%2Fx'}, 'caBundle': 'Q0E='}


async def test_exited_server_stops_the_operator(registry, settings, cluster) -> None:
    @kopf.on.validate('kopfexamples', registry=registry)
    def fn(**_: Any) -> None:
        pass

    async def shortlived(fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        yield {'url': 'https://example.com/'}

    settings.admission.server = shortlived
    with pytest.raises(RuntimeError, match='has exited'):
        await asyncio.wait_for(kopf.operator(registry=registry, settings=settings, namespaces=['default']),
                               timeout=10)


async def test_handlers_without_a_server_fail_the_start(registry, settings, cluster) -> None:
    @kopf.on.validate('kopfexamples', registry=registry)
    def fn(**_: Any) -> None:
        pass

    settings.admission.server = None
    settings.admission.managed = None
    with pytest.raises(RuntimeError, match=r"Admission handlers exist \('fn'\), but no webhook server"):
        await asyncio.wait_for(kopf.operator(registry=registry, settings=settings, namespaces=['default']),
                               timeout=10)


async def test_managed_configurations_without_a_server_fail_the_start(registry, settings, cluster) -> None:
    settings.admission.server = None
    with pytest.raises(RuntimeError, match='needs a webhook server'):
        await asyncio.wait_for(kopf.operator(registry=registry, settings=settings, namespaces=['default']),
                               timeout=10)


async def test_one_failure_is_reported_by_priority(registry, settings, operator, cluster) -> None:
    calls: list[str] = []

    @kopf.on.validate('kopfexamples', registry=registry)
    def arbitrary(**_: Any) -> None:
        calls.append('arbitrary')
        raise ValueError('arbitrary')

    @kopf.on.validate('kopfexamples', registry=registry)
    def temporary(**_: Any) -> None:
        calls.append('temporary')
        raise kopf.TemporaryError('temporary')

    @kopf.on.validate('kopfexamples', registry=registry)
    def admission(spec: Any, **_: Any) -> None:
        calls.append('admission')
        if spec.get('x') == 1:
            raise kopf.AdmissionError('admission', code=403)

    @kopf.on.validate('kopfexamples', registry=registry)
    def permanent(**_: Any) -> None:
        calls.append('permanent')
        raise kopf.PermanentError('permanent')

    other = json.loads(json.dumps(REVIEW))
    other['request']['object']['spec']['x'] = 2
    async with operator(registry, settings):
        url, context = webhook_url(cluster)
        root = url.rsplit('/', 1)[0]  # not addressed: all the handlers of the resource
        _, with_admission_error = await post(root, REVIEW, ssl_context=context)
        _, without_admission_error = await post(root, other, ssl_context=context)

    assert calls == ['arbitrary', 'temporary', 'admission', 'permanent'] * 2  # all validators run
    assert with_admission_error['response']['status'] == {'message': 'admission', 'code': 403}
    assert without_admission_error['response']['status'] == {'message': 'permanent', 'code': 500}


def test_the_framework_does_not_import_the_webhook_servers() -> None:
    # The admission engine is in kopf-core: without kopf-webhooks, the operators still run.
    code = ('import sys, kopf; import kopf._core.engines.admission; '
            'print(sorted(name for name in sys.modules '
            'if name.startswith(("kopf._webhooks", "aiohttp.web"))))')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60,
                            check=True)
    assert result.stdout.strip() == '[]'
