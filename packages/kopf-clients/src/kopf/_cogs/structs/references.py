"""
References to resources and namespaces: what the API client needs to build URLs.

``Resource`` is a fully known resource, as discovered from the cluster's API.
Selectors (what handlers ask for) and namespace patterns are matched against it.
"""
import dataclasses
import enum
import urllib.parse
from collections.abc import Mapping
from typing import NewType

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
            parts.append(f'namespaces/{urllib.parse.quote(namespace, safe="")}')
        parts.append(self.plural)
        if name is not None:
            parts.append(urllib.parse.quote(name, safe=''))
        if subresource is not None:
            parts.append(urllib.parse.quote(subresource, safe=''))
        url = '/'.join(parts)
        if params:
            url += '?' + urllib.parse.urlencode(params)
        return (server.rstrip('/') if server else '') + url
