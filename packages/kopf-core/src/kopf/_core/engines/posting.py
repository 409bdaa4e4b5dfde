"""
Kubernetes events (``kind: Event``, as seen in ``kubectl describe``) about objects, posted in the background.

The events come from two sources:

* explicit calls of :func:`event`, :func:`info`, :func:`warn`, :func:`exception` in the handlers
  (or anywhere else in the operator's code, in any thread);
* the records of the per-object loggers (``kopf.objects``, see ``kopf._core.actions.loggers``)
  at or above ``settings.posting.level`` if ``settings.posting.loggers`` is on.

In both cases, nothing is posted if ``settings.posting.enabled`` is off, and nothing is posted
about events themselves ("no events for events"): otherwise, an operator that handles events
would cause an avalanche of events about events about events.

The callers never wait for the API: the events are put to a queue and return immediately;
a full queue drops the event (with a debug message) instead of blocking or failing the caller.
The poster task (:func:`poster`) takes them from the queue and posts them by several workers
in parallel (``settings.posting.worker_limit``), retrying the failures with the back-offs of
the event (``settings.posting.default_backoffs`` for explicit events, ``logging_backoffs`` for
the log messages): a failure to post an event is never an error of the object's handling.

Every operator has its own queue, its own settings, and its own poster. Several operators can
run in one process (embedded): an event is put to the queue of the operator in whose context it
is created. The context is a context variable (:data:`event_queue_var`) that the reactor sets
before it spawns the operator's tasks, so every task of the operator inherits it, and so do
the synchronous handlers if they are executed in a copy of the task's context. In threads that
do not carry that context (e.g. started by the operator's code), the queue of the only running
operator is used; if several operators are running, such events are dropped, since it is unknown
which of the operators they belong to (run such threads in ``contextvars.copy_context()``).
"""
import asyncio
import contextvars
import dataclasses
import datetime
import logging
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kopf._clients import events
from kopf._clients.vault import Vault
from kopf._cogs.aiokits.backoffs import BackoffsSpec
from kopf._core.actions import loggers
from kopf._core.intents.configuration import OperatorSettings

__all__ = [
    'EventQueue',
    'K8sEvent',
    'event',
    'event_queue_var',
    'exception',
    'find_event_queue',
    'info',
    'poster',
    'warn',
]

logger = logging.getLogger(__name__)  # never the per-object logger: its records can become events

DEFAULT_QUEUE_SIZE = 10_000
LOGGING_REASON = 'Logging'

# The explicit events of these types are posted only at or above the settings' level (as if they were
# log messages); the events of other (custom) types are always posted if posting is enabled at all.
EVENT_TYPE_LEVELS: Mapping[str, int] = {
    'Normal': logging.INFO,
    'Warning': logging.WARNING,
    'Error': logging.ERROR,
}

# The API limits the message of events. Unlike the client's cut at the end, the middle is cut here,
# so that both the beginning and the ending (often the most meaningful part, e.g. errors) are kept.
MAX_MESSAGE_LENGTH = events.MAX_MESSAGE_LENGTH
CUT_MESSAGE_INFIX = '...'


@dataclasses.dataclass(frozen=True, slots=True)
class K8sEvent:
    """One event to post: about which object, what, and how persistently to retry it."""
    ref: Mapping[str, Any]
    type: str
    reason: str
    message: str
    backoffs: BackoffsSpec
    timestamp: datetime.datetime


def cut_message(message: str) -> str:
    if len(message) <= MAX_MESSAGE_LENGTH:
        return message
    kept = MAX_MESSAGE_LENGTH - len(CUT_MESSAGE_INFIX)
    head = (kept + 1) // 2
    tail = kept - head
    return message[:head] + CUT_MESSAGE_INFIX + message[-tail:]


def event_type_for_level(levelno: int) -> str:
    if levelno >= logging.ERROR:
        return 'Error'
    elif levelno >= logging.WARNING:
        return 'Warning'
    else:
        return 'Normal'


class EventQueue:
    """
    The events of one operator waiting for its poster; safe to fill from any thread.

    It must be created in the operator's event loop. Putting never blocks and never raises:
    when the queue is full or the operator's loop is closed, the event is dropped with a debug
    message. The operator's settings travel with the queue, so that the event-posting calls
    know whether and how to post without a separate context.
    """

    def __init__(self, *, settings: OperatorSettings, maxsize: int = DEFAULT_QUEUE_SIZE) -> None:
        super().__init__()
        self.settings = settings
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._queue: asyncio.Queue[K8sEvent] = asyncio.Queue(maxsize=maxsize)
        self._arrived = asyncio.Event()

    def __len__(self) -> int:
        return self._queue.qsize()

    def put(self, event: K8sEvent) -> None:
        """Queue an event for posting, from any thread; never block, never fail."""
        if threading.get_ident() == self._loop_thread_id:
            self._put_here(event)
            return
        try:
            self._loop.call_soon_threadsafe(self._put_here, event)
        except RuntimeError:  # the loop is closed: the operator has exited
            logger.debug(f'The operator has exited; dropping the event: {_describe(event)}')

    def _put_here(self, event: K8sEvent) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            logger.debug(f'Too many events are waiting to be posted; dropping the event: {_describe(event)}')
        else:
            self._arrived.set()

    async def join(self) -> None:
        """Wait until all events queued so far are processed: posted, or given up after retries."""
        await self._queue.join()


# The queue of the operator in whose context the code runs; set by the reactor for its tasks.
event_queue_var: contextvars.ContextVar[EventQueue] = contextvars.ContextVar('event_queue_var')

# The queues with running posters: for the calls from threads without the operator's context.
_running_queues: list[EventQueue] = []
_running_queues_lock = threading.Lock()


def find_event_queue() -> EventQueue | None:
    """The queue of the current operator, or of the only running one, or None if unknown."""
    try:
        return event_queue_var.get()
    except LookupError:
        pass
    with _running_queues_lock:
        return _running_queues[0] if len(_running_queues) == 1 else None


def _describe(event: K8sEvent) -> str:
    return f'{event.type} {event.reason}: {event.message!r}'


def _iter_bodies(objs: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    items: Iterable[Any] = [objs] if isinstance(objs, Mapping) else objs
    for item in items:
        if isinstance(item, Mapping):
            yield item
        elif callable(getattr(item, 'to_dict', None)):  # models of the official client
            yield item.to_dict()
        else:
            raise TypeError(f'Events can be posted only about objects as mappings, got {item!r}.')


def event(
        objs: Mapping[str, Any] | Iterable[Mapping[str, Any]],
        *,
        type: str,
        reason: str,
        message: str = '',
        backoffs: BackoffsSpec | None = None,
) -> None:
    """
    Post a Kubernetes event about an object or objects, in the background.

    It returns immediately, in any thread. The event is dropped if posting is disabled in
    the operator's settings, if its type (``Normal``/``Warning``/``Error``) is below the
    settings' level, if it is about an event, or if there is no operator to post it.
    ``backoffs`` are the delays between the retries on failures (the settings' default if None).
    """
    queue = find_event_queue()
    if queue is None:
        logger.debug(f'No operator in this context; dropping the event: {type} {reason}: {message!r}')
        return

    posting = queue.settings.posting
    level = EVENT_TYPE_LEVELS.get(type)
    if not posting.enabled or (level is not None and level < posting.level):
        return

    actual_backoffs = posting.default_backoffs if backoffs is None else backoffs
    timestamp = datetime.datetime.now(datetime.UTC)
    actual_message = cut_message(message)
    for body in _iter_bodies(objs):
        ref = loggers.build_object_ref(body)
        if not events.is_event_ref(ref):
            queue.put(K8sEvent(ref=ref, type=type, reason=reason, message=actual_message,
                               backoffs=actual_backoffs, timestamp=timestamp))


def info(
        objs: Mapping[str, Any] | Iterable[Mapping[str, Any]],
        *,
        reason: str,
        message: str = '',
        backoffs: BackoffsSpec | None = None,
) -> None:
    """Post a ``Normal`` event about the object(s); see :func:`event`."""
    event(objs, type='Normal', reason=reason, message=message, backoffs=backoffs)


def warn(
        objs: Mapping[str, Any] | Iterable[Mapping[str, Any]],
        *,
        reason: str,
        message: str = '',
        backoffs: BackoffsSpec | None = None,
) -> None:
    """Post a ``Warning`` event about the object(s); see :func:`event`."""
    event(objs, type='Warning', reason=reason, message=message, backoffs=backoffs)


def exception(
        objs: Mapping[str, Any] | Iterable[Mapping[str, Any]],
        *,
        reason: str = '',
        message: str = '',
        exc: BaseException | None = None,
        backoffs: BackoffsSpec | None = None,
) -> None:
    """
    Post an ``Error`` event about the object(s) with an exception; see :func:`event`.

    The exception is the one being handled now unless given explicitly. Its text is appended
    to the message; its class name is the reason unless the reason is given.
    """
    if exc is None:
        exc = sys.exc_info()[1]
    reason = reason or type(exc).__name__
    if exc is not None:
        message = f'{message} {exc}' if message else str(exc)
    event(objs, type='Error', reason=reason, message=message, backoffs=backoffs)


class ObjectLogsPostingHandler(logging.Handler):
    """
    Turns the records of the per-object loggers into events of those objects.

    It is attached to the ``kopf.objects`` logger once the module is imported. The records of
    the local loggers (:class:`~kopf._core.actions.loggers.LocalObjectLogger`) and the records
    without an object (e.g. logged directly to ``kopf.objects``) are never posted.
    """

    def emit(self, record: logging.LogRecord) -> None:
        attrs = record.__dict__
        ref: Mapping[str, Any] | None = attrs.get(loggers.REF_ATTR)
        settings: OperatorSettings | None = attrs.get(loggers.SETTINGS_ATTR)
        if ref is None or settings is None or attrs.get(loggers.LOCAL_ATTR):
            return

        posting = settings.posting
        if not posting.enabled or not posting.loggers or record.levelno < posting.level:
            return
        if events.is_event_ref(ref):
            return

        queue = find_event_queue()
        if queue is None:
            return

        try:
            message = record.getMessage()
        except Exception:
            self.handleError(record)
            return

        queue.put(K8sEvent(
            ref=ref,
            type=event_type_for_level(record.levelno),
            reason=LOGGING_REASON,
            message=cut_message(message),
            backoffs=posting.logging_backoffs,
            timestamp=datetime.datetime.fromtimestamp(record.created, datetime.UTC),
        ))


def _install_logs_handler() -> None:
    # Once per process, even if several operators run: the handler finds the queue of each record.
    # It is here from the import on (not only while the posters run), so that the messages logged
    # in the operator's context before its poster starts are queued too.
    if not any(isinstance(handler, ObjectLogsPostingHandler) for handler in loggers.object_logger.handlers):
        loggers.object_logger.addHandler(ObjectLogsPostingHandler())


_install_logs_handler()


def _start_serving(queue: EventQueue) -> None:
    with _running_queues_lock:
        _running_queues.append(queue)


def _stop_serving(queue: EventQueue) -> None:
    with _running_queues_lock:
        _running_queues.remove(queue)


async def poster(*, event_queue: EventQueue, vault: Vault) -> None:
    """
    Post the events of the queue until cancelled, by a pool of workers.

    The workers are started as the events arrive, up to ``settings.posting.worker_limit``
    (unlimited if None), and exit after ``settings.posting.idle_timeout`` seconds without
    events. While the poster runs, the calls from the threads without the operator's context
    use its queue if it is the only running poster in the process. On cancellation,
    the events being posted are abandoned, the queued ones are kept.
    """
    pool = _WorkersPool(event_queue=event_queue, vault=vault)
    _start_serving(event_queue)
    try:
        while True:
            await event_queue._arrived.wait()
            event_queue._arrived.clear()
            pool.scale()
    finally:
        _stop_serving(event_queue)
        await pool.stop()


class _WorkersPool:
    """The workers of one poster; a worker posts one event at a time, with its retries."""

    def __init__(self, *, event_queue: EventQueue, vault: Vault) -> None:
        super().__init__()
        self.event_queue = event_queue
        self.vault = vault
        self.workers: set[asyncio.Task[None]] = set()
        self.idle = 0  # workers that are started or waiting for events, i.e. not posting now

    def scale(self) -> None:
        queue = self.event_queue._queue
        limit = self.event_queue.settings.posting.worker_limit
        while queue.qsize() > self.idle and (limit is None or len(self.workers) < max(1, limit)):
            self.idle += 1
            task = asyncio.create_task(self._work(), name='poster of events: worker')
            self.workers.add(task)
            task.add_done_callback(self.workers.discard)

    async def stop(self) -> None:
        workers = list(self.workers)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    async def _work(self) -> None:
        queue = self.event_queue._queue
        settings = self.event_queue.settings
        try:
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=settings.posting.idle_timeout)
                except TimeoutError:
                    if queue.empty():
                        return
                    continue  # an event came just when the time was out: do not leave it unserved

                self.idle -= 1
                try:
                    await _post_with_retries(event, settings=settings, vault=self.vault)
                except Exception:
                    logger.exception(f'Failed to post an event unexpectedly: {_describe(event)}')
                finally:
                    self.idle += 1
                    queue.task_done()
        finally:
            self.idle -= 1


async def _post_with_retries(event: K8sEvent, *, settings: OperatorSettings, vault: Vault) -> None:
    """
    Post one event by the client, retrying any failure with the event's own back-offs (best-effort).

    The event's back-offs replace the client's ``settings.networking.error_backoffs``, so the number
    of attempts and the delays are only those of the event. The absent namespace (e.g. being deleted
    together with the object) is not retried: it will not appear again. The client logs the failures.
    """
    posting = settings.posting
    await events.post_event(
        settings=settings, vault=vault, ref=event.ref, type=event.type, reason=event.reason,
        message=event.message, component=posting.reporting_component, instance=posting.reporting_instance,
        name_prefix=posting.event_name_prefix, now=event.timestamp,
        backoffs=event.backoffs, best_effort=True, logger=logger,
    )
