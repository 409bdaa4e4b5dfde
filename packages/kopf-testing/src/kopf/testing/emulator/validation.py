"""
Validation of the object metadata that every Kubernetes API server enforces for all resources.

Only the generic rules are checked (names, labels, annotations, finalizers, owner references):
the emulator does not validate resource-specific schemas, so that operators can store any
custom object. The messages follow the wording of real API servers.
"""

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from kopf.testing.emulator.errors import Cause

NameRule = Literal['subdomain', 'label', 'dns1035', 'path-segment']

_DNS1123_LABEL = re.compile(r'[a-z0-9]([-a-z0-9]*[a-z0-9])?')
_DNS1123_SUBDOMAIN = re.compile(r'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')
_DNS1035_LABEL = re.compile(r'[a-z]([-a-z0-9]*[a-z0-9])?')
_QUALIFIED_NAME_PART = re.compile(r'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')
_LABEL_VALUE = re.compile(r'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')

_DNS1123_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_DNS1123_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', "
    r"regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_DNS1035_LABEL_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
    'start with an alphabetic character, and end with an alphanumeric character '
    "(e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
_QUALIFIED_NAME_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', "
    "regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', "
    "regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_MAX_ANNOTATIONS_SIZE = 256 * 1024


def go_value(value: Any) -> str:
    """A value as Go's validation messages print it: JSON, compact; a top-level number as Go formats it."""
    if isinstance(value, float) and not isinstance(value, bool):
        return repr(value) if not value.is_integer() else str(int(value))
    return json.dumps(value, separators=(',', ':'))


def _quote(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def name_problems(name: str, rule: NameRule) -> list[str]:
    """Explain why a name violates the naming rule of its resource (empty if it does not)."""
    if rule == 'path-segment':
        # Some resources only forbid what cannot be put into a URL path segment.
        if name in ('.', '..'):
            return [f'may not be {_quote(name)}']
        if '/' in name or '%' in name:
            return [f'may not contain {"/" if "/" in name else "%"}']
        return []
    if rule == 'subdomain':
        problems = [] if len(name) <= 253 else ['must be no more than 253 characters']
        if not _DNS1123_SUBDOMAIN.fullmatch(name):
            problems.append(_DNS1123_SUBDOMAIN_MESSAGE)
        return problems
    problems = [] if len(name) <= 63 else ['must be no more than 63 characters']
    pattern, message = (
        (_DNS1123_LABEL, _DNS1123_LABEL_MESSAGE)
        if rule == 'label'
        else (_DNS1035_LABEL, _DNS1035_LABEL_MESSAGE)
    )
    if not pattern.fullmatch(name):
        problems.append(message)
    return problems


def qualified_name_problems(key: str) -> list[str]:
    """Explain why a label/annotation key or a finalizer is not a valid qualified name."""
    prefix, slash, name = key.rpartition('/')
    problems: list[str] = []
    if slash:
        if not prefix:
            problems.append('prefix part must be non-empty')
        elif len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            problems.append(f'prefix part {_DNS1123_SUBDOMAIN_MESSAGE}')
    if not name:
        problems.append('name part must be non-empty')
    else:
        if len(name) > 63:
            problems.append('name part must be no more than 63 characters')
        if not _QUALIFIED_NAME_PART.fullmatch(name):
            problems.append(_QUALIFIED_NAME_MESSAGE)
    return problems


def label_value_problems(value: str) -> list[str]:
    problems = [] if len(value) <= 63 else ['must be no more than 63 characters']
    if not _LABEL_VALUE.fullmatch(value):
        problems.append(_LABEL_VALUE_MESSAGE)
    return problems


# The fields of ObjectMeta (and of its lists' items): the others are pruned, as real servers prune them.
_OBJECT_META = frozenset({
    'name', 'generateName', 'namespace', 'selfLink', 'uid', 'resourceVersion', 'generation',
    'creationTimestamp', 'deletionTimestamp', 'deletionGracePeriodSeconds', 'labels', 'annotations',
    'ownerReferences', 'finalizers', 'managedFields',
})
_META_ITEMS = {
    'ownerReferences': frozenset({'apiVersion', 'kind', 'name', 'uid', 'controller', 'blockOwnerDeletion'}),
    'managedFields': frozenset({'manager', 'operation', 'apiVersion', 'time', 'fieldsType', 'fieldsV1',
                                'subresource'}),
}

PLAIN_META = _OBJECT_META - _META_ITEMS.keys()  # the fields that need no look inside to be known as known


def prune_metadata(metadata: dict[str, Any], unknown: list[str]) -> dict[str, Any]:
    """The metadata with ObjectMeta's fields only (the same object if so); the others' paths added."""
    result: dict[str, Any] | None = None
    for key, value in metadata.items():
        if key not in _OBJECT_META:
            unknown.append(f'metadata.{key}')
            result = dict(metadata) if result is None else result
            del result[key]
        elif key in _META_ITEMS and isinstance(value, list):
            allowed = _META_ITEMS[key]
            items = [_prune_item(item, allowed, f'metadata.{key}[{index}]', unknown)
                     for index, item in enumerate(value)]
            if any(new is not old for new, old in zip(items, value, strict=True)):
                result = dict(metadata) if result is None else result
                result[key] = items
    return metadata if result is None else result


def _prune_item(item: Any, allowed: frozenset[str], path: str, unknown: list[str]) -> Any:
    if not isinstance(item, dict) or item.keys() <= allowed:
        return item
    unknown.extend(f'{path}.{key}' for key in item if key not in allowed)
    return {key: value for key, value in item.items() if key in allowed}


def validate_metadata(
    metadata: Mapping[str, Any],
    name_rule: NameRule,
    *,
    check_name: bool = True,
    previous: Mapping[str, Any] | None = None,
) -> list[Cause]:
    """
    All problems of the generic metadata fields of an object about to be stored.

    With the ``previous`` metadata given, the fields that are the very same objects as there
    are not checked again: stored objects are immutable, so they were checked when stored.
    """
    if previous is not None:
        metadata = {key: value for key, value in metadata.items() if previous.get(key) is not value}
    causes: list[Cause] = []
    name = metadata.get('name')
    if check_name:
        if not isinstance(name, str) or not name:
            causes.append(
                Cause(
                    'metadata.name',
                    'Required value: name or generateName is required',
                    reason='FieldValueRequired',
                )
            )
        else:
            for problem in name_problems(name, name_rule):
                causes.append(Cause('metadata.name', f'Invalid value: {_quote(name)}: {problem}'))

    labels = metadata.get('labels')
    if labels is not None:
        if not isinstance(labels, dict):
            causes.append(
                Cause(
                    'metadata.labels',
                    'Invalid value: labels must be a map of strings',
                    reason='FieldValueTypeInvalid',
                )
            )
        else:
            for key, value in labels.items():
                for problem in qualified_name_problems(key):
                    causes.append(Cause('metadata.labels', f'Invalid value: {_quote(key)}: {problem}'))
                if not isinstance(value, str):
                    causes.append(
                        Cause(
                            f'metadata.labels[{key}]',
                            'Invalid value: must be a string',
                            reason='FieldValueTypeInvalid',
                        )
                    )
                else:
                    for problem in label_value_problems(value):
                        causes.append(Cause('metadata.labels', f'Invalid value: {_quote(value)}: {problem}'))

    annotations = metadata.get('annotations')
    if annotations is not None:
        if not isinstance(annotations, dict):
            causes.append(
                Cause(
                    'metadata.annotations',
                    'Invalid value: annotations must be a map of strings',
                    reason='FieldValueTypeInvalid',
                )
            )
        else:
            total_size = 0
            for key, value in annotations.items():
                for problem in qualified_name_problems(key):
                    causes.append(Cause('metadata.annotations', f'Invalid value: {_quote(key)}: {problem}'))
                if not isinstance(value, str):
                    causes.append(
                        Cause(
                            f'metadata.annotations[{key}]',
                            'Invalid value: must be a string',
                            reason='FieldValueTypeInvalid',
                        )
                    )
                else:
                    total_size += len(key) + len(value)
            if total_size > _MAX_ANNOTATIONS_SIZE:
                causes.append(
                    Cause(
                        'metadata.annotations',
                        f'Too long: must have at most {_MAX_ANNOTATIONS_SIZE} bytes',
                        reason='FieldValueTooLong',
                    )
                )

    finalizers = metadata.get('finalizers')
    if finalizers is not None:
        if not isinstance(finalizers, list):
            causes.append(
                Cause(
                    'metadata.finalizers',
                    'Invalid value: finalizers must be a list of strings',
                    reason='FieldValueTypeInvalid',
                )
            )
        else:
            for index, finalizer in enumerate(finalizers):
                if not isinstance(finalizer, str):
                    causes.append(
                        Cause(
                            f'metadata.finalizers[{index}]',
                            'Invalid value: must be a string',
                            reason='FieldValueTypeInvalid',
                        )
                    )
                    continue
                for problem in qualified_name_problems(finalizer):
                    causes.append(
                        Cause(
                            f'metadata.finalizers[{index}]', f'Invalid value: {_quote(finalizer)}: {problem}'
                        )
                    )

    owner_references = metadata.get('ownerReferences')
    if owner_references is not None:
        if not isinstance(owner_references, list):
            causes.append(
                Cause(
                    'metadata.ownerReferences',
                    'Invalid value: must be a list',
                    reason='FieldValueTypeInvalid',
                )
            )
        else:
            for index, reference in enumerate(owner_references):
                field = f'metadata.ownerReferences[{index}]'
                if not isinstance(reference, dict):
                    causes.append(
                        Cause(field, 'Invalid value: must be an object', reason='FieldValueTypeInvalid')
                    )
                    continue
                for required in ('apiVersion', 'kind', 'name', 'uid'):
                    if not isinstance(reference.get(required), str) or not reference.get(required):
                        causes.append(
                            Cause(f'{field}.{required}', 'Required value', reason='FieldValueRequired')
                        )
    return causes


_JSON_TYPES = ((bool, 'bool'), (str, 'string'), (int, 'number'), (float, 'number'), (list, 'array'),
               (dict, 'object'))
# The Go types of the generic metadata fields: the whole field's, and its items' (for maps and lists).
_METADATA_TYPES: Mapping[str, tuple[type, str, type | None, str]] = {
    'name': (str, 'string', None, ''),
    'generateName': (str, 'string', None, ''),
    'namespace': (str, 'string', None, ''),
    'labels': (dict, 'map[string]string', str, 'string'),
    'annotations': (dict, 'map[string]string', str, 'string'),
    'finalizers': (list, '[]string', str, 'string'),
    'ownerReferences': (list, '[]v1.OwnerReference', dict, 'v1.OwnerReference'),
}


def json_type_name(value: Any) -> str:
    return next((name for cls, name in _JSON_TYPES if isinstance(value, cls)), 'value')


def type_problem(metadata: Mapping[str, Any], *, custom: bool) -> str | None:
    """
    Why the metadata cannot be decoded into Kubernetes' ObjectMeta (e.g. a number as a label), if so.

    Real servers decode the bodies of creations and updates into Go types first: a field of a wrong
    JSON type fails the request with 400 and Go's wording, before any validation (422). Nulls are
    nothing. (In patches, the same problems are found after patching: 422, see validate_metadata.)
    """
    prefix = 'ObjectMeta.' if custom else 'ObjectMeta.metadata.'
    for field, (field_type, go_type, item_type, item_go_type) in _METADATA_TYPES.items():
        value = metadata.get(field)
        if value is None:
            continue
        if not isinstance(value, field_type):
            return (f'json: cannot unmarshal {json_type_name(value)} into Go struct field '
                    f'{prefix}{field} of type {go_type}')
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        for item in items:
            if item is not None and item_type is not None and not isinstance(item, item_type):
                return (f'json: cannot unmarshal {json_type_name(item)} into Go struct field '
                        f'{prefix}{field} of type {item_go_type}')
    return None
