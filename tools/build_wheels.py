"""
Build the six distributions of this repository as wheels into one directory, for installing elsewhere.

    python tools/build_wheels.py [DIR]          # DIR: ./wheels by default

Then, in any virtualenv (e.g. your operator's project)::

    pip install --find-links DIR 'kopf==0.1.0'      # everything (the meta-package)
    pip install --find-links DIR kopf-core          # only what embedding an operator needs

The version pin of the meta-package matters: the package index has the original Kopf as ``kopf``
(with higher version numbers), and pip takes the highest version it finds. The other distributions'
names are this repository's only, and their dependencies (aiohttp, click, ...) come from the index.
"""
import argparse
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ['packages/kopf-clients', 'packages/kopf-core', 'packages/kopf-webhooks', 'packages/kopf-cli',
           'packages/kopf-testing', '.']


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or '').strip().split('\n\n')[0]
    parser = argparse.ArgumentParser(prog='python tools/build_wheels.py', description=description)
    parser.add_argument('directory', nargs='?', default='wheels', help='where to put the wheels (./wheels)')
    args = parser.parse_args(argv)
    target = pathlib.Path(args.directory).resolve()
    target.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '-w', str(target),
               *(str(REPO / source) for source in SOURCES)]
    result = subprocess.run(command)
    if result.returncode != 0:
        print(f'Building the wheels has failed (pip exited with {result.returncode}).', file=sys.stderr)
        return result.returncode
    wheels = sorted(path.name for path in target.glob('kopf*-0.1.0-*.whl'))
    print('\n'.join(wheels))
    print(f"Built {len(wheels)} wheels into {target}. Install with: "
          f"pip install --find-links {target} 'kopf==0.1.0'  (or: kopf-core alone, for embedding)")
    return 0


if __name__ == '__main__':
    sys.exit(main())
