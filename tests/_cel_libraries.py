"""
A CRD whose CEL rules use Kubernetes' own CEL libraries, and what real kube-apiservers answer to its objects.

Shared by the emulator's own tests (``tests/emulator/test_schemas.py``) and by the fidelity tests
(``tests/kubeapi/test_fidelity.py``, on both the emulator and a real kube-apiserver). Every rule is true
of ``VALID``; each rule's message is its index, so that a failure names its rule. The expectations are
kube-apiserver v1.37's answers (incl. their quirks: ``quantity('1000m')`` is not an integer there).
"""
import re
from typing import Any, NamedTuple

GROUP = 'libraries.kopf.dev'
PLURAL = 'libraries'
KIND = 'Library'

RULES = [
    # The extended strings.
    "self.s.trim() == 'Hello, World'", "self.s.lowerAscii() == ' hello, world '",
    "self.s.upperAscii() == ' HELLO, WORLD '", "self.s.charAt(1) == 'H'", "self.s.charAt(14) == ''",
    "self.s.indexOf('o') == 5", "self.s.indexOf('o', 6) == 9", "self.s.lastIndexOf('o') == 9",
    "self.s.lastIndexOf('o', 8) == 5", "self.s.replace('o', '0') == ' Hell0, W0rld '",
    "self.s.replace('o', '0', 1) == ' Hell0, World '", "self.s.split(', ') == [' Hello', 'World ']",
    "self.s.split(', ', 1) == [' Hello, World ']", "'abc'.split('') == ['a', 'b', 'c']",
    "self.s.substring(1, 6) == 'Hello'", "self.s.substring(8) == 'World '", "self.sl.join('-') == 'a-b'",
    "self.sl.join() == 'ab'",
    # The lists and the regexes.
    "self.l.isSorted()", "!([2, 1].isSorted())", "self.l.sum() == 6", "self.l.min() == 1",
    "self.l.max() == 3", "self.l.indexOf(2) == 1", "[1, 2, 1].lastIndexOf(1) == 2", "[1.5, 2.5].sum() == 4.0",
    "[].sum() == 0", "self.sl.min() == 'a'", "'abc123def456'.find('[0-9]+') == '123'",
    "'abc'.find('[0-9]+') == ''", "'abc123def456'.findAll('[0-9]+') == ['123', '456']",
    "'abc123def456'.findAll('[0-9]+', 1) == ['123']",
    # The quantities.
    "isQuantity(self.q)", "quantity(self.q).isGreaterThan(quantity('1Gi'))",
    "quantity('1k').compareTo(quantity('1000')) == 0", "quantity('2').sub(1).asInteger() == 1",
    "quantity('1e3').asInteger() == 1000", "quantity('1.5').asApproximateFloat() == 1.5",
    "!isQuantity('1.5.5')", "!isQuantity('1K')", "quantity('1Mi').compareTo(quantity('1024Ki')) == 0",
    "quantity('1Mi') == quantity('1024Ki')", "!quantity('1.5').isInteger()",
    "quantity('2').add(3).asInteger() == 5", "quantity('1E').isGreaterThan(quantity('1P'))",
    "!quantity('1000m').isInteger()", "!quantity('1.0').isInteger()", "!quantity('1.5Gi').isInteger()",
    "quantity('1e3').isInteger()", "quantity('1k').isInteger()",
    "!quantity('1m').add(quantity('999m')).isInteger()", "quantity('1').add(quantity('1k')).isInteger()",
    "!quantity('0.5Ki').isInteger()", "!quantity('10e-1').isInteger()",
    "!quantity('2').sub(quantity('1000m')).isInteger()", "quantity('1000m').asApproximateFloat() == 1.0",
    # The URLs.
    "isURL(self.u)", "url(self.u).getScheme() == 'https'", "url(self.u).getHost() == 'example.com:8443'",
    "url(self.u).getHostname() == 'example.com'", "url(self.u).getPort() == '8443'",
    "url(self.u).getEscapedPath() == '/a%20b/c'", "url(self.u).getQuery() == {'x': ['1', '2'], 'y': ['']}",
    "!isURL('not a url')", "isURL('/abs/path')", "!isURL('rel/path')",
    "url('https://[::1]:80').getHostname() == '::1'", "url('https://[::1]:80').getHost() == '[::1]:80'",
    "url('https://example.com').getPort() == ''", "isURL('mailto:someone@example.com')",
    # The IPs and CIDRs.
    "isIP(self.ip)", "ip(self.ip).family() == 4", "ip('::1').isLoopback()", "ip('0.0.0.0').isUnspecified()",
    "ip('fe80::1').isLinkLocalUnicast()", "ip('224.0.0.1').isLinkLocalMulticast()",
    "ip('10.0.0.1').isGlobalUnicast()", "!isIP('::ffff:1.2.3.4')", "!isIP('1.2.3')",
    "ip('ff02::1').isLinkLocalMulticast()", "isCIDR(self.c)", "cidr(self.c).containsIP('10.1.2.3')",
    "cidr(self.c).containsIP(ip('10.1.2.3'))", "cidr(self.c).containsCIDR('10.1.0.0/16')",
    "cidr('10.1.2.3/8').masked() == cidr('10.0.0.0/8')", "cidr(self.c).prefixLength() == 8",
    "cidr('10.1.2.3/8').ip() == ip('10.1.2.3')", "ip('10.0.0.1') == ip('10.0.0.1')",
    "!cidr(self.c).containsCIDR('11.0.0.0/16')", "!isCIDR('10.0.0.0/33')", "!isIP('010.0.0.1')",
    # The semantic versions.
    "isSemver(self.v)", "semver(self.v).major() == 1", "semver(self.v).minor() == 2",
    "semver(self.v).patch() == 3", "semver('1.2.3').isGreaterThan(semver(self.v))",
    "semver('1.0.0-alpha').isLessThan(semver('1.0.0-alpha.1'))",
    "semver('1.0.0-2').isLessThan(semver('1.0.0-a'))", "semver('v1.2', true).compareTo(semver('1.2.0')) == 0",
    "!isSemver('v1.2.3')", "isSemver('v1.2', true)", "semver('1.2.3+a') == semver('1.2.3+b')",
    # What the emulator does not evaluate (cel-python has no optional types): not checked there, true here.
    "self.?s.orValue('x') != ''",
]
UNSUPPORTED = len(RULES) - 1  # the index of the rule that the emulator does not check

_STRING = {'type': 'string', 'maxLength': 64}  # the limits keep the rules' estimated cost in the budget
SCHEMA: dict[str, Any] = {'type': 'object', 'properties': {'spec': {
    'type': 'object', 'x-kubernetes-validations': [{'rule': rule, 'message': f'#{index}'}
                                                   for index, rule in enumerate(RULES)],
    'properties': {
        's': _STRING, 'q': _STRING, 'u': _STRING, 'ip': _STRING, 'c': _STRING, 'v': _STRING,
        'l': {'type': 'array', 'maxItems': 10, 'items': {'type': 'integer'}},
        'sl': {'type': 'array', 'maxItems': 10, 'items': {'type': 'string', 'maxLength': 10}},
    },
}}}
CRD = {
    'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
    'metadata': {'name': f'{PLURAL}.{GROUP}'},
    'spec': {'group': GROUP, 'scope': 'Namespaced', 'names': {'plural': PLURAL, 'kind': KIND},
             'versions': [{'name': 'v1', 'served': True, 'storage': True,
                           'schema': {'openAPIV3Schema': SCHEMA}}]},
}
VALID = {'s': ' Hello, World ', 'sl': ['a', 'b'], 'l': [1, 2, 3], 'q': '1.5Gi', 'ip': '10.0.0.1',
         'c': '10.0.0.0/8', 'u': 'https://user@example.com:8443/a%20b/c?x=1&x=2&y', 'v': '1.2.3-alpha.1+b'}


def _uses(field: str) -> list[int]:
    return [index for index, rule in enumerate(RULES) if re.search(rf'\bself\.{field}\b', rule)]


def _failed(*indexes: int) -> dict[int, str]:
    return {index: f'Invalid value: #{index}' for index in indexes}


def _unparsed(field: str, error: str) -> dict[int, str]:
    """A value that its library cannot parse: its check (e.g. ``isIP()``) fails, the rest cannot evaluate."""
    check, *others = _uses(field)
    return {**_failed(check), **{index: f'Invalid value: "object": {error} evaluating rule: #{index}'
                                 for index in others}}


def _ip(text: str, why: str) -> str:
    return f'IP Address "{text}" parse error during conversion from string: ParseAddr("{text}"): {why}'


def _cidr(text: str, why: str) -> str:
    problem = 'network address parse error during conversion from string'
    return f'{problem}: {problem}: netip.ParsePrefix("{text}"): {why}'


def _url(text: str) -> str:
    return f'URL parse error during conversion from string: parse "{text}": invalid URI for request'


_QUANTITY = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
_SUM, _MIN, _MAX, _INDEX = (RULES.index(f'self.l.{rule}') for rule in
                            ('sum() == 6', 'min() == 1', 'max() == 3', 'indexOf(2) == 1'))


class Invalid(NamedTuple):
    """An object with these changes of ``VALID``, and the causes of the 422 (all of ``spec``, as invalid)."""
    id: str
    changes: dict[str, Any]
    causes: dict[int, str]  # by the rule's index, the cause's message


INVALID = [
    Invalid('empty', {'l': [], 'q': 'x', 'u': 'x', 'ip': 'x', 'c': 'x', 'v': 'x'}, {
        **_failed(_SUM, _INDEX),
        _MIN: f'Invalid value: "object": min called on empty list evaluating rule: #{_MIN}',
        _MAX: f'Invalid value: "object": max called on empty list evaluating rule: #{_MAX}',
        **_unparsed('q', _QUANTITY), **_unparsed('u', _url('x')),
        **_unparsed('ip', _ip('x', 'unable to parse IP')), **_unparsed('c', _cidr('x', "no '/'")),
        **_unparsed('v', 'No Major.Minor.Patch elements found'),
    }),
    Invalid('malformed', {'ip': '1.2.3.4/99', 'c': '1.2.3.4/x', 'v': '1.2.3-', 'q': '1.5.5'}, {
        **_unparsed('q', _QUANTITY), **_unparsed('ip', _ip('1.2.3.4/99', 'unexpected character (at "/99")')),
        **_unparsed('c', _cidr('1.2.3.4/x', 'bad bits after slash: "x"')),
        **_unparsed('v', 'Prerelease is empty'),
    }),
    Invalid('zeroes', {'ip': '01.2.3', 'c': '10.0.0.0/33', 'v': '01.2.3', 'u': 'rel/path'}, {
        **_unparsed('u', _url('rel/path')),
        **_unparsed('ip', _ip('01.2.3', 'IPv4 field has octet with leading zero')),
        **_unparsed('c', _cidr('10.0.0.0/33', 'prefix length out of range')),
        **_unparsed('v', 'Major number must not contain leading zeroes "01"'),
    }),
    Invalid('other', {'ip': '1.2.3.4.5', 'c': 'x/8', 'v': '1.2', 'l': [3, 2]}, {
        **_failed(RULES.index('self.l.isSorted()'), _SUM, _MIN),
        **_unparsed('ip', _ip('1.2.3.4.5', 'IPv4 address too long')),
        **_unparsed('c', _cidr('x/8', 'ParseAddr("x"): unable to parse IP')),
        **_unparsed('v', 'No Major.Minor.Patch elements found'),
    }),
]


def path(namespace: str, name: str = '') -> str:
    return '/'.join(filter(None, [f'/apis/{GROUP}/v1/namespaces/{namespace}/{PLURAL}', name]))


def library(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {'apiVersion': f'{GROUP}/v1', 'kind': KIND, 'metadata': {'name': name}, 'spec': spec}


def check_invalid(case: Invalid, code: int, body: Any) -> None:
    expected = [{'reason': 'FieldValueInvalid', 'message': case.causes[index], 'field': 'spec'}
                for index in sorted(case.causes)]
    assert (code, body.get('details', {}).get('causes')) == (422, expected), body
