"""
The structural schemas of CRDs applied to custom objects, as real API servers apply them.

For every creation and update of a custom object (incl. patches and the status subresource), with the
``openAPIV3Schema`` of the version in the request's URL:

* **Pruning**: the fields that the schema does not declare are dropped (unless under
  ``x-kubernetes-preserve-unknown-fields: true``; ``apiVersion``, ``kind``, ``metadata`` are kept at
  the root and in ``x-kubernetes-embedded-resource`` objects). They are reported as ``Warning``
  headers (``unknown field "spec.x"``), or fail the request with 400 with ``fieldValidation=Strict``,
  or go silently with ``fieldValidation=Ignore``. Nulls of non-nullable fields are dropped silently.
* **Defaulting**: the absent fields with a ``default`` get it, top-down (a defaulted object gets its
  own fields' defaults), in the objects that exist (a parent is not created for its child's default).
* **Validation**: types (incl. ``nullable``, ``x-kubernetes-int-or-string``), ``required``, ``enum``,
  the limits of numbers, strings, arrays and objects, ``pattern``, a few formats (``date-time``,
  ``date``, ``int32``, ``int64``), ``allOf``/``anyOf``/``oneOf``/``not``; with the real servers'
  wording, as 422 with all the causes. On updates, unchanged values are not re-validated (the
  validation ratcheting of Kubernetes 1.33+): an object stored under an older schema stays updatable.
  The strings' ``maxLength``, ``minLength``, ``pattern``: the first one failed only, as real servers.
* **Unique lists** (``x-kubernetes-list-type: set``, and ``map`` by its ``x-kubernetes-list-map-keys``):
  each repeated value once, where it is first repeated (``Duplicate value: {"type":"Ready"}``); on
  updates, not checked at all if the old object had repeated values already (as real servers).
* **CEL rules** (``x-kubernetes-validations``: ``rule``, ``message``, ``messageExpression``,
  ``fieldPath``, ``reason``; the transition rules with ``oldSelf`` on updates only, in the items of map
  lists and the entries of maps correlated with the old ones by their keys), evaluated by
  ``cel-python`` (the ``kopf-testing[cel]`` extra) if installed, else not checked (said once in the
  log). Only after no "blocking" problem (a wrong type, a missing field, an unsupported value, too
  long, too many: then the cause "some validation rules were not checked" instead), as real servers.
  Besides the standard CEL, Kubernetes' own libraries (strings, lists, regexes, URLs, quantities, IPs
  and CIDRs, semantic versions: ``celfunctions.py``). A rule that cel-python cannot evaluate (e.g. the
  optional types' ``self.?x``, ``format``, a function of no library here) is not checked: its objects
  pass it, and the log says so once per rule.

Not done (the emulator's known differences): the ratcheting of the CEL rules' problems in the
reordered items of map lists (by position here, by key in real servers), the CEL rules' cost limits
(the schemas themselves are checked when a CRD is created or updated: ``schemachecks.py``; ``metadata``
is pruned to ObjectMeta's fields for all kinds: ``validation.prune_metadata``), and the re-pruning of
the stored objects when a CRD's schema changes.
"""

import datetime
import functools
import itertools
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from kopf.testing.emulator.errors import Cause
from kopf.testing.emulator.validation import go_value

FIELD_VALIDATION_MODES = ('', 'Ignore', 'Strict', 'Warn')

_DROPPED: Any = object()  # a field that pruning removes

_ROOT_FIELDS = frozenset({'apiVersion', 'kind', 'metadata'})
_COMBINATIONS = frozenset({'allOf', 'anyOf', 'oneOf', 'not'})
_INT32 = (-2**31, 2**31 - 1)
_INT64 = (-2**63, 2**63 - 1)

# The keys of schemas that do nothing to the objects: such schemas are not walked at all.
_INERT_KEYS = frozenset({'type', 'description', 'title', 'example', 'externalDocs',
                         'x-kubernetes-preserve-unknown-fields'})

Path = tuple[str | int | tuple[str], ...]  # a field, a list's index, a map's key (``[key]`` in CEL's causes)


def effective(schema: Any) -> Mapping[str, Any] | None:
    """The schema if it does anything to the objects; ``None`` for "an object with anything in it"."""
    if not isinstance(schema, dict):
        return None
    if schema.keys() <= _INERT_KEYS and schema.get('x-kubernetes-preserve-unknown-fields') is True:
        return None
    return schema


# ----------------------------------------------------------------------------------------------------
# Pruning and defaulting: one walk, copying only what it changes (the stored objects share their parts).

def prune_and_default(body: dict[str, Any], schema: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The object pruned and defaulted by the schema, and the paths of the unknown fields (sorted)."""
    unknown: list[str] = []
    result = _walk(body, schema, '', unknown, root=True)
    return result, sorted(unknown)


def _walk(value: Any, schema: Mapping[str, Any], path: str, unknown: list[str], *, root: bool = False) -> Any:
    if schema.get('x-kubernetes-int-or-string'):
        return _integral(value)
    if isinstance(value, dict):
        return _walk_object(value, schema, path, unknown, root=root)
    if isinstance(value, list):
        items = schema.get('items')
        if not isinstance(items, dict):
            return value
        walked = [_walk(item, items, f'{path}[{index}]', unknown) for index, item in enumerate(value)]
        return value if all(a is b for a, b in zip(walked, value, strict=True)) else walked
    if schema.get('type') in ('integer', 'number'):
        return _integral(value)
    return value


def _walk_object(value: dict[str, Any], schema: Mapping[str, Any], path: str, unknown: list[str],
                 *, root: bool) -> dict[str, Any]:
    properties = schema.get('properties')
    properties = properties if isinstance(properties, dict) else {}
    additional = schema.get('additionalProperties')
    preserve = schema.get('x-kubernetes-preserve-unknown-fields') is True or additional is True
    kept = _ROOT_FIELDS if root or schema.get('x-kubernetes-embedded-resource') else frozenset()
    result: dict[str, Any] | None = None  # a copy, made at the first change
    for index, (key, item) in enumerate(value.items()):
        subschema = properties.get(key)
        if subschema is None and isinstance(additional, dict):
            subschema = additional
        if isinstance(subschema, dict):
            if item is None and not subschema.get('nullable'):
                new: Any = _DROPPED  # like real servers: before defaulting, silently
            else:
                new = _walk(item, subschema, f'{path}.{key}' if path else key, unknown)
        elif key in kept or preserve:
            new = item
        else:
            unknown.append(f'{path}.{key}' if path else key)
            new = _DROPPED
        if new is not item and result is None:
            result = dict(itertools.islice(value.items(), index))
        if result is not None and new is not _DROPPED:
            result[key] = new
    for key, subschema in properties.items():
        if isinstance(subschema, dict) and 'default' in subschema and key not in (
            value if result is None else result
        ):
            result = dict(value) if result is None else result
            result[key] = _walk(json.loads(json.dumps(subschema['default'])), subschema,
                                f'{path}.{key}' if path else key, [])
    return value if result is None else result


def _integral(value: Any) -> Any:
    """Like real servers: a JSON number with an integral value (``2.0``) is an integer (``2``)."""
    if isinstance(value, float) and value.is_integer() and _INT64[0] <= value <= _INT64[1]:
        return int(value)
    return value


# ----------------------------------------------------------------------------------------------------
# Validation.

def validate(body: Mapping[str, Any], schema: Mapping[str, Any], *,
             old: Mapping[str, Any] | None = None, subtree: str | None = None) -> list[Cause]:
    """
    The problems of the object by the schema, worded as real API servers word them.

    With ``old``, the problems of the values that have not changed are not reported (ratcheting; for
    ``required``, the value is the object that lacks the field).
    With ``subtree`` (e.g. ``status`` for the status subresource), only that field is validated, and
    the messages name the fields relative to it, as real servers do (``phase in body ...``).
    """
    problems: list[tuple[Path, Cause]] = []
    checked: tuple[Any, Mapping[str, Any], Path] | None = None  # what the lists and rules are checked in
    if subtree is None:
        _validate_object_fields(body, schema, (), problems, root=True)
        checked = (body, schema, ())
    else:
        properties = schema.get('properties')
        subschema = properties.get(subtree) if isinstance(properties, dict) else None
        if isinstance(subschema, dict) and subtree in body:
            _validate(body[subtree], subschema, (subtree,), problems, relative_to=1)
            checked = (body[subtree], subschema, (subtree,))
    if old is not None:
        problems = [(path, cause) for path, cause in problems if not _unchanged(body, old, path)]
    if checked is None:
        return [cause for _, cause in problems]
    value, subschema, path = checked
    old_value = _ABSENT if old is None else old if subtree is None else old.get(subtree, _ABSENT)
    traits = _traits(subschema)
    if traits.lists:  # like real servers: not at all in an update of an object that had duplicates already
        duplicates: list[tuple[Path, Cause]] = []
        _find_duplicates(value, subschema, path, duplicates)
        if duplicates and old_value is not _ABSENT:
            had: list[tuple[Path, Cause]] = []
            _find_duplicates(old_value, subschema, path, had)
            duplicates = [] if had else duplicates
        problems.extend(duplicates)
    if traits.rules:
        if any(cause.reason in _BLOCKING for _, cause in problems):  # like real servers: it is said
            problems.append(((), _SKIPPED_RULES))
        else:
            ruled: list[tuple[Path, Cause]] = []
            _check_rules(value, subschema, path, ruled, old=old_value)
            if old is not None:
                ruled = [(path, cause) for path, cause in ruled if not _unchanged(body, old, path)]
            problems.extend(ruled)
    return [cause for _, cause in problems]


def validate_value(value: Any, schema: Mapping[str, Any]) -> list[Cause]:
    """The problems of a value by its schema (e.g. a default's), its fields named relative to it."""
    problems: list[tuple[Path, Cause]] = []
    _validate(value, schema, (), problems)
    return [cause for _, cause in problems]


def _unchanged(new: Any, old: Any, path: Path) -> bool:
    """Whether the value at the path is the same in both objects (``required``: the object with the field)."""
    for step in path:
        if isinstance(step, int):
            if not isinstance(new, list) or not isinstance(old, list) or step >= min(len(new), len(old)):
                return False
            new, old = new[step], old[step]
            continue
        key = step[0] if isinstance(step, tuple) else step
        if not (isinstance(new, dict) and isinstance(old, dict) and key in new and key in old):
            return False
        new, old = new[key], old[key]
    return bool(new == old) and type(new) is type(old)


@functools.lru_cache(maxsize=4096)
def _field(path: Path) -> str:
    text = ''
    for step in path:
        if isinstance(step, int | tuple):
            text += f'[{step if isinstance(step, int) else step[0]}]'
        else:
            text += f'.{step}' if text else step
    return text


def _json_type(value: Any) -> str:
    if value is None:
        return 'null'
    if isinstance(value, bool):
        return 'boolean'
    if isinstance(value, int):
        return 'integer'
    if isinstance(value, float):
        return 'number'
    if isinstance(value, str):
        return 'string'
    if isinstance(value, list):
        return 'array'
    return 'object'


def _validate(value: Any, schema: Mapping[str, Any], path: Path,
              problems: list[tuple[Path, Cause]], relative_to: int = 0) -> None:
    field = _field(path)
    name = _field(path[relative_to:]) or field  # the name in "... in body ..." (relative for subresources)

    def problem(message: str, reason: str = 'FieldValueInvalid', at: str | None = None) -> None:
        problems.append((path, Cause(field if at is None else at, message, reason)))

    def type_problem(expected: str) -> None:
        actual = _json_type(value)
        problem(f'Invalid value: "{actual}": {name} in body must be of type {expected}: "{actual}"',
                'FieldValueTypeInvalid')
        if expected == 'integer' and actual == 'number':
            problem(f'Invalid value: "": Checked value must be of type integer (default format) in {name}',
                    at='<nil>')

    if value is None and (schema.get('nullable') or not _declares_type(schema)):
        return
    if schema.get('x-kubernetes-int-or-string'):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            type_problem('integer,string')
            return
    else:
        expected = schema.get('type')
        if isinstance(expected, str) and expected and not _is_of_type(value, expected):
            type_problem(expected)
            return

    enum = schema.get('enum')
    if isinstance(enum, list) and not any(_json_equal(value, option) for option in enum):
        supported = ', '.join(go_value(option) for option in enum)
        problem(f'Unsupported value: {go_value(value)}: supported values: {supported}',
                'FieldValueNotSupported')

    if isinstance(value, str):
        _validate_string(value, schema, name, problem)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _validate_number(value, schema, name, problem)
    elif isinstance(value, list):
        min_items, max_items = schema.get('minItems'), schema.get('maxItems')
        if isinstance(min_items, int) and len(value) < min_items:
            problem(f'Invalid value: {len(value)}: {name} in body should have at least {min_items} items')
        if isinstance(max_items, int) and len(value) > max_items:
            problem(f'Too many: {len(value)}: must have at most {_items(max_items)}', 'FieldValueTooMany')
        items = schema.get('items')
        if isinstance(items, dict):
            for index, item in enumerate(value):
                _validate(item, items, (*path, index), problems, relative_to)
    elif isinstance(value, dict):
        if isinstance(schema.get('minProperties'), int) and len(value) < schema['minProperties']:
            problem(f'Invalid value: {len(value)}: {name} in body should have at least '
                    f'{schema["minProperties"]} properties')
        if isinstance(schema.get('maxProperties'), int) and len(value) > schema['maxProperties']:
            problem(f'Too many: {len(value)}: must have at most {_items(schema["maxProperties"])}',
                    'FieldValueTooMany')
        _validate_object_fields(value, schema, path, problems, relative_to=relative_to)

    if not _COMBINATIONS.isdisjoint(schema):
        _validate_combinations(value, schema, path, name, problems, relative_to)


def _items(count: int) -> str:
    return '1 item' if count == 1 else f'{count} items'


def _validate_object_fields(value: Mapping[str, Any], schema: Mapping[str, Any], path: Path,
                            problems: list[tuple[Path, Cause]], *, relative_to: int = 0,
                            root: bool = False) -> None:
    properties = schema.get('properties')
    properties = properties if isinstance(properties, dict) else {}
    additional = schema.get('additionalProperties')
    for key, item in value.items():
        if root and key in _ROOT_FIELDS:
            continue
        subschema = properties.get(key, additional)
        if isinstance(subschema, dict):
            _validate(item, subschema, (*path, key), problems, relative_to)
    required = schema.get('required')
    for key in required if isinstance(required, list) else ():
        if isinstance(key, str) and key not in value:
            problems.append((path, Cause(_field((*path, key)), 'Required value', 'FieldValueRequired')))


def _validate_string(value: str, schema: Mapping[str, Any], name: str, problem: Any) -> None:
    max_length, min_length = schema.get('maxLength'), schema.get('minLength')
    pattern = schema.get('pattern')
    if isinstance(max_length, int) and len(value) > max_length:  # like real servers: the first of these only
        problem(f'Too long: may not be more than {max_length} bytes', 'FieldValueTooLong')
    elif isinstance(min_length, int) and len(value) < min_length:
        problem(f'Invalid value: {go_value(value)}: {name} in body should be at least {min_length} '
                'chars long')
    elif isinstance(pattern, str) and not _matches(pattern, value):
        problem(f"Invalid value: {go_value(value)}: {name} in body should match '{pattern}'")
    fmt = schema.get('format')
    if fmt in _STRING_FORMATS and not _STRING_FORMATS[fmt](value):
        problem(f'Invalid value: {go_value(value)}: {name} in body must be of type {fmt}: {go_value(value)}',
                'FieldValueTypeInvalid')


def _matches(pattern: str, value: str) -> bool:
    try:
        return re.search(pattern, value) is not None
    except re.error:
        return True  # not a pattern that Python knows: not checked


def _validate_number(value: float, schema: Mapping[str, Any], name: str, problem: Any) -> None:
    minimum, maximum, factor = schema.get('minimum'), schema.get('maximum'), schema.get('multipleOf')
    shown = go_value(value)
    where = f'Invalid value: {shown}: {name} in body'
    if isinstance(factor, (int, float)) and not isinstance(factor, bool):
        if isinstance(value, int) and isinstance(factor, float):
            factor = int(factor)  # like real servers: an integer's factor is truncated (0.5 becomes 0)
        if factor <= 0:
            problem(f'Invalid value: {shown}: factor MultipleOf declared for {name} must be positive: '
                    f'{go_value(factor)}')
        elif not _is_multiple(value, factor):
            problem(f'{where} should be a multiple of {go_value(factor)}')
    if isinstance(minimum, (int, float)) and not isinstance(minimum, bool):
        if schema.get('exclusiveMinimum') is True and value <= minimum:
            problem(f'{where} should be greater than {go_value(minimum)}')
        elif value < minimum:
            problem(f'{where} should be greater than or equal to {go_value(minimum)}')
    if isinstance(maximum, (int, float)) and not isinstance(maximum, bool):
        if schema.get('exclusiveMaximum') is True and value >= maximum:
            problem(f'{where} should be less than {go_value(maximum)}')
        elif value > maximum:
            problem(f'{where} should be less than or equal to {go_value(maximum)}')
    fmt = schema.get('format')
    limits = _INT32 if fmt == 'int32' else _INT64 if fmt == 'int64' else None
    if limits is not None and isinstance(value, int) and not limits[0] <= value <= limits[1]:
        problem(f'Invalid value: "": Checked value must be of type integer with format {fmt} in {name}',
                at='<nil>')


def _validate_combinations(value: Any, schema: Mapping[str, Any], path: Path, name: str,
                           problems: list[tuple[Path, Cause]], relative_to: int) -> None:
    def failed(text: str) -> None:
        problems.append((path, Cause('<nil>', f'Invalid value: "": "{name}" {text}')))

    def outcome(subschema: Any) -> list[tuple[Path, Cause]]:
        found: list[tuple[Path, Cause]] = []
        if isinstance(subschema, dict):
            _validate(value, subschema, path, found, relative_to)
        return found

    for subschema in _schemas(schema.get('allOf')):
        problems.extend(outcome(subschema))
    any_of = _schemas(schema.get('anyOf'))
    if any_of:
        outcomes = [outcome(subschema) for subschema in any_of]
        if all(outcomes):
            failed('must validate at least one schema (anyOf)')
            problems.extend(outcomes[0])
    one_of = _schemas(schema.get('oneOf'))
    if one_of:
        outcomes = [outcome(subschema) for subschema in one_of]
        if sum(1 for found in outcomes if not found) != 1:
            failed('must validate one and only one schema (oneOf)')
    negated = schema.get('not')
    if isinstance(negated, dict) and not outcome(negated):
        failed('must not validate the schema (not)')


def _schemas(value: Any) -> Sequence[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _declares_type(schema: Mapping[str, Any]) -> bool:
    return bool(schema.get('type')) or bool(schema.get('x-kubernetes-int-or-string'))


def _is_of_type(value: Any, expected: str) -> bool:
    actual = _json_type(value)
    if expected == 'number':
        return actual in ('integer', 'number')
    if expected == 'integer' and actual == 'number':
        return bool(value.is_integer())  # 2.0 is an integer (real servers decode it as one)
    return actual == expected


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _is_multiple(value: float, factor: float) -> bool:
    quotient = value / factor
    return abs(quotient - round(quotient)) < 1e-9


def _is_date_time(value: str) -> bool:
    try:
        datetime.datetime.fromisoformat(value.replace('Z', '+00:00').replace('z', '+00:00'))
    except ValueError:
        return False
    return 'T' in value.upper() or ' ' in value


def _is_date(value: str) -> bool:
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


_STRING_FORMATS = {'date-time': _is_date_time, 'date': _is_date}


logger = logging.getLogger(__name__)
_ABSENT: Any = object()  # no old value (a creation, or a field that is new)
_REASON_PREFIXES = {'FieldValueForbidden': 'Forbidden', 'FieldValueRequired': 'Required value',
                    'FieldValueDuplicate': 'Duplicate value'}


_SKIPPED_RULES = Cause('<nil>', 'Invalid value: null: some validation rules were not checked because the '
                                'object was invalid; correct the existing errors to complete validation')
# The kinds of problems after which real servers check no CEL rules (their "blocking" errors).
_BLOCKING = frozenset({'FieldValueTypeInvalid', 'FieldValueNotSupported', 'FieldValueRequired',
                       'FieldValueTooLong', 'FieldValueTooMany'})


class _Traits(NamedTuple):
    """What a schema has anywhere in it, besides the plain validation (remembered per schema)."""
    rules: bool  # CEL rules (x-kubernetes-validations)
    lists: bool  # lists of unique items (x-kubernetes-list-type: set or map)


_TRAITS: dict[int, tuple[Mapping[str, Any], _Traits]] = {}  # by id, the schema kept (no reuse of ids)


def _traits(schema: Mapping[str, Any]) -> _Traits:
    """The schema's traits (remembered: the schemas of CRDs are never changed, but replaced)."""
    remembered = _TRAITS.get(id(schema))
    if remembered is None or remembered[0] is not schema:
        if len(_TRAITS) >= 1024:
            _TRAITS.clear()
        remembered = _TRAITS[id(schema)] = (schema, _Traits(_finds(schema, _ruled), _finds(schema, _unique)))
    return remembered[1]


def _ruled(schema: Mapping[str, Any]) -> bool:
    return bool(schema.get('x-kubernetes-validations'))


def _unique(schema: Mapping[str, Any]) -> bool:
    return schema.get('x-kubernetes-list-type') in ('set', 'map')


def _finds(schema: Any, predicate: Callable[[Mapping[str, Any]], bool]) -> bool:
    if not isinstance(schema, dict):
        return False
    if predicate(schema):
        return True
    properties = schema.get('properties')
    children = [*(properties.values() if isinstance(properties, dict) else ()),
                schema.get('additionalProperties'), schema.get('items')]
    return any(_finds(child, predicate) for child in children)


# ----------------------------------------------------------------------------------------------------
# The lists of unique items (x-kubernetes-list-type: set, or map by its x-kubernetes-list-map-keys).

def _find_duplicates(value: Any, schema: Mapping[str, Any], path: Path,
                     problems: list[tuple[Path, Cause]]) -> None:
    """The repeated items of the sets and maps (each repeated value once, where it is first repeated)."""
    if isinstance(value, list):
        list_type = schema.get('x-kubernetes-list-type')
        keys = schema.get('x-kubernetes-list-map-keys')
        keys = [key for key in keys if isinstance(key, str)] if isinstance(keys, list) else None
        if list_type == 'set' or (list_type == 'map' and keys is not None):
            seen: set[str] = set()
            reported: set[str] = set()
            for index, item in enumerate(value):
                if list_type == 'map':
                    if not isinstance(item, dict):
                        continue
                    item = {key: item[key] for key in keys or () if key in item}
                text = json.dumps(item, sort_keys=True, separators=(',', ':'))
                if text in seen and text not in reported:
                    reported.add(text)
                    shown = go_value(item) if not isinstance(item, dict) else text
                    at = (*path, index)
                    cause = Cause(_field(at), f'Duplicate value: {shown}', 'FieldValueDuplicate')
                    problems.append((at, cause))
                seen.add(text)
        items = schema.get('items')
        if isinstance(items, dict) and _traits(items).lists:
            for index, item in enumerate(value):
                _find_duplicates(item, items, (*path, index), problems)
    elif isinstance(value, dict):
        for key, item, subschema, _ in _fields(value, schema, path):
            if _traits(subschema).lists:
                _find_duplicates(item, subschema, (*path, key), problems)


def _fields(value: Mapping[str, Any], schema: Mapping[str, Any],
            path: Path) -> Iterator[tuple[str, Any, Mapping[str, Any], bool]]:
    """An object's fields with their schemas, and whether each is a property (or an entry of a map)."""
    properties = schema.get('properties')
    properties = properties if isinstance(properties, dict) else {}
    additional = schema.get('additionalProperties')
    for key, item in value.items():
        subschema = properties.get(key, additional)
        if isinstance(subschema, dict) and (path or key not in _ROOT_FIELDS):
            yield key, item, subschema, key in properties


# ----------------------------------------------------------------------------------------------------
# CEL rules (x-kubernetes-validations), if cel-python is installed.

@functools.cache
def _cel() -> Any:
    try:
        import celpy
    except ImportError:
        logger.warning('The CEL rules of CRDs (x-kubernetes-validations) are not checked: cel-python is not '
                       'installed. To check them as real servers do, install kopf-testing[cel].')
        return None
    return celpy


_CELPY_TEXTS = {  # cel-python's words for what Kubernetes' libraries say otherwise
    'Attempt to reduce an empty sequence or a sequence with a None value': 'min called on empty list',
}


class _Unsupported(Exception):
    """A rule that the emulator cannot evaluate (see ``_check_rule``)."""


@functools.lru_cache(maxsize=1024)
def _program(expression: str) -> Any:
    celpy = _cel()
    from kopf.testing.emulator import celfunctions
    environment = celpy.Environment()
    try:
        return environment.program(environment.compile(expression), functions=celfunctions.FUNCTIONS)
    except Exception as e:  # e.g. the optional types' syntax (``self.?x``), unknown to cel-python
        raise _Unsupported(f'{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}') from None


@functools.cache
def _not_checked(expression: str, reason: str) -> None:
    """Say once per rule that it is not checked (its objects pass it), and why."""
    logger.warning('The CEL rule %r is not checked by the emulator (its objects pass it as if valid): %s. '
                   'Test it on a real API server.', expression, reason)


def _check_rules(value: Any, schema: Mapping[str, Any], path: Path, problems: list[tuple[Path, Cause]],
                 *, old: Any) -> None:
    """The CEL rules of the value and of everything in it, as real servers check them (after the schema)."""
    expected = schema.get('type')
    if value is not None and isinstance(expected, str) and expected and not _is_of_type(value, expected):
        return  # a problem of the schema already: its rules are not evaluated
    rules = schema.get('x-kubernetes-validations')
    celpy = _cel() if isinstance(rules, list) and rules and value is not None else None
    if celpy is not None and isinstance(rules, list):
        activation = {'self': celpy.json_to_cel(value)}  # once for all the node's rules
        if old is not _ABSENT:
            activation['oldSelf'] = celpy.json_to_cel(old)
        for rule in rules:
            if isinstance(rule, dict) and isinstance(rule.get('rule'), str):
                cause = _check_rule(value, rule, path, activation)
                if cause is not None:
                    problems.append((path, cause))
    if isinstance(value, dict):
        for key, item, subschema, declared in _fields(value, schema, path):
            if _traits(subschema).rules:
                old_item = old.get(key, _ABSENT) if isinstance(old, dict) else _ABSENT
                step: str | tuple[str] = key if declared else (key,)  # a map's key: "[key]"
                _check_rules(item, subschema, (*path, step), problems, old=old_item)
    elif isinstance(value, list) and isinstance(schema.get('items'), dict) and _traits(schema['items']).rules:
        olds = _correlated(old, schema)
        for index, item in enumerate(value):
            old_item = olds.get(_map_key(item, schema), _ABSENT) if olds else _ABSENT
            _check_rules(item, schema['items'], (*path, index), problems, old=old_item)


def _correlated(old: Any, schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """The old items of a map list by their keys (only these are correlated with the new ones)."""
    if schema.get('x-kubernetes-list-type') != 'map' or not isinstance(old, list):
        return None
    return {_map_key(item, schema): item for item in old if isinstance(item, dict)}


def _map_key(item: Any, schema: Mapping[str, Any]) -> str:
    keys = schema.get('x-kubernetes-list-map-keys')
    if not isinstance(item, dict) or not isinstance(keys, list):
        return ''
    return json.dumps([item.get(key) for key in keys])


def _check_rule(value: Any, rule: Mapping[str, Any], path: Path, activation: dict[str, Any]) -> Cause | None:
    celpy = _cel()
    expression: str = rule['rule']
    if 'oldSelf' not in activation and re.search(r'\boldSelf\b', expression):
        return None  # the transition rules are for updates only
    field = _field(path)
    message = rule.get('message') if isinstance(rule.get('message'), str) else None
    try:
        result = _program(expression).evaluate(activation)
    except _Unsupported as e:
        _not_checked(expression, str(e))
        return None
    except celpy.CELEvalError as e:
        text = str(e.args[0]) if e.args else str(e)
        if text.startswith('undeclared reference to '):  # a function of no library here
            _not_checked(expression, text.split(' (in activation', 1)[0])
            return None
        text = re.sub(r"^no such member in mapping: '(.*)'$", r'no such key: \1', text)
        text = _CELPY_TEXTS.get(text, text)
        return Cause(field, f'Invalid value: "{_json_type(value)}": {text} evaluating rule: '
                            f'{message or expression}')
    except Exception as e:  # cel-python's own failures (e.g. the two-variable comprehensions)
        _not_checked(expression, f'{type(e).__name__}: {e}')
        return None
    if result is True or (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
        return None
    if isinstance(rule.get('messageExpression'), str):
        try:
            message = str(_program(rule['messageExpression']).evaluate(activation))
        except Exception:
            pass  # like real servers: the static message (or the rule) instead
    message = message or f'failed rule: {expression}'
    if isinstance(rule.get('fieldPath'), str) and rule['fieldPath']:
        field += rule['fieldPath']
    reason = str(rule.get('reason') or 'FieldValueInvalid')
    if reason in _REASON_PREFIXES:
        return Cause(field, f'{_REASON_PREFIXES[reason]}: {message}', reason)
    shown = f'{go_value(value)}: ' if not isinstance(value, (dict, list)) else ''
    return Cause(field, f'Invalid value: {shown}{message}', reason)
