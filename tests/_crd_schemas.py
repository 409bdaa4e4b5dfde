"""
A CRD with a rich structural schema, and what real kube-apiservers answer to objects of it.

Shared by the emulator's own tests (``tests/emulator/test_schemas.py``, on the emulator only) and by
the fidelity tests (``tests/kubeapi/test_fidelity.py``, on both the emulator and a real kube-apiserver),
so that the expectations of the former are checked against a real server by the latter.
The expectations are kube-apiserver v1.37's answers, as they are (incl. their quirks).
"""
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

GROUP = 'schemas.kopf.dev'
PLURAL = 'schematics'
KIND = 'Schematic'
MERGE = 'application/merge-patch+json'
JSON_PATCH = 'application/json-patch+json'


def crd(group: str, plural: str, kind: str, schema: dict[str, Any], *,
        status: bool = False) -> dict[str, Any]:
    """A namespaced CRD of one version, ``v1``, with the schema (and the status subresource if asked)."""
    version = {'name': 'v1', 'served': True, 'storage': True, 'schema': {'openAPIV3Schema': schema}}
    return {
        'apiVersion': 'apiextensions.k8s.io/v1',
        'kind': 'CustomResourceDefinition',
        'metadata': {'name': f'{plural}.{group}'},
        'spec': {'group': group, 'scope': 'Namespaced',
                 'names': {'plural': plural, 'singular': kind.lower(), 'kind': kind},
                 'versions': [{**version, 'subresources': {'status': {}}} if status else version]},
    }


SCHEMA: dict[str, Any] = {
    'type': 'object',
    'properties': {
        'spec': {'type': 'object', 'required': ['size'], 'properties': {
            'size': {'type': 'integer', 'minimum': 1, 'maximum': 10},
            'mode': {'type': 'string', 'default': 'auto', 'enum': ['auto', 'manual']},
            'name': {'type': 'string', 'minLength': 2, 'maxLength': 5, 'pattern': '^[a-z]+$'},
            'ratio': {'type': 'number', 'exclusiveMinimum': True, 'minimum': 0, 'multipleOf': 0.5},
            'flag': {'type': 'boolean'},
            'tags': {'type': 'array', 'items': {'type': 'string'}, 'minItems': 1, 'maxItems': 2},
            'items': {'type': 'array', 'items': {'type': 'object', 'properties': {
                'key': {'type': 'string', 'default': 'k'}}}},
            'counts': {'type': 'object', 'additionalProperties': {'type': 'integer'}},
            'port': {'x-kubernetes-int-or-string': True},
            'nullable': {'type': 'string', 'nullable': True},
            'word': {'type': 'string', 'default': 'w'},
            'nested': {'type': 'object', 'default': {}, 'properties': {
                'a': {'type': 'string', 'default': 'A'}, 'b': {'type': 'string'}}},
            'optional': {'type': 'object', 'properties': {'a': {'type': 'string', 'default': 'A'}}},
            'extra': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
            'embedded': {'type': 'object', 'x-kubernetes-embedded-resource': True,
                         'properties': {'spec': {'type': 'object'}}},
            'time': {'type': 'string', 'format': 'date-time'},
            'int32': {'type': 'integer', 'format': 'int32'},
            'props': {'type': 'object', 'minProperties': 1, 'maxProperties': 2,
                      'x-kubernetes-preserve-unknown-fields': True},
            'set': {'type': 'array', 'x-kubernetes-list-type': 'set', 'items': {'type': 'string'}},
            'conditions': {'type': 'array', 'x-kubernetes-list-type': 'map',
                           'x-kubernetes-list-map-keys': ['type', 'scope'], 'items': {
                               'type': 'object', 'required': ['type'], 'properties': {
                                   'type': {'type': 'string'}, 'scope': {'type': 'string', 'default': 'all'},
                                   'status': {'type': 'string'},
                                   'tags': {'type': 'array', 'x-kubernetes-list-type': 'set',
                                            'items': {'type': 'integer'}}}}},
            'plain': {'type': 'array', 'items': {'type': 'string'}},  # a set when tightened (ratcheting)
        }},
        'status': {'type': 'object', 'properties': {
            'phase': {'type': 'string'},
            'count': {'type': 'integer', 'minimum': 0},
            'nodes': {'type': 'array', 'x-kubernetes-list-type': 'set', 'items': {'type': 'string'}},
        }},
    },
}

CRD = crd(GROUP, PLURAL, KIND, SCHEMA, status=True)

# Another CRD, with CEL rules (checked with kopf-testing[cel]): in its own, as a real server checks no rule
# of an object invalid by its schema, but says so (see SKIPPED_RULES).
RULES_GROUP = 'rules.kopf.dev'
RULES_PLURAL = 'ruleds'
RULES_KIND = 'Ruled'
_IMMUTABLE_VALUE = {'type': 'object', 'required': ['type'], 'properties': {
    'type': {'type': 'string', 'maxLength': 5}, 'value': {'type': 'string', 'maxLength': 5}},
    'x-kubernetes-validations': [{'rule': 'self.value == oldSelf.value', 'message': 'immutable value'}]}
RULES_SCHEMA: dict[str, Any] = {'type': 'object', 'properties': {'spec': {
    'type': 'object', 'x-kubernetes-validations': [
        {'rule': 'self.min <= self.max', 'message': 'min must not exceed max'},
        {'rule': "!has(self.name) || self.name.startsWith('a')"},
        {'rule': 'self.max < 100', 'messageExpression': "'too many'"},
        {'rule': 'self.min != 7', 'message': 'not seven', 'fieldPath': '.min',
         'reason': 'FieldValueForbidden'},
    ], 'properties': {
        'min': {'type': 'integer'},
        'max': {'type': 'integer'},
        'name': {'type': 'string', 'maxLength': 10, 'x-kubernetes-validations': [
            {'rule': 'self.size() > 1', 'message': 'short'}]},
        'mode': {'type': 'string', 'maxLength': 10, 'x-kubernetes-validations': [
            {'rule': 'self == oldSelf', 'message': 'mode is immutable'}]},
        'tags': {'type': 'array', 'maxItems': 10, 'items': {'type': 'string', 'maxLength': 10},
                 'x-kubernetes-validations': [{'rule': 'self.all(t, t.size() < 4)'}]},
        'count': {'type': 'integer', 'minimum': 0},
        'one': {'type': 'array', 'maxItems': 1, 'items': {'type': 'string'}},
        'set': {'type': 'array', 'x-kubernetes-list-type': 'set', 'items': {'type': 'string'}},
        'conds': {'type': 'array', 'maxItems': 5, 'x-kubernetes-list-type': 'map',  # correlated by "type"
                  'x-kubernetes-list-map-keys': ['type'], 'items': _IMMUTABLE_VALUE},
        'map': {'type': 'object', 'maxProperties': 5, 'additionalProperties': _IMMUTABLE_VALUE},
    }}}}
RULES_CRD = crd(RULES_GROUP, RULES_PLURAL, RULES_KIND, RULES_SCHEMA)
SKIPPED_RULES = ('<nil>', 'FieldValueInvalid',
                 'Invalid value: null: some validation rules were not checked because the object was '
                 'invalid; correct the existing errors to complete validation')

# What every object of the CRD gets by default (besides its own fields).
DEFAULTS = {'mode': 'auto', 'nested': {'a': 'A'}, 'word': 'w'}


def path(namespace: str, name: str = '', subresource: str = '', *, plural: str = PLURAL,
         group: str = GROUP) -> str:
    return '/'.join(filter(None, [f'/apis/{group}/v1/namespaces/{namespace}/{plural}', name, subresource]))


def schematic(name: str, spec: Any = None, *, kind: str = KIND, group: str = GROUP,
              **extra: Any) -> dict[str, Any]:
    body = {'apiVersion': f'{group}/v1', 'kind': kind, 'metadata': {'name': name}, **extra}
    return body if spec is None else {**body, 'spec': spec}


def ruled(name: str, spec: Any) -> dict[str, Any]:
    return schematic(name, spec, kind=RULES_KIND, group=RULES_GROUP)


def invalid(name: str, *causes: tuple[str, str, str], kind: str = KIND, group: str = GROUP) -> dict[str, Any]:
    """The Status of 422 for the causes (the field, the reason, the message)."""
    texts = [f'{field}: {message}' for field, _, message in causes]
    summary = texts[0] if len(texts) == 1 else '[' + ', '.join(texts) + ']'
    return {
        'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure', 'reason': 'Invalid',
        'code': 422, 'message': f'{kind}.{group} "{name}" is invalid: {summary}',
        'details': {'name': name, 'group': group, 'kind': kind, 'causes': [
            {'field': field, 'reason': reason, 'message': message} for field, reason, message in causes
        ]},
    }


def warnings(headers: Iterable[str]) -> list[str]:
    """The texts of the ``Warning`` headers (each header once, or joined with commas)."""
    return [re.sub(r'\\(.)', r'\1', text) for header in headers
            for text in re.findall(r'299 - "((?:[^"\\]|\\.)*)"', header)]


class Creation(NamedTuple):
    """A new object, and what a real server does with it: stores this spec, or answers this Status."""
    id: str
    body: dict[str, Any]
    params: dict[str, str]
    code: int
    result: dict[str, Any] | None  # the stored spec, or the Status of the failure
    warnings: list[str]


def _ok(id: str, spec: Any, stored: Any, warned: list[str] | None = None, *,
        params: dict[str, str] | None = None, **extra: Any) -> Creation:
    return Creation(id, schematic(id, spec, **extra), params or {}, 201, stored, warned or [])


def _bad(id: str, spec: Any, *causes: tuple[str, str, str]) -> Creation:
    return Creation(id, schematic(id, spec), {}, 422, invalid(id, *causes), [])


def _value(field: str, value: str, text: str, *, name: str | None = None) -> tuple[str, str, str]:
    """A cause of an invalid value (``name``: as the message names the field, if not as ``field``)."""
    return field, 'FieldValueInvalid', f'Invalid value: {value}: {name or field} in body {text}'


def _type(field: str, actual: str, expected: str, *, name: str | None = None) -> tuple[str, str, str]:
    text = f'must be of type {expected}: "{actual}"'
    return field, 'FieldValueTypeInvalid', f'Invalid value: "{actual}": {name or field} in body {text}'


def _duplicate(field: str, value: str) -> tuple[str, str, str]:
    return field, 'FieldValueDuplicate', f'Duplicate value: {value}'


def _nil(text: str) -> tuple[str, str, str]:
    return '<nil>', 'FieldValueInvalid', f'Invalid value: "": {text}'


def _status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    status = {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
              'reason': reason, 'code': code, 'message': message}
    return {**status, 'details': details} if details else status


_REQUIRED = 'FieldValueRequired', 'Required value'
_UNSUPPORTED = 'Unsupported value: "Bogus": supported values: "", "Ignore", "Strict", "Warn"'
_STRICT = (f'{KIND} in version "v1" cannot be handled as a {KIND}: strict decoding error: '
           f'unknown field "spec.nested.q", unknown field "spec.x"')
_EMBEDDED = {'apiVersion': 'v1', 'kind': 'X', 'metadata': {'name': 'n'}}
_LIMITS = {'min': 1, 'max': 2, 'name': 'ab', 'mode': 'x', 'tags': ['a'],
           'conds': [{'type': 'A', 'value': '1'}, {'type': 'B', 'value': '2'}],
           'map': {'k': {'type': 'A', 'value': '1'}}}

CREATIONS: list[Creation] = [
    _ok('minimal', {'size': 1}, {'size': 1, **DEFAULTS}),
    _ok('unknown-fields', {'size': 1, 'unknown': 1, 'nested': {'zz': 1}}, {'size': 1, **DEFAULTS},
        ['unknown field "spec.nested.zz"', 'unknown field "spec.unknown"',
         'unknown field "status.other"', 'unknown field "top"'],
        top=1, status={'phase': 'x', 'other': 1}),
    _ok('nested-defaults',
        {'size': 1, 'items': [{}, {'key': 'v', 'u': 1}], 'optional': {},
         'embedded': {**_EMBEDDED, 'spec': {'q': 1}, 'junk': 1}},
        {'size': 1, **DEFAULTS, 'items': [{'key': 'k'}, {'key': 'v'}], 'optional': {'a': 'A'},
         'embedded': {**_EMBEDDED, 'spec': {}}},
        ['unknown field "spec.embedded.junk"', 'unknown field "spec.embedded.spec.q"',
         'unknown field "spec.items[1].u"']),
    _ok('nulls', {'size': 1, 'nullable': None, 'word': None, 'mode': None, 'name': None, 'nested': None},
        {'size': 1, **DEFAULTS, 'nullable': None}),
    _ok('only-nulls', {'size': 1, 'nested': {'a': None}}, {'size': 1, **DEFAULTS}),
    _ok('null-in-a-map', {'size': 1, 'counts': {'a': None, 'b': 2}},
        {'size': 1, **DEFAULTS, 'counts': {'b': 2}}),
    _ok('preserved', {'size': 1, 'extra': {'any': {'thing': [1, 'x']}}, 'port': 'http'},
        {'size': 1, **DEFAULTS, 'extra': {'any': {'thing': [1, 'x']}}, 'port': 'http'}),
    _ok('integral-float', {'size': 2.0, 'time': '2026-01-02T03:04:05Z'},
        {'size': 2, **DEFAULTS, 'time': '2026-01-02T03:04:05Z'}),
    _ok('no-spec', None, None),
    Creation('null-spec', {**schematic('null-spec'), 'spec': None}, {}, 201, None, []),
    _ok('dry-run', {'size': 1, 'junk': 1}, {'size': 1, **DEFAULTS}, ['unknown field "spec.junk"'],
        params={'dryRun': 'All'}),
    _ok('ignored', {'size': 1, 'junk': 1}, {'size': 1, **DEFAULTS}, params={'fieldValidation': 'Ignore'}),
    Creation('strict', schematic('strict', {'size': 0, 'x': 1, 'nested': {'q': 2}}),
             {'fieldValidation': 'Strict'}, 400, _status(400, 'BadRequest', _STRICT), []),
    Creation('bogus', schematic('bogus', {'size': 1}), {'fieldValidation': 'Bogus'}, 422, _status(
        422, 'Invalid', f'CreateOptions.meta.k8s.io "" is invalid: fieldValidation: {_UNSUPPORTED}',
        group='meta.k8s.io', kind='CreateOptions', causes=[
            {'reason': 'FieldValueNotSupported', 'field': 'fieldValidation', 'message': _UNSUPPORTED}],
    ), []),
    _bad('below-minimum', {'size': 0}, _value('spec.size', '0', 'should be greater than or equal to 1')),
    _bad('above-maximum', {'size': 11}, _value('spec.size', '11', 'should be less than or equal to 10')),
    _bad('wrong-type', {'size': 'x'}, _type('spec.size', 'string', 'integer')),
    _bad('fraction', {'size': 1.5}, _type('spec.size', 'number', 'integer'),
         _nil('Checked value must be of type integer (default format) in spec.size')),
    _bad('required', {}, ('spec.size', *_REQUIRED)),
    _bad('enum', {'size': 1, 'mode': 'zzz'}, ('spec.mode', 'FieldValueNotSupported',
                                             'Unsupported value: "zzz": supported values: "auto", "manual"')),
    _bad('too-long', {'size': 1, 'name': 'abcdefg'},
         ('spec.name', 'FieldValueTooLong', 'Too long: may not be more than 5 bytes')),
    _bad('too-short', {'size': 1, 'name': 'a'},
         _value('spec.name', '"a"', 'should be at least 2 chars long')),
    _bad('pattern', {'size': 1, 'name': 'ab1'}, _value('spec.name', '"ab1"', "should match '^[a-z]+$'")),
    _bad('too-short-and-pattern', {'size': 1, 'name': '1'},  # the first of a string's problems only
         _value('spec.name', '"1"', 'should be at least 2 chars long')),
    _bad('exclusive-minimum', {'size': 1, 'ratio': 0},  # 0 is an integer: the factor is truncated to 0 too
         ('spec.ratio', 'FieldValueInvalid',
          'Invalid value: 0: factor MultipleOf declared for spec.ratio must be positive: 0'),
         _value('spec.ratio', '0', 'should be greater than 0')),
    _bad('multiple-of', {'size': 1, 'ratio': 0.7},
         _value('spec.ratio', '0.7', 'should be a multiple of 0.5')),
    _bad('boolean', {'size': 1, 'flag': 'yes'}, _type('spec.flag', 'string', 'boolean')),
    _bad('min-items', {'size': 1, 'tags': []}, _value('spec.tags', '0', 'should have at least 1 items')),
    _bad('max-items', {'size': 1, 'tags': ['a', 'b', 'c']},
         ('spec.tags', 'FieldValueTooMany', 'Too many: 3: must have at most 2 items')),
    _bad('item-type', {'size': 1, 'tags': ['a', 1]}, _type('spec.tags[1]', 'integer', 'string')),
    _bad('null-item', {'size': 1, 'tags': [None]}, _type('spec.tags[0]', 'null', 'string')),
    _bad('map-value', {'size': 1, 'counts': {'a': 'x'}}, _type('spec.counts.a', 'string', 'integer')),
    _bad('int-or-string', {'size': 1, 'port': True}, _type('spec.port', 'boolean', 'integer,string')),
    _bad('date-time', {'size': 1, 'time': 'nope'},
         ('spec.time', 'FieldValueTypeInvalid',
          'Invalid value: "nope": spec.time in body must be of type date-time: "nope"')),
    _bad('int32', {'size': 1, 'int32': 2**40},
         _nil('Checked value must be of type integer with format int32 in spec.int32')),
    _bad('min-properties', {'size': 1, 'props': {}},
         _value('spec.props', '0', 'should have at least 1 properties')),
    _bad('max-properties', {'size': 1, 'props': {'a': 1, 'b': 2, 'c': 3}},
         ('spec.props', 'FieldValueTooMany', 'Too many: 3: must have at most 2 items')),
    _bad('not-an-object', 5, _type('spec', 'integer', 'object')),
    _ok('unique', {'size': 1, 'set': ['a', 'b'], 'conditions': [
        {'type': 'A', 'tags': [1, 2]}, {'type': 'A', 'scope': 'x'}, {'type': 'B', 'status': 'y'}]},
        {'size': 1, **DEFAULTS, 'set': ['a', 'b'], 'conditions': [
            {'type': 'A', 'scope': 'all', 'tags': [1, 2]}, {'type': 'A', 'scope': 'x'},
            {'type': 'B', 'scope': 'all', 'status': 'y'}]}),
    _bad('set-duplicates', {'size': 1, 'set': ['a', 'b', 'a', 'a', 'b']},  # each once, where first repeated
         _duplicate('spec.set[2]', '"a"'), _duplicate('spec.set[4]', '"b"')),
    _bad('map-duplicates', {'size': 1, 'conditions': [  # by the keys, with their defaults; then the items'
        {'type': 'A', 'status': 'x', 'tags': [3, 3]}, {'type': 'A', 'scope': 'all', 'status': 'y'}]},
         _duplicate('spec.conditions[1]', '{"scope":"all","type":"A"}'),
         _duplicate('spec.conditions[0].tags[1]', '3')),
    _bad('duplicates-after-types', {'size': 'x', 'set': ['a', 'a']},
         _type('spec.size', 'string', 'integer'), _duplicate('spec.set[1]', '"a"')),
]


def _ruled_ok(id: str, spec: Any) -> Creation:
    return Creation(id, ruled(id, spec), {}, 201, spec, [])


def _ruled_bad(id: str, spec: Any, *causes: tuple[str, str, str]) -> Creation:
    status = invalid(id, *causes, kind=RULES_KIND, group=RULES_GROUP)
    return Creation(id, ruled(id, spec), {}, 422, status, [])


RULED_CREATIONS: list[Creation] = [
    _ruled_ok('cel-valid', _LIMITS),
    _ruled_bad('cel-message', {'min': 3, 'max': 2},
               ('spec', 'FieldValueInvalid', 'Invalid value: min must not exceed max')),
    _ruled_bad('cel-no-message', {'min': 1, 'max': 2, 'name': 'b'},
               ('spec', 'FieldValueInvalid', "Invalid value: failed rule: !has(self.name) || "
                                             "self.name.startsWith('a')"),
               ('spec.name', 'FieldValueInvalid', 'Invalid value: "b": short')),
    _ruled_bad('cel-message-expression', {'min': 1, 'max': 200},
               ('spec', 'FieldValueInvalid', 'Invalid value: too many')),
    _ruled_bad('cel-field-path', {'min': 7, 'max': 9},
               ('spec.min', 'FieldValueForbidden', 'Forbidden: not seven')),
    _ruled_bad('cel-list', {'min': 1, 'max': 2, 'tags': ['abcdef']},
               ('spec.tags', 'FieldValueInvalid', 'Invalid value: failed rule: self.all(t, t.size() < 4)')),
    _ruled_bad('cel-evaluation-error', {'max': 2},
               ('spec', 'FieldValueInvalid', 'Invalid value: "object": no such key: min evaluating rule: '
                                             'min must not exceed max'),
               ('spec', 'FieldValueInvalid', 'Invalid value: "object": no such key: min evaluating rule: '
                                             'not seven')),
    _ruled_bad('cel-after-a-schema-error', {'min': 'x', 'max': 2},
               ('spec.min', 'FieldValueTypeInvalid',
                'Invalid value: "string": spec.min in body must be of type integer: "string"'),
               SKIPPED_RULES),
    _ruled_bad('cel-after-too-many', {'min': 3, 'max': 2, 'one': ['a', 'b']},
               ('spec.one', 'FieldValueTooMany', 'Too many: 2: must have at most 1 item'), SKIPPED_RULES),
    _ruled_bad('cel-after-a-minimum', {'min': 3, 'max': 2, 'count': -1},  # not a "blocking" problem
               _value('spec.count', '-1', 'should be greater than or equal to 0'),
               ('spec', 'FieldValueInvalid', 'Invalid value: min must not exceed max')),
    _ruled_bad('cel-after-duplicates', {'min': 3, 'max': 2, 'set': ['a', 'a']},
               _duplicate('spec.set[1]', '"a"'),
               ('spec', 'FieldValueInvalid', 'Invalid value: min must not exceed max')),
]


def check_creation(case: Creation, code: int, body: Any, warned: list[str]) -> None:
    if case.code == 201:
        found = (code, body.get('spec'), 'top' in body, warned)
        assert found == (201, case.result, False, case.warnings), body
    else:
        assert (code, body, warned) == (case.code, case.result, case.warnings)


class Step(NamedTuple):
    """A change of the object ``target`` (created as ``TARGET``), and what a real server answers to it."""
    id: str
    method: str
    subresource: str
    body: Any
    params: dict[str, str]
    content_type: str
    code: int
    expected: dict[str, Any]  # the spec & status after it, or the Status (or its message's end) of a failure
    warnings: list[str]


TARGET = schematic('target', {'size': 5, 'flag': True})
_STORED_SPEC = {'size': 5, 'flag': True, **DEFAULTS}


def _step(id: str, body: Any, code: int, expected: dict[str, Any], warned: list[str] | None = None, *,
          subresource: str = '', content_type: str = MERGE, **params: str) -> Step:
    return Step(id, 'PATCH', subresource, body, params, content_type, code, expected, warned or [])


_WITH_STATUS = {'spec': _STORED_SPEC, 'status': {'phase': 'r'}}
_BOGUS = 'fieldValidation: Unsupported value: "x": supported values: "", "Ignore", "Strict", "Warn"'

STEPS: list[Step] = [
    _step('status-type', {'status': {'phase': 5, 'zz': 1}}, 422,
          invalid('target', _type('status.phase', 'integer', 'string', name='phase')),
          ['unknown field "status.zz"'], subresource='status'),
    _step('status-minimum', {'status': {'count': -1}}, 422,
          invalid('target', _value('status.count', '-1', 'should be greater than or equal to 0',
                                   name='count')),
          subresource='status'),
    _step('status-duplicates', {'status': {'nodes': ['n', 'n']}}, 422,
          invalid('target', _duplicate('status.nodes[1]', '"n"')), subresource='status'),
    _step('status-pruned', {'status': {'phase': 'q', 'zz': 1}}, 200,
          {'spec': _STORED_SPEC, 'status': {'phase': 'q'}}, ['unknown field "status.zz"'],
          subresource='status'),
    _step('status-ignored', {'status': {'phase': 'r', 'zz': 1}}, 200, _WITH_STATUS,
          subresource='status', fieldValidation='Ignore'),
    _step('spec-maximum', {'spec': {'size': 50}}, 422,
          invalid('target', _value('spec.size', '50', 'should be less than or equal to 10'))),
    _step('spec-nulls-defaulted', {'spec': {'mode': None, 'nested': None, 'junk': 1}}, 200, _WITH_STATUS,
          ['unknown field "spec.junk"']),
    _step('json-patch-pruned', [{'op': 'add', 'path': '/spec/junk', 'value': 1}], 200, _WITH_STATUS,
          ['unknown field "spec.junk"'], content_type=JSON_PATCH),
    _step('json-patch-type', [{'op': 'replace', 'path': '/spec/size', 'value': 'x'}], 422,
          invalid('target', _type('spec.size', 'string', 'integer')), content_type=JSON_PATCH),
    _step('status-via-main', {'status': {'phase': 7}}, 200, _WITH_STATUS),
    _step('strict', {'spec': {'junk': 1}}, 422,
          {'message-end': 'strict decoding error: unknown field "spec.junk"'}, fieldValidation='Strict'),
    _step('bogus', {'spec': {'size': 2}}, 422, {'message-end': _BOGUS}, fieldValidation='x'),
    _step('changed', {'spec': {'size': 6, 'mode': 'manual'}}, 200,
          {'spec': {**_STORED_SPEC, 'size': 6, 'mode': 'manual'}, 'status': {'phase': 'r'}}),
]


def check_step(step: Step, code: int, body: Any, warned: list[str]) -> None:
    if 'message-end' in step.expected:
        assert (code, body['reason'], warned) == (step.code, 'Invalid', step.warnings), body
        assert body['message'].endswith(step.expected['message-end']), body
    elif step.code == 200:
        found = {'spec': body.get('spec'), 'status': body.get('status')}
        assert (code, found, warned) == (200, step.expected, step.warnings), body
    else:
        assert (code, body, warned) == (step.code, step.expected, step.warnings)


# The CEL transition rules (oldSelf): on updates only.
_COND_A, _COND_B = {'type': 'A', 'value': '1'}, {'type': 'B', 'value': '2'}
RULED = ruled('ruled', _LIMITS)
TRANSITIONS: list[Step] = [
    _step('immutable', {'spec': {'mode': 'y'}}, 422, invalid(
        'ruled', ('spec.mode', 'FieldValueInvalid', 'Invalid value: "y": mode is immutable'),
        kind=RULES_KIND, group=RULES_GROUP)),
    _step('unchanged', {'spec': {'mode': 'x', 'max': 3}}, 200,
          {'spec': {**_LIMITS, 'max': 3}, 'status': None}),
    # The items of map lists are correlated with the old ones by their keys (whatever their order), a map's
    # entries by theirs (named "[key]" in the causes); the new ones have no old values.
    _step('map-list-reordered', {'spec': {'conds': [_COND_B, _COND_A, {'type': 'C', 'value': '3'}]}}, 200,
          {'spec': {**_LIMITS, 'max': 3, 'conds': [_COND_B, _COND_A, {'type': 'C', 'value': '3'}]},
           'status': None}),
    _step('map-list-item-changed', {'spec': {'conds': [{'type': 'B', 'value': '9'}, _COND_A]}}, 422, invalid(
        'ruled', ('spec.conds[0]', 'FieldValueInvalid', 'Invalid value: immutable value'),
        kind=RULES_KIND, group=RULES_GROUP)),
    _step('map-entry-changed', {'spec': {'map': {'k': {'type': 'A', 'value': '9'}, 'j': _COND_B}}}, 422,
          invalid('ruled', ('spec.map[k]', 'FieldValueInvalid', 'Invalid value: immutable value'),
                  kind=RULES_KIND, group=RULES_GROUP)),
]


# Ratcheting: an object stored under a looser schema, the schema tightened (size <= 3, "later" required,
# "plain" a set of unique items).
RATCHETED = schematic('ratcheted', {'size': 5, 'plain': ['a', 'a']})


def tightened(crd: dict[str, Any]) -> dict[str, Any]:
    spec_schema = crd['spec']['versions'][0]['schema']['openAPIV3Schema']['properties']['spec']
    spec_schema['properties']['size']['maximum'] = 3
    spec_schema['required'] = ['size', 'later']
    spec_schema['properties']['later'] = {'type': 'string'}
    spec_schema['properties']['plain']['x-kubernetes-list-type'] = 'set'
    return crd


# The invalid size is kept while unchanged, the missing field is not; the repeated items are not checked
# at all while the stored object has some (even new ones), and are once it has none.
_RATCHETED_SPEC = {'size': 5, 'plain': ['a', 'a'], **DEFAULTS}
RATCHETING: list[Step] = [
    _step('other-field', {'spec': {'flag': False}}, 422, invalid('ratcheted', ('spec.later', *_REQUIRED))),
    _step('labels', {'metadata': {'labels': {'a': 'b'}}}, 200, {'spec': _RATCHETED_SPEC, 'status': None}),
    _step('status', {'status': {'phase': 'p'}}, 200,
          {'spec': _RATCHETED_SPEC, 'status': {'phase': 'p'}}, subresource='status'),
    _step('fixed', {'spec': {'later': 'x'}}, 200,
          {'spec': {**_RATCHETED_SPEC, 'later': 'x'}, 'status': {'phase': 'p'}}),
    _step('changed', {'spec': {'size': 4}}, 422,
          invalid('ratcheted', _value('spec.size', '4', 'should be less than or equal to 3'))),
    _step('new-duplicates', {'spec': {'plain': ['b', 'b', 'c']}}, 200,
          {'spec': {**_RATCHETED_SPEC, 'later': 'x', 'plain': ['b', 'b', 'c']}, 'status': {'phase': 'p'}}),
    _step('unique', {'spec': {'plain': ['c']}}, 200,
          {'spec': {**_RATCHETED_SPEC, 'later': 'x', 'plain': ['c']}, 'status': {'phase': 'p'}}),
    _step('duplicates-again', {'spec': {'plain': ['c', 'c']}}, 422,
          invalid('ratcheted', _duplicate('spec.plain[1]', '"c"'))),
]
RATCHETED_NEW = Creation('new', schematic('new', {'size': 4, 'plain': ['a', 'a']}), {}, 422, invalid(
    'new', _value('spec.size', '4', 'should be less than or equal to 3'), ('spec.later', *_REQUIRED),
    _duplicate('spec.plain[1]', '"a"')), [])


# CRDs that real servers refuse for their schemas: by id, the openAPIV3Schema, and the causes (each
# field relative to ``spec.validation.openAPIV3Schema``, as real servers name the one schema of a CRD).
class RefusedSchema(NamedTuple):
    id: str
    schema: dict[str, Any]
    causes: list[tuple[str, str, str]]  # the field (relative), the reason, the message


def _spec(schema: dict[str, Any]) -> dict[str, Any]:
    return {'type': 'object', 'properties': {'spec': schema}}


def _under_spec(properties: dict[str, Any]) -> dict[str, Any]:
    return _spec({'type': 'object', 'properties': properties})


def _a(schema: dict[str, Any]) -> dict[str, Any]:
    return _under_spec({'a': schema})


def _l(schema: dict[str, Any]) -> dict[str, Any]:
    return _under_spec({'l': schema})


_MAP_ITEMS = {'type': 'object', 'properties': {'k': {'type': 'string'}}}
_LIST_MAP = {'type': 'array', 'x-kubernetes-list-type': 'map'}
_FIELDS = 'Required value: must not be empty for specified object fields'
_STRUCTURAL = 'Forbidden: must be empty to be structural'
_TYPES = '"array", "boolean", "integer", "number", "object", "string"'
_KEY_OPTIONAL = ('Required value: this property is in x-kubernetes-list-map-keys, so it must have a '
                 'default or be a required property')
_EMBEDDED_PROPERTIES = ('Required value: must not be empty if x-kubernetes-embedded-resource is true without '
                        'x-kubernetes-preserve-unknown-fields')
_METADATA = ('Forbidden: must not specify anything other than name and generateName, but metadata is '
             'implicitly specified')
_INVALID, _TYPE_INVALID = 'FieldValueInvalid', 'FieldValueTypeInvalid'
_NOT_SUPPORTED, _FORBIDDEN, _REQUIRED_ = 'FieldValueNotSupported', 'FieldValueForbidden', 'FieldValueRequired'
_A, _L = '.properties[spec].properties[a]', '.properties[spec].properties[l]'

REFUSED_SCHEMAS: list[RefusedSchema] = [
    RefusedSchema('no-type', _spec({'properties': {'a': {'type': 'string'}}}), [
        ('.properties[spec].type', _REQUIRED_, _FIELDS)]),
    RefusedSchema('no-items-type', _l({'type': 'array', 'items': {'properties': {}}}), [
        (f'{_L}.items.type', _REQUIRED_, 'Required value: must not be empty for specified array items')]),
    RefusedSchema('no-map-type', _a({'type': 'object', 'additionalProperties': {'properties': {}}}),
                  [(f'{_A}.additionalProperties.type', _REQUIRED_, _FIELDS)]),
    RefusedSchema('no-items', _l({'type': 'array'}), [
        (f'{_L}.items', _REQUIRED_, 'Required value: must be specified')]),
    RefusedSchema('unknown-type', _spec({'type': 'objekt'}), [
        ('.properties[spec].type', _NOT_SUPPORTED,
         f'Unsupported value: "objekt": supported values: {_TYPES}')]),
    RefusedSchema('both-properties', _a({'type': 'object', 'properties': {'x': {'type': 'string'}},
                                         'additionalProperties': {'type': 'string'}}), [
        (f'{_A}.additionalProperties', _FORBIDDEN,
         'Forbidden: additionalProperties and properties are mutual exclusive')]),
    RefusedSchema('preserve-false', _under_spec({'a': {'type': 'object',
                                                       'x-kubernetes-preserve-unknown-fields': False}}), [
        (f'{_A}.x-kubernetes-preserve-unknown-fields', _INVALID,
         'Invalid value: false: must be true or undefined')]),
    RefusedSchema('map-without-keys', _l({**_LIST_MAP, 'items': _MAP_ITEMS}), [
        (f'{_L}.x-kubernetes-list-map-keys', _REQUIRED_,
         'Required value: must not be empty if x-kubernetes-list-type is map')]),
    RefusedSchema('map-of-scalars', _under_spec({'l': {**_LIST_MAP, 'x-kubernetes-list-map-keys': ['k'],
                                                       'items': {'type': 'string'}}}), [
        (f'{_L}.items.type', _INVALID,
         'Invalid value: "string": must be object if parent array\'s x-kubernetes-list-type is map')]),
    RefusedSchema('map-key-optional', _under_spec({'l': {**_LIST_MAP, 'x-kubernetes-list-map-keys': ['k'],
                                                         'items': _MAP_ITEMS}}), [
        (f'{_L}.items.properties[k].default', _REQUIRED_, _KEY_OPTIONAL)]),
    RefusedSchema('map-key-unknown', _under_spec({'l': {**_LIST_MAP, 'x-kubernetes-list-map-keys': ['j'],
                                                        'items': _MAP_ITEMS}}), [
        (f'{_L}.x-kubernetes-list-map-keys', _INVALID,
         'Invalid value: ["j"]: entries must all be names of item properties')]),
    RefusedSchema('set-of-objects', _under_spec({'l': {'type': 'array', 'x-kubernetes-list-type': 'set',
                                                       'items': _MAP_ITEMS}}), [
        (f'{_L}.items.x-kubernetes-map-type', _INVALID,
         'Invalid value: null: must be atomic as item of a list with x-kubernetes-list-type=set')]),
    RefusedSchema('unknown-list-type', _under_spec({'l': {'type': 'array', 'x-kubernetes-list-type': 'bag',
                                                          'items': {'type': 'string'}}}), [
        (f'{_L}.x-kubernetes-list-type', _NOT_SUPPORTED,
         'Unsupported value: "bag": supported values: "atomic", "set", "map"')]),
    RefusedSchema('unknown-map-type', _a({'type': 'object', 'x-kubernetes-map-type': 'bogus'}), [
        (f'{_A}.x-kubernetes-map-type', _NOT_SUPPORTED,
         'Unsupported value: "bogus": supported values: "atomic", "granular"')]),
    RefusedSchema('embedded-string', _a({'type': 'string', 'x-kubernetes-embedded-resource': True}),
                  [(f'{_A}.properties', _REQUIRED_, _EMBEDDED_PROPERTIES),
                   (f'{_A}.type', _INVALID,
                    'Invalid value: "string": must be object if x-kubernetes-embedded-resource is true')]),
    RefusedSchema('typed-all-of', _a({'type': 'string', 'allOf': [{'type': 'string'}]}), [
        (f'{_A}.allOf[0].type', _FORBIDDEN, _STRUCTURAL)]),
    RefusedSchema('typed-any-of-property', _under_spec({'a': {
        'type': 'object', 'properties': {'x': {'type': 'string'}},
        'anyOf': [{'properties': {'x': {'type': 'string'}}}],
    }}), [(f'{_A}.anyOf[0].properties[x].type', _FORBIDDEN, _STRUCTURAL)]),
    RefusedSchema('default-of-a-wrong-type', _a({'type': 'integer', 'default': 'x'}), [
        (f'{_A}.default', _TYPE_INVALID,
         'Invalid value: "string":  in body must be of type integer: "string"')]),
    RefusedSchema('default-not-enumerated', _a({'type': 'string', 'enum': ['a'], 'default': 'b'}), [
        (f'{_A}.default', _NOT_SUPPORTED, 'Unsupported value: "b": supported values: "a"')]),
    RefusedSchema('default-with-unknown-fields', _under_spec({'a': {
        'type': 'object', 'properties': {'x': {'type': 'integer'}}, 'default': {'x': 'y', 'z': 1}}}), [
        (f'{_A}.default', _INVALID, 'Invalid value: {"x":"y","z":1}: must not have unknown fields'),
        (f'{_A}.default.x', _TYPE_INVALID,
         'Invalid value: "string": x in body must be of type integer: "string"')]),
    RefusedSchema('default-in-a-list', _under_spec({'a': {'type': 'array', 'items': {'type': 'integer'},
                                                          'default': [1, 'x']}}), [
        (f'{_A}.default.[1]', _TYPE_INVALID,
         'Invalid value: "string": [1] in body must be of type integer: "string"')]),
    RefusedSchema('old-self-in-list-items', _l({'type': 'array', 'maxItems': 5, 'items': {
        'type': 'string', 'maxLength': 5, 'x-kubernetes-validations': [{'rule': 'self == oldSelf'}]}}), [
        (f'{_L}.items.x-kubernetes-validations[0].rule', _INVALID,
         'Invalid value: "self == oldSelf": oldSelf cannot be used on the uncorrelatable portion of the '
         'schema within spec.validation.openAPIV3Schema.properties[spec].properties[l]')]),
    RefusedSchema('root-type', {'type': 'string'}, [
        ('.type', _INVALID, 'Invalid value: "string": must be object at the root')]),
    RefusedSchema('root-without-type', {'properties': {'spec': {'type': 'object'}}}, [
        ('.type', _REQUIRED_, 'Required value: must not be empty at the root')]),
    RefusedSchema('metadata-fields', {'type': 'object', 'properties': {'metadata': {
        'type': 'object', 'properties': {'labels': {'type': 'object'}}}}}, [
        ('.properties[metadata]', _FORBIDDEN, _METADATA)]),
]
# Accepted although they look wrong (as real servers accept them).
ACCEPTED_SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ('additional-false', _under_spec({'p': {'type': 'object', 'additionalProperties': False}})),
    ('properties-of-a-string', _a({'type': 'string', 'properties': {'x': {'type': 'string'}}})),
    ('typed-int-or-string', _a({'type': 'string', 'x-kubernetes-int-or-string': True})),
    ('untyped-preserved', _a({'x-kubernetes-preserve-unknown-fields': True})),
    ('untyped-any-of', _under_spec({'a': {'type': 'object', 'properties': {'x': {'type': 'string'}},
                                          'anyOf': [{'required': ['x']}]}})),
    ('metadata-name', {'type': 'object', 'properties': {'metadata': {
        'type': 'object', 'properties': {'name': {'type': 'string', 'maxLength': 5}}}}}),
]


def checked_crd(id: str, schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD of its own (named by the case's id), in a group of its own, with this schema."""
    plural = id.replace('-', '')
    return crd('checks.kopf.dev', plural, plural.capitalize(), schema)


def check_refused(case: RefusedSchema, code: int, body: Any) -> None:
    causes = [{'reason': reason, 'message': message, 'field': f'spec.validation.openAPIV3Schema{field}'}
              for field, reason, message in case.causes]
    assert (code, body.get('details', {}).get('causes')) == (422, causes), body
