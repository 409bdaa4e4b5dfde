"""
The benchmark operator: an index of all objects (name -> spec.field), and a marker that proves it complete.

The create handler of the one ``kopfmarkers`` object may run only once every index is fully
populated (a guarantee of Kopf); it stores the index's size in the marker's status
(``status.check_fn.indexed``), so the benchmark sees when it ran and whether the index was complete.
``BENCH_INDEX=0`` runs the same operator without the index (the baseline of time and memory).
"""
import os
from collections.abc import Mapping

import kopf

WITH_INDEX = os.environ.get('BENCH_INDEX', '1') == '1'

if WITH_INDEX:
    @kopf.index('kopfexamples')
    async def by_name(name: str, spec: kopf.Spec, **_: object) -> dict[str, object]:
        return {name: spec.get('field')}


@kopf.on.create('kopfmarkers')
async def check_fn(**kwargs: object) -> dict[str, int]:
    index = kwargs.get('by_name')
    return {'indexed': len(index) if isinstance(index, Mapping) else -1}
