"""
What the operator remembers about every object it has seen, in memory only, for its lifetime.

Most of an object's state lives on the object itself (the progress of the handlers, the last
handled essence), so that it survives restarts. But some things are only for this very process:

* the per-object ``memo`` kwarg (a shallow copy of the operator's memo made at the first sight);
* whether the object was first seen in the initial listing (i.e. it existed before the operator
  started), and whether it has been fully handled since then: the resuming handlers are due
  only once per operator lifetime, and only for such objects;
* the resource version of our own latest patch and the time of it: until this version comes back
  via the watch-stream, the object's state is inconsistent (see :mod:`.versions`); and whether
  that version needs nothing from us, so that its echo is not processed at all;
* the place where the daemons & timers keep their per-object record (``spawns``, filled by their engine);
* while a handling cycle of several steps is in progress: which essence each finished handler was
  called with, so that the handlers done before a change in the middle of the cycle are called again
  with it (see :mod:`.reruns`). It is forgotten when the cycle ends, and lost on restarts: then,
  the handlers done before a restart are not called again in that cycle (as in Kopf).

There can be many thousands of idle objects, so a memory is a small slotted record with no tasks,
no locks, and no copies of the bodies. It is created on the first event of an object, and forgotten
when the object is deleted.
"""
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kopf._core.engines.spawns import ObjectSpawns
from kopf._core.intents.memos import make_object_memo
from kopf._core.reactor.versions import VersionBook

__all__ = ['ResourceMemories', 'ResourceMemory']


class ResourceMemory(VersionBook):
    """The in-memory state of one object (see the module's description; the versions: :mod:`.versions`)."""

    __slots__ = (
        'cycle_essences',
        'cycle_purpose',
        'fully_handled_once',
        'memo',
        'noticed_by_listing',
        'spawns',
    )

    memo: Any
    noticed_by_listing: bool  # seen first in the initial listing: it existed before the operator started
    fully_handled_once: bool  # a changing cycle has finished since then: no more resuming
    spawns: ObjectSpawns | None  # the daemons' & timers' per-object record, owned by their engine
    cycle_purpose: str | None  # the reason of the unfinished handling cycle that the essences belong to
    cycle_essences: dict[str, Any] | None  # by handler id: the essence of its last success in that cycle
                                           # (of its last call for the unfinished parents of sub-handlers)

    def __init__(self, *, memo: Any = None, noticed_by_listing: bool = False) -> None:
        super().__init__()
        self.memo = memo
        self.noticed_by_listing = noticed_by_listing
        self.fully_handled_once = False
        self.spawns = None
        self.cycle_purpose = None
        self.cycle_essences = None

    def __repr__(self) -> str:
        return (f'<{type(self).__name__} listed={self.noticed_by_listing} '
                f'handled={self.fully_handled_once} expected={self.expected_version!r}>')


def _key_of(raw_body: Mapping[str, Any]) -> str | tuple[str | None, ...]:
    # The uids are unique across all resources; the rest is for the rare bodies without uids
    # (e.g. in tests), where the api version and kind disambiguate the same names of different resources.
    meta = raw_body.get('metadata') or {}
    uid = meta.get('uid')
    if uid:
        return str(uid)
    return (raw_body.get('apiVersion'), raw_body.get('kind'), meta.get('namespace'), meta.get('name'))


class ResourceMemories:
    """
    The memories of all the objects of all the resources served by one operator.

    Embedded operators may create it and give it to :func:`kopf.operator` (``memories=``) to inspect
    what is remembered, e.g. in tests; by default, each operator makes its own.
    """

    def __init__(self) -> None:
        super().__init__()
        self._memories: dict[str | tuple[str | None, ...], ResourceMemory] = {}

    def __len__(self) -> int:
        return len(self._memories)

    def __iter__(self) -> Iterator[ResourceMemory]:
        return iter(list(self._memories.values()))

    def __contains__(self, raw_body: object) -> bool:
        return isinstance(raw_body, Mapping) and _key_of(raw_body) in self._memories

    def iter_all_memories(self) -> Iterator[ResourceMemory]:
        """All the memories at the moment (a snapshot: safe to forget some while iterating)."""
        return iter(self)

    def recall(
            self,
            raw_body: Mapping[str, Any],
            *,
            memo: object | None = None,
            noticed_by_listing: bool = False,
            ephemeral: bool = False,
    ) -> ResourceMemory:
        """
        The memory of the object; a new one if the object is seen for the first time.

        ``memo`` is the operator's memo, copied into the new memories only.
        ``noticed_by_listing`` is remembered only when the memory is created: an object is "old"
        only if it was seen in the very first listing since the operator has started.
        An ``ephemeral`` memory is not kept if it is new (e.g. for a deletion of an unknown object).
        """
        key = _key_of(raw_body)
        memory = self._memories.get(key)
        if memory is None:
            memory = ResourceMemory(memo=make_object_memo(memo), noticed_by_listing=noticed_by_listing)
            if not ephemeral:
                self._memories[key] = memory
        return memory

    def get(self, raw_body: Mapping[str, Any]) -> ResourceMemory | None:
        """The memory of the object if it is remembered (a new one is never made)."""
        return self._memories.get(_key_of(raw_body))

    def forget_uids(self, forgotten: Callable[[str], bool]) -> list[ResourceMemory]:
        """Forget the objects whose uids are such (e.g. given away to another replica); their memories."""
        keys = [key for key in self._memories if isinstance(key, str) and forgotten(key)]
        return [self._memories.pop(key) for key in keys]

    def forget(self, raw_body: Mapping[str, Any]) -> None:
        """Forget the object (e.g. when it is deleted); nothing happens if it is not remembered."""
        self._memories.pop(_key_of(raw_body), None)
