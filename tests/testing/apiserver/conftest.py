"""
Fake binaries of the control plane, for the tests of starting, failing, and stopping without Go builds.

- ``SLEEPER``: never exits by itself (a fake etcd, or a kube-apiserver that never gets ready);
- ``FAKE_APISERVER``: a Python HTTPS server that reads kube-apiserver's flags (port, serving
  certificate, client CA) and answers the readiness checks to clients with a client certificate.

Every fake writes its PID to ``$FAKE_PIDS_DIR/<name>.pid`` and its arguments (one per line) to
``$FAKE_ARGS_DIR/<name>.args``, so the tests can check what ran and that nothing is left running.
The helpers are fixtures, since the test modules cannot import each other (importlib mode).
"""
import os
import pathlib
import signal
import socket
import sys
import textwrap
from collections.abc import Callable, Iterator

import pytest

RECORD = '''
echo $$ > "$FAKE_PIDS_DIR/$(basename "$0").pid"
printf '%s\\n' "$@" > "$FAKE_ARGS_DIR/$(basename "$0").args"
'''

SLEEPER = f'''#!/bin/sh
{RECORD}
exec sleep 600
'''

FAKE_APISERVER = textwrap.dedent(f'''\
    #!{sys.executable}
    import http.server, json, os, ssl, sys
    name = os.path.basename(sys.argv[0])
    with open(os.path.join(os.environ['FAKE_PIDS_DIR'], name + '.pid'), 'w') as f:
        f.write(str(os.getpid()))
    with open(os.path.join(os.environ['FAKE_ARGS_DIR'], name + '.args'), 'w') as f:
        f.write(''.join(arg + '\\n' for arg in sys.argv[1:]))
    flags = dict(arg[2:].split('=', 1) for arg in sys.argv[1:] if arg.startswith('--') and '=' in arg)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            answers = {{
                '/readyz?verbose': b'[+]ping ok\\nreadyz check passed',
                '/api/v1/namespaces/default': json.dumps({{'metadata': {{'name': 'default'}}}}).encode(),
                '/version': json.dumps({{'gitVersion': 'v1.99.0-fake'}}).encode(),
            }}
            body = answers.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header('Content-Length', str(len(body or b'')))
            self.end_headers()
            self.wfile.write(body or b'')

        def log_message(self, format, *args):
            print('fake:', format % args, flush=True)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(flags['tls-cert-file'], flags['tls-private-key-file'])
    context.load_verify_locations(flags['client-ca-file'])
    context.verify_mode = ssl.CERT_REQUIRED  # as kube-apiserver with --client-ca-file: the admin's cert
    server = http.server.ThreadingHTTPServer((flags['bind-address'], int(flags['secure-port'])), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print('fake kube-apiserver serves', flush=True)
    server.serve_forever()
''')


@pytest.fixture()
def record() -> str:
    """The lines of a fake shell script that record its PID and arguments."""
    return RECORD


@pytest.fixture()
def sleeper() -> str:
    return SLEEPER


@pytest.fixture()
def fake_apiserver() -> str:
    """The script of the fake kube-apiserver that gets ready (see above)."""
    return FAKE_APISERVER


@pytest.fixture()
def fake_dirs(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> tuple[pathlib.Path, pathlib.Path]:
    pids_dir, args_dir = tmp_path / 'pids', tmp_path / 'args'
    pids_dir.mkdir()
    args_dir.mkdir()
    monkeypatch.setenv('FAKE_PIDS_DIR', str(pids_dir))
    monkeypatch.setenv('FAKE_ARGS_DIR', str(args_dir))
    return pids_dir, args_dir


@pytest.fixture()
def make_assets(tmp_path: pathlib.Path, fake_dirs: tuple[pathlib.Path, pathlib.Path],
                ) -> Iterator[Callable[..., pathlib.Path]]:
    """Write a directory of fake binaries (scripts); by default, a control plane that gets ready."""
    made: list[pathlib.Path] = []

    def make(
            *, apiserver: str = FAKE_APISERVER, etcd: str = SLEEPER, kubectl: str | None = None,
    ) -> pathlib.Path:
        directory = tmp_path / f'assets-{len(made)}'
        directory.mkdir()
        for name, script in [('etcd', etcd), ('kube-apiserver', apiserver), ('kubectl', kubectl)]:
            if script is not None:
                path = directory / name
                path.write_text(script)
                path.chmod(0o755)
        made.append(directory)
        return directory

    yield make

    # Nothing the fakes started may outlive the test, whatever the test checked itself.
    leftovers = [pid for pid in _recorded_pids(fake_dirs[0]).values() if _is_alive(pid)]
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, 'some fake processes were left running'


@pytest.fixture()
def fake_pids(fake_dirs: tuple[pathlib.Path, pathlib.Path]) -> Callable[[], dict[str, int]]:
    """The PIDs of the fakes started so far, by their names."""
    return lambda: _recorded_pids(fake_dirs[0])


@pytest.fixture()
def fake_args(fake_dirs: tuple[pathlib.Path, pathlib.Path]) -> Callable[[str], list[str]]:
    """The command-line arguments of the last fake started under the name."""
    return lambda name: (fake_dirs[1] / f'{name}.args').read_text().splitlines()


@pytest.fixture()
def is_alive() -> Callable[[int], bool]:
    return _is_alive


@pytest.fixture()
def is_port_free() -> Callable[[int], bool]:
    def check(port: int) -> bool:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(('127.0.0.1', port))
            except OSError:
                return False
            return True
    return check


def _recorded_pids(pids_dir: pathlib.Path) -> dict[str, int]:
    return {path.stem: int(path.read_text()) for path in pids_dir.glob('*.pid') if path.read_text().strip()}


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead but not reaped: only its parent (us, via Popen) reaps it; count it as dead.
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False
