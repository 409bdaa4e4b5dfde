"""
Metrics & traces: the framework's Prometheus metrics at an endpoint, the operator's own beside them.

* ``settings.metrics.endpoint`` (or ``kopf run --metrics URL``) serves the framework's metrics: handler
  calls by outcome and their durations, the queue, the objects, the API requests (see the README).
  It needs prometheus-client: ``pip install "kopf[metrics]"``.
* The operator's own metrics go to the same registry (prometheus-client's global one by default), and
  are counted per handled change, not per attempt: after the work that can fail.
* ``dashboard.json`` is a Grafana dashboard over these metrics; ``render.py`` draws its panels with real
  data from this operator under load against the emulator (``dashboard.png``).

Run it with: kopf run examples/16-metrics/example.py --verbose   (then: curl http://127.0.0.1:9090/metrics)
"""
import os
import random
from typing import Any

import prometheus_client

import kopf

# Counted once per handled object: the handler may be retried, but this line runs after what can fail.
PROVISIONED = prometheus_client.Counter('example_provisioned', 'KopfExamples provisioned.', ['field'])


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.metrics.endpoint = os.environ.get('EXAMPLE_METRICS_URL', 'http://127.0.0.1:9090/metrics')


@kopf.on.create('kopfexamples')
@kopf.on.update('kopfexamples', field='spec')
def provision(spec: kopf.Spec, retry: int, **_: Any) -> dict[str, Any]:
    if retry == 0 and random.random() < float(os.environ.get('EXAMPLE_FAILURE_RATE', '0')):
        raise kopf.TemporaryError('The backend is busy; retrying.', delay=0.5)
    PROVISIONED.labels(field=str(spec.get('field'))).inc()  # low-cardinality values only (not names)
    return {'provisioned': True}


@kopf.on.delete('kopfexamples')
def deprovision(**_: Any) -> None:
    pass
