"""
Build the six distributions as wheels and install them into fresh virtualenvs, as users would.

These checks follow the packaging recipe of the project: wheel installs, editable installs,
removal of one upper distribution, type markers surviving it, and the `kopf` entry points.
They are slow (virtualenvs, pip), so they run only in tox's `packaging` environment.
"""
import os
import pathlib
import subprocess
import sys
import textwrap
import venv

import pytest

pytestmark = pytest.mark.packaging

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ['kopf-clients', 'kopf-core', 'kopf-webhooks', 'kopf-cli', 'kopf-testing']


def run(*args: str | os.PathLike[str], cwd: pathlib.Path | None = None) -> str:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd)
    assert result.returncode == 0, f'{args} failed:\n{result.stdout}\n{result.stderr}'
    return result.stdout


def make_venv(path: pathlib.Path) -> pathlib.Path:
    venv.create(path, with_pip=True)
    return path / 'bin' / 'python'


@pytest.fixture(scope='module')
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp('wheels')
    run(sys.executable, REPO / 'tools' / 'build_wheels.py', path)  # as the README tells the users
    return path


@pytest.fixture(scope='module')
def wheel_venv(wheelhouse: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    python = make_venv(tmp_path_factory.mktemp('wheel-venv'))
    run(python, '-m', 'pip', 'install', '-q', '--find-links', wheelhouse, 'kopf==0.1.0', 'mypy')
    return python


def test_all_wheels_are_built(wheelhouse: pathlib.Path) -> None:
    names = sorted(p.name.split('-')[0] for p in wheelhouse.glob('*.whl'))
    assert names == sorted(['kopf', 'kopf_clients', 'kopf_core', 'kopf_webhooks', 'kopf_cli', 'kopf_testing'])


def test_meta_package_wheel_has_no_code(wheelhouse: pathlib.Path) -> None:
    import zipfile
    [meta] = wheelhouse.glob('kopf-*.whl')
    names = zipfile.ZipFile(meta).namelist()
    assert not [n for n in names if n.endswith('.py')]


def test_wheels_import_everything(wheel_venv: pathlib.Path) -> None:
    run(wheel_venv, '-c', 'import kopf, kopf.on, kopf.testing, kopf._cli, kopf._clients, kopf._webhooks')


def test_kopf_script_and_python_dash_m(wheel_venv: pathlib.Path) -> None:
    script = wheel_venv.parent / 'kopf'
    for output in [run(script, '--version'), run(wheel_venv, '-m', 'kopf', '--version')]:
        for name in PACKAGES:
            assert f'{name} 0.1.0' in output


def test_types_are_visible_to_mypy(wheel_venv: pathlib.Path, tmp_path: pathlib.Path) -> None:
    user_file = tmp_path / 'my_operator.py'  # not 'operator.py': it shadows the stdlib
    user_file.write_text(textwrap.dedent('''
        import kopf
        resource: kopf.Resource = kopf.Resource('', 'v1', 'pods')
        wrong: int = kopf.Resource('', 'v1', 'pods')
    '''))
    result = subprocess.run([wheel_venv, '-m', 'mypy', '--strict', str(user_file)],
                            capture_output=True, text=True, cwd=tmp_path)
    # Exactly one error: the deliberate one. If types were lost (no py.typed), there would be none.
    assert 'Incompatible types in assignment' in result.stdout, result.stdout
    assert 'Found 1 error' in result.stdout, result.stdout


def test_uninstalling_an_upper_distribution(wheel_venv: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # This test changes the shared venv, so it goes last among the wheel-venv tests.
    run(wheel_venv, '-m', 'pip', 'uninstall', '-q', '-y', 'kopf-webhooks', 'kopf')
    code = textwrap.dedent('''
        import pathlib, kopf
        assert (pathlib.Path(kopf.__file__).parent / 'py.typed').is_file(), 'kopf/py.typed is lost'
        try:
            kopf.WebhookServer
        except ImportError as e:
            assert 'pip install kopf-webhooks' in str(e), str(e)
        else:
            raise AssertionError('kopf.WebhookServer resolved without kopf-webhooks')
    ''')
    run(wheel_venv, '-c', code)


def test_editable_installs(tmp_path: pathlib.Path) -> None:
    python = make_venv(tmp_path / 'editable-venv')
    editables = [arg for name in PACKAGES for arg in ('-e', REPO / 'packages' / name)]
    run(python, '-m', 'pip', 'install', '-q', *editables, '-e', REPO)
    code = 'import kopf, kopf.on, kopf._clients, kopf._cogs, kopf.testing, kopf._cli; '
    code += 'print(len(kopf.__path__))'
    assert int(run(python, '-c', code, cwd=tmp_path).strip()) == 5
    assert 'kopf-core 0.1.0' in run(python, '-m', 'kopf', '--version', cwd=tmp_path)


EMBEDDED_OPERATOR = """
    import asyncio, json, os, pathlib, threading, urllib.request
    import kopf

    @kopf.on.create('configmaps')
    def created(name, **_):
        pathlib.Path(os.environ['MARK_FILE']).write_text(name)

    async def main():
        stop = asyncio.Event()
        operator = asyncio.create_task(kopf.operator(standalone=True, namespaces=['default'], stop_flag=stop))
        body = json.dumps({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'cm1'}}).encode()
        request = urllib.request.Request(os.environ['API_URL'] + '/api/v1/namespaces/default/configmaps',
                                         data=body, method='POST',
                                         headers={'Content-Type': 'application/json'})
        await asyncio.to_thread(urllib.request.urlopen, request)
        for _ in range(200):
            if pathlib.Path(os.environ['MARK_FILE']).exists():
                break
            await asyncio.sleep(0.05)
        stop.set()
        await operator

    asyncio.run(main())
"""


def test_kopf_core_alone_from_the_wheels_embeds_an_operator(
        wheelhouse: pathlib.Path, wheel_venv: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # The README's way for users: `pip install --find-links DIR kopf-core` into their own virtualenv.
    python = make_venv(tmp_path / 'core-venv')
    run(python, '-m', 'pip', 'install', '-q', '--find-links', wheelhouse, 'kopf-core')
    installed = run(python, '-m', 'pip', 'list', '--format=freeze')
    assert 'kopf-core==0.1.0' in installed and 'kopf-testing' not in installed
    kubeconfig = tmp_path / 'kubeconfig'
    command = [str(wheel_venv), '-m', 'kopf.testing.emulator', '--kubeconfig', str(kubeconfig)]
    emulator = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert emulator.stderr is not None
        line = emulator.stderr.readline()  # "The Kubernetes API emulator serves at URL; kubeconfig: ..."
        url = line.split(' serves at ')[1].split(';')[0]
        (tmp_path / 'embedded.py').write_text(textwrap.dedent(EMBEDDED_OPERATOR))
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), API_URL=url, MARK_FILE=str(tmp_path / 'mark'))
        result = subprocess.run([str(python), str(tmp_path / 'embedded.py')], env=env, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert (tmp_path / 'mark').read_text() == 'cm1'
    finally:
        emulator.terminate()
        emulator.wait(10)
