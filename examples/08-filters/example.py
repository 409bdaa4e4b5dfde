"""
Filters: the handlers are called only for the objects (or changes) that match their criteria.

The sample object (examples/obj.yaml) has ``somelabel: somevalue``, ``someannotation: somevalue``,
and ``spec.field: value``. Every handler that runs returns True, so ``kubectl get kex -o yaml``
shows which of them have matched in the status; the non-matching ones leave no trace at all.
All criteria of one handler must match together.

Run it with: kopf run examples/08-filters/example.py --verbose
"""
from typing import Any

import kopf


# Labels and annotations: exact values, presence, or absence.
@kopf.on.create('kopfexamples',
                labels={'somelabel': 'somevalue'},
                annotations={'someannotation': kopf.PRESENT})
def by_metadata(**_: Any) -> bool:
    return True


@kopf.on.create('kopfexamples', labels={'somelabel': 'othervalue'})
def by_other_label(**_: Any) -> bool:  # never called for the sample object
    return True


@kopf.on.create('kopfexamples', labels={'otherlabel': kopf.ABSENT})
def without_label(**_: Any) -> bool:
    return True


# Any field of the object: a specific value, or kopf.PRESENT/kopf.ABSENT.
@kopf.on.create('kopfexamples', field='spec.field', value='value')
def by_field(**_: Any) -> bool:
    return True


# Updates of a field: from one specific value to another, in this case.
@kopf.on.update('kopfexamples', field='spec.field', old='value', new='changed')
def field_changed(**_: Any) -> bool:
    return True


# Arbitrary callbacks: for the whole object (when=), or for one value (instead of the value itself).
def has_items(spec: kopf.Spec, **_: Any) -> bool:
    return bool(spec.get('items'))


def is_paused(spec: kopf.Spec, **_: Any) -> bool:
    return bool(spec.get('paused'))


def starts_with_some(value: str | None, **_: Any) -> bool:  # None if there is no such label
    return value is not None and value.startswith('some')


def is_lowercase(value: str | None, **_: Any) -> bool:
    return value is not None and value.islower()


def is_uppercase(value: str | None, **_: Any) -> bool:
    return value is not None and value.isupper()


@kopf.on.create('kopfexamples', when=has_items, labels={'somelabel': starts_with_some})
def by_callbacks(**_: Any) -> bool:
    return True


# The callbacks can be combined: kopf.all_(), kopf.any_(), kopf.none_(), kopf.not_().
@kopf.on.create('kopfexamples',
                labels={'somelabel': kopf.all_([is_lowercase, starts_with_some])},
                annotations={'someannotation': kopf.any_([is_uppercase, starts_with_some])},
                when=kopf.none_([is_paused]))
def by_combined_callbacks(**_: Any) -> bool:
    return True


@kopf.on.create('kopfexamples', when=kopf.not_(has_items))
def without_items(**_: Any) -> bool:  # never called for the sample object: it has items
    return True
