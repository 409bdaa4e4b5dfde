"""
Timers: a function called regularly per object and handler (``@kopf.timer``), while the object matches.

There is no task per timer: one scheduler per operator keeps the deadlines of all the timers
of all the objects in a heap, and asks the event loop to wake it up at the nearest one only
(a single ``loop.call_at()`` handle at any time). A task exists only while a timer's function runs.
So an idle timer costs a small slotted record and a heap entry; thousands of objects with timers
cost no tasks and no sleeping coroutines.

The schedule of a timer of an object:

* the first call is due right when the object is seen (created, or listed at the operator's start),
  or ``initial_delay`` seconds later (a number, or a callback of the handler's kwargs);
* after a successful call, the next one is due in ``interval`` seconds since the end of the call
  (of the function itself: applying its patch and result to the object is not counted, so the API's
  latency does not stretch the intervals), or since its start if ``sharp`` (i.e. the interval minus
  the duration of the call);
* with ``idle``, no call is made until the object stays unchanged for that long (every change of the
  object, including by the timer's own patches & results, resets the idle time); with ``idle`` and
  no ``interval``, the timer is called once per such quiet period; with neither, it is called once
  per object (as in Kopf; the decorator warns at load);
* a failed call is retried per the usual error handling: after the ``backoff`` (arbitrary errors),
  or the :class:`kopf.TemporaryError`'s delay; the ``retry``/``started``/``runtime`` kwargs count
  the attempts since the last success; a failure for good (:class:`kopf.PermanentError`, the retries
  or the timeout exceeded) stops the timer for that object.

The calls in the framework's own hands are limited (``settings.background.timer_seats``): a call is in
the hands from its start until its function is called, and from the function's end until the call is over
(applying the patch: also while it is in flight, but not during its retries' backoffs), and also while its
function runs for less than ``settings.execution.lending_delay`` (the usual quick functions). The timers due
beyond the limit wait in line and start as the earlier calls leave the hands. E.g. 10,000 timers due at once
(all objects listed at the start, with the same initial delay) do not make 10,000 tasks all waiting for the
API at once --- only as many as the API can serve soon. (So, unlike the processing's seats, the hands are not
lent while a patch is in flight: they would bound nothing then. In a backoff, they are: the timers whose
patches fail, e.g. by a webhook rejecting some objects, do not stop the others' timers.)
The slow functions are not limited: they leave the hands while they run, and are back at once when they end.
The hands are a :class:`kopf._cogs.aiokits.capacity.Capacity`, as the processing's seats are.

The calls of one timer for one object never overlap: the next one is scheduled when the previous
one ends. After every call, the timer's ``patch`` and its result (into the status, under the handler's
id) are applied to the object; the transformation functions that fail because the object has changed
meanwhile are carried over to the next call.
"""
import asyncio
import functools
import heapq
import itertools
import math
from collections.abc import Mapping
from typing import Any

from kopf._clients.vault import Vault
from kopf._cogs.aiokits import capacity
from kopf._cogs.helpers import metering
from kopf._cogs.structs.patches import Patch
from kopf._core.actions import loggers
from kopf._core.actions.progression import HandlerState, handler_kwargs
from kopf._core.engines.spawns import ObjectSpawns, Timer, execute_and_apply, initial_delay_of
from kopf._core.intents.causes import ResourceSpawningCause
from kopf._core.intents.configuration import BackgroundSettings, OperatorSettings
from kopf._core.intents.handlers import TimerHandler

__all__ = ['MAX_CALLS_IN_HANDS', 'Timer', 'Timers']  # Timer: the record is in .spawns, kept here too

# How many timer calls can be in the framework's own hands at once by default (see the module's description):
# the operators take ``settings.background.timer_seats``.
MAX_CALLS_IN_HANDS: int = BackgroundSettings.timer_seats

# The deadlines this close to the wake-up time are due at it (the loop's clock is not infinitely precise).
_CLOCK_SLACK = 0.001

# The heap is cleaned of the outdated entries when they are this many more than the valid ones.
_COMPACTION_THRESHOLD = 1000


class Timers:
    """The scheduler of all the timers of one operator (see the module's description)."""

    def __init__(self, *, settings: OperatorSettings, vault: Vault, indices: Mapping[str, Any]) -> None:
        super().__init__()
        self.settings = settings
        self.vault = vault
        self.indices = indices
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()  # for the equal deadlines: the timers themselves are not comparable
        self._scheduled = 0  # how many timers have a valid entry in the heap
        self._wakeup: asyncio.TimerHandle | None = None
        self._wakeup_at = math.inf
        self._tasks: set[asyncio.Task[None]] = set()
        # The calls in the framework's own hands; the due timers beyond them wait in line there (no tasks).
        self._hands: capacity.Capacity[Timer] = capacity.Capacity(
            settings.background.timer_seats, lending_delay=settings.execution.lending_delay,
            lending_in_flight=False,  # the hands bound the calls waiting for the API: see the module's docs
            on_granted=self._start_in_turn)
        self._closed = False

    @property
    def scheduled(self) -> int:
        """How many timers wait for their deadlines (or for their turn once due) now."""
        return self._scheduled + self._hands.waiting

    @property
    def running(self) -> int:
        """How many timers' functions run now."""
        return len(self._tasks)

    def start(self, spawns: ObjectSpawns, handler: TimerHandler, *, since: float | None = None) -> Timer:
        """
        Start a timer for the object (the caller ensures there is none of this handler already).

        The first call is due ``initial_delay`` after ``since`` (when the object became visible or matching;
        now if not known), or at once if that moment has passed already.
        """
        timer = Timer(handler=handler, spawns=spawns)
        spawns.timers[handler.id] = timer
        delay = 0.0
        if handler.initial_delay is not None:
            logger = loggers.LocalObjectLogger(body=spawns.body, settings=self.settings)
            delay = initial_delay_of(handler, lambda: self._kwargs_for(timer), logger)
        now = asyncio.get_running_loop().time()
        self._schedule(timer, (min(since, now) if since is not None else now) + delay)
        return timer

    def stop(self, timer: Timer) -> None:
        """Stop the timer: no more calls; a call in progress is not interrupted, but waited for."""
        timer.stopped = True
        self._unschedule(timer)
        if timer.task is None and timer.spawns.timers.get(timer.handler.id) is timer:
            del timer.spawns.timers[timer.handler.id]

    def notice_change(self, spawns: ObjectSpawns) -> None:
        """The object has changed: the idle-only timers that have served their quiet period get a new one."""
        for timer in spawns.timers.values():
            if timer.idle_mark is not None and spawns.changed_at > timer.idle_mark:
                self._wait_for_quiet_period(timer)

    async def stop_all(self) -> None:
        """Stop the scheduling for good, cancel the calls in progress, and wait until they exit."""
        self._closed = True
        if self._wakeup is not None:
            self._wakeup.cancel()
            self._wakeup = None
        self._hands.close()  # the waiting timers are not started, the running functions not lent out
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._heap.clear()
        self._scheduled = 0

    #
    # The scheduling.
    #

    def _schedule(self, timer: Timer, due: float) -> None:
        if self._closed or timer.stopped or timer.finished:
            return
        if timer.due is None:
            self._scheduled += 1
        timer.due = due  # an older entry of the timer (if any) becomes outdated and is skipped later
        heapq.heappush(self._heap, (due, next(self._order), timer))
        if len(self._heap) > 2 * self._scheduled + _COMPACTION_THRESHOLD:
            self._heap = [entry for entry in self._heap if entry[2].due == entry[0]]
            heapq.heapify(self._heap)
        self._arm()

    def _unschedule(self, timer: Timer) -> None:
        if timer.due is not None:
            timer.due = None
            self._scheduled -= 1

    def _arm(self) -> None:
        """Make the loop wake the scheduler up at the nearest deadline (and only then)."""
        if self._closed or not self._heap:
            return
        earliest = self._heap[0][0]
        if self._wakeup is not None and self._wakeup_at <= earliest:
            return
        if self._wakeup is not None:
            self._wakeup.cancel()
        self._wakeup = asyncio.get_running_loop().call_at(earliest, self._wake_up)
        self._wakeup_at = earliest

    def _wake_up(self) -> None:
        """Start the calls of the timers that are due (a callback of the loop, not a task)."""
        self._wakeup = None
        self._wakeup_at = math.inf
        loop = asyncio.get_running_loop()
        now = loop.time() + _CLOCK_SLACK
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, _, timer = heapq.heappop(heap)
            if timer.due != due or timer.task is not None:
                continue  # an outdated entry: the timer is stopped or rescheduled since then
            self._unschedule(timer)
            timer.last_due = due
            idle = timer.handler.idle
            quiet_since = timer.spawns.changed_at
            if idle is not None and quiet_since + idle > now:
                self._schedule(timer, quiet_since + idle)  # the object has changed meanwhile
                continue
            if self._hands.take_or_queue(timer):  # else, started by _start_in_turn() when there is room
                self._start(timer)
        self._arm()

    def _start(self, timer: Timer) -> None:
        """Start a call of the timer, with its place in the hands taken already."""
        hold = capacity.Hold(self._hands, True)  # taken
        task = asyncio.create_task(self._run(timer, hold))  # not named: naming costs more than the call
        task.add_done_callback(functools.partial(self._finished, timer, hold))
        timer.task = task
        self._tasks.add(task)

    def _start_in_turn(self, timer: Timer) -> bool:
        """Start a due timer that has waited in line for room in the hands; False if it is not due anymore."""
        if timer.stopped or timer.finished or timer.task is not None or timer.due is not None:
            return False  # stopped, or rescheduled (e.g. for its quiet period) while waiting in line
        self._start(timer)
        return True

    def _finished(self, timer: Timer, hold: capacity.Hold, task: asyncio.Task[None]) -> None:
        # Normally, the call cleans up after itself; but a task cancelled before it starts runs no code.
        self._tasks.discard(task)
        hold.leave()  # a lending still due (e.g. cancelled in the function) finds the hands left: no-op
        if timer.task is task:
            timer.task = None
            if timer.stopped and timer.spawns.timers.get(timer.handler.id) is timer:
                del timer.spawns.timers[timer.handler.id]
            timer.spawns.notify()

    def _wait_for_quiet_period(self, timer: Timer) -> None:
        """For the idle-only timers: the next call is due once the object stays unchanged long enough."""
        timer.idle_mark = None
        if timer.task is None and timer.due is None:
            self._schedule(timer, timer.spawns.changed_at + (timer.handler.idle or 0))

    #
    # The calls.
    #

    def _kwargs_for(self, timer: Timer) -> dict[str, Any]:
        state = timer.state if timer.state is not None else HandlerState.from_scratch()
        cause = self._make_cause(timer, Patch(body=timer.spawns.body),
                                 loggers.LocalObjectLogger(body=timer.spawns.body, settings=self.settings))
        return {**handler_kwargs(state), **cause.kwargs_for(timer.handler)}

    def _make_cause(self, timer: Timer, patch: Patch, logger: loggers.ObjectLogger) -> ResourceSpawningCause:
        spawns = timer.spawns
        return ResourceSpawningCause(resource=spawns.resource, body=spawns.transient_body(), patch=patch,
                                     logger=logger, memo=spawns.memo, indices=self.indices)

    async def _run(self, timer: Timer, hold: capacity.Hold) -> None:
        """One call of the timer's function (with its patch), then the scheduling of the next one."""
        handler, spawns = timer.handler, timer.spawns
        loop = asyncio.get_running_loop()
        started = loop.time()
        changed_at = spawns.changed_at
        logger = loggers.ObjectLogger(body=spawns.body, settings=self.settings)
        state = timer.state if timer.state is not None else HandlerState.from_scratch()
        patch = Patch(body=spawns.body)
        if timer.fns:
            patch.fns.extend(timer.fns)
            timer.fns = None
        cause = self._make_cause(timer, patch, logger)
        meters = metering.meters
        if meters is not None:
            _measure_tick(meters, timer, started)

        final = failed = False
        delay: float | None = None
        ended: list[float] = []  # when the function is over (its patch and result are applied after that)
        try:
            def called() -> None:
                ended.append(loop.time())
                hold.take_back()  # back to the framework's own steps after a long function: no waiting

            # While the function runs for long, the call leaves the hands to others (see the module's docs).
            outcome = await execute_and_apply(settings=self.settings, vault=self.vault, handler=handler,
                                              cause=cause, state=state, logger=logger,
                                              calling=hold.lend_later, called=called, spawns=spawns,
                                              seat=hold)
            final, failed, delay = outcome.final, outcome.exception is not None, outcome.delay
            if not final:
                state = state.with_outcome(outcome)  # only the retries need the state (it is reset otherwise)
        except Exception as e:  # not the function's failures (they are outcomes), but the framework's
            logger.exception(f'Timer {handler.id!r} has failed unexpectedly: {e}')
            backoff = handler.backoff
            delay = backoff if backoff is not None else self.settings.execution.default_backoff
        finally:
            timer.task = None
            timer.fns = list(patch.fns) if patch.fns else None
            if timer.stopped and spawns.timers.get(handler.id) is timer:
                del spawns.timers[handler.id]
            spawns.notify()

        if final and failed:
            timer.finished = True
            timer.state = None
            logger.debug(f'Timer {handler.id!r} has failed for good and will not be called for this object.')
        elif not final:
            timer.state = state
            self._schedule(timer, loop.time() + (delay or 0))
        else:
            timer.state = None
            interval = handler.interval
            if interval is None and handler.idle is None:
                timer.finished = True  # neither interval= nor idle=: called once per object, as in Kopf
            elif interval is None:
                timer.idle_mark = changed_at  # until the object changes and stays quiet again
                if spawns.changed_at > changed_at:  # it has changed during the call
                    self._wait_for_quiet_period(timer)
            elif handler.sharp:
                now = loop.time()
                if meters is not None and now - started >= 2 * interval:  # the call has outlasted its ticks
                    _measure_missed(meters, timer, int((now - started) // interval) - 1)
                self._schedule(timer, max(started + interval, now))
            else:
                # The interval is between the calls: the API's latency of applying the results is not in it.
                self._schedule(timer, (ended[0] if ended else loop.time()) + interval)


def _measure_tick(meters: metering.Meters, timer: Timer, started: float) -> None:
    """Count the timer's call, its lateness after its deadline, the ticks missed by it (whole intervals)."""
    resource = timer.spawns.resource
    name = f'{resource.plural}.{resource.group}' if resource.group else resource.plural
    handler_label = meters.capped('handler', str(timer.handler.id))
    meters.child(meters.timer_ticks, name, handler_label).inc()
    if timer.last_due is not None:
        lateness = max(0.0, started - timer.last_due)
        meters.child(meters.timer_lateness, name).observe(lateness)
        interval = timer.handler.interval
        if interval and lateness >= interval:
            _measure_missed(meters, timer, int(lateness // interval))


def _measure_missed(meters: metering.Meters, timer: Timer, ticks: int) -> None:
    """Count the ticks missed: a sharp timer's call longer than its interval, or a late start."""
    resource = timer.spawns.resource
    name = f'{resource.plural}.{resource.group}' if resource.group else resource.plural
    meters.child(meters.timer_missed_ticks, name, meters.capped('handler', str(timer.handler.id))).inc(ticks)
