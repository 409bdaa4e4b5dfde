"""
The structures of admission reviews and webhooks: what the admission handlers get and the servers serve.

They are types only: the admission webhooks themselves (the servers, the tunnels, the managed
configurations) come with kopf-webhooks. The operators can annotate their code with them already.
"""
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal, Protocol, TypedDict

Headers = Mapping[str, str]  # the HTTP headers of an admission request
SSLPeer = Mapping[str, Any]  # the client certificate of an admission request, as the SSL layer parsed it
Operation = Literal['CREATE', 'UPDATE', 'DELETE', 'CONNECT']


class UserInfo(TypedDict):
    """Who makes the API request under admission (as the apiserver tells in the review)."""
    username: str
    uid: str
    groups: list[str]


class WebhookClientConfigService(TypedDict, total=False):
    """How the apiservers reach the webhooks via an in-cluster service."""
    namespace: str | None
    name: str | None
    path: str | None
    port: int | None


class WebhookClientConfig(TypedDict, total=False):
    """
    How the apiservers reach the webhooks: a URL or a service, and the CA bundle to trust.

    It goes into the webhook configurations as it is; the handler ids are appended to the path.
    """
    caBundle: str | None
    url: str | None
    service: WebhookClientConfigService | None


class WebhookFn(Protocol):
    """
    The framework's function that a webhook server calls for every admission request it receives.

    The servers do not implement it: they get it, call it with the parsed request, and send back
    the review that it returns.
    """

    async def __call__(
            self,
            request: Mapping[str, Any],
            *,
            webhook: str | None = None,
            headers: Headers | None = None,
            sslpeer: SSLPeer | None = None,
    ) -> Mapping[str, Any]: ...


# A webhook server or tunnel: called with the framework's function, it yields the client configs
# (e.g. once started, and again when its address changes) until the operator exits.
WebhookServerProtocol = Callable[[WebhookFn], AsyncIterator[WebhookClientConfig]]
