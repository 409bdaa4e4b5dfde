import pickle
import re

import pytest

from kopf._cogs.structs.references import EVERYTHING, Resource, Selector

POD = Resource('', 'v1', 'pods', kind='Pod', singular='pod', shortcuts=frozenset({'po'}),
               categories=frozenset({'all'}), namespaced=True)
CORE_EVENT = Resource('', 'v1', 'events', kind='Event', singular='event', shortcuts=frozenset({'ev'}),
                      namespaced=True)
NEW_EVENT = Resource('events.k8s.io', 'v1', 'events', kind='Event', singular='event',
                     shortcuts=frozenset({'ev'}), namespaced=True)
POD_METRICS = Resource('metrics.k8s.io', 'v1beta1', 'pods', kind='PodMetrics', singular='', namespaced=True)
DEPLOYMENT = Resource('apps', 'v1', 'deployments', kind='Deployment', singular='deployment',
                      shortcuts=frozenset({'deploy'}), categories=frozenset({'all'}), namespaced=True)
OLD_DEPLOYMENT = Resource('apps', 'v1beta1', 'deployments', kind='Deployment', singular='deployment',
                          shortcuts=frozenset({'deploy'}), namespaced=True, preferred=False)
KEX = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', singular='kopfexample',
               shortcuts=frozenset({'kex', 'kexes'}), categories=frozenset({'kopf'}), namespaced=True)
OLD_KEX = Resource('kopf.dev', 'v1beta1', 'kopfexamples', kind='KopfExample', singular='kopfexample',
                   shortcuts=frozenset({'kex', 'kexes'}), namespaced=True, preferred=False)
STATEFULSET = Resource('apps', 'v1', 'statefulsets', kind='StatefulSet', singular='statefulset',
                       shortcuts=frozenset({'sts'}), categories=frozenset({'all'}), namespaced=True)

CLUSTER = [POD, CORE_EVENT, NEW_EVENT, POD_METRICS, DEPLOYMENT, OLD_DEPLOYMENT, KEX, OLD_KEX, STATEFULSET]


@pytest.mark.parametrize('args, kwargs, group, version, name', [
    # The forms of the docs, with the name always the last positional argument.
    (('kopf.dev', 'v1', 'kopfexamples'), {}, 'kopf.dev', 'v1', 'kopfexamples'),
    (('kopf.dev/v1', 'kopfexamples'), {}, 'kopf.dev', 'v1', 'kopfexamples'),
    (('apps', 'v1', 'deployments'), {}, 'apps', 'v1', 'deployments'),
    (('apps/v1', 'deployments'), {}, 'apps', 'v1', 'deployments'),
    (('', 'v1', 'pods'), {}, '', 'v1', 'pods'),
    (('v1', 'pods'), {}, '', 'v1', 'pods'),
    (('kopf.dev', 'kopfexamples'), {}, 'kopf.dev', None, 'kopfexamples'),
    (('apps', 'deployments'), {}, 'apps', None, 'deployments'),
    (('kopfexamples.kopf.dev',), {}, 'kopf.dev', None, 'kopfexamples'),
    (('deployments.apps',), {}, 'apps', None, 'deployments'),
    (('pods.metrics.k8s.io',), {}, 'metrics.k8s.io', None, 'pods'),
    (('pods.v1',), {}, '', 'v1', 'pods'),
    (('deployments.v1.apps',), {}, 'apps', 'v1', 'deployments'),
    (('pods.v1beta1.metrics.k8s.io',), {}, 'metrics.k8s.io', 'v1beta1', 'pods'),
    (('kopfexamples',), {}, None, None, 'kopfexamples'),
    (('KopfExample',), {}, None, None, 'KopfExample'),
    (('kex',), {}, None, None, 'kex'),
    (('kopf.dev', 'v1', EVERYTHING), {}, 'kopf.dev', 'v1', EVERYTHING),
    (('kopf.dev/v1', EVERYTHING), {}, 'kopf.dev', 'v1', EVERYTHING),
    (('kopf.dev', EVERYTHING), {}, 'kopf.dev', None, EVERYTHING),
    ((EVERYTHING,), {}, None, None, EVERYTHING),
    ((EVERYTHING,), {'group': 'kopf.dev'}, 'kopf.dev', None, EVERYTHING),
    # Trailing Nones are as if not given (the decorators pass them all).
    (('kopfexamples', None, None), {}, None, None, 'kopfexamples'),
    (('kopf.dev', 'kopfexamples', None), {}, 'kopf.dev', None, 'kopfexamples'),
    # Keywords complement the positionals.
    (('kopfexamples',), {'group': 'kopf.dev'}, 'kopf.dev', None, 'kopfexamples'),
    (('kopfexamples',), {'group': 'kopf.dev', 'version': 'v1'}, 'kopf.dev', 'v1', 'kopfexamples'),
    (('kopf.dev', 'kopfexamples'), {'version': 'v1'}, 'kopf.dev', 'v1', 'kopfexamples'),
])
def test_positional_forms(args, kwargs, group, version, name):
    selector = Selector(*args, **kwargs)
    assert selector.group == group
    assert selector.version == version
    assert selector.any_name == name
    assert selector.kind is None
    assert selector.plural is None


@pytest.mark.parametrize('kwargs', [
    {'kind': 'KopfExample'},
    {'plural': 'kopfexamples'},
    {'singular': 'kopfexample'},
    {'shortcut': 'kex'},
    {'category': 'kopf'},
    {'group': 'kopf.dev', 'version': 'v1', 'plural': 'kopfexamples'},
])
def test_keyword_forms(kwargs):
    selector = Selector(**kwargs)
    for key, value in kwargs.items():
        assert getattr(selector, key) == value
    assert selector.any_name is None


@pytest.mark.parametrize('args, kwargs, error, message', [
    ((), {}, TypeError, r'name, a category, or EVERYTHING'),
    ((), {'group': 'kopf.dev', 'version': 'v1'}, TypeError, r'name, a category, or EVERYTHING'),
    (('kopf.dev', 'kopfexamples'), {'group': 'kopf.dev'}, TypeError, r'group is specified twice'),
    (('v1', 'pods'), {'group': 'apps'}, TypeError, r'group is specified twice'),
    (('kopf.dev/v1', 'kopfexamples'), {'version': 'v1'}, TypeError, r'version is specified twice'),
    (('kopfexamples.kopf.dev',), {'group': 'kopf.dev'}, TypeError, r'group is specified twice'),
    (('kopfexamples',), {'kind': 'KopfExample'}, TypeError, r'ambiguous'),
    (('kopfexamples',), {'category': 'all'}, TypeError, r'ambiguous'),
    ((), {'kind': 'KopfExample', 'plural': 'kopfexamples'}, TypeError, r'Only one resource name'),
    ((), {'plural': 'pods', 'category': 'all'}, TypeError, r'Only one resource name'),
    ((EVERYTHING,), {'kind': 'Pod'}, TypeError, r'EVERYTHING cannot be combined'),
    ((EVERYTHING, 'v1'), {}, TypeError, r'EVERYTHING can only be in place of the resource name'),
    ((EVERYTHING, 'v1', 'pods'), {}, TypeError, r'EVERYTHING can only be'),
    ((None, 'v1', 'pods'), {}, TypeError, r'gaps'),
    (('kopf.dev', None, 'kopfexamples'), {}, TypeError, r'gaps'),
    (('',), {}, ValueError, r'name cannot be empty'),
    (('kopf.dev', ''), {}, ValueError, r'name cannot be empty'),
    (('', 'pods'), {}, ValueError, r'group cannot be empty'),
    (('kopf.dev/', 'kopfexamples'), {}, ValueError, r'group/version'),
    (('/v1', 'kopfexamples'), {}, ValueError, r'group/version'),
    (('kopf.dev/v1/x', 'kopfexamples'), {}, ValueError, r'group/version'),
    (('kopf.dev/v1', 'v1', 'kopfexamples'), {}, ValueError, r'slashes'),
    (('kopf.dev', '', 'kopfexamples'), {}, ValueError, r'version cannot be empty'),
    (('kopfexamples',), {'version': ''}, ValueError, r'version cannot be empty'),
    ((), {'kind': ''}, ValueError, r'kind cannot be empty'),
    (('kopfexamples.',), {}, ValueError, r'Malformed'),
    (('.kopf.dev',), {}, ValueError, r'Malformed'),
    (('kopfexamples..dev',), {}, ValueError, r'Malformed'),
    ((lambda r: True, 'v1'), {}, TypeError, r'predicate cannot be combined'),
    (('kopf.dev/v1',), {}, ValueError, r'name must be the last argument'),
    (('kopfexamples',), {'group': 'kopf.dev/v1'}, ValueError, r'slashes'),
    (('kopfexamples',), {'version': 'kopf.dev/v1'}, ValueError, r'slashes'),
])
def test_invalid_specifications(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        Selector(*args, **kwargs)


def test_equality_is_by_meaning_not_by_form():
    assert Selector('kopf.dev', 'v1', 'kopfexamples') == Selector('kopf.dev/v1', 'kopfexamples')
    assert Selector('v1', 'pods') == Selector('', 'v1', 'pods') == Selector('pods.v1')
    assert hash(Selector('v1', 'pods')) == hash(Selector('pods.v1'))
    assert Selector('kopf.dev', 'kopfexamples') != Selector('kopf.dev', 'v1', 'kopfexamples')
    assert Selector('pods') != Selector(plural='pods')


def test_repr_shows_only_the_given_parts():
    assert repr(Selector('kopf.dev/v1', 'kex')) == "Selector(group='kopf.dev', version='v1', any_name='kex')"


@pytest.mark.parametrize('args, kwargs, expected', [
    (('kopf.dev', 'v1', 'kopfexamples'), {}, {KEX}),
    (('kopf.dev/v1', 'kopfexamples'), {}, {KEX}),
    (('kopf.dev', 'v1beta1', 'kopfexamples'), {}, {OLD_KEX}),  # non-preferred, but explicitly requested
    (('kopf.dev', 'kopfexamples'), {}, {KEX}),  # only the preferred version
    (('kopfexamples.kopf.dev',), {}, {KEX}),
    (('kopfexamples',), {}, {KEX}),
    (('kopfexample',), {}, {KEX}),
    (('KopfExample',), {}, {KEX}),
    (('kex',), {}, {KEX}),
    (('kexes',), {}, {KEX}),
    (('StatefulSet',), {}, {STATEFULSET}),
    (('deployments',), {}, {DEPLOYMENT}),
    (('apps', 'deployments'), {}, {DEPLOYMENT}),
    (('apps/v1', 'deployments'), {}, {DEPLOYMENT}),
    (('deployments.apps',), {}, {DEPLOYMENT}),
    (('deployments.v1beta1.apps',), {}, {OLD_DEPLOYMENT}),
    (('pod',), {}, {POD}),
    (('Pod',), {}, {POD}),
    (('po',), {}, {POD}),
    (('v1', 'pods'), {}, {POD}),
    (('', 'v1', 'pods'), {}, {POD}),
    (('pods.v1',), {}, {POD}),
    (('pods.metrics.k8s.io',), {}, {POD_METRICS}),
    (('metrics.k8s.io', 'pods'), {}, {POD_METRICS}),
    (('PodMetrics',), {}, {POD_METRICS}),
    (('v1', 'events'), {}, {CORE_EVENT}),
    (('events.k8s.io', 'events'), {}, {NEW_EVENT}),
    ((), {'kind': 'KopfExample'}, {KEX}),
    ((), {'plural': 'kopfexamples'}, {KEX}),
    ((), {'singular': 'kopfexample'}, {KEX}),
    ((), {'shortcut': 'kex'}, {KEX}),
    ((), {'kind': 'Deployment', 'version': 'v1beta1'}, {OLD_DEPLOYMENT}),
    ((), {'category': 'all'}, {POD, DEPLOYMENT, STATEFULSET}),
    ((), {'category': 'nonexistent'}, set()),
    (('nonexistent',), {}, set()),
    (('kopf.dev', 'v1', EVERYTHING), {}, {KEX}),
    (('kopf.dev/v1beta1', EVERYTHING), {}, {OLD_KEX}),
    (('kopf.dev', EVERYTHING), {}, {KEX}),
    (('apps', EVERYTHING), {}, {DEPLOYMENT, STATEFULSET}),
    ((EVERYTHING,), {}, {POD, NEW_EVENT, POD_METRICS, DEPLOYMENT, KEX, STATEFULSET}),  # no core events
    ((lambda r: r.namespaced and r.group == 'apps',), {}, {DEPLOYMENT, STATEFULSET}),
    ((lambda r: r.group == 'apps',), {'version': 'v1beta1'}, {OLD_DEPLOYMENT}),
])
def test_selection_in_a_cluster(args, kwargs, expected):
    selector = Selector(*args, **kwargs)
    assert selector.select(CLUSTER) == expected


@pytest.mark.parametrize('args, kwargs, specific', [
    (('kopfexamples',), {}, True),
    (('kopf.dev', 'v1', 'kopfexamples'), {}, True),
    ((), {'kind': 'Pod'}, True),
    ((), {'plural': 'pods'}, True),
    ((), {'singular': 'pod'}, True),
    ((), {'shortcut': 'po'}, True),
    ((), {'category': 'all'}, False),
    ((EVERYTHING,), {}, False),
    (('kopf.dev', EVERYTHING), {}, False),
    ((lambda r: True,), {}, False),
])
def test_specificity(args, kwargs, specific):
    assert Selector(*args, **kwargs).is_specific is specific


def test_ambiguous_names_select_nothing():
    other_kex = Resource('other.dev', 'v1', 'kopfexamples', kind='KopfExample', singular='kopfexample')
    resources = [KEX, other_kex]
    assert Selector('kopfexamples').check(KEX)
    assert Selector('kopfexamples').check(other_kex)
    assert Selector('kopfexamples').select(resources) == set()
    assert Selector(kind='KopfExample').select(resources) == set()
    assert Selector('kopf.dev', 'kopfexamples').select(resources) == {KEX}


def test_ambiguous_names_prefer_the_core_api():
    assert Selector('pods').select(CLUSTER) == {POD}
    assert Selector('events').select(CLUSTER) == {CORE_EVENT}
    assert Selector('Event').select(CLUSTER) == {CORE_EVENT}
    assert Selector(plural='pods').select(CLUSTER) == {POD}


def test_multi_resource_selectors_are_not_disambiguated():
    other_kex = Resource('other.dev', 'v1', 'kopfexamples', kind='KopfExample',
                         categories=frozenset({'kopf'}))
    assert Selector(category='kopf').select([KEX, other_kex]) == {KEX, other_kex}
    assert Selector(EVERYTHING).select([KEX, other_kex]) == {KEX, other_kex}


def test_everything_excludes_only_the_core_events():
    assert not Selector(EVERYTHING).check(CORE_EVENT)
    assert not Selector('', 'v1', EVERYTHING).check(CORE_EVENT)
    assert Selector(EVERYTHING).check(NEW_EVENT)
    assert Selector('v1', EVERYTHING).select(CLUSTER) == {POD}


def test_kind_keyword_is_exact():
    assert Selector(kind='Pod').check(POD)
    assert not Selector(kind='pod').check(POD)


def test_names_are_matched_only_in_their_roles():
    assert not Selector(plural='kex').check(KEX)
    assert not Selector(shortcut='kopfexamples').check(KEX)
    assert not Selector(singular='KopfExample').check(KEX)


def test_selector_is_immutable():
    selector = Selector('pods')
    with pytest.raises(AttributeError):
        selector.group = 'apps'


def test_predicate_selector_calls_the_predicate_with_resources():
    seen: list[Resource] = []
    selector = Selector(lambda r: seen.append(r) or re.fullmatch(r'.*s', r.plural) is not None)
    assert selector.check(KEX)
    assert seen == [KEX]


def test_resources_are_equal_and_hashed_by_group_version_plural_only():
    resource = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample', namespaced=True)
    same = Resource('kopf.dev', 'v1', 'kopfexamples')
    other = Resource('kopf.dev', 'v2', 'kopfexamples', kind='KopfExample', namespaced=True)
    assert resource == same and hash(resource) == hash(same)
    assert resource != other and {resource: 1}.get(other) is None


def test_pickled_resources_get_their_hash_anew():
    # The hash is remembered per resource, but the strings' hashes differ between processes:
    # a remembered hash must not travel with the pickle (it would be wrong in another process).
    resource = Resource('kopf.dev', 'v1', 'kopfexamples', kind='KopfExample')
    pickled = pickle.dumps(resource)
    assert b'_hash' not in pickled
    restored = pickle.loads(pickled)
    assert restored == resource and hash(restored) == hash(resource) and restored.kind == 'KopfExample'
