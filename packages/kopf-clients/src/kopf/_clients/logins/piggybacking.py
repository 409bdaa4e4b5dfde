"""
Logins that piggyback on other Kubernetes client libraries: pykube-ng, kubernetes, kubernetes_asyncio.

Each library loads its configuration its own way (in-cluster first, then kubeconfig), including
the authentication methods Kopf does not implement itself; here, only what the API calls need
is taken from the result. The libraries are optional: they are imported only when a login
function runs, and a missing library makes its login function return ``None``.

Error texts of these libraries may quote whole kubeconfig entries (with tokens), so they are
trimmed before being put into :class:`kopf.LoginError`, and the original exceptions are not chained.
"""
import base64
import binascii
import contextlib
import contextvars
import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kopf._clients.logins import execplugins, kubeconfig, serviceaccount
from kopf._cogs.configs.networking import ClientSettings
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError

Logger = logging.Logger | logging.LoggerAdapter[Any]
_FnT = TypeVar('_FnT', bound=Callable[..., Any])

# The kubeconfig's problems already raised by a login function in the current round of logging in
# (the operator's authentication sets a new set for every round). The default login functions read
# the same kubeconfig files, so a broken file is reported by the first of them only, not by each.
reported_problems: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar(
    'reported_problems', default=None)


class _AlreadyReported(Exception):
    pass


@contextlib.contextmanager
def _reported_once() -> Iterator[None]:
    """Let the kubeconfig's problems escape only once per round of logging in (see ``reported_problems``)."""
    try:
        yield
    except LoginError as e:
        reported = reported_problems.get()
        if reported is not None:
            if str(e) in reported:
                raise _AlreadyReported(str(e)) from None
            reported.add(str(e))
        raise


def _quiet_if_reported(fn: _FnT) -> _FnT:
    """A login function that offers nothing if its kubeconfig's problem is already reported in this round."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*, logger: Logger, **kwargs: Any) -> Any:
            try:
                return await fn(logger=logger, **kwargs)
            except _AlreadyReported as e:
                logger.debug(f'The kubeconfig is not usable, as reported above: {e}')
                return None
        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*, logger: Logger, **kwargs: Any) -> Any:
        try:
            return fn(logger=logger, **kwargs)
        except _AlreadyReported as e:
            logger.debug(f'The kubeconfig is not usable, as reported above: {e}')
            return None
    return wrapper  # type: ignore[return-value]


@_quiet_if_reported
def login_via_pykube(
        *,
        logger: Logger,
        settings: ClientSettings,
        **_: Any,
) -> ConnectionInfo | None:
    """
    Log in the way pykube-ng does: the in-cluster service account, else the kubeconfig.

    Returns ``None`` if pykube-ng is not installed or there is nothing to log in with.
    pykube-ng reads only one kubeconfig file: with several files in ``$KUBECONFIG``,
    the first existing one is used.
    """
    try:
        import pykube
    except ImportError:
        logger.debug('pykube-ng is not installed; skipping the login via pykube-ng.')
        return None

    source = 'the in-cluster service account'
    try:
        config = pykube.KubeConfig.from_service_account()
    except (FileNotFoundError, KeyError):  # no token file, or no KUBERNETES_SERVICE_HOST/PORT.
        with _reported_once():
            paths = _existing_kubeconfig_paths()
        if not paths:
            logger.debug('pykube-ng found neither the in-cluster service account nor a kubeconfig.')
            return None
        if len(paths) > 1:
            logger.debug(f'pykube-ng reads only one kubeconfig file; using {paths[0]}.')
        source = str(paths[0])
        with _reported_once():
            # The library's own errors are vague: explain ours first (the same as the other logins do).
            kubeconfig.check_kubeconfig(paths[:1], run_exec=True)
        try:
            config = pykube.KubeConfig.from_file(str(paths[0]))
        except yaml.YAMLError:
            raise LoginError(
                f'pykube-ng cannot parse the kubeconfig {source}: it is not valid YAML.') from None
        except (pykube.PyKubeError, OSError) as e:
            raise LoginError(f'pykube-ng cannot load the kubeconfig {source}: {_trimmed(e)}') from None

    try:
        return _connection_info_from_pykube(config, settings=settings)
    except LoginError:
        raise
    except (pykube.PyKubeError, OSError, KeyError, TypeError, AttributeError) as e:
        raise LoginError(f'pykube-ng cannot use the config from {source}: {_trimmed(e)}') from None


@_quiet_if_reported
def login_via_client(
        *,
        logger: Logger,
        settings: ClientSettings,
        **_: Any,
) -> ConnectionInfo | None:
    """
    Log in the way the official ``kubernetes`` client does: in-cluster, else the kubeconfig.

    Returns ``None`` if the library is not installed or there is nothing to log in with.
    """
    try:
        import kubernetes.client
        import kubernetes.config
    except ImportError:
        logger.debug('The kubernetes client library is not installed; skipping the login via it.')
        return None

    # The library is only partially typed; its config loaders are not.
    k8s_config: Any = kubernetes.config
    configuration = kubernetes.client.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        with _reported_once():
            location = _kubeconfig_location()
        if location is None:
            logger.debug('The kubernetes client found neither an in-cluster config nor a kubeconfig.')
            return None
        with _reported_once():
            # Clearer than the library's errors; and the library would swallow the exec plugins' failures.
            kubeconfig.check_kubeconfig(_existing_kubeconfig_paths(), run_exec=True)
        try:
            k8s_config.load_kube_config(
                config_file=location,
                client_configuration=configuration,
                persist_config=False,
            )
            _, active_context = k8s_config.list_kube_config_contexts(config_file=location)
        except yaml.YAMLError:
            raise LoginError(
                f'The kubernetes client cannot parse the kubeconfig {location}: it is not valid YAML.'
            ) from None
        except (k8s_config.ConfigException, OSError, KeyError, TypeError, ValueError) as e:
            raise LoginError(
                f'The kubernetes client cannot load the kubeconfig {location}: {_trimmed(e)}'
            ) from None
        namespace = _namespace_of_context(active_context)
    else:
        namespace = _in_cluster_namespace()

    authorization = configuration.get_api_key_with_prefix('BearerToken', alias='authorization')
    return _connection_info_from_client_configuration(
        configuration, authorization=authorization, namespace=namespace, settings=settings)


@_quiet_if_reported
async def login_via_async_client(
        *,
        logger: Logger,
        settings: ClientSettings,
        **_: Any,
) -> ConnectionInfo | None:
    """
    Log in the way ``kubernetes_asyncio`` does: in-cluster, else the kubeconfig.

    Returns ``None`` if the library is not installed or there is nothing to log in with.
    """
    try:
        import kubernetes_asyncio.client
        import kubernetes_asyncio.config
    except ImportError:
        logger.debug('kubernetes_asyncio is not installed; skipping the login via it.')
        return None

    configuration = kubernetes_asyncio.client.Configuration()
    try:
        kubernetes_asyncio.config.load_incluster_config(client_configuration=configuration)
    except kubernetes_asyncio.config.ConfigException:
        with _reported_once():
            location = _kubeconfig_location()
        if location is None:
            logger.debug('kubernetes_asyncio found neither an in-cluster config nor a kubeconfig.')
            return None
        with _reported_once():
            # Clearer than the library's errors; and the library would swallow the exec plugins' failures.
            kubeconfig.check_kubeconfig(_existing_kubeconfig_paths(), run_exec=True)
        try:
            await kubernetes_asyncio.config.load_kube_config(
                config_file=location,
                client_configuration=configuration,
                persist_config=False,
            )
            _, active_context = kubernetes_asyncio.config.list_kube_config_contexts(config_file=location)
        except yaml.YAMLError:
            raise LoginError(
                f'kubernetes_asyncio cannot parse the kubeconfig {location}: it is not valid YAML.'
            ) from None
        except (kubernetes_asyncio.config.ConfigException, OSError, KeyError, TypeError, ValueError) as e:
            raise LoginError(
                f'kubernetes_asyncio cannot load the kubeconfig {location}: {_trimmed(e)}') from None
        namespace = _namespace_of_context(active_context)
    else:
        namespace = _in_cluster_namespace()

    # Coroutine in recent versions (the token refresh hook can be async), plain in older ones.
    authorization = configuration.get_api_key_with_prefix('BearerToken', alias='authorization')
    if inspect.isawaitable(authorization):
        authorization = await authorization
    return _connection_info_from_client_configuration(
        configuration, authorization=authorization, namespace=namespace, settings=settings)


def _connection_info_from_pykube(config: Any, *, settings: ClientSettings) -> ConnectionInfo:
    cluster: Mapping[str, Any] = config.cluster
    user: Mapping[str, Any] = config.user

    # pykube-ng wraps file/data pairs into objects that read either of them.
    ca = cluster.get('certificate-authority')
    certificate = user.get('client-certificate')
    private_key = user.get('client-key')
    ca_data: bytes | None = ca.bytes() if ca is not None else None

    token: str | None = user.get('token') or None
    certificate_data: bytes | None = certificate.bytes() if certificate is not None else None
    private_key_data: bytes | None = private_key.bytes() if private_key is not None else None
    expiration = None

    # The same order of methods as pykube-ng uses for its requests: token, exec, basic, auth-provider.
    if not token and user.get('exec') is not None:
        base_dir = Path(config.kubeconfig_path).parent if config.kubeconfig_path else None
        exec_cluster_info: dict[str, Any] = {'server': cluster['server']}
        if ca_data is not None:
            exec_cluster_info['certificate-authority-data'] = base64.b64encode(ca_data).decode('ascii')
        for key in ['insecure-skip-tls-verify', 'proxy-url', 'tls-server-name']:
            if key in cluster:
                exec_cluster_info[key] = cluster[key]
        spec = execplugins.parse_exec_spec(
            user['exec'],
            origin=f'the current user in {config.kubeconfig_path or "the pykube-ng config"}',
            base_dir=base_dir,
            cluster_info=exec_cluster_info,
        )
        credential = execplugins.get_exec_credential(spec)
        token = credential.token
        expiration = credential.expiration
        if credential.certificate_data is not None:
            certificate_data = credential.certificate_data
            private_key_data = credential.private_key_data

    username = user.get('username') or None
    password = user.get('password') or None
    if not token and not (username and password) and isinstance(user.get('auth-provider'), Mapping):
        # Whatever the provider has put into the kubeconfig last time; pykube-ng does the same
        # when no refresh is possible. Expired ones are rejected by the server and re-requested.
        provider = user['auth-provider']
        provider_config = provider.get('config') or {}
        if provider.get('name') == 'oidc':
            token = provider_config.get('id-token') or None
            expiration = serviceaccount.jwt_expiration(token) if token else None
        else:
            token = provider_config.get('access-token') or None

    insecure = cluster.get('insecure-skip-tls-verify')
    return ConnectionInfo(
        server=cluster['server'],
        ca_data=ca_data,
        insecure=True if insecure else None,
        username=username,
        password=password,
        scheme='Bearer' if token else None,
        token=token,
        certificate_data=certificate_data,
        private_key_data=private_key_data,
        default_namespace=config.namespace or None,
        expiration=expiration,
        proxy_url=cluster.get('proxy-url') or None,
        trust_env=settings.networking.trust_env,
    )


def _connection_info_from_client_configuration(
        configuration: Any,
        *,
        authorization: str | None,
        namespace: str | None,
        settings: ClientSettings,
) -> ConnectionInfo:
    """Extract the credentials from a ``Configuration`` of kubernetes or kubernetes_asyncio."""
    username: str | None = configuration.username or None
    password: str | None = configuration.password or None
    scheme: str | None = None
    token: str | None = None
    if authorization:
        # The libraries keep the whole header value: "Bearer xyz", "bearer xyz", or "Basic base64".
        raw_scheme, _, credentials = authorization.strip().partition(' ')
        credentials = credentials.strip()
        basic = _decode_basic(credentials) if raw_scheme.lower() == 'basic' else None
        if raw_scheme.lower() == 'bearer':
            scheme, token = 'Bearer', credentials
        elif basic is not None:
            username, password = basic
        elif credentials:
            scheme, token = raw_scheme, credentials
        else:  # only a token, with no scheme.
            scheme, token = 'Bearer', raw_scheme

    return ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert or None,
        insecure=True if not configuration.verify_ssl else None,
        username=username,
        password=password,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file or None,
        private_key_path=configuration.key_file or None,
        default_namespace=namespace,
        proxy_url=configuration.proxy or None,
        trust_env=settings.networking.trust_env,
    )


def _decode_basic(credentials: str) -> tuple[str, str] | None:
    try:
        decoded = base64.b64decode(credentials, validate=True).decode('utf-8')
    except (binascii.Error, ValueError):
        return None
    username, colon, password = decoded.partition(':')
    return (username, password) if colon else None


def _existing_kubeconfig_paths() -> list[Path]:
    """
    The kubeconfig files that exist, in the order of precedence; empty if none is configured.

    If ``$KUBECONFIG`` names only missing files, it is an error rather than "no kubeconfig":
    the setting was explicit, and silently ignoring it would hide the mistake.
    """
    paths = kubeconfig.find_kubeconfig_paths()
    existing = [path for path in paths if path.exists()]
    if len(paths) == 1 and not existing:
        raise LoginError(
            f'The kubeconfig file {paths[0]} does not exist; '
            f'create it or fix ${kubeconfig.KUBECONFIG_ENV_VAR}.'
        )
    if paths and not existing:
        missing = ', '.join(str(path) for path in paths)
        raise LoginError(
            f'None of the kubeconfig files in ${kubeconfig.KUBECONFIG_ENV_VAR} exists: {missing}; '
            f'create them or fix ${kubeconfig.KUBECONFIG_ENV_VAR}.'
        )
    return existing


def _kubeconfig_location() -> str | None:
    """The kubeconfig location in the form the kubernetes libraries accept (os.pathsep-separated)."""
    paths = _existing_kubeconfig_paths()
    return os.pathsep.join(str(path) for path in paths) if paths else None


def _namespace_of_context(context: Any) -> str | None:
    if isinstance(context, Mapping) and isinstance(context.get('context'), Mapping):
        namespace = context['context'].get('namespace')
        return namespace if isinstance(namespace, str) and namespace else None
    return None


def _in_cluster_namespace() -> str | None:
    try:
        path = serviceaccount.SERVICE_ACCOUNT_DIR / 'namespace'
        return path.read_text(encoding='utf-8').strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _trimmed(error: BaseException) -> str:
    """
    The error's text without quoted config entries.

    The kubernetes libraries name the kubeconfig entries by their whole content (tokens included)
    in some messages, e.g. "Expected key token in /path/{'name': ..., 'user': {...}}".
    """
    if isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], str):
        return f'the key {error.args[0]!r} is missing in the config'
    text = str(error) or type(error).__name__
    for marker in ['{', '[']:
        if marker in text:
            text = text[:text.index(marker)].rstrip() + ' (details omitted: they may contain credentials)'
    return text
