"""
Draw the dashboard's panels (``dashboard.json``) with real data: this example's operator under load.

It starts the Kubernetes API emulator and ``kopf run`` of ``example.py`` with the metrics on, makes
a load of KopfExamples (creations, changes, deletions; 10% of the first attempts of the handler fail),
scrapes the metrics endpoint every second, and evaluates the dashboard's own queries on the scrapes
(the few PromQL forms that the dashboard uses: ``sum by (...) (rate|increase(m[w]))``, a gauge summed
or maxed by labels, ``histogram_quantile(q, sum by (le, ...) (rate(m_bucket[w])))``). Then it draws them
into ``dashboard.png`` laid out as in Grafana. Needs matplotlib and prometheus-client.

    python examples/16-metrics/render.py [--seconds 90] [--output examples/16-metrics/dashboard.png]
"""
import argparse
import json
import math
import os
import pathlib
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
Series = dict[str, list[tuple[float, float]]]  # legend -> [(t, value)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


def scrape(url: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def call(server: str, method: str, path: str, body: Any = None, ctype: str = 'application/json') -> None:
    data = json.dumps(body).encode() if body is not None else None
    headers = {'Content-Type': ctype}
    request = urllib.request.Request(server + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10):
            pass
    except urllib.error.HTTPError:
        pass  # e.g. a deletion of an object already gone


def run_load(seconds: float, step: float = 1.0) -> list[tuple[float, Samples]]:
    """Run the emulator, the operator and the load; return the scrapes with their times."""
    import yaml
    api_port, metrics_port = free_port(), free_port()
    server = f'http://127.0.0.1:{api_port}'
    metrics_url = f'http://127.0.0.1:{metrics_port}/metrics'
    workdir = pathlib.Path(tempfile.mkdtemp())
    kubeconfig = workdir / 'kubeconfig'
    env = {**os.environ, 'KUBECONFIG': str(kubeconfig), 'EXAMPLE_METRICS_URL': metrics_url,
           'EXAMPLE_FAILURE_RATE': '0.1'}
    emulator = subprocess.Popen([sys.executable, '-m', 'kopf.testing.emulator', '--port', str(api_port),
                                 '--kubeconfig', str(kubeconfig)], env=env)
    operator = None
    try:
        _wait_for(lambda: _listening(api_port))
        call(server, 'POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions',
             yaml.safe_load((REPO / 'examples' / 'crd.yaml').read_text()))
        operator = subprocess.Popen([sys.executable, '-m', 'kopf', 'run', '-A', '--standalone',
                                     str(HERE / 'example.py')], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(lambda: _listening(metrics_port))
        sample = yaml.safe_load((REPO / 'examples' / 'obj.yaml').read_text())
        path = '/apis/kopf.dev/v1/namespaces/default/kopfexamples'
        rng = random.Random(7)
        alive: list[str] = []
        scrapes: list[tuple[float, Samples]] = []
        started = time.monotonic()
        counter = 0
        while (now := time.monotonic()) - started < seconds:
            phase = (now - started) / seconds
            creations = int(20 + 60 * math.sin(math.pi * phase) ** 2)  # a wave of load
            for _ in range(creations):
                counter += 1
                sample['metadata']['name'] = f'kex-{counter}'
                sample['spec']['field'] = rng.choice(['a', 'b', 'c'])
                call(server, 'POST', path, sample)
                alive.append(sample['metadata']['name'])
            for name in rng.sample(alive, min(len(alive), creations // 2)):
                call(server, 'PATCH', f'{path}/{name}', {'spec': {'field': rng.choice(['a', 'b', 'c'])}},
                     'application/merge-patch+json')
            if len(alive) > 300:
                for name in alive[:creations]:
                    call(server, 'DELETE', f'{path}/{name}')
                del alive[:creations]
            scrapes.append((time.monotonic() - started, scrape(metrics_url)))
            time.sleep(max(0.0, step - (time.monotonic() - now)))
        return scrapes
    finally:
        for process in [operator, emulator]:
            if process is not None:
                process.terminate()
                process.wait(timeout=30)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(('127.0.0.1', port)) == 0


def _wait_for(condition: Callable[[], bool], within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError('Not started in time.')
        time.sleep(0.1)


#
# The dashboard's queries over the scrapes.
#

_SELECTOR = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<matchers>[^}]*)\})?'
                       r'(\[(?P<window>\d+)(?P<unit>[smh])\])?$')
_FUNC = re.compile(r'^(?P<func>rate|increase)\((?P<inner>.*)\)$')
_AGG = re.compile(r'^(?P<agg>sum|max)(?: by \((?P<by>[^)]*)\))? ?\((?P<inner>.*)\)$')
_QUANTILE = re.compile(r'^histogram_quantile\((?P<q>[0-9.]+), (?P<inner>.*)\)$')


Labels = tuple[tuple[str, str], ...]


def evaluate(expr: str, scrapes: list[tuple[float, Samples]], index: int) -> dict[Labels, float]:
    """The value of the expression at the index's scrape, per label set (only the forms of the dashboard)."""
    expr = expr.replace('{resource=~"$resource"}', '')
    if match := _QUANTILE.match(expr):
        buckets = evaluate(match['inner'], scrapes, index)
        return _quantiles(float(match['q']), buckets)
    if match := _AGG.match(expr):
        inner = evaluate(match['inner'], scrapes, index)
        keys = [key.strip() for key in (match['by'] or '').split(',') if key.strip()]
        result: dict[Labels, float] = {}
        for labels, value in inner.items():
            group = tuple((key, val) for key, val in labels if key in keys)
            result[group] = (result.get(group, 0.0) + value if match['agg'] == 'sum' else
                             max(result.get(group, value), value))
        return result
    if match := _FUNC.match(expr):
        selector = _SELECTOR.match(match['inner'])
        assert selector is not None, expr
        window = int(selector['window']) * {'s': 1, 'm': 60, 'h': 3600}[selector['unit']]
        now_t, now = scrapes[index]
        then_index = max(0, next((i for i, (t, _) in enumerate(scrapes) if t >= now_t - window), 0))
        then_t, then = scrapes[then_index]
        if now_t <= then_t:
            return {}
        result = {}
        for (name, labels), value in now.items():
            if name == selector['name']:
                delta = max(0.0, value - then.get((name, labels), 0.0))
                result[labels] = delta / (now_t - then_t) if match['func'] == 'rate' else delta
        return result
    selector = _SELECTOR.match(expr)
    assert selector is not None, expr
    return {labels: value for (name, labels), value in scrapes[index][1].items() if name == selector['name']}


def _quantiles(q: float, buckets: dict[Labels, float]) -> dict[Labels, float]:
    groups: dict[Labels, list[tuple[float, float]]] = {}
    for labels, value in buckets.items():
        le = dict(labels).get('le')
        if le is None:
            continue
        group = tuple((key, val) for key, val in labels if key != 'le')
        groups.setdefault(group, []).append((float(le), value))
    result = {}
    for group, points in groups.items():
        points.sort()
        total = points[-1][1]
        if total <= 0:
            continue
        rank = q * total
        previous_le, previous_count = 0.0, 0.0
        for le, count in points:
            if count >= rank:
                if math.isinf(le):
                    result[group] = previous_le
                else:
                    spread = count - previous_count
                    fraction = (rank - previous_count) / spread if spread > 0 else 0
                    result[group] = previous_le + (le - previous_le) * fraction
                break
            previous_le, previous_count = le, count
    return result


def legend(template: str, labels: tuple[tuple[str, str], ...]) -> str:
    values = dict(labels)
    return re.sub(r'\{\{(\w+)\}\}', lambda m: values.get(m.group(1), ''), template)


def draw(dashboard: dict[str, Any], scrapes: list[tuple[float, Samples]], output: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    panels = dashboard['panels']
    rows = max(panel['gridPos']['y'] // 8 for panel in panels) + 1
    figure, axes = plt.subplots(rows, 3, figsize=(18, 4.2 * rows), facecolor='#111217')
    for panel in panels:
        ax = axes[panel['gridPos']['y'] // 8][panel['gridPos']['x'] // 8]
        ax.set_facecolor('#181b1f')
        ax.set_title(panel['title'], color='#d8d9da', fontsize=11, loc='left')
        ax.tick_params(colors='#8e8e8e', labelsize=8)
        for spine in ax.spines.values():
            spine.set_color('#2c3235')
        ax.grid(color='#2c3235', linewidth=0.5)
        series: Series = {}
        for target in panel['targets']:
            for index, (t, _) in enumerate(scrapes):
                for labels, value in evaluate(target['expr'], scrapes, index).items():
                    series.setdefault(legend(target['legendFormat'], labels), []).append((t, value))
        for name, points in sorted(series.items()):
            ax.plot([t for t, _ in points], [v for _, v in points], label=name, linewidth=1.5)
        unit = panel['fieldConfig']['defaults']['unit']
        ax.set_ylabel({'ops': 'per second', 'reqps': 'requests/s', 's': 'seconds', 'bytes': 'bytes',
                       'percentunit': 'CPU share', 'short': ''}.get(unit, unit), color='#8e8e8e', fontsize=8)
        ax.set_xlabel('seconds', color='#8e8e8e', fontsize=8)
        if series:
            ax.legend(fontsize=7, facecolor='#181b1f', edgecolor='#2c3235', labelcolor='#d8d9da',
                      loc='upper left')
    figure.suptitle(f'{dashboard["title"]}: examples/16-metrics under load against the API emulator',
                    color='#d8d9da', fontsize=14)
    figure.tight_layout(rect=(0, 0, 1, 0.97))
    figure.savefig(output, dpi=80, facecolor=figure.get_facecolor())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0] if __doc__ else None)
    parser.add_argument('--seconds', type=float, default=90)
    parser.add_argument('--output', type=pathlib.Path, default=HERE / 'dashboard.png')
    args = parser.parse_args()
    dashboard = json.loads((HERE / 'dashboard.json').read_text())
    scrapes = run_load(args.seconds)
    draw(dashboard, scrapes, args.output)
    print(f'{len(scrapes)} scrapes drawn into {args.output}')


if __name__ == '__main__':
    main()
