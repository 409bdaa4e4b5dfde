"""
Merge every distribution's `src/kopf` into one directory tree for import-linter.

import-linter (grimp) looks for one directory per package, while the monorepo spreads `kopf`
across five `src/` folders. A fresh merged copy keeps the analysis on the current sources,
not on whatever was installed into the lint environment earlier.
"""
import pathlib
import shutil
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def main(target: pathlib.Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    for source in sorted(REPO.glob('packages/*/src')):
        shutil.copytree(source, target, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))


if __name__ == '__main__':
    main(pathlib.Path(sys.argv[1]))
