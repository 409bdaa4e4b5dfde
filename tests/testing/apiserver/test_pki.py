"""
The certificates, keys, tokens and kubeconfigs of the control plane, checked without its binaries.
"""
import asyncio
import base64
import pathlib
import ssl
import stat

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kopf._clients.logins.kubeconfig import connection_info_from_kubeconfig, load_kubeconfig
from kopf.testing.apiserver import pki


@pytest.fixture(scope='module')
def serving_ca() -> pki.CertificateAuthority:
    return pki.CertificateAuthority.generate('test-ca')


@pytest.fixture(scope='module')
def client_ca() -> pki.CertificateAuthority:
    return pki.CertificateAuthority.generate('test-client-ca')


@pytest.fixture(scope='module')
def serving(serving_ca: pki.CertificateAuthority) -> pki.KeyPair:
    return serving_ca.issue_serving_certificate('kube-apiserver', dns_names=['localhost'],
                                                ip_addresses=['127.0.0.1', '10.0.0.1'])


@pytest.fixture(scope='module')
def admin(client_ca: pki.CertificateAuthority) -> pki.KeyPair:
    return client_ca.issue_client_certificate('kopf-admin', ['system:masters'])


def load(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_the_ca_is_self_signed_and_a_ca(serving_ca: pki.CertificateAuthority) -> None:
    certificate = load(serving_ca.cert_pem)
    certificate.verify_directly_issued_by(certificate)
    assert certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert certificate.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert certificate.subject.rfc4514_string() == 'CN=test-ca'


def test_the_serving_certificate(serving_ca: pki.CertificateAuthority, serving: pki.KeyPair) -> None:
    certificate = load(serving.cert_pem)
    certificate.verify_directly_issued_by(load(serving_ca.cert_pem))
    sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ['localhost']
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ['127.0.0.1', '10.0.0.1']
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_the_admin_is_in_system_masters(client_ca: pki.CertificateAuthority,
                                        serving_ca: pki.CertificateAuthority, admin: pki.KeyPair) -> None:
    certificate = load(admin.cert_pem)
    certificate.verify_directly_issued_by(load(client_ca.cert_pem))
    with pytest.raises(ValueError):
        certificate.verify_directly_issued_by(load(serving_ca.cert_pem))  # a CA of its own
    assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == 'kopf-admin'
    assert [a.value for a in certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        'system:masters']
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_a_user_in_several_groups(client_ca: pki.CertificateAuthority) -> None:
    certificate = load(client_ca.issue_client_certificate('alice', ['team-a', 'team-b']).cert_pem)
    assert [a.value for a in certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        'team-a', 'team-b']


def test_the_private_key_matches_the_certificate(admin: pki.KeyPair) -> None:
    key = serialization.load_pem_private_key(admin.key_pem, password=None)
    assert admin.key_pem.startswith(b'-----BEGIN EC PRIVATE KEY-----')
    assert key.public_key() == load(admin.cert_pem).public_key()


def test_the_service_account_keys_sign_and_verify() -> None:
    keys = pki.make_service_account_keys()
    private = serialization.load_pem_private_key(keys.private_pem, password=None)
    public = serialization.load_pem_public_key(keys.public_pem)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert isinstance(public, ec.EllipticCurvePublicKey)
    signature = private.sign(b'a token', ec.ECDSA(hashes.SHA256()))
    public.verify(signature, b'a token', ec.ECDSA(hashes.SHA256()))


def test_no_secrets_in_reprs(serving_ca: pki.CertificateAuthority, admin: pki.KeyPair) -> None:
    keys = pki.make_service_account_keys()
    for thing in (serving_ca, admin, keys):
        assert 'PRIVATE' not in repr(thing)
        # No private field by its name (not "key" anywhere: a certificate's random base64 can hold any word;
        # the names have "_", which base64 has not).
        for field in ['key_pem=', 'private_pem=', '_key=', '_certificate=']:
            assert field not in repr(thing)
    for secret in [admin.key_pem, keys.private_pem]:
        body = b''.join(secret.splitlines()[1:-1]).decode()  # the base64 between the PEM's armour lines
        assert all(body not in repr(thing) for thing in (serving_ca, admin, keys))


def test_tokens_are_random_and_long() -> None:
    tokens = {pki.make_token() for _ in range(10)}
    assert len(tokens) == 10
    assert all(len(token) >= 43 for token in tokens)  # 256 bits in URL-safe base64


def test_the_token_file() -> None:
    text = pki.format_token_file([('t0k3n', 'kopf-admin', 'uid1', ['system:masters', 'g2']),
                                  ('other', 'bob', 'uid2', [])])
    assert text == 't0k3n,kopf-admin,uid1,"system:masters,g2"\nother,bob,uid2\n'


def test_the_token_file_refuses_commas_without_telling_the_token() -> None:
    with pytest.raises(ValueError) as err:
        pki.format_token_file([('se,cret', 'user', 'uid', [])])
    assert 'se,cret' not in str(err.value)


def test_the_kubeconfig_embeds_everything(serving_ca: pki.CertificateAuthority, admin: pki.KeyPair) -> None:
    kubeconfig = pki.build_kubeconfig(
        url='https://127.0.0.1:6443', ca_pem=serving_ca.cert_pem, name='cp',
        users={'admin': pki.user_with_certificate(admin), 'admin-token': {'token': 'T'}},
        current_user='admin',
    )
    assert kubeconfig['current-context'] == 'admin'
    assert kubeconfig['clusters'] == [{'name': 'cp', 'cluster': {
        'server': 'https://127.0.0.1:6443',
        'certificate-authority-data': base64.b64encode(serving_ca.cert_pem).decode(),
    }}]
    assert kubeconfig['contexts'] == [
        {'name': 'admin', 'context': {'cluster': 'cp', 'user': 'admin'}},
        {'name': 'admin-token', 'context': {'cluster': 'cp', 'user': 'admin-token'}},
    ]
    user = kubeconfig['users'][0]['user']
    assert base64.b64decode(user['client-certificate-data']) == admin.cert_pem
    assert base64.b64decode(user['client-key-data']) == admin.key_pem


def test_kopf_reads_the_kubeconfig(tmp_path: pathlib.Path, serving_ca: pki.CertificateAuthority,
                                   admin: pki.KeyPair) -> None:
    kubeconfig = pki.build_kubeconfig(
        url='https://127.0.0.1:6443', ca_pem=serving_ca.cert_pem, name='cp',
        users={'admin': pki.user_with_certificate(admin), 'admin-token': {'token': 'T'}},
        current_user='admin',
    )
    path = tmp_path / 'kubeconfig'
    pki.write_private_file(path, pki.dump_kubeconfig(kubeconfig))
    assert yaml.safe_load(path.read_text()) == kubeconfig

    info = connection_info_from_kubeconfig(load_kubeconfig([path]))
    assert info.server == 'https://127.0.0.1:6443'
    assert info.ca_data == serving_ca.cert_pem
    assert info.certificate_data == admin.cert_pem
    assert info.private_key_data == admin.key_pem
    assert info.token is None
    info = connection_info_from_kubeconfig(load_kubeconfig([path]), context_name='admin-token')
    assert info.token == 'T'
    assert info.certificate_data is None


def test_private_files_are_for_the_owner_only(tmp_path: pathlib.Path) -> None:
    path = tmp_path / 'sub' / 'secret'
    pki.write_private_file(path, 'data')
    pki.write_private_file(path, b'more data')  # replaced atomically
    assert path.read_bytes() == b'more data'
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ['secret']


async def test_mutual_tls_with_the_certificates(tmp_path: pathlib.Path, serving_ca: pki.CertificateAuthority,
                                                client_ca: pki.CertificateAuthority, serving: pki.KeyPair,
                                                admin: pki.KeyPair) -> None:
    """Like kube-apiserver: serve by one CA, require the clients' certificates by the other."""
    for name, content in [('ca.crt', serving_ca.cert_pem), ('client-ca.crt', client_ca.cert_pem),
                          ('serving.crt', serving.cert_pem), ('serving.key', serving.key_pem),
                          ('admin.crt', admin.cert_pem), ('admin.key', admin.key_pem)]:
        pki.write_private_file(tmp_path / name, content)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / 'serving.crt', tmp_path / 'serving.key')
    server_context.load_verify_locations(tmp_path / 'client-ca.crt')
    server_context.verify_mode = ssl.CERT_REQUIRED
    peers: list[object] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info('peercert')['subject'])
        writer.write(b'hello')
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, '127.0.0.1', 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    async with server:
        client_context = ssl.create_default_context(cafile=tmp_path / 'ca.crt')
        client_context.load_cert_chain(tmp_path / 'admin.crt', tmp_path / 'admin.key')
        reader, writer = await asyncio.open_connection('127.0.0.1', port, ssl=client_context)
        assert await reader.read() == b'hello'
        writer.close()
        assert peers == [((('organizationName', 'system:masters'),), (('commonName', 'kopf-admin'),))]

        # Without a client certificate, the server refuses it (with TLS 1.3, after the client's handshake).
        anonymous_context = ssl.create_default_context(cafile=tmp_path / 'ca.crt')
        try:
            reader, writer = await asyncio.open_connection('127.0.0.1', port, ssl=anonymous_context)
            data = await reader.read()
            writer.close()
        except (ssl.SSLError, ConnectionError):
            data = b''
        assert data == b''
        assert len(peers) == 1
