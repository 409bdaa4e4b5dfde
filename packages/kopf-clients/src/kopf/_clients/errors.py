"""
Errors of the Kubernetes API, as exceptions with one class per meaningful HTTP status.

The API reports failures with a ``kind: Status`` object in the response body.
:func:`check_response` turns such a response into the most specific exception class,
so that callers can catch exactly what they expect (e.g. a missing object) and let the rest escalate::

    try:
        await fetching.read_obj(...)
    except errors.APINotFoundError:
        ...

The texts of these exceptions are built only from the status code, the method & URL of the request
(which never contain credentials: tokens go in headers), and the server's own message.
Request headers are never stored in the exceptions, so tokens cannot leak via logs or tracebacks.
"""
import asyncio
import datetime
import email.utils
import json
import socket
import ssl
from collections.abc import Mapping
from typing import Any

from kopf._clients.connections import CannotConnect, Disconnected, NetworkError


class APIError(Exception):
    """
    Any error reported by the Kubernetes API with an HTTP status of 4xx or 5xx.

    ``status`` is the HTTP status code. ``payload`` is the parsed ``kind: Status`` object
    of the response body if the server sent one (or None if the body was not JSON).
    ``message``, ``reason``, ``details`` are taken from the payload when available.
    """

    status: int
    payload: Mapping[str, Any] | None

    def __init__(
            self,
            payload: Mapping[str, Any] | None,
            *,
            status: int,
            method: str | None = None,
            url: str | None = None,
            text: str | None = None,
            retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.payload = payload
        self.method = method
        self.url = url
        self._text = text
        self._retry_after = retry_after
        super().__init__(self._describe())

    def _describe(self) -> str:
        # Whatever the server said, plus where we asked. Never include any headers of the request.
        explanation = self.message or (self._text or '').strip()[:1000] or 'no explanation'
        where = f' for {self.method} {self.url}' if self.method and self.url else ''
        reason = f' {self.reason}' if self.reason else ''
        return f'HTTP {self.status}{reason}{where}: {explanation}'

    @property
    def code(self) -> int:
        """The status code as reported in the payload (falls back to the HTTP status)."""
        value = self.payload.get('code') if self.payload else None
        return value if isinstance(value, int) else self.status

    @property
    def message(self) -> str | None:
        """The human-readable message of the server, if any."""
        value = self.payload.get('message') if self.payload else None
        return value if isinstance(value, str) else None

    @property
    def reason(self) -> str | None:
        """The machine-readable reason of the server, e.g. ``NotFound``, ``AlreadyExists``."""
        value = self.payload.get('reason') if self.payload else None
        return value if isinstance(value, str) else None

    @property
    def details(self) -> Mapping[str, Any] | None:
        """Extra details of the status: the kind, name, group, causes of the failure."""
        value = self.payload.get('details') if self.payload else None
        return value if isinstance(value, Mapping) else None

    @property
    def retry_after(self) -> float | None:
        """
        How long the server asked to wait before repeating the request, in seconds, if it did.

        It comes from the ``Retry-After`` header, or else from ``details.retryAfterSeconds``.
        """
        if self._retry_after is not None:
            return self._retry_after
        value = self.details.get('retryAfterSeconds') if self.details else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class APIClientError(APIError):
    """The request is wrong in some way (HTTP 4xx); repeating it as is will not help."""


class APIServerError(APIError):
    """The server failed to process the request (HTTP 5xx); it is presumably temporary."""


class APINonJSONResponseError(APIServerError):
    """
    A successful HTTP status, but the body is not JSON (e.g. an HTML page of a proxy in front of the API).

    The server (or whatever answers in its name) misbehaves: like the 5xx errors, it is retried.
    """

    def __init__(self, body: bytes, *, status: int,
                 method: str | None = None, url: str | None = None) -> None:
        text = f'the response is not JSON: {body[:200]!r}'
        super().__init__(None, status=status, method=method, url=url, text=text)


class APIUnauthorizedError(APIClientError):
    """HTTP 401: the credentials are invalid or expired; new credentials are needed."""


class APIForbiddenError(APIClientError):
    """HTTP 403: the credentials are valid, but the RBAC permissions do not allow the request."""


class APINamespaceTerminatingError(APIForbiddenError):
    """
    HTTP 403 with the ``NamespaceTerminating`` cause: no new objects in a namespace being deleted.

    Like the absent namespace, it is final: the namespace will not stop terminating, only disappear.
    """


class APINotFoundError(APIClientError):
    """HTTP 404: the object, the namespace, or the resource does not exist."""


class APIConflictError(APIClientError):
    """HTTP 409: the object already exists, or its resource version does not match."""


class APIGoneError(APIClientError):
    """HTTP 410: the requested resource version is too old and is gone from the server's history."""


class APIUnprocessableEntityError(APIClientError):
    """HTTP 422: the object or the patch is invalid (e.g. it violates the schema)."""


class APITooManyRequestsError(APIClientError):
    """HTTP 429: the server throttles the client; the request can be repeated later (see ``retry_after``)."""


_CLASSES_BY_STATUS: Mapping[int, type[APIError]] = {
    401: APIUnauthorizedError,
    403: APIForbiddenError,
    404: APINotFoundError,
    409: APIConflictError,
    410: APIGoneError,
    422: APIUnprocessableEntityError,
    429: APITooManyRequestsError,
}


def get_error_class(status: int) -> type[APIError]:
    """The most specific exception class for an HTTP status code (only for 4xx/5xx)."""
    if status in _CLASSES_BY_STATUS:
        return _CLASSES_BY_STATUS[status]
    elif 400 <= status < 500:
        return APIClientError
    elif 500 <= status < 600:
        return APIServerError
    else:
        return APIError


def make_error(
        status: int,
        payload: Mapping[str, Any] | None,
        *,
        method: str | None = None,
        url: str | None = None,
        text: str | None = None,
        retry_after: float | None = None,
) -> APIError:
    """Build the exception for an HTTP status and a ``kind: Status`` payload (e.g. of a watch-event)."""
    cls = get_error_class(status)
    if cls is APIForbiddenError and _has_cause(payload, 'NamespaceTerminating'):
        cls = APINamespaceTerminatingError
    return cls(payload, status=status, method=method, url=url, text=text, retry_after=retry_after)


def _has_cause(payload: Mapping[str, Any] | None, reason: str) -> bool:
    """Whether a ``kind: Status`` payload has a cause with this reason in ``details.causes``."""
    details = payload.get('details') if isinstance(payload, Mapping) else None
    causes = details.get('causes') if isinstance(details, Mapping) else None
    return isinstance(causes, list) and any(
        isinstance(cause, Mapping) and cause.get('reason') == reason for cause in causes
    )


def parse_retry_after(value: str | None) -> float | None:
    """
    Interpret the ``Retry-After`` header: either a number of seconds or an HTTP date.

    Unparseable values are ignored (None); dates in the past mean "no delay" (0).
    """
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return max(0.0, (moment - datetime.datetime.now(datetime.UTC)).total_seconds())


def parse_status(text: str) -> Mapping[str, Any] | None:
    """Parse a response body as a ``kind: Status`` object if possible, or None if it is not JSON."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, Mapping) else None


def error_of_response(status: int, text: str, *, method: str, url: str, retry_after: str | None) -> APIError:
    """The most specific :class:`APIError` for an error response: its status, body, and headers."""
    payload = parse_status(text)
    return make_error(status, payload, method=method, url=url, text=text,
                      retry_after=parse_retry_after(retry_after))


def describe_network_error(error: BaseException) -> str:
    """
    A short description of a network failure for the logs: what has happened, and where.

    E.g. "connection refused to https://127.0.0.1:6443" instead of the whole error object.
    Unknown errors are described by their ``repr()``.
    """
    if isinstance(error, CannotConnect):
        address, os_error = error.address, error.os_error
        if isinstance(os_error, ssl.SSLCertVerificationError):
            reason = os_error.verify_message or os_error
            return (f'the TLS certificate of {address} cannot be verified: {reason}; trust the CA '
                    f'of the server (the cluster\'s "certificate-authority-data" or "certificate-authority" '
                    f'in the kubeconfig)')
        if isinstance(os_error, ssl.SSLError):
            return f'the TLS handshake with {address} has failed: {os_error}'
        if isinstance(os_error, socket.gaierror):
            return f'the host of {address} cannot be resolved'
        if isinstance(os_error, ConnectionRefusedError):
            return f'connection refused to {address}'
        reason = os_error.strerror or str(os_error) or type(os_error).__name__
        return f'cannot connect to {address}: {reason}'
    if isinstance(error, Disconnected):
        return 'the server has closed the connection unexpectedly'
    if isinstance(error, asyncio.TimeoutError):
        return f'timed out: {error}' if str(error) else 'timed out'
    if isinstance(error, NetworkError) and str(error):
        return str(error)
    return repr(error)


def describe_error(error: BaseException) -> str:
    """The error's text; for the network failures, their short description (as above)."""
    if isinstance(error, (NetworkError, asyncio.TimeoutError)):
        return describe_network_error(error)
    return str(error)
