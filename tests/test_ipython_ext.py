"""The IPython extension, through IPython's own InteractiveShell.

Magics run with ``run_line_magic`` / ``run_cell``; rich output is captured with
``capture_output``. "notebook" display means every mime type is active (as in ipykernel);
"terminal" means text/plain only (as in the IPython terminal). Compile behaviour is
asserted through metrics counters.
"""
from __future__ import annotations

import itertools
import re
import shutil

import pytest
import torch

import xlanb

IPython = pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

from xlanb.extensions import display as xd  # noqa: E402
from support import loaded_shell  # noqa: E402
from xlanb.extensions.ipython import XlaMagics  # noqa: E402

HAVE_DOT = shutil.which("dot") is not None

# These tests recompile on purpose; the core's frequent-recompile warning is expected.
pytestmark = pytest.mark.filterwarnings("ignore:xlanb. compiles too frequent")
MAGICS = ("xla_mode", "xla_pending", "xla_sync", "xla_hlo", "xla_peek", "xla_metrics",
          "xla_graphs", "xla_status")


def counter(name: str) -> int:
    return xlanb.metrics.counter_value(name) or 0


_sizes = itertools.count(5)


def fresh() -> int:
    """A size no other test used: graphs with it are new to the process's graph cache."""
    return next(_sizes)


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    yield ip


def _loaded(shell, kind: str):
    yield from loaded_shell(shell, kind, ("x", "y", "z", "w", "acc", "out", "v", "ts"))


@pytest.fixture
def ip(shell):
    """Notebook-like display."""
    yield from _loaded(shell, "notebook")


@pytest.fixture(params=["notebook", "terminal"])
def both(shell, request):
    """Each display set-up in turn, for the tests whose output depends on it."""
    yield from _loaded(shell, request.param)


nb = ip


def run(ip, code: str):
    """Run a cell; return the captured (stdout, [mime bundles])."""
    with capture_output() as c:
        res = ip.run_cell(code, store_history=True)
    res.raise_error()
    return c.stdout, [o.data for o in c.outputs]


def magic(ip, name: str, line: str = ""):
    with capture_output() as c:
        ret = ip.run_line_magic(name, line)
    return ret, c.stdout, [o.data for o in c.outputs]


def record(ip):
    """x: device data of a fresh shape (copied, not computed: no compile); y and z:
    4 pending ops (mm, relu, add, sum)."""
    n = fresh()
    run(ip, f"x = torch.randn({n}, {n}).to('xla')\n"
            "y = (x @ x).relu() + 1\nz = y.sum()")
    xlanb.metrics.clear()  # count from here


# --------------------------------------------------------------------------- load/unload

def test_load_registers_and_unload_removes_everything(shell):
    shell.run_line_magic("load_ext", "xlanb")
    try:
        for name in MAGICS:
            assert shell.find_line_magic(name) is not None, name
        assert shell.find_cell_magic("xla_explain") is not None
        html = shell.display_formatter.formatters["text/html"]
        assert html.lookup_by_type(xlanb.XlaTensor) is not None
        shell.run_line_magic("xla_status", "on")
        assert any(getattr(cb, "__self__", None).__class__ is XlaMagics
                   for cb in shell.events.callbacks["post_run_cell"])
        # loading twice is harmless
        xlanb.load_ipython_extension(shell)
    finally:
        with capture_output():
            shell.run_line_magic("unload_ext", "xlanb")
    for name in MAGICS:
        assert shell.find_line_magic(name) is None, name
    assert shell.find_cell_magic("xla_explain") is None
    for event in ("pre_run_cell", "post_run_cell"):
        assert not any(getattr(cb, "__self__", None).__class__ is XlaMagics
                       for cb in shell.events.callbacks[event])
    with pytest.raises(KeyError):
        shell.display_formatter.formatters["text/html"].lookup_by_type(xlanb.XlaTensor)


def test_magics_have_help(ip):
    doc = ip.find_line_magic("xla_pending").__doc__
    assert "%xla_pending [" in doc and "--depth N" in doc and "--svg" in doc
    assert "lazy" in ip.find_line_magic("xla_mode").__doc__
    assert "recompile" in ip.find_cell_magic("xla_explain").__doc__


# --------------------------------------------------------------------------- %xla_mode

def test_mode_show_and_switch(ip):
    _, out, _ = magic(ip, "xla_mode")
    assert "xla mode: lazy" in out and "opbyop" in out
    record(ip)
    _, out, _ = magic(ip, "xla_mode", "eager")
    assert xlanb.get_mode() == "eager"
    assert "lazy -> eager" in out and "synced" in out
    _, out, _ = magic(ip, "xla_mode", "opbyop")
    assert xlanb.get_mode() == "opbyop"


def test_bad_mode_is_usage_error_and_keeps_pending(ip):
    record(ip)
    before = xlanb.pending_ir()
    with pytest.raises(UsageError, match="valid modes are: lazy, eager, opbyop"):
        ip.run_line_magic("xla_mode", "fast")
    assert xlanb.get_mode() == "lazy"
    assert xlanb.pending_ir() == before
    # through run_cell it is reported, not raised, and the session goes on
    with capture_output() as c:
        res = ip.run_cell("%xla_mode fast")
    assert "UsageError" in c.stdout + c.stderr or not res.success
    assert xlanb.pending_ir() == before


# --------------------------------------------------------------------------- %xla_pending

def test_pending_named_tensor(both):
    record(both)
    compiles = counter("UncachedCompile")
    before = xlanb.pending_ir()
    _, _, outs = magic(both, "xla_pending", "z")
    (bundle,) = outs
    text = bundle["text/plain"]
    assert "aten::mm" in text and "aten::sum" in text and "pending of z: 4 ops" in text
    assert "In[" in text  # source lines resolved to notebook cells
    if both.display_kind == "terminal":
        assert set(bundle) == {"text/plain"}
    elif HAVE_DOT:
        assert bundle["image/svg+xml"].lstrip().startswith("<?xml")
        assert "<svg" in bundle["image/svg+xml"]
    assert xlanb.pending_ir() == before
    assert counter("UncachedCompile") == compiles


def test_pending_all_live_text_dot_depth(ip):
    record(ip)
    _, _, (b,) = magic(ip, "xla_pending", "--text")
    assert "image/svg+xml" not in b and "aten::relu" in b["text/plain"]
    _, _, (b,) = magic(ip, "xla_pending", "z --text --depth 2")
    assert "aten::sum" in b["text/plain"] and "aten::mm" not in b["text/plain"]
    assert "not shown (depth=2)" in b["text/plain"]
    _, _, (b,) = magic(ip, "xla_pending", "--text --fold")  # no repeated layers here
    assert "more layers" not in b["text/plain"] and "aten::relu" in b["text/plain"]
    _, _, (b,) = magic(ip, "xla_pending", "z --dot --depth 2")
    assert b["text/plain"].splitlines()[1].startswith("digraph")
    assert "aten::sum" in b["text/plain"] and "aten::mm" not in b["text/plain"]


@pytest.mark.skipif(not HAVE_DOT, reason="Graphviz's dot is not installed")
def test_pending_svg_forced_in_any_frontend(both):
    record(both)
    _, _, (b,) = magic(both, "xla_pending", "y z --svg")
    if both.display_kind == "notebook":
        assert "<svg" in b["image/svg+xml"]
    assert "aten::relu" in b["text/plain"]


def test_pending_without_dot_shows_text_and_hint(nb, monkeypatch):
    record(nb)
    monkeypatch.setenv("PATH", "/nonexistent")
    _, _, (b,) = magic(nb, "xla_pending", "z")
    assert "image/svg+xml" not in b
    assert "aten::sum" in b["text/plain"] and "apt-get install graphviz" in b["text/plain"]
    assert "apt-get install graphviz" in b["text/html"]


def test_pending_nothing_pending(ip):
    _, _, (b,) = magic(ip, "xla_pending", "")
    assert "no pending ops" in b["text/plain"]


@pytest.mark.parametrize("line, message", [
    ("nope", "'nope' is not defined"),
    ("notatensor", "int, not a tensor on the xla device"),
    ("cpu_t", "not on the xla device"),
    ("x+1", "is not a name"),
    ("z --depth 0", "positive"),
])
def test_pending_bad_input(ip, line, message):
    record(ip)
    ip.user_ns["cpu_t"] = torch.ones(2)
    ip.user_ns["notatensor"] = 3
    before = xlanb.pending_ir()
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("xla_pending", line)
    assert xlanb.pending_ir() == before
    ip.user_ns.pop("cpu_t")


def test_pending_accepts_dotted_names_and_sequences(ip):
    record(ip)
    run(ip, "class Box: pass\nbox = Box(); box.t = z\nts = [y, z]")
    _, _, (b,) = magic(ip, "xla_pending", "box.t ts --text")
    assert "aten::sum" in b["text/plain"]
    ip.user_ns.pop("box")


# --------------------------------------------------------------------------- %xla_sync

def test_sync_reports_new_compile_then_cache_hit(both):
    record(both)
    _, _, (b,) = magic(both, "xla_sync")
    text = b["text/plain"]
    assert counter("UncachedCompile") == 1
    assert "new compile" in text and "4 ops" in text
    g = xlanb.graphs()[-1]
    assert g.hash[:12] in text
    run(both, "y = (x @ x).relu() + 1\nz = y.sum()")
    _, _, (b,) = magic(both, "xla_sync")
    assert counter("UncachedCompile") == 1 and counter("CachedCompile") == 1
    assert "cache hit" in b["text/plain"] and g.hash[:12] in b["text/plain"]
    if both.display_kind == "notebook":
        assert "cache hit" in b["text/html"]
    _, _, (b,) = magic(both, "xla_sync")
    assert "nothing was pending" in b["text/plain"]


def test_sync_reports_recompile_reason(ip):
    run(ip, f"x = torch.randn({fresh()}, 4).to('xla')")
    for n in (2, 3):
        run(ip, f"acc = torch.cat([x] * {n})")
        _, _, (b,) = magic(ip, "xla_sync")
    assert "recompile" in b["text/plain"] and "aten::cat" in b["text/plain"]


@pytest.mark.parametrize("mode", ["eager", "opbyop"])
def test_sync_in_other_modes(ip, mode):
    magic(ip, "xla_mode", mode)
    run(ip, "x = torch.ones(3, device='xla')\ny = (x * 2).exp()")
    _, _, (b,) = magic(ip, "xla_sync")
    if mode == "opbyop":
        assert "run one by one" in b["text/plain"]
    else:  # eager: the open run of new ops compiles as one graph, quickly
        assert "a run of" in b["text/plain"] and "-> graph" in b["text/plain"], b["text/plain"]
        assert counter("EagerRunCompile") + counter("EagerRunCacheHit") == 1
    assert counter("UncachedCompile") == 0
    assert torch.allclose(ip.user_ns["y"].cpu(), torch.full((3,), 2.0).exp())


# --------------------------------------------------------------------------- %xla_hlo

def test_hlo_dialects(both):
    record(both)
    compiles = counter("UncachedCompile")
    _, _, (b,) = magic(both, "xla_hlo", "z")
    assert "stablehlo.dot_general" in b["text/plain"]
    assert "sdy.sharding<" not in b["text/plain"]  # tidied
    if both.display_kind == "notebook":
        assert "<span style=" in b["text/html"] and "dot_general" in b["text/html"]
    else:
        assert set(b) == {"text/plain"}
    _, _, (b,) = magic(both, "xla_hlo", "z --dialect hlo")
    assert "HloModule" in b["text/plain"]
    _, _, (b,) = magic(both, "xla_hlo", "z --raw")
    assert "sdy.sharding<" in b["text/plain"]
    assert counter("UncachedCompile") == compiles  # nothing compiled


def test_hlo_optimized_is_reused_by_the_sync(ip):
    record(ip)
    _, _, (b,) = magic(ip, "xla_hlo", "--optimized")
    assert "HloModule" in b["text/plain"] and "FileNames" not in b["text/plain"]
    assert counter("UncachedCompile") == 1
    xlanb.sync()
    assert counter("UncachedCompile") == 1 and counter("CachedCompile") == 1


def test_hlo_bad_input(ip):
    with pytest.raises(UsageError, match="nothing is pending"):
        ip.run_line_magic("xla_hlo", "")
    record(ip)
    before = xlanb.pending_ir()
    with pytest.raises(UsageError, match="nothing is pending for x"):
        ip.run_line_magic("xla_hlo", "x")  # device data, no pending work
    with pytest.raises(UsageError, match="dialect"):
        ip.run_line_magic("xla_hlo", "z --dialect mlir")
    with pytest.raises(UsageError, match="not defined"):
        ip.run_line_magic("xla_hlo", "nope")
    assert xlanb.pending_ir() == before


# --------------------------------------------------------------------------- %xla_peek

def test_peek_does_not_cut_the_graph(ip):
    record(ip)
    before = xlanb.pending_ir()
    expected = torch.relu(ip.user_ns["x"].cpu() @ ip.user_ns["x"].cpu()) + 1
    value, _, _ = magic(ip, "xla_peek", "z")
    assert value.device.type == "cpu"
    torch.testing.assert_close(value, expected.sum())
    value, _, _ = magic(ip, "xla_peek", "y[0]")
    torch.testing.assert_close(value, expected[0])
    pair, _, _ = magic(ip, "xla_peek", "[y, z]")
    assert len(pair) == 2 and pair[0].device.type == "cpu"
    assert xlanb.pending_ir() == before
    assert counter("UncachedCompile") == 0
    xlanb.sync()
    assert counter("UncachedCompile") == 1


@pytest.mark.parametrize("expr, message", [
    ("nope + 1", "not defined"),
    ("3 +", "not a Python expression"),
    ("'text'", "is a str, not a tensor"),
    ("", "needs an expression"),
    ("1/0", r"1/0: ZeroDivisionError: division by zero"),  # one line, no traceback
])
def test_peek_bad_input(ip, expr, message):
    record(ip)
    before = xlanb.pending_ir()
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("xla_peek", expr)
    assert xlanb.pending_ir() == before


# --------------------------------------------------------------------------- %xla_metrics

def test_metrics_table(both):
    record(both)
    xlanb.sync()
    _, _, (b,) = magic(both, "xla_metrics")
    text = b["text/plain"]
    lines = [ln.split()[0] for ln in text.splitlines()[3:] if ln.strip()]
    assert lines[0] == "UncachedCompile" and "CompileTime" in lines
    assert "1 graph compile" in text
    assert "OpCacheHit" not in lines  # never counted: only with --all
    if both.display_kind == "notebook":
        assert "<table" in b["text/html"] and "UncachedCompile" in b["text/html"]
    else:
        assert set(b) == {"text/plain"}
    _, _, (b,) = magic(both, "xla_metrics", "--all")
    assert "OpCacheHit" in b["text/plain"]
    _, _, (b,) = magic(both, "xla_metrics", "--reset")
    assert "cleared" in b["text/plain"]
    assert counter("UncachedCompile") == 0
    _, _, (b,) = magic(both, "xla_metrics")
    assert "0 graph compiles" in b["text/plain"]


def test_metrics_lists_cpu_fallbacks(ip):
    xlanb.metrics.counter("aten::fake_op")
    _, _, (b,) = magic(ip, "xla_metrics")
    assert "aten::fake_op" in b["text/plain"] and "1 CPU fallback" in b["text/plain"]


# --------------------------------------------------------------------------- %xla_graphs

def test_graphs_table_names_the_recompiling_line(both):
    run(both, f"x = torch.randn({fresh()}, 3).to('xla')")
    run(both, "acc = x\nfor i in range(3):\n    acc = torch.cat((acc, x))\n    xlanb.sync()")
    _, _, (b,) = magic(both, "xla_graphs")
    text = b["text/plain"]
    assert "shape change: aten::cat" in text
    assert re.search(r"In\[\d+\]:3 <module>", text), text  # the cat's line in the cell
    assert "recompiles every step" in text
    if both.display_kind == "notebook":
        assert "<table" in b["text/html"] and "shape change" in b["text/html"]
    _, _, (b,) = magic(both, "xla_graphs", "--last 1")
    assert len([ln for ln in b["text/plain"].splitlines() if ln[:1].isdigit()]) == 1
    with pytest.raises(UsageError):
        both.run_line_magic("xla_graphs", "--last 0")


def test_graphs_empty(ip):
    xlanb.sync()
    if not len(xlanb.graphs()):
        _, _, (b,) = magic(ip, "xla_graphs")
        assert "no compiled graphs" in b["text/plain"]


# --------------------------------------------------------------------------- %%xla_explain

def test_explain_names_the_cause_and_line(both):
    n = fresh()
    run(both, f"x = torch.randn(2, {n}).to('xla')")
    xlanb.metrics.clear()
    stdout, outs = run(both, "%%xla_explain\nacc = x\nfor i in range(3):\n"
                           "    acc = torch.cat((acc, x))\n    xlanb.sync()\nacc.shape")
    texts = [o["text/plain"] for o in outs]
    report = next(t for t in texts if t.startswith("xla explain"))
    assert "3 compiles" in report
    assert "shape change: aten::cat" in report
    assert "xlanb.sync()" in report and "In[" in report
    assert re.search(r"In\[\d+\]:5 <module>: xlanb.sync\(\)", report)  # as the cell shows it
    assert re.search(r"aten::cat at In\[\d+\]:4 <module>", report), report
    assert "recompiles" in report
    assert f"torch.Size([8, {n}])" in stdout  # the cell's value is still shown
    assert counter("UncachedCompile") == 3
    if both.display_kind == "notebook":
        html = next(o["text/html"] for o in outs if "text/html" in o)
        assert "xla explain" in html


def test_explain_cache_hits_and_op_compiles(ip):
    run(ip, "x = torch.randn(3, device='xla')\nxlanb.sync()\ny = x * 2\nxlanb.sync()")
    _, outs = run(ip, "%%xla_explain\ny = x * 2\nxlanb.sync()")
    report = outs[0]["text/plain"]
    assert "1 cache hit" in report and "0 compiles" in report
    magic(ip, "xla_mode", "eager")
    _, outs = run(ip, "%%xla_explain\nw = x.sin().cos()")
    assert "2 ops still pending (mode eager)" in outs[0]["text/plain"]
    assert "open run" in outs[0]["text/plain"]
    _, outs = run(ip, "%%xla_explain\nw = x.sin().cos()\nw.cpu()")
    report = outs[0]["text/plain"]  # the run compiled as one graph, its line named
    assert "1 run compile" in report and "2 ops, compiled in" in report, report
    assert "In[" in report and "w.cpu()" in report


def test_explain_reports_even_when_the_cell_fails(ip):
    run(ip, "x = torch.randn(3, device='xla')")
    with capture_output() as c:
        res = ip.run_cell("%%xla_explain\ny = x + 1\nxlanb.sync()\nraise RuntimeError('boom')",
                          store_history=True)
    assert isinstance(res.error_in_exec, RuntimeError)
    assert any(o.data["text/plain"].startswith("xla explain") for o in c.outputs)
    with pytest.raises(UsageError):
        ip.run_cell_magic("xla_explain", "--bogus", "pass")


# --------------------------------------------------------------------------- %xla_status

def test_status_line_after_each_cell(ip):
    _, out, _ = magic(ip, "xla_status", "on")
    assert "status line on" in out
    try:
        out, _ = run(ip, f"x = torch.randn({fresh()}, device='xla')\ny = x + 1")
        assert "xla: lazy · 3 pending ops" in out.splitlines()[-1]
        out, _ = run(ip, "xlanb.sync()")
        last = out.splitlines()[-1]
        assert "xla: lazy · 0 pending ops · 1 compile (" in last and "new graph at In[" in last
        run(ip, "y = x + 1\nxlanb.sync()")
        out, _ = run(ip, "y = x + 1\nxlanb.sync()")
        assert "1 cached graph run" in out
        out, _ = run(ip, "for k in (2, 3):\n    acc = torch.cat([x] * k)\n    xlanb.sync()")
        assert "2 compiles" in out and "recompile: shape change: aten::cat at In[" in out
    finally:
        magic(ip, "xla_status", "off")
    out, _ = run(ip, "y = x + 2")
    assert "xla:" not in out
    with pytest.raises(UsageError):
        ip.run_line_magic("xla_status", "maybe")
    _, out, _ = magic(ip, "xla_status")
    assert out.startswith("xla: lazy · 1 pending op") and "status line off" in out


# --------------------------------------------------------------------------- tensors

def test_notebook_repr_of_a_pending_tensor_does_not_cut_the_graph(both):
    record(both)
    before = xlanb.pending_ir()
    with capture_output() as c:
        both.run_cell("y", store_history=True)
    assert "device='xla:0'" in c.stdout
    data, _ = both.display_formatter.format(both.user_ns["y"])
    assert "device='xla:0'" in data["text/plain"]
    if both.display_kind == "notebook":
        assert "3 pending ops" in data["text/html"] and "by peek" in data["text/html"]
    assert xlanb.pending_ir() == before
    assert counter("UncachedCompile") == 0


# --------------------------------------------------------------------------- display objects

def test_display_objects_always_have_plain_text():
    objs = [xd.PendingGraph("%0 = f32[2] device_data\noutputs: %0", 0),
            xd.HloView("module {}", "stablehlo", False, 1), xd.MetricsTable(),
            xd.GraphsTable([]), xd.SyncSummary(xd.Activity(), 0, "lazy"),
            xd.ExplainReport(xd.Activity(), 0, "lazy")]
    for obj in objs:
        bundle = obj._repr_mimebundle_()
        assert bundle["text/plain"] == repr(obj)
        only_text = obj._repr_mimebundle_(include=["text/plain"])
        assert set(only_text) == {"text/plain"}
        assert "text/html" not in obj._repr_mimebundle_(exclude=["text/html"])


def test_depth_keeps_the_last_levels_in_text_and_pictures():
    x = torch.arange(2.0).to("xla")
    y = x.sin().cos().exp()
    text = xlanb.pending_ir(y, depth=2)
    assert "aten::cos" in text and "aten::exp" in text and "aten::sin" not in text
    assert text.startswith("# 1 earlier ops not shown")
    dot = xlanb.pending_ir(y, fmt="dot", depth=1)
    assert "aten::exp" in dot and "aten::cos" not in dot and "(cut)" in dot
    assert dot.rstrip().endswith("}")


def test_source_resolver_labels_cells(ip, monkeypatch):
    """The resolver names cells through the labeler the extension installed (the shell's
    map of cell code names to execution counts), as every core message does."""
    from xlanb import GraphSummary, OpRecord, SourceLoc
    monkeypatch.setitem(ip.compile._filename_map, "/tmp/ipykernel_1/123.py", 7)
    cell = SourceLoc("/tmp/ipykernel_1/123.py", 4, "<module>")
    r = xd.SourceResolver()
    assert cell.short == "In[7]:4 <module>"
    assert r.label(cell) == "In[7]:4 <module>"  # the core's one location format
    assert r.label(SourceLoc("/other/dir/123.py", 4, "<module>")) == "123.py:4 <module>"
    assert r.label(SourceLoc("/src/train.py", 51, "step")) == "train.py:51 step"
    assert r.label(SourceLoc("/src/extensions/ipython.py", 120, "xla_sync")) == "%xla_sync"
    assert r.label(None) == ""
    # the core's renderer and differ name source lines through the resolver
    op = OpRecord("aten::cat", "f32[2]", "%0", cell, "", (0,), "%0")
    a = GraphSummary(("f32[2]",), (op,), (1,))
    b = GraphSummary(("f32[3]",), (op._replace(aval="f32[3]"),), (1,))
    assert xlanb.explain(a, b, label=r.label) == \
        "shape change: aten::cat at In[7]:4 <module>: f32[2] -> f32[3]"
    assert "# In[7]:4 <module>" in xlanb.render_text(b, label=r.label)
    assert 'tooltip="In[7]:4 <module>"' in xlanb.render_dot(b, label=r.label)


def test_pending_collapse_scopes(ip):
    run(ip, f"m = torch.nn.Sequential(torch.nn.Linear({fresh()}, 4), torch.nn.ReLU()).to('xla')\n"
            "v = m(torch.ones(2, m[0].in_features).to('xla')).sum()")
    _, _, (b,) = magic(ip, "xla_pending", "v --dot --collapse 1")
    assert "Sequential" in b["text/plain"] and "3 ops" in b["text/plain"]
    _, _, (b,) = magic(ip, "xla_pending", "v --dot --depth 1 --collapse 1")
    assert "(cut)" in b["text/plain"]
    ip.user_ns.pop("m")


def test_graphs_show_one_graph(both):
    record(both)
    xlanb.sync()
    _, _, (b,) = magic(both, "xla_graphs", "--show -1")
    assert "graph #" in b["text/plain"] and "aten::mm" in b["text/plain"]
    if both.display_kind == "notebook" and HAVE_DOT:
        assert "<svg" in b["image/svg+xml"]
    _, _, (b,) = magic(both, "xla_graphs", "--show -1 --text")
    assert "image/svg+xml" not in b
    with pytest.raises(UsageError, match="no graph #"):
        both.run_line_magic("xla_graphs", f"--show {len(xlanb.graphs())}")


def test_graphs_synced_inside_a_magic_are_named_by_the_magic():
    from types import SimpleNamespace as G
    from xlanb import SourceLoc as L
    for src in (L("/ip/core/interactiveshell.py", 2417, "run_line_magic"),
                L("/ip/core/interactiveshell.py", 2541, "run_cell_magic"),
                L("<decorator-gen-123>", 2, "xla_sync"),
                L("/src/extensions/ipython.py", 203, "xla_sync")):
        assert xd.graph_where(G(src=src, cause="%xla_sync")) == "%xla_sync"
    assert xd.graph_where(G(src=L("/ip/interactiveshell.py", 1, "run_line_magic"),
                            cause="xlanb.hlo(optimized=True)")) == "a magic (xlanb.hlo(optimized=True))"
    assert xd.graph_where(G(src=L("/src/train.py", 3, "step"), cause="user sync")) == "train.py:3 step"
    assert xd.graph_where(G(src=L("/src/ipython.py", 3, "step"), cause="user sync")) == "ipython.py:3 step"


def test_explain_error_traceback_names_the_cell_it_ran_in(shell):
    """A cell that raises under %%xla_explain: its traceback names that cell's In[N],
    also when the same code ran before as another cell."""
    import io
    import re
    from contextlib import redirect_stdout
    shell.run_line_magic("load_ext", "xlanb")
    for _ in range(2):
        n = shell.execution_count
        out = io.StringIO()
        with redirect_stdout(out):
            shell.run_cell("%%xla_explain\ny = 2\nraise ValueError('boom')", store_history=True)
        text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
        assert f"Cell In[{n}], line 3" in text, text


def test_a_cell_that_ends_starts_the_tier_up_of_its_hot_runs(ip, monkeypatch):
    """When a cell ends, the eager runs it ran again and again start their optimized
    compiles (the user's think time); ``XLANB_IDLE_TIER_UP=0`` (``config``) turns it off."""
    from xlanb.execute import graphs
    monkeypatch.setattr(graphs, "graph_cache", {})  # only this test's graphs
    n = fresh()
    code = (f"with xlanb.mode('eager'):\n"
            f"    v = torch.randn(3, {n + 900}).to('xla')\n"
            f"    for _ in range(5):\n"
            f"        out = ((v.exp() * 2.0 + v).sum(dim=1)).cpu()\n")
    monkeypatch.setattr(xlanb.config, "idle_tier_up", 0)
    run(ip, code)
    hot = max(graphs.graph_cache.values(), key=lambda g: g.hits)
    assert hot.quick and hot.hits == 4 and hot._tiering is None
    monkeypatch.setattr(xlanb.config, "idle_tier_up", 4)
    run(ip, code)
    hot = max(graphs.graph_cache.values(), key=lambda g: g.hits)
    assert hot._tiering is not None  # started as the cell ended
    hot._tiering.result(timeout=120)
    assert not hot.quick
