"""Run the example notebooks as tests/test_notebooks.py does (the ``python3`` kernel, a
fresh HOME) and store their outputs in place: the notebooks are documentation read on
GitHub, and the test fails when a stored output differs from a fresh run's.

    python tools/store_notebooks.py                 # every notebook in examples/
    python tools/store_notebooks.py 01_magics_tour nans
"""
from __future__ import annotations

import pathlib
import sys

import nbformat

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
import test_notebooks  # noqa: E402  (its runner: the same kernel, HOME and settings)


def main(names: list[str]) -> int:
    paths = ([test_notebooks.EXAMPLES / f"{n.removesuffix('.ipynb')}.ipynb" for n in names]
             or test_notebooks.NOTEBOOKS)
    for path in paths:
        if not path.exists():
            print(f"no such notebook: {path}", file=sys.stderr)
            return 2
        nb = test_notebooks.execute(path)
        nbformat.write(nb, path)
        print(f"stored {path.name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
