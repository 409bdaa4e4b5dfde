"""
The framework's Prometheus metrics: served by ``kopf run --metrics URL`` and scraped during a real
operator run against the emulator; their counts, histograms and text format; their bad input.
"""
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import kopf
from kopf._cogs.helpers import metering
from kopf.testing import Cluster, KopfRunner, eventually
from kopf.testing.plugin import KubeAPI

REPO = pathlib.Path(__file__).resolve().parents[2]
WAIT = 10.0
OPERATOR = '''
    import kopf

    attempts = {}

    @kopf.on.create('kopfexamples', backoff=0.01)
    def create_fn(name, retry, **_):
        if retry < 2:
            raise kopf.TemporaryError('not yet', delay=0.01)
        return {'attempts': retry + 1}
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of the endpoint: (name, sorted labels) -> value; checks the content type too."""
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        assert response.headers['Content-Type'].startswith('text/plain; version=')  # Prometheus' text format
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    return samples.get((metric, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(autouse=True)
def _metrics_off_afterwards() -> Iterator[None]:
    yield
    metering.disable()


@pytest.fixture()
def cluster(k8s_api: KubeAPI) -> Cluster:
    cluster = Cluster(k8s_api.kubeconfig_path)
    cluster.apply_crd(yaml.safe_load((REPO / 'examples' / 'crd.yaml').read_text()))
    return cluster


@pytest.fixture()
def operator_path(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / 'metered_operator.py'
    path.write_text(textwrap.dedent(OPERATOR))
    return path


def test_handler_calls_are_counted_by_outcome_per_attempt_and_per_change(
        cluster: Cluster, operator_path: pathlib.Path) -> None:
    url = f'http://127.0.0.1:{free_port()}/metrics'
    args = ['run', '-A', '--standalone', f'--metrics={url}', str(operator_path)]
    with KopfRunner(args, registry=kopf.OperatorRegistry(), timeout=WAIT) as runner:
        sample = yaml.safe_load((REPO / 'examples' / 'obj.yaml').read_text())
        cluster.create('/apis/kopf.dev/v1/namespaces/default/kopfexamples', sample)

        def handled() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            samples = scrape(url)
            assert value(samples, 'kopf_changes_handled_total', resource='kopfexamples.kopf.dev',
                         reason='create') == 1
            return samples

        samples = eventually(handled, within=WAIT)
        cluster.delete('/apis/kopf.dev/v1/namespaces/default/kopfexamples/kopf-example-1')

    assert runner.exit_code == 0, runner.output
    assert f'Serving the metrics at {url}' in runner.output
    kex = {'resource': 'kopfexamples.kopf.dev', 'handler': 'create_fn'}
    # One handler that fails twice, then succeeds: three calls, two temporary outcomes, one change handled.
    assert value(samples, 'kopf_handler_calls_total', **kex, outcome='temporary') == 2
    assert value(samples, 'kopf_handler_calls_total', **kex, outcome='success') == 1
    assert value(samples, 'kopf_handler_retries_total', **kex) == 2
    assert value(samples, 'kopf_handler_duration_seconds_count', **kex) == 3
    assert value(samples, 'kopf_handler_duration_seconds_bucket', **kex, le='+Inf') == 3
    # The queue and the API client: no object names in the labels, only the resources.
    assert value(samples, 'kopf_workqueue_adds_total', resource='kopfexamples.kopf.dev') >= 3
    waits = value(samples, 'kopf_workqueue_queue_duration_seconds_count', resource='kopfexamples.kopf.dev')
    assert waits >= 3
    assert value(samples, 'kopf_objects', resource='kopfexamples.kopf.dev', state='known') == 1
    # The results go to /status if the CRD has the subresource (the shared API server's CRD may have none).
    assert sum(value(samples, 'kopf_rest_client_requests_total', verb='PATCH', resource=resource, code='200')
               for resource in ['kopfexamples.kopf.dev', 'kopfexamples.kopf.dev/status']) >= 2
    assert value(samples, 'kopf_rest_client_requests_total', verb='WATCH',
                 resource='kopfexamples.kopf.dev', code='200') >= 1
    assert not [labels for (_, labels) in samples for key, val in labels if 'kopf-example-1' in val]
    # The port is released and the metrics are off when the operator exits.
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=WAIT)
    assert metering.meters is None


def test_a_scrape_restricted_by_names_renders_only_those(
        cluster: Cluster, operator_path: pathlib.Path) -> None:
    url = f'http://127.0.0.1:{free_port()}/metrics'
    args = ['run', '-A', '--standalone', f'--metrics={url}', str(operator_path)]
    names = ['kopf_objects', 'kopf_workqueue_depth', 'kopf_handler_calls_total']
    query = '&'.join(f'name[]={name}' for name in names)
    with KopfRunner(args, registry=kopf.OperatorRegistry(), timeout=WAIT) as runner:
        sample = yaml.safe_load((REPO / 'examples' / 'obj.yaml').read_text())
        cluster.create('/apis/kopf.dev/v1/namespaces/default/kopfexamples', sample)

        def handled() -> Samples:
            samples = scrape(url)
            assert value(samples, 'kopf_handler_calls_total', resource='kopfexamples.kopf.dev',
                         handler='create_fn', outcome='success') == 1
            return samples

        full = eventually(handled, within=WAIT)
        restricted = scrape(f'{url}?{query}')
        cluster.delete('/apis/kopf.dev/v1/namespaces/default/kopfexamples/kopf-example-1')

    assert runner.exit_code == 0, runner.output
    assert {name for name, _ in restricted} == set(names)  # the gauges of the state among them
    assert {name for name, _ in full} > set(names)  # e.g. the histograms, not rendered when restricted
    assert value(restricted, 'kopf_handler_calls_total', resource='kopfexamples.kopf.dev',
                 handler='create_fn', outcome='success') == 1


def test_metrics_share_the_liveness_endpoints_port(cluster: Cluster, operator_path: pathlib.Path) -> None:
    port = free_port()
    args = ['run', '-A', '--standalone', f'--liveness=http://127.0.0.1:{port}/healthz',
            f'--metrics=http://127.0.0.1:{port}/metrics', str(operator_path)]
    with KopfRunner(args, registry=kopf.OperatorRegistry(), timeout=WAIT) as runner:
        samples = scrape(f'http://127.0.0.1:{port}/metrics')
        with urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=WAIT) as response:
            assert response.status == 200
    assert runner.exit_code == 0, runner.output
    assert ('kopf_objects', (('resource', 'kopfexamples.kopf.dev'), ('state', 'known'))) in samples


def test_users_metrics_join_on_the_same_registry(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    path = tmp_path / 'own_metrics.py'
    path.write_text(textwrap.dedent('''
        import kopf
        import prometheus_client

        @kopf.on.startup()
        def configure(settings, memo, **_):
            settings.metrics.registry = prometheus_client.CollectorRegistry()
            registry = settings.metrics.registry
            memo.widgets = prometheus_client.Counter('widgets', 'Widgets made.', registry=registry)

        @kopf.on.create('kopfexamples')
        def create_fn(memo, **_):
            memo.widgets.inc()
    '''))
    url = f'http://127.0.0.1:{free_port()}/metrics'
    args = ['run', '-A', '--standalone', f'--metrics={url}', str(path)]
    with KopfRunner(args, registry=kopf.OperatorRegistry(), timeout=WAIT) as runner:
        sample = yaml.safe_load((REPO / 'examples' / 'obj.yaml').read_text())
        sample['metadata']['name'] = 'kex-widgets'
        cluster.create('/apis/kopf.dev/v1/namespaces/default/kopfexamples', sample)
        samples = eventually(lambda: _with_widgets(scrape(url)), within=WAIT)
        cluster.delete('/apis/kopf.dev/v1/namespaces/default/kopfexamples/kex-widgets')
    assert runner.exit_code == 0, runner.output
    assert ('kopf_objects', (('resource', 'kopfexamples.kopf.dev'), ('state', 'known'))) in samples


def _with_widgets(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[
        tuple[str, tuple[tuple[str, str], ...]], float]:
    assert samples.get(('widgets_total', ())) == 1
    return samples


@pytest.mark.parametrize('url, problem', [
    ('127.0.0.1:9090/metrics', 'the scheme is missing'),
    ('https://127.0.0.1:9090/metrics', 'https:// is not supported'),
    ('http://127.0.0.1/metrics', 'the port is missing'),
])
def test_bad_urls_are_explained_in_one_line(url: str, problem: str) -> None:
    result = subprocess.run([sys.executable, '-m', 'kopf', 'run', f'--metrics={url}'],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    [line] = [line for line in result.stderr.splitlines() if 'metrics' in line]
    assert problem in line and 'Expected: http://HOST:PORT/PATH' in line


def test_a_busy_port_is_explained_in_one_line(cluster: Cluster, operator_path: pathlib.Path) -> None:
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        url = f'http://127.0.0.1:{port}/metrics'
        args = ['run', '-A', '--standalone', f'--metrics={url}', str(operator_path)]
        with KopfRunner(args, registry=kopf.OperatorRegistry(), timeout=WAIT, reraise=False) as runner:
            pass
    assert runner.exit_code == 1
    assert f'Cannot serve the metrics endpoint at 127.0.0.1:{port}' in runner.output


def test_without_prometheus_client_the_option_says_what_to_install() -> None:
    code = ('import sys; sys.modules["prometheus_client"] = None; '
            'from kopf._cli.commands import main; main(["run", "--metrics=http://127.0.0.1:0/metrics"])')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert 'The metrics need prometheus-client, which is not installed: pip install "kopf[metrics]"' \
           in result.stderr


def test_without_the_option_nothing_is_imported_or_measured(tmp_path: pathlib.Path) -> None:
    code = ('import sys, kopf; from kopf._core.reactor import running; '
            'from kopf._cogs.helpers import metering; '
            'print("prometheus_client" in sys.modules, metering.meters)')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == 'False None', result.stderr


@pytest.mark.parametrize('path, expected', [
    ('/api/v1/namespaces/ns1/configmaps/cm1', 'configmaps'),
    ('/api/v1/namespaces/ns1/configmaps', 'configmaps'),
    ('/api/v1/namespaces', 'namespaces'),
    ('/api/v1/namespaces/ns1', 'namespaces'),
    ('/apis/kopf.dev/v1/namespaces/ns1/kopfexamples/kex1/status', 'kopfexamples.kopf.dev/status'),
    ('/apis/kopf.dev/v1/kopfexamples', 'kopfexamples.kopf.dev'),
    ('/apis/kopf.dev/v1/clusterkopfpeerings/default', 'clusterkopfpeerings.kopf.dev'),
    ('/apis/kopf.dev/v1', 'discovery'),
    ('/api/v1', 'discovery'),
    ('/version', 'other'),
    ('/api/v1/namespaces/ns1/pods?watch=true', 'pods'),
])
def test_paths_are_reduced_to_resources(path: str, expected: str) -> None:
    assert metering.resource_of_path(path) == expected


_NAMED = re.compile(r'^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))(?P<rest>/.*)?$')


def _resource_by_regex(path: str) -> str:
    # The general reading of a path (by the URL's grammar), of which resource_of_path() is a cheaper twin.
    match = _NAMED.match(path.split('?', 1)[0])
    if match is None:
        return 'other'
    parts = [part for part in (match.group('rest') or '').split('/') if part]
    if parts[:1] == ['namespaces'] and len(parts) >= 3:
        parts = parts[2:]
    if not parts:
        return 'discovery'
    name = f'{parts[0]}.{match.group("group")}' if match.group('group') else parts[0]
    return f'{name}/{parts[2]}' if len(parts) >= 3 else name


_SEGMENTS = st.sampled_from(['', 'api', 'apis', 'v1', 'kopf.dev', 'namespaces', 'ns1', 'kex1', 'status',
                             'configmaps', '?watch=true', 'a?b'])


@hypothesis.given(st.lists(_SEGMENTS, max_size=8), st.sampled_from(['/', '', '//']))
def test_path_reduction_is_the_general_one(segments: list[str], lead: str) -> None:
    path = lead + '/'.join(segments)
    assert metering.resource_of_path(path) == _resource_by_regex(path)


def test_children_are_remembered_and_counted() -> None:
    registry = CollectorRegistry()
    meters = metering.Meters(registry)
    try:
        first = meters.child(meters.requests, 'GET', 'pods', '200')
        assert meters.child(meters.requests, 'GET', 'pods', '200') is first
        assert meters.child(meters.requests, 'GET', 'pods', '404') is not first
        for _ in range(3):
            meters.child(meters.requests, 'GET', 'pods', '200').inc()
        assert registry.get_sample_value('kopf_rest_client_requests_total',
                                         {'verb': 'GET', 'resource': 'pods', 'code': '200'}) == 3
    finally:
        meters.unregister()


def test_lease_and_handling_gauges(cluster: Cluster, operator_path: pathlib.Path) -> None:
    url = f'http://127.0.0.1:{free_port()}/metrics'
    args = ['run', '-A', '--lease', 'default/metered', f'--metrics={url}', str(operator_path)]
    with KopfRunner(args, registry=kopf.OperatorRegistry(), timeout=WAIT) as runner:
        def leading() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            samples = scrape(url)
            assert value(samples, 'kopf_leader_election_master_status', name='default/metered') == 1
            assert value(samples, 'kopf_handling_paused') == 0
            return samples

        eventually(leading, within=WAIT)
    assert runner.exit_code == 0, runner.output


def test_seats_and_requests_in_flight_are_gauged(k8s_emulator: Any) -> None:
    # Whether the framework's own steps or the API server hold the objects back: the seats taken, the objects
    # waiting for one (the workqueue's depth), the requests in flight. The emulator delays the responses.
    cluster = Cluster(k8s_emulator.kubeconfig_path)
    cluster.apply_crd(yaml.safe_load((REPO / 'examples' / 'crd.yaml').read_text()))
    registry = kopf.OperatorRegistry()
    release = threading.Event()
    kex = {'resource': 'kopfexamples.kopf.dev'}

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.queueing.processing_seats = 2
        settings.execution.lending_delay = 3600  # the handlers keep their objects' seats
        settings.posting.enabled = False

    @kopf.on.create('kopfexamples', registry=registry)
    def create_fn(**_: Any) -> None:
        release.wait(WAIT)

    url = f'http://127.0.0.1:{free_port()}/metrics'
    args = ['run', '-A', '--standalone', f'--metrics={url}']
    with KopfRunner(args, registry=registry, timeout=WAIT) as runner:
        for index in range(3):
            body = {'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': f'kex{index}'}}
            cluster.create('/apis/kopf.dev/v1/namespaces/default/kopfexamples', body)

        def seated() -> None:  # two objects in their handlers, the third one waits for a seat
            samples = scrape(url)
            assert value(samples, 'kopf_processing_seats', state='taken') == 2
            assert value(samples, 'kopf_processing_seats', state='free') == 0
            assert samples[('kopf_processing_reserve_used', ())] == 0  # no request waits for a slot
            assert value(samples, 'kopf_workqueue_depth', **kex) == 1
            assert value(samples, 'kopf_rest_client_requests_in_flight') == 0

        eventually(seated, within=WAIT)
        k8s_emulator.add_latency(WAIT, method='PATCH', after_applying=True, count=2)  # the next two responses
        release.set()

        def in_flight() -> None:  # the two results' patches wait for the server (the seats are not lent)
            samples = scrape(url)
            assert value(samples, 'kopf_rest_client_requests_in_flight') == 2
            assert value(samples, 'kopf_rest_client_requests_waiting') == 0
            assert value(samples, 'kopf_processing_seats', state='taken') == 2
            assert value(samples, 'kopf_workqueue_depth', **kex) == 1

        eventually(in_flight, within=WAIT)
        k8s_emulator.clear_faults()
    assert runner.exit_code == 0, runner.output


async def test_admission_reviews_are_counted_by_webhook_and_outcome() -> None:
    import prometheus_client

    from kopf._core.engines.admission import serve_admission_request
    from kopf._core.reactor.observation import Insights

    registry = kopf.OperatorRegistry()

    @kopf.on.validate('kopfexamples', id='check', registry=registry)
    def check(spec: kopf.Spec, **_: object) -> None:
        if spec.get('bad'):
            raise kopf.AdmissionError('bad')

    meters = metering.enable(prometheus_client.CollectorRegistry())
    insights = Insights()
    insights.webhook_resources.add(kopf.Resource('kopf.dev', 'v1', 'kopfexamples', namespaced=True))
    insights.ready_resources.set()
    for bad in [False, True, True]:
        request = {'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview', 'request': {
            'uid': 'u1', 'operation': 'CREATE', 'userInfo': {}, 'dryRun': False,
            'kind': {'group': 'kopf.dev', 'version': 'v1', 'kind': 'KopfExample'},
            'resource': {'group': 'kopf.dev', 'version': 'v1', 'resource': 'kopfexamples'},
            'object': {'metadata': {'name': 'kex1', 'namespace': 'ns1'}, 'spec': {'bad': bad}}}}
        await serve_admission_request(request, webhook='check', registry=registry,
                                      settings=kopf.OperatorSettings(), insights=insights)
    text = prometheus_client.generate_latest(meters.registry).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert value(samples, 'kopf_admission_reviews_total', webhook='check', outcome='allowed') == 1
    assert value(samples, 'kopf_admission_reviews_total', webhook='check', outcome='denied') == 2
    assert value(samples, 'kopf_admission_review_duration_seconds_count', webhook='check') == 3


SPAWNING_OPERATOR = '''
    import time
    import kopf

    @kopf.timer('kopfexamples', interval=0.2)
    async def ticking(**_):
        pass

    @kopf.timer('kopfexamples', interval=0.05, sharp=True)
    def slow(**_):
        time.sleep(0.3)  # longer than its interval: the ticks meanwhile are missed

    @kopf.daemon('kopfexamples')
    async def watching(stopped, **_):
        await stopped.wait()
'''


def test_timers_and_daemons_are_measured(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    path = tmp_path / 'spawning_operator.py'
    path.write_text(textwrap.dedent(SPAWNING_OPERATOR))
    url = f'http://127.0.0.1:{free_port()}/metrics'
    args = ['run', '-A', '--standalone', f'--metrics={url}', str(path)]
    kex = {'resource': 'kopfexamples.kopf.dev'}
    with KopfRunner(args, registry=kopf.OperatorRegistry(), timeout=WAIT) as runner:
        sample = yaml.safe_load((REPO / 'examples' / 'obj.yaml').read_text())
        cluster.create('/apis/kopf.dev/v1/namespaces/default/kopfexamples', sample)

        def ticked() -> Samples:
            samples = scrape(url)
            assert value(samples, 'kopf_timer_ticks_total', **kex, handler='ticking') >= 3
            assert value(samples, 'kopf_timer_ticks_total', **kex, handler='slow') >= 3
            assert value(samples, 'kopf_timer_missed_ticks_total', **kex, handler='slow') >= 1
            assert value(samples, 'kopf_daemons_running', **kex) == 1
            return samples

        samples = eventually(ticked, within=WAIT)
        timers = sum(value(samples, 'kopf_timers', **kex, state=state) for state in ['scheduled', 'running'])
        cluster.delete('/apis/kopf.dev/v1/namespaces/default/kopfexamples/kopf-example-1')

        def stopped() -> None:
            assert value(scrape(url), 'kopf_daemons_running', **kex) == 0

        eventually(stopped, within=WAIT)

    assert runner.exit_code == 0, runner.output
    assert timers == 2  # the object's two timers: each either waiting for its deadline or running
    ticks = sum(value(samples, 'kopf_timer_ticks_total', **kex, handler=handler)
                for handler in ['ticking', 'slow'])
    assert value(samples, 'kopf_timer_lateness_seconds_count', **kex) == ticks
    # The quick timer's calls start on time (by its interval after the previous one): none missed.
    assert value(samples, 'kopf_timer_missed_ticks_total', **kex, handler='ticking') == 0


@hypothesis.given(st.lists(st.tuples(st.sampled_from(['a', 'b']), st.floats(0, 100)), max_size=30),
                  st.lists(st.sampled_from(['x', 'y', 'z']), max_size=30))
def test_instruments_expose_as_prometheus_clients_own(observations: list[tuple[str, float]],
                                                      increments: list[str]) -> None:
    # The framework's lock-free instruments against prometheus-client's Counter & Histogram: the same text.
    import prometheus_client
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    buckets = (0.001, 0.5, 1.0, 2.5, 10.0, 60.0)
    our_histogram = metering.Histogram('h_seconds', 'H.', ['k'], buckets=buckets, registry=ours)
    our_counter = metering.Counter('c', 'C.', ['k'], registry=ours)
    our_plain = metering.Counter('p', 'P.', registry=ours)
    their_histogram = prometheus_client.Histogram('h_seconds', 'H.', ['k'], buckets=buckets, registry=theirs)
    their_counter = prometheus_client.Counter('c', 'C.', ['k'], registry=theirs)
    their_plain = prometheus_client.Counter('p', 'P.', registry=theirs)
    for key, amount in observations:
        our_histogram.labels(key).observe(amount)
        their_histogram.labels(key).observe(amount)
    for key in increments:
        our_counter.labels(key).inc()
        their_counter.labels(key).inc()
        our_plain.inc(2)
        their_plain.inc(2)

    def text(registry: CollectorRegistry) -> list[str]:
        lines = prometheus_client.generate_latest(registry).decode().splitlines()
        return sorted(line for line in lines if '_created' not in line)

    assert text(ours) == text(theirs)


SHARDED_OPERATOR = '''
    import kopf

    @kopf.on.startup()
    def configure(settings, **_):
        settings.sharding.count = 4
        settings.sharding.lease_duration = 2
        settings.sharding.renew_deadline = 1.2
        settings.sharding.retry_period = 0.2
        settings.sharding.handover_timeout = 2
        settings.posting.enabled = False

    @kopf.on.create('kopfexamples')
    def create_fn(**_):
        pass
'''


def liveness(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        assert response.status == 200
        return json.loads(response.read())  # type: ignore[no-any-return]


def test_shards_are_measured_and_reported_by_the_liveness_of_each_replica(
        cluster: Cluster, tmp_path: pathlib.Path) -> None:
    # Two real replicas: this process's one (the metrics are per process) and a `kopf run` subprocess.
    path = tmp_path / 'sharded_operator.py'
    path.write_text(textwrap.dedent(SHARDED_OPERATOR))
    ports = [free_port(), free_port()]
    metrics = [f'http://127.0.0.1:{port}/metrics' for port in ports]
    probes = [f'http://127.0.0.1:{port}/healthz' for port in ports]
    name = {'name': 'default/metered'}

    def args(index: int) -> list[str]:
        return ['run', '-n', 'default', '--shards', 'default/metered', f'--metrics={metrics[index]}',
                f'--liveness={probes[index]}', str(path)]

    with KopfRunner(args(0), registry=kopf.OperatorRegistry(), timeout=WAIT) as runner:
        def alone() -> None:
            samples = scrape(metrics[0])
            assert value(samples, 'kopf_shards_held', **name) == 4
            assert value(samples, 'kopf_shard_members', **name) == 1
            assert value(samples, 'kopf_shard_handovers_total', **name, direction='taken') == 4
            report = liveness(probes[0])['kopf.sharding']
            assert isinstance(report, dict) and report.pop('identity')
            assert report == {'name': 'default/metered', 'count': 4, 'shards': [0, 1, 2, 3],
                              'giving_up': [], 'members': 1, 'share': 4}

        eventually(alone, within=WAIT)

        env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig_path))
        with open(tmp_path / 'other.log', 'w') as output:
            other = subprocess.Popen([sys.executable, '-m', 'kopf', *args(1)], env=env,
                                     stdout=output, stderr=subprocess.STDOUT)
        try:
            def split() -> tuple[Samples, Samples, list[Any]]:
                try:
                    ours, theirs = scrape(metrics[0]), scrape(metrics[1])
                    reports = [liveness(url)['kopf.sharding'] for url in probes]
                except urllib.error.URLError as e:  # the subprocess is not serving (or not ready) yet
                    raise AssertionError(str(e)) from None
                assert [value(samples, 'kopf_shards_held', **name) for samples in [ours, theirs]] == [2, 2]
                assert [value(samples, 'kopf_shard_members', **name) for samples in [ours, theirs]] == [2, 2]
                assert [report['members'] for report in reports] == [2, 2]
                assert sorted(reports[0]['shards'] + reports[1]['shards']) == [0, 1, 2, 3]
                return ours, theirs, reports

            ours, theirs, reports = eventually(split, within=WAIT * 2)
            assert value(ours, 'kopf_shard_handovers_total', **name, direction='given') == 2
            assert value(theirs, 'kopf_shard_handovers_total', **name, direction='taken') == 2
            assert reports[0]['identity'] != reports[1]['identity']
            other.send_signal(signal.SIGTERM)  # a graceful exit: its shards are released, ours take them
            assert other.wait(WAIT * 2) == 0, (tmp_path / 'other.log').read_text()

            def back() -> None:
                samples = scrape(metrics[0])
                assert value(samples, 'kopf_shards_held', **name) == 4
                assert value(samples, 'kopf_shard_members', **name) == 1
                assert value(samples, 'kopf_shard_handovers_total', **name, direction='taken') == 6

            eventually(back, within=WAIT)
        finally:
            if other.poll() is None:
                other.kill()
                other.wait(WAIT)
    assert runner.exit_code == 0, runner.output
