"""
A Kubernetes API emulator: an in-process HTTP test double of the API server, for tests without a cluster.

It is a test double of the API server, not a cluster: it stores objects and serves them by the
conventions of the Kubernetes API, so that operators and clients (the official ``kubernetes``
client, pykube-ng, kubectl, Kopf) work against it unchanged; but nothing runs containers and
no controllers reconcile anything. Users with a real cluster keep using it via ``KUBECONFIG``.

Usage: see :class:`KubernetesEmulator`; in pytest, the ``k8s_emulator`` fixture; from a shell::

    python -m kopf.testing.emulator --port 0 --kubeconfig /tmp/emulator.kubeconfig

What it does like a real API server: discovery (incl. enough of OpenAPI v3 for kubectl);
GET/LIST (label & field selectors, pagination)/WATCH (history replay, bookmarks, 410 Gone,
timeouts)/POST/PUT/PATCH (merge, JSON, strategic, apply)/DELETE (finalizers, preconditions,
collections); system metadata, ``generation``, one global ``resourceVersion``; the status
subresource; CRDs registering their resources, their schemas pruning, defaulting and validating
the objects (with ``fieldValidation``); the defaults, conversions and initial statuses of the common
built-in kinds (see :mod:`.builtins`); namespace existence & termination; admission
webhooks; Tables for ``kubectl get``; Status objects for all errors; with ``feature_gates``, the
server-side sharded lists & watches (``shardSelector``, see :mod:`kopf.testing.emulator.sharding`).

Differences from a real API server, deliberately kept for simplicity:

* No authentication or authorization: any credentials are accepted, everything is allowed
  (unless ``accept_tokens()`` limits the accepted bearer tokens, e.g. to test a rotation).
* JSON and YAML only, no protobuf: kubectl's generator commands for built-in kinds (e.g.
  ``kubectl create configmap``) send protobuf and get 415; ``kubectl apply/create -f`` work.
* The schemas of CRDs prune, default and validate the objects (see :mod:`.schemas`; their CEL
  rules with ``kopf-testing[cel]`` only, with Kubernetes' CEL libraries; the rules that cel-python
  cannot evaluate are not checked, and the log says so); all versions of
  a resource share one storage and differ only in ``apiVersion`` (no conversion webhooks).
* Strategic merge-patch merges lists by key only for well-known fields (``containers``,
  ``env``, ``ports``, ``volumes``, ``conditions``, ``finalizers``, ...); other lists are replaced.
* Server-side apply merges the applied configuration into the object; there is no field
  ownership tracking (no ``managedFields``, no conflicts).
* The cleanups that real clusters do in controllers (namespace contents, custom objects of a
  deleted CRD, garbage collection by ``ownerReferences``) happen at once, within the request
  that triggers them, and without admission. Pods are never "running": deleting one is instant.
* ``core/v1`` and ``events.k8s.io/v1`` events are stored separately.
"""

from kopf.testing.emulator.errors import ApiError
from kopf.testing.emulator.faults import RequestCounter, RequestKey
from kopf.testing.emulator.resources import ResourceInfo
from kopf.testing.emulator.server import KubernetesEmulator

__all__ = [
    'ApiError',
    'KubernetesEmulator',
    'RequestCounter',
    'RequestKey',
    'ResourceInfo',
]
