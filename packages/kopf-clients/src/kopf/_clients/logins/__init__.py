"""
Login functions: where the credentials for the Kubernetes API come from.

The built-in ones read a kubeconfig or the pod's service account directly; the piggybacking
ones borrow the config loading of pykube-ng, kubernetes or kubernetes_asyncio, if installed.
All of them return a :class:`kopf.ConnectionInfo`, or ``None`` if they have nothing to offer.
"""
from kopf._clients.logins.defaults import (
    LoginFn,
    default_login_fns,
    login_default,
)
from kopf._clients.logins.execplugins import (
    forget_exec_credentials,
)
from kopf._clients.logins.kubeconfig import (
    login_with_kubeconfig,
)
from kopf._clients.logins.piggybacking import (
    login_via_async_client,
    login_via_client,
    login_via_pykube,
)
from kopf._clients.logins.serviceaccount import (
    login_with_service_account,
)

__all__ = [
    'LoginFn',
    'default_login_fns',
    'forget_exec_credentials',
    'login_default',
    'login_via_async_client',
    'login_via_client',
    'login_via_pykube',
    'login_with_kubeconfig',
    'login_with_service_account',
]
