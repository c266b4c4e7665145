"""Inspecting pending work without running it, and asking why graphs compiled.

``pending_ir`` (text and DOT, with the user's source lines and nn.Module scopes),
``render_svg``, ``hlo`` (StableHLO/HLO, optionally optimized through the graph cache),
``graphs()`` (every compiled graph with its cause and source line) and the recompile
explanations of seeds/001's growing ``torch.cat``.

The graph cache lives for the whole process, so every test that counts compiles uses
shapes no other test uses.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn

import xlanb
from conftest import _child_env, counter

HERE = os.path.basename(__file__)
IR_LINE = re.compile(
    r"^%(\d+) = (?:f32|f64|s64|s32|pred|bf16|f16)\[[\d,]*\] (aten::\w+|device_data)(?:\(([^)]*)\))?"
    r"(?:  # (\S+:\d+) (\S+))?(?:  \[([^\]]+)\])?$")


def _line() -> int:
    """The caller's line number."""
    return sys._getframe(1).f_lineno


def _marked(tag: str) -> int:
    """The line of this file that ends with the comment ``# <tag>``."""
    with open(__file__) as f:
        found = [i for i, ln in enumerate(f, 1) if ln.rstrip().endswith(f"# <{tag}>")]
    assert len(found) == 1, (tag, found)
    return found[0]


def _executes() -> int:
    d = xlanb.metrics.metric_data("ExecuteTime")
    return 0 if d is None else d.count


class TwoLayer(nn.Module):
    def __init__(self, d_in=6, d_hidden=10, d_out=3):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        h = self.fc1(x)  # <fc1>
        h = torch.relu(h)  # <relu>
        return self.fc2(h)  # <fc2>


FC1_LINE = _marked("fc1")
RELU_LINE = _marked("relu")
FC2_LINE = _marked("fc2")


def _two_layer(d_in=6, d_hidden=10, d_out=3, batch=4):
    torch.manual_seed(0)
    m = TwoLayer(d_in, d_hidden, d_out).to("xla")
    x = torch.randn(batch, d_in).to("xla")
    xlanb.sync()
    return m, x


# ---------------------------------------------------------------------------------------
# pending_ir: text


def test_pending_ir_text_has_user_lines_and_module_scopes():
    m, x = _two_layer()
    y = m(x)
    z = y * 2
    z_line = _line() - 1
    before = (counter("UncachedCompile"), counter("OpCompile"), _executes())
    text = xlanb.pending_ir(z)
    assert (counter("UncachedCompile"), counter("OpCompile"), _executes()) == before
    assert xlanb.pending_count(z) > 0

    lines = text.splitlines()
    assert lines[-1].startswith("outputs: %")
    ops = {}
    for ln in lines[:-1]:
        if ln.startswith("#"):
            continue
        mt = IR_LINE.match(ln)
        assert mt, f"unexpected IR line: {ln!r}"
        if mt.group(2) != "device_data":
            ops.setdefault(mt.group(2), []).append(mt)
    # one line per node, numbered in order
    nums = [int(ln.split(" ", 1)[0][1:]) for ln in lines[:-1] if ln.startswith("%")]
    assert nums == list(range(len(nums)))

    addmms = ops["aten::addmm"]
    assert len(addmms) == 2
    # the user's frame (this file, the forward line), not torch's functional.py
    fc1, fc2 = addmms
    assert fc1.group(4) == f"{HERE}:{FC1_LINE}" and fc1.group(5) == "forward"
    assert fc2.group(4) == f"{HERE}:{FC2_LINE}" and fc2.group(5) == "forward"
    assert fc1.group(6) == "TwoLayer.fc1"
    assert fc2.group(6) == "TwoLayer.fc2"
    # inputs are %refs to earlier nodes
    assert all(re.fullmatch(r"%\d+", a) for a in fc1.group(3).split(", "))
    assert "f32[4,10] aten::addmm" in fc1.group(0)
    (relu,) = ops["aten::relu"]
    assert relu.group(4) == f"{HERE}:{RELU_LINE}" and relu.group(6) == "TwoLayer"
    (mul,) = ops["aten::mul"]
    assert mul.group(4) == f"{HERE}:{z_line}"
    assert mul.group(5) == "test_pending_ir_text_has_user_lines_and_module_scopes"
    assert mul.group(6) is None  # outside any module
    for ln in lines:
        assert "functional.py" not in ln and "module.py" not in ln and "xlanb" not in ln


def test_pending_ir_covers_all_live_tensors_by_default():
    a = torch.ones(3, 2).to("xla") + 1
    b = torch.ones(5).to("xla").neg()
    all_text = xlanb.pending_ir()
    assert "aten::add" in all_text and "aten::neg" in all_text
    assert len(all_text.splitlines()[-1].split(",")) == 2  # both outputs
    only_a = xlanb.pending_ir(a)
    assert "aten::add" in only_a and "aten::neg" not in only_a
    assert xlanb.pending_count() == 2 and xlanb.pending_count(b) == 1
    del a, b


def test_pending_ir_nothing_pending():
    x = torch.ones(2).to("xla")
    xlanb.sync()
    assert xlanb.pending_count() == 0
    text = xlanb.pending_ir()
    assert "aten::" not in text
    assert "aten::" not in xlanb.pending_ir(x)


def test_pending_ir_depth_trims():
    x = torch.ones(4).to("xla")
    y = ((((x + 1) * 2) - 3).exp()).sin()
    full = xlanb.pending_ir(y)
    assert full.count("aten::") == 5
    d1 = xlanb.pending_ir(y, depth=1)
    assert "aten::sin" in d1 and "aten::exp" not in d1 and "aten::add" not in d1
    assert re.search(r"\b4\b.*not shown", d1), d1
    d2 = xlanb.pending_ir(y, depth=2)
    assert "aten::sin" in d2 and "aten::exp" in d2 and "aten::sub" not in d2
    assert xlanb.pending_ir(y, depth=50) == full
    with pytest.raises(ValueError):
        xlanb.pending_ir(y, depth=0)


def test_pending_ir_bad_arguments():
    y = torch.ones(3).to("xla") * 2
    with pytest.raises(ValueError, match="text.*dot"):
        xlanb.pending_ir(y, fmt="svg")
    with pytest.raises(TypeError, match="xla"):
        xlanb.pending_ir(torch.ones(3))


# ---------------------------------------------------------------------------------------
# pending_ir: DOT and SVG


def _dot_of_program():
    m, x = _two_layer(7, 9, 2, batch=3)
    y = m(x).sum()
    dot = xlanb.pending_ir(y, fmt="dot")
    xlanb.sync()
    return dot


def test_pending_ir_dot_ids_clusters_tooltips():
    dot = _dot_of_program()
    again = _dot_of_program()
    assert dot == again  # node ids (and everything else) stable from run to run
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    assert "subgraph cluster_TwoLayer_fc1" in dot
    assert "subgraph cluster_TwoLayer_fc2" in dot
    assert re.search(r'label="TwoLayer\.fc1"', dot)
    # each op's tooltip carries its source line
    assert f'tooltip="{HERE}:{FC1_LINE} forward"' in dot
    assert f'tooltip="{HERE}:{FC2_LINE} forward"' in dot
    # addmm of fc1 is inside the fc1 cluster
    fc1_block = dot.split("subgraph cluster_TwoLayer_fc1", 1)[1].split("}", 1)[0]
    assert "aten::addmm" in fc1_block
    edges = re.findall(r"^\s*n(\d+) -> n(\d+);$", dot, re.M)
    assert edges and all(int(a) < int(b) for a, b in edges)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot is not installed")
def test_render_svg_with_dot():
    m, x = _two_layer()
    dot = xlanb.pending_ir(m(x), fmt="dot")
    svg = xlanb.render_svg(dot)
    assert "<svg" in svg and "</svg>" in svg
    titles = re.findall(r"<title>(n\d+)</title>", svg)
    assert len(titles) == len(set(re.findall(r"^\s*(n\d+) \[", dot, re.M)))
    assert "cluster_TwoLayer_fc1" in svg


def test_render_svg_without_dot_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("dot") is None
    with pytest.raises(RuntimeError, match="graphviz") as err:
        xlanb.render_svg("digraph { a -> b }")
    assert "install" in str(err.value)


# ---------------------------------------------------------------------------------------
# hlo


def test_hlo_returns_modules_without_running_anything():
    x = torch.ones(3, 5).to("xla")
    y = torch.tanh(x @ torch.ones(5, 2).to("xla")) + 1
    ir = xlanb.pending_ir()
    before = (counter("UncachedCompile"), counter("CachedCompile"), _executes())
    shlo = xlanb.hlo(y)
    assert "stablehlo." in shlo and "tensor<3x2xf32>" in shlo
    hlo_text = xlanb.hlo(y, dialect="hlo")
    assert "HloModule" in hlo_text and "f32[3,2]" in hlo_text
    assert (counter("UncachedCompile"), counter("CachedCompile"), _executes()) == before
    assert xlanb.metrics.metric_data("ExecuteTime") is None
    assert xlanb.pending_ir() == ir
    with pytest.raises(ValueError, match="stablehlo"):
        xlanb.hlo(y, dialect="mlir")
    torch.testing.assert_close(y.cpu(), torch.tanh(torch.full((3, 2), 5.0)) + 1)


def test_hlo_optimized_compiles_once_through_the_cache():
    x = torch.ones(7, 3).to("xla")
    y = (x * 4).sum(1).sqrt()
    opt = xlanb.hlo(optimized=True)
    assert "HloModule" in opt
    assert counter("UncachedCompile") == 1
    assert _executes() == 0
    assert xlanb.pending_count() > 0
    xlanb.sync()
    assert counter("UncachedCompile") == 1 and counter("CachedCompile") == 1
    torch.testing.assert_close(y.cpu(), torch.full((7,), 12.0).sqrt())


def test_hlo_of_nothing_pending():
    x = torch.ones(2).to("xla")
    xlanb.sync()
    assert xlanb.hlo() == ""
    assert xlanb.hlo(x) == ""


# ---------------------------------------------------------------------------------------
# graphs(): compile records, causes, table


def test_graphs_records_user_sync():
    x = torch.ones(11, 2).to("xla")
    y = (x + 3).relu()
    xlanb.sync()
    sync_line = _line() - 1
    gl = xlanb.graphs()
    assert isinstance(gl, xlanb.GraphList) and isinstance(gl, list)
    g = gl[-1]
    assert isinstance(g, xlanb.CompiledGraph)
    assert g.cause == "user sync"
    assert g.src.short == f"{HERE}:{sync_line} test_graphs_records_user_sync"
    assert re.fullmatch(r"[0-9a-f]{16}", g.hash)
    assert g.n_nodes == 2 and g.n_inputs == 1 and g.n_outputs >= 1
    assert g.compile_time > 0 and g.run_time > 0 and g.hits == 0
    assert g.explanation == ""
    assert g.ops == ("aten::add", "aten::relu")
    cost = g.cost_analysis()
    assert isinstance(cost, dict)
    assert g.memory_analysis() is None or hasattr(g.memory_analysis(), "argument_size_in_bytes")
    # the same structure again: a hit on this record, no new record
    y2 = (torch.zeros(11, 2).to("xla") + 3).relu()
    xlanb.sync()
    assert xlanb.graphs()[-1] is g and g.hits == 1
    torch.testing.assert_close(y2.cpu(), torch.full((11, 2), 3.0))
    torch.testing.assert_close(y.cpu(), torch.full((11, 2), 4.0))


def test_graphs_table_and_html():
    x = torch.ones(2, 13).to("xla")
    y = (x * 5).sum()
    xlanb.mark_step()
    line = _line() - 1
    gl = xlanb.graphs()
    text = str(gl)
    header = text.splitlines()[0].split()
    for col in ("hash", "ops", "in", "out", "compile", "hits", "cause", "source"):
        assert col in header
    last = [ln for ln in text.splitlines() if gl[-1].hash[:12] in ln]
    assert last and f"{HERE}:{line}" in last[0] and "mark_step" in last[0]
    html = gl._repr_html_()
    assert html.startswith("<table") and gl[-1].hash[:12] in html
    assert str(xlanb.GraphList()) == "no compiled graphs"
    assert y.item() == 130.0


def test_cause_value_needed_by_item():
    s = (torch.ones(19).to("xla") * 2).sum()
    assert s.item() == 38.0
    line = _line() - 1
    g = xlanb.graphs()[-1]
    assert g.cause == "value needed by .item()"
    assert g.src.short.startswith(f"{HERE}:{line} ")


def test_cause_cpu_fallback(monkeypatch):
    from test_fallback import _unlowered  # the same probing as the fallback tests
    # no warning from here: test_fallback checks the first one in the process
    monkeypatch.setattr(xlanb.config, "warn_fallbacks", False)
    op, _, mk, fn = _unlowered()[0]
    name = f"aten::{op.overloadpacket.__name__}"
    # pending lazy work feeding the fallback op must be computed for it
    ins = tuple((t + 0).neg().neg() for t in mk("xla"))
    assert xlanb.pending_count() > 0
    got = fn(*ins)
    line = _line() - 1
    assert counter(name) == 1
    assert counter("UncachedCompile") >= 1
    causes = [g.cause for g in xlanb.graphs()]
    assert f"CPU fallback of {name}" in causes, causes
    g = next(g for g in reversed(xlanb.graphs()) if g.cause == f"CPU fallback of {name}")
    # the user's frame: the candidate's call is a lambda in test_fallback.py
    assert g.src.short.startswith(("test_fallback.py:", f"{HERE}:{line} ")), g.src
    assert got.device.type == "xla"
    want = fn(*mk("cpu"))
    torch.testing.assert_close(got.cpu(), want)


def test_cause_mode_switch():
    x = torch.ones(3, 17).to("xla")
    y = x.exp() * 2
    xlanb.set_mode("eager")
    line = _line() - 1
    assert counter("UncachedCompile") == 1
    g = xlanb.graphs()[-1]
    assert g.cause == "mode switch"
    assert g.src.short.startswith(f"{HERE}:{line} ")
    assert xlanb.pending_count() == 0
    torch.testing.assert_close(y.cpu(), torch.full((3, 17), 1.0).exp() * 2)


# ---------------------------------------------------------------------------------------
# Recompile explanations


def _eval_loop(steps, preallocate, width):
    """seeds/001: an eval loop that accumulates predictions with torch.cat."""
    torch.manual_seed(1)
    model = nn.Linear(width, 2).to("xla")
    batch = 3
    if preallocate:
        preds = torch.zeros(steps * batch, 2).to("xla")
    else:
        preds = torch.zeros(0, 2).to("xla")
    xlanb.sync()
    xlanb.metrics.clear()
    for i in range(steps):
        x = torch.full((batch, width), float(i)).to("xla")
        out = model(x)
        if preallocate:  # rows chosen by a device index: values never recompile
            rows = torch.arange(i * batch, (i + 1) * batch).to("xla")
            preds.index_copy_(0, rows, out)
        else:
            preds = torch.cat((preds, out), dim=0)  # <cat>
        xlanb.sync()
    return preds


CAT_LINE = _marked("cat")


def test_seed001_growing_cat_recompiles_and_explains(monkeypatch):
    # predictions too big to grow on the host (as a real evaluation's are): every
    # changed segment compiles
    monkeypatch.setattr(xlanb.config, "host_segment_bytes", 0)
    n0 = len(xlanb.graphs())
    preds = _eval_loop(5, preallocate=False, width=23)
    assert counter("UncachedCompile") >= 5  # the graph changes every step
    new = xlanb.graphs()[n0:]
    assert new[0].explanation == ""  # the first graph from this line
    for g in new[1:]:
        if "aten::cat" in g.ops:  # (not the fixed part, compiled once when cut)
            e = g.explanation
            assert "aten::cat" in e, e
            assert f"{HERE}:{CAT_LINE}" in e, e
    # the growing shape, before and now
    assert "shape change" in new[1].explanation
    assert "f32[3,2]" in new[1].explanation and "f32[6,2]" in new[1].explanation
    # from the third shapes on, the step is cut where it changed: only the cat compiles,
    # and what grows is named with its fix
    assert set(new[-1].ops) == {"aten::cat"}, new[-1].ops
    assert counter("SegmentCacheHit") >= 1
    assert (f"dim 0 of the tensor made at {HERE}:{CAT_LINE}" in new[-1].explanation
            and "grows by 3 each sync" in new[-1].explanation), new[-1].explanation
    assert "recompiled" in str(xlanb.graphs()) and f"{HERE}:{CAT_LINE}" in str(xlanb.graphs())
    assert tuple(preds.shape) == (15, 2)


def test_seed001_small_growing_cat_runs_on_the_host():
    n0 = len(xlanb.graphs())
    preds = _eval_loop(6, preallocate=False, width=41)
    # whole graphs until it is cut, then the fixed part once; the cat (a few bytes) on
    # CPU torch (or, at sizes an earlier test compiled it, from the cache)
    new = xlanb.graphs()[n0:]
    assert len(new) <= 4 and not any("aten::cat" in g.ops for g in new[2:]), new
    assert counter("SegmentOnHost") >= 1
    assert counter("SegmentOnHost") + counter("SegmentCacheHit") >= 5
    assert tuple(preds.shape) == (18, 2)


def test_seed001_preallocated_compiles_once():
    preds = _eval_loop(3, preallocate=True, width=29)
    assert counter("UncachedCompile") == 1
    assert counter("CachedCompile") == 2
    assert tuple(preds.shape) == (9, 2)


def _slice_step(preds, i, out):
    preds[i:i + 3] = out  # <slice>
    xlanb.sync()


def test_changed_static_argument_is_explained():
    preds = torch.zeros(12, 43).to("xla")
    out = torch.ones(3, 43).to("xla")
    xlanb.sync()
    n0 = len(xlanb.graphs())
    _slice_step(preds, 0, out)
    _slice_step(preds, 3, out)
    new = xlanb.graphs()[n0:]
    assert len(new) == 2  # slice offsets are static: a new graph
    e = new[1].explanation
    assert "aten::slice" in e and f"{HERE}:{_marked('slice')}" in e, e


def test_too_frequent_compiles_warn_naming_the_cause(monkeypatch):
    """The issue asks for a torch_xla-style "compiles too frequent" warning that names
    the cause (the torch.cat line and the growing shape)."""
    monkeypatch.setattr(xlanb.config, "host_segment_bytes", 0)  # (the cat compiles)
    xlanb.reset()  # the warning comes once per line: earlier tests loop through that line too
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        _eval_loop(6, preallocate=False, width=31)
    msgs = [str(w.message) for w in rec]
    assert any("compile" in m.lower() and f"{HERE}:{CAT_LINE}" in m for m in msgs), msgs


def _act_step(use_gelu: bool, h):
    y = torch.nn.functional.gelu(h) if use_gelu else torch.relu(h)  # <act>
    xlanb.sync()
    return y


ACT_LINE = _marked("act")


def test_changed_op_is_explained():
    x = torch.ones(5, 37).to("xla")
    xlanb.sync()
    n0 = len(xlanb.graphs())
    _act_step(False, x - 0.5)
    _act_step(True, x - 0.5)
    new = xlanb.graphs()[n0:]
    assert len(new) == 2
    e = new[1].explanation
    assert "aten::gelu" in e and "aten::relu" in e, e
    assert f"{HERE}:{ACT_LINE}" in e, e
    # the same op again: a cache hit, nothing new to explain
    _act_step(True, x - 0.5)
    assert len(xlanb.graphs()) == n0 + 2


def test_added_ops_are_explained():
    def step(extra: bool):
        x = torch.ones(41).to("xla")
        y = x * 2
        if extra:
            y = y.exp().log()
        xlanb.sync()
        return y

    n0 = len(xlanb.graphs())
    step(False)
    step(True)
    e = xlanb.graphs()[n0 + 1].explanation
    assert "added" in e and "aten::exp" in e, e
    assert HERE in e


def test_xlanb_debug_prints_recompile_explanations():
    code = textwrap.dedent("""
        import torch, xlanb
        preds = torch.zeros(0, 2).to("xla")
        for i in range(3):
            preds = torch.cat((preds, torch.ones(2, 2).to("xla") * i), 0)
            xlanb.sync()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_child_env({"XLANB_DEBUG": "1"}), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    both = proc.stdout + proc.stderr  # printed or logged: either stream will do
    assert "aten::cat" in both and "<string>:5" in both, both
