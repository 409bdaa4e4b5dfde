import re

import pytest

from kopf._cogs.structs.references import (
    are_specific_namespaces,
    is_specific_namespace,
    match_namespace,
    match_namespaces,
    select_specific_namespaces,
)


@pytest.mark.parametrize('pattern, name, expected', [
    # Plain names.
    ('some-namespace', 'some-namespace', True),
    ('some-namespace', 'another-namespace', False),
    ('some-namespace', 'some-namespace-2', False),
    # Globs.
    ('*-pr-123-*', 'myapp-pr-123-live', True),
    ('*-pr-123-*', 'myapp-pr-456-live', False),
    ('ns-?', 'ns-1', True),
    ('ns-?', 'ns-12', False),
    ('*', 'anything', True),
    # A negation first: everything else is implied.
    ('!*-pr-123-*', 'myapp-pr-123-live', False),
    ('!*-pr-123-*', 'myapp-pr-456-live', True),
    ('!kube-*', 'default', True),
    ('!kube-*', 'kube-system', False),
    # The docs' example: the first glob decides; the rightmost matching glob wins.
    ('myapp-*,!*-pr-*,*-pr-123', 'myapp-live', True),
    ('myapp-*,!*-pr-*,*-pr-123', 'myapp-pr-456', False),
    ('myapp-*,!*-pr-*,*-pr-123', 'myapp-pr-123', True),
    ('myapp-*,!*-pr-*,*-pr-123', 'otherapp-live', False),
    ('myapp-*,!*-pr-*,*-pr-123', 'otherapp-pr-123', False),
    # Spaces around the commas and empty globs are tolerated.
    ('myapp-*, !*-pr-*', 'myapp-pr-1', False),
    ('myapp-*,,', 'myapp-1', True),
    ('', 'default', False),
    # Case-sensitive, as the namespaces are.
    ('Default', 'default', False),
    # Regular expressions must match the whole name.
    (re.compile(r'myapp-\d+'), 'myapp-123', True),
    (re.compile(r'myapp-\d+'), 'myapp-123-x', False),
    (re.compile(r'myapp'), 'x-myapp', False),
])
def test_match_namespace(pattern, name, expected):
    assert match_namespace(name, pattern) is expected


@pytest.mark.parametrize('patterns, name, expected', [
    (['ns1', 'ns2'], 'ns1', True),
    (['ns1', 'ns2'], 'ns2', True),
    (['ns1', 'ns2'], 'ns3', False),
    (['ns1', 'app-*'], 'app-x', True),
    (['!kube-*', 'kube-public'], 'kube-public', True),
    (['!kube-*', 'kube-public'], 'kube-system', False),
    ([re.compile('a.c'), 'xyz'], 'abc', True),
    ([], 'anything', False),
])
def test_match_namespaces(patterns, name, expected):
    assert match_namespaces(name, patterns) is expected


@pytest.mark.parametrize('pattern, expected', [
    ('default', True),
    ('some-namespace', True),
    ('ns-*', False),
    ('ns-?', False),
    ('!default', False),
    ('a,b', False),
    ('ns-[ab]', False),
    ('', False),
    (re.compile('default'), False),
])
def test_is_specific_namespace(pattern, expected):
    assert is_specific_namespace(pattern) is expected


@pytest.mark.parametrize('patterns, expected', [
    (['ns1'], True),
    (['ns1', 'ns2'], True),
    (['ns1', 'ns-*'], False),
    (['ns1', re.compile('ns2')], False),
    ([], False),  # no restrictions means cluster-wide, which needs no namespace listing, but is not specific
])
def test_are_specific_namespaces(patterns, expected):
    assert are_specific_namespaces(patterns) is expected


def test_select_specific_namespaces_ignores_the_patterns():
    patterns = ['ns1', 'ns-*', '!ns2', 'a,b', re.compile('ns3'), 'ns4', 'ns1']
    assert select_specific_namespaces(patterns) == {'ns1', 'ns4'}
