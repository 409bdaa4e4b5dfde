"""
The scale benchmark's operator: one update handler (returns a small dict, stored in the status).

The objects are pre-created as already handled (their diff-base annotation matches the spec), so
no handler is due at the start; a later change of the spec is. With ``SCALE_METRICS_PORT`` set,
the framework's metrics are served on that port (the benchmark polls them to see when every
object of the listing has been processed). With ``SCALE_CHUNK_SIZE``, the listing is paginated;
with ``SCALE_INITIAL_STREAMING=1``, it is a watch-stream's initial events (``sendInitialEvents``).
"""
import os
from typing import Any

import kopf


@kopf.on.update('kopfexamples')
def update_fn(**_: object) -> dict[str, str]:
    return {'message': 'updated'}


if os.environ.get('SCALE_CHUNK_SIZE'):  # the listing page by page (``limit``), not all at once
    @kopf.on.startup()
    def paginated(settings: Any, **_: Any) -> None:
        settings.watching.chunk_size = int(os.environ['SCALE_CHUNK_SIZE'])


if os.environ.get('SCALE_INITIAL_STREAMING') == '1':  # the listing as a watch-stream's initial events
    @kopf.on.startup()
    def streamed(settings: Any, **_: Any) -> None:
        settings.watching.initial_streaming = True


if os.environ.get('SCALE_METRICS_PORT'):
    @kopf.on.startup()
    def metered(settings: Any, **_: Any) -> None:
        settings.metrics.endpoint = f'http://127.0.0.1:{os.environ["SCALE_METRICS_PORT"]}/metrics'
