import copy
import gc
import weakref

import pytest

from kopf._cogs.structs.bodies import Body, Meta, RawBody, RawEvent, Spec, Status
from kopf._cogs.structs.patches import Patch

RAW: RawBody = {
    'apiVersion': 'kopf.dev/v1',
    'kind': 'KopfExample',
    'metadata': {
        'name': 'kopf-example-1',
        'namespace': 'default',
        'uid': 'uid-1',
        'labels': {'app': 'x'},
        'annotations': {'note': 'y'},
        'creationTimestamp': '2020-01-01T00:00:00Z',
    },
    'spec': {'field': 'value'},
    'status': {'phase': 'Running'},
}


def test_body_is_a_read_only_mapping_of_the_raw_body():
    body = Body(RAW)
    assert body == RAW
    assert body['kind'] == 'KopfExample'
    assert set(body) == set(RAW)
    assert body['spec'] is RAW['spec']  # no copies
    with pytest.raises(TypeError):
        body['kind'] = 'Other'


def test_views_are_typed_and_stable():
    body = Body(RAW)
    assert isinstance(body.meta, Meta)
    assert isinstance(body.spec, Spec)
    assert isinstance(body.status, Status)
    assert body.meta is body.metadata
    assert body.spec is body.spec
    assert body.meta.labels is body.meta.labels


def test_views_show_the_fields():
    body = Body(RAW)
    assert body.spec == {'field': 'value'}
    assert body.status == {'phase': 'Running'}
    assert body.meta['name'] == 'kopf-example-1'
    assert body.meta.name == 'kopf-example-1'
    assert body.meta.namespace == 'default'
    assert body.meta.uid == 'uid-1'
    assert body.meta.labels == {'app': 'x'}
    assert body.meta.annotations == {'note': 'y'}
    assert body.meta.creation_timestamp == '2020-01-01T00:00:00Z'
    assert body.meta.deletion_timestamp is None


def test_views_of_an_empty_body():
    body = Body({})
    assert body.spec == {}
    assert body.status == {}
    assert body.meta == {}
    assert body.meta.labels == {}
    assert body.meta.annotations == {}
    assert body.meta.name is None
    assert body.meta.namespace is None
    assert body.meta.uid is None
    assert body.meta.creation_timestamp is None


def test_replacement_is_seen_by_all_views_held_by_handlers():
    body = Body(RAW)
    spec, meta, status, labels = body.spec, body.meta, body.status, body.meta.labels
    newer = copy.deepcopy(RAW)
    newer['spec'] = {'field': 'new-value'}
    newer['metadata']['labels'] = {'app': 'z'}
    newer['metadata']['deletionTimestamp'] = '2020-01-02T00:00:00Z'
    del newer['status']
    body._replace_with(newer)
    assert body == newer
    assert spec == {'field': 'new-value'}
    assert status == {}
    assert labels == {'app': 'z'}
    assert meta.deletion_timestamp == '2020-01-02T00:00:00Z'
    assert RAW['spec'] == {'field': 'value'}  # the old raw body is intact


def test_changes_in_place_of_the_raw_body_are_seen():
    raw = copy.deepcopy(RAW)
    body = Body(raw)
    raw['spec']['other'] = 1
    raw['metadata']['labels']['new'] = 'label'
    assert body.spec == {'field': 'value', 'other': 1}
    assert body.meta.labels['new'] == 'label'


def test_raw_types_are_plain_dicts():
    raw: RawBody = {'metadata': {'name': 'x'}}
    event: RawEvent = {'type': 'ADDED', 'object': raw}
    assert type(raw) is dict
    assert type(event) is dict
    assert Body(event['object']).meta.name == 'x'


def test_body_of_a_body_is_replaced_independently():
    outer = Body({'spec': {'a': 1}})
    inner = Body(outer)
    assert inner.spec == {'a': 1}
    inner._replace_with({'spec': {'a': 2}})
    assert outer.spec == {'a': 1}
    assert inner.spec == {'a': 2}
    inner._replace_with(outer)
    outer._replace_with({'spec': {'a': 3}})
    assert inner.spec == {'a': 3}  # still a live view of the outer body


@pytest.fixture()
def no_gc():
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.usefixtures('no_gc')
def test_bodies_have_no_reference_cycles():
    body = Body(copy.deepcopy(RAW))
    views = [body.spec, body.status, body.meta, body.meta.labels, body.meta.annotations]
    assert all(views)
    ref = weakref.ref(body)
    del body
    assert ref() is None  # freed by the reference counting, with no garbage collection
    assert views[0] == {'field': 'value'}  # the views kept by handlers still work


@pytest.mark.usefixtures('no_gc')
def test_patches_have_no_reference_cycles():
    patch = Patch()
    patch.spec['x'] = 1
    patch.meta.labels['y'] = '2'
    ref = weakref.ref(patch)
    del patch
    assert ref() is None
