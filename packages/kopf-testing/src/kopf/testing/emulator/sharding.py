"""
The server-side sharded lists & watches (KEP-5866, alpha in Kubernetes 1.36+, the feature gate
``ShardedListAndWatch``), as kube-apiserver v1.37.2 does them (probed; see ``tests/kubeapi``):

* ``?shardSelector=shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')``
  on a list or a watch keeps only the objects whose 64-bit FNV-1a hash of the field (the UTF-8 bytes of
  the string; ``''`` if absent) is in ``[start, end)``: the start is inclusive, the end exclusive.
  The fields: ``object.metadata.uid`` or ``object.metadata.namespace``.
* The bounds are string literals (``'`` or ``"``): ``0x`` and exactly 16 lowercase hex digits, or
  ``'0x10000000000000000'`` (2**64, the end of the last range); the start must be less than the end.
* Several ranges are joined with ``||`` (all of the same field; parentheses and spaces are allowed).
* A list says what it has applied in ``metadata.shardInfo.selector``: the ranges in the given order,
  each as ``shardRange(FIELD, 'START', 'END')``, joined with `` || `` (nothing merged or sorted);
  but only for the built-in resources: the lists of custom resources are filtered, without the echo.
* An invalid selector fails the list or the watch with HTTP 500 (a Status with no reason):
  ``invalid shard selector: ...``. An empty one means none. A GET of one object ignores it.
* Without the feature gate, the parameter is ignored silently (even if invalid), with no echo.
* Also seen: the continuation tokens of the pages do not keep the selector (every page applies its own
  request's one); the bookmarks (incl. the end of the initial events) carry nothing about it; a selector
  of 100 ranges is served, one of 1000 is too long a URL (the connection is dropped): no limit here.
"""

import dataclasses
import re
from typing import Any

from kopf.testing.emulator import errors

FEATURE_GATE = 'ShardedListAndWatch'
FIELDS = ('object.metadata.uid', 'object.metadata.namespace')
END_OF_HASHES = 1 << 64

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1

_TOKENS = re.compile(
    r"""\s*(?:
        (?P<string>'[^'\\]*'|"[^"\\]*")
      | (?P<number>\d+(?:\.\d+)?u?)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op>\|\||&&|[().,!])
    )""",
    re.VERBOSE,
)
_LITERAL_TYPES = {'true': 'bool', 'false': 'bool', 'null': 'null_type'}


def fnv1a_64(text: str) -> int:
    value = _FNV_OFFSET
    for byte in text.encode('utf-8'):
        value = ((value ^ byte) * _FNV_PRIME) & _MASK
    return value


@dataclasses.dataclass(frozen=True)
class ShardSelector:
    field: str  # one of FIELDS
    ranges: tuple[tuple[int, int], ...]  # [start, end) of the hashes

    def render(self) -> str:
        """The selector as real servers echo it: canonical, in the given order of the ranges."""
        return ' || '.join(f"shardRange({self.field}, '{_hex(start)}', '{_hex(end)}')"
                           for start, end in self.ranges)

    def matches(self, body: dict[str, Any]) -> bool:
        metadata = body.get('metadata') or {}
        key = 'uid' if self.field == 'object.metadata.uid' else 'namespace'
        value = fnv1a_64(str(metadata.get(key) or ''))
        return any(start <= value < end for start, end in self.ranges)


def _hex(value: int) -> str:
    return f'0x{value:016x}'


class _Invalid(Exception):
    pass


def parse_shard_selector(text: str) -> ShardSelector | None:
    """The selector of a request (None if empty); :class:`~.errors.ApiError` 500 if invalid."""
    if not text.strip():
        return None
    try:
        tree = _Parser(text).parse()
        calls: list[Any] = []
        _flatten(tree, calls)
        fields = []
        ranges = []
        for call in calls:
            field, start, end = _shard_range(call)
            fields.append(field)
            ranges.append((start, end))
        for field in fields[1:]:
            if field != fields[0]:
                raise _Invalid(f'all shard ranges must use the same field, got "{fields[0]}" and "{field}"')
        return ShardSelector(field=fields[0], ranges=tuple(ranges))
    except _Invalid as e:
        raise errors.ApiError(500, f'invalid shard selector: {e}', reason='') from None


def _flatten(node: Any, calls: list[Any]) -> None:
    kind = node[0]
    if kind == 'call' and node[1] == '_||_':
        for argument in node[2]:
            _flatten(argument, calls)
    elif kind == 'call' and node[1] == 'shardRange':
        calls.append(node)
    elif kind == 'call':
        raise _Invalid(f'unsupported function "{node[1]}"; only shardRange() and || are allowed')
    else:
        raise _Invalid(f'unexpected expression kind {_kind(node)}; expected shardRange() call or || operator')


def _kind(node: Any) -> int:
    """The numbers of cel-go's expression kinds, as real servers mention them."""
    return {'call': 1, 'ident': 3, 'literal': 5, 'select': 7}[node[0]]


def _shard_range(call: Any) -> tuple[str, int, int]:
    arguments = call[2]
    if len(arguments) != 3:
        raise _Invalid(f'shardRange() requires exactly 3 arguments, got {len(arguments)}')
    path = _path(arguments[0])
    if path is None:
        raise _Invalid(f'shardRange() first argument: expected field path (e.g. object.metadata.uid), '
                       f'got expression kind {_kind(arguments[0])}')
    if path not in FIELDS:
        raise _Invalid(f'unsupported field path "{path}"; supported: {", ".join(FIELDS)}')
    start = _bound('hexStart', arguments[1])
    end = _bound('hexEnd', arguments[2])
    if start >= end:
        raise _Invalid(f'shard range start {_hex(start)} must be less than end {_hex(end)}')
    return path, start, end


def _path(node: Any) -> str | None:
    if node[0] == 'ident':
        return str(node[1])
    if node[0] == 'select':
        prefix = _path(node[1])
        return f'{prefix}.{node[2]}' if prefix is not None else None
    return None


def _bound(name: str, node: Any) -> int:
    if node[0] != 'literal' or node[1] != 'string':
        type_name = node[1] if node[0] == 'literal' else f'expression kind {_kind(node)}'
        raise _Invalid(f'{name} must be a string literal, got {type_name}')
    text: str = node[2]
    if not text.startswith('0x'):
        raise _Invalid(f"{name} must have '0x' prefix, got \"{text}\"")
    digits = text[2:]
    if not digits:
        raise _Invalid(f"{name}: hex value is required after '0x'")
    for char in digits:
        if char not in '0123456789abcdef':
            raise _Invalid(f'{name}: invalid hex character "{char}" in "{text}"')
    if len(digits) > 17:
        raise _Invalid(f'{name}: hex value too long ({len(digits)} chars, max 17): "{digits}"')
    if len(digits) == 17:
        if int(digits, 16) != END_OF_HASHES:
            raise _Invalid(f"{name}: 17-digit hex value must be '0x10000000000000000' (2^64), got \"{text}\"")
        return END_OF_HASHES
    if len(digits) != 16:
        raise _Invalid(f'{name} must be a 0x-prefixed 16-digit hex value, got "{text}" '
                       f'(did you mean "{_hex(int(digits, 16))}"?)')
    return int(digits, 16)


class _Parser:
    """The little of CEL that shard selectors use: calls, field paths, literals, ``||``, ``&&``, ``!``."""

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        position = 0
        while position < len(text):
            if not text[position:].strip():
                break
            match = _TOKENS.match(text, position)
            if match is None or not match.group(match.lastgroup or ''):
                raise _Invalid(f"CEL parse error: Syntax error: token recognition error at: "
                               f"'{text[position:].strip()[:1]}'")
            kind = match.lastgroup or ''
            self.tokens.append((kind, match.group(kind)))
            position = match.end()
        self.index = 0

    def parse(self) -> Any:
        node = self._or()
        if self.index < len(self.tokens):
            raise _Invalid(f"CEL parse error: Syntax error: extraneous input '{self.tokens[self.index][1]}' "
                           f"expecting <EOF>")
        return node

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def _take(self, value: str) -> None:
        token = self._peek()
        if token is None or token[1] != value:
            found = "'<EOF>'" if token is None else f"'{token[1]}'"
            raise _Invalid(f"CEL parse error: Syntax error: missing '{value}' at {found}")
        self.index += 1

    def _or(self) -> Any:
        operands = [self._and()]
        while (token := self._peek()) is not None and token[1] == '||':
            self.index += 1
            operands.append(self._and())
        return operands[0] if len(operands) == 1 else ('call', '_||_', operands)

    def _and(self) -> Any:
        operands = [self._unary()]
        while (token := self._peek()) is not None and token[1] == '&&':
            self.index += 1
            operands.append(self._unary())
        return operands[0] if len(operands) == 1 else ('call', '_&&_', operands)

    def _unary(self) -> Any:
        token = self._peek()
        if token is not None and token[1] == '!':
            self.index += 1
            return ('call', '!_', [self._unary()])
        return self._member()

    def _member(self) -> Any:
        node = self._primary()
        while (token := self._peek()) is not None and token[1] == '.':
            self.index += 1
            name = self._peek()
            if name is None or name[0] != 'ident':
                raise _Invalid("CEL parse error: Syntax error: no viable alternative at input '.'")
            self.index += 1
            node = ('select', node, name[1])
        return node

    def _primary(self) -> Any:
        token = self._peek()
        if token is None:
            raise _Invalid("CEL parse error: Syntax error: mismatched input '<EOF>' expecting an expression")
        kind, value = token
        self.index += 1
        if value == '(':
            node = self._or()
            self._take(')')
            return node
        if kind == 'string':
            return ('literal', 'string', value[1:-1])
        if kind == 'number':
            type_name = 'uint64' if value.endswith('u') else 'double' if '.' in value else 'int64'
            return ('literal', type_name, value)
        if kind == 'ident' and value in _LITERAL_TYPES:
            return ('literal', _LITERAL_TYPES[value], value)
        if kind == 'ident':
            following = self._peek()
            if following is not None and following[1] == '(':
                self.index += 1
                return ('call', value, self._arguments())
            return ('ident', value)
        raise _Invalid(f"CEL parse error: Syntax error: extraneous input '{value}'")

    def _arguments(self) -> list[Any]:
        arguments: list[Any] = []
        token = self._peek()
        if token is not None and token[1] == ')':
            self.index += 1
            return arguments
        while True:
            arguments.append(self._or())
            token = self._peek()
            if token is not None and token[1] == ',':
                self.index += 1
                continue
            self._take(')')
            return arguments

