"""
References to resources and namespaces: what the API client needs to build URLs.

``Resource`` is a fully known resource, as discovered from the cluster's API.
Selectors (what handlers ask for) and namespace patterns are matched against it.
"""
import dataclasses
import enum
import fnmatch
import re
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, NewType

# A namespace of a namespaced object, or None for cluster-scoped objects or cluster-wide requests.
Namespace = NewType('Namespace', str)
NamespaceName = NewType('NamespaceName', str)


class Marker(enum.Enum):
    """Special values for resource specifications."""

    EVERYTHING = enum.auto()


EVERYTHING = Marker.EVERYTHING


@dataclasses.dataclass(frozen=True)
class Resource:
    """
    A resource of the Kubernetes API as it is discovered: group, version, names, scope, verbs.

    Only ``group``, ``version`` and ``plural`` identify it: the rest is informational
    and is excluded from equality and hashing.
    """

    group: str
    version: str
    plural: str

    kind: str | None = dataclasses.field(default=None, compare=False)
    singular: str | None = dataclasses.field(default=None, compare=False)
    shortcuts: frozenset[str] = dataclasses.field(default=frozenset(), compare=False)
    categories: frozenset[str] = dataclasses.field(default=frozenset(), compare=False)
    subresources: frozenset[str] = dataclasses.field(default=frozenset(), compare=False)
    namespaced: bool | None = dataclasses.field(default=None, compare=False)
    preferred: bool = dataclasses.field(default=True, compare=False)
    verbs: frozenset[str] = dataclasses.field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        # The resources are the keys of the registries' caches, looked up several times for every event:
        # the hash of the identifying fields is computed once (the dataclass's one makes a tuple each time).
        object.__setattr__(self, '_hash', hash((self.group, self.version, self.plural)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined,no-any-return]

    # The strings' hashes differ between processes: a pickled resource gets its hash anew when unpickled.
    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != '_hash'}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def __repr__(self) -> str:
        return self.name if self.group else f'{self.plural}.{self.version}'

    @property
    def name(self) -> str:
        """The kubectl-style name: ``plural.group`` (or just ``plural`` for the core API)."""
        return f'{self.plural}.{self.group}'.strip('.')

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` of the objects: ``group/version``, or ``v1`` for the core API."""
        return f'{self.group}/{self.version}' if self.group else self.version

    def get_url(
            self,
            *,
            server: str | None = None,
            namespace: str | None = None,
            name: str | None = None,
            subresource: str | None = None,
            params: Mapping[str, str] | None = None,
    ) -> str:
        """
        Build the URL of the resource, or of its object, or of the object's subresource.

        For namespaced resources, no namespace means a cluster-wide request (list/watch only).
        For cluster-scoped resources, a namespace is an error: it would silently mean nothing.
        """
        if subresource is not None and name is None:
            raise ValueError('Subresources can be accessed only on named objects.')
        if namespace is not None and self.namespaced is False:
            raise ValueError(f'Cluster-scoped resource {self} cannot have a namespace: {namespace!r}.')
        if namespace is None and name is not None and self.namespaced:
            raise ValueError(f'Namespaced resource {self} needs a namespace for the object {name!r}.')

        base = f'/apis/{self.group}/{self.version}' if self.group else f'/api/{self.version}'
        parts = [base]
        if namespace is not None:
            parts.append(f'namespaces/{_quote(namespace)}')
        parts.append(self.plural)
        if name is not None:
            parts.append(_quote(name))
        if subresource is not None:
            parts.append(_quote(subresource))
        url = '/'.join(parts)
        if params:
            url += '?' + urllib.parse.urlencode(params)
        return (server.rstrip('/') if server else '') + url


# What urllib.parse.quote(..., safe='') leaves as it is: the unreserved characters of URLs (RFC 3986).
_UNRESERVED = re.compile(r'[A-Za-z0-9_.~-]*').fullmatch


def _quote(part: str) -> str:
    """A path segment, percent-encoded: the usual names (RFC 1123 labels) need nothing, so nothing is done."""
    # Every request's URL has 2-3 of these: quote() costs several times the check (benchmarks/README.md).
    return part if _UNRESERVED(part) else urllib.parse.quote(part, safe='')


# A resource predicate: the alternative to naming the resources in a selector.
ResourcePredicate = Callable[[Resource], bool]

# API versions as they appear in the kubectl-style names, e.g. "pods.v1" or "deployments.v1.apps".
_VERSION_RE = re.compile(r'v\d+(?:(?:alpha|beta)\d+)?')


@dataclasses.dataclass(frozen=True, init=False)
class Selector:
    """
    A resource specification of a handler: which of the cluster's resources it serves.

    The positional arguments follow kubectl-like forms, with the resource name always last:
    ``('kopf.dev', 'v1', 'kopfexamples')``, ``('kopf.dev/v1', 'kopfexamples')``,
    ``('kopf.dev', 'kopfexamples')`` (the group's preferred version), ``('v1', 'pods')``
    (the core API), ``('kopfexamples.kopf.dev')``, ``('pods.v1')``, ``('deployments.v1.apps')``,
    or just ``('kopfexamples')`` in any group. The name can be a plural, singular, kind, or short name.
    ``EVERYTHING`` in place of the name selects all resources (in the group/version, if given).

    The keyword arguments are more precise: ``group``, ``version``, and at most one
    of ``kind``, ``plural``, ``singular``, ``shortcut``, ``category``.

    The specification is parsed and validated once, at creation. The equality and hashing
    are by the parsed meaning, not by the form in which it was written.
    """

    group: str | None
    version: str | None
    kind: str | None
    plural: str | None
    singular: str | None
    shortcut: str | None
    category: str | None
    any_name: str | Marker | None
    predicate: ResourcePredicate | None

    def __init__(
            self,
            arg1: str | Marker | ResourcePredicate | None = None,
            arg2: str | Marker | None = None,
            arg3: str | Marker | None = None,
            /,
            *,
            group: str | None = None,
            version: str | None = None,
            kind: str | None = None,
            plural: str | None = None,
            singular: str | None = None,
            shortcut: str | None = None,
            category: str | None = None,
    ) -> None:
        super().__init__()
        predicate: ResourcePredicate | None = None
        positionals: tuple[str | Marker, ...]
        if callable(arg1) and not isinstance(arg1, (str, Marker)):
            if arg2 is not None or arg3 is not None:
                raise TypeError('A resource predicate cannot be combined with other positional arguments.')
            predicate, positionals = arg1, ()
        else:
            positionals = _strip_trailing_nones(arg1, arg2, arg3)
        pos_group, pos_version, any_name = _parse_positionals(positionals)

        if pos_group is not None and group is not None:
            raise TypeError(f'The group is specified twice: {pos_group!r} and group={group!r}.')
        if pos_version is not None and version is not None:
            raise TypeError(f'The version is specified twice: {pos_version!r} and version={version!r}.')
        group = pos_group if pos_group is not None else group
        version = pos_version if pos_version is not None else version

        keyword_names = {
            'kind': kind, 'plural': plural, 'singular': singular, 'shortcut': shortcut, 'category': category,
        }
        given_keywords = {key: value for key, value in keyword_names.items() if value is not None}
        for key, value in given_keywords.items():
            if not value:
                raise ValueError(f'The resource {key} cannot be empty.')
        if any_name is EVERYTHING and given_keywords:
            raise TypeError(f'EVERYTHING cannot be combined with specific names: {given_keywords!r}.')
        if any_name is not None and given_keywords:
            raise TypeError(f'The resource name {any_name!r} is ambiguous with {given_keywords!r}.')
        if len(given_keywords) > 1:
            raise TypeError(f'Only one resource name can be specified, got: {given_keywords!r}.')
        if any_name is None and not given_keywords and predicate is None:
            raise TypeError('A resource name, a category, or EVERYTHING (or a predicate) is required.')
        if version is not None and not version:
            raise ValueError('The API version cannot be empty.')
        if '/' in (group or '') or '/' in (version or ''):
            raise ValueError(f'The group and the version must not contain slashes: {group!r}, {version!r}.')

        object.__setattr__(self, 'group', group)
        object.__setattr__(self, 'version', version)
        object.__setattr__(self, 'kind', kind)
        object.__setattr__(self, 'plural', plural)
        object.__setattr__(self, 'singular', singular)
        object.__setattr__(self, 'shortcut', shortcut)
        object.__setattr__(self, 'category', category)
        object.__setattr__(self, 'any_name', any_name)
        object.__setattr__(self, 'predicate', predicate)

    def __repr__(self) -> str:
        parts = [
            f'{field.name}={getattr(self, field.name)!r}'
            for field in dataclasses.fields(self) if getattr(self, field.name) is not None
        ]
        return f'{type(self).__name__}({", ".join(parts)})'

    @property
    def is_specific(self) -> bool:
        """Whether one specific resource is meant (by a name), not many (by a category, EVERYTHING)."""
        return (
            isinstance(self.any_name, str) or
            self.kind is not None or
            self.plural is not None or
            self.singular is not None or
            self.shortcut is not None
        )

    def check(self, resource: Resource) -> bool:
        """Whether the resource matches the selector (ignoring the ambiguities with other resources)."""
        if self.group is not None and resource.group != self.group:
            return False
        if self.version is not None and resource.version != self.version:
            return False
        if self.version is None and not resource.preferred:
            return False
        if self.kind is not None and resource.kind != self.kind:
            return False
        if self.plural is not None and resource.plural != self.plural:
            return False
        if self.singular is not None and resource.singular != self.singular:
            return False
        if self.shortcut is not None and self.shortcut not in resource.shortcuts:
            return False
        if self.category is not None and self.category not in resource.categories:
            return False
        if self.any_name is EVERYTHING:
            # The core events are produced by the framework itself while handling other resources:
            # serving them by EVERYTHING would cause endless handling cycles.
            if resource.group == '' and resource.plural == 'events':
                return False
        elif isinstance(self.any_name, str) and not _matches_any_name(resource, self.any_name):
            return False
        return self.predicate is None or self.predicate(resource)

    def select(self, resources: Iterable[Resource]) -> set[Resource]:
        """
        Select the matching resources, resolving the ambiguities of the specific names.

        If a specific name matches resources in 2+ API groups, the core API wins (as in kubectl,
        e.g. "pods" vs. "pods.metrics.k8s.io"); if there is no core resource among them,
        nothing is selected, since the intention cannot be guessed.
        """
        matched = {resource for resource in resources if self.check(resource)}
        if self.is_specific and len({resource.group for resource in matched}) > 1:
            matched = {resource for resource in matched if resource.group == ''}
        return matched


def _strip_trailing_nones(*args: str | Marker | None) -> tuple[str | Marker, ...]:
    values = list(args)
    while values and values[-1] is None:
        values.pop()
    if any(value is None for value in values):
        raise TypeError(f'Positional resource arguments cannot have gaps: {tuple(args)!r}.')
    return tuple(value for value in values if value is not None)


def _parse_positionals(args: tuple[str | Marker, ...]) -> tuple[str | None, str | None, str | Marker | None]:
    """Interpret the positional resource specification: return the group, version, and name."""
    if not args:
        return None, None, None
    *api, name = args
    if isinstance(name, str) and not name:
        raise ValueError('The resource name cannot be empty.')
    if isinstance(name, str) and '/' in name:
        raise ValueError(f'The resource name must be the last argument, not a group/version: {name!r}.')
    if any(isinstance(part, Marker) for part in api):
        raise TypeError(f'EVERYTHING can only be in place of the resource name (the last one): {args!r}.')
    api_parts = [part for part in api if isinstance(part, str)]

    if len(api_parts) == 0:
        if isinstance(name, str) and '.' in name:
            return _parse_dotted_name(name)
        return None, None, name

    if len(api_parts) == 1:
        spec = api_parts[0]
        if '/' in spec:
            group, _, version = spec.partition('/')
            if not group or not version or '/' in version:
                raise ValueError(f'The API group/version must be as "group/version", got {spec!r}.')
            return group, version, name
        if spec == 'v1':  # the legacy core API has no group
            return '', 'v1', name
        if not spec:
            raise ValueError('The API group cannot be empty without a version; use "v1" for the core API.')
        return spec, None, name

    group, version = api_parts
    if '/' in group or '/' in version:
        raise ValueError(f'The group and the version must not contain slashes: {group!r}, {version!r}.')
    if not version:
        raise ValueError('The API version cannot be empty.')
    return group, version, name


def _parse_dotted_name(name: str) -> tuple[str | None, str | None, str]:
    """Interpret the kubectl-style names: ``plural.group``, ``plural.version``, ``plural.version.group``."""
    plural, _, rest = name.partition('.')
    if not plural or not rest or '' in rest.split('.'):
        raise ValueError(f'Malformed resource name: {name!r}.')
    first, _, remainder = rest.partition('.')
    if _VERSION_RE.fullmatch(first):
        return remainder, first, plural
    return rest, None, plural


def _matches_any_name(resource: Resource, name: str) -> bool:
    return (
        name == resource.plural or
        name == resource.singular or
        name in resource.shortcuts or
        (resource.kind is not None and name.lower() == resource.kind.lower())
    )


# A namespace pattern: comma-separated globs (with "!" for negation), or a regular expression.
NamespacePattern = str | re.Pattern[str]

_GLOB_CHARS = frozenset(',*?![]')


def match_namespace(name: str, pattern: NamespacePattern) -> bool:
    """
    Check if the namespace name matches one pattern.

    A regular expression must match the whole name. A string is a comma-separated list
    of globs (``*`` and ``?``), each possibly negated with ``!``. The globs are applied
    left to right, and the rightmost matching one decides. The first glob is decisive:
    a name that does not match it does not match the pattern at all; and if it is a negation,
    all names are implied to match initially (as if the pattern started with ``*``).
    """
    if isinstance(pattern, re.Pattern):
        return pattern.fullmatch(name) is not None

    globs = [glob.strip() for glob in pattern.split(',')]
    globs = [glob for glob in globs if glob]
    if not globs:
        return False

    first_negated = globs[0].startswith('!')
    matches = True if first_negated else fnmatch.fnmatchcase(name, globs[0])
    if not matches:
        return False
    for glob in (globs if first_negated else globs[1:]):
        negated = glob.startswith('!')
        mask = glob[1:] if negated else glob
        if fnmatch.fnmatchcase(name, mask):
            matches = not negated
    return matches


def match_namespaces(name: str, patterns: Iterable[NamespacePattern]) -> bool:
    """Check if the namespace name matches any of the patterns (as from several ``--namespace`` options)."""
    return any(match_namespace(name, pattern) for pattern in patterns)


def is_specific_namespace(pattern: NamespacePattern) -> bool:
    """Whether the pattern is just a namespace name: no globs, negations, lists, or regexps."""
    return isinstance(pattern, str) and bool(pattern) and not (_GLOB_CHARS & set(pattern))


def are_specific_namespaces(patterns: Collection[NamespacePattern]) -> bool:
    """
    Whether all patterns are plain namespace names, so that the namespaces need not be listed.

    An empty collection is not "specific": it means no namespace restrictions (cluster-wide).
    """
    return bool(patterns) and all(is_specific_namespace(pattern) for pattern in patterns)


def select_specific_namespaces(patterns: Iterable[NamespacePattern]) -> set[Namespace]:
    """
    Only the plain namespace names of the patterns, with the globs and regexps ignored.

    This is a fallback for when the namespaces cannot be listed/watched: the specific ones
    are served as they are (assuming they exist), the patterns cannot be used at all.
    """
    return {
        Namespace(pattern) for pattern in patterns
        if isinstance(pattern, str) and is_specific_namespace(pattern)
    }
