"""Sphinx configuration: ``python -m sphinx -W -b html docs docs/_build``.

The example notebooks stay in examples/ (the tests run them there); they are copied
into docs/examples/ when the build starts and rendered with their stored outputs.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import sys

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(ROOT))  # this checkout's xlanb, whatever else is installed



def _this_checkout() -> None:
    """xlanb.extensions and xlanb.kernel from this checkout. An editable install maps
    them to the folder it was made from (extensions/ and kernel/ sit beside xlanb/, see
    pyproject.toml), which in another worktree is another checkout's."""
    import importlib.util
    for name, folder in (("xlanb.extensions", "extensions"), ("xlanb.kernel", "kernel")):
        init = ROOT / folder / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(init.parent)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


import xlanb  # noqa: E402  (this checkout's: ROOT is first on the path)

_this_checkout()

project = "xlanb"
author = "the xlanb authors"
copyright = "the xlanb authors"
release = version = "0.1.0"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "xlanb_ref",
]
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
# A subclass's method without a docstring of its own says nothing (XlaTensor.tolist is
# not torch's, whatever torch's docstring says).
autodoc_inherit_docstrings = False
autodoc_member_order = "bysource"
html_theme = "furo"
html_title = "xlanb"
html_static_path = []

# The notebooks are stored executed; tests/test_notebooks.py runs them. Never here.
nb_execution_mode = "off"
# tracebacks as IPython stored them, colours included (the ipythontb lexer stumbles on
# xlanb's messages)
nb_render_error_lexer = "myst-ansi"
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3


def _copy_notebooks() -> None:
    """examples/*.ipynb copied to docs/examples/ (ignored by git) when missing or stale,
    with their modification times, so an incremental build re-reads only what changed.
    Copies, not symbolic links: MyST resolves a link's target through the link, outside
    the source folder."""
    out = DOCS / "examples"
    out.mkdir(exist_ok=True)
    wanted = {p.name: p for p in sorted((ROOT / "examples").glob("*.ipynb"))}
    for stale in out.iterdir():
        if stale.name not in wanted:
            stale.unlink()
    for name, src in wanted.items():
        dst = out / name
        if dst.is_symlink():
            dst.unlink()
        if dst.exists() and dst.stat().st_mtime == src.stat().st_mtime \
                and dst.stat().st_size == src.stat().st_size:
            continue
        shutil.copy2(src, dst)


_copy_notebooks()


def _outputs_in_build(app) -> None:
    """myst-nb writes the notebooks' images to the output folder's parent, which for
    ``docs/_build`` is the source folder: here they go with the doctrees instead."""
    import pathlib as _p
    app.env.mystnb_config = app.env.mystnb_config.copy(
        output_folder=str(_p.Path(app.doctreedir) / "jupyter_execute"))


def setup(app):
    app.connect("builder-inited", _outputs_in_build, priority=900)  # after myst-nb's
