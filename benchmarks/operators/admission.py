"""
The benchmark operator: one validating and one mutating handler, served by ``kopf.WebhookServer`` over TLS.

The same file runs under both implementations. Configured by the environment: ``BENCH_WEBHOOK_PORT``,
``BENCH_CERTFILE`` & ``BENCH_PKEYFILE`` (a certificate made by the benchmark: Kopf 1.45.2's self-signed
one cannot be made on OpenSSL 3.0.10+), ``BENCH_SYNC_HANDLERS=1`` for sync handlers (in the executor)
instead of async ones. The webhook configurations are not managed: the benchmark posts the reviews itself.
"""
import os

import kopf


def check(spec: kopf.Spec, warnings: list[str]) -> None:
    if spec.get('numbers') == 'bad':
        raise kopf.AdmissionError('Numbers must be a list.', code=400)
    if spec.get('warn'):
        warnings.append('A warning.')


def default(spec: kopf.Spec, patch: kopf.Patch) -> None:
    if 'numbers' not in spec:
        patch.spec['numbers'] = [1, 2, 3]


if os.environ.get('BENCH_SYNC_HANDLERS') == '1':
    @kopf.on.validate('kopfexamples')
    def validate_fn(spec: kopf.Spec, warnings: list[str], **_: object) -> None:
        check(spec, warnings)

    @kopf.on.mutate('kopfexamples')
    def mutate_fn(spec: kopf.Spec, patch: kopf.Patch, **_: object) -> None:
        default(spec, patch)
else:
    @kopf.on.validate('kopfexamples')
    async def validate_fn(spec: kopf.Spec, warnings: list[str], **_: object) -> None:
        check(spec, warnings)

    @kopf.on.mutate('kopfexamples')
    async def mutate_fn(spec: kopf.Spec, patch: kopf.Patch, **_: object) -> None:
        default(spec, patch)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: object) -> None:
    settings.admission.server = kopf.WebhookServer(
        addr='127.0.0.1', port=int(os.environ['BENCH_WEBHOOK_PORT']),
        certfile=os.environ['BENCH_CERTFILE'], pkeyfile=os.environ['BENCH_PKEYFILE'],
    )
    settings.posting.enabled = False
