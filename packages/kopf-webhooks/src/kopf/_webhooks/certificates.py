"""
Self-signed certificates for the development-mode webhook servers.

The ``cryptography`` package makes them (a dependency of kopf-webhooks). ``certbuilder`` is used only
as a fallback where ``cryptography`` is not importable: it relies on ``oscrypto``, whose releases
up to 1.3.0 cannot parse the versions of OpenSSL 3.0.10+ and fail with "Error detecting the version
of libcrypto" on most modern systems.

The certificate is its own CA (``caBundle`` in the webhook configurations): one self-signed
certificate with the server's host names and IP addresses as SANs, usable both as the server's
certificate and as the trust anchor of its clients (the apiservers, curl, the emulator).
"""
import datetime
import ipaddress
from collections.abc import Collection

__all__ = ['build_certificate', 'split_hostnames']

# The addresses that mean "all interfaces" when listening: never a valid SAN of a reachable endpoint.
_MAGIC_ADDRESSES = frozenset({'0.0.0.0', '::'})

# Long enough for any development session, short enough to not be a lasting credential.
VALIDITY = datetime.timedelta(days=180)


def split_hostnames(hostnames: Collection[str]) -> tuple[list[str], list[str]]:
    """The DNS names and the IP addresses (normalised) among the host names, deduplicated, in order."""
    names: list[str] = []
    addresses: list[str] = []
    for hostname in hostnames:
        if not hostname:
            continue
        hostname = hostname.strip('[]')  # IPv6 addresses as in URLs
        try:
            address = str(ipaddress.ip_address(hostname))
        except ValueError:
            if hostname not in names:
                names.append(hostname)
        else:
            if address not in _MAGIC_ADDRESSES and address not in addresses:
                addresses.append(address)
    return names, addresses


def build_certificate(
        hostnames: Collection[str],
        password: str | None = None,
) -> tuple[bytes, bytes]:
    """
    Make a self-signed certificate for the host names & addresses; return it and its private key as PEM.

    The first DNS name is the common name (or the first IP address if there are no names);
    all of them are the SANs. The private key is encrypted with the password if given.
    """
    names, addresses = split_hostnames(hostnames)
    if not names and not addresses:
        raise ValueError(f'No host names or IP addresses to build a certificate for: {list(hostnames)!r}.')
    try:
        return _build_with_cryptography(names, addresses, password)
    except ImportError:
        pass
    try:
        return _build_with_certbuilder(names, addresses, password)
    except ImportError:
        raise ImportError(
            'Self-signed certificates need the "cryptography" package, which is not installed. '
            'Install it with: pip install kopf-webhooks  (it is a dependency), or: pip install cryptography; '
            'or give the webhook server a certificate (certfile=, pkeyfile=), or run it with insecure=True.'
        ) from None


def _build_with_cryptography(
        names: list[str], addresses: list[str], password: str | None,
) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    common_name = (names or addresses)[0]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    sans += [x509.IPAddress(ipaddress.ip_address(address)) for address in addresses]
    now = datetime.datetime.now(datetime.UTC)
    public_key = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate small clock skews
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False,
        ), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public_key), critical=False)
        .sign(key, hashes.SHA256())
    )
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    cert_pem = certificate.public_bytes(serialization.Encoding.PEM)
    pkey_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    return cert_pem, pkey_pem


def _build_with_certbuilder(  # pragma: no cover  # only where cryptography is absent
        names: list[str], addresses: list[str], password: str | None,
) -> tuple[bytes, bytes]:
    import certbuilder  # type: ignore[import-untyped,import-not-found,unused-ignore]
    import oscrypto.asymmetric  # type: ignore[import-untyped,import-not-found,unused-ignore]

    public_key, private_key = oscrypto.asymmetric.generate_pair('ec', curve='secp256r1')
    builder = certbuilder.CertificateBuilder({'common_name': (names or addresses)[0]}, public_key)
    builder.self_signed = True
    builder.ca = True
    builder.subject_alt_domains = names
    builder.subject_alt_ips = addresses
    certificate = builder.build(private_key)
    cert_pem: bytes = certbuilder.pem_armor_certificate(certificate)
    pkey_pem: bytes = oscrypto.asymmetric.dump_private_key(private_key, password, target_ms=10)
    return cert_pem, pkey_pem
