"""
Fixtures for the hierarchy kits: the object flavours and the owners (explicit or being handled).

Every flavour converts JSON-shaped bodies to its own objects and back, so that the same tables of
cases run against raw dicts, pykube-ng objects, and the models of the Kubernetes clients.
Besides the real clients (skipped if not installed), a minimal imitation of the legacy
openapi-generator models (plain classes, no pydantic) keeps that style covered regardless of
which versions of the clients are installed.
"""
import copy
import dataclasses
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, ClassVar

import pytest

from kopf._core.actions.contexts import owner_var


@dataclasses.dataclass(frozen=True)
class Flavour:
    name: str
    make: Callable[[str, Mapping[str, Any]], Any]  # (model name like "V1Pod", JSON body) -> object
    dump: Callable[[Any], Any]  # object -> JSON body


def _make_dict(model_name: str, body: Mapping[str, Any]) -> Any:
    return copy.deepcopy(dict(body))


def _make_pykube(model_name: str, body: Mapping[str, Any]) -> Any:
    import pykube.objects
    cls = getattr(pykube.objects, model_name.removeprefix('V1'))
    return cls(None, copy.deepcopy(dict(body)))


def _model_from_json(namespace: ModuleType, type_name: str, data: Any) -> Any:
    if data is None:
        return None
    if match := re.fullmatch(r'(?:list|List)\[(.+)\]', type_name):
        return [_model_from_json(namespace, match.group(1), item) for item in data]
    cls: Any = getattr(namespace, type_name, None)
    if not isinstance(getattr(cls, 'attribute_map', None), Mapping):
        return copy.deepcopy(data)  # primitives, dicts of primitives, free-form objects
    unknown = set(data) - set(cls.attribute_map.values())
    assert not unknown, f"{type_name} has no fields {unknown}"
    kwargs = {attr: _model_from_json(namespace, cls.openapi_types[attr], data[key])
              for attr, key in cls.attribute_map.items() if key in data}
    return cls(**kwargs)


def _model_to_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_model_to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _model_to_json(item) for key, item in value.items()}
    attribute_map = getattr(type(value), 'attribute_map', None)
    if isinstance(attribute_map, Mapping):
        return {key: _model_to_json(getattr(value, attr)) for attr, key in attribute_map.items()
                if getattr(value, attr) is not None}
    return value


def _model_flavour(name: str, namespace: ModuleType) -> Flavour:
    return Flavour(
        name=name,
        make=lambda model_name, body: _model_from_json(namespace, model_name, body),
        dump=_model_to_json,
    )


# An imitation of the models by the legacy openapi-generator (as in older kubernetes/kubernetes_asyncio):
# plain classes with two class-level maps, keyword-only constructors, and client-side validation.
class _LegacyModel:
    openapi_types: ClassVar[dict[str, str]] = {}
    attribute_map: ClassVar[dict[str, str]] = {}
    required: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - set(self.openapi_types)
        if unknown:
            raise TypeError(f"unexpected arguments: {unknown}")
        missing = {attr for attr in self.required if kwargs.get(attr) is None}
        if missing:
            raise ValueError(f"Invalid value for {missing}, must not be `None`")
        for attr in self.openapi_types:
            setattr(self, attr, kwargs.get(attr))


def _legacy(name: str, fields: dict[str, tuple[str, str]], required: frozenset[str] = frozenset()) -> type:
    return type(name, (_LegacyModel,), {
        'openapi_types': {attr: type_name for attr, (_, type_name) in fields.items()},
        'attribute_map': {attr: key for attr, (key, _) in fields.items()},
        'required': required,
        '__module__': __name__,
    })


_ROOT = {
    'api_version': ('apiVersion', 'str'),
    'kind': ('kind', 'str'),
    'metadata': ('metadata', 'V1ObjectMeta'),
}
V1OwnerReference = _legacy('V1OwnerReference', {
    'api_version': ('apiVersion', 'str'),
    'kind': ('kind', 'str'),
    'name': ('name', 'str'),
    'uid': ('uid', 'str'),
    'controller': ('controller', 'bool'),
    'block_owner_deletion': ('blockOwnerDeletion', 'bool'),
}, required=frozenset({'name', 'uid'}))
V1ObjectMeta = _legacy('V1ObjectMeta', {
    'name': ('name', 'str'),
    'generate_name': ('generateName', 'str'),
    'namespace': ('namespace', 'str'),
    'uid': ('uid', 'str'),
    'labels': ('labels', 'dict(str, str)'),
    'owner_references': ('ownerReferences', 'list[V1OwnerReference]'),
})
V1PodTemplateSpec = _legacy('V1PodTemplateSpec', {
    'metadata': ('metadata', 'V1ObjectMeta'),
    'spec': ('spec', 'object'),
})
V1DeploymentSpec = _legacy('V1DeploymentSpec', {
    'selector': ('selector', 'object'),
    'template': ('template', 'V1PodTemplateSpec'),
})
V1JobSpec = _legacy('V1JobSpec', {'template': ('template', 'V1PodTemplateSpec')})
V1JobTemplateSpec = _legacy('V1JobTemplateSpec', {
    'metadata': ('metadata', 'V1ObjectMeta'),
    'spec': ('spec', 'V1JobSpec'),
})
V1CronJobSpec = _legacy('V1CronJobSpec', {
    'schedule': ('schedule', 'str'),
    'job_template': ('jobTemplate', 'V1JobTemplateSpec'),
})
V1Pod = _legacy('V1Pod', {**_ROOT, 'spec': ('spec', 'object')})
V1Deployment = _legacy('V1Deployment', {**_ROOT, 'spec': ('spec', 'V1DeploymentSpec')})
V1CronJob = _legacy('V1CronJob', {**_ROOT, 'spec': ('spec', 'V1CronJobSpec')})


def _flavour_dict() -> Flavour:
    return Flavour('dict', _make_dict, lambda obj: obj)


def _flavour_pykube() -> Flavour:
    pytest.importorskip('pykube')
    return Flavour('pykube', _make_pykube, lambda obj: obj.obj)


def _flavour_kubernetes() -> Flavour:
    return _model_flavour('kubernetes', pytest.importorskip('kubernetes.client'))


def _flavour_kubernetes_asyncio() -> Flavour:
    return _model_flavour('kubernetes_asyncio', pytest.importorskip('kubernetes_asyncio.client'))


def _flavour_legacy() -> Flavour:
    return _model_flavour('legacy-models', sys.modules[__name__])


FLAVOURS = {
    'dict': _flavour_dict,
    'pykube': _flavour_pykube,
    'kubernetes': _flavour_kubernetes,
    'kubernetes_asyncio': _flavour_kubernetes_asyncio,
    'legacy-models': _flavour_legacy,
}
MODEL_FLAVOURS = ['kubernetes', 'kubernetes_asyncio', 'legacy-models']


@pytest.fixture(params=list(FLAVOURS))
def flavour(request: pytest.FixtureRequest) -> Flavour:
    return FLAVOURS[request.param]()


@pytest.fixture(params=MODEL_FLAVOURS)
def model_flavour(request: pytest.FixtureRequest) -> Flavour:
    return FLAVOURS[request.param]()


@pytest.fixture()
def owner() -> dict[str, Any]:
    return {
        'apiVersion': 'kopf.dev/v1',
        'kind': 'KopfExample',
        'metadata': {
            'name': 'kopf-example-1',
            'namespace': 'default',
            'uid': 'uid-of-owner',
            'labels': {'somelabel': 'somevalue'},
        },
        'spec': {'field': 'value'},
    }


@pytest.fixture()
def handled(owner: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Pretend that a handler of the owner is being executed, as the core does it: via the context var."""
    token = owner_var.set(owner)
    try:
        yield owner
    finally:
        owner_var.reset(token)
