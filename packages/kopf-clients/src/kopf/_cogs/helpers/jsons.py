"""
JSON for the API traffic: every watch-event, every request and every response goes through it.

``orjson`` is used when installed (a dependency of kopf-clients): it parses the objects several times
faster than the standard library, encodes the patches an order of magnitude faster, and the objects it
parses share their keys (the same dozens of field names in every object), so the objects kept in memory
cost less (the figures: benchmarks/README.md, the orjson paragraph of ``core_handling.py``'s section).
What it cannot do is left to the standard library, so the results are the same either way:
integers beyond 64 bits (orjson reads them as floats, losing digits: a document with a run of 19+ digits
is parsed by the standard library; Kubernetes itself sends no such integers, its decoder makes them floats,
but the annotations and the admission reviews can hold any JSON), non-string keys, and the types the
standard library refuses to encode (datetimes, dataclasses: orjson would encode them, but then the same
patch would fail elsewhere).
"""
import json
from types import ModuleType
from typing import Any

_orjson: ModuleType | None
try:
    import orjson as _orjson
except ImportError:  # e.g. installed with --no-deps, or on a platform with no wheels of it
    _orjson = None

__all__ = ['ACCELERATED', 'dumps', 'loads']

# Whether the parsing is native (orjson): then, parsing a small document anew is cheaper than copying one.
ACCELERATED: bool = _orjson is not None

if _orjson is not None:
    _OPTIONS = _orjson.OPT_PASSTHROUGH_DATACLASS | _orjson.OPT_PASSTHROUGH_DATETIME


# Every digit as "0", everything else as "x": an integer beyond 64 bits has 19 digits at least (a cheap
# search in C: ~0.7 µs per 0.5 KB watch-event, a small part of its parsing and processing).
# A text is checked as its UTF-8 (the same digits: no byte of a multi-byte character is ASCII), since
# bytes are translated by a table several times faster than texts by a mapping (e.g. the diff-bases).
_DIGITS_MASK = bytes(48 if 48 <= code <= 57 else 120 for code in range(256))
_LONG_DIGITS = b'0' * 19


def _may_hold_big_integers(data: bytes | bytearray | str) -> bool:
    if len(data) < 19:
        return False
    if isinstance(data, str):
        data = data.encode('utf-8', 'surrogatepass')  # lone surrogates: orjson has refused them already
    return _LONG_DIGITS in data.translate(_DIGITS_MASK)


def loads(data: bytes | bytearray | str) -> Any:
    """Parse a JSON document (UTF-8 if bytes); ``ValueError`` if it is not one (or ``UnicodeDecodeError``)."""
    if _orjson is not None:
        try:
            parsed = _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # e.g. a number beyond the floats' range: the standard library reads it or explains it.
        else:
            if not _may_hold_big_integers(data):
                return parsed
    # The API speaks UTF-8 only: decoding it here skips json's detection of the encoding.
    return json.loads(data if isinstance(data, str) else data.decode('utf-8'))


def dumps(obj: Any) -> bytes:
    """Encode as compact UTF-8 JSON; a ``TypeError`` or ``ValueError`` if it cannot be (as ``json.dumps``)."""
    if _orjson is not None:
        try:
            encoded: bytes = _orjson.dumps(obj, option=_OPTIONS)
            return encoded
        except TypeError:
            pass  # e.g. non-string keys, which the standard library converts, or an unknown type.
    return json.dumps(obj, separators=(',', ':'), ensure_ascii=False).encode('utf-8')
