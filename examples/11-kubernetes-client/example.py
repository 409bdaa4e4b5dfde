"""
The official Kubernetes client in the handlers: a KopfExample gets a Pod, created with ``kubernetes``.

Kopf itself does not create or modify other objects: the handlers use any API client for that.
The official client is synchronous, so the handlers are synchronous too: Kopf runs them in threads.
The client is configured once, on startup, with the same credentials as the operator itself.

Run it with: kopf run examples/11-kubernetes-client/example.py --verbose
"""
# The client's configuration functions have no type annotations (unlike its models and APIs):
# mypy: disable-error-code="no-untyped-call"
import os
from typing import Any

import kubernetes

import kopf


@kopf.on.startup()
def configure_client(logger: kopf.Logger, **_: Any) -> None:
    try:
        kubernetes.config.load_incluster_config()  # inside a cluster: the pod's service account
    except kubernetes.config.ConfigException:
        # Outside: $KUBECONFIG or ~/.kube/config, as for Kopf. The variable is read here explicitly:
        # the client remembers it when imported, which can be too early (e.g. in tests).
        kubernetes.config.load_kube_config(config_file=os.environ.get('KUBECONFIG'))
    logger.info('The kubernetes client is configured.')


@kopf.on.create('kopfexamples')
def create_fn(spec: kopf.Spec, namespace: str, logger: kopf.Logger, **_: Any) -> dict[str, Any]:
    container = kubernetes.client.V1Container(name='main', image='busybox', command=['sleep', '3600'])
    pod = kubernetes.client.V1Pod(
        metadata=kubernetes.client.V1ObjectMeta(annotations={'kopf.dev/field': str(spec.get('field'))}),
        spec=kubernetes.client.V1PodSpec(containers=[container]),
    )

    # kopf.adopt() works with the client's models too: the namespace & labels of the KopfExample,
    # a name generated from its name (with a random suffix), the owner reference.
    kopf.adopt(pod)

    created = kubernetes.client.CoreV1Api().create_namespaced_pod(namespace=namespace, body=pod)
    assert created.metadata is not None  # always present in the objects returned by the API
    logger.info(f'Pod {created.metadata.name!r} is created.')
    return {'children': [created.metadata.name]}


@kopf.on.update('kopfexamples', field='spec.field')
def update_fn(new: Any, status: kopf.Status, namespace: str, logger: kopf.Logger, **_: Any) -> None:
    api = kubernetes.client.CoreV1Api()
    for name in status.get('create_fn', {}).get('children', []):  # the result of create_fn
        api.patch_namespaced_pod(name=name, namespace=namespace,
                                 body={'metadata': {'annotations': {'kopf.dev/field': str(new)}}})
        logger.info(f'Pod {name!r} is annotated with field={new!r}.')
