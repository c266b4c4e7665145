"""Front ends of TPU targets (issue 32, section 5): ``%xla_target``, ``--target`` on
``%%xla_explain`` / ``%xla_hlo`` / ``%xla_memory``, the target columns of ``%xla_graphs``,
pdb's ``xtarget``, and ``python -m xlanb.run`` under ``XLANB_TARGET``.

The compiles are real: libtpu compiles each graph for a TPU topology on this CPU-only
machine (1-15 s each), so the graphs are tiny (a 128x128 matmul), the target is
``v5e:1x1`` and the tests compile as few of them as they can. Looking never changes what
the next sync compiles: the pending graph and the CPU's compile counters are checked.
"""
from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xlanb

IPython = pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

from xlanb.extensions import display as xd  # noqa: E402
from xlanb.extensions import ipython as xipy  # noqa: E402
from xlanb.extensions import pdb as xpdb  # noqa: E402
from support import child_env, loaded_shell  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TARGET = "v5e:1x1"
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason='libtpu is not installed (pip install "xlanb[tpu]")')
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:xlanb. compiles too frequent")]


def counter(name: str) -> int:
    return xlanb.metrics.counter_value(name) or 0


@pytest.fixture(autouse=True)
def _no_target():
    """Every test starts and ends with no target set."""
    xlanb.set_target(None)
    yield
    xlanb.set_target(None)


@pytest.fixture(scope="module")
def shell():
    return InteractiveShell.instance()


def _loaded(shell, kind: str):
    yield from loaded_shell(shell, kind, ("x", "y", "z", "w", "ran"))


@pytest.fixture
def nb(shell):
    """Notebook-like display: every mime type."""
    yield from _loaded(shell, "notebook")


@pytest.fixture
def term(shell):
    """Terminal-like display: text/plain only."""
    yield from _loaded(shell, "terminal")


def run(ip, code: str):
    with capture_output() as c:
        res = ip.run_cell(code, store_history=True)
    res.raise_error()
    return c.stdout, [o.data for o in c.outputs]


def magic(ip, name: str, line: str = ""):
    with capture_output() as c:
        ret = ip.run_line_magic(name, line)
    return ret, c.stdout, [o.data for o in c.outputs]


def matmul(ip) -> None:
    """x: device data (copied, nothing compiled); y: one pending op, a 128x128 matmul."""
    run(ip, "x = (torch.ones(128, 128) / 128).to('xla')\ny = x @ x")


# --------------------------------------------------------------------------- one text

def _report():
    """A TargetReport made by hand (no libtpu): one padded argument made in a cell, one
    collective from another line of it, a note."""
    from types import SimpleNamespace
    from xlanb.graph.collectives import Collective, CollectiveList
    t = SimpleNamespace(name=TARGET, chip="TPU v5 lite", num_devices=1, hbm_bytes=16 << 30,
                        peak_flops=197e12, hbm_bytes_per_s=819e9)
    padding = xlanb.PaddingList([xlanb.PaddingRow(
        "argument", "input %0 (device_data)", "Net", "/tmp/ipykernel_1/cell.py:3",
        "f32[1000,1000]", "{1,0:T(8,128)}", 4_000_000, 4_096_000)])
    collectives = CollectiveList([Collective("all-reduce", "all-reduce.1", "f32[8]", 32,
                                             "{{0}}", "aten::sum", "Net",
                                             "/tmp/ipykernel_1/cell.py:5")], graph_hash="ab" * 6)
    return xlanb.TargetReport(
        t, "ab" * 6, memory=xlanb.GraphMemory(4_096_000, 2_000, 0, 1_000, 4_099_000, 0),
        fits=True, cost=xlanb.TargetCost(2e9, 6e6, 1e-5, 1e-5, 7e-6), padding=padding,
        collectives=collectives, compile_seconds=1.5, notes=("int64 is pairs of int32",),
        executable=object())


class _Cells(xd.SourceResolver):
    """A front end's names for a cell's lines."""

    def label_text(self, where: str) -> str:
        return "In[7] line " + where.rsplit(":", 1)[1]


def test_the_report_prints_its_sections():
    r = _report()
    text = str(r).splitlines()
    assert text[0] == r.headline() and r.headline().startswith(f"graph {'ab' * 6} for {TARGET}")
    assert r.summary_line() == f"{TARGET} (1 x TPU v5 lite): {r.verdict()}"
    assert "  note: int64 is pairs of int32" in text and "  padding (most first):" in text
    assert (f"  collectives: graph {'ab' * 6}: 1 collectives (1 all-reduce), 32 bytes per "
            "device") in text, text
    assert [s.kind for s in r.sections()] == ["memory", "cost", "layouts", "notes", "padding",
                                              "collectives"]
    assert r.sections()[4].rows[0][-1] == "cell.py:3"  # the core's own name for the line
    assert "<table class='xlanb-padding'" in r._repr_html_() and "title='HBM'" in r._repr_html_()


def test_the_views_lay_out_the_sections_and_read_none_of_the_reports_text(monkeypatch):
    """extensions/display.py shows a TargetReport from ``sections()``, naming each line its
    own way, and never reads the report's text or HTML back (issue 59)."""
    r = _report()
    words = [line for s in r.sections() for line in s.lines]

    def unread(*_):
        raise AssertionError("a view read the report's text")
    for name in ("__str__", "__repr__", "_repr_html_"):
        monkeypatch.setattr(xlanb.TargetReport, name, unread)
    view = xd.TargetView(r, "The pending graph", _Cells())
    text, page = view.text(), view.html()
    for line in words:
        assert line in text, line
    assert "In[7] line 3" in text and "In[7] line 5" in text and "cell.py" not in text
    assert "In[7] line 3" in page and "In[7] line 5" in page and "cell.py" not in page
    assert "<table class='xlanb-padding'" in page and "<table class='xlanb-collectives'" in page
    assert "xlanb-target" in page and "title='HBM'" in page
    mem = xd.TargetMemory(r, "graph", _Cells()).text()
    assert "note: int64 is pairs of int32" in mem and "in TPU layouts" in mem
    assert "In[7] line 3" in mem


# --------------------------------------------------------------------------- %xla_target

def test_magics_are_listed_with_help(nb):
    doc = xipy.__doc__
    for text in ("%xla_target [T|off]", "--target T", "%%xla_explain [--target T]"):
        assert text in doc, text
    help_ = nb.find_line_magic("xla_target").__doc__
    assert "--now" in help_ and "libtpu" in help_
    assert "--target" in nb.find_line_magic("xla_hlo").__doc__
    assert "--target" in nb.find_line_magic("xla_memory").__doc__
    assert "--target" in nb.find_cell_magic("xla_explain").__doc__


@needs_libtpu
def test_xla_target_sets_shows_and_turns_off(term):
    _, out, (b,) = magic(term, "xla_target")
    text = b["text/plain"]
    assert "xla target: off" in text
    for gen, chip in xlanb.CHIPS.items():  # the known generations, with their HBM
        assert gen in text and chip.device_kind in text and xlanb.format_bytes(chip.hbm_bytes) in text
    _, out, _ = magic(term, "xla_target", TARGET)
    assert xlanb.get_target().name == TARGET
    assert f"off -> {TARGET} (1 x TPU v5 lite, 16.0 GiB HBM per chip)" in out
    _, _, (b,) = magic(term, "xla_target")
    assert f"xla target: {TARGET} (1 x TPU v5 lite" in b["text/plain"]
    assert xd.status_line(None).endswith(f" · target {TARGET}")  # %xla_status names it
    _, out, _ = magic(term, "xla_target", "off")
    assert xlanb.get_target() is None and f"{TARGET} -> off" in out
    _, out, _ = magic(term, "xla_target", "off")
    assert "off (unchanged)" in out


@needs_libtpu
@pytest.mark.parametrize("line, says", [
    ("v9:1x1", "unknown TPU generation 'v9'"),
    ("nonsense", "a target is a TPU topology such as 'v5e:2x2'"),
    ("--now", "no target: give one"),
    ("off --now", "--now needs a topology"),
    ("v5e:1x1 --now nosuchname", "name 'nosuchname' is not defined"),
    ("v5e:1x1 --graph 99999", "there is no graph #99999"),
])
def test_xla_target_bad_input_is_one_line_and_loses_nothing(nb, line, says):
    matmul(nb)
    xlanb.set_target(TARGET)
    before = (xlanb.pending_count(), counter("UncachedCompile"), counter("TargetCompile"))
    if line == "--now":
        xlanb.set_target(None)
    with pytest.raises(UsageError) as e:
        nb.run_line_magic("xla_target", line)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert (xlanb.pending_count(), counter("UncachedCompile"), counter("TargetCompile")) == before
    if line != "--now":
        assert xlanb.get_target().name == TARGET  # a bad name changes nothing


@needs_libtpu
def test_xla_target_now_shows_the_report_and_runs_nothing(nb):
    matmul(nb)
    pending, compiles = xlanb.pending_count(), counter("UncachedCompile")
    _, _, (b,) = magic(nb, "xla_target", f"{TARGET} --now y")
    text = b["text/plain"]
    assert text.startswith(f"The pending graph (1 op), compiled for {TARGET}"), text
    assert "fits" in text and "memory per chip" in text and "aten::mm" in text
    assert "In[" in text and "ipython-input" not in text  # padding rows name the cell
    assert "xlanb-target" in b["text/html"] and "HBM" in b["text/html"]
    assert "In[" in b["text/html"] and "ipython-input" not in b["text/html"]
    assert xlanb.get_target() is None  # --now leaves the session's target as it was
    assert xlanb.pending_count() == pending and counter("UncachedCompile") == compiles
    assert counter("TargetCompile") == 1


# --------------------------------------------------------------------------- --target

@needs_libtpu
def test_memory_and_hlo_for_a_target(term):
    matmul(term)
    pending, compiles = xlanb.pending_count(), counter("UncachedCompile")
    _, _, (b,) = magic(term, "xla_memory", f"--target {TARGET}")
    assert set(b) == {"text/plain"}  # a terminal: text only
    text = b["text/plain"]
    assert f"The pending graph (1 op) on {TARGET}" in text, text
    assert "of 16.0 GiB HBM: fits" in text
    assert "argument" in text and "output" in text and "T(8,128)" in text
    assert "In[" in text  # the padding rows name the cell's line
    _, _, (b,) = magic(term, "xla_hlo", f"y --target {TARGET}")
    text = b["text/plain"]
    assert text.startswith(f"// TPU-optimized HLO for {TARGET}"), text[:200]
    assert "HloModule" in text and "{1,0:T(8,128)}" in text  # the TPU's tiled layouts
    assert "backend_config" not in text  # tidied, unless --raw
    assert xlanb.pending_count() == pending and counter("UncachedCompile") == compiles
    assert counter("TargetCompile") == 2
    for name, line, says in (
            ("xla_hlo", f"--target {TARGET} --optimized", "takes no --dialect or --optimized"),
            ("xla_hlo", "--target v9:1x1", "unknown TPU generation"),
            ("xla_memory", f"--target {TARGET} --by-line", "takes no --by-line"),
            ("xla_memory", "--target v9:1x1", "unknown TPU generation")):
        with pytest.raises(UsageError, match=says):
            term.run_line_magic(name, line)
    assert counter("TargetCompile") == 2


@needs_libtpu
def test_a_step_that_does_not_fit_is_an_answer(nb):
    """The TPU compiler refuses a 70000x70000 float32 result (18 GiB) on a 16 GiB v5e chip:
    the magics show its answer. (Lazy: never computed here; dropped before the test ends.)"""
    try:
        run(nb, "with xlanb.mode('lazy'):\n    w = torch.ones(1).to('xla')\n"
                "    big = w.expand(70000, 70000) + 1")
        pending, compiles = xlanb.pending_count(), counter("UncachedCompile")
        _, _, (b,) = magic(nb, "xla_memory", f"--target {TARGET}")
        text = b["text/plain"]
        assert "of 16.0 GiB HBM: DOES NOT FIT" in text and "CompileTimeHbmOom" in text, text
        assert "border-left:2px solid #c33" in b["text/html"]  # the HBM line, in red
        _, _, (b,) = magic(nb, "xla_hlo", f"big --target {TARGET}")
        text = b["text/plain"]
        assert text.startswith("No TPU module: the pending graph (2 ops), refused by the TPU "
                               f"compiler for {TARGET}"), text[:300]
        assert "DOES NOT FIT" in text and "xlanb-target" in b["text/html"]
        assert xlanb.pending_count() == pending and counter("UncachedCompile") == compiles
    finally:
        nb.user_ns.pop("big", None)  # never synced: 18 GiB on this machine


@needs_libtpu
def test_explain_target_and_the_graph_table(nb):
    run(nb, "x = (torch.ones(128, 128) / 128).to('xla')")
    with pytest.raises(UsageError, match="unknown TPU generation"):
        nb.run_cell_magic("xla_explain", "--target v9:1x1", "ran = True")
    assert "ran" not in nb.user_ns  # a bad target: the cell did not run
    with capture_output() as c:
        nb.run_cell_magic("xla_explain", f"--target {TARGET}",
                          "z = (x @ x).relu() * 3\nxlanb.sync()\nran = True")
    assert nb.user_ns["ran"] is True
    (b,) = [o.data for o in c.outputs]
    text = b["text/plain"]
    assert f"- on {TARGET} (1 x TPU v5 lite, 16.0 GiB HBM per chip)" in text, text
    g = xlanb.graphs()[-1]
    assert f"graph {g.hash[:12]}: peak " in text and "fits" in text and "roofline" in text
    assert xlanb.get_target() is None  # only while the cell ran
    assert g.target.target.name == TARGET and g.target.fits is True
    html = xd.TargetMemory(g.target, "graph").html()  # the displays, on its report
    assert "HBM" in html and "<table class='xlanb-padding'" in html
    assert "xlanb-target" in xd.TargetView(g.target, "graph").html()
    # %xla_graphs: the core's columns, the target's among them
    _, _, (b,) = magic(nb, "xla_graphs", "--last 1")
    text = b["text/plain"]
    for header in ("TPU peak", "fits", "TPU est.", "TPU compile", "why each compiled"):
        assert header in text, text
    row = next(ln for ln in text.splitlines() if ln.startswith(str(len(xlanb.graphs()) - 1)))
    assert TARGET in row and " yes " in row and "In[" in row, row
    assert "<th style='text-align:left'>fits</th>" in b["text/html"]


def test_graph_table_columns_come_from_the_core():
    gs = list(xlanb.graphs())
    table = xd.GraphsTable(gs)
    headers = tuple(c.header for c in xlanb.graph_columns(gs))
    assert table.HEADER == ("#",) + headers + ("why",)
    if not any(g.target is not None for g in gs):
        assert "TPU peak" not in table.HEADER


# --------------------------------------------------------------------------- pdb

@pytest.fixture
def dbg():
    d = xpdb.XlaPdb(stdout=io.StringIO(), readrc=False)
    d.reset()
    return d


def _cmd(d, line: str) -> str:
    d.stdout = io.StringIO()
    d.onecmd(line)
    return d.stdout.getvalue()


def test_pdb_lists_xtarget():
    assert "xtarget [NAME|off]" in xpdb.__doc__


@needs_libtpu
def test_pdb_xtarget(dbg):
    x = (torch.ones(128, 128) / 128).to("xla")
    y = x @ x  # noqa: F841 - read by xtarget below
    dbg.setup(sys._getframe(), None)
    out = _cmd(dbg, "help xtarget")
    assert out.startswith("xtarget [NAME|off]") and "--now" in out
    out = _cmd(dbg, "xtarget")
    assert out.startswith("target: off") and "TPU v5 lite" in out and "16.0 GiB" in out
    pending, compiles = xlanb.pending_count(), counter("UncachedCompile")
    for line, says in (("xtarget v9:1x1", "unknown TPU generation 'v9'"),
                       ("xtarget nonsense", "a target is a TPU topology"),
                       ("xtarget --now", "no target: give one"),
                       ("xtarget y", "a target is a TPU topology"),
                       ("xtarget v5e:1x1 y", "usage: xtarget"),
                       ("xtarget --graph x", "--graph takes a graph number"),
                       ("xtarget v5e:1x1 --now nosuch", "NameError")):
        out = _cmd(dbg, line)
        assert out.startswith("*** xtarget: ") and out.count("\n") == 1 and says in out, (line, out)
    assert xlanb.get_target() is None
    out = _cmd(dbg, f"xtarget {TARGET}")
    assert xlanb.get_target().name == TARGET and out.startswith(f"target: off -> {TARGET}")
    assert _cmd(dbg, "xtarget").startswith(f"target: {TARGET} (1 x TPU v5 lite")
    assert _cmd(dbg, "xtarget v9:1x1").startswith("*** ") and xlanb.get_target().name == TARGET
    out = _cmd(dbg, "xtarget --now y")  # the target set above
    assert out.startswith(f"The pending graph (1 op), compiled for {TARGET}"), out
    assert "fits" in out and "padding" in out and "***" not in out
    assert xlanb.pending_count() == pending and counter("UncachedCompile") == compiles
    assert _cmd(dbg, "xtarget off").strip() == f"target: {TARGET} -> off"
    assert xlanb.get_target() is None
    assert dbg.complete_xtarget("v5", "xtarget v5", 8, 10) == ["v5e:2x2", "v5p:2x2x1", "v5e:1x1"]
    assert dbg.complete_xtarget("--n", "xtarget v5e:1x1 --n", 16, 19) == ["--now "]


# --------------------------------------------------------------------------- xlanb.run

RUN_PROGRAM = '''
import torch
import torch_xla.core.xla_model as xm
dev = xm.xla_device()
x = torch.ones(128, 128, device=dev) / 128
y = (x @ x).relu()
xm.mark_step()
z = y.sum()
xm.mark_step()
print("value", float(z.cpu()))
'''


def _run_env(**extra) -> dict:
    return child_env(extra)


@needs_libtpu
def test_run_under_xlanb_target_prints_a_line_per_graph(tmp_path):
    (tmp_path / "prog.py").write_text(RUN_PROGRAM)
    shadow = ["--shadow"] if xlanb.compat.real_torch_xla() else []
    good = subprocess.Popen([sys.executable, "-m", "xlanb.run", *shadow, "prog.py"],
                            cwd=tmp_path, env=_run_env(XLANB_TARGET=TARGET), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    bad = subprocess.run([sys.executable, "-m", "xlanb.run", *shadow, "--target", "v9:1x1",
                          "prog.py"], cwd=tmp_path, env=_run_env(), text=True,
                         capture_output=True, timeout=240)
    out, err = good.communicate(timeout=240)
    assert good.returncode == 0, err[-3000:]
    assert "value 128.0" in out  # the program ran on the CPU as usual
    lines = [ln for ln in err.splitlines() if ln.startswith("xlanb.run: graph #")]
    assert len(lines) == 2, err[-3000:]
    assert lines[0].startswith("xlanb.run: graph #0 ") and " ops at prog.py:7 " in lines[0]
    assert "(1 op at prog.py:9" in lines[1]
    for ln in lines:
        assert f"on {TARGET} (1 x TPU v5 lite): peak " in ln and "HBM per chip, fits" in ln, ln
        assert "TPU compile" in ln
    assert "TPU_ACCELERATOR_TYPE" not in err  # libtpu's start-up warnings stay quiet
    assert bad.returncode != 0 and "xlanb.run: --target v9:1x1" in bad.stderr
    assert "unknown TPU generation" in bad.stderr and "value" not in bad.stdout
