import asyncio
import contextvars
from typing import Any

import pytest

import kopf
from kopf._core.actions.contexts import owner_var
from kopf._kits.hierarchies import adopt

REF = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'name': 'kopf-example-1', 'uid': 'uid-of-owner',
       'controller': True, 'blockOwnerDeletion': True}
OTHER = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': 'other', 'uid': 'uid2'}


@pytest.mark.parametrize('metadata, kwargs, expected', [
    pytest.param(None, {}, {
        'ownerReferences': [REF], 'generateName': 'kopf-example-1-', 'namespace': 'default',
        'labels': {'somelabel': 'somevalue'},
    }, id='defaults'),
    pytest.param(None, {'strict': True}, {
        'ownerReferences': [REF], 'name': 'kopf-example-1', 'namespace': 'default',
        'labels': {'somelabel': 'somevalue'},
    }, id='strict'),
    pytest.param({'name': 'mine', 'namespace': 'ns', 'labels': {'somelabel': 'mine'},
                  'ownerReferences': [OTHER]}, {'strict': True}, {
        'ownerReferences': [OTHER, REF], 'name': 'mine', 'namespace': 'ns', 'labels': {'somelabel': 'mine'},
    }, id='existing-kept'),
    pytest.param({'name': 'mine', 'namespace': 'ns', 'labels': {'somelabel': 'mine'},
                  'ownerReferences': [OTHER]}, {'forced': True}, {
        'ownerReferences': [OTHER, REF], 'generateName': 'kopf-example-1-', 'namespace': 'default',
        'labels': {'somelabel': 'somevalue'},
    }, id='existing-forced'),
])
def test_adopting(flavour: Any, owner: dict[str, Any], metadata: Any, kwargs: Any, expected: Any) -> None:
    obj = flavour.make('V1Pod', {} if metadata is None else {'metadata': metadata})
    adopt(obj, owner, **kwargs)
    assert flavour.dump(obj) == {'metadata': expected}
    adopt(obj, owner, **kwargs)  # idempotent
    assert flavour.dump(obj) == {'metadata': expected}


def test_adopting_implicitly_with_nested(flavour: Any, handled: dict[str, Any]) -> None:
    obj = flavour.make('V1Deployment', {'spec': {'selector': {}, 'template': {}}})
    adopt(obj, nested='spec.template')
    assert flavour.dump(obj) == {
        'metadata': {
            'ownerReferences': [REF], 'generateName': 'kopf-example-1-', 'namespace': 'default',
            'labels': {'somelabel': 'somevalue'},
        },
        'spec': {'selector': {}, 'template': {'metadata': {'labels': {'somelabel': 'somevalue'}}}},
    }


def test_docs_example(handled: dict[str, Any]) -> None:
    objs: list[dict[str, Any]] = [{'kind': 'Job'}, {'kind': 'Deployment'}]
    adopt(objs, strict=True, forced=True, nested='spec.template')
    expected_metadata = {
        'ownerReferences': [REF],
        'name': 'kopf-example-1',
        'namespace': 'default',
        'labels': {'somelabel': 'somevalue'},
    }
    assert objs == [
        {'kind': 'Job', 'metadata': expected_metadata},
        {'kind': 'Deployment', 'metadata': expected_metadata},
    ]


def test_cluster_scoped_owner(flavour: Any) -> None:
    owner = {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'ns1', 'uid': 'uid1'}}
    obj = flavour.make('V1Pod', {'metadata': {'namespace': 'mine'}})
    adopt(obj, owner, forced=True)
    assert flavour.dump(obj) == {'metadata': {
        'ownerReferences': [{'apiVersion': 'v1', 'kind': 'Namespace', 'name': 'ns1', 'uid': 'uid1',
                             'controller': True, 'blockOwnerDeletion': True}],
        'generateName': 'ns1-',
        'namespace': 'mine',
    }}


def test_explicit_owner_is_not_mixed_with_the_implicit_one(handled: dict[str, Any]) -> None:
    # The explicit owner is cluster-scoped and unlabelled: nothing may leak from the object being handled.
    owner = {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'ns1', 'uid': 'uid1'}}
    obj: dict[str, Any] = {}
    adopt(obj, owner)
    assert obj == {'metadata': {
        'ownerReferences': [{'apiVersion': 'v1', 'kind': 'Namespace', 'name': 'ns1', 'uid': 'uid1',
                             'controller': True, 'blockOwnerDeletion': True}],
        'generateName': 'ns1-',
    }}


def test_generators_are_consumed_once(owner: dict[str, Any]) -> None:
    objs: list[dict[str, Any]] = [{}, {}]
    adopt((obj for obj in objs), owner)
    assert all(obj['metadata']['namespace'] == 'default' for obj in objs)
    assert all(obj['metadata']['labels'] == {'somelabel': 'somevalue'} for obj in objs)


def test_implicit_owner_in_a_copied_context(owner: dict[str, Any]) -> None:
    def handler() -> dict[str, Any]:
        owner_var.set(owner)
        obj: dict[str, Any] = {}
        adopt(obj)
        return obj

    obj = contextvars.copy_context().run(handler)
    assert obj['metadata']['ownerReferences'] == [REF]
    with pytest.raises(LookupError):
        owner_var.get()  # it did not leak out of the handler's context


async def test_implicit_owner_in_tasks(owner: dict[str, Any]) -> None:
    other = {**owner, 'metadata': {**owner['metadata'], 'name': 'other', 'uid': 'uid-other'}}

    async def handler(body: dict[str, Any]) -> dict[str, Any]:
        owner_var.set(body)
        await asyncio.sleep(0)  # let the other task set its own owner in between
        obj: dict[str, Any] = {}
        adopt(obj)
        return obj

    obj1, obj2 = await asyncio.gather(handler(owner), handler(other))
    assert obj1['metadata']['ownerReferences'][0]['uid'] == 'uid-of-owner'
    assert obj2['metadata']['ownerReferences'][0]['uid'] == 'uid-other'


def test_owner_without_uid_changes_nothing(owner: dict[str, Any]) -> None:
    del owner['metadata']['uid']
    obj: dict[str, Any] = {}
    with pytest.raises(ValueError, match=r'metadata\.uid'):
        adopt(obj, owner)
    assert obj == {}


def test_children_share_nothing_with_the_owner_or_each_other(owner: dict[str, Any]) -> None:
    objs: list[dict[str, Any]] = [{}, {}]
    adopt(objs, owner)
    objs[0]['metadata']['labels']['extra'] = 'x'
    objs[0]['metadata']['ownerReferences'][0]['name'] = 'changed'
    assert owner['metadata']['labels'] == {'somelabel': 'somevalue'}
    assert objs[1]['metadata']['labels'] == {'somelabel': 'somevalue'}
    assert objs[1]['metadata']['ownerReferences'] == [REF]


def test_owner_as_a_read_only_body_view(owner: dict[str, Any]) -> None:
    # The core puts kopf.Body (a live read-only view) into the context, not a dict.
    body_cls = getattr(kopf, 'Body', None)
    if body_cls is None:
        pytest.skip("kopf.Body is not available yet.")
    token = owner_var.set(body_cls(owner))
    try:
        obj: dict[str, Any] = {}
        adopt(obj, strict=True)
    finally:
        owner_var.reset(token)
    assert obj == {'metadata': {
        'ownerReferences': [REF], 'name': 'kopf-example-1', 'namespace': 'default',
        'labels': {'somelabel': 'somevalue'},
    }}
    assert type(obj['metadata']['labels']) is dict
