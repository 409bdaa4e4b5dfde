import pytest

import kopf
from kopf._kits import hierarchies


@pytest.mark.parametrize('name', [
    'adopt', 'label', 'harmonize_naming', 'adjust_namespace',
    'append_owner_reference', 'remove_owner_reference',
    'build_owner_reference', 'build_object_reference',
    'OwnerReference', 'ObjectReference',
])
def test_public_names(name: str) -> None:
    assert getattr(kopf, name) is getattr(hierarchies, name)
