"""
Built-in resources: the handlers work for ConfigMaps, Pods, etc. the same way as for custom ones.

This operator keeps a checksum of every ConfigMap's data in its annotation (e.g. to restart the pods
that use the ConfigMap when its data changes). Only the ConfigMaps labelled ``kopf.dev/checksum``
are served: an operator should not touch the objects that other tools own.

Run it with: kopf run examples/07-builtins/example.py --verbose
Then: kubectl apply -f examples/07-builtins/configmap.yaml
"""
import hashlib
import json
from typing import Any

import kopf

SELECTED = {'kopf.dev/checksum': kopf.PRESENT}
ANNOTATION = 'kopf.dev/data-checksum'


@kopf.on.create('configmaps', labels=SELECTED)
@kopf.on.update('configmaps', labels=SELECTED, field='data')  # our own annotation is not a reason
def checksum_fn(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any) -> None:
    data = json.dumps(body.get('data', {}), sort_keys=True)
    checksum = hashlib.sha256(data.encode()).hexdigest()

    # Built-in resources have no place for the handlers' results (the ConfigMaps have no status):
    # instead of returning a result, patch the object. Kopf applies the patch after the handler.
    patch.metadata.annotations[ANNOTATION] = checksum
    logger.info(f'The data checksum is {checksum}.')

