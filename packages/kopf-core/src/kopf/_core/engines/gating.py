"""
The handling gate: whether the operator may handle the objects now, as decided by its coordinators.

Several coordinators can hold the operator back at once: the Kopf-compatible peering (one per peering
object, e.g. one per served namespace), the leader election with a Lease, ``kopf freeze`` (via the
peering). Each one gets its own :class:`GateBlocker` and turns it on and off; the gate is open only
while none of them blocks. The reactor obeys the gate: while it is closed, no watch-streams run
(so no object is processed) and the daemons & timers are paused; when it opens, the watch-streams
start anew (every object is listed as if new) and the daemons & timers are resumed.

The gate itself makes no API calls and knows nothing about who blocks it and why, except the names
(for the logs and the tests).
"""
import asyncio

__all__ = ['GateBlocker', 'HandlingGate']


class GateBlocker:
    """One reason for the operator to not handle the objects now; turned on & off by its coordinator."""

    def __init__(self, gate: 'HandlingGate', name: str, *, blocking: bool) -> None:
        super().__init__()
        self._gate = gate
        self.name = name
        self._blocking = blocking
        self._decided = False  # until its coordinator says anything: e.g. the peers are not seen yet

    def __repr__(self) -> str:
        return f'<GateBlocker {self.name!r}: {"blocking" if self._blocking else "not blocking"}>'

    @property
    def blocking(self) -> bool:
        return self._blocking

    @property
    def decided(self) -> bool:
        """Whether the coordinator has decided (to block or not): the initial state is a guess."""
        return self._decided

    def block(self) -> None:
        self._set(True)

    def unblock(self) -> None:
        self._set(False)

    def discard(self) -> None:
        """Forget this blocker for good (e.g. its coordinator has exited): it never blocks again."""
        self._set(False)
        self._gate._blockers.discard(self)

    def _set(self, value: bool) -> None:
        if self._blocking != value or not self._decided:
            self._blocking = value
            self._decided = True
            self._gate._notify()


class HandlingGate:
    """Open while none of its blockers blocks (see the module's description)."""

    def __init__(self) -> None:
        super().__init__()
        self._blockers: set[GateBlocker] = set()
        self._changed = asyncio.Event()
        self.generation = 0  # incremented on every change: to notice the changes missed while busy

    def __repr__(self) -> str:
        return f'<HandlingGate: {"open" if self.is_open else "closed by " + ", ".join(self.blocked_by)}>'

    @property
    def is_open(self) -> bool:
        return not any(blocker.blocking for blocker in self._blockers)

    @property
    def decided(self) -> bool:
        """Whether all the coordinators have decided at least once (e.g. for the operator's readiness)."""
        return all(blocker.decided for blocker in self._blockers)

    @property
    def blocked_by(self) -> list[str]:
        """The names of the blockers that keep the gate closed now (sorted, for stable logs)."""
        return sorted(blocker.name for blocker in self._blockers if blocker.blocking)

    def blocker(self, name: str, *, blocking: bool = True) -> GateBlocker:
        """
        A new blocker of this gate, blocking from the start by default: the coordinator has not decided yet.
        """
        blocker = GateBlocker(self, name, blocking=blocking)
        self._blockers.add(blocker)
        if blocking:
            self._notify()
        return blocker

    async def wait_for_change(self, *, since: int | None = None) -> None:
        """
        Wait until any blocker changes (the gate might or might not change its state).

        With ``since`` (a :attr:`generation` seen before), return at once if anything has changed since then.
        """
        if since is not None and since != self.generation:
            return
        await self._changed.wait()

    async def wait_open(self) -> None:
        while not self.is_open:
            await self.wait_for_change()

    async def wait_closed(self) -> None:
        while self.is_open:
            await self.wait_for_change()

    def _notify(self) -> None:
        # Wake up everyone who waits for the current change, and start a new "generation" of waiters.
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()
