"""
The progress of the handlers of one object within one handling cycle: retries, delays, successes, failures.

A handler's progress survives between the handling cycles (and operator restarts) only on the object
itself, via the progress storage (annotations, status, or both). This module turns those records
into immutable in-memory states, advances them with the outcomes of the handlers' executions,
and writes the changed ones back into the patch of the object.

The record format is compatible with the records that Kopf writes, field by field and in this order::

    {"started": "2020-12-31T23:59:59.123456+00:00",   # the first attempt (for timeouts & kwargs)
     "stopped": "...",                                # when finished (successfully or not)
     "delayed": "...",                                # not to be retried until then
     "purpose": "create",                             # the reason of the cycle the record belongs to
     "retries": 1,                                    # the number of attempts made so far
     "success": false, "failure": false,              # finished: succeeded or failed for good
     "message": "...",                                # the last error, if any
     "subrefs": ["parent/child1"]}                    # all the sub-handlers' ids (of all depths)

The absent fields are ``None`` in the records given to the storage: it is up to the storage
to omit them (annotations) or to send them as deletions (status).
"""
import dataclasses
import datetime
import json
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, NamedTuple, cast

from kopf._cogs.helpers.typedefs import Logger
from kopf._cogs.structs.bodies import Body, BodyEssence
from kopf._cogs.structs.patches import Patch
from kopf._core.intents.handlers import BaseHandler, HandlerId
from kopf._core.persistence.conventions import describe_json, excerpt, shorten
from kopf._core.persistence.diffbase import DiffBaseStorage
from kopf._core.persistence.progress import ProgressRecord, ProgressStorage

__all__ = [
    'HandlerState',
    'Outcome',
    'State',
    'StateCounts',
    'fetch_diffbase',
]

# For the callers that give no logger (e.g. custom tools): the unreadable records are never silent.
_fallback_logger = logging.getLogger('kopf.objects')


class Outcome(NamedTuple):
    """
    The result of one attempt to execute a handler.

    ``final`` means that the handler is finished for this cycle: it succeeded (``exception`` is None)
    or failed for good (``exception`` is set). Otherwise, it is retried after ``delay`` seconds
    (``None``: as soon as possible, with no delay recorded). ``result`` is the handler's return value
    (only for successes). ``subrefs`` are the ids of the sub-handlers seen by the handler (of all depths).

    A named tuple, not a frozen dataclass: one is made for every handler call, and a frozen dataclass
    sets its fields one by one through ``object.__setattr__()`` (several times slower to make).
    """

    final: bool
    delay: float | None = None
    result: object = None
    exception: BaseException | None = None
    subrefs: Collection[HandlerId] = ()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _parse_time(value: object) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    parsed = datetime.datetime.fromisoformat(value)
    # The timestamps are in UTC by convention even if written without a timezone (e.g. by older versions).
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=datetime.UTC)


def _format_time(value: datetime.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _normalized(record: Mapping[str, Any] | None) -> dict[str, Any]:
    # Absent keys and None values mean the same in the records (annotations omit them, the status keeps them).
    return {key: value for key, value in (record or {}).items() if value is not None}


@dataclasses.dataclass(frozen=True, kw_only=True)
class HandlerState:
    """
    The progress of one handler for one object: immutable; every change makes a new state.

    ``stored`` is the record as it was fetched from the storage (None for new states): the state is
    written back only if its record differs from it, so that unchanged handlers cause no patches.
    """

    started: datetime.datetime | None = None
    stopped: datetime.datetime | None = None
    delayed: datetime.datetime | None = None
    purpose: str | None = None
    retries: int = 0
    success: bool = False
    failure: bool = False
    message: str | None = None
    subrefs: tuple[HandlerId, ...] = ()
    stored: ProgressRecord | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def from_scratch(cls, *, purpose: str | None = None) -> 'HandlerState':
        """A handler seen for the first time in this cycle: it "starts" now (for its timeout & kwargs)."""
        return _BLANK_STATE._replace(started=_now(), purpose=purpose)

    def _replace(self, **changes: Any) -> 'HandlerState':
        """
        The same as ``dataclasses.replace()``, but several times faster (it is done for every handler call).

        The frozen dataclass's own ``__init__`` sets the fields one by one via ``object.__setattr__``;
        the fields are plain attributes, so a copy of the instance's dict is the same state.
        """
        state = object.__new__(HandlerState)
        state.__dict__.update(self.__dict__, **changes)
        return state

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> 'HandlerState':
        """Restore the state from a stored record (lenient to absent fields, strict to malformed times)."""
        return cls(
            started=_parse_time(record.get('started')) or _now(),
            stopped=_parse_time(record.get('stopped')),
            delayed=_parse_time(record.get('delayed')),
            purpose=record.get('purpose'),
            retries=int(record.get('retries') or 0),
            success=bool(record.get('success')),
            failure=bool(record.get('failure')),
            message=record.get('message'),
            subrefs=tuple(HandlerId(ref) for ref in record.get('subrefs') or ()),
            stored=cast(ProgressRecord, dict(record)),
        )

    def as_record(self) -> ProgressRecord:
        """The record to store: all the fields, in the canonical order, ``None`` for the absent ones."""
        return ProgressRecord(
            started=_format_time(self.started),
            stopped=_format_time(self.stopped),
            delayed=_format_time(self.delayed),
            purpose=self.purpose,
            retries=self.retries,
            success=self.success,
            failure=self.failure,
            message=self.message,
            subrefs=list(self.subrefs) if self.subrefs else None,
        )

    @property
    def changed(self) -> bool:
        """Whether the state must be (re-)written to the storage."""
        return _normalized(self.as_record()) != _normalized(self.stored)

    def with_purpose(self, purpose: str | None) -> 'HandlerState':
        """The same progress, but for another cycle (e.g. an unfinished update turned into a deletion)."""
        return self._replace(purpose=purpose)

    def with_outcome(self, outcome: Outcome) -> 'HandlerState':
        """The state after one more attempt: finished or to be retried (maybe after a delay)."""
        now = _now()
        subrefs: tuple[HandlerId, ...] = ()
        if self.subrefs or outcome.subrefs:
            subrefs = tuple(sorted(set(self.subrefs) | set(outcome.subrefs)))
        if outcome.final:
            failed = outcome.exception is not None
            return self._replace(
                stopped=now,
                delayed=None,
                retries=self.retries + 1,
                success=not failed,
                failure=failed,
                message=str(outcome.exception) if failed else None,
                subrefs=subrefs,
            )
        else:
            delay = outcome.delay
            return self._replace(
                delayed=now + datetime.timedelta(seconds=delay) if delay is not None else None,
                retries=self.retries + 1,
                message=str(outcome.exception) if outcome.exception is not None else None,
                subrefs=subrefs,
            )

    @property
    def finished(self) -> bool:
        return self.success or self.failure

    @property
    def sleeping(self) -> bool:
        """Whether the handler must not be retried yet (it is delayed into the future)."""
        return not self.finished and self.delayed is not None and self.delayed > _now()

    @property
    def awakened(self) -> bool:
        """Whether the handler can be executed now (if it is not finished)."""
        return not self.sleeping

    @property
    def delay(self) -> float:
        """Seconds until the handler can be retried: 0 if it can be retried now (or is finished)."""
        if self.finished or self.delayed is None:
            return 0
        return max(0.0, (self.delayed - _now()).total_seconds())

    @property
    def runtime(self) -> datetime.timedelta:
        """The time since the first attempt (across the retries, cycles, and operator restarts)."""
        return _now() - self.started if self.started is not None else datetime.timedelta(0)


_BLANK_STATE = HandlerState()  # the defaults of all fields, for the fast copies


class StateCounts(NamedTuple):
    """How many handlers are finished (either way) and how many are still pending."""

    success: int
    failure: int
    pending: int


class State(Mapping[HandlerId, HandlerState]):
    """
    The states of the handlers of one object in one cycle: an immutable mapping by the handlers' ids.

    A processing cycle of an object (``resource_handlers``: all changing handlers of the resource,
    ``cause_handlers``: those selected for the cause)::

        state = State.from_storage(body=body, storage=storage, handlers=resource_handlers)
        if state.purpose is not None and state.purpose != cause.reason:  # e.g. an update -> a deletion
            ...  # log the superseded cycle's state.counts
            state.purge(body=body, patch=patch, storage=storage, handlers=resource_handlers)
        state = state.with_purpose(cause.reason).with_handlers(cause_handlers)
        outcomes = await execute_handlers_once(..., handlers=cause_handlers, state=state)
        state = state.with_outcomes(outcomes)
        state.store(body=body, patch=patch, storage=storage)
        deliver_results(outcomes=outcomes, patch=patch)
        if state.done:  # the records stored in this very cycle are dropped from the patch
            state.purge(body=body, patch=patch, storage=storage, handlers=resource_handlers)
    """

    _states: Mapping[HandlerId, HandlerState]
    _purpose: str | None

    def __init__(
            self,
            states: Mapping[HandlerId, HandlerState] | None = None,
            *,
            purpose: str | None = None,
    ) -> None:
        super().__init__()
        self._states = dict(states or {})
        self._purpose = purpose

    def _derived(self, states: dict[HandlerId, HandlerState], purpose: str | None) -> 'State':
        """A new state of the same type with these states, which are not copied (they are made for it)."""
        state = object.__new__(type(self))
        state._states = states
        state._purpose = purpose
        return state

    @classmethod
    def from_scratch(cls, *, purpose: str | None = None) -> 'State':
        """An empty state: nothing has been stored (e.g. for the activities, which have no object)."""
        return cls(purpose=purpose)

    @classmethod
    def from_storage(
            cls,
            *,
            body: Body,
            storage: ProgressStorage,
            handlers: Iterable[BaseHandler],
            logger: Logger | None = None,
    ) -> 'State':
        """
        The stored states of those of the handlers that have any records on the object.

        The unreadable records (e.g. garbage in the annotations) are reported to the logger
        and ignored: those handlers start from scratch, as if they had no records.

        The purpose of the state is the purpose of the stored records (normally, they all have
        the same one), or None if nothing is stored.
        """
        states: dict[HandlerId, HandlerState] = {}
        for handler in handlers:
            if handler.id not in states:
                state = _fetch_state(storage=storage, key=handler.id, body=body,
                                     logger=logger if logger is not None else _fallback_logger)
                if state is not None:
                    states[handler.id] = state
        purposes = [state.purpose for state in states.values() if state.purpose is not None]
        return cls(states, purpose=purposes[0] if purposes else None)

    def __repr__(self) -> str:
        return f'<{type(self).__name__} purpose={self._purpose!r}: {self._states!r}>'

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[HandlerId]:
        return iter(self._states)

    def __getitem__(self, key: HandlerId) -> HandlerState:
        return self._states[key]

    # Not the Mapping's own ones: they go through __getitem__ and its KeyError (done for every handler call).
    def __contains__(self, key: object) -> bool:
        return key in self._states

    def get(self, key: HandlerId, default: Any = None) -> Any:
        return self._states.get(key, default)

    @property
    def purpose(self) -> str | None:
        """The reason of the cycle this state belongs to (e.g. ``'create'``), if known."""
        return self._purpose

    def with_purpose(self, purpose: str | None) -> 'State':
        """
        The same progress, re-labelled for another purpose.

        This is how an unfinished cycle continues as another one (e.g. an update superseded by
        a deletion): the handlers that serve both keep their retries, delays, and start times.
        """
        if not self._states:  # the usual case: nothing stored (a cycle of one step stores nothing)
            return self if purpose == self._purpose else self._derived({}, purpose)
        if purpose == self._purpose and all(state.purpose == purpose for state in self._states.values()):
            return self
        states = {key: state.with_purpose(purpose) for key, state in self._states.items()}
        return self._derived(states, purpose)

    def with_handlers(self, handlers: Iterable[BaseHandler]) -> 'State':
        """
        The states of exactly these handlers: the known ones are kept, the new ones start now.

        The states of other handlers (e.g. from a superseded cycle) are dropped: purge them
        from the storage beforehand if needed.
        """
        states: dict[HandlerId, HandlerState] = {}
        for handler in handlers:
            known = self._states.get(handler.id)
            if known is None:
                known = HandlerState.from_scratch(purpose=self._purpose)
            states[handler.id] = known
        return self._derived(states, self._purpose)

    def with_restarted(self, keys: Iterable[HandlerId]) -> 'State':
        """
        The same progress, but these handlers start anew, as if they had never run in this cycle.

        E.g. the handlers finished before the object changed in the middle of the cycle. Their records
        are overwritten when stored (the old ones are kept as ``stored``, to compare the new ones with).
        """
        states = dict(self._states)
        for key in keys:
            known = states.get(key)
            if known is not None:
                fresh = HandlerState.from_scratch(purpose=self._purpose)
                states[key] = fresh._replace(stored=known.stored)
        return self._derived(states, self._purpose)

    def with_outcomes(self, outcomes: Mapping[HandlerId, Outcome]) -> 'State':
        """The state after the handlers' attempts; the outcomes of unknown handlers are ignored."""
        states = dict(self._states)
        for key, outcome in outcomes.items():
            if key in states:
                states[key] = states[key].with_outcome(outcome)
        return self._derived(states, self._purpose)

    def store(self, *, body: Body, patch: Patch, storage: ProgressStorage) -> None:
        """Put the changed (and new) states into the patch, via the storage."""
        for key, state in self._states.items():
            record = state.as_record()  # the same as `state.changed` does, but made only once
            if _normalized(record) != _normalized(state.stored):
                storage.store(key=key, record=record, body=body, patch=patch)

    def purge(
            self,
            *,
            body: Body,
            patch: Patch,
            storage: ProgressStorage,
            handlers: Iterable[BaseHandler] = (),
    ) -> None:
        """
        Put the removal of the records into the patch: of this state's handlers, of the given handlers
        (e.g. all handlers of the resource, to clean up after the handlers that no longer match),
        and of all their known sub-handlers (the parents know the ids of their sub-handlers of all depths).
        """
        keys: dict[HandlerId, None] = dict.fromkeys(self._states)  # an ordered set
        keys.update(dict.fromkeys(handler.id for handler in handlers))
        for state in self._states.values():
            keys.update(dict.fromkeys(state.subrefs))
        for key in keys:
            storage.purge(key=key, body=body, patch=patch)

    @property
    def done(self) -> bool:
        """Whether all the handlers are finished (successfully or not)."""
        # Not all() of a generator: this is done for every cycle, and a generator's steps are calls.
        for state in self._states.values():  # noqa: SIM110
            if not (state.success or state.failure):
                return False
        return True

    @property
    def has_subrefs(self) -> bool:
        """Whether any of the handlers has sub-handlers (known in this cycle or stored)."""
        for state in self._states.values():  # noqa: SIM110  # not any(): see `done`
            if state.subrefs:
                return True
        return False

    @property
    def counts(self) -> StateCounts:
        """How many handlers succeeded, failed for good, and are pending (for the logs)."""
        states = self._states.values()
        return StateCounts(
            success=sum(1 for state in states if state.success),
            failure=sum(1 for state in states if state.failure),
            pending=sum(1 for state in states if not state.finished),
        )

    @property
    def delays(self) -> list[float]:
        """For every unfinished handler, the seconds until it can be retried (0 for those due now)."""
        return [state.delay for state in self._states.values() if not state.finished]

    @property
    def delay(self) -> float | None:
        """The nearest of the delays: 0 if some handler is due now, None if all are finished."""
        delays = self.delays
        return min(delays) if delays else None

    def kwargs_for(self, handler: BaseHandler) -> dict[str, Any]:
        """The handler's kwargs about its retrying: ``retry``, ``started``, ``runtime``."""
        state = self._states.get(handler.id)
        if state is None:
            state = HandlerState.from_scratch(purpose=self._purpose)
        return handler_kwargs(state)


def handler_kwargs(state: HandlerState) -> dict[str, Any]:
    """The retrying-related kwargs of a handler from its state: ``retry``, ``started``, ``runtime``."""
    return {'retry': state.retries, 'started': state.started, 'runtime': state.runtime}



def _is_timestamp(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        datetime.datetime.fromisoformat(value)
    except ValueError:
        return value == ''  # "no time", as _parse_time() reads it
    return True


# What every known field of a progress record must be (unless null), and its name in the messages.
# Unknown fields are allowed (e.g. of other versions).
_RECORD_FIELDS: Mapping[str, tuple[Callable[[Any], bool], str]] = {
    'started': (_is_timestamp, 'a timestamp in the ISO 8601 format'),
    'stopped': (_is_timestamp, 'a timestamp in the ISO 8601 format'),
    'delayed': (_is_timestamp, 'a timestamp in the ISO 8601 format'),
    'purpose': (lambda value: isinstance(value, str), 'a string'),
    'retries': (lambda value: isinstance(value, int) and not isinstance(value, bool), 'an integer'),
    'success': (lambda value: isinstance(value, bool), 'true or false'),
    'failure': (lambda value: isinstance(value, bool), 'true or false'),
    'message': (lambda value: isinstance(value, str), 'a string'),
    'subrefs': (lambda value: isinstance(value, list) and all(isinstance(ref, str) for ref in value),
                'a list of strings'),
}


# The fields checked by their types on every fetch; the timestamps are checked by parsing them (once).
_PLAIN_FIELDS = {name: check for name, check in _RECORD_FIELDS.items()
                 if name not in {'started', 'stopped', 'delayed'}}


def _record_problem(record: Any) -> str | None:
    """What makes a fetched progress record unusable, in words; None if it is usable."""
    if not isinstance(record, Mapping):
        return f'it holds {describe_json(record)}'
    for name, (is_valid, expected) in _RECORD_FIELDS.items():
        value = record.get(name)
        if value is not None and not is_valid(value):
            return f'its field {name!r} is {shorten(json.dumps(value))} instead of {expected}'
    return None


def _fetch_state(*, storage: ProgressStorage, key: str, body: Body, logger: Logger) -> HandlerState | None:
    """
    The handler's state from its record; None if there is none or it is unreadable (which is then reported).

    The storages return what is stored as it is, as in Kopf: the records edited by hand, or written
    by other tools under the same names, are checked here. An unreadable record would otherwise fail
    the object's every handling cycle; ignored, it is overwritten as the handler goes on.
    The usual (valid) records are parsed once; the fields are examined one by one only to explain a failure.
    """
    record: Any  # whatever is stored, not necessarily a record
    try:
        record = storage.fetch(key=key, body=body)
    except json.JSONDecodeError as e:
        problem = f'it is not JSON ({e})'
    else:
        if record is None:
            return None
        if isinstance(record, Mapping) and all(
                is_valid(value)
                for name, (is_valid, _) in _PLAIN_FIELDS.items() if (value := record.get(name)) is not None):
            try:
                return HandlerState.from_record(record)
            except ValueError:  # malformed timestamps: explained below
                pass
        problem = _record_problem(record) or 'it cannot be read'
    where, stored = storage.locate(key=key, body=body) or ('The stored progress', None)
    quote = f': {excerpt(stored)}' if isinstance(stored, str) and not problem.startswith('its field') else ''
    logger.warning(f'{where} must hold the progress of the handler {key!r} as a JSON object, '
                   f'but {problem}{quote}. It is ignored: the handler starts anew.')
    return None


def fetch_diffbase(*, storage: DiffBaseStorage, body: Body, logger: Logger) -> BodyEssence | None:
    """
    The object's essence as last handled; None if it was never handled or if the record is unreadable.

    An unreadable diff-base (e.g. garbage in the annotation) is reported and treated as absent:
    the object is handled as a new one, and the diff-base is overwritten when that is done.
    Otherwise, the object would fail in every handling cycle and would never be handled at all.
    """
    essence: Any  # whatever is stored, not necessarily an essence
    try:
        essence = storage.fetch(body=body)
    except json.JSONDecodeError as e:
        problem = f'it is not JSON ({e})'
    except TypeError as e:  # e.g. not a string in the status, where a serialised essence is expected
        problem = str(e)
    else:
        if essence is None or type(essence) is dict or isinstance(essence, Mapping):
            return essence  # type: ignore[return-value]  # not cast(): it is a call, for every event
        problem = f'it holds {describe_json(essence)}'
    where, stored = storage.locate(body=body) or ('The stored diff-base', None)
    quote = f': {excerpt(stored)}' if isinstance(stored, str) else ''
    logger.warning(f"{where} must hold the object's essence as last handled (the diff-base) "
                   f'as a JSON object, but {problem}{quote}. '
                   f'It is ignored: the object is handled as a new one (by the creation handlers).')
    return None
