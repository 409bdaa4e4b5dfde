"""
Certificates for the TLS tests, as the clusters in the wild have them: chains with intermediate CAs, CAs
with no key usage extension (which Python 3.13's default verification rejects, and Kubernetes accepts).
"""
import dataclasses
import datetime
import ipaddress
import pathlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclasses.dataclass(frozen=True)
class Issued:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())

    def write(self, directory: pathlib.Path, name: str, *,
              chain: tuple['Issued', ...] = ()) -> tuple[str, str]:
        """The certificate (followed by the ``chain``'s) and the key as files, for ``load_cert_chain()``."""
        cert_path, key_path = directory / f'{name}.crt', directory / f'{name}.key'
        cert_path.write_bytes(self.cert_pem + b''.join(issued.cert_pem for issued in chain))
        key_path.write_bytes(self.key_pem)
        return str(cert_path), str(key_path)


def issue(name: str, *, issuer: Issued | None = None, ca: bool = False, key_usage: bool = True,
          server: bool = False, client: bool = False) -> Issued:
    """
    A certificate signed by the ``issuer`` (self-signed if None).

    ``key_usage=False``: with no key usage extension, as the CAs of e.g. MicroK8s (and older hand-made ones).
    ``server``: for ``localhost`` and ``127.0.0.1``; ``client``: for the client authentication.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(subject)
               .issuer_name(issuer.cert.subject if issuer is not None else subject)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=1))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), critical=False)
    if key_usage:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=not ca, key_cert_sign=ca, crl_sign=ca, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName('localhost'), x509.IPAddress(ipaddress.ip_address('127.0.0.1'))]), critical=False)
    if server or client:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    cert = builder.sign(issuer.key if issuer is not None else key, hashes.SHA256())
    return Issued(cert=cert, key=key)


def issue_via_intermediate(name: str, *, key_usage: bool = True, server: bool = False,
                           client: bool = False) -> tuple[Issued, Issued]:
    """
    An intermediate CA (signed by a root CA, with or without the key usage), and a certificate signed by it.

    For the tests that trust the intermediate CA alone, as Kubernetes' programs can (not the root).
    """
    root = issue('root-ca', ca=True)
    intermediate = issue('intermediate-ca', issuer=root, ca=True, key_usage=key_usage)
    return intermediate, issue(name, issuer=intermediate, server=server, client=client)

