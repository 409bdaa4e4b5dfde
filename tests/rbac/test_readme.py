"""
README's RBAC section and the examples' RBAC files, checked against ``rbac.yaml`` (which the tests prove).

The section is generated: ``python tests/rbac/test_readme.py`` rewrites it from ``rbac.yaml``; the test
fails if it differs (the rules were changed without the README, or the README by hand). The examples'
``rbac.yaml`` files must grant exactly the verbs of the features they are for.
"""
import pathlib
import re
import sys
import textwrap
from typing import Any

import yaml

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
README = REPO / 'README.md'
DATA = HERE / 'rbac.yaml'
BEGIN = '<!-- The RBAC rules: generated from tests/rbac/rbac.yaml by `python tests/rbac/test_readme.py`. -->'
END = '<!-- The end of the generated RBAC rules. -->'
INTRO = (
    'Every set below is enough for its feature, and every verb of it is needed: the tests of `tests/rbac/` '
    'run an operator as a user with exactly these rules on a real API server, and then without each verb '
    'in turn, for which the operator logs one line naming the verb, the resource and the namespace (or the '
    'cluster scope), with no traceback. The features add up (e.g. the handlers and the Lease election); '
    '`kopfexamples` of `kopf.dev` stands for your resources (also their `status` subresource, if they '
    'have one: the operator patches it). A `Role` in the operator\'s namespace (or the Lease\'s or the '
    'peering\'s one) for the `namespace` rules; a `ClusterRole` for the `cluster` rules.'
)


def _rules(data: dict[str, Any], feature: str, scope: str) -> list[dict[str, Any]]:
    return [{key: value for key, value in rule.items() if key != 'scope'}
            for rule in data[feature] if rule['scope'] == scope]


def render() -> str:
    text = DATA.read_text()
    data = yaml.safe_load(text)
    comments = dict(re.findall(r'^([a-z-]+):\s*#\s*(.*)$', text, flags=re.MULTILINE))
    lines = [BEGIN, '', *textwrap.wrap(INTRO, width=110), '']
    for feature in data:
        lines += [f'- `{feature}`: {comments[feature]}', '', '  ```yaml']
        for scope, kind in [('namespace', 'Role'), ('cluster', 'ClusterRole')]:
            rules = _rules(data, feature, scope)
            if rules:
                lines.append(f'  # {kind}')
                for rule in rules:
                    prefix = '- '
                    for key in ('apiGroups', 'resources', 'verbs'):
                        values = ', '.join(value or '""' for value in rule[key])
                        lines.append(f'  {prefix}{key}: [{values}]')
                        prefix = '  '
        lines += ['  ```', '']
    lines.append(END)
    return '\n'.join(lines)


def _section(readme: str) -> str:
    begin, end = readme.index(BEGIN), readme.index(END)
    return readme[begin:end + len(END)]


def test_readme_is_generated_from_the_rules() -> None:
    readme = README.read_text()
    assert BEGIN in readme and END in readme, 'README has no generated RBAC section.'
    assert _section(readme) == render(), 'Regenerate it: python tests/rbac/test_readme.py'


def test_readme_yaml_blocks_are_the_rules() -> None:
    section = _section(README.read_text())
    blocks = [yaml.safe_load(textwrap.dedent(block))
              for block in re.findall(r'```yaml\n(.*?)```', section, flags=re.DOTALL)]
    data = yaml.safe_load(DATA.read_text())
    rules = [_rules(data, feature, 'namespace') + _rules(data, feature, 'cluster') for feature in data]
    assert blocks == rules


def _verbs(path: pathlib.Path) -> dict[str, set[tuple[str, str, str]]]:
    """The verbs of every Role & ClusterRole of an example: {kind: {(group, resource, verb), ...}}."""
    found: dict[str, set[tuple[str, str, str]]] = {}
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc['kind'] in ('Role', 'ClusterRole'):
            found.setdefault(doc['kind'], set()).update(
                (group, resource, verb) for rule in doc['rules'] for group in rule['apiGroups']
                for resource in rule['resources'] for verb in rule['verbs'])
    return found


def _expected(*features: str) -> dict[str, set[tuple[str, str, str]]]:
    data = yaml.safe_load(DATA.read_text())
    found: dict[str, set[tuple[str, str, str]]] = {}
    for feature in features:
        for rule in data[feature]:
            kind = 'Role' if rule['scope'] == 'namespace' else 'ClusterRole'
            found.setdefault(kind, set()).update(
                (group, resource, verb) for group in rule['apiGroups']
                for resource in rule['resources'] for verb in rule['verbs'])
    return found


def test_the_examples_grant_the_rules_of_their_features() -> None:
    assert _verbs(REPO / 'examples' / '15-peering' / 'rbac.yaml') == _expected(
        'peering-cluster', 'peering-namespaced', 'lease')
    assert _verbs(REPO / 'examples' / '17-sharding' / 'rbac.yaml') == _expected('sharding')


if __name__ == '__main__':
    readme = README.read_text()
    if BEGIN in readme:
        readme = readme.replace(_section(readme), render())
    else:
        readme = readme.rstrip('\n') + '\n\n## RBAC: the permissions of every feature\n\n' + render() + '\n'
    README.write_text(readme)
    sys.exit(0)
