"""
The checks of a CRD's schemas when the CRD is created or updated, as real API servers check them.

Real servers refuse a CRD whose ``openAPIV3Schema`` is not structural or is inconsistent (422, with a
cause per problem); the emulator refused none, so a CRD that a cluster refuses worked in the tests.
Checked, with kube-apiserver's wording: the types (required at the root, in properties, items and
additionalProperties, unless ``x-kubernetes-int-or-string`` or ``x-kubernetes-preserve-unknown-fields``;
supported; ``object`` at the root), the items of arrays, ``properties`` with ``additionalProperties``,
``x-kubernetes-preserve-unknown-fields: false``, the list types and map types (their values, the keys
of map lists, the items of sets and maps), the root's ``metadata`` (name and generateName only), the
embedded resources, no types in ``allOf``/``anyOf``/``oneOf``/``not``, and the defaults (valid by
their schemas, with no unknown fields).

The CEL rules: ``oldSelf`` only where the old values are correlated (not in the items of lists other
than map lists). Not checked: the rules' compilation and estimated cost (cel-go's own messages), the
formats, the value validations inside ``allOf``/``anyOf``/``oneOf``/``not`` beyond their types.
"""
import json
import re
from collections.abc import Mapping
from typing import Any

from kopf.testing.emulator import schemas
from kopf.testing.emulator.errors import Cause
from kopf.testing.emulator.validation import go_value

_TYPES = ('array', 'boolean', 'integer', 'number', 'object', 'string')
_SUPPORTED_TYPES = ', '.join(f'"{name}"' for name in _TYPES)
_COMBINATIONS = ('allOf', 'anyOf', 'oneOf', 'not')
_MAP_TYPE = 'x-kubernetes-map-type'
_METADATA = frozenset({'name', 'generateName'})
_MAP_KEYS = 'x-kubernetes-list-map-keys'


def problems(crd_spec: Mapping[str, Any]) -> list[Cause]:
    """The problems of the schemas of the CRD's versions (each distinct schema once, as real servers)."""
    versions = crd_spec.get('versions')
    found: list[Cause] = []
    if not isinstance(versions, list):
        return found
    schemas_ = [(version.get('schema') or {}).get('openAPIV3Schema') for version in versions
                if isinstance(version, dict)]
    if schemas_ and all(schema == schemas_[0] for schema in schemas_):  # as one, like real servers
        where = [('spec.validation.openAPIV3Schema', schemas_[0])]
    else:
        where = [(f'spec.versions[{index}].schema.openAPIV3Schema', schema)
                 for index, schema in enumerate(schemas_)]
    for field, schema in where:
        if isinstance(schema, dict):
            _check_root(schema, field, found)
    return found


def _check_root(schema: Mapping[str, Any], field: str, found: list[Cause]) -> None:
    kind = schema.get('type')
    if not kind:
        found.append(_required(f'{field}.type', 'must not be empty at the root'))
    elif kind != 'object':
        found.append(Cause(f'{field}.type', f'Invalid value: {json.dumps(kind)}: must be object at the root'))
    metadata = _dict(schema.get('properties')).get('metadata')
    if isinstance(metadata, dict) and not _dict(metadata.get('properties')).keys() <= _METADATA:
        found.append(Cause(f'{field}.properties[metadata]',
                           'Forbidden: must not specify anything other than name and generateName, '
                           'but metadata is implicitly specified', 'FieldValueForbidden'))
    _check_node(schema, field, found, root=True)


def _check_node(schema: Mapping[str, Any], field: str, found: list[Cause], *,
                root: bool = False, place: str = 'object fields', uncorrelated: str | None = None) -> None:
    """
    One node of a schema, and the nodes in it.

    ``uncorrelated``: the list (its field) whose items have no old values for the transition rules (all
    but the items of map lists): the rules there must not use ``oldSelf``.
    """
    kind = schema.get('type')
    loose = schema.get('x-kubernetes-int-or-string') is True or \
        schema.get('x-kubernetes-preserve-unknown-fields') is True
    if not root and not kind and not loose:
        found.append(_required(f'{field}.type', f'must not be empty for specified {place}'))
    elif kind and kind not in _TYPES:
        found.append(Cause(f'{field}.type', f'Unsupported value: {json.dumps(kind)}: supported values: '
                                            f'{_SUPPORTED_TYPES}', 'FieldValueNotSupported'))
    if schema.get('x-kubernetes-preserve-unknown-fields') is False:
        found.append(Cause(f'{field}.x-kubernetes-preserve-unknown-fields',
                           'Invalid value: false: must be true or undefined'))
    if schema.get('x-kubernetes-embedded-resource') is True:
        if not schema.get('properties') and schema.get('x-kubernetes-preserve-unknown-fields') is not True:
            found.append(_required(f'{field}.properties',
                                   'must not be empty if x-kubernetes-embedded-resource is true '
                                   'without x-kubernetes-preserve-unknown-fields'))
        if kind != 'object':
            found.append(Cause(f'{field}.type', f'Invalid value: {json.dumps(kind)}: must be object if '
                                                'x-kubernetes-embedded-resource is true'))
    map_type = schema.get('x-kubernetes-map-type')
    if map_type is not None and map_type not in ('atomic', 'granular'):
        found.append(Cause(f'{field}.x-kubernetes-map-type', f'Unsupported value: {json.dumps(map_type)}: '
                                                             'supported values: "atomic", "granular"',
                           'FieldValueNotSupported'))

    properties = schema.get('properties')
    additional = schema.get('additionalProperties')
    if isinstance(properties, dict) and properties and isinstance(additional, dict):
        found.append(Cause(f'{field}.additionalProperties',
                           'Forbidden: additionalProperties and properties are mutual exclusive',
                           'FieldValueForbidden'))
    if 'default' in schema:
        _check_default(schema['default'], schema, f'{field}.default', found)
    for index, rule in enumerate(_list(schema.get('x-kubernetes-validations'))):
        text = _dict(rule).get('rule')
        if uncorrelated is not None and isinstance(text, str) and re.search(r'\boldSelf\b', text):
            why = f'oldSelf cannot be used on the uncorrelatable portion of the schema within {uncorrelated}'
            found.append(_invalid(f'{field}.x-kubernetes-validations[{index}].rule', text, why))
    items = schema.get('items')
    if kind == 'array' and not isinstance(items, dict):
        found.append(Cause(f'{field}.items', 'Required value: must be specified', 'FieldValueRequired'))
    if isinstance(items, dict):
        _check_list_type(schema, items, field, found)
    for key, subschema in (properties.items() if isinstance(properties, dict) else ()):
        if isinstance(subschema, dict):
            _check_node(subschema, f'{field}.properties[{key}]', found, uncorrelated=uncorrelated)
    if isinstance(additional, dict):
        _check_node(additional, f'{field}.additionalProperties', found, uncorrelated=uncorrelated)
    if isinstance(items, dict):
        mapped = schema.get('x-kubernetes-list-type') == 'map'
        _check_node(items, f'{field}.items', found, place='array items',
                    uncorrelated=uncorrelated if uncorrelated is not None or mapped else field)
    for keyword in _COMBINATIONS:
        branches = schema.get(keyword)
        for index, branch in enumerate([branches] if isinstance(branches, dict) else _list(branches)):
            if isinstance(branch, dict):
                where = f'{field}.{keyword}' if keyword == 'not' else f'{field}.{keyword}[{index}]'
                _check_combined(branch, where, found)


def _check_list_type(schema: Mapping[str, Any], items: Mapping[str, Any], field: str,
                     found: list[Cause]) -> None:
    list_type = schema.get('x-kubernetes-list-type')
    if list_type is None:
        return
    if list_type not in ('atomic', 'set', 'map'):
        found.append(Cause(f'{field}.x-kubernetes-list-type', f'Unsupported value: {json.dumps(list_type)}: '
                                                              'supported values: "atomic", "set", "map"',
                           'FieldValueNotSupported'))
    elif list_type == 'set' and items.get('type') == 'object' and items.get(_MAP_TYPE) != 'atomic':
        found.append(_invalid(f'{field}.items.{_MAP_TYPE}', items.get(_MAP_TYPE),
                              'must be atomic as item of a list with x-kubernetes-list-type=set'))
    elif list_type == 'map':
        keys = schema.get('x-kubernetes-list-map-keys')
        properties = _dict(items.get('properties'))
        if items.get('type') != 'object':
            found.append(_invalid(f'{field}.items.type', items.get('type'),
                                  "must be object if parent array's x-kubernetes-list-type is map"))
        elif not keys:
            found.append(_required(f'{field}.{_MAP_KEYS}',
                                   'must not be empty if x-kubernetes-list-type is map'))
        elif not isinstance(keys, list) or not all(key in properties for key in keys):
            found.append(_invalid(f'{field}.{_MAP_KEYS}', keys,
                                  'entries must all be names of item properties'))
        else:
            for key in keys:
                if key not in _list(items.get('required')) and 'default' not in _dict(properties[key]):
                    found.append(Cause(f'{field}.items.properties[{key}].default',
                                       'Required value: this property is in x-kubernetes-list-map-keys, '
                                       'so it must have a default or be a required property',
                                       'FieldValueRequired'))


def _check_combined(schema: Mapping[str, Any], field: str, found: list[Cause]) -> None:
    """In ``allOf``/``anyOf``/``oneOf``/``not``: value validations only, no types (structural schemas)."""
    if 'type' in schema:
        found.append(Cause(f'{field}.type', 'Forbidden: must be empty to be structural',
                           'FieldValueForbidden'))
    properties = schema.get('properties')
    for key, subschema in (properties.items() if isinstance(properties, dict) else ()):
        if isinstance(subschema, dict):
            _check_combined(subschema, f'{field}.properties[{key}]', found)
    for key in ('items', 'additionalProperties'):
        if isinstance(schema.get(key), dict):
            _check_combined(schema[key], f'{field}.{key}', found)


def _check_default(value: Any, schema: Mapping[str, Any], field: str, found: list[Cause]) -> None:
    """The default by its schema: no unknown fields, and valid (the fields named relative to it)."""
    if value is None:
        return
    _, unknown = schemas.prune_and_default({'v': value}, {'type': 'object', 'properties': {'v': schema}})
    if unknown:
        found.append(Cause(field, f'Invalid value: {go_value(value)}: must not have unknown fields'))
    for cause in schemas.validate_value(value, schema):
        cause.field = f'{field}.{cause.field}' if cause.field else field
        found.append(cause)


def _invalid(field: str, value: Any, why: str) -> Cause:
    return Cause(field, f'Invalid value: {go_value(value)}: {why}')


def _required(field: str, why: str) -> Cause:
    return Cause(field, f'Required value: {why}', 'FieldValueRequired')


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


