"""The notebook widgets (xlanb.widgets), headless: build each widget, drive its controls
through ``.value`` as a person would, and check what it shows (the SVG Graphviz drew, the
HTML of each tab, the charts). No browser or kernel is needed; tests/test_widgets_browser.py
renders them in Chromium.
"""
from __future__ import annotations

import itertools
import re
from html import unescape
import shutil
import time

import pytest
import torch

import xlanb

pytest.importorskip("ipywidgets")
from xlanb.extensions import widgets as xw  # noqa: E402
from xlanb import GraphSummary, OpRecord, SourceLoc  # noqa: E402

HAVE_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAVE_DOT, reason="Graphviz's dot is not installed")
pytestmark = pytest.mark.filterwarnings("ignore:xlanb. compiles too frequent")

_sizes = itertools.count(53)


def fresh() -> int:
    """A size no other test used, so graphs with it are new to the process's graph cache."""
    return next(_sizes)


def counter(name: str) -> int:
    return xlanb.metrics.counter_value(name) or 0


def nodes(svg: str) -> dict[str, str]:
    """Graphviz SVG -> {node id (n12, s_Model_enc): the node's <g> element text}."""
    out = {}
    for block in re.split(r'(?=<g id="node\d+" class="node">)', svg)[1:]:
        m = re.search(r"<title>([^<]+)</title>", block)
        out[m[1]] = block.split("</g>\n</g>")[0]
    return out


def filled(block: str, colour: str) -> bool:
    return f'fill="{colour}"' in block


class Net(torch.nn.Module):
    """Two levels of module scopes: Net.enc.0 (Linear), Net.enc.1 (ReLU), Net.head."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.enc = torch.nn.Sequential(torch.nn.Linear(n, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.enc(x))


@pytest.fixture
def pending():
    """A pending lazy graph (loss) of a small model, and its summary."""
    xlanb.set_mode("lazy")
    n = fresh()
    net = Net(n).to("xla")
    xlanb.sync()
    x = torch.randn(4, n).to("xla")
    with torch.no_grad():  # no saved activations: loss is the only live pending tensor
        loss = net(x).pow(2).mean()
    return loss, xlanb.pending_summary(loss)


def positions(s: GraphSummary, name: str) -> list[int]:
    return [len(s.inputs) + j for j, o in enumerate(s.ops) if o.name == name]


# --------------------------------------------------------------------------- GraphView

@needs_dot
def test_graphview_draws_the_pending_graph_with_tooltips(pending):
    loss, s = pending
    before = (counter("UncachedCompile"), counter("CachedCompile"), xlanb.pending_count(loss))
    gv = xw.GraphView([loss], readable=1000)  # small enough to open with every scope open
    assert gv.source.value == "pending" and gv.graph.compiled is None
    assert gv.scope_depth is None and gv.depth.value == gv.depth.max == 3  # Net.enc.0
    drawn = nodes(gv.svg)
    for p in range(len(s.inputs) + len(s.ops)):
        assert f"n{p}" in drawn, p
    relu = positions(s, "aten::relu")[0]
    tip = re.search(r'xlink:title="([^"]*)"', drawn[f"n{relu}"])[1]
    assert f"%{relu} aten::relu" in tip and "dtype f32" in tip and "shape [4, 16]" in tip
    assert "test_widgets.py:" in tip and "module: Net.enc.1" in tip
    # looking never compiles, runs or cuts the pending graph
    assert (counter("UncachedCompile"), counter("CachedCompile"),
            xlanb.pending_count(loss)) == before


@needs_dot
def test_search_highlights_the_matches(pending):
    loss, s = pending
    gv = xw.GraphView([loss], readable=1000)
    gv.search.value = "relu"
    relus = positions(s, "aten::relu")
    assert gv.matches == relus and len(relus) == 2
    drawn = nodes(gv.svg)
    for p in relus:
        assert filled(drawn[f"n{p}"], xw.HIGHLIGHT)
    others = [k for k in drawn if k not in {f"n{p}" for p in relus}]
    assert others and not any(filled(drawn[k], xw.HIGHLIGHT) for k in others)
    assert "2 matches" in gv.info.value
    # a source line finds the ops recorded there; a bad regex is searched literally
    line = s.ops[relus[0] - len(s.inputs)].src.short.split()[0]  # test_widgets.py:NN
    gv.search.value = line
    assert set(relus) <= set(gv.matches)
    gv.search.value = "aten::relu("
    assert gv.matches == []
    gv.search.value = "module.enc.1|Net.enc.1"
    assert relus[0] in gv.matches


@needs_dot
def test_only_matches_draws_the_matches_and_their_neighbours(pending):
    loss, s = pending
    gv = xw.GraphView([loss], readable=1000)
    gv.search.value = "aten::relu"
    gv.only_matches.value = True
    drawn = set(nodes(gv.svg))
    want = {f"n{p}" for p in xw.neighbourhood(s, gv.matches)}
    assert drawn == want
    assert len(drawn) < len(s.inputs) + len(s.ops)


@needs_dot
def test_depth_change_collapses_scopes(pending):
    loss, s = pending
    gv = xw.GraphView([loss], readable=1000)
    gv.search.value = "relu"
    gv.depth.value = 2  # Net.enc.0 .. Net.enc.3 collapse into one Net.enc box
    assert gv.scope_depth == 2
    drawn = nodes(gv.svg)
    assert "s_Net_enc" in drawn
    n_enc = sum(1 for o in s.ops if o.scope.startswith("Net.enc."))
    assert f"{n_enc} ops" in drawn["s_Net_enc"]
    assert filled(drawn["s_Net_enc"], xw.HIGHLIGHT)      # it holds the matches
    for p in positions(s, "aten::relu"):
        assert f"n{p}" not in drawn  # inside the box
    head = [len(s.inputs) + j for j, o in enumerate(s.ops) if o.scope == "Net.head"]
    assert head and all(f"n{p}" in drawn and not filled(drawn[f"n{p}"], xw.HIGHLIGHT)
                        for p in head)  # Net.head is 2 levels deep: still open
    assert "relu ×2" in drawn["s_Net_enc"]  # the box's tooltip lists what it holds
    gv.depth.value = 1
    assert {k for k in nodes(gv.svg) if k.startswith("s_")} == {"s_Net"}
    gv.depth.value = 0
    assert set(k for k in nodes(gv.svg) if k.startswith("s_")) == {"s__top_"}
    gv.depth.value = gv.depth.max
    assert not any(k.startswith("s_") for k in nodes(gv.svg))


@needs_dot
def test_a_large_graph_opens_collapsed():
    xlanb.set_mode("lazy")
    n = fresh()
    blocks = [torch.nn.Sequential(torch.nn.Linear(n, n), torch.nn.Tanh()) for _ in range(12)]
    model = torch.nn.Sequential(*blocks).to("xla")
    xlanb.sync()
    out = model(torch.randn(2, n).to("xla"))
    s = xlanb.pending_summary(out)
    assert xw.drawn_nodes(s, None) > xw.READABLE_NODES
    gv = xw.GraphView(out)
    assert gv.scope_depth is not None and gv.depth.value < gv.depth.max
    drawn = nodes(gv.svg)
    assert len(drawn) <= xw.READABLE_NODES
    assert any(k.startswith("s_") for k in drawn)
    assert "collapsed" in gv.info.value


@needs_dot
def test_a_huge_unscoped_graph_shows_the_nodes_near_the_outputs():
    xlanb.set_mode("lazy")
    x = torch.randn(3, fresh()).to("xla")
    y = x
    for _ in range(xw.MAX_DRAWN_NODES + 20):  # no modules: nothing to collapse
        y = y * 1.01 + 0.5
    gv = xw.GraphView(y)
    assert gv.depth.disabled
    assert "too many to draw" in gv.info.value
    drawn = nodes(gv.svg)
    assert 0 < len(drawn) <= xw.READABLE_NODES + 1
    root = xlanb.pending_summary(y).outputs[0]
    assert f"n{root}" in drawn


@needs_dot
def test_tabs_show_ir_stablehlo_hlo_and_cost(pending):
    loss, s = pending
    gv = xw.GraphView([loss])
    gv.search.value = "relu"
    gv.show_tab("IR text")
    assert "aten::addmm" in gv.ir_html.value
    assert re.search(r"background:#f5b041'>%\d+ = f32\[4,16\] aten::relu", gv.ir_html.value)
    compiles = counter("UncachedCompile")
    gv.show_tab("StableHLO")
    assert "stablehlo." in gv.stablehlo_html.value
    gv.show_tab("Optimized HLO")
    assert "not compiled yet" in gv.hlo_html.value
    gv.show_tab("Cost & memory")
    assert "Ops by kind" in gv.cost_html.value
    assert counter("UncachedCompile") == compiles  # reading never compiled

    gv.compile_button.click()  # compile now; the next sync reuses the executable
    assert counter("UncachedCompile") == compiles + 1
    assert "HloModule" in gv.hlo_html.value
    assert "flops" in gv.cost_html.value and "Device memory" in gv.cost_html.value
    hits = counter("CachedCompile")
    xlanb.sync()
    assert counter("UncachedCompile") == compiles + 1 and counter("CachedCompile") == hits + 1


@needs_dot
def test_switching_to_a_compiled_graph(pending):
    loss, s = pending
    xlanb.sync()
    index = len(xlanb.graphs()) - 1
    g = xlanb.graphs()[index]
    gv = xw.GraphView([loss])  # nothing pending for loss any more
    assert "no ops" in gv.info.value
    gv.source.value = index
    assert gv.graph.compiled is g and f"graph #{index}" in gv.info.value
    assert set(nodes(gv.svg)) >= {f"n{p}" for p in g.summary.outputs}
    gv.show_tab("Optimized HLO")
    assert "HloModule" in gv.hlo_html.value
    gv.show_tab("Cost & memory")
    assert "flops" in gv.cost_html.value
    # opened directly, by index or object
    assert xw.GraphView(graph=-1).graph.compiled is xlanb.graphs()[-1]
    assert xw.GraphView(graph=g).source.value == index
    with pytest.raises(IndexError):
        xw.GraphView(graph=10_000)


def test_graphview_rejects_cpu_tensors():
    with pytest.raises(TypeError, match="xla tensors"):
        xw.GraphView(torch.ones(2))


def test_without_dot_the_graph_tab_explains_and_shows_text(pending, monkeypatch):
    def no_dot(_):
        raise RuntimeError("Graphviz's `dot` is not installed: apt-get install graphviz")
    monkeypatch.setattr(xlanb, "render_svg", no_dot)
    loss, s = pending
    gv = xw.GraphView([loss])
    assert gv.svg == ""
    assert "apt-get install graphviz" in gv.graph_html.value
    assert "aten::addmm" in gv.graph_html.value  # the IR as text instead
    assert "aten::addmm" in gv.snapshot().html


@needs_dot
def test_snapshot_is_static_html_with_the_svg(pending):
    loss, s = pending
    gv = xw.GraphView([loss])
    gv.search.value = "relu"
    html = gv.snapshot()._repr_html_()
    assert "<svg" in html and "<?xml" not in html
    assert "find 'relu'" in unescape(html)
    assert xw.HIGHLIGHT in html


# --------------------------------------------------------------------------- GraphDiff

def _two_graphs_from_one_line():
    """Two compiled graphs synced from the same line whose cat output grows."""
    xlanb.set_mode("lazy")
    n = fresh()
    w = torch.randn(n, 3).to("xla")
    acc = torch.zeros(2, 3).to("xla")
    xlanb.sync()
    start = len(xlanb.graphs())
    # whole graphs: every test makes these ops at other sizes, and from their third
    # sizes on xlanb would cut them into segments (graph/segments.py)
    segments, xlanb.config.segments = xlanb.config.segments, False
    try:
        for _ in range(2):
            acc = torch.cat((acc, (torch.ones(2, n, device="xla") @ w).relu()))
            xlanb.sync()
    finally:
        xlanb.config.segments = segments
    gs = xlanb.graphs()
    assert len(gs) == start + 2
    return gs[start], gs[start + 1]


@needs_dot
def test_graphdiff_highlights_the_changed_node():
    a, b = _two_graphs_from_one_line()
    gd = xw.GraphDiff(a, b)
    (cat,) = positions(b.summary, "aten::cat")
    (acc,) = [i for i, (x, y) in enumerate(zip(a.summary.inputs, b.summary.inputs)) if x != y]
    assert gd.diff.b[acc] == "changed" and gd.diff.b[cat] == "follows"
    # nothing else differs: the matmul and relu are the same in both graphs
    assert set(gd.diff.b) == {acc, cat}
    right, left = nodes(gd.right_svg), nodes(gd.left_svg)
    assert filled(right[f"n{acc}"], xw.CHANGED) and filled(left[f"n{acc}"], xw.CHANGED)
    assert filled(right[f"n{cat}"], xw.FOLLOWS)
    for p in positions(b.summary, "aten::relu") + positions(b.summary, "aten::mm"):
        assert f"n{p}" in right and not filled(right[f"n{p}"], xw.CHANGED)
    assert "f32[2,3] -&gt; f32[4,3]" in gd.info.value
    assert "why it recompiled" in gd.info.value and "aten::cat" in gd.info.value
    html = gd.snapshot().html
    assert html.count("<svg") == 2


@needs_dot
def test_graphdiff_defaults_to_the_last_recompile():
    a, b = _two_graphs_from_one_line()
    gd = xw.GraphDiff()
    assert gd.b_graph is b and gd.a_graph is a
    idx = len(xlanb.graphs()) - 1
    assert xw.GraphDiff(idx - 1, idx).b_graph is b
    with pytest.raises(TypeError):
        xw.GraphDiff(a)


@needs_dot
def test_graphdiff_only_changes_and_depth(pending):
    a, b = _two_graphs_from_one_line()
    gd = xw.GraphDiff(a, b)
    gd.only_changes.value = True
    drawn = set(nodes(gd.right_svg))
    assert drawn == {f"n{p}" for p in xw.neighbourhood(b.summary, gd.diff.b)}


def _op(name, aval, ins, src=SourceLoc("m.py", 1, "f"), scope="", static=None):
    call = ", ".join(f"%{q}" for q in ins)
    return OpRecord(name, aval, call, src, scope, tuple(ins),
                    call if static is None else static)


def test_diff_summaries_marks_added_removed_and_changed_ops():
    a = GraphSummary(("f32[4]",), (_op("aten::sin", "f32[4]", [0]),
                                   _op("aten::cos", "f32[4]", [1]),
                                   _op("aten::sum", "f32[]", [2])), (3,))
    b = GraphSummary(("f32[4]",), (_op("aten::sin", "f32[4]", [0]),
                                   _op("aten::exp", "f32[4]", [1]),
                                   _op("aten::cos", "f32[4]", [2]),
                                   _op("aten::sum", "f32[]", [3], static="%3, dim=0")), (4,))
    d = xw.diff_summaries(a, b)
    assert d.b == {2: "added", 3: "follows", 4: "changed"}
    assert d.a == {2: "follows", 3: "changed"}
    assert any("only in the new graph" in line and "aten::exp" in line for line in d.lines)
    assert any("arguments" in line and "dim=0" in line for line in d.lines)
    same = xw.diff_summaries(a, a)
    assert same.a == same.b == {} and same.lines == []


def test_diff_ignores_renumbering():
    """One extra input shifts every position; ops whose arguments only moved are not
    differences."""
    a = GraphSummary(("f32[4]",), (_op("aten::sin", "f32[4]", [0]),), (1,))
    b = GraphSummary(("s64[2]", "f32[4]"), (_op("aten::sin", "f32[4]", [1]),), (2,))
    d = xw.diff_summaries(a, b)
    assert d.b == {0: "added"} and d.a == {}


# --------------------------------------------------------------------------- dashboard

def _some_work():
    xlanb.set_mode("lazy")
    x = torch.randn(3, fresh()).to("xla")
    (x * 2).sum().item()
    xlanb.sync()


def test_metrics_dashboard_shows_counts_and_charts():
    dash = xw.MetricsDashboard(auto=False)
    assert "no syncs yet" in dash.charts.value
    _some_work()
    dash.refresh_button.click()
    compiles = counter("UncachedCompile")
    assert compiles >= 1
    assert f">{compiles}</div>" in dash.cards.value
    assert "graph compiles" in dash.cards.value and "cache hit rate" in dash.cards.value
    assert dash.charts.value.count("<svg") >= 4
    assert "Where the time went" in dash.charts.value
    assert "Slowest graph compiles" in dash.charts.value
    assert xw.C_COMPILE in dash.charts.value
    dash.zero_button.click()  # counts from now on; xlanb's metrics are kept
    assert counter("UncachedCompile") == compiles
    assert "<div style='font-size:22px; font-weight:bold; color:#222'>0</div>" in dash.cards.value
    assert "Slowest" not in dash.charts.value
    assert "<svg" in dash.snapshot()._repr_html_()
    dash.close()


def _compile_threads_idle(timeout: float = 120.0) -> None:
    """Wait until no compile runs or waits on xlanb's compile threads."""
    from xlanb.runtime import jit
    end = time.monotonic() + timeout
    while jit.compiles_pending() and time.monotonic() < end:
        time.sleep(0.02)


def test_metrics_dashboard_refreshes_after_each_cell():
    IPython = pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    dash = xw.MetricsDashboard(shell=ip)
    try:
        assert dash._post_run_cell in ip.events.callbacks["post_run_cell"]
        n = fresh()
        _compile_threads_idle()  # an earlier test's tier-up must not land in these cells
        ip.run_cell(f"import torch, xlanb\nxlanb.set_mode('lazy')\n"
                    f"_t = torch.ones(2, {n}).to('xla') * 3\nxlanb.sync()", store_history=True)
        _compile_threads_idle()  # (a quick compile of 0.5 s, loaded, tiers up at once)
        ip.run_cell("1 + 1", store_history=True)  # no xla work: no column
        assert len(dash._history) == 1
        cell = dash._history[0]
        assert re.fullmatch(r"In\[\d+\]", cell.label)
        assert cell.data["counters"].get("UncachedCompile") == 1
        assert cell.label in dash.charts.value and "1c" in dash.charts.value
    finally:
        dash.close()
        xlanb.set_mode("lazy")
    assert dash._post_run_cell not in ip.events.callbacks["post_run_cell"]


# --------------------------------------------------------------------------- charts, layering

def test_charts_are_plain_svg():
    svg = xw.bar_chart_svg([("compile", 2.0, "#f00", "2 s"), ("run", 0.5, "#00f", "0.5 s")],
                           "Where the time went")
    assert svg.startswith("<svg") and svg.count("<rect") == 4 and "Where the time went" in svg
    svg = xw.stacked_bar_svg([("hits", 3, "#0f0"), ("misses", 1, "#f00")], "cache")
    assert "75%" in svg and "25%" in svg
    svg = xw.column_chart_svg([("In[1]", [(1.0, "#f00"), (0.5, "#00f")], "1c", "hover")],
                              [("compile", "#f00")], "per cell")
    assert "In[1]" in svg and "<title>hover</title>" in svg


def test_the_core_never_imports_ipywidgets(python_child):
    out = python_child("import sys, torch, xlanb\n"
                       "x = torch.ones(2).to('xla') + 1; xlanb.sync(); xlanb.pending_ir()\n"
                       "print('before', 'ipywidgets' in sys.modules)\n"
                       "xlanb.widgets.GraphView\n"
                       "print('after', 'ipywidgets' in sys.modules)\n")
    assert "before False" in out and "after True" in out
