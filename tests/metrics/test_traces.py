"""The framework's OpenTelemetry traces, checked by the SDK's in-memory exporter in a real operator run."""
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import yaml
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import kopf
from kopf._cogs.helpers import tracing
from kopf.testing import Cluster, KopfRunner, eventually
from kopf.testing.plugin import KubeAPI

REPO = pathlib.Path(__file__).resolve().parents[2]
WAIT = 10.0
KEX = '/apis/kopf.dev/v1/namespaces/default/kopfexamples'
OPERATOR = '''
    import kopf
    from opentelemetry import trace

    @kopf.on.create('kopfexamples')
    def create_fn(retry, **_):
        context = trace.get_current_span().get_span_context()  # the handler's span: a user's spans join it
        if retry < 1:
            raise kopf.TemporaryError('not yet', delay=0.01)
        return {'trace': format(context.trace_id, '032x')}
'''


@pytest.fixture()
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    tracing.disable()


@pytest.fixture()
def cluster(k8s_api: KubeAPI) -> Cluster:
    cluster = Cluster(k8s_api.kubeconfig_path)
    cluster.apply_crd(yaml.safe_load((REPO / 'examples' / 'crd.yaml').read_text()))
    return cluster


def test_cycles_handlers_and_requests_are_spans_of_one_trace(
        cluster: Cluster, exporter: InMemorySpanExporter, tmp_path: pathlib.Path) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = kopf.OperatorSettings()
    settings.tracing.provider = provider
    path = tmp_path / 'traced_operator.py'
    path.write_text(textwrap.dedent(OPERATOR))
    with KopfRunner(['run', '-A', '--standalone', str(path)], registry=kopf.OperatorRegistry(),
                    settings=settings, timeout=WAIT) as runner:
        cluster.create(KEX, yaml.safe_load((REPO / 'examples' / 'obj.yaml').read_text()))
        obj = eventually(lambda: _handled(cluster), within=WAIT)
    assert runner.exit_code == 0, runner.output

    spans = exporter.get_finished_spans()
    handlers = [span for span in spans
                if span.name == 'kopf.handler' and span.attributes['kopf.handler.id'] == 'create_fn']
    assert [span.attributes['kopf.handler.outcome'] for span in handlers] == ['temporary', 'success']
    assert [span.attributes['kopf.handler.retry'] for span in handlers] == [0, 1]
    assert handlers[0].events and handlers[0].events[0].name == 'exception'  # recorded
    success = handlers[1]
    cycle = _parent(spans, success)
    assert cycle.name == 'kopf.process'
    assert cycle.attributes['k8s.object.name'] == 'kopf-example-1'
    assert cycle.attributes['k8s.resource'] == 'kopfexamples.kopf.dev'
    assert cycle.attributes['kopf.cause'] == 'create'
    # The handler's own context is the trace's: what the user does there joins it.
    assert obj['status']['create_fn']['trace'] == format(cycle.context.trace_id, '032x')
    # The cycle's requests (its patches) are children of the cycle, with the resource, not the object.
    requests = [span for span in spans if span.name == 'HTTP PATCH' and span.parent is not None
                and span.parent.span_id == cycle.context.span_id]
    assert requests
    assert {span.attributes['k8s.resource'] for span in requests} <= {
        'kopfexamples.kopf.dev', 'kopfexamples.kopf.dev/status'}
    assert {span.attributes['http.response.status_code'] for span in requests} == {200}


def test_no_spans_without_an_sdk_or_a_provider(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    path = tmp_path / 'plain_operator.py'
    path.write_text('import kopf\n')
    with KopfRunner(['run', '-A', '--standalone', str(path)], registry=kopf.OperatorRegistry(),
                    timeout=WAIT) as runner:
        assert tracing.tracer is None  # the global provider is the API's default: nothing would be recorded
    assert runner.exit_code == 0, runner.output


def _handled(cluster: Cluster) -> dict[str, object]:
    obj = cluster.get(f'{KEX}/kopf-example-1') or {}
    assert 'trace' in (obj.get('status') or {}).get('create_fn', {})
    return obj


def _parent(spans: tuple[ReadableSpan, ...], span: ReadableSpan) -> ReadableSpan:
    assert span.parent is not None
    [parent] = [candidate for candidate in spans if candidate.context.span_id == span.parent.span_id]
    return parent


def test_opentelemetry_is_not_imported_only_to_see_that_nothing_is_configured() -> None:
    # The operator's start asks whether an SDK is configured: not by importing opentelemetry (~1 MB, ~30 ms).
    code = ('import sys, kopf; from kopf._core.reactor.running import _enable_tracing; '
            'print(_enable_tracing(kopf.OperatorSettings()), "opentelemetry" in sys.modules)')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == 'False False', result.stderr
