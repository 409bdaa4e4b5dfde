"""
The logins used when an operator declares no login handlers of its own.

As documented for Kopf: piggyback on pykube-ng and on the official kubernetes client, each one
if installed; if neither is, fall back to the built-in service account and kubeconfig logins.
"""
import asyncio
import importlib.util
import inspect
import logging
from collections.abc import Callable
from typing import Any

from kopf._clients.logins.kubeconfig import login_with_kubeconfig
from kopf._clients.logins.piggybacking import Logger, login_via_client, login_via_pykube
from kopf._clients.logins.serviceaccount import login_with_service_account
from kopf._cogs.configs.networking import ClientSettings, StandaloneClientSettings
from kopf._cogs.structs.credentials import ConnectionInfo, LoginError, VaultKey

# A login function: called with keyword arguments (settings, logger, ...); sync or async;
# returns ConnectionInfo or None.
LoginFn = Callable[..., Any]

_default_logger = logging.getLogger('kopf.activities.authentication')


def default_login_fns() -> list[LoginFn]:
    """The login functions to use when no login handlers are declared, in the order of trying."""
    fns: list[LoginFn] = []
    if _is_importable('pykube'):
        fns.append(login_via_pykube)
    if _is_importable('kubernetes'):
        fns.append(login_via_client)
    if not fns:
        fns.extend([login_with_service_account, login_with_kubeconfig])
    return fns


async def login_default(
        settings: ClientSettings | None = None,
        logger: Logger | None = None,
) -> dict[VaultKey, ConnectionInfo]:
    """
    Run the default login functions once and collect their credentials by function name.

    Sync functions run in threads, as they can read files and run exec plugins.
    A failing function does not prevent the others from providing credentials; if none of them
    provides any, the first failure is raised, or a :class:`kopf.LoginError` saying that
    nothing was found.
    """
    settings = settings if settings is not None else StandaloneClientSettings()
    logger = logger if logger is not None else _default_logger
    results: dict[VaultKey, ConnectionInfo] = {}
    errors: list[LoginError] = []
    fns = default_login_fns()
    for fn in fns:
        try:
            if inspect.iscoroutinefunction(fn):
                outcome = await fn(settings=settings, logger=logger)
            else:
                outcome = await asyncio.to_thread(fn, settings=settings, logger=logger)
        except LoginError as e:
            logger.warning(f'Login via {fn.__name__} failed: {e}')
            errors.append(e)
            continue
        if isinstance(outcome, ConnectionInfo):
            results[VaultKey(fn.__name__)] = outcome

    if not results and errors:
        raise errors[0]
    if not results:
        names = ', '.join(fn.__name__ for fn in fns)
        raise LoginError(
            f'No credentials were found by {names}: not in a cluster and no kubeconfig; '
            f'set $KUBECONFIG, create ~/.kube/config, or declare a login handler with @kopf.on.login().'
        )
    return results


def _is_importable(name: str) -> bool:
    # Only checks, without importing: the libraries are heavy and their import has side effects.
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
