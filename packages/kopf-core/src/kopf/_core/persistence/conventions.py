"""
The conventions shared by the storages: how annotation keys are formed, marked, and cleaned.

Kubernetes limits the name part of an annotation key to 63 characters, and Kopf's older
versions limited the whole key (with its prefix) to the same length. To stay readable
by both, a long key is truncated and suffixed with a short hash, and both the "V2" key
(only the name limited) and the "V1" key (the whole key limited) are written; they are
the same for short keys, so only one is written then. The hash is blake2b of 4 bytes in
base64 with ``-`` and ``.`` instead of ``+`` and ``/`` (the annotation-safe alphabet),
without the ``=`` padding. The V2 key hashes the key as given, the V1 key hashes its
"safe" form (``/`` replaced with ``.``): this is what Kopf writes, so it is kept as is.

Deployments copy their annotations to their ReplicaSets. If both are served by Kopf-based
operators, the ReplicaSet would look as already handled. So, for a ReplicaSet owned by a
Deployment, the keys get an ``-ofDRS`` mark ("of Deployment's ReplicaSet").

Operators with a non-default prefix put a ``{prefix}/kopf-managed`` marker on the objects,
so that other Kopf-based operators exclude that prefix from the objects' essence too
(otherwise, every write of one operator would be a change for another one).
"""
import base64
import functools
import hashlib
import json
from collections.abc import Collection, Iterable, Mapping, MutableMapping
from typing import Any, cast

from kopf._cogs.helpers import jsons
from kopf._cogs.structs import bodies, dicts, patches

# The essences as the storages get them: typed (as in the public API) or plain dicts.
AnyEssence = bodies.BodyEssence | MutableMapping[str, Any]

# The limit of the name part of annotation keys (V2) and of the whole key in the older Kopf (V1).
MAX_KEY_LENGTH = 63

# Kopf's own prefix: its annotations are never a part of the objects' essence, marked or not.
KNOWN_PREFIXES: frozenset[str] = frozenset({'kopf.zalando.org'})

# The name of the marker that declares its prefix as belonging to some Kopf-based operator.
MARKER_NAME = 'kopf-managed'
KNOWN_MARKERS: frozenset[str] = frozenset({MARKER_NAME})
MARKER_VALUE = 'yes'
_MARKER_SUFFIXES = tuple(f'/{marker}' for marker in KNOWN_MARKERS)

# The annotations that are never a part of the objects' essence: written by kubectl on every apply.
SYSTEM_ANNOTATIONS: frozenset[str] = frozenset({'kubectl.kubernetes.io/last-applied-configuration'})

# The mark of the keys on ReplicaSets owned by Deployments (which copy their annotations to them).
REPLICASET_OF_DEPLOYMENT_MARK = '-ofDRS'


def annotations_of(body: Mapping[str, Any]) -> Mapping[str, str]:
    """The annotations of an object (raw or a view); empty if there are none."""
    metadata = body.get('metadata')
    # The exact-dict checks go first: they are the usual case, and much faster than the ABC checks.
    # (None, i.e. absent, is the usual non-dict: the ABC's check is a Python-level call even for it.)
    annotations = None
    if type(metadata) is dict or (metadata is not None and isinstance(metadata, Mapping)):
        annotations = metadata.get('annotations')
    if type(annotations) is dict or (annotations is not None and isinstance(annotations, Mapping)):
        return annotations
    return {}


def split_annotation_key(key: str) -> tuple[str, str] | None:
    """The prefix (domain) and the name of an annotation key; ``None`` if it has no prefix."""
    prefix, slash, name = key.partition('/')
    return (prefix, name) if slash else None


@functools.lru_cache(maxsize=4096)
def _hash_suffix(key: str) -> str:
    digest = hashlib.blake2b(key.encode('utf-8'), digest_size=4).digest()
    return '-' + base64.b64encode(digest, altchars=b'-.').decode('ascii').rstrip('=')


class CollisionEvadingConvention:
    """
    Marks the keys of the objects that are known to get other objects' annotations copied.

    The only known case is a ReplicaSet owned by a Deployment: the Deployment controller copies
    the Deployment's annotations (and so, its Kopf-related annotations) to its ReplicaSets.
    """

    def mark_key(self, key: str, *, body: bodies.Body) -> str:
        if body.get('kind') == 'ReplicaSet':
            metadata = body.get('metadata')
            owners = metadata.get('ownerReferences') if isinstance(metadata, Mapping) else None
            if isinstance(owners, list) and any(
                isinstance(owner, Mapping) and owner.get('kind') == 'Deployment' for owner in owners
            ):
                return key + REPLICASET_OF_DEPLOYMENT_MARK
        return key


class StorageKeyFormingConvention(CollisionEvadingConvention):
    """
    Forms the annotation keys for the storages: prefixed, safe, within the length limits.

    See the module's description for the V1/V2 keys and their hashing.
    The ``prefix`` is required: unprefixed annotations would collide with the users' ones.
    """

    prefix: str
    v1: bool

    # The keys are formed for every handler of every object in every cycle, always the same ones:
    # they are remembered per storage (by everything they depend on), within a sane limit.
    _MAX_CACHED_KEYS = 1024

    def __init__(self, *args: Any, prefix: str, v1: bool, **kwargs: Any) -> None:
        if not prefix:
            raise ValueError('Annotations storages must be prefixed.')
        super().__init__(*args, **kwargs)
        self.prefix = prefix
        self.v1 = v1
        self._cached_keys: dict[tuple[str, bool, str], tuple[str, ...]] = {}

    def make_keys(self, key: str, *, body: bodies.Body | None = None) -> Iterable[str]:
        """All the keys to write and to read (in the order of precedence) for one logical key."""
        # The marking (done for every key of every object) marks only the ReplicaSets: the other kinds
        # are known to keep their keys without a call, unless the marking is redefined by a descendant.
        if body is None or (body.get('kind') != 'ReplicaSet' and
                            type(self).mark_key is CollisionEvadingConvention.mark_key):
            marked_key = key
        else:
            marked_key = self.mark_key(key, body=body)
        # Absent if a descendant skips our __init__: then, no caching.
        cache: dict[tuple[str, bool, str], tuple[str, ...]] | None = self.__dict__.get('_cached_keys')
        cache_key = (self.prefix, self.v1, marked_key)
        if cache is not None and cache_key in cache:
            return cache[cache_key]
        v2_key = self.make_v2_key(marked_key)
        if not self.v1:
            keys: tuple[str, ...] = (v2_key,)
        else:
            v1_key = self.make_v1_key(marked_key)
            keys = (v2_key,) if v1_key == v2_key else (v2_key, v1_key)
        if cache is not None:
            if len(cache) >= self._MAX_CACHED_KEYS:
                cache.clear()
            cache[cache_key] = keys
        return keys

    def make_v1_key(self, key: str, max_length: int = MAX_KEY_LENGTH) -> str:
        """The key as older Kopf versions formed it: the whole key is limited, the safe key is hashed."""
        safe_key = self.make_safe_key(key)
        full_key = f'{self.prefix}/{safe_key}'
        if len(full_key) <= max_length:
            return full_key
        suffix = self.make_suffix(safe_key)
        # With very long prefixes, the length goes negative and cuts from the end: that is what
        # Kopf writes for such prefixes, so it is reproduced rather than "fixed".
        name_length = max_length - len(self.prefix) - 1 - len(suffix)
        return f'{self.prefix}/{safe_key[:name_length]}{suffix}'

    def make_v2_key(self, key: str, max_length: int = MAX_KEY_LENGTH) -> str:
        """The key as Kubernetes limits it: only the name part is limited, the original key is hashed."""
        safe_key = self.make_safe_key(key)
        if len(safe_key) <= max_length:
            return f'{self.prefix}/{safe_key}'
        suffix = self.make_suffix(key)
        return f'{self.prefix}/{safe_key[:max_length - len(suffix)]}{suffix}'

    def make_suffix(self, key: str) -> str:
        return _hash_suffix(key)

    @staticmethod
    def make_safe_key(key: str) -> str:
        """Slashes are not allowed in the name part of annotation keys (e.g. in sub-handlers' ids)."""
        return key.replace('/', '.')


_NO_PREFIXES: frozenset[str] = frozenset()


class StorageKeyMarkingConvention:
    """
    Declares the storages' prefixes as Kopf-managed, and detects such prefixes on the objects.

    The marker is written once per object, together with the first write of a storage,
    unless the prefix is Kopf's own (known to all Kopf-based operators anyway).
    """

    def detect_marked_prefixes(self, keys: Iterable[str]) -> frozenset[str]:
        """The prefixes declared as Kopf-managed by the markers among these annotation keys."""
        marked: set[str] | None = None
        for key in keys:
            if key.endswith(_MARKER_SUFFIXES):  # not split: this is done for every key of every event
                parts = split_annotation_key(key)
                if parts is not None and parts[1] in KNOWN_MARKERS:
                    marked = marked if marked is not None else set()
                    marked.add(parts[0])
        return frozenset(marked) if marked is not None else _NO_PREFIXES  # usually none: no sets made

    def store_marker(self, prefix: str, patch: patches.Patch, body: bodies.Body) -> None:
        """Put the marker of the prefix into the patch, unless the object has it or needs none."""
        if prefix in KNOWN_PREFIXES:
            return
        marker_key = f'{prefix}/{MARKER_NAME}'
        if marker_key not in annotations_of(body):
            patch.meta.annotations[marker_key] = MARKER_VALUE


class StorageStanzaCleaner:
    """Helpers to remove the storages' own data from the essences, leaving no empty stanzas behind."""

    @staticmethod
    def remove_annotations(essence: AnyEssence, keys_to_remove: Collection[str]) -> None:
        """Remove these annotations from the essence, in place."""
        mutable: MutableMapping[str, Any] = essence  # type: ignore[assignment]  # not cast(): it is a call
        metadata = mutable.get('metadata')
        annotations = None
        if type(metadata) is dict or (metadata is not None and isinstance(metadata, MutableMapping)):
            annotations = metadata.get('annotations')
        if type(annotations) is dict or (annotations is not None and isinstance(annotations, MutableMapping)):
            for key in keys_to_remove:
                annotations.pop(key, None)

    @staticmethod
    def remove_empty_stanzas(essence: AnyEssence) -> None:
        """Remove the empty annotations, labels, metadata, status of the essence, in place."""
        mutable: MutableMapping[str, Any] = essence  # type: ignore[assignment]  # not cast(): it is a call
        metadata = mutable.get('metadata')
        # The exact-dict & None checks go first: the ABC's check is a Python-level call, and this is frequent.
        if type(metadata) is dict or (metadata is not None and isinstance(metadata, MutableMapping)):
            for field in ('annotations', 'labels'):
                if field in metadata and not metadata[field]:
                    del metadata[field]
            if not metadata:
                del mutable['metadata']
        if 'status' in mutable and not mutable['status']:
            del mutable['status']

    @staticmethod
    def has_empty_stanzas(essence: AnyEssence) -> bool:
        """Whether :meth:`remove_empty_stanzas` might change the essence (the usual essences have none)."""
        metadata = essence.get('metadata')
        if metadata is not None and (type(metadata) is not dict or not metadata or
                                     ('annotations' in metadata and not metadata['annotations']) or
                                     ('labels' in metadata and not metadata['labels'])):
            return True
        return 'status' in essence and not essence['status']


def parse_named_field(field: dicts.FieldSpec, name: str) -> dicts.FieldPath:
    """A field path, with the ``{name}`` placeholder in the dotted form replaced by the name."""
    if isinstance(field, str):
        field = field.format(name=name)
    return dicts.parse_field(field)


def copy_json(value: Any) -> Any:
    """
    A deep copy of JSON-like data (dicts, lists, scalars), much faster than ``copy.deepcopy``.

    Other containers (e.g. tuples, sets) and objects are kept as they are: they are not expected
    in the objects' bodies and the records, and copying them blindly could break them.

    Deeply nested data (hundreds of levels, which the API accepts) would exceed Python's recursion
    limit in the fast recursive copy: such data is copied level by level with a stack of its own.
    """
    try:
        return _copy_json_recursively(value)
    except RecursionError:
        return _copy_json_iteratively(value)


def _copy_json_recursively(value: Any) -> Any:
    # The scalars (most of the items) are kept with one look; all the rest goes through the same checks
    # as the value itself (as in the iterative copy): the nested mappings other than dicts are copied too.
    if type(value) is dict:
        return {key: item if type(item) in _SCALARS else _copy_json_recursively(item)
                for key, item in value.items()}
    if type(value) is list:
        return [item if type(item) in _SCALARS else _copy_json_recursively(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _copy_json_recursively(item) for key, item in value.items()}
    return value


def _copy_json_iteratively(value: Any) -> Any:
    def shell(source: Any) -> Any:
        if type(source) is list:
            return [None] * len(source)
        if type(source) is dict or isinstance(source, Mapping):
            return {}
        return source

    root = shell(value)
    stack: list[tuple[Any, Any]] = [(value, root)] if root is not value else []
    while stack:
        source, target = stack.pop()
        items = enumerate(source) if type(source) is list else source.items()
        for key, item in items:
            copied = shell(item)
            target[key] = copied
            if copied is not item:
                stack.append((item, copied))
    return root


_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None)})


@functools.lru_cache(maxsize=1024)
def _parse_json(text: str) -> Any:
    return jsons.loads(text)  # orjson if installed: the same results as the standard library's, faster


def decode_json(text: str) -> Any:
    """
    Parse a JSON-serialised annotation into a private result: the callers can modify it freely.

    Invalid JSON raises ``ValueError`` (a JSON error). With orjson, every call parses anew: parsing a small
    object's diff-base is faster than copying it from a cache (benchmarks/README.md). With the standard
    library, parsing is the slower one: each distinct value is parsed only once while it is in use
    (the same records are read several times per handling cycle), and the callers get copies of it.
    """
    if jsons.ACCELERATED:
        return jsons.loads(text)
    return copy_json(_parse_json(text))


# The same as json.dumps(value, separators=...), which would make a new encoder on every call.
_COMPACT_JSON_ENCODER = json.JSONEncoder(separators=(',', ':'))


def encode_json(value: Any) -> str:
    """The compact JSON form of the value, as Kopf writes it (no spaces, ASCII-only)."""
    return _COMPACT_JSON_ENCODER.encode(value)


def remove_along(essence: AnyEssence, path: Iterable[str]) -> None:
    """
    Remove the field, and then every dict on its path that is (or has become) empty.

    The empty dicts on the path are removed even if the field itself is absent: this is how Kopf
    cleans the essences. The dicts on the path are copied before being modified, so that
    the essences that share them (e.g. the one this one is a shallow copy of) stay intact.
    """
    keys = path if isinstance(path, tuple) else tuple(path)
    if not keys or keys[0] not in essence:  # the usual case (e.g. no status in the essences): nothing to do
        return
    chain: list[MutableMapping[str, Any]] = [cast('MutableMapping[str, Any]', essence)]
    for key in keys[:-1]:
        child = chain[-1].get(key)
        if not isinstance(child, Mapping):
            break
        copied = dict(child)
        chain[-1][key] = copied
        chain.append(copied)
    else:
        chain[-1].pop(keys[-1], None)
    for parent, key in zip(reversed(chain[:-1]), reversed(keys[:len(chain) - 1]), strict=True):
        child = parent.get(key)
        if isinstance(child, Mapping) and not child:
            del parent[key]
        else:
            break


def shorten(text: str, limit: int = 60) -> str:
    """The text cut to the limit (marked so), for the messages about the stored values (they can be long)."""
    return text if len(text) <= limit else text[:limit] + '...'


def excerpt(text: str, limit: int = 60) -> str:
    """A short quotation of a stored text for the messages."""
    return repr(shorten(text, limit))


def describe_json(value: Any) -> str:
    """What the parsed JSON value is, in words: 'a JSON array', 'a JSON string', etc."""
    if value is None:
        return 'JSON null'
    if isinstance(value, bool):
        return 'a JSON boolean'
    if isinstance(value, (int, float)):
        return 'a JSON number'
    if isinstance(value, str):
        return 'a JSON string'
    if isinstance(value, list):
        return 'a JSON array'
    return 'a JSON object'

