"""
Type-check every example with `mypy --strict`, one file at a time.

The examples are all named `example.py` (they are read as standalone scripts), so mypy cannot
check them in one run: it would see several modules named `example`.
"""
import pathlib
import sys

from mypy import api

REPO = pathlib.Path(__file__).resolve().parents[1]


def main() -> int:
    failed = False
    for path in sorted(REPO.glob('examples/*/example.py')):
        stdout, stderr, status = api.run(['--strict', str(path)])  # the cache is shared between the runs
        if status != 0:
            failed = True
            print(stdout + stderr, end='')
    print('Examples: mypy --strict has ' + ('failed.' if failed else 'passed.'))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
