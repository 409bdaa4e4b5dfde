"""
Record how the original Kopf's persistence storages respond to a table of direct calls.

Runs in Kopf's own virtualenv (``import kopf`` is the original there), as a black box:
only the public classes and their public methods are called, with the inputs listed below,
and the outcomes (results, patches, errors) are stored as JSON. Our compatibility tests replay
the same calls on our storages and compare the outcomes exactly.

Usage: ``/work/kopf-venv/bin/python tools/compat/probe_kopf_storages.py --output storages.json``
"""

import argparse
import copy
import json
import pathlib
from typing import Any

import kopf

KEYS = [
    'create_fn',
    'create_fn/child1',
    'field_fn/spec.field',
    'a/b/c',
    'x' * 46,
    'x' * 47,
    'x' * 57,
    'x' * 58,
    'x' * 63,
    'x' * 64,
    'x' * 70,
    'x' * 200,
    'a' * 70 + '/b',
    'sub/' + 'a' * 70,
    'parent-' + 'p' * 63 + '/child',
    'p' * 50 + '/c',
    'hash-8-' + 'z' * 63,
    'hash-3-' + 'z' * 63,  # their hashes contain '+' and '/' in standard base64
    'ünïcödé-' * 9,
    'with space/and:colon',
    '',
]

OWNED_BY_DEPLOYMENT = [{'apiVersion': 'apps/v1', 'kind': 'Deployment', 'name': 'd', 'uid': 'u1'}]
OWNED_BY_OTHER = [{'apiVersion': 'apps/v1', 'kind': 'StatefulSet', 'name': 's', 'uid': 'u2'}]

RS_OF_DEPLOYMENT = {
    'apiVersion': 'apps/v1',
    'kind': 'ReplicaSet',
    'metadata': {'ownerReferences': OWNED_BY_DEPLOYMENT},
}
MARKING_BODIES: dict[str, dict[str, Any]] = {
    'plain': {'metadata': {}},
    'rs-of-deployment': {
        'apiVersion': 'apps/v1',
        'kind': 'ReplicaSet',
        'metadata': {'ownerReferences': OWNED_BY_DEPLOYMENT},
    },
    'rs-of-deployment-and-other': {
        'apiVersion': 'apps/v1',
        'kind': 'ReplicaSet',
        'metadata': {'ownerReferences': OWNED_BY_OTHER + OWNED_BY_DEPLOYMENT},
    },
    'rs-any-version': {
        'apiVersion': 'extensions/v1beta1',
        'kind': 'ReplicaSet',
        'metadata': {'ownerReferences': OWNED_BY_DEPLOYMENT},
    },
    'rs-of-other': {
        'apiVersion': 'apps/v1',
        'kind': 'ReplicaSet',
        'metadata': {'ownerReferences': OWNED_BY_OTHER},
    },
    'rs-unowned': {'apiVersion': 'apps/v1', 'kind': 'ReplicaSet', 'metadata': {}},
    'pod-of-rs': {
        'apiVersion': 'v1',
        'kind': 'Pod',
        'metadata': {
            'ownerReferences': [{'apiVersion': 'apps/v1', 'kind': 'ReplicaSet', 'name': 'r', 'uid': 'u3'}]
        },
    },
    'kex-of-deployment': {
        'apiVersion': 'kopf.dev/v1',
        'kind': 'KopfExample',
        'metadata': {'ownerReferences': OWNED_BY_DEPLOYMENT},
    },
}

RECORDS: list[dict[str, Any]] = [
    {
        'started': '2020-01-01T00:00:00.123456+00:00',
        'stopped': '2020-01-01T00:00:01.123456+00:00',
        'purpose': 'create',
        'retries': 1,
        'success': True,
        'failure': False,
    },
    {
        'started': '2020-01-01T00:00:00.123456+00:00',
        'stopped': None,
        'delayed': '2020-01-01T00:01:00+00:00',
        'purpose': 'update',
        'retries': 3,
        'success': False,
        'failure': False,
        'message': 'Ünïcode "quoted"\n',
        'subrefs': None,
    },
    {
        'started': None,
        'stopped': None,
        'delayed': None,
        'purpose': None,
        'retries': None,
        'success': None,
        'failure': None,
        'message': None,
        'subrefs': ['create_fn/child1', 'create_fn/child2'],
    },
    {'subrefs': [], 'retries': 0},
    {},
]

ESSENCE_BODIES: dict[str, dict[str, Any]] = {
    'full': {
        'apiVersion': 'kopf.dev/v1',
        'kind': 'KopfExample',
        'metadata': {
            'name': 'n',
            'namespace': 'ns',
            'uid': 'u',
            'resourceVersion': '1',
            'generation': 3,
            'creationTimestamp': 't',
            'deletionTimestamp': 'd',
            'deletionGracePeriodSeconds': 0,
            'selfLink': 's',
            'managedFields': [{}],
            'finalizers': ['f'],
            'ownerReferences': [{'kind': 'X'}],
            'generateName': 'g-',
            'annotations': {
                'z-first': 'b',
                'kubectl.kubernetes.io/last-applied-configuration': '{}',
                'kopf.zalando.org/last-handled-configuration': '{}',
                'kopf.zalando.org/create_fn': '{}',
                'kopf.zalando.org/touch-dummy': 'x',
                'other.org/x': 'y',
                'kopf.zalando.org/kopf-managed': 'yes',
                'deployment.kubernetes.io/revision': '1',
                'my-op.example.com/create_fn': '{}',
                'sub.kopf.zalando.org/x': 'sub',
                'xkopf.zalando.org/x': 'not-sub',
                'kopf.zalando.org': 'no-slash',
                'kubectl.kubernetes.io/other': 'kept',
            },
            'labels': {'b': 'second', 'a': 'first'},
        },
        'spec': {'x': 1, 'nested': {'a': None, 'list': [1, {'b': 2}]}, 'empty': {}},
        'status': {'s': 1, 'kopf': {'progress': {'fn': {}}}, 'x': {'y': 1, 'z': 2}},
        'data': {'k': 'v'},
        'extra': 1,
    },
    'marked-foreign': {
        'metadata': {
            'annotations': {
                'my-op.example.com/kopf-managed': 'yes',
                'my-op.example.com/x': '1',
                'sub.my-op.example.com/x': '2',
                'other.com/y': '3',
                'empty.com/kopf-managed': '',
                'empty.com/z': '4',
                'kopf-managed': 'no-prefix',
                'my-op.example.com/a/b': '5',
            }
        },
        'spec': {},
    },
    'minimal': {'metadata': {'name': 'x'}},
    'empty-stanzas': {'metadata': {'name': 'x', 'labels': {}, 'annotations': {}}, 'spec': {}, 'status': {}},
    'only-system': {
        'metadata': {'annotations': {'kopf.zalando.org/last-handled-configuration': 'x'}, 'labels': {}}
    },
    'empty': {},
    'with-diff-bases': {
        'metadata': {
            'labels': {'a': 'b'},
            'annotations': {
                'kopf.zalando.org/last-handled-configuration': '{"spec":{}}\n',
                'my-op.example.com/diff-base': '{"spec":{}}\n',
                'my-op.example.com/kopf-managed': 'yes',
                'other': 'value',
            },
        },
        'spec': {'x': 1, 'nested': {'a': 1}},
        'status': {'kopf': {'last-handled-configuration': '{}'}, 'diff-base': '{}', 'other': 1},
    },
    'rs-of-deployment': {
        'apiVersion': 'apps/v1',
        'kind': 'ReplicaSet',
        'metadata': {
            'ownerReferences': OWNED_BY_DEPLOYMENT,
            'labels': {'app': 'x'},
            'annotations': {
                'deployment.kubernetes.io/revision': '2',
                'kopf.zalando.org/last-handled-configuration': '{"spec":{}}\n',
                'kopf.zalando.org/last-handled-configuration-ofDRS': '{"spec":{"a":1}}\n',
            },
        },
        'spec': {'replicas': 1},
    },
}

EXTRA_FIELDS: list[list[Any] | None] = [
    None,
    [],
    ['status.kopf'],
    ['status.diff-base'],
    ['status.x.y'],
    ['status.x'],
    ['status'],
    ['metadata.name'],
    ['metadata'],
    ['metadata.annotations'],
    ['spec.x'],
    ['spec.nested.a'],
    ['status.absent.deep'],
    [['status', 'x', 'z']],
    ['status.x.y', 'status.s'],
]

IGNORED_FIELDS: list[list[Any] | None] = [
    None,
    ['spec.x'],
    ['spec.nested.list'],
    ['spec'],
    ['metadata.labels.a'],
    ['metadata.labels'],
    ['status.x'],
    ['absent.field'],
    [['spec', 'nested', 'a']],
    ['data.k'],
]


_BASE = '{"spec":{"a":1}}'
_LHC = 'kopf.zalando.org/last-handled-configuration'
DIFFBASE_BODIES: dict[str, dict[str, Any]] = {
    'empty': {},
    'annotation': {'metadata': {'annotations': {_LHC: _BASE + '\n'}}},
    'annotation-no-newline': {'metadata': {'annotations': {_LHC: _BASE}}},
    'annotation-null': {'metadata': {'annotations': {_LHC: 'null'}}},
    'annotation-garbage': {'metadata': {'annotations': {_LHC: '{'}}},
    'annotation-empty': {'metadata': {'annotations': {_LHC: ''}}},
    'custom-key': {'metadata': {'annotations': {'my-op.example.com/diff-base': _BASE + '\n'}}},
    'status': {'status': {'kopf': {'last-handled-configuration': _BASE}}},
    'status-my-op': {'status': {'my-op': {'last-handled-configuration': '{"spec":{"b":2}}'}}},
    'status-field': {'status': {'diff-base': '{"spec":{"c":3}}'}},
    'status-and-annotation': {
        'metadata': {'annotations': {_LHC: _BASE + '\n'}},
        'status': {
            'diff-base': '{"spec":{"c":3}}',
            'kopf': {'last-handled-configuration': '{"spec":{"d":4}}'},
        },
    },
    'status-garbage': {'status': {'kopf': {'last-handled-configuration': 'nope'}}},
    'marker-present': {'metadata': {'annotations': {'my-op.example.com/kopf-managed': 'yes'}}},
    'rs-of-deployment': ESSENCE_BODIES['rs-of-deployment'],
}
DIFFBASE_ESSENCES: list[dict[str, Any]] = [
    {'spec': {'a': 1}},
    {
        'spec': {'ü': 'ñ', 'b': [1, 2.5, True, None], 'nested': {'z': 1, 'a': 2}},
        'metadata': {'labels': {'l': 'v'}, 'annotations': {'a': 'b'}},
    },
    {},
]


DIFFBASE_STORE_BODIES = ['empty', 'annotation', 'marker-present', 'rs-of-deployment']


def make_storage(spec: dict[str, Any]) -> Any:
    cls = getattr(kopf, spec['class'])
    if 'storages' in spec:
        return cls([make_storage(child) for child in spec['storages']])
    return cls(**spec.get('kwargs', {}))


def outcome(fn: Any) -> dict[str, Any]:
    try:
        return {'result': fn()}
    except Exception as e:
        return {'error': type(e).__name__}


def patch_of(fn: Any) -> dict[str, Any]:
    patch = kopf.Patch()
    try:
        fn(patch)
    except Exception as e:
        return {'error': type(e).__name__}
    return {'patch': json.loads(json.dumps(patch))}


def progress_spec_variants() -> list[dict[str, Any]]:
    return [
        {'class': 'AnnotationsProgressStorage'},
        {'class': 'AnnotationsProgressStorage', 'kwargs': {'verbose': True}},
        {'class': 'AnnotationsProgressStorage', 'kwargs': {'v1': False}},
        {'class': 'AnnotationsProgressStorage', 'kwargs': {'prefix': 'my-op.example.com', 'touch_key': 'tk'}},
        {'class': 'AnnotationsProgressStorage', 'kwargs': {'prefix': 'p' * 60}},
        {'class': 'StatusProgressStorage'},
        {
            'class': 'StatusProgressStorage',
            'kwargs': {'field': ['status', 'a.b'], 'touch_field': ('status', 't')},
        },
        {'class': 'SmartProgressStorage'},
        {
            'class': 'SmartProgressStorage',
            'kwargs': {
                'name': 'x',
                'field': 'status.{name}.f',
                'touch_key': 'tk',
                'touch_field': 'status.{name}.t',
                'prefix': 'p.example.com',
                'v1': False,
                'verbose': True,
            },
        },
        {
            'class': 'MultiProgressStorage',
            'storages': [{'class': 'StatusProgressStorage'}, {'class': 'AnnotationsProgressStorage'}],
        },
    ]


def diffbase_spec_variants() -> list[dict[str, Any]]:
    return [
        {'class': 'AnnotationsDiffBaseStorage'},
        {'class': 'AnnotationsDiffBaseStorage', 'kwargs': {'v1': False}},
        {
            'class': 'AnnotationsDiffBaseStorage',
            'kwargs': {'prefix': 'my-op.example.com', 'key': 'diff-base'},
        },
        {'class': 'AnnotationsDiffBaseStorage', 'kwargs': {'prefix': 'p' * 60}},
        {'class': 'StatusDiffBaseStorage'},
        {'class': 'StatusDiffBaseStorage', 'kwargs': {'name': 'my-op'}},
        {'class': 'StatusDiffBaseStorage', 'kwargs': {'field': 'status.diff-base'}},
        {
            'class': 'MultiDiffBaseStorage',
            'storages': [
                {'class': 'StatusDiffBaseStorage', 'kwargs': {'field': 'status.diff-base'}},
                {'class': 'AnnotationsDiffBaseStorage'},
            ],
        },
    ]


def probe_keys() -> list[dict[str, Any]]:
    cases = []
    for spec in [
        {'class': 'AnnotationsProgressStorage'},
        {'class': 'AnnotationsProgressStorage', 'kwargs': {'v1': False}},
        {'class': 'AnnotationsProgressStorage', 'kwargs': {'prefix': 'my-op.example.com'}},
        {'class': 'AnnotationsProgressStorage', 'kwargs': {'prefix': 'p' * 60}},
        {'class': 'AnnotationsDiffBaseStorage', 'kwargs': {'prefix': 'q' * 45}},
    ]:
        storage = make_storage(spec)
        for key in KEYS:
            cases.append(
                {
                    'storage': spec,
                    'key': key,
                    'make_safe_key': storage.make_safe_key(key),
                    'make_suffix': storage.make_suffix(key),
                    'make_v1_key': storage.make_v1_key(key),
                    'make_v2_key': storage.make_v2_key(key),
                    'make_keys': list(storage.make_keys(key)),
                    'marked_keys': list(storage.make_keys(key, body=kopf.Body(RS_OF_DEPLOYMENT))),
                }
            )
    return cases


def probe_marking() -> list[dict[str, Any]]:
    storage = kopf.AnnotationsProgressStorage()
    return [
        {'body': name, 'mark_key': storage.mark_key('fn', body=kopf.Body(body))}
        for name, body in MARKING_BODIES.items()
    ]


STORE_BODIES = ['empty', 'marker-present', 'rs-of-deployment', 'both-places']
TOUCH_BODIES = ['empty', 'short-record', 'both-places', 'marker-present', 'rs-of-deployment']


def progress_bodies() -> dict[str, dict[str, Any]]:
    default = kopf.AnnotationsProgressStorage()
    long_key = 'x' * 70
    v2_key, v1_key = list(default.make_keys(long_key))
    return {
        'empty': {},
        'no-annotations': {'metadata': {'name': 'n'}},
        'short-record': {
            'metadata': {
                'annotations': {
                    'kopf.zalando.org/create_fn': '{"started":"2020-01-01T00:00:00+00:00","retries":2}',
                    'kopf.zalando.org/touch-dummy': 'old-touch',
                    'my-op.example.com/create_fn': '{"started":"custom-prefix"}',
                }
            }
        },
        'both-long-keys': {
            'metadata': {'annotations': {v2_key: '{"started":"v2"}', v1_key: '{"started":"v1"}'}}
        },
        'v1-long-key-only': {'metadata': {'annotations': {v1_key: '{"started":"v1"}'}}},
        'v2-long-key-only': {'metadata': {'annotations': {v2_key: '{"started":"v2"}'}}},
        'garbage': {'metadata': {'annotations': {'kopf.zalando.org/create_fn': 'not json'}}},
        'null-record': {'metadata': {'annotations': {'kopf.zalando.org/create_fn': 'null'}}},
        'extra-fields': {
            'metadata': {
                'annotations': {'kopf.zalando.org/create_fn': '{"started":"s","unknown":[1,2],"retries":"3"}'}
            }
        },
        'status-records': {
            'status': {
                'kopf': {
                    'progress': {
                        'create_fn': {'started': 'from-status', 'retries': 5},
                        'create_fn/child1': {'started': 'child-from-status'},
                    },
                    'dummy': 'status-touch',
                },
                'my-op': {'create_fn': {'started': 'my-op-status'}},
                'a.b': {'create_fn': {'started': 'dotted'}},
            }
        },
        'both-places': {
            'metadata': {
                'annotations': {
                    'kopf.zalando.org/create_fn': '{"started":"from-annotations"}',
                    'kopf.zalando.org/touch-dummy': 'ann-touch',
                }
            },
            'status': {
                'kopf': {'progress': {'create_fn': {'started': 'from-status'}}, 'dummy': 'status-touch'}
            },
        },
        'marker-present': {
            'metadata': {
                'annotations': {'my-op.example.com/kopf-managed': 'yes', 'p.example.com/kopf-managed': 'yes'}
            }
        },
        'rs-of-deployment': {
            'apiVersion': 'apps/v1',
            'kind': 'ReplicaSet',
            'metadata': {
                'ownerReferences': OWNED_BY_DEPLOYMENT,
                'annotations': {
                    'kopf.zalando.org/create_fn': '{"started":"copied-from-deployment"}',
                    'kopf.zalando.org/create_fn-ofDRS': '{"started":"own"}',
                },
            },
        },
    }


def probe_progress() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    bodies = progress_bodies()
    for spec in progress_spec_variants():
        storage = make_storage(spec)
        for body_name, raw in bodies.items():
            body = kopf.Body(copy.deepcopy(raw))
            for key in ['create_fn', 'create_fn/child1', 'x' * 70]:
                cases.append(
                    {
                        'storage': spec,
                        'op': 'fetch',
                        'body': body_name,
                        'key': key,
                        **outcome(
                            lambda key=key, body=body, storage=storage: storage.fetch(key=key, body=body)
                        ),
                    }
                )
                cases.append(
                    {
                        'storage': spec,
                        'op': 'purge',
                        'body': body_name,
                        'key': key,
                        **patch_of(
                            lambda p, key=key, body=body, storage=storage: storage.purge(
                                key=key, body=body, patch=p
                            )
                        ),
                    }
                )
            if body_name not in STORE_BODIES:
                continue
            for index, record in enumerate(RECORDS):
                for key in ['create_fn', 'x' * 70] if index == 0 else ['create_fn']:
                    cases.append(
                        {
                            'storage': spec,
                            'op': 'store',
                            'body': body_name,
                            'key': key,
                            'record': index,
                            **patch_of(
                                lambda p, key=key, record=record, body=body, storage=storage: storage.store(
                                    key=key, record=copy.deepcopy(record), body=body, patch=p
                                )
                            ),
                        }
                    )
        for body_name in STORE_BODIES:
            # A record stored and purged within one cycle (i.e. in the same patch, not applied yet).
            body = kopf.Body(copy.deepcopy(bodies[body_name]))
            cases.append(
                {
                    'storage': spec,
                    'op': 'store_then_purge',
                    'body': body_name,
                    'key': 'create_fn',
                    'record': 0,
                    **patch_of(
                        lambda p, body=body, storage=storage: (
                            storage.store(
                                key='create_fn', record=copy.deepcopy(RECORDS[0]), body=body, patch=p
                            ),
                            storage.purge(key='create_fn', body=body, patch=p),
                        )
                    ),
                }
            )
        for body_name in TOUCH_BODIES:
            body = kopf.Body(copy.deepcopy(bodies[body_name]))
            for value in ['new-touch', 'old-touch', 'status-touch', 'ann-touch', None]:
                cases.append(
                    {
                        'storage': spec,
                        'op': 'touch',
                        'body': body_name,
                        'value': value,
                        **patch_of(
                            lambda p, value=value, body=body, storage=storage: storage.touch(
                                body=body, patch=p, value=value
                            )
                        ),
                    }
                )
        for name, raw in {**bodies, **ESSENCE_BODIES}.items():
            essence = copy.deepcopy(raw)
            result = outcome(lambda essence=essence, storage=storage: storage.clear(essence=essence))
            cases.append(
                {'storage': spec, 'op': 'clear', 'essence': name, **result, 'input_intact': essence == raw}
            )
        if hasattr(storage, 'field'):
            cases.append(
                {'storage': spec, 'op': 'fields', 'result': [list(storage.field), list(storage.touch_field)]}
            )
    return cases


def probe_diffbase() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for spec in diffbase_spec_variants():
        storage = make_storage(spec)
        for body_name, raw in DIFFBASE_BODIES.items():
            body = kopf.Body(copy.deepcopy(raw))
            cases.append(
                {
                    'storage': spec,
                    'op': 'fetch',
                    'body': body_name,
                    **outcome(lambda body=body, storage=storage: storage.fetch(body=body)),
                }
            )
            if body_name not in DIFFBASE_STORE_BODIES:
                continue
            for index, essence in enumerate(DIFFBASE_ESSENCES):
                cases.append(
                    {
                        'storage': spec,
                        'op': 'store',
                        'body': body_name,
                        'essence': index,
                        **patch_of(
                            lambda p, body=body, essence=essence, storage=storage: storage.store(
                                body=body, patch=p, essence=copy.deepcopy(essence)
                            )
                        ),
                    }
                )
        if hasattr(storage, 'field'):
            cases.append({'storage': spec, 'op': 'fields', 'result': list(storage.field)})
    combinations = [(ignored, None) for ignored in IGNORED_FIELDS] + [(None, extra) for extra in EXTRA_FIELDS]
    combinations += [(['status.x'], ['status.x.y']), (['spec.nested'], ['spec.nested.a'])]
    variants = diffbase_spec_variants()
    extras_only = [(None, extra) for extra in EXTRA_FIELDS]
    multi_ignoring = {
        'class': 'MultiDiffBaseStorage',
        'storages': [
            {'class': 'AnnotationsDiffBaseStorage', 'kwargs': {'ignored_fields': ['spec.x']}},
            {'class': 'StatusDiffBaseStorage', 'kwargs': {'ignored_fields': ['spec.nested']}},
        ],
    }
    plans = [
        (variants[0], combinations),  # annotations, default
        (variants[2], extras_only),  # annotations, custom prefix & key
        (variants[4], extras_only),  # status, default
        (variants[7], extras_only),  # multi: status & annotations
        (multi_ignoring, [(None, None)]),
    ]
    for spec, spec_combinations in plans:
        for ignored, extra in spec_combinations:
            if ignored is None:
                storage_spec = spec
            else:
                storage_spec = {
                    'class': spec['class'],
                    'kwargs': dict(spec.get('kwargs', {}), ignored_fields=ignored),
                }
            storage = make_storage(storage_spec)
            for name, raw in ESSENCE_BODIES.items():
                body = kopf.Body(copy.deepcopy(raw))
                result = outcome(
                    lambda body=body, extra=extra, storage=storage: storage.build(
                        body=body, extra_fields=extra
                    )
                )
                cases.append(
                    {
                        'storage': storage_spec,
                        'op': 'build',
                        'body': name,
                        'extra_fields': extra,
                        **result,
                        'body_intact': dict(body) == raw,
                    }
                )
    return cases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('--output', type=pathlib.Path, required=True)
    args = parser.parse_args()
    data = {
        'kopf_version': kopf.__version__ if hasattr(kopf, '__version__') else '1.45.2',
        'inputs': {
            'keys': KEYS,
            'marking_bodies': MARKING_BODIES,
            'records': RECORDS,
            'progress_bodies': progress_bodies(),
            'essence_bodies': ESSENCE_BODIES,
            'diffbase_bodies': DIFFBASE_BODIES,
            'diffbase_essences': DIFFBASE_ESSENCES,
        },
        'keys': probe_keys(),
        'marking': probe_marking(),
        'progress': probe_progress(),
        'diffbase': probe_diffbase(),
    }
    # The storage specs are listed once and referred to by their index, to keep the file small.
    specs: list[dict[str, Any]] = []
    for section in ('keys', 'progress', 'diffbase'):
        for case in data[section]:
            if case['storage'] not in specs:
                specs.append(case['storage'])
            case['storage'] = specs.index(case['storage'])
    data['storages'] = specs
    args.output.write_text(dump_by_lines(data))


def dump_by_lines(data: dict[str, Any]) -> str:
    """Valid JSON with one case per line: compact, yet reviewable in diffs."""
    sections = []
    for name, value in data.items():
        if isinstance(value, list):
            items = ',\n'.join('  ' + json.dumps(item, ensure_ascii=False) for item in value)
            sections.append(f'{json.dumps(name)}: [\n{items}\n]')
        else:
            sections.append(f'{json.dumps(name)}: {json.dumps(value, ensure_ascii=False)}')
    return '{\n' + ',\n'.join(sections) + '\n}\n'


if __name__ == '__main__':
    main()
