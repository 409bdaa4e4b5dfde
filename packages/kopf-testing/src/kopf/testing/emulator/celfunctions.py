"""
Kubernetes' own CEL libraries, for the CRDs' rules (``x-kubernetes-validations``) in cel-python.

Imported only with cel-python installed (the ``kopf-testing[cel]`` extra). Done: the extended strings
(``charAt``, ``indexOf``, ``lastIndexOf``, ``lowerAscii``, ``upperAscii``, ``replace``, ``split``,
``substring``, ``trim``, ``join``), the lists (``isSorted``, ``sum``, ``min``, ``max``, ``indexOf``,
``lastIndexOf``), the regexes (``find``, ``findAll``), the URLs (``url``, ``isURL`` and their getters),
the quantities (``quantity``, ``isQuantity``, comparisons and arithmetic), the IPs and CIDRs (``ip``,
``isIP``, ``cidr``, ``isCIDR`` and their methods), and the semantic versions (``semver``, ``isSemver``).
What is not here (e.g. ``format``, the optional types' syntax, two-variable comprehensions) is not
evaluated: the rules that use it are not checked, and the log says so (see ``schemas.py``).
"""
import fractions
import ipaddress
import itertools
import re
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from celpy.celtypes import BoolType, DoubleType, IntType, ListType, MapType, StringType
from celpy.evaluation import CELEvalError

_INT64 = (-2**63, 2**63 - 1)


def _error(message: str) -> Any:
    return CELEvalError(message)


# ----------------------------------------------------------------------------------------------------
# Strings (cel-go's extended strings) and lists (Kubernetes' lists library), by the receiver's type.

def _char_at(text: str, index: int) -> Any:
    if not 0 <= index <= len(text):
        return _error(f'index out of range: {index}')
    return StringType(text[index:index + 1])


def _index_of(receiver: Any, item: Any, offset: int = 0) -> Any:
    if isinstance(receiver, list):
        return IntType(next((index for index, value in enumerate(receiver) if value == item), -1))
    if not 0 <= offset <= len(receiver):
        return _error(f'index out of range: {offset}')
    return IntType(receiver.find(item, offset))


def _last_index_of(receiver: Any, item: Any, *offset: int) -> Any:
    if isinstance(receiver, list):
        found = [index for index, value in enumerate(receiver) if value == item]
        return IntType(found[-1] if found else -1)
    end = offset[0] if offset else len(receiver)
    if not 0 <= end <= len(receiver):
        return _error(f'index out of range: {end}')
    return IntType(receiver.rfind(item, 0, end + len(item)))


def _ascii(text: str, convert: Callable[[str], str]) -> StringType:
    return StringType(''.join(convert(char) if char.isascii() else char for char in text))


def _replace(text: str, old: str, new: str, count: int = -1) -> StringType:
    return StringType(text.replace(old, new, count))


def _split(text: str, separator: str, limit: int = -1) -> Any:
    if limit == 0:
        return ListType([])
    if separator == '':  # like Go: into the characters (the last one keeps the rest)
        parts = list(text) if limit < 0 else [*text[:limit - 1], text[limit - 1:]] if text else []
    else:
        parts = text.split(separator, limit - 1 if limit > 0 else -1)
    return ListType([StringType(part) for part in parts])


def _substring(text: str, start: int, end: int | None = None) -> Any:
    end = len(text) if end is None else end
    if not 0 <= start <= end <= len(text):
        return _error(f'index out of range: {start if not 0 <= start <= len(text) else end}')
    return StringType(text[start:end])


def _join(items: Sequence[str], separator: str = '') -> StringType:
    return StringType(separator.join(items))


def _is_sorted(items: Sequence[Any]) -> BoolType:
    return BoolType(all(a <= b for a, b in itertools.pairwise(items)))


def _sum(items: Sequence[Any]) -> Any:
    if not items:
        return IntType(0)
    total = items[0]
    for item in items[1:]:
        total = total + item
    return total


def _extreme(name: str, pick: Callable[..., Any]) -> Callable[[Sequence[Any]], Any]:
    def extreme(items: Sequence[Any]) -> Any:
        return pick(items) if items else _error(f'{name} called on empty list')
    return extreme


def _find(text: str, pattern: str) -> StringType:
    found = re.search(pattern, text)
    return StringType(found.group(0) if found else '')


def _find_all(text: str, pattern: str, limit: int = -1) -> ListType:
    found = [StringType(match.group(0)) for match in re.finditer(pattern, text)]
    return ListType(found if limit < 0 else found[:limit])


# ----------------------------------------------------------------------------------------------------
# Quantities (resource.Quantity).

_QUANTITY = re.compile(r'([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)'
                       r'(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?')
_SUFFIXES = {
    '': fractions.Fraction(1), 'n': fractions.Fraction(1, 10**9), 'u': fractions.Fraction(1, 10**6),
    'm': fractions.Fraction(1, 1000), 'k': fractions.Fraction(10**3), 'M': fractions.Fraction(10**6),
    'G': fractions.Fraction(10**9), 'T': fractions.Fraction(10**12), 'P': fractions.Fraction(10**15),
    'E': fractions.Fraction(10**18), 'Ki': fractions.Fraction(2**10), 'Mi': fractions.Fraction(2**20),
    'Gi': fractions.Fraction(2**30), 'Ti': fractions.Fraction(2**40), 'Pi': fractions.Fraction(2**50),
    'Ei': fractions.Fraction(2**60),
}
_QUANTITY_ERROR = ("quantities must match the regular expression "
                   "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")


_SCALES = {'n': -9, 'u': -6, 'm': -3, 'k': 3, 'M': 6, 'G': 9, 'T': 12, 'P': 15, 'E': 18}


class Quantity:
    """
    A Kubernetes quantity (``500m``, ``1Gi``, ``2e3``): its exact value, and its decimal scale.

    The scale is as Kubernetes keeps it: negative for the fractions of a unit as written (``1000m``,
    ``1.0``, ``1.5Gi``), the smaller one of a sum's. Kubernetes says that such quantities are not
    integers, whatever their value; so does this.
    """

    def __init__(self, value: fractions.Fraction, scale: int) -> None:
        self.value = value
        self.scale = scale

    @classmethod
    def parse(cls, text: str) -> 'Quantity | None':
        match = _QUANTITY.fullmatch(text)
        if match is None:
            return None
        sign, number, suffix = match.group(1), match.group(2), match.group(3) or ''
        value = fractions.Fraction(number)
        scale = -len(number.partition('.')[2])
        if suffix[:1] in ('e', 'E') and len(suffix) > 1:
            value *= fractions.Fraction(10) ** int(suffix[1:])
            scale += int(suffix[1:])
        else:
            value *= _SUFFIXES[suffix]
            scale += _SCALES.get(suffix, 0)
        return cls(-value if sign == '-' else value, min(scale, 0) if scale < 0 else 0)

    def is_integer(self) -> bool:
        return self.scale >= 0 and self.value.denominator == 1 and _INT64[0] <= self.value <= _INT64[1]

    def plus(self, other: Any, sign: int = 1) -> 'Quantity':
        value, scale = (other.value, other.scale) if isinstance(other, Quantity) else (int(other), 0)
        return Quantity(self.value + sign * value, min(self.scale, scale))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _as_fraction(value: Any) -> fractions.Fraction:
    return value.value if isinstance(value, Quantity) else fractions.Fraction(int(value))


def _quantity(text: str) -> Any:
    parsed = Quantity.parse(text)
    return _error(_QUANTITY_ERROR) if parsed is None else parsed


def _as_integer(quantity: Quantity) -> Any:
    if not quantity.is_integer():
        return _error('cannot convert value to integer')
    return IntType(int(quantity.value))


# ----------------------------------------------------------------------------------------------------
# URLs, IPs and CIDRs, semantic versions.

class URL:
    def __init__(self, parts: urllib.parse.SplitResult) -> None:
        self.parts = parts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, URL) and self.parts == other.parts

    def __hash__(self) -> int:
        return hash(self.parts)


def _parse_url(text: str) -> URL | None:
    """As Go's ``url.ParseRequestURI``: an absolute URI or an absolute path, with no spaces."""
    if not text or any(char.isspace() or ord(char) < 0x20 or ord(char) == 0x7f for char in text):
        return None
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018  # a bad port fails here
    except ValueError:
        return None
    absolute = bool(parts.scheme) and re.fullmatch(r'[A-Za-z][A-Za-z0-9+.-]*', parts.scheme) is not None
    if not absolute and not text.startswith('/'):
        return None
    return URL(parts)


def _url(text: str) -> Any:
    parsed = _parse_url(text)
    return _error(f'URL parse error during conversion from string: parse "{text}": invalid URI for request') \
        if parsed is None else parsed


def _get_query(url: URL) -> MapType:
    query = urllib.parse.parse_qs(url.parts.query, keep_blank_values=True)
    return MapType({StringType(key): ListType([StringType(value) for value in values])
                    for key, values in query.items()})


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and (address.ipv4_mapped is not None or address.scope_id):
        return None  # like Kubernetes: no IPv4-mapped IPv6 addresses, no zones
    return address


def _ip_problem(text: str) -> str:
    """Why the text is not an IP address, in the words of Go's ``netip.ParseAddr`` (IPv4 only)."""
    if '%' in text and _parse_ip(text.partition('%')[0]) is not None:
        return f'IP address "{text}" with zone value is not allowed'
    kind = next((char for char in text if char in '.:%'), '')
    why = _ipv4_problem(text) if kind == '.' else 'unable to parse IP'
    return f'IP Address "{text}" parse error during conversion from string: ParseAddr("{text}"): {why}'


def _ipv4_problem(text: str) -> str:
    fields, digits, value = 0, 0, 0
    for index, char in enumerate(text):
        if '0' <= char <= '9':
            if digits == 1 and value == 0:
                return 'IPv4 field has octet with leading zero'
            value, digits = value * 10 + int(char), digits + 1
            if value > 255:
                return 'IPv4 field has value >255'
        elif char == '.':
            if digits == 0:
                return f'IPv4 field must have at least one digit (at "{text[index:]}")'
            if fields == 3:
                return 'IPv4 address too long'
            fields, digits, value = fields + 1, 0, 0
        else:
            return f'unexpected character (at "{text[index:]}")'
    return 'IPv4 address too short' if fields < 3 or digits == 0 else 'unable to parse IP'


def _cidr_problem(text: str) -> str:
    address, slash, prefix = text.partition('/')
    if not slash:
        why = "no '/'"
    elif not prefix.isdigit():
        why = f'bad bits after slash: "{prefix}"'
    elif _parse_ip(address) is None:
        why = f'ParseAddr("{address}"): unable to parse IP'
    else:
        why = 'prefix length out of range'
    problem = 'network address parse error during conversion from string'
    return f'{problem}: {problem}: netip.ParsePrefix("{text}"): {why}'


class IP:
    def __init__(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
        self.address = address

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IP) and self.address == other.address

    def __hash__(self) -> int:
        return hash(self.address)


class CIDR:
    def __init__(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address, prefix: int) -> None:
        self.address = address
        self.network = ipaddress.ip_network(f'{address}/{prefix}', strict=False)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CIDR) and (self.address, self.network) == (other.address, other.network)

    def __hash__(self) -> int:
        return hash((self.address, self.network))


def _parse_cidr(text: str) -> CIDR | None:
    address, slash, prefix = text.partition('/')
    parsed = _parse_ip(address)
    if parsed is None or not slash or not prefix.isdigit() or int(prefix) > parsed.max_prefixlen:
        return None
    return CIDR(parsed, int(prefix))


def _ip(value: Any) -> Any:
    if isinstance(value, CIDR):
        return IP(value.address)
    parsed = _parse_ip(value)
    return _error(_ip_problem(value)) if parsed is None else IP(parsed)


def _cidr(text: str) -> Any:
    parsed = _parse_cidr(text)
    return _error(_cidr_problem(text)) if parsed is None else parsed


def _contains_ip(cidr: CIDR, value: Any) -> Any:
    address = value.address if isinstance(value, IP) else _parse_ip(value)
    if address is None:
        return _error(_ip_problem(value))
    return BoolType(address in cidr.network)


def _contains_cidr(cidr: CIDR, value: Any) -> Any:
    other = value if isinstance(value, CIDR) else _parse_cidr(value)
    if other is None:
        return _error(_cidr_problem(value))
    inner, outer = other.network, cidr.network
    return BoolType(inner.version == outer.version and inner.subnet_of(outer))  # type: ignore[arg-type]


def _masked(cidr: CIDR) -> CIDR:
    return CIDR(cidr.network.network_address, cidr.network.prefixlen)


_LINK_LOCAL_MULTICAST = {4: ipaddress.ip_network('224.0.0.0/24'), 6: ipaddress.ip_network('ff02::/16')}

class Semver:
    def __init__(self, major: int, minor: int, patch: int, pre: tuple[str, ...]) -> None:
        self.version = (major, minor, patch)
        self.pre = pre

    def key(self) -> tuple[Any, ...]:
        # A version with no pre-release is above all of its pre-releases; numbers below words.
        pre = tuple((0, int(part), '') if part.isdigit() else (1, 0, part) for part in self.pre)
        return (*self.version, not self.pre, pre)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())


def _parse_semver(text: str, normalize: Any = False) -> Semver | str:
    """The version, or why it is none, as Go's ``blang/semver`` says it (with Kubernetes' normalization)."""
    if normalize:
        text = text[1:] if text.startswith('v') else text
        core, rest = re.match(r'([0-9.]*)(.*)', text).groups()  # type: ignore[union-attr]
        numbers = core.split('.')
        if all(numbers) and len(numbers) <= 3:
            numbers = [str(int(n)) for n in numbers] + ['0'] * (3 - len(numbers))
            text = '.'.join(numbers) + rest
    if not text:
        return 'Version string empty'
    parts = text.split('.', 2)
    if len(parts) != 3:
        return 'No Major.Minor.Patch elements found'
    patch, plus, build = parts[2].partition('+')
    patch, minus, pre = patch.partition('-')
    for name, number in (('major', parts[0]), ('minor', parts[1]), ('patch', patch)):
        if not number.isdigit() or not number.isascii():
            return f'Invalid character(s) found in {name} number "{number}"'
        if len(number) > 1 and number[0] == '0':
            return f'{name.capitalize()} number must not contain leading zeroes "{number}"'
    for part in pre.split('.') if minus else ():
        if not part:
            return 'Prerelease is empty'
        if not re.fullmatch(r'[0-9A-Za-z-]+', part):
            return f'Invalid character(s) found in prerelease "{part}"'
        if part.isdigit() and len(part) > 1 and part[0] == '0':
            return f'Numeric PreRelease version must not contain leading zeroes "{part}"'
    for part in build.split('.') if plus else ():
        if not part:
            return 'Build meta data is empty'
        if not re.fullmatch(r'[0-9A-Za-z-]+', part):
            return f'Invalid character(s) found in build meta data "{part}"'
    return Semver(int(parts[0]), int(parts[1]), int(patch), tuple(pre.split('.')) if minus else ())


def _semver(text: str, normalize: bool = False) -> Any:
    parsed = _parse_semver(text, normalize)
    return _error(parsed) if isinstance(parsed, str) else parsed


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, Semver):
        x: tuple[Any, ...] = a.key()
        y: tuple[Any, ...] = b.key()
        return int(x > y) - int(x < y)
    p, q = _as_fraction(a), _as_fraction(b)
    return (p > q) - (p < q)


# ----------------------------------------------------------------------------------------------------
# The functions by their CEL names (receiver-style calls get the receiver first), for ``program()``.

FUNCTIONS: dict[str, Callable[..., Any]] = {
    'charAt': _char_at,
    'indexOf': _index_of,
    'lastIndexOf': _last_index_of,
    'lowerAscii': lambda text: _ascii(text, str.lower),
    'upperAscii': lambda text: _ascii(text, str.upper),
    'replace': _replace,
    'split': _split,
    'substring': _substring,
    'trim': lambda text: StringType(text.strip()),
    'join': _join,
    'isSorted': _is_sorted,
    'sum': _sum,
    'min': _extreme('min', min),
    'max': _extreme('max', max),
    'find': _find,
    'findAll': _find_all,
    'quantity': _quantity,
    'isQuantity': lambda text: BoolType(Quantity.parse(text) is not None),
    'isInteger': lambda q: BoolType(q.is_integer()),
    'asInteger': _as_integer,
    'asApproximateFloat': lambda q: DoubleType(float(q.value)),
    'add': lambda q, other: q.plus(other),
    'sub': lambda q, other: q.plus(other, -1),
    'compareTo': lambda a, b: IntType(_compare(a, b)),
    'isGreaterThan': lambda a, b: BoolType(_compare(a, b) > 0),
    'isLessThan': lambda a, b: BoolType(_compare(a, b) < 0),
    'url': _url,
    'isURL': lambda text: BoolType(_parse_url(text) is not None),
    'getScheme': lambda url: StringType(url.parts.scheme),
    'getHost': lambda url: StringType(url.parts.netloc.rpartition('@')[2]),
    'getHostname': lambda url: StringType(url.parts.hostname or ''),
    'getPort': lambda url: StringType(str(url.parts.port) if url.parts.port is not None else ''),
    'getEscapedPath': lambda url: StringType(url.parts.path),
    'getQuery': _get_query,
    'ip': _ip,
    'isIP': lambda text: BoolType(_parse_ip(text) is not None),
    'cidr': _cidr,
    'isCIDR': lambda text: BoolType(_parse_cidr(text) is not None),
    'family': lambda ip: IntType(ip.address.version),
    'isUnspecified': lambda ip: BoolType(ip.address.is_unspecified),
    'isLoopback': lambda ip: BoolType(ip.address.is_loopback),
    'isLinkLocalMulticast': lambda ip: BoolType(ip.address in _LINK_LOCAL_MULTICAST[ip.address.version]),
    'isLinkLocalUnicast': lambda ip: BoolType(ip.address.is_link_local and not ip.address.is_multicast),
    'isGlobalUnicast': lambda ip: BoolType(not (ip.address.is_unspecified or ip.address.is_loopback
                                                or ip.address.is_multicast or ip.address.is_link_local
                                                or ip.address == ipaddress.ip_address('255.255.255.255'))),
    'containsIP': _contains_ip,
    'containsCIDR': _contains_cidr,
    'masked': _masked,
    'prefixLength': lambda cidr: IntType(cidr.network.prefixlen),
    'semver': _semver,
    'isSemver': lambda text, normalize=False: BoolType(isinstance(_parse_semver(text, normalize), Semver)),
    'major': lambda v: IntType(v.version[0]),
    'minor': lambda v: IntType(v.version[1]),
    'patch': lambda v: IntType(v.version[2]),
}
