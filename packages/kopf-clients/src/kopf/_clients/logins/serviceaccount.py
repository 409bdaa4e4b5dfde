"""
The built-in in-cluster login: the pod's service account, as mounted by Kubernetes.

The API endpoint comes from the ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT``
environment variables, the credentials from the service account directory: ``token``,
``ca.crt`` and ``namespace``. The kubelet rotates the token file in place, so the file is
re-read on every login; if the token declares its expiry (a JWT with ``exp``), the credentials
are marked to expire slightly earlier, so that the vault asks for a fresh token in time.
"""
import base64
import binascii
import datetime
import json
import os
from pathlib import Path
from typing import Any

from kopf._cogs.configs.networking import ClientSettings
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError

SERVICE_ACCOUNT_DIR = Path('/var/run/secrets/kubernetes.io/serviceaccount')
SERVICE_HOST_ENV_VAR = 'KUBERNETES_SERVICE_HOST'
SERVICE_PORT_ENV_VAR = 'KUBERNETES_SERVICE_PORT'

# How long before the token's own expiry the credentials are considered expired. The kubelet
# replaces the token file well before that (at 80% of the token's lifetime), so by then
# a fresh token is already in the file.
TOKEN_EXPIRY_MARGIN = datetime.timedelta(minutes=1)


def login_with_service_account(
        *,
        settings: ClientSettings,
        service_account_dir: str | os.PathLike[str] | None = None,
        **_: Any,
) -> ConnectionInfo | None:
    """
    Log in with the pod's service account when running inside a cluster.

    Returns ``None`` outside of a cluster (no ``KUBERNETES_SERVICE_HOST``) or when no token is
    mounted (e.g. ``automountServiceAccountToken: false``). ``service_account_dir`` replaces the
    standard mount point (:data:`SERVICE_ACCOUNT_DIR`).
    """
    host = os.environ.get(SERVICE_HOST_ENV_VAR)
    if not host:
        return None
    port = os.environ.get(SERVICE_PORT_ENV_VAR) or '443'

    directory = Path(service_account_dir) if service_account_dir is not None else SERVICE_ACCOUNT_DIR
    token_path = directory / 'token'
    try:
        token = token_path.read_text(encoding='utf-8').strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise LoginError(f'Cannot read the service account token {token_path}: {reason}.') from None
    if not token:
        raise LoginError(f'The service account token file {token_path} is empty.')

    ca_path = directory / 'ca.crt'
    namespace_path = directory / 'namespace'
    try:
        namespace = namespace_path.read_text(encoding='utf-8').strip() or None
    except FileNotFoundError:
        namespace = None
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise LoginError(f'Cannot read the service account namespace {namespace_path}: {reason}.') from None

    # IPv6 addresses must be bracketed in URLs.
    netloc = f'[{host}]:{port}' if ':' in host else f'{host}:{port}'
    return ConnectionInfo(
        server=f'https://{netloc}',
        ca_path=str(ca_path) if ca_path.exists() else None,
        scheme='Bearer',
        token=token,
        default_namespace=namespace,
        expiration=_expiration_of(token, token_path),
        trust_env=settings.networking.trust_env,
    )


def _expiration_of(token: str, token_path: Path) -> datetime.datetime | None:
    """When to stop using the token: shortly before its ``exp``, or None if it does not say."""
    expires_at = jwt_expiration(token)
    if expires_at is None:
        return None
    now = datetime.datetime.now(datetime.UTC)
    if expires_at <= now:
        raise LoginError(
            f'The service account token in {token_path} expired at {expires_at.isoformat()}; '
            f'the kubelet should have replaced it: check the pod and the node.'
        )
    if expires_at - TOKEN_EXPIRY_MARGIN > now:
        return expires_at - TOKEN_EXPIRY_MARGIN
    return expires_at


def jwt_expiration(token: str) -> datetime.datetime | None:
    """
    The ``exp`` claim of a JWT as a UTC time, or None if the token is not a JWT or has no ``exp``.

    The signature is not verified: it is the server's job; here, it only tells when to re-login.
    """
    parts = token.split('.')
    if len(parts) != 3:
        return None
    payload = parts[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + '=' * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        return None
    if not isinstance(claims, dict):
        return None
    exp = claims.get('exp')
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        return None
    try:
        return datetime.datetime.fromtimestamp(exp, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return None
