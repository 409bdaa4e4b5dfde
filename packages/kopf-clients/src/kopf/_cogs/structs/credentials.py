"""
Credentials as the login functions produce them and the API client consumes them.

The vault that keeps several of them with priorities lives in ``kopf._clients.vault``.
"""
import dataclasses
import datetime
from typing import NewType

VaultKey = NewType('VaultKey', str)


class LoginError(Exception):
    """Raised when the operator cannot authenticate with the Kubernetes API."""


@dataclasses.dataclass(frozen=True)
class ConnectionInfo:
    """
    One API endpoint with its credentials and connection flags.

    The login functions return it; the API client turns it into an HTTP session.
    Naive ``expiration`` times are taken as UTC.
    """

    server: str
    ca_path: str | None = None
    ca_data: bytes | None = None
    insecure: bool | None = None
    username: str | None = None
    password: str | None = None
    scheme: str | None = None  # RFC-7235/5.1: e.g. Bearer, Basic, Digest, etc.
    token: str | None = None
    certificate_path: str | None = None
    certificate_data: bytes | None = None
    private_key_path: str | None = None
    private_key_data: bytes | None = None
    default_namespace: str | None = None  # used for cluster objects' namespace-less requests.
    priority: int = 0
    expiration: datetime.datetime | None = None  # TZ-naive or TZ-aware; naive means UTC.
    proxy_url: str | None = None
    trust_env: bool = False

    def __repr__(self) -> str:
        # Secrets never go to logs or tracebacks: only say which of them are present.
        hidden = {'password', 'token', 'certificate_data', 'private_key_data', 'ca_data'}
        parts = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None or (field.name in ('priority',) and value == 0):
                continue
            parts.append(f'{field.name}=<hidden>' if field.name in hidden else f'{field.name}={value!r}')
        return f'{type(self).__name__}({", ".join(parts)})'

    __str__ = __repr__
