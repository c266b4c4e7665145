"""The layer order of xlanb/ holds: no import goes up the declared order (tools/layers.py),
counting imports inside functions, so there is no cycle; upward calls go only through the
named hooks; front ends use only the public API; DESIGN.md's diagram is the declared one.
Imports are read with ``ast``, nothing is imported to check them."""
from __future__ import annotations

import ast
import os
import shutil
import sys

import pytest

from tools import layers

ROOT = layers.ROOT


def test_no_import_goes_up_the_declared_order():
    assert layers.violations() == []


def test_every_module_is_declared():
    undeclared = [m for m, p in layers.module_files().items()
                  if layers.rank_of(m) is None and not layers._is_package_init(m, p)]
    assert undeclared == []


@pytest.fixture
def tree_copy(tmp_path, monkeypatch):
    """A copy of xlanb/ to break on purpose: the checker must see what it is for."""
    dst = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "xlanb"), dst / "xlanb",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(layers, "PACKAGE", str(dst / "xlanb"))
    monkeypatch.setattr(layers, "ROOT", str(dst))
    return dst / "xlanb"


def test_checker_catches_a_function_local_import_going_up(tree_copy):
    ir = tree_copy / "ir" / "nodes.py"
    ir.write_text(ir.read_text() + "\n\ndef _late():\n    from ..dispatch import dispatcher\n"
                  "    return dispatcher\n")
    found = layers.violations()
    assert any(v.startswith("xlanb.ir.nodes:") and "xlanb.dispatch.dispatcher" in v and "above it" in v
               for v in found), found
    assert any(v.startswith("import cycle:") for v in found), found


def test_checker_exempts_type_checking_blocks_only(tree_copy):
    ir = tree_copy / "ir" / "nodes.py"
    ir.write_text(ir.read_text() + "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                  "    from ..dispatch import dispatcher  # noqa: F401\n")
    assert layers.violations() == []


def test_checker_catches_a_hook_installed_from_elsewhere(tree_copy):
    ex = tree_copy / "values" / "fills.py"
    ex.write_text(ex.read_text() + "\n\ndef _sneak(fn):\n    set_handler('repr', fn)\n")
    found = layers.violations()
    assert any("xlanb.values.fills" in v and "set_handler" in v for v in found), found


def test_checker_catches_an_undeclared_module(tree_copy):
    (tree_copy / "stray.py").write_text("from .ir import Node\n")
    assert any(v.startswith("xlanb.stray: not in the declared layer order")
               for v in layers.violations())


def test_hooks_are_installed_by_the_modules_named():
    """Each named hook is called where tools/layers.py says, and nowhere else."""
    files = layers.module_files()
    for hook, allowed in layers.HOOKS.items():
        name = hook.rpartition(".")[2]
        callers = set()
        for mod, path in files.items():
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == name:
                    callers.add(mod)
        assert callers == set(allowed), (hook, callers)


def test_front_ends_use_only_the_public_api():
    """extensions/ and kernel/ import ``xlanb`` itself and each other, nothing inside it."""
    bad = []
    for folder in ("extensions", "kernel"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if not name.endswith(".py"):
                continue
            path = os.path.join(ROOT, folder, name)
            for node in ast.walk(ast.parse(open(path).read())):
                mods = []
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    mods = [node.module or ""]
                for m in mods:
                    if m.startswith("xlanb.") and not m.startswith(("xlanb.extensions", "xlanb.kernel")):
                        bad.append(f"{folder}/{name}:{node.lineno} imports {m}")
    assert bad == []


def test_design_diagram_is_the_declared_order():
    """docs/DESIGN.md's layer diagram is written by ``python -m tools.layers --write``."""
    assert layers.design_block() == layers.diagram()


def test_import_xlanb_loads_no_opinfo_or_front_end_machinery(python_child):
    out = python_child(
        "import sys, xlanb\n"
        "heavy = ['torch.testing._internal.common_methods_invocations', 'IPython',\n"
        "         'ipywidgets', 'graphviz', 'tools.coverage', 'xlanb.extensions']\n"
        "print([m for m in heavy if m in sys.modules])\n")
    assert out.strip().splitlines()[-1] == "[]"


def test_widgets_import_as_users_write_it(python_child):
    out = python_child(
        "from xlanb.widgets import GraphView, GraphDiff, MetricsDashboard\n"
        "import xlanb\n"
        "print(GraphView is xlanb.widgets.GraphView, MetricsDashboard.__name__)\n")
    assert out.strip().splitlines()[-1] == "True MetricsDashboard"


def test_layers_script_runs_clean():
    import subprocess
    proc = subprocess.run([sys.executable, "-m", "tools.layers"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "base" in proc.stdout and "dispatch" in proc.stdout


def test_xlanb_settings_are_read_in_config_only():
    """Every ``XLANB_*`` variable is read in ``xlanb/base/config.py`` (issue 44), where it
    is checked once; elsewhere they are only set, for the processes a launcher starts."""
    import re
    read = re.compile(r"""(environ\.get\(|getenv\(|environ\[)\s*["']XLANB_\w+["']\s*(?!\]\s*=[^=])""")
    offenders = []
    for top in ("xlanb", "extensions", "kernel"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                path = os.path.join(dirpath, f)
                if not f.endswith(".py") or path.endswith(os.path.join("base", "config.py")):
                    continue
                with open(path, encoding="utf-8") as fh:
                    for i, line in enumerate(fh, 1):
                        if read.search(line):
                            offenders.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def _library_trees():
    """Every parsed module of the library and its front ends, with its path from ROOT."""
    for top in ("xlanb", "extensions", "kernel"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    with open(path, encoding="utf-8") as fh:
                        yield os.path.relpath(path, ROOT), ast.parse(fh.read())


def _name(node) -> str:
    """``g.hash`` -> ``hash``, ``line`` -> ``line``; "" for anything else (a call...)."""
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _small_format_offenders(rel: str, tree) -> list[str]:
    out = []
    for node in ast.walk(tree):
        # a hash cut by hand: ``g.hash[:12]``
        if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice)
                and node.slice.lower is None and isinstance(node.slice.upper, ast.Constant)
                and "hash" in _name(node.value).lower()):
            out.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        # a location built by hand: ``f"{src.file}:{src.line}"``
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            for a, colon, b in zip(parts, parts[1:], parts[2:]):
                if (isinstance(a, ast.FormattedValue) and isinstance(colon, ast.Constant)
                        and str(colon.value).startswith(":")
                        and isinstance(b, ast.FormattedValue)
                        and _name(b.value) in ("line", "lineno", "f_lineno")):
                    out.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_hashes_and_locations_are_formatted_in_one_place():
    """A shown hash and a ``file:line`` are written by ``xlanb/base/formats.py`` alone
    (``format_hash``, ``format_location``; issue 44): a copy elsewhere drifts (a widget
    once showed 8 characters of the hash the tables show 12 of)."""
    home = os.path.join("xlanb", "base", "formats.py")
    offenders = [o for rel, tree in _library_trees() if rel != home
                 for o in _small_format_offenders(rel, tree)]
    assert not offenders, "\n".join(offenders)


def test_the_format_check_sees_a_copy():
    found = _small_format_offenders("x.py", ast.parse(
        'a = g.hash[:8]\nb = f"{loc.file}:{loc.line} {loc.function}"\nc = format_hash(g.hash)\n'))
    assert [f.split(":")[1] for f in found] == ["1", "2"]


def test_is_this_frame_xlanbs_is_answered_in_frames_only():
    """``base/frames.py`` holds the one list of frames that are never the user's line and
    the package's folder (issue 44); elsewhere they are asked, not copied: no module reads
    its private lists or works the package's folder out from ``__file__``."""
    home = os.path.join("xlanb", "base", "frames.py")
    offenders = []
    for rel, tree in _library_trees():
        if rel == home:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Name, ast.Attribute, ast.alias)):
                name = getattr(node, "id", None) or getattr(node, "attr", None) or node.name
                if name in ("_SKIP_PREFIXES", "_SKIP_SUFFIXES", "_forward_ops"):
                    offenders.append(f"{rel}:{node.lineno}: {name}")
            if (isinstance(node, ast.Call) and ast.unparse(node.func) == "os.path.dirname"
                    and node.args and any(isinstance(n, ast.Name) and n.id == "__file__"
                                          for n in ast.walk(node.args[0]))
                    and rel.startswith("xlanb")):
                offenders.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("path", ["eager-cold", "lazy-warm"])
def test_an_op_turns_upward_only_through_the_mode_policy_hook(path):
    """Followed from its line to its value (tools/follow_an_op, a child process), an op
    calls up the layer order only where a read asks the mode's policy what to run
    (``realize`` -> ``roots_to_run``, ``run_sync_plan``, ``synced``), not through a
    lambda or a property a lower layer was handed (the build's lowering function and a
    graph's ``memory`` were both, once)."""
    from tools import follow_an_op
    up = follow_an_op.follow(path)["up"]
    assert up and all(caller == "xlanb.pending.realize" and callee == "xlanb.modes.policy"
                      for caller, callee, _ in up), up
