"""
Back-off sequences: the delays between retries, as the settings specify them.
"""
from collections.abc import Iterable, Iterator

__all__ = ['BackoffsSpec', 'iter_backoffs']

# A back-off specification: a single number, or a re-iterable collection of numbers (maybe infinite).
BackoffsSpec = float | Iterable[float]


def iter_backoffs(backoffs: BackoffsSpec | None) -> Iterator[float]:
    """Start a new sequence of delays from a number, a collection, or any re-iterable (maybe infinite)."""
    if backoffs is None:
        return iter(())
    if isinstance(backoffs, (int, float)):
        return iter((float(backoffs),))
    return iter(backoffs)
