"""
Run a command with the real control plane's binaries: build them if needed, then point the tests at them.

    python tools/kube-assets/ensure.py -- pytest -m real_apiserver

* ``KUBEBUILDER_ASSETS`` already set (e.g. by ``setup-envtest``): used as it is, nothing is built.
* Otherwise, ``tools/kube-assets/build.sh`` builds them (or finds them built) from Go modules, and
  ``KUBEBUILDER_ASSETS`` is set to their directory for the command.
* No Go on the machine (a user's laptop): one line says why nothing runs and how to get the binaries,
  and the exit code is 0; a failed build fails (its Go error is shown above).

With the binaries, ``KOPF_TESTING_REQUIRE_CONTROL_PLANE=1`` is set too: the tests then fail instead of
skipping if the control plane cannot be started.
"""
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
NO_GO = 3  # build.sh's exit code when there is no usable Go


def main(argv: list[str]) -> int:
    command = argv[argv.index('--') + 1:] if '--' in argv else argv
    if not command:
        print('Usage: python tools/kube-assets/ensure.py -- COMMAND [ARGS...]', file=sys.stderr)
        return 2
    env = dict(os.environ)
    if not env.get('KUBEBUILDER_ASSETS'):
        result = subprocess.run(['bash', str(HERE / 'build.sh')], stdout=subprocess.PIPE, text=True)
        if result.returncode == NO_GO:
            print('The real-API-server tests are skipped: Go is not installed here. Build the binaries '
                  'with Go 1.26+ (tools/kube-assets/build.sh), or set KUBEBUILDER_ASSETS to a directory '
                  'with etcd, kube-apiserver, kubectl (e.g. from setup-envtest).', file=sys.stderr)
            return 0
        if result.returncode != 0:
            print(f'Building the Kubernetes binaries has failed (exit code {result.returncode}); '
                  f'see the Go error above.', file=sys.stderr)
            return result.returncode
        lines = result.stdout.strip().splitlines()
        if not lines:
            print('tools/kube-assets/build.sh printed no directory.', file=sys.stderr)
            return 1
        env['KUBEBUILDER_ASSETS'] = lines[-1]
    env.setdefault('KOPF_TESTING_REQUIRE_CONTROL_PLANE', '1')
    print(f'KUBEBUILDER_ASSETS={env["KUBEBUILDER_ASSETS"]}', file=sys.stderr)
    return subprocess.run(command, env=env).returncode


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
