"""
Label and field selectors: the query-string syntax of LIST/WATCH and the structured ``LabelSelector``.

Label selectors support ``=``, ``==``, ``!=``, ``in``, ``notin``, existence (``key``),
non-existence (``!key``) and the numeric ``>``/``<``. Field selectors support ``=``, ``==``
and ``!=`` on dotted paths; which paths are allowed is decided by the resource.
"""

import dataclasses
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

from kopf.testing.emulator import validation

LabelOperator = Literal['=', '!=', 'in', 'notin', 'exists', '!exists', '>', '<']


class SelectorError(ValueError):
    """A selector that cannot be parsed; the message is meant for the API client."""


@dataclasses.dataclass(frozen=True)
class LabelRequirement:
    key: str
    operator: LabelOperator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, Any]) -> bool:
        present = self.key in labels
        match self.operator:
            case 'exists':
                return present
            case '!exists':
                return not present
            case '=' | 'in':
                return present and labels[self.key] in self.values
            case '!=' | 'notin':
                return not present or labels[self.key] not in self.values
            case '>' | '<':
                if not present:
                    return False
                try:
                    actual = int(labels[self.key])
                except (TypeError, ValueError):
                    return False
                (limit,) = (int(value) for value in self.values)
                return actual > limit if self.operator == '>' else actual < limit


LabelSelector = tuple[LabelRequirement, ...]

_SET_REQUIREMENT = re.compile(r'^\s*(?P<key>[^\s!=<>()]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$')
_EQUALITY_REQUIREMENT = re.compile(
    r'^\s*(?P<key>[^\s!=<>()]+)\s*(?P<op>==|=|!=|>|<)\s*(?P<value>[^\s!=<>(),]*)\s*$'
)
_EXISTENCE_REQUIREMENT = re.compile(r'^\s*(?P<neg>!?)\s*(?P<key>[^\s!=<>()]+)\s*$')


def _split_top_level(text: str) -> list[str]:
    """Split by commas that are not inside parentheses (``a in (x,y),b`` has two parts)."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == '(':
            depth += 1
        elif char == ')':
            depth -= 1
            if depth < 0:
                raise SelectorError(f'unable to parse requirement: unbalanced parentheses in {text!r}')
        if char == ',' and depth == 0:
            parts.append(''.join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise SelectorError(f'unable to parse requirement: unbalanced parentheses in {text!r}')
    parts.append(''.join(current))
    return parts


def _check_key(key: str) -> None:
    problems = validation.qualified_name_problems(key)
    if problems:
        raise SelectorError(f'unable to parse requirement: invalid label key "{key}": {"; ".join(problems)}')


def _check_value(value: str) -> None:
    problems = validation.label_value_problems(value)
    if problems:
        raise SelectorError(
            f'unable to parse requirement: invalid label value: "{value}": {"; ".join(problems)}'
        )


def parse_label_selector(text: str) -> LabelSelector:
    """Parse the ``labelSelector`` query parameter; an empty string selects everything."""
    if not text.strip():
        return ()
    requirements: list[LabelRequirement] = []
    for part in _split_top_level(text):
        if not part.strip():
            raise SelectorError(f'unable to parse requirement: found an empty requirement in {text!r}')
        if match := _SET_REQUIREMENT.match(part):
            key = match['key']
            values = (
                [value.strip() for value in match['values'].split(',')] if match['values'].strip() else []
            )
            if not values and match['op'] == 'in':
                raise SelectorError(
                    'unable to parse requirement: for "in" operator, values set can\'t be empty'
                )
            _check_key(key)
            for value in values:
                _check_value(value)
            operator: LabelOperator = 'in' if match['op'] == 'in' else 'notin'
            requirements.append(LabelRequirement(key, operator, frozenset(values)))
        elif match := _EQUALITY_REQUIREMENT.match(part):
            key, value = match['key'], match['value']
            _check_key(key)
            op = match['op']
            if op in ('>', '<'):
                if not re.fullmatch(r'-?\d+', value):
                    raise SelectorError(
                        f'unable to parse requirement: for "{op}" operator, '
                        f'the value must be an integer, got "{value}"'
                    )
                requirements.append(LabelRequirement(key, '>' if op == '>' else '<', frozenset([value])))
            else:
                _check_value(value)
                requirements.append(LabelRequirement(key, '!=' if op == '!=' else '=', frozenset([value])))
        elif match := _EXISTENCE_REQUIREMENT.match(part):
            key = match['key']
            _check_key(key)
            requirements.append(LabelRequirement(key, '!exists' if match['neg'] else 'exists'))
        else:
            raise SelectorError(f'unable to parse requirement: {part.strip()!r} is not a valid requirement')
    return tuple(requirements)


def labels_match(selector: LabelSelector, labels: Mapping[str, Any] | None) -> bool:
    if not selector:
        return True
    actual = labels if labels is not None else {}
    return all(requirement.matches(actual) for requirement in selector)


def label_selector_from_struct(struct: Any) -> LabelSelector | None:
    """
    Convert a structured ``LabelSelector`` (``matchLabels``/``matchExpressions``) to requirements.

    ``None`` means "matches nothing" (an invalid selector), the empty tuple means "matches everything".
    """
    if struct is None:
        return ()
    if not isinstance(struct, dict):
        return None
    requirements: list[LabelRequirement] = []
    match_labels = struct.get('matchLabels') or {}
    if not isinstance(match_labels, dict):
        return None
    for key, value in match_labels.items():
        requirements.append(LabelRequirement(str(key), '=', frozenset([str(value)])))
    expressions = struct.get('matchExpressions') or []
    if not isinstance(expressions, list):
        return None
    operators: dict[str, LabelOperator] = {
        'In': 'in',
        'NotIn': 'notin',
        'Exists': 'exists',
        'DoesNotExist': '!exists',
    }
    for expression in expressions:
        if not isinstance(expression, dict) or expression.get('operator') not in operators:
            return None
        values = expression.get('values') or []
        requirements.append(
            LabelRequirement(
                str(expression.get('key', '')),
                operators[expression['operator']],
                frozenset(str(value) for value in values),
            )
        )
    return tuple(requirements)


@dataclasses.dataclass(frozen=True)
class FieldRequirement:
    path: str
    negated: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        actual = field_value(obj, self.path)
        return (actual != self.value) if self.negated else (actual == self.value)


FieldSelector = tuple[FieldRequirement, ...]


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form of a dotted field, as field selectors compare them (absent fields are "")."""
    current: Any = obj
    for part in path.split('.'):
        if not isinstance(current, Mapping):
            return ''
        current = current.get(part)
    if current is None:
        return ''
    if isinstance(current, bool):
        return 'true' if current else 'false'
    return str(current)


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == '\\':
            escaped = True
        elif char == separator:
            parts.append(''.join(current))
            current = []
        else:
            current.append(char)
    parts.append(''.join(current))
    return parts


_FIELD_REQUIREMENT = re.compile(r'^(?P<path>[^=!]+?)\s*(?P<op>==|=|!=)\s*(?P<value>.*)$', re.DOTALL)


def parse_field_selector(text: str, allowed_paths: Collection[str]) -> FieldSelector:
    """Parse the ``fieldSelector`` query parameter, accepting only the fields the resource supports."""
    if not text.strip():
        return ()
    requirements: list[FieldRequirement] = []
    for part in _split_unescaped(text, ','):
        match = _FIELD_REQUIREMENT.match(part.strip())
        if not match:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        path = match['path'].strip()
        if path not in allowed_paths:
            raise SelectorError(
                f'"{path}" is not a known field selector: only '
                + ', '.join(f'"{allowed}"' for allowed in sorted(allowed_paths))
            )
        requirements.append(FieldRequirement(path, match['op'] == '!=', match['value'].strip()))
    return tuple(requirements)


def fields_match(selector: Sequence[FieldRequirement], obj: Mapping[str, Any]) -> bool:
    return all(requirement.matches(obj) for requirement in selector)
