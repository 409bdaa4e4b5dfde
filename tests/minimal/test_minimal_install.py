"""
Run in tox's `minimal` environment: only kopf-clients and kopf-core are installed, from wheels.

`import kopf` must work for embedding; names of the absent upper distributions must explain
what to install instead of failing obscurely.
"""
import importlib.metadata
import importlib.util
import pathlib
import subprocess
import sys

import pytest


def is_installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    is_installed('kopf-webhooks') or is_installed('kopf-testing') or is_installed('kopf-cli'),
    reason='Only meaningful when just kopf-clients and kopf-core are installed (tox -e minimal).',
)


def test_kopf_imports_with_core_only() -> None:
    import kopf

    assert kopf.Resource('', 'v1', 'pods').api_version == 'v1'
    assert kopf.EVERYTHING is not None


def test_star_import_works_with_core_only() -> None:
    namespace: dict[str, object] = {}
    exec('from kopf import *', namespace)  # the webhooks' names are not in __all__ without kopf-webhooks
    assert 'Resource' in namespace and 'AiohttpSession' in namespace
    assert 'WebhookServer' not in namespace


def test_lazy_upper_name_names_its_distribution() -> None:
    import kopf

    with pytest.raises(ImportError) as err:
        _ = kopf.WebhookServer
    assert "'kopf-webhooks'" in str(err.value)
    assert 'pip install kopf-webhooks' in str(err.value)


def test_testing_subpackage_names_its_distribution() -> None:
    import kopf

    with pytest.raises(ImportError, match=r"kopf\.testing is provided by the 'kopf-testing' distribution"):
        _ = kopf.testing


def test_admission_types_are_there_before_the_webhooks() -> None:
    import kopf

    assert kopf.UserInfo.__annotations__.keys() == {'username', 'uid', 'groups'}
    assert set(kopf.WebhookClientConfig.__annotations__) == {'caBundle', 'url', 'service'}
    assert kopf.Operation.__args__ == ('CREATE', 'UPDATE', 'DELETE', 'CONNECT')  # type: ignore[attr-defined]


def test_unknown_name_is_a_plain_attribute_error() -> None:
    import kopf

    with pytest.raises(AttributeError, match='no attribute'):
        _ = kopf.NoSuchThingAnywhere


def test_upper_packages_are_absent() -> None:
    assert importlib.util.find_spec('kopf.testing') is None
    assert importlib.util.find_spec('kopf._cli') is None


def test_type_markers_are_shipped() -> None:
    import kopf

    root = pathlib.Path(kopf.__file__).parent
    assert (root / 'py.typed').is_file()
    assert (root / '_cogs' / 'py.typed').is_file()
    assert (root / '_clients' / 'py.typed').is_file()


def test_python_dash_m_kopf_is_absent_without_the_cli() -> None:
    result = subprocess.run([sys.executable, '-m', 'kopf'], capture_output=True, text=True)
    assert result.returncode != 0
