"""
Logging of the operator: per-object loggers, the log formats, and the one-time setup of logging.

Everything the framework and the handlers log about a specific object goes to the ``kopf.objects``
logger via :class:`ObjectLogger`. The adapter attaches a small reference to the object (apiVersion,
kind, name, uid, namespace) to every record; the formatters turn it into the ``[namespace/name]``
prefix (text formats) or into a nested JSON field (the JSON format), and the event poster
(in ``kopf._core.engines.posting``) turns such records into Kubernetes events.

The reference is copied from the body once per adapter, when its first record is logged (an adapter is
made for every event and every timer's tick, but most of them log nothing at the usual levels): the
records can be formatted or posted later (e.g. from a queue), when the body may have changed or been
replaced, so they carry a copy. The prefix is rendered once per adapter too, so that formatting stays
cheap when thousands of objects are logged about.

The attributes added to the records (``kopf_object_ref`` & co) are internal and can change.
"""
import enum
import logging
import sys
import threading
import time
from collections.abc import Mapping, MutableMapping
from typing import Any, ClassVar, TextIO, TypedDict

from kopf._cogs.structs import dicts
from kopf._core.intents.configuration import OperatorSettings

try:
    from pythonjsonlogger.json import JsonFormatter as _JsonFormatter
except ImportError:  # python-json-logger < 3.1 has it in another module
    from pythonjsonlogger.jsonlogger import (  # type: ignore[no-redef,attr-defined,unused-ignore]
        JsonFormatter as _JsonFormatter,
    )

__all__ = [
    'DEFAULT_REFKEY',
    'LocalObjectLogger',
    'LogFormat',
    'ObjectJsonFormatter',
    'ObjectLogger',
    'ObjectRef',
    'ObjectTextFormatter',
    'build_object_prefix',
    'build_object_ref',
    'configure',
    'make_formatter',
    'object_logger',
]

OBJECTS_LOGGER_NAME = 'kopf.objects'

# The logger of all messages about individual objects; the event poster listens to it.
object_logger = logging.getLogger(OBJECTS_LOGGER_NAME)

# The names of the record attributes added by ObjectLogger. They are read by the formatters here
# and by the event poster; they never get into JSON logs as extra fields.
REF_ATTR = 'kopf_object_ref'
PREFIX_ATTR = 'kopf_object_prefix'
LOCAL_ATTR = 'kopf_local_only'
SETTINGS_ATTR = 'kopf_settings'
OWN_RECORD_ATTRS = frozenset({REF_ATTR, PREFIX_ATTR, LOCAL_ATTR, SETTINGS_ATTR})

DEFAULT_REFKEY = 'object'


class ObjectRef(TypedDict):
    """What identifies an object in the logs and in the events about it (as in K8s object references)."""
    apiVersion: str | None
    kind: str | None
    name: str | None
    uid: str | None
    namespace: str | None


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def build_object_ref(body: Mapping[str, Any]) -> ObjectRef:
    """
    Copy the identifying fields of an object into a new, detached reference.

    Besides the regular bodies, it accepts the dicts of the official client's models
    (``obj.to_dict()``), which have ``api_version`` instead of ``apiVersion``.
    """
    body = dicts.raw_mapping(body)  # a live view (kopf.Body) resolves its path on every access
    metadata = body.get('metadata') or {}
    api_version = body.get('apiVersion', body.get('api_version'))
    return ObjectRef(
        apiVersion=_str_or_none(api_version),
        kind=_str_or_none(body.get('kind')),
        name=_str_or_none(metadata.get('name')),
        uid=_str_or_none(metadata.get('uid')),
        namespace=_str_or_none(metadata.get('namespace')),
    )


def build_object_prefix(ref: Mapping[str, Any]) -> str:
    """The prefix of the text logs: ``[namespace/name]``, or ``[name]`` for cluster-scoped objects."""
    name, namespace = ref.get('name'), ref.get('namespace')
    return f'[{namespace}/{name}]' if namespace else f'[{name}]'


class ObjectLogger(logging.LoggerAdapter[logging.Logger]):
    """
    A logger for messages about one object: logs to ``kopf.objects`` with the object's identity.

    The identity is a detached copy of the object's reference (see :func:`build_object_ref`), made
    at the first record, so the records do not keep the body alive and are not affected by its later
    changes (the adapter keeps the body only until then).
    The messages are posted as Kubernetes events of that object if the operator's settings
    allow that (``settings.posting``).
    """

    local: ClassVar[bool] = False  # whether the records must never be posted as k8s-events

    def __init__(self, *, body: Mapping[str, Any], settings: OperatorSettings) -> None:
        super().__init__(object_logger)
        self._body: Mapping[str, Any] | None = body  # until the identity is copied from it
        self._settings = settings
        self._extra: dict[str, Any] | None = None

    def _own_extra(self) -> dict[str, Any]:
        extra = self._extra
        if extra is None:
            ref = build_object_ref(self._body or {})
            extra = self._extra = {
                SETTINGS_ATTR: self._settings,
                REF_ATTR: ref,
                PREFIX_ATTR: build_object_prefix(ref),
                LOCAL_ATTR: self.local,
            }
            self._body = None
        return extra

    def _twin(self, cls: type['ObjectLogger']) -> 'ObjectLogger':
        """The same logger of another class (e.g. the local one), with no repeated parsing of the body."""
        twin = cls.__new__(cls)
        logging.LoggerAdapter.__init__(twin, object_logger)
        twin._body, twin._settings = self._body, self._settings
        twin._extra = {**self._extra, LOCAL_ATTR: cls.local} if self._extra is not None else None
        return twin

    # Several debug & info messages per event, usually of disabled levels: checked at once, with no calls
    # of the adapter's layers. When emitted, the records name the caller's function and line, not these.

    def debug(self, msg: object, *args: object, exc_info: Any = None, stack_info: bool = False,
              stacklevel: int = 1, extra: Mapping[str, object] | None = None, **kwargs: object) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            if exc_info is None and not stack_info and extra is None and not kwargs:
                self._emit(logging.DEBUG, msg, args, sys._getframe(stacklevel))
            else:
                self.log(logging.DEBUG, msg, *args, exc_info=exc_info, stack_info=stack_info,
                         stacklevel=stacklevel + 1, extra=extra, **kwargs)

    def info(self, msg: object, *args: object, exc_info: Any = None, stack_info: bool = False,
             stacklevel: int = 1, extra: Mapping[str, object] | None = None, **kwargs: object) -> None:
        if self.logger.isEnabledFor(logging.INFO):
            if exc_info is None and not stack_info and extra is None and not kwargs:
                self._emit(logging.INFO, msg, args, sys._getframe(stacklevel))
            else:
                self.log(logging.INFO, msg, *args, exc_info=exc_info, stack_info=stack_info,
                         stacklevel=stacklevel + 1, extra=extra, **kwargs)

    def _emit(self, level: int, msg: object, args: tuple[object, ...], frame: Any) -> None:
        """
        What ``self.log()`` does for a plain message, with the caller's frame known (given by the caller).

        The logging's general path looks for the caller by walking the stack from its own frames and
        skipping the logging module's ones (a few Python-level calls per record); the caller here is
        the frame that called :meth:`debug` or :meth:`info` (``stacklevel`` frames up), the same one.
        """
        logger = self.logger
        code = frame.f_code
        record = logger.makeRecord(logger.name, level, code.co_filename, frame.f_lineno, msg, args,
                                   None, code.co_name, self._own_extra(), None)
        logger.handle(record)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        # Keep the caller's own extras (they get into JSON logs), but never let them replace ours.
        own_extra = self._own_extra()
        caller_extra = kwargs.get('extra')
        kwargs['extra'] = {**caller_extra, **own_extra} if caller_extra else own_extra
        return msg, kwargs


class LocalObjectLogger(ObjectLogger):
    """
    The same as :class:`ObjectLogger`, but its messages are never posted as Kubernetes events.

    It is for the messages that are too frequent for events, e.g. about every watch-event.
    """

    local = True


class LogFormat(enum.Enum):
    """The formats of the operator's logs (``--log-format`` in CLI)."""
    PLAIN = '%(message)s'
    FULL = '[%(asctime)s] %(name)-20.20s [%(levelname)-8.8s] %(message)s'
    JSON = '-json-'


class ObjectTextFormatter(logging.Formatter):
    """A text formatter that, if asked to, prefixes the messages about objects with their names."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None, *, prefix: bool = True) -> None:
        super().__init__(fmt, datefmt)
        self.object_prefixing = prefix

    _seconds: int | None = None  # the latest second formatted, and how (the same for many records)
    _seconds_text: str = ''

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        # As the default formatTime() does: the time to the second, then the milliseconds (cached per second).
        seconds = int(record.created)
        if seconds != self._seconds:
            self._seconds_text = time.strftime(self.default_time_format, self.converter(record.created))
            self._seconds = seconds
        return f'{self._seconds_text},{int(record.msecs):03d}'  # as default_msec_format: '%s,%03d'

    def formatMessage(self, record: logging.LogRecord) -> str:
        object_prefix = record.__dict__.get(PREFIX_ATTR) if self.object_prefixing else None
        if not object_prefix:
            return super().formatMessage(record)

        # The prefix goes into this output only: other handlers must see the original message.
        message = record.message
        record.message = f'{object_prefix} {message}'
        try:
            return super().formatMessage(record)
        finally:
            record.message = message


# All attributes of plain records: they are not "extras", so they do not get into JSON logs.
_STANDARD_RECORD_ATTRS = frozenset(logging.LogRecord('', 0, '', 0, '', (), None).__dict__) | {
    'message', 'asctime', 'taskName',
}


def _json_severity(levelno: int) -> str:
    if levelno <= logging.DEBUG:
        return 'debug'
    elif levelno <= logging.INFO:
        return 'info'
    elif levelno <= logging.WARNING:
        return 'warn'
    elif levelno <= logging.ERROR:
        return 'error'
    else:
        return 'fatal'


class ObjectJsonFormatter(_JsonFormatter):
    """
    One JSON object per line: the message, the caller's extras, the exception if any,
    the ISO-formatted timestamp, the object's reference under the ``refkey`` (only for
    messages about objects), and the lowercase severity (``debug``, ``info``, ``warn``,
    ``error``, ``fatal``). The object prefix in the message is off by default: the reference
    identifies the object already.
    """

    def __init__(self, *, refkey: str | None = None, prefix: bool = False) -> None:
        super().__init__(
            '%(message)s',
            timestamp=True,
            reserved_attrs=sorted(_STANDARD_RECORD_ATTRS | OWN_RECORD_ATTRS),
        )
        self.refkey = refkey or DEFAULT_REFKEY
        self.object_prefixing = prefix  # not `prefix`: that is the JSON formatter's own setting

    def add_fields(
            self,
            log_data: dict[str, Any],
            record: logging.LogRecord,
            message_dict: dict[str, Any],
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        attrs = record.__dict__
        object_prefix = attrs.get(PREFIX_ATTR) if self.object_prefixing else None
        if object_prefix:
            log_data['message'] = f'{object_prefix} {log_data.get("message")}'
        ref = attrs.get(REF_ATTR)
        if ref is not None:
            log_data[self.refkey] = ref
        log_data['severity'] = _json_severity(record.levelno)


def make_formatter(
        log_format: LogFormat = LogFormat.FULL,
        *,
        log_prefix: bool | None = None,
        log_refkey: str | None = None,
) -> logging.Formatter:
    """
    A formatter for the format; ``log_prefix=None`` means the default of the format:
    prefixed for the text formats, not prefixed for JSON (it has the reference as a field).
    """
    if log_format is LogFormat.JSON:
        return ObjectJsonFormatter(refkey=log_refkey, prefix=bool(log_prefix))
    return ObjectTextFormatter(log_format.value, prefix=True if log_prefix is None else log_prefix)


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to ``sys.stderr`` as it is at the moment of writing (tools & tests can replace it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # the handler's lock is held here, so this is thread-safe
        super().emit(record)


class _NoisyLoggerMute:
    """
    Silences or restores a third-party logger, remembering its propagation from before.

    The state is taken from the logger itself (is our handler there?), not remembered here,
    so that it stays correct even if someone else resets the logger in between.
    """

    def __init__(self, name: str) -> None:
        self.logger = logging.getLogger(name)
        self.null_handler = logging.NullHandler()  # otherwise, the "last resort" handler prints it
        self.previous_propagate = True

    def mute(self) -> None:
        if self.null_handler not in self.logger.handlers:
            self.previous_propagate = self.logger.propagate
            self.logger.addHandler(self.null_handler)
        self.logger.propagate = False

    def unmute(self) -> None:
        if self.null_handler in self.logger.handlers:
            self.logger.removeHandler(self.null_handler)
            self.logger.propagate = self.previous_propagate


class _LevelCap:
    """Sets a minimal level of a third-party logger, remembering its level from before."""

    def __init__(self, name: str, level: int) -> None:
        self.logger = logging.getLogger(name)
        self.level = level
        self.previous_level: int | None = None

    def apply(self) -> None:
        if self.previous_level is None or self.logger.level != self.level:
            self.previous_level = self.logger.level
            self.logger.setLevel(self.level)

    def revert(self) -> None:
        # If someone else has changed the level since we set it, it is theirs now: leave it.
        if self.previous_level is not None and self.logger.level == self.level:
            self.logger.setLevel(self.previous_level)
        self.previous_level = None


# configure() replaces its own previous setup (its handlers are known by their class, even when
# someone has put an older one back) and leaves the handlers of others (the application, pytest).
_installing = threading.Lock()  # operators started in threads at once (e.g. 2 replicas in a test)
_asyncio_mute = _NoisyLoggerMute('asyncio')
_aiohttp_cap = _LevelCap('aiohttp', logging.INFO)  # hides the debug internals, keeps the access logs


def configure(
        debug: bool | None = None,
        verbose: bool | None = None,
        quiet: bool | None = None,
        log_format: LogFormat = LogFormat.FULL,
        log_prefix: bool | None = False,
        log_refkey: str | None = None,
) -> None:
    """
    Set up the logging of the process: the level, the format, the output to stderr.

    The levels: ``debug`` shows everything including the internals of asyncio; ``verbose``
    shows what the framework does (the debug messages) but hides the asyncio & aiohttp
    internals; ``quiet`` shows only warnings and errors; the default shows the informational
    messages and above. Calling it again replaces the previous setup (it does not add handlers).
    ``log_prefix=None`` means the format's default (see :func:`make_formatter`).
    """
    if isinstance(log_format, str):  # tolerate the names from configs/CLIs, e.g. 'json'
        log_format = LogFormat[log_format.upper()]

    if debug or verbose:
        level = logging.DEBUG
    elif quiet:
        level = logging.WARNING
    else:
        level = logging.INFO

    handler = _StderrHandler()
    handler.setFormatter(make_formatter(log_format, log_prefix=log_prefix, log_refkey=log_refkey))

    root = logging.getLogger()
    with _installing:
        for previous in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
            root.removeHandler(previous)
            previous.close()
        root.addHandler(handler)
        root.setLevel(level)

    if debug:
        _asyncio_mute.unmute()
        _aiohttp_cap.revert()
    elif verbose:
        _asyncio_mute.mute()
        _aiohttp_cap.apply()
    else:
        _asyncio_mute.mute()
        _aiohttp_cap.revert()
