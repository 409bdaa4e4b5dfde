"""Label and field selectors, parsed and matched."""

import pytest

from kopf.testing.emulator.selectors import (
    SelectorError,
    label_selector_from_struct,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)

LABELS = {'app': 'web', 'tier': 'front', 'replicas': '3', 'example.com/owner': 'me'}


@pytest.mark.parametrize(
    'text, matches',
    [
        ('app=web', True),
        ('app = web', True),
        ('app=db', False),
        ('app!=db', True),
        ('absent!=x', True),
        ('app in (web, db)', True),
        ('app notin (web)', False),
        ('absent notin (x)', True),
        ('absent in (x)', False),
        ('tier', True),
        ('!tier', False),
        ('! absent', True),
        ('replicas>2', True),
        ('replicas<2', False),
        ('absent>2', False),
        ('app>2', False),  # not a number
        ('example.com/owner=me', True),
        ('app=web,tier in (front,back),!absent', True),
        ('app=web,tier=back', False),
        ('app=', False),
    ],
)
def test_label_selectors(text: str, matches: bool) -> None:
    assert labels_match(parse_label_selector(text), LABELS) is matches


@pytest.mark.parametrize(
    'text',
    [
        'app in (web',
        'app in web)',
        'app in ()',
        'app==web==x',
        'bad key=x',
        'app=bad value',
        'app=web,,tier',
        '-app=web',
        'replicas>x',
    ],
)
def test_invalid_label_selectors(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(text)


def test_empty_selectors_match_everything() -> None:
    assert parse_label_selector('') == ()
    assert labels_match((), None)
    assert labels_match(parse_label_selector('!x'), None)


def test_structured_label_selectors() -> None:
    selector = label_selector_from_struct(
        {
            'matchLabels': {'app': 'web'},
            'matchExpressions': [
                {'key': 'tier', 'operator': 'In', 'values': ['front']},
                {'key': 'absent', 'operator': 'DoesNotExist'},
            ],
        }
    )
    assert selector is not None
    assert labels_match(selector, LABELS)
    assert not labels_match(selector, {'app': 'web'})
    assert label_selector_from_struct(None) == ()
    assert label_selector_from_struct({'matchExpressions': [{'key': 'a', 'operator': 'Weird'}]}) is None
    assert label_selector_from_struct('not a selector') is None


def test_field_selectors() -> None:
    obj = {'metadata': {'name': 'x', 'namespace': 'ns'}, 'spec': {'flag': True}}
    allowed = ['metadata.name', 'metadata.namespace', 'spec.flag']
    assert all(requirement.matches(obj) for requirement in parse_field_selector('metadata.name=x', allowed))
    assert all(requirement.matches(obj) for requirement in parse_field_selector('spec.flag==true', allowed))
    assert not any(
        requirement.matches(obj) for requirement in parse_field_selector('metadata.name!=x', allowed)
    )
    with pytest.raises(SelectorError):
        parse_field_selector('spec.other=x', allowed)
    with pytest.raises(SelectorError):
        parse_field_selector('nonsense', allowed)
