"""
The patch formats of the Kubernetes API: JSON merge-patch, JSON-patch and strategic-merge-patch.

All functions here treat their inputs as immutable and return new structures that share every
unchanged branch with the original. Stored objects are never modified in place anywhere in the
emulator, so sharing is safe and saves the deep copies that would otherwise dominate a PATCH.
"""

from collections.abc import Mapping, Sequence
from typing import Any


class PatchFormatError(ValueError):
    """The patch document itself is malformed (the API answers 400 Bad Request)."""


class PatchApplicationError(ValueError):
    """The patch is well-formed but cannot be applied to this object (422 Unprocessable Entity)."""


# --------------------------------------------------------------------------------------------
# JSON merge-patch (RFC 7386).


def apply_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = apply_merge_patch(result.get(key), value)
        else:
            result[key] = value
    return result


# --------------------------------------------------------------------------------------------
# JSON-patch (RFC 6902) with JSON pointers (RFC 6901).


def parse_pointer(pointer: Any) -> list[str]:
    if not isinstance(pointer, str):
        raise PatchFormatError(f'a JSON pointer must be a string, got {pointer!r}')
    if pointer == '':
        return []
    if not pointer.startswith('/'):
        raise PatchApplicationError(f'a JSON pointer must start with "/": {pointer!r}')
    return [token.replace('~1', '/').replace('~0', '~') for token in pointer[1:].split('/')]


def _list_index(token: str, length: int, *, allow_end: bool, pointer: str) -> int:
    if allow_end and token == '-':
        return length
    if not token.isdigit() or (len(token) > 1 and token.startswith('0')):
        raise PatchApplicationError(f'invalid array index {token!r} in {pointer!r}')
    index = int(token)
    if index > length or (index == length and not allow_end):
        raise PatchApplicationError(f'array index {index} is out of bounds in {pointer!r}')
    return index


def _resolve(doc: Any, tokens: Sequence[str], pointer: str) -> Any:
    current = doc
    for token in tokens:
        if isinstance(current, dict):
            if token not in current:
                raise PatchApplicationError(f'path {pointer!r} does not exist')
            current = current[token]
        elif isinstance(current, list):
            current = current[_list_index(token, len(current), allow_end=False, pointer=pointer)]
        else:
            raise PatchApplicationError(f'path {pointer!r} does not exist')
    return current


def _with_change(node: Any, tokens: Sequence[str], op: str, value: Any, pointer: str) -> Any:
    """A copy of ``node`` with ``op`` applied at ``tokens``; only the containers on the path are copied."""
    token = tokens[0]
    if len(tokens) > 1:
        if isinstance(node, dict):
            if token not in node:
                raise PatchApplicationError(f'path {pointer!r} does not exist')
            copy = dict(node)
            copy[token] = _with_change(node[token], tokens[1:], op, value, pointer)
            return copy
        if isinstance(node, list):
            index = _list_index(token, len(node), allow_end=False, pointer=pointer)
            items = list(node)
            items[index] = _with_change(node[index], tokens[1:], op, value, pointer)
            return items
        raise PatchApplicationError(f'path {pointer!r} does not exist')

    if isinstance(node, dict):
        copy = dict(node)
        if op == 'add':
            copy[token] = value
        elif token not in node:
            raise PatchApplicationError(f'path {pointer!r} does not exist')
        elif op == 'remove':
            del copy[token]
        else:
            copy[token] = value
        return copy
    if isinstance(node, list):
        items = list(node)
        if op == 'add':
            items.insert(_list_index(token, len(node), allow_end=True, pointer=pointer), value)
        elif op == 'remove':
            del items[_list_index(token, len(node), allow_end=False, pointer=pointer)]
        else:
            items[_list_index(token, len(node), allow_end=False, pointer=pointer)] = value
        return items
    raise PatchApplicationError(f'path {pointer!r} does not exist')


def json_equal(a: Any, b: Any) -> bool:
    """Equality by JSON semantics: unlike Python's ``==``, ``true`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and bool(a == b)


def apply_json_patch(doc: Any, operations: Any) -> Any:
    """
    Apply a JSON-patch (RFC 6902).

    Like real API servers: what does not decode into a list of operations (of strings' fields) is a
    :class:`PatchFormatError` (400); an operation that is unknown, incomplete, or cannot be applied
    is a :class:`PatchApplicationError` (422), and nothing of the patch is applied then.
    """
    if not isinstance(operations, list):
        raise PatchFormatError('a JSON-patch must be a list of operations')
    for operation in operations:
        if not isinstance(operation, dict):
            raise PatchFormatError(f'a JSON-patch operation must be an object, got {operation!r}')
        for field in ('op', 'path', 'from'):
            if operation.get(field) is not None and not isinstance(operation[field], str):
                raise PatchFormatError(f'the "{field}" of a JSON-patch operation must be a string')
    for operation in operations:
        op = operation.get('op')
        if 'path' not in operation:
            raise PatchApplicationError(f'the JSON-patch operation {op!r} has no "path"')
        pointer = operation['path']
        tokens = parse_pointer(pointer)
        if op in ('add', 'replace', 'test') and 'value' not in operation:
            raise PatchApplicationError(f'the JSON-patch operation {op!r} at {pointer!r} has no "value"')
        match op:
            case 'add' | 'replace':
                value = operation['value']
                doc = value if not tokens else _with_change(doc, tokens, op, value, pointer)
            case 'remove':
                if not tokens:
                    raise PatchApplicationError('the root of the document cannot be removed')
                doc = _with_change(doc, tokens, 'remove', None, pointer)
            case 'test':
                actual = _resolve(doc, tokens, pointer)
                if not json_equal(actual, operation['value']):
                    raise PatchApplicationError(
                        f'testing value {pointer} failed: expected {operation["value"]!r}, found {actual!r}'
                    )
            case 'move' | 'copy':
                if 'from' not in operation:
                    raise PatchApplicationError(
                        f'the JSON-patch operation {op!r} at {pointer!r} has no "from"'
                    )
                source = operation['from']
                source_tokens = parse_pointer(source)
                value = _resolve(doc, source_tokens, source)
                if op == 'move':
                    if tokens[: len(source_tokens)] == source_tokens and len(tokens) > len(source_tokens):
                        raise PatchApplicationError(f'cannot move {source!r} into its own child {pointer!r}')
                    if tokens == source_tokens:
                        continue
                    if not source_tokens:
                        raise PatchApplicationError('the root of the document cannot be moved')
                    doc = _with_change(doc, source_tokens, 'remove', None, source)
                doc = value if not tokens else _with_change(doc, tokens, 'add', value, pointer)
            case _:
                raise PatchApplicationError(f'unexpected JSON-patch operation: {op!r}')
    return doc


# --------------------------------------------------------------------------------------------
# Strategic merge-patch.
#
# Real API servers take the list-merging strategies from the Go types of built-in resources.
# Here, a small table of the well-known list fields stands in for them: lists named in it are
# merged by their key; all other lists are replaced, as a JSON merge-patch would do.

_MERGE_KEYS: Mapping[str, tuple[str, ...]] = {
    'containers': ('name',),
    'initContainers': ('name',),
    'ephemeralContainers': ('name',),
    'env': ('name',),
    'volumes': ('name',),
    'volumeMounts': ('mountPath',),
    'volumeDevices': ('devicePath',),
    'ports': ('containerPort', 'port'),
    'imagePullSecrets': ('name',),
    'hostAliases': ('ip',),
    'topologySpreadConstraints': ('topologyKey',),
    'ownerReferences': ('uid',),
    'conditions': ('type',),
}
_MERGED_PRIMITIVE_LISTS = frozenset({'finalizers'})
_DIRECTIVE = '$patch'
_RETAIN_KEYS = '$retainKeys'
_SET_ELEMENT_ORDER = '$setElementOrder/'
_DELETE_FROM_PRIMITIVE_LIST = '$deleteFromPrimitiveList/'


class _Deleted:
    """A marker for ``$patch: delete`` of a whole map."""


_DELETED = _Deleted()


def apply_strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        raise PatchFormatError('a strategic merge patch must be an object')
    result = _merge_map(target if isinstance(target, dict) else {}, patch)
    return {} if result is _DELETED else result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: _strip_directives(item)
            for key, item in value.items()
            if key not in (_DIRECTIVE, _RETAIN_KEYS)
            and not key.startswith(('$setElementOrder/', '$deleteFromPrimitiveList/'))
        }
    if isinstance(value, list):
        return [_strip_directives(item) for item in value]
    return value


def _merge_map(target: Mapping[str, Any], patch: Mapping[str, Any]) -> Any:
    directive = patch.get(_DIRECTIVE)
    if directive == 'delete':
        return _DELETED
    if directive == 'replace':
        return _strip_directives(patch)
    if directive is not None and directive != 'merge':
        raise PatchFormatError(f'unknown patch type: {directive!r} in the strategic merge patch')

    result = dict(target)
    for key, value in patch.items():
        if key in (_DIRECTIVE, _RETAIN_KEYS) or key.startswith(_SET_ELEMENT_ORDER):
            continue
        if key.startswith(_DELETE_FROM_PRIMITIVE_LIST):
            field = key[len(_DELETE_FROM_PRIMITIVE_LIST) :]
            if not isinstance(value, list):
                raise PatchFormatError(f'invalid value for {key!r}: a list is expected')
            current = result.get(field)
            if isinstance(current, list):
                result[field] = [item for item in current if item not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(result[key] if isinstance(result.get(key), dict) else {}, value)
            if merged is _DELETED:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value

    retained = patch.get(_RETAIN_KEYS)
    if retained is not None:
        if not isinstance(retained, list):
            raise PatchFormatError(f'invalid value for {_RETAIN_KEYS!r}: a list is expected')
        result = {key: value for key, value in result.items() if key in retained}
    return result


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    if field in _MERGED_PRIMITIVE_LISTS:
        merged = list(current) if isinstance(current, list) else []
        for item in patch:
            if item not in merged:
                merged.append(item)
        return _server_order(merged, patch, current if isinstance(current, list) else [], lambda item: item)

    candidates = _MERGE_KEYS.get(field)
    if candidates is None or not all(isinstance(item, dict) for item in patch):
        return [_strip_directives(item) for item in patch]

    if any(item.get(_DIRECTIVE) == 'replace' for item in patch):
        return [_strip_directives(item) for item in patch if item.get(_DIRECTIVE) != 'replace']

    existing = [item for item in current if isinstance(item, dict)] if isinstance(current, list) else []
    merge_key = next(
        (
            key
            for key in candidates
            if any(key in item for item in [*patch, *existing] if isinstance(item, dict))
        ),
        candidates[0],
    )
    merged_items: list[Any] = list(existing)
    for item in patch:
        if merge_key not in item:
            raise PatchFormatError(f'the list item of {field!r} has no merge key {merge_key!r}')
        position = next(
            (
                index
                for index, old in enumerate(merged_items)
                if isinstance(old, dict) and old.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get(_DIRECTIVE) == 'delete':
            if position is not None:
                del merged_items[position]
            continue
        if position is None:
            merged_items.append(_strip_directives(item))
        else:
            merged = _merge_map(merged_items[position], item)
            if merged is _DELETED:
                del merged_items[position]
            else:
                merged_items[position] = merged
    return _server_order(merged_items, patch, existing, lambda item: item.get(merge_key))


def _server_order(merged: list[Any], patch: list[Any], current: list[Any], key: Any) -> list[Any]:
    """
    Order the merged list like real API servers do (``normalizeElementOrder`` of apimachinery).

    The items of the patch and the server-only items keep their relative orders, and are interleaved
    by their positions on the server where both are known there; else the patch's item comes first
    (so new items go before the server-only items that follow them, not at the end).
    """
    patched = [key(item) for item in patch if not (isinstance(item, dict) and _DIRECTIVE in item)]
    server = [key(item) for item in current]
    left = [item for item in merged if key(item) not in patched]  # server-only, in the server's order
    right = [item for item in merged if key(item) in patched]  # in the patch
    result: list[Any] = []
    while left and right:
        li = server.index(key(left[0])) if key(left[0]) in server else -1
        ri = server.index(key(right[0])) if key(right[0]) in server else -1
        result.append(left.pop(0) if li >= 0 and ri >= 0 and li < ri else right.pop(0))
    return [*result, *left, *right]
