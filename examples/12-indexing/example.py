"""
Indexing: in-memory overviews of the cluster's objects, given to every handler as kwargs.

* ``@kopf.index`` declares an index: the function's name is the index's name and the kwarg's name.
* A function returns a dict to put its values under the keys of the dict, or another value
  to put it under the key ``None``. The objects' values are replaced when they change and removed
  when they are deleted (or stop matching the filters).
* The handlers look up the indices instead of listing the objects via the API: an index is a read-only
  mapping of keys to collections of values (``kopf.Index`` of ``kopf.Store``).
* The indices are filled from the initial listings before any other handler runs, and every event
  of an object updates the indices before the handlers of that same event see them.

Run it with: kopf run examples/12-indexing/example.py --verbose
"""
from typing import Any

import kopf


@kopf.index('kopfexamples')
def fields(spec: kopf.Spec, namespace: str | None, name: str | None, **_: Any) -> Any:
    """The KopfExamples by their spec.field: ``{'value': [('default', 'kopf-example-1'), ...]}``."""
    return {spec.get('field'): (namespace, name)}


@kopf.index('pods')
def pods_by_namespace(namespace: str | None, name: str | None, **_: Any) -> Any:
    """The pods' names by their namespaces: ``{'default': ['pod1', 'pod2'], ...}``."""
    return {namespace: name}


@kopf.on.create('kopfexamples')
@kopf.on.update('kopfexamples', field='spec.field')
def report_fn(
        spec: kopf.Spec,
        namespace: str | None,
        fields: kopf.Index[str, tuple[str, str]],
        pods_by_namespace: kopf.Index[str | None, str],
        logger: kopf.Logger,
        **_: Any,
) -> dict[str, Any]:
    value = spec.get('field')
    same_field = sorted(name for _, name in fields.get(value, []))
    pods = len(pods_by_namespace.get(namespace, []))
    logger.info(f'KopfExamples with field={value!r}: {same_field}; pods in the namespace: {pods}.')
    return {'same_field': same_field, 'pods': pods}  # stored in the object's status
