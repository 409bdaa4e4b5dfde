"""The benchmark operator of ``create_delete`` with async handlers: no executor threads (core_handling.py)."""
import kopf


@kopf.on.create('kopfexamples')
async def create_fn(**_: object) -> dict[str, str]:
    return {'message': 'hello'}


@kopf.on.delete('kopfexamples')
async def delete_fn(**_: object) -> None:
    pass
