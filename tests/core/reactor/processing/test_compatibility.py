"""
Compatibility with Kopf 1.45.2: the same scenarios, the same logs, the same objects in the end.

The scenarios were captured from the original Kopf on our emulator (see ``tools/compat``):
the operator's code, the objects before and after, the requests (the scenario's own steps among them),
and the object-related logs. Here, the same operator's code is registered into our registry,
the same objects are created, the same steps are made, and our processing must log the same
messages (except the patching details: we patch less often) and leave the objects the same.

Also, the objects as Kopf has left them must look handled to our processing: nothing is called again.
"""
import ast
import json
import logging
import pathlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kopf._core.intents import registries
from kopf._core.intents.configuration import OperatorSettings
from kopf._core.intents.handlers import Activity
from kopf._core.intents.registries import OperatorRegistry

FIXTURES = pathlib.Path(__file__).parents[2] / 'persistence' / 'fixtures' / 'kopf-1.45.2'

# All but those with retries after long delays, with many long handler ids (slow to replay),
# and with the verbose progress storage (Kopf stalls there: see test_continuity.py).
SCENARIOS = [
    'create-single',
    'create-several',
    'permanent-error',
    'subhandlers',
    'field-handler',
    'update',
    'delete',
    'delete-foreign-finalizer',
    'diffbase-only-changed',
    'diffbase-only-same',
    'foreign-kopf-annotations',
    'status-progress',
    'status-diffbase',
    'custom-prefix',
    'multi-progress',
    'smart-reads-status',
]
SYSTEM_FIELDS = ('uid', 'creationTimestamp', 'generation', 'resourceVersion', 'deletionTimestamp',
                 'deletionGracePeriodSeconds')
BODY_DUMP = re.compile(r'^(?P<head>\S[^:]* is in progress): \{.*\}$', re.DOTALL)
SECONDS = re.compile(r'\d+(\.\d+)? seconds')
DIFF = re.compile(r'^(?P<head>.*(?:diff:|DIFF) )(?P<diff>\(.*\))$')
PATCHING = ('Merge-patching the ', 'JSON-patching the ')


def load(name: str) -> dict[str, Any]:
    fixture: dict[str, Any] = json.loads((FIXTURES / f'{name}.json').read_text())
    return fixture


def arrangeable(obj: dict[str, Any]) -> dict[str, Any]:
    """The fields of a captured object that can be created anew (without the system ones)."""
    metadata = {key: value for key, value in obj['metadata'].items() if key not in SYSTEM_FIELDS}
    return {key: value for key, value in obj.items() if key not in ('apiVersion', 'kind')} | {
        'metadata': metadata}


def comparable(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    return arrangeable(obj)


def normalized(line: str) -> str:
    """A log line without what differs from run to run: the bodies, the seconds, the diffs' order."""
    dumped = BODY_DUMP.match(line)
    if dumped:
        line = dumped.group('head') + ': <body>'
    line = SECONDS.sub('<N> seconds', line)
    diffed = DIFF.match(line)
    if diffed:  # the order of the diff's items is not guaranteed (nor needed)
        items = sorted(repr(item) for item in ast.literal_eval(diffed.group('diff')))
        line = diffed.group('head') + ', '.join(items)
    return line


def kopf_lines(fixture: dict[str, Any]) -> list[str]:
    lines = []
    for line in fixture['log']:
        level, _, message = line.partition(' ')
        message = message.split('] ', 1)[1]  # without the object's prefix
        message = message.split('  (+', 1)[0]  # without the tracebacks' markers
        if not message.startswith(PATCHING):
            lines.append(f'{level} {normalized(message)}')
    return lines


@pytest.fixture
def use_registry(registry: OperatorRegistry, settings: OperatorSettings,
                 ) -> Iterator[Callable[[dict[str, Any]], None]]:
    """Register the operator's code of a scenario into the test's registry; configure the settings."""
    original = registries.get_default_registry()

    def register(fixture: dict[str, Any]) -> None:
        registries.set_default_registry(registry)
        exec('import kopf\n' + '\n'.join(fixture['operator']), {})
        for handler in registry.activities.get_handlers(Activity.STARTUP):
            handler.fn(settings=settings, logger=logging.getLogger('startup'), memo=None)

    try:
        yield register
    finally:
        registries.set_default_registry(original)


@pytest.mark.parametrize('name', SCENARIOS)
async def test_same_logs_and_objects(
        name: str, use_registry: Callable[[dict[str, Any]], None], operator: Any, cluster: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    fixture = load(name)
    use_registry(fixture)
    await cluster.create(**arrangeable(fixture['objects']['kex1']['before']))

    # Kopf has seen the object in the initial listing; then, the scenario's steps are made.
    await operator.settle(first=None)
    for request in fixture['requests']:
        if request['actor'] == 'script':
            await cluster.request(request['method'], request['path'], request['body'],
                                  content_type=request['content_type'] or 'application/json')
            await operator.settle(first='MODIFIED')

    ours = [f'[{record.levelname}] {normalized(record.getMessage())}'
            for record in caplog.records if record.name == 'kopf.objects'
            and not record.getMessage().startswith(PATCHING)]
    assert ours == kopf_lines(fixture)
    assert comparable(cluster.get()) == comparable(fixture['objects']['kex1']['after'])


@pytest.mark.parametrize('name', [name for name in SCENARIOS if load(name)['objects']['kex1']['after']])
async def test_objects_handled_by_kopf_are_not_handled_again(
        name: str, use_registry: Callable[[dict[str, Any]], None], operator: Any, cluster: Any,
        emulator: Any, messages: Callable[[], list[str]]) -> None:
    fixture = load(name)
    use_registry(fixture)
    after = fixture['objects']['kex1']['after']
    await cluster.create(**arrangeable(after))
    if 'deletionTimestamp' in after['metadata']:
        await cluster.delete('kex1')  # it stays with the foreign finalizers only
    emulator.requests.reset()

    await operator.settle(first=None)
    await operator.settle(first='MODIFIED')

    assert emulator.requests.total == 0
    assert not [message for message in messages() if 'is invoked' in message]
