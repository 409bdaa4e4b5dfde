from typing import Any

import pytest

from kopf._kits.hierarchies import label


@pytest.mark.parametrize('metadata, labels, forced, expected', [
    pytest.param(None, {'a': '1'}, False, {'metadata': {'labels': {'a': '1'}}}, id='no-metadata'),
    pytest.param({'name': 'x'}, {'a': '1'}, False, {'metadata': {'name': 'x', 'labels': {'a': '1'}}},
                 id='no-labels'),
    pytest.param({'labels': {'b': '2'}}, {'a': '1'}, False, {'metadata': {'labels': {'a': '1', 'b': '2'}}},
                 id='other-labels-kept'),
    pytest.param({'labels': {'a': '0'}}, {'a': '1', 'c': '3'}, False,
                 {'metadata': {'labels': {'a': '0', 'c': '3'}}}, id='existing-not-overwritten'),
    pytest.param({'labels': {'a': '0'}}, {'a': '1', 'c': '3'}, True,
                 {'metadata': {'labels': {'a': '1', 'c': '3'}}}, id='existing-overwritten-if-forced'),
    pytest.param(None, {}, False, {}, id='empty-labels-change-nothing'),
    pytest.param(None, {}, True, {}, id='empty-labels-change-nothing-even-if-forced'),
    pytest.param({'labels': {'a': '0'}}, {}, True, {'metadata': {'labels': {'a': '0'}}},
                 id='empty-keeps-all'),
])
def test_labelling(flavour: Any, metadata: Any, labels: Any, forced: bool, expected: Any) -> None:
    obj = flavour.make('V1Pod', {} if metadata is None else {'metadata': metadata})
    label(obj, labels, forced=forced)
    assert flavour.dump(obj) == expected


@pytest.mark.parametrize('forced', [False, True])
def test_idempotence(flavour: Any, forced: bool) -> None:
    obj = flavour.make('V1Pod', {'metadata': {'labels': {'a': '0'}}})
    label(obj, {'a': '1', 'b': '2'}, forced=forced)
    once = flavour.dump(obj)
    label(obj, {'a': '1', 'b': '2'}, forced=forced)
    assert flavour.dump(obj) == once


@pytest.mark.parametrize('kwargs', [
    pytest.param({}, id='omitted'),
    pytest.param({'labels': None}, id='none'),
])
def test_implicit_labels_of_the_owner(flavour: Any, handled: dict[str, Any], kwargs: dict[str, Any]) -> None:
    objs = [flavour.make('V1Pod', {}), flavour.make('V1Pod', {'metadata': {'labels': {'somelabel': 'mine'}}})]
    label(objs, **kwargs)
    assert [flavour.dump(obj) for obj in objs] == [
        {'metadata': {'labels': {'somelabel': 'somevalue'}}},
        {'metadata': {'labels': {'somelabel': 'mine'}}},
    ]
    label(objs, forced=True, **kwargs)
    assert [flavour.dump(obj) for obj in objs] == [
        {'metadata': {'labels': {'somelabel': 'somevalue'}}},
        {'metadata': {'labels': {'somelabel': 'somevalue'}}},
    ]


def test_implicit_owner_without_labels(handled: dict[str, Any]) -> None:
    del handled['metadata']['labels']
    obj: dict[str, Any] = {}
    label(obj)
    assert obj == {}


DEPLOYMENT: dict[str, Any] = {'spec': {'selector': {}, 'template': {}}}
DEPLOYMENT_WITH_TEMPLATE_LABELS = {'spec': {'selector': {}, 'template': {'metadata': {'labels': {'a': '0'}}}}}
CRONJOB = {'spec': {'schedule': '* * * * *', 'jobTemplate': {'spec': {'template': {}}}}}


@pytest.mark.parametrize('model, body, nested, forced, expected', [
    pytest.param('V1Deployment', DEPLOYMENT, 'spec.template', False, {
        'metadata': {'labels': {'a': '1'}},
        'spec': {'selector': {}, 'template': {'metadata': {'labels': {'a': '1'}}}},
    }, id='dotted-string'),
    pytest.param('V1Deployment', DEPLOYMENT, ['spec.template'], False, {
        'metadata': {'labels': {'a': '1'}},
        'spec': {'selector': {}, 'template': {'metadata': {'labels': {'a': '1'}}}},
    }, id='list-of-strings'),
    pytest.param('V1Deployment', DEPLOYMENT, [('spec', 'template')], False, {
        'metadata': {'labels': {'a': '1'}},
        'spec': {'selector': {}, 'template': {'metadata': {'labels': {'a': '1'}}}},
    }, id='list-of-tuples'),
    pytest.param('V1Deployment', DEPLOYMENT, [['spec', 'template'], None, ''], False, {
        'metadata': {'labels': {'a': '1'}},
        'spec': {'selector': {}, 'template': {'metadata': {'labels': {'a': '1'}}}},
    }, id='lists-nones-empties'),
    pytest.param('V1Deployment', DEPLOYMENT_WITH_TEMPLATE_LABELS, 'spec.template', False, {
        'metadata': {'labels': {'a': '1'}},
        'spec': {'selector': {}, 'template': {'metadata': {'labels': {'a': '0'}}}},
    }, id='nested-existing-not-overwritten'),
    pytest.param('V1Deployment', DEPLOYMENT_WITH_TEMPLATE_LABELS, 'spec.template', True, {
        'metadata': {'labels': {'a': '1'}},
        'spec': {'selector': {}, 'template': {'metadata': {'labels': {'a': '1'}}}},
    }, id='nested-existing-overwritten-if-forced'),
    pytest.param('V1Pod', {}, 'spec.template', False, {
        'metadata': {'labels': {'a': '1'}},
    }, id='absent-nested-skipped'),
    pytest.param('V1Deployment', DEPLOYMENT, 'spec.nonexistent', False, {
        'metadata': {'labels': {'a': '1'}},
        'spec': {'selector': {}, 'template': {}},
    }, id='unknown-nested-skipped'),
    pytest.param('V1CronJob', CRONJOB, ['spec.jobTemplate', 'spec.jobTemplate.spec.template'], False, {
        'metadata': {'labels': {'a': '1'}},
        'spec': {'schedule': '* * * * *', 'jobTemplate': {
            'metadata': {'labels': {'a': '1'}},
            'spec': {'template': {'metadata': {'labels': {'a': '1'}}}},
        }},
    }, id='camel-case-fields'),
])
def test_nested(flavour: Any, model: str, body: Any, nested: Any, forced: bool, expected: Any) -> None:
    obj = flavour.make(model, body)
    label(obj, {'a': '1'}, nested=nested, forced=forced)
    assert flavour.dump(obj) == expected


def test_nested_model_fields_by_python_names(model_flavour: Any) -> None:
    obj = model_flavour.make('V1CronJob', CRONJOB)
    label(obj, {'a': '1'}, nested='spec.job_template')
    assert model_flavour.dump(obj)['spec']['jobTemplate']['metadata'] == {'labels': {'a': '1'}}


def test_nested_with_implicit_labels(flavour: Any, handled: dict[str, Any]) -> None:
    obj = flavour.make('V1Deployment', DEPLOYMENT)
    label(obj, nested='spec.template')
    assert flavour.dump(obj) == {
        'metadata': {'labels': {'somelabel': 'somevalue'}},
        'spec': {'selector': {}, 'template': {'metadata': {'labels': {'somelabel': 'somevalue'}}}},
    }


def test_docs_example_of_nested_labels(handled: dict[str, Any]) -> None:
    objs: list[dict[str, Any]] = [{'kind': 'Job'}, {'kind': 'Deployment', 'spec': {'template': {}}}]
    label(objs, {'label1': 'value1'}, nested='spec.template')
    label(objs, nested='spec.template')
    assert objs == [
        {'kind': 'Job', 'metadata': {'labels': {'label1': 'value1', 'somelabel': 'somevalue'}}},
        {'kind': 'Deployment',
         'metadata': {'labels': {'label1': 'value1', 'somelabel': 'somevalue'}},
         'spec': {'template': {'metadata': {'labels': {'label1': 'value1', 'somelabel': 'somevalue'}}}}},
    ]


@pytest.mark.parametrize('force, forced, expected', [
    pytest.param(True, False, {'a': '1'}, id='force-true'),
    pytest.param(False, False, {'a': '0'}, id='force-false'),
])
def test_deprecated_force_alias(force: bool, forced: bool, expected: Any) -> None:
    obj = {'metadata': {'labels': {'a': '0'}}}
    with pytest.warns(DeprecationWarning, match=r'forced='):
        label(obj, {'a': '1'}, force=force, forced=forced)
    assert obj == {'metadata': {'labels': expected}}


def test_dict_labels_are_modified_in_place() -> None:
    labels = {'b': '2'}
    obj = {'metadata': {'labels': labels}}
    label(obj, {'a': '1'})
    assert obj['metadata']['labels'] is labels
    assert labels == {'a': '1', 'b': '2'}


def test_none_values_are_put_as_they_are() -> None:
    obj = {'metadata': {'labels': {'a': '0'}}}
    label(obj, {'a': None}, forced=True)
    assert obj == {'metadata': {'labels': {'a': None}}}


@pytest.mark.parametrize('nested, error, match', [
    pytest.param(123, TypeError, r'nested= must be', id='not-iterable'),
    pytest.param([123], TypeError, r'nested field path', id='int-item'),
    pytest.param([('spec', 1)], TypeError, r'nested field path', id='non-string-part'),
    pytest.param('spec..template', ValueError, r'empty field name', id='empty-part'),
    pytest.param(['spec.'], ValueError, r'empty field name', id='trailing-dot'),
])
def test_bad_nested_paths(nested: Any, error: type[Exception], match: str) -> None:
    obj: dict[str, Any] = {}
    with pytest.raises(error, match=match):
        label(obj, {'a': '1'}, nested=nested)
    assert obj == {}


@pytest.mark.parametrize('body, match', [
    pytest.param({'spec': {'template': 'oops'}}, r'spec\.template must be', id='non-mapping-target'),
    pytest.param({'spec': ['oops']}, r'spec must be', id='non-mapping-intermediate'),
    pytest.param({'spec': {'template': {'metadata': 'oops'}}}, r'metadata must be',
                 id='non-mapping-metadata'),
    pytest.param({'metadata': {'labels': ['oops']}}, r'labels must be a mapping', id='non-mapping-labels'),
])
def test_bad_structures(body: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        label(body, {'a': '1'}, nested='spec.template')


@pytest.mark.parametrize('labels', [
    pytest.param(['a', 'b'], id='list'),
    pytest.param('a=b', id='string'),
])
def test_bad_labels(labels: Any) -> None:
    with pytest.raises(TypeError, match=r'Labels must be a mapping'):
        label({}, labels)
