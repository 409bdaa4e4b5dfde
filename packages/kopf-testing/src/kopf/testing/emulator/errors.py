"""
API errors as the Kubernetes API server reports them: ``kind: Status`` objects with codes and reasons.

Every failure inside the emulator is raised as :class:`ApiError` and rendered by the HTTP layer;
the helpers below build the common ones with the wording real API servers use, so that clients
which parse the messages or the reasons behave the same as against a real cluster.
"""

from collections.abc import Mapping, Sequence
from typing import Any

# The reason that real API servers put into a Status for each HTTP code they may return.
REASONS_BY_CODE: Mapping[int, str] = {
    400: 'BadRequest',
    401: 'Unauthorized',
    403: 'Forbidden',
    404: 'NotFound',
    405: 'MethodNotAllowed',
    406: 'NotAcceptable',
    409: 'Conflict',
    410: 'Gone',
    413: 'RequestEntityTooLarge',
    415: 'UnsupportedMediaType',
    422: 'Invalid',
    429: 'TooManyRequests',
    500: 'InternalError',
    503: 'ServiceUnavailable',
    504: 'Timeout',
}


class ApiError(Exception):
    """A failed API request, rendered to the client as a ``kind: Status`` object."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        plain_text: bool = False,
    ) -> None:
        super().__init__(message)
        self.plain_text = plain_text  # sent as text/plain, not as a Status (as real servers do off the API)
        self.code = code
        self.message = message
        self.reason = reason if reason is not None else REASONS_BY_CODE.get(code, 'Unknown')
        self.details = dict(details) if details else None
        self.headers = dict(headers) if headers else {}
        self.warnings: list[str] = []  # e.g. the unknown fields found before the failure: sent anyway

    def as_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            'kind': 'Status',
            'apiVersion': 'v1',
            'metadata': {},
            'status': 'Failure',
            'message': self.message,
            'reason': self.reason,
            'code': self.code,
        }
        if not self.reason:  # e.g. the invalid shard selectors of real servers: 500 with no reason
            del status['reason']
        if self.details:
            status['details'] = self.details
        return status


def _resource_details(plural: str, group: str, name: str | None) -> dict[str, Any]:
    details: dict[str, Any] = {'kind': plural}
    if name:
        details['name'] = name
    if group:
        details['group'] = group
    return details


def _qualified(plural: str, group: str) -> str:
    return f'{plural}.{group}' if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        404, f'{_qualified(plural, group)} "{name}" not found', details=_resource_details(plural, group, name)
    )


def unknown_resource() -> ApiError:
    return ApiError(404, 'the server could not find the requested resource', details={})


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        409,
        f'{_qualified(plural, group)} "{name}" already exists',
        reason='AlreadyExists',
        details=_resource_details(plural, group, name),
    )


def conflict(plural: str, group: str, name: str, explanation: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": {explanation}',
        reason='Conflict',
        details=_resource_details(plural, group, name),
    )


def modified_conflict(plural: str, group: str, name: str) -> ApiError:
    return conflict(
        plural,
        group,
        name,
        'the object has been modified; please apply your changes to the latest version and try again',
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def forbidden(plural: str, group: str, name: str, explanation: str) -> ApiError:
    return ApiError(
        403,
        f'{_qualified(plural, group)} "{name}" is forbidden: {explanation}',
        details=_resource_details(plural, group, name),
    )


def namespace_terminating(plural: str, group: str, name: str, namespace: str) -> ApiError:
    """Creating in a namespace being deleted: 403 with the ``NamespaceTerminating`` cause, as Kubernetes."""
    details = {
        **_resource_details(plural, group, name),
        'causes': [{
            'reason': 'NamespaceTerminating',
            'message': f'namespace {namespace} is being terminated',
            'field': 'metadata.namespace',
        }],
    }
    return ApiError(
        403,
        f'{_qualified(plural, group)} "{name}" is forbidden: '
        f'unable to create new content in namespace {namespace} because it is being terminated',
        details=details,
    )


def method_not_allowed(message: str) -> ApiError:
    return ApiError(405, message, details={})


def unsupported_media_type(accepted: Sequence[str]) -> ApiError:
    return ApiError(
        415,
        'the body of the request was in an unknown format - accepted media types include: '
        + ', '.join(accepted),
    )


def expired(message: str) -> ApiError:
    return ApiError(410, message, reason='Expired')


class Cause:
    """One field-level problem of an invalid object, as in a Status' ``details.causes``."""

    __slots__ = ('field', 'message', 'reason')

    def __init__(self, field: str, message: str, reason: str = 'FieldValueInvalid') -> None:
        self.field = field
        self.message = message
        self.reason = reason

    def as_dict(self) -> dict[str, str]:
        return {'reason': self.reason, 'message': self.message, 'field': self.field}

    def __str__(self) -> str:
        return f'{self.field}: {self.message}'


def invalid(kind: str, group: str, name: str, causes: Sequence[Cause]) -> ApiError:
    if len(causes) == 1:
        summary = str(causes[0])
    else:
        summary = '[' + ', '.join(str(cause) for cause in causes) + ']'
    details: dict[str, Any] = {'kind': kind, 'causes': [cause.as_dict() for cause in causes]}
    if name:  # e.g. not for the options of requests (DeleteOptions, CreateOptions)
        details = {'name': name, **details}
    if group:
        details['group'] = group
    return ApiError(
        422,
        f'{kind}.{group} "{name}" is invalid: {summary}'
        if group
        else f'{kind} "{name}" is invalid: {summary}',
        details=details,
    )


def undecodable(kind: str, version: str, explanation: str) -> ApiError:
    """A body that does not fit the Go types of its resource (e.g. a number as a label): 400."""
    return ApiError(400, f'{kind} in version "{version}" cannot be handled as a {kind}: {explanation}')


def page_not_found() -> ApiError:
    """Outside of the served API groups: a plain-text 404, not a Status, as real servers answer."""
    return ApiError(404, '404 page not found', plain_text=True)


def unprocessable(message: str) -> ApiError:
    """A well-formed request that cannot be applied, e.g. a JSON-patch whose ``test`` fails."""
    return ApiError(422, message)


def internal_error(message: str) -> ApiError:
    return ApiError(500, f'Internal error occurred: {message}', details={'causes': [{'message': message}]})
