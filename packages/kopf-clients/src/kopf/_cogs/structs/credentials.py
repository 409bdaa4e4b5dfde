"""
Credentials as the login functions produce them and the API client consumes them.

The vault that keeps several of them with priorities lives in ``kopf._clients.vault``.
"""
import dataclasses
import datetime
from typing import Any, NewType

VaultKey = NewType('VaultKey', str)


class LoginError(Exception):
    """Raised when the operator cannot authenticate with the Kubernetes API."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class KubeContext:
    """
    What every kind of credentials has: the API endpoint, the priority, the namespace, the expiration.

    The login functions return one of its kinds (:class:`ConnectionInfo` or :class:`AiohttpSession`).
    Naive ``expiration`` times are taken as UTC.
    """

    server: str
    priority: int = 0
    default_namespace: str | None = None  # used for cluster objects' namespace-less requests.
    expiration: datetime.datetime | None = None  # TZ-naive or TZ-aware; naive means UTC.


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConnectionInfo(KubeContext):
    """
    One API endpoint with its credentials and connection flags.

    The login functions return it; the API client turns it into an HTTP session.
    """

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class AiohttpSession(KubeContext):
    """
    A custom ``aiohttp.ClientSession`` to make the API requests with, instead of the built-in client.

    For what the built-in client does not do (e.g. a custom connector or TLS set-up, request tracing):
    the session carries its own authentication (headers, certificates). The requests go to ``server``
    with paths relative to it. The session stays the caller's: the framework does not close it.
    """

    aiohttp_session: Any  # aiohttp.ClientSession: not imported here (aiohttp is imported only when used)

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(server={self.server!r}, priority={self.priority!r}, '
                f'aiohttp_session=<{type(self.aiohttp_session).__name__}>)')

    __str__ = __repr__
