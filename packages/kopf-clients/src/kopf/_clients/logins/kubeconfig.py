"""
The built-in kubeconfig login: read kubeconfig files directly, without any client library.

Which files: those listed in ``$KUBECONFIG`` (separated by :data:`os.pathsep`), or else
``~/.kube/config`` if it exists. Several files are merged the way kubectl merges them:
for clusters, users and contexts, the first file that defines a name wins; the first file
that sets ``current-context`` wins. Relative paths inside a file are relative to that file.

Supported: tokens and token files, basic auth, client certificates (files or inline data),
CA certificates (files or inline data), insecure-skip-tls-verify, proxy-url, the context's
namespace, and exec credential plugins. Legacy ``auth-provider`` users are not supported
here: the error explains the alternatives.
"""
import base64
import binascii
import dataclasses
import datetime
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kopf._clients.logins import execplugins
from kopf._cogs.configs.networking import ClientSettings
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError

KUBECONFIG_ENV_VAR = 'KUBECONFIG'
DEFAULT_KUBECONFIG_PATH = '~/.kube/config'

# The cluster extension whose content is given to exec plugins that ask for the cluster info.
EXEC_CLUSTER_EXTENSION = 'client.authentication.k8s.io/exec'

# Top-level kubeconfig lists of named entries: the list's key -> the key of the entry's payload.
_SECTIONS = {'clusters': 'cluster', 'users': 'user', 'contexts': 'context'}


@dataclasses.dataclass(frozen=True)
class KubeconfigEntry:
    """One named cluster, user or context, with the file that defined it (for relative paths)."""

    kind: str  # cluster, user, context
    name: str
    body: Mapping[str, Any] = dataclasses.field(repr=False)  # users' bodies hold secrets.
    origin: Path

    @property
    def where(self) -> str:
        return f'{self.kind} {self.name!r} in {self.origin}'


@dataclasses.dataclass
class MergedKubeconfig:
    """Several kubeconfig files merged into one view, as kubectl sees them."""

    paths: list[Path]
    clusters: dict[str, KubeconfigEntry] = dataclasses.field(default_factory=dict)
    users: dict[str, KubeconfigEntry] = dataclasses.field(default_factory=dict)
    contexts: dict[str, KubeconfigEntry] = dataclasses.field(default_factory=dict)
    current_context: str | None = None

    @property
    def files(self) -> str:
        return ', '.join(str(path) for path in self.paths)

    @property
    def is_empty(self) -> bool:
        return not self.clusters and not self.users and not self.contexts and not self.current_context


def login_with_kubeconfig(
        *,
        settings: ClientSettings,
        kubeconfig_context: str | None = None,
        **_: Any,
) -> ConnectionInfo | None:
    """
    Log in with the credentials of a kubeconfig file, parsed by Kopf itself.

    Meant for simple setups where neither pykube-ng nor the official ``kubernetes`` client is
    installed. Returns ``None`` if there is no kubeconfig at all. ``kubeconfig_context`` picks
    a context other than the file's ``current-context``. Raises :class:`kopf.LoginError`
    when a kubeconfig exists but cannot be used; the message says what to fix.
    """
    paths = find_kubeconfig_paths()
    if not paths:
        return None
    merged = load_kubeconfig(paths)
    if merged.is_empty:
        return None
    return connection_info_from_kubeconfig(
        merged,
        context_name=kubeconfig_context,
        trust_env=settings.networking.trust_env,
    )


def find_kubeconfig_paths() -> list[Path]:
    """
    The kubeconfig files to read, in the order of their precedence; empty if there are none.

    Files listed in ``$KUBECONFIG`` are returned even if missing (reading them will explain);
    the default ``~/.kube/config`` is only returned if it exists.
    """
    listed = os.environ.get(KUBECONFIG_ENV_VAR, '').split(os.pathsep)
    paths: list[Path] = []
    for item in listed:
        if item and Path(item).expanduser() not in paths:
            paths.append(Path(item).expanduser())
    if paths:
        return paths
    default_path = Path(DEFAULT_KUBECONFIG_PATH).expanduser()
    return [default_path] if default_path.exists() else []


def load_kubeconfig(paths: Sequence[Path]) -> MergedKubeconfig:
    """Read and merge the files; the first definition of each name and of current-context wins."""
    merged = MergedKubeconfig(paths=[path.absolute() for path in paths])
    for path in merged.paths:
        document = _read_yaml_file(path)
        for section, payload_key in _SECTIONS.items():
            target: dict[str, KubeconfigEntry] = getattr(merged, section)
            for entry in _parse_section(document, section, payload_key, path):
                target.setdefault(entry.name, entry)
        current_context = document.get('current-context')
        if current_context is not None and not isinstance(current_context, str):
            raise LoginError(f'The current-context in {path} must be a string (a context name).')
        if current_context and merged.current_context is None:
            merged.current_context = current_context
    return merged


def check_kubeconfig(
        paths: Sequence[Path],
        *,
        context_name: str | None = None,
        run_exec: bool = False,
) -> None:
    """
    Raise :class:`kopf.LoginError` if the kubeconfig files cannot work, naming the file and the field.

    For the logins that piggyback on other libraries: their own errors are vague or misleading
    (e.g. a context naming a missing user is accepted and fails later with HTTP 401), so the files
    are checked here first. Only what every client agrees on is checked: the YAML, the selected
    context with its cluster and user, the server URL, the referenced files, the base64 data.
    The legacy auth-providers are left to the libraries. The exec plugins are run only with
    ``run_exec`` (their credentials are remembered until they expire, as usual): the ``kubernetes``
    libraries swallow the plugins' failures (they log them and go on without credentials).
    """
    merged = load_kubeconfig(paths)
    if merged.is_empty:
        return
    _, cluster, user = _select_context(merged, context_name)
    endpoint = _parse_cluster(cluster)
    if user is not None:
        # Only the exec plugins are run: the auth-providers are never rejected here (see above).
        _parse_user(user, endpoint, run_exec=run_exec and user.body.get('exec') is not None)


def _select_context(
        merged: MergedKubeconfig,
        context_name: str | None,
) -> tuple[KubeconfigEntry, KubeconfigEntry, KubeconfigEntry | None]:
    context_name = context_name or merged.current_context
    if not context_name:
        example = next(iter(merged.contexts), 'NAME')
        raise LoginError(
            f'No "current-context" field is set in the kubeconfig ({merged.files}); '
            f'set it to one of the contexts ({_names(merged.contexts)}), '
            f'e.g.: kubectl config use-context {example}'
        )
    context = merged.contexts.get(context_name)
    if context is None:
        raise LoginError(
            f'The context {context_name!r} is not defined in the kubeconfig ({merged.files}); '
            f'known contexts: {_names(merged.contexts)}.'
        )

    cluster_name = context.body.get('cluster')
    if not isinstance(cluster_name, str) or not cluster_name:
        raise LoginError(f'The {context.where} does not name a cluster; set its "cluster" field.')
    cluster = merged.clusters.get(cluster_name)
    if cluster is None:
        raise LoginError(
            f'The "cluster" field of the {context.where} refers to the cluster {cluster_name!r}, '
            f'which is not defined in the kubeconfig ({merged.files}); '
            f'known clusters: {_names(merged.clusters)}.'
        )

    user_name = context.body.get('user')
    user: KubeconfigEntry | None = None
    if user_name:
        if not isinstance(user_name, str):
            raise LoginError(f'The "user" field of the {context.where} must be a string (a user name).')
        user = merged.users.get(user_name)
        if user is None:
            raise LoginError(
                f'The "user" field of the {context.where} refers to the user {user_name!r}, '
                f'which is not defined in the kubeconfig ({merged.files}); '
                f'known users: {_names(merged.users)}.'
            )

    namespace = context.body.get('namespace')
    if namespace is not None and not isinstance(namespace, str):
        raise LoginError(f'The "namespace" field of the {context.where} must be a string.')
    return context, cluster, user


def connection_info_from_kubeconfig(
        merged: MergedKubeconfig,
        *,
        context_name: str | None = None,
        trust_env: bool = False,
) -> ConnectionInfo:
    """Turn the selected context (or the current one) with its cluster and user into credentials."""
    context, cluster, user = _select_context(merged, context_name)
    namespace = context.body.get('namespace')
    endpoint = _parse_cluster(cluster)
    credentials = _parse_user(user, endpoint) if user is not None else _UserCredentials()
    return ConnectionInfo(
        server=endpoint.server,
        ca_path=endpoint.ca_path,
        ca_data=endpoint.ca_data,
        insecure=endpoint.insecure,
        proxy_url=endpoint.proxy_url,
        username=credentials.username,
        password=credentials.password,
        scheme='Bearer' if credentials.token else None,
        token=credentials.token,
        certificate_path=credentials.certificate_path,
        certificate_data=credentials.certificate_data,
        private_key_path=credentials.private_key_path,
        private_key_data=credentials.private_key_data,
        expiration=credentials.expiration,
        default_namespace=namespace or None,
        trust_env=trust_env,
    )


@dataclasses.dataclass(frozen=True)
class _ClusterEndpoint:
    server: str
    ca_path: str | None
    ca_data: bytes | None
    insecure: bool | None
    proxy_url: str | None
    exec_cluster_info: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class _UserCredentials:
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    token: str | None = dataclasses.field(default=None, repr=False)
    certificate_path: str | None = None
    certificate_data: bytes | None = dataclasses.field(default=None, repr=False)
    private_key_path: str | None = None
    private_key_data: bytes | None = dataclasses.field(default=None, repr=False)
    expiration: datetime.datetime | None = None


def _names(entries: Mapping[str, KubeconfigEntry]) -> str:
    return ', '.join(repr(name) for name in entries) or 'none'


def _parse_cluster(cluster: KubeconfigEntry) -> _ClusterEndpoint:
    body = cluster.body
    server = body.get('server')
    if not isinstance(server, str) or not server:
        raise LoginError(f'The {cluster.where} has no server URL; set its "server" field.')
    parsed = urllib.parse.urlsplit(server)
    if parsed.scheme not in ('http', 'https') or not parsed.hostname or any(c.isspace() for c in server):
        raise LoginError(
            f'The "server" field of the {cluster.where} is not an http:// or https:// URL: {server!r}; '
            f"set it to the API server's URL, e.g. https://127.0.0.1:6443."
        )

    insecure = body.get('insecure-skip-tls-verify')
    if insecure is not None and not isinstance(insecure, bool):
        raise LoginError(
            f'The "insecure-skip-tls-verify" field of the {cluster.where} must be true or false.')

    proxy_url = body.get('proxy-url')
    if proxy_url is not None and not isinstance(proxy_url, str):
        raise LoginError(f'The "proxy-url" field of the {cluster.where} must be a URL string.')

    ca_path: str | None = None
    ca_data: bytes | None = None
    if body.get('certificate-authority-data'):
        ca_data = _decode_base64(body['certificate-authority-data'], cluster, 'certificate-authority-data')
        ca_bytes = ca_data
    elif body.get('certificate-authority'):
        path = _resolve_path(body['certificate-authority'], cluster, 'certificate-authority')
        ca_bytes = _read_file(path, cluster, 'certificate-authority')
        ca_path = str(path)
    else:
        ca_bytes = None

    # What exec plugins get in KUBERNETES_EXEC_INFO if they ask for it (provideClusterInfo).
    exec_cluster_info: dict[str, Any] = {'server': server}
    for key in ['tls-server-name', 'insecure-skip-tls-verify', 'proxy-url', 'disable-compression']:
        if key in body:
            exec_cluster_info[key] = body[key]
    if ca_bytes is not None:
        exec_cluster_info['certificate-authority-data'] = base64.b64encode(ca_bytes).decode('ascii')
    extensions = body.get('extensions')
    if isinstance(extensions, list):
        for extension in extensions:
            if isinstance(extension, Mapping) and extension.get('name') == EXEC_CLUSTER_EXTENSION:
                exec_cluster_info['config'] = extension.get('extension')

    return _ClusterEndpoint(
        server=server,
        ca_path=ca_path,
        ca_data=ca_data,
        insecure=True if insecure else None,
        proxy_url=proxy_url or None,
        exec_cluster_info=exec_cluster_info,
    )


def _parse_user(
        user: KubeconfigEntry,
        endpoint: _ClusterEndpoint,
        *,
        run_exec: bool = True,
) -> _UserCredentials:
    """The user's credentials; with ``run_exec=False``, only checked (no plugins, no auth-provider errors)."""
    body = user.body

    # A token file wins over an inline token: the file is what gets rotated.
    token: str | None = None
    if body.get('tokenFile'):
        path = _resolve_path(body['tokenFile'], user, 'tokenFile')
        token = _read_file(path, user, 'tokenFile').decode('utf-8', errors='replace').strip()
        if not token:
            raise LoginError(f'The token file {path} (field "tokenFile" of the {user.where}) is empty.')
    elif body.get('token'):
        if not isinstance(body['token'], str):
            raise LoginError(f'The "token" field of the {user.where} must be a string.')
        token = body['token'].strip()

    username = body.get('username')
    password = body.get('password')
    if username is not None and not isinstance(username, str):
        raise LoginError(f'The "username" field of the {user.where} must be a string.')
    if password is not None and not isinstance(password, str):
        raise LoginError(f'The "password" field of the {user.where} must be a string.')

    certificate_path, certificate_data = _path_or_data(user, 'client-certificate')
    private_key_path, private_key_data = _path_or_data(user, 'client-key')
    has_certificate = certificate_path is not None or certificate_data is not None
    has_private_key = private_key_path is not None or private_key_data is not None
    if has_certificate != has_private_key:
        raise LoginError(
            f'The {user.where} has only one of client-certificate and client-key; '
            f'a client certificate needs both (as files or as *-data fields).'
        )

    expiration: datetime.datetime | None = None
    if not token and body.get('exec') is not None:
        if not run_exec:
            return _UserCredentials()
        spec = execplugins.parse_exec_spec(
            body['exec'],
            origin=user.where,
            base_dir=user.origin.parent,
            cluster_info=endpoint.exec_cluster_info,
        )
        credential = execplugins.get_exec_credential(spec)
        token = credential.token
        expiration = credential.expiration
        if credential.certificate_data is not None:
            certificate_path, certificate_data = None, credential.certificate_data
            private_key_path, private_key_data = None, credential.private_key_data

    has_any = bool(token or username or certificate_path or certificate_data)
    if not has_any and body.get('auth-provider') is not None and run_exec:
        provider = body['auth-provider']
        provider_name = provider.get('name') if isinstance(provider, Mapping) else None
        raise LoginError(
            f'The {user.where} uses the auth-provider {provider_name!r}, which the built-in '
            f'kubeconfig login does not support. Install pykube-ng or kubernetes '
            f'(e.g. pip install kopf[full-auth]) to log in through them, '
            f'or switch the kubeconfig to an exec credential plugin (e.g. kubelogin).'
        )

    return _UserCredentials(
        username=username or None,
        password=password or None,
        token=token or None,
        certificate_path=certificate_path,
        certificate_data=certificate_data,
        private_key_path=private_key_path,
        private_key_data=private_key_data,
        expiration=expiration,
    )


def _path_or_data(entry: KubeconfigEntry, field: str) -> tuple[str | None, bytes | None]:
    """Read a ``field``/``field-data`` pair: a checked path or decoded data; data wins, as in kubectl."""
    data_field = f'{field}-data'
    if entry.body.get(data_field):
        return None, _decode_base64(entry.body[data_field], entry, data_field)
    if entry.body.get(field):
        path = _resolve_path(entry.body[field], entry, field)
        _read_file(path, entry, field)  # fail early and clearly rather than in the TLS setup.
        return str(path), None
    return None, None


def _resolve_path(value: Any, entry: KubeconfigEntry, field: str) -> Path:
    if not isinstance(value, str):
        raise LoginError(f'The "{field}" field of the {entry.where} must be a file path.')
    path = Path(value).expanduser()
    return path if path.is_absolute() else entry.origin.parent / path


def _read_file(path: Path, entry: KubeconfigEntry, field: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise LoginError(
            f'Cannot read the file {path} (field "{field}" of the {entry.where}): {reason}; '
            f'fix the path or the file permissions.'
        ) from None


def _decode_base64(value: Any, entry: KubeconfigEntry, field: str) -> bytes:
    # The value itself is never quoted: the *-data fields hold keys and certificates.
    if not isinstance(value, str):
        raise LoginError(f'The "{field}" field of the {entry.where} must be a base64-encoded string.')
    try:
        return base64.b64decode(''.join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise LoginError(f'The "{field}" field of the {entry.where} is not valid base64.') from None


def _read_yaml_file(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding='utf-8')
    except FileNotFoundError:
        raise LoginError(
            f'The kubeconfig file {path} does not exist; '
            f'create it or fix ${KUBECONFIG_ENV_VAR}.'
        ) from None
    except IsADirectoryError:
        raise LoginError(f'The kubeconfig path {path} is a directory, not a file.') from None
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise LoginError(f'Cannot read the kubeconfig file {path}: {reason}.') from None

    # YAML errors quote the offending lines, which may hold tokens: only the position is reported,
    # and the original exception is not chained (it would be printed with the traceback).
    try:
        document = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        position = f' at line {mark.line + 1}, column {mark.column + 1}' if mark is not None else ''
        raise LoginError(
            f'The kubeconfig file {path} is not valid YAML{position}: {e.problem}; fix its syntax.'
        ) from None
    except yaml.YAMLError:
        raise LoginError(f'The kubeconfig file {path} is not valid YAML; fix its syntax.') from None

    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise LoginError(
            f'The kubeconfig file {path} must contain a mapping (apiVersion, clusters, users, ...), '
            f'not a {type(document).__name__}.'
        )
    return document


def _parse_section(
        document: Mapping[str, Any],
        section: str,
        payload_key: str,
        path: Path,
) -> list[KubeconfigEntry]:
    items = document.get(section)
    if items is None:
        return []
    if not isinstance(items, list):
        raise LoginError(f'The "{section}" field in {path} must be a list of named {payload_key}s.')
    entries = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping) or not isinstance(item.get('name'), str) or not item['name']:
            raise LoginError(f'The item {section}[{index}] in {path} must be a mapping with a "name".')
        body = item.get(payload_key)
        if body is None:
            body = {}
        if not isinstance(body, Mapping):
            raise LoginError(
                f'The "{payload_key}" field of {section}[{index}] ({item["name"]!r}) in {path} '
                f'must be a mapping.'
            )
        entries.append(KubeconfigEntry(kind=payload_key, name=item['name'], body=body, origin=path))
    return entries
