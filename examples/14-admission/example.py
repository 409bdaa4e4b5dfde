"""
Admission: validating and mutating webhooks, served by the operator itself.

* ``@kopf.on.validate`` handlers accept or deny the API requests before the objects are stored:
  raise ``kopf.AdmissionError`` (with a message and an HTTP code) to deny; add to ``warnings``
  to warn the user (``kubectl`` shows them).
* ``@kopf.on.mutate`` handlers change the objects before they are stored: modify the ``patch``
  (changes to ``body``/``spec`` are not remembered); the framework returns it as a JSON-patch.
* A webhook server must be configured: here, ``kopf.WebhookServer`` on a local port with
  a self-signed certificate (for local clusters, use ``kopf.WebhookK3dServer``,
  ``kopf.WebhookMinikubeServer``, ``kopf.WebhookAutoServer``; for remote ones, ``kopf.WebhookAutoTunnel``).
* ``settings.admission.managed``: the operator creates & maintains the validating and mutating
  webhook configurations of its handlers (and removes its webhooks from them when it exits).

Run it with: kopf run examples/14-admission/example.py --verbose
"""
import os
from typing import Any

import kopf


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Port 0: any free port; the managed configurations get the actual one.
    port = int(os.environ.get('EXAMPLE_WEBHOOK_PORT', '0'))
    settings.admission.server = kopf.WebhookServer(addr='127.0.0.1', port=port)
    settings.admission.managed = 'auto.kopf.dev'


@kopf.on.validate('kopfexamples')
def say_hello(warnings: list[str], **_: Any) -> None:
    warnings.append("Verified with the operator's hook.")


@kopf.on.validate('kopfexamples')
def check_numbers(spec: kopf.Spec, **_: Any) -> None:
    if not isinstance(spec.get('numbers', []), list):
        raise kopf.AdmissionError('Numbers must be a list if present.', code=422)


@kopf.on.validate('kopfexamples')
def numbers_range(spec: kopf.Spec, warnings: list[str], **_: Any) -> None:
    numbers = spec.get('numbers', [])
    if isinstance(numbers, list):
        for value in numbers:
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise kopf.AdmissionError(f'Cannot convert {value!r} to a number.', code=422) from None
            if not 0 <= number <= 100:
                raise kopf.AdmissionError('Numbers must be within 0..100.', code=422)
            if not isinstance(value, (int, float)):
                warnings.append(f'{value!r} is not a number but can be converted.')


@kopf.on.mutate('kopfexamples', operation='CREATE')
def ensure_default_numbers(spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
    if 'numbers' not in spec:
        patch.spec['numbers'] = [1, 2, 3]


@kopf.on.mutate('kopfexamples')
def convert_numbers_if_possible(spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
    if isinstance(spec.get('numbers'), list):
        patch.spec['numbers'] = [_maybe_number(value) for value in spec['numbers']]


def _maybe_number(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


@kopf.on.create('kopfexamples')
@kopf.on.update('kopfexamples', field='spec')
def report_fn(spec: kopf.Spec, logger: kopf.Logger, **_: Any) -> dict[str, Any]:
    logger.info(f'The admitted numbers are: {spec.get("numbers")}')
    return {'numbers': spec.get('numbers')}
