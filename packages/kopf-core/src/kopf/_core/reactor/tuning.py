"""
Tuning the process while operators run in it: the garbage collector (``settings.process.gc_threshold``).

The garbage collector is the process's, not the operator's: several operators can run in one process
(e.g. in threads), so they share the tuning: the first one to start saves the process's own thresholds,
the last one to exit restores them (unless someone else has changed them meanwhile).
"""
import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ['tuned_gc']

# The garbage collector is the process's: the operators running in it (e.g. in several threads)
# tune it while any of them runs, and the last one to exit restores the process's own thresholds.
_gc_lock = threading.Lock()
_gc_users = 0
_gc_saved: tuple[int, int, int] | None = None  # the process's own thresholds, to restore
_gc_tuned: tuple[int, int, int] | None = None  # ours, to see if someone has changed them meanwhile


@contextlib.contextmanager
def tuned_gc(threshold: int | None) -> Iterator[None]:
    """Raise the threshold of the youngest GC generation while in the context (see ``settings.process``)."""
    global _gc_users, _gc_saved, _gc_tuned
    if threshold is None:
        yield
        return
    with _gc_lock:
        current = gc.get_threshold()
        if _gc_users == 0:
            _gc_saved, _gc_tuned = current, None
        _gc_users += 1
        if threshold > current[0]:
            gc.set_threshold(threshold, *current[1:])
            _gc_tuned = gc.get_threshold()
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0:
                if _gc_saved is not None and _gc_tuned is not None and gc.get_threshold() == _gc_tuned:
                    gc.set_threshold(*_gc_saved)
                _gc_saved = _gc_tuned = None
