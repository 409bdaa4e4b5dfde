"""
The certificates, keys and tokens of a test control plane, made with ``cryptography``; its kubeconfigs.

All keys are ECDSA P-256: made many times faster than RSA-2048 ones (benchmarks/README.md), and accepted by
kube-apiserver for serving, for client certificates, and for signing service-account tokens (ES256).

- the serving CA and the serving certificate (for ``127.0.0.1``, ``localhost`` and the in-cluster
  names of the ``kubernetes`` service);
- the client CA (``--client-ca-file``) and the certificates of users issued by it, the admin
  among them (``O=system:masters``: all permissions with RBAC, by the bootstrap policy);
- the service-account signing key (``--service-account-signing-key-file``) and its public key;
- a random bearer token for a static token file (``--token-auth-file``).

Nothing here puts a key or a token into a ``repr()``: the fields with secrets are hidden there.
"""

import base64
import dataclasses
import datetime
import ipaddress
import os
import pathlib
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    'CertificateAuthority',
    'KeyPair',
    'ServiceAccountKeys',
    'build_kubeconfig',
    'dump_kubeconfig',
    'format_token_file',
    'make_service_account_keys',
    'make_token',
    'user_with_certificate',
    'write_private_file',
]

# Long enough for any test session or a long-running local cluster; not a lasting credential.
VALIDITY = datetime.timedelta(days=365)
CLOCK_SKEW = datetime.timedelta(minutes=5)


@dataclasses.dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, as PEM."""
    cert_pem: bytes
    key_pem: bytes = dataclasses.field(repr=False)


@dataclasses.dataclass(frozen=True)
class ServiceAccountKeys:
    """The key that signs the service accounts' tokens (private, as PEM) and its public key (PEM)."""
    private_pem: bytes = dataclasses.field(repr=False)
    public_pem: bytes


@dataclasses.dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA that issues the serving certificate or the users' client certificates."""
    cert_pem: bytes
    _certificate: x509.Certificate = dataclasses.field(repr=False, compare=False)
    _key: ec.EllipticCurvePrivateKey = dataclasses.field(repr=False, compare=False)

    @classmethod
    def generate(cls, common_name: str) -> 'CertificateAuthority':
        key = _generate_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        public_key = key.public_key()
        certificate = (
            _builder(subject=name, issuer=name, public_key=public_key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(key_cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(certificate.public_bytes(serialization.Encoding.PEM), certificate, key)

    def issue_serving_certificate(
            self,
            common_name: str,
            *,
            dns_names: Iterable[str] = (),
            ip_addresses: Iterable[str] = (),
    ) -> KeyPair:
        """A server certificate for the names and IP addresses (as SANs)."""
        sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(address)) for address in ip_addresses]
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        return self._issue(subject, ExtendedKeyUsageOID.SERVER_AUTH, sans=sans)

    def issue_client_certificate(self, user: str, groups: Sequence[str] = ()) -> KeyPair:
        """A client certificate of a user (``CN``) in groups (``O``s), as kube-apiserver reads them."""
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
        return self._issue(x509.Name(attributes), ExtendedKeyUsageOID.CLIENT_AUTH)

    def _issue(
            self,
            subject: x509.Name,
            usage: x509.ObjectIdentifier,
            *,
            sans: Sequence[x509.GeneralName] = (),
    ) -> KeyPair:
        key = _generate_key()
        builder = (
            _builder(subject=subject, issuer=self._certificate.subject, public_key=key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(digital_signature=True), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        return KeyPair(certificate.public_bytes(serialization.Encoding.PEM), _private_pem(key))


def make_service_account_keys() -> ServiceAccountKeys:
    key = _generate_key()
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo,
    )
    return ServiceAccountKeys(private_pem=_private_pem(key), public_pem=public_pem)


def make_token() -> str:
    """A random bearer token (URL-safe, 256 bits)."""
    return secrets.token_urlsafe(32)


def format_token_file(entries: Iterable[tuple[str, str, str, Sequence[str]]]) -> str:
    """The CSV of ``--token-auth-file``: ``token,user,uid,"group1,group2"`` per line."""
    lines = []
    for token, user, uid, groups in entries:
        for field in (token, user, uid, *groups):
            if any(char in field for char in ',"\n\r'):
                # The field is not quoted in the message: it might be the token.
                raise ValueError('A field of the static token file cannot contain commas, quotes, newlines.')
        line = f'{token},{user},{uid}'
        if groups:
            line += f',"{",".join(groups)}"'
        lines.append(line)
    return ''.join(f'{line}\n' for line in lines)


def build_kubeconfig(
        *,
        url: str,
        ca_pem: bytes,
        name: str,
        users: Mapping[str, Mapping[str, Any]],
        current_user: str,
) -> dict[str, Any]:
    """
    A kubeconfig with one cluster and a context per user (named by the user), all data embedded.

    ``users`` maps the users' names to their kubeconfig fields (e.g. ``client-certificate-data``,
    ``client-key-data``, or ``token``); :func:`user_with_certificate` makes them for a key pair.
    """
    return {
        'apiVersion': 'v1',
        'kind': 'Config',
        'clusters': [{'name': name, 'cluster': {
            'server': url,
            'certificate-authority-data': _b64(ca_pem),
        }}],
        'users': [{'name': user, 'user': dict(fields)} for user, fields in users.items()],
        'contexts': [{'name': user, 'context': {'cluster': name, 'user': user}} for user in users],
        'current-context': current_user,
        'preferences': {},
    }


def user_with_certificate(pair: KeyPair) -> dict[str, str]:
    """The kubeconfig fields of a user authenticated by a client certificate (embedded)."""
    return {'client-certificate-data': _b64(pair.cert_pem), 'client-key-data': _b64(pair.key_pem)}


def write_private_file(path: pathlib.Path, content: str | bytes) -> None:
    """Write a file readable only by its owner, atomically (whoever waits for it never reads half)."""
    data = content.encode() if isinstance(content, str) else content
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f'.{path.name}.tmp')
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    temporary.replace(path)


def dump_kubeconfig(kubeconfig: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(kubeconfig), sort_keys=False)


def _generate_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # "EC PRIVATE KEY": the format that every consumer of kube-apiserver's flags reads.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _builder(
        *, subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + VALIDITY)
    )


def _key_usage(*, key_cert_sign: bool = False, digital_signature: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature, key_cert_sign=key_cert_sign, crl_sign=key_cert_sign,
        content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, encipher_only=False, decipher_only=False,
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode('ascii')
