"""The benchmark operator: one create handler that returns a small dict (stored in status)."""
import kopf


@kopf.on.create('kopfexamples')
def create_fn(**_: object) -> dict[str, str]:
    return {'message': 'hello'}
