"""
Children: every KopfExample gets a ConfigMap of its own, owned by it (created with pykube-ng).

The ownership is what Kubernetes needs to delete the children together with their parent:
so there is no deletion handler here, and no finalizer on the KopfExamples.

Run it with: kopf run examples/02-children/example.py --verbose
"""
from typing import Any

import pykube

import kopf


def make_api() -> pykube.HTTPClient:
    # Kopf does not talk to the cluster on behalf of the handlers: use any client library.
    # This one logs in the same way as the operator: in-cluster, or with $KUBECONFIG / ~/.kube/config.
    return pykube.HTTPClient(pykube.KubeConfig.from_env())


@kopf.on.create('kopfexamples')
def create_fn(spec: kopf.Spec, name: str | None, logger: kopf.Logger, **_: Any) -> dict[str, Any]:
    data = {
        'apiVersion': 'v1',
        'kind': 'ConfigMap',
        'data': {'field': str(spec.get('field', '')), 'items': ','.join(spec.get('items', []))},
    }

    # Take the namespace & labels of the KopfExample being handled, name the child after it
    # (strict: exactly its name, no random suffix), and add the owner reference to it.
    kopf.adopt(data, strict=True)

    configmap = pykube.ConfigMap(make_api(), data)
    configmap.create()
    logger.info(f'ConfigMap {configmap.name!r} is created for {name!r}.')
    return {'children': [configmap.name]}  # stored in status.create_fn (see the CRD's printer columns)


@kopf.on.update('kopfexamples', field='spec.field')
def update_fn(new: Any, name: str | None, namespace: str | None, logger: kopf.Logger, **_: Any) -> None:
    # The child has the same name as its parent (see create_fn), so it is easy to find.
    configmap = pykube.ConfigMap.objects(make_api(), namespace=namespace).get_by_name(name)
    configmap.patch({'data': {'field': str(new)}})
    logger.info(f'ConfigMap {configmap.name!r} now has field={new!r}.')
