"""The benchmark operator: a create handler plus a delete handler (which needs a finalizer)."""
import kopf


@kopf.on.create('kopfexamples')
def create_fn(**_: object) -> dict[str, str]:
    return {'message': 'hello'}


@kopf.on.delete('kopfexamples')
def delete_fn(**_: object) -> None:
    pass
