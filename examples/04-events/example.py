"""
Kubernetes events: report what the operator does in ``kubectl describe kopfexample kopf-example-1``.

``kopf.info()``, ``kopf.warn()``, ``kopf.exception()`` (and ``kopf.event()`` for custom types)
post events about any object; they return at once, the posting happens in the background.
By default, only these explicit calls become events; here, the operator's own log messages
about the objects (e.g. "Handler 'create_fn' succeeded.") are also posted, as in the startup handler.

Run it with: kopf run examples/04-events/example.py --verbose
"""
from typing import Any

import kopf


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.loggers = True  # also post the per-object log messages (at INFO level and above)


@kopf.on.create('kopfexamples')
def create_fn(body: kopf.Body, spec: kopf.Spec, **_: Any) -> None:
    kopf.info(body, reason='Provisioned', message=f'Provisioned with field={spec.get("field")!r}.')


@kopf.on.update('kopfexamples', field='spec.field')
def update_fn(body: kopf.Body, old: Any, new: Any, **_: Any) -> None:
    kopf.warn(body, reason='FieldChanged', message=f'spec.field changed from {old!r} to {new!r}.')


@kopf.on.delete('kopfexamples')
def delete_fn(body: kopf.Body, **_: Any) -> None:
    try:
        release_external_resources()
    except ConnectionError:
        # Do not block the deletion because of it; leave a trace instead: kopf.exception() adds
        # the error's text to the message. (Such events remain even when the object is gone.)
        kopf.exception(body, reason='CleanupFailed', message='The external resources are not released:')


def release_external_resources() -> None:
    raise ConnectionError('The external system is unreachable.')  # a stand-in for a real cleanup
