"""
The exceptions that handlers raise to tell the framework how to treat their failures.

``TemporaryError`` asks for a retry (after its delay), ``PermanentError`` stops the retries
of the handler for the current change. Any other exception is treated according to the
handler's ``errors=`` mode (:class:`kopf.ErrorsMode`, which lives with the handlers' declarations
in ``kopf._core.intents.handlers`` and is re-exported here for convenience).
"""
from kopf._core.intents.handlers import ErrorsMode

__all__ = [
    'AdmissionError',
    'ErrorsMode',
    'HandlerChildrenRetry',
    'HandlerRetriesError',
    'HandlerTimeoutError',
    'PermanentError',
    'TemporaryError',
]


class PermanentError(Exception):
    """A failure that retrying cannot fix: the handler is failed for good (for this change)."""


class TemporaryError(Exception):
    """
    A failure that may go away by itself: the handler is retried after ``delay`` seconds.

    A delay of ``None`` (or zero) means an immediate retry.
    """

    delay: float | None

    def __init__(self, message: str | None = None, /, delay: float | None = 60) -> None:
        # No message means no args at all, so that str(err) is empty rather than "None".
        super().__init__(*(() if message is None else (message,)))
        self.delay = delay


class HandlerTimeoutError(PermanentError):
    """The handler has been retried for longer than its ``timeout=`` allows."""


class HandlerRetriesError(PermanentError):
    """The handler has been retried more times than its ``retries=`` allows."""


class HandlerChildrenRetry(TemporaryError):
    """
    An internal signal: the handler itself is done, but some of its sub-handlers are not yet.

    It is retried like a temporary error (usually with no delay), but reported more quietly,
    since nothing has actually failed.
    """


class AdmissionError(PermanentError):
    """
    A rejection of an admission request with a message and an HTTP code for the API client.

    It is a permanent error in every other regard; in admission webhooks, it is preferred over
    other errors when only one of several failures can be reported back to the API server.
    """

    message: str
    code: int

    def __init__(self, message: str = '', code: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
