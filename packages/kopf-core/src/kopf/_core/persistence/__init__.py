"""
The persistence of the operator's state in (or beside) the objects: the lowest layer of the core.

* :mod:`.progress`: the handlers' progress records (retries, successes, failures, delays).
* :mod:`.diffbase`: the essence of the objects as last handled: the base for the diffs.
* :mod:`.finalizers`: blocking and allowing the deletion of the objects.
* :mod:`.conventions`: how the annotation keys are formed, marked, and cleaned.

The storages read from :class:`kopf.Body` and write into :class:`kopf.Patch`; they never
talk to the API themselves. This layer knows nothing about handlers, causes, or the reactor:
the handlers are referred to by their ids as plain strings.
"""
from kopf._core.persistence.conventions import (
    CollisionEvadingConvention,
    StorageKeyFormingConvention,
    StorageKeyMarkingConvention,
    StorageStanzaCleaner,
)
from kopf._core.persistence.diffbase import (
    AnnotationsDiffBaseStorage,
    DiffBaseStorage,
    MultiDiffBaseStorage,
    StatusDiffBaseStorage,
)
from kopf._core.persistence.finalizers import (
    DEFAULT_FINALIZER,
    is_deletion_blocked,
    is_deletion_ongoing,
    make_allowing_json_patch,
    make_blocking_json_patch,
)
from kopf._core.persistence.progress import (
    AnnotationsProgressStorage,
    MultiProgressStorage,
    ProgressRecord,
    ProgressStorage,
    SmartProgressStorage,
    StatusProgressStorage,
)

__all__ = [
    'DEFAULT_FINALIZER',
    'AnnotationsDiffBaseStorage',
    'AnnotationsProgressStorage',
    'CollisionEvadingConvention',
    'DiffBaseStorage',
    'MultiDiffBaseStorage',
    'MultiProgressStorage',
    'ProgressRecord',
    'ProgressStorage',
    'SmartProgressStorage',
    'StatusDiffBaseStorage',
    'StatusProgressStorage',
    'StorageKeyFormingConvention',
    'StorageKeyMarkingConvention',
    'StorageStanzaCleaner',
    'is_deletion_blocked',
    'is_deletion_ongoing',
    'make_allowing_json_patch',
    'make_blocking_json_patch',
]
