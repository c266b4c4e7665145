"""Device memory (issue 25): the torch-style figures, memory by source line, each graph's
memory analysis, the limit checked before a graph (or eager op) runs, XLA's own
out-of-memory error, and the front ends (%xla_memory, pdb xmem, the dashboard panel)."""
from __future__ import annotations

import gc
import io
import os
import subprocess
import sys
import textwrap

import jax
import pytest
import torch

import xlanb

MiB = 1 << 20


def _line_of(marker: str) -> int:
    """The line of this file holding ``marker`` (a comment), for attribution checks."""
    with open(__file__) as f:
        for i, text in enumerate(f, 1):
            if marker in text and "_line_of" not in text:
                return i
    raise AssertionError(marker)


@pytest.fixture(autouse=True)
def _collected():
    gc.collect()  # tensors of earlier tests caught in cycles are not "live" here
    yield
    gc.collect()


def test_allocated_counts_exactly_the_live_tensors(mode):
    base = xlanb.memory_allocated()
    a = torch.ones(256, 1024, device="xla")                  # 1 MiB
    b = torch.zeros(128, 1024, dtype=torch.float64, device="xla")  # 1 MiB
    c = torch.arange(1000, device="xla", dtype=torch.int32)  # 4000 B
    xlanb.sync()
    assert xlanb.memory_allocated() - base == MiB + MiB + 4000
    # views share their base's storage: they add nothing, read or not
    v = a[3:7]
    w = b.view(-1)
    t = a.t()
    assert (v.sum() + t.sum()).item() == 4 * 1024 + 256 * 1024
    assert w.shape == (128 * 1024,)
    assert xlanb.memory_allocated() - base == 2 * MiB + 4000
    # pending tensors take nothing yet; computed, they do
    d = a * 2
    if mode != "eager":
        assert xlanb.memory_allocated() - base == 2 * MiB + 4000
        assert xlanb.memory_by_line().pending
    xlanb.sync()
    assert xlanb.memory_allocated() - base == 3 * MiB + 4000
    del a, v, t  # the view kept the storage alive; with both gone it is freed
    assert xlanb.memory_allocated() - base == 2 * MiB + 4000
    del b, w, c, d
    assert xlanb.memory_allocated() == base
    # every buffer xlanb holds is at least the tensors, and the peak at least that
    assert xlanb.memory_reserved() >= xlanb.memory_allocated()
    assert xlanb.max_memory_allocated() >= 3 * MiB


def test_memory_by_line_attributes_allocations_to_their_lines(mode):
    x = torch.randn(512, 512, device="xla")   # @line-x
    w = torch.randn(512, 256, device="xla")   # @line-w
    y = (x @ w).relu()                        # @line-y
    xlanb.sync()
    rows = {r.loc.line: r for r in xlanb.memory_by_line() if r.loc is not None
            and r.loc.file == __file__}
    assert rows[_line_of("@line-x")].bytes == 512 * 512 * 4
    assert rows[_line_of("@line-w")].bytes == 512 * 256 * 4
    assert rows[_line_of("@line-y")].bytes == 512 * 256 * 4
    assert rows[_line_of("@line-x")].count == 1
    assert "test_memory.py:" in rows[_line_of("@line-x")].source
    by_line = xlanb.memory_by_line()
    assert list(by_line) == sorted(by_line, key=lambda r: -r.bytes)
    assert f"test_memory.py:{_line_of('@line-y')}" in str(by_line)
    del x, w, y


def test_module_scope_and_pending_rows(mode):
    lin = torch.nn.Linear(256, 512).to("xla")
    h = lin(torch.ones(300, 256, device="xla"))  # @line-h
    if mode != "eager":
        pend = xlanb.memory_by_line().pending
        assert any(r.loc is not None and r.loc.line == _line_of("@line-h") and r.bytes == 300 * 512 * 4
                   for r in pend)
    xlanb.sync()
    rows = [r for r in xlanb.memory_by_line() if r.loc is not None
            and r.loc.line == _line_of("@line-h")]
    assert any(r.bytes == 300 * 512 * 4 for r in rows), rows
    # the weights were made by .to("xla") two lines up
    w_rows = [r for r in xlanb.memory_by_line() if r.loc is not None
              and r.loc.line == _line_of("@line-h") - 1]
    assert sum(r.bytes for r in w_rows) == (256 * 512 + 512) * 4
    del lin, h


def test_small_eager_results_skip_the_line_unless_asked():
    xlanb.set_mode("eager")
    background = xlanb.config.background_compile
    xlanb.config.background_compile = False  # an op recorded while compiling has its line
    try:
        a = torch.ones(8, device="xla")
        b = a + 1  # 32 bytes: below the threshold, no line
        rows = [r for r in xlanb.memory_by_line() if r.op == "aten::add" and r.loc is None]
        assert rows and "line not recorded" in rows[0].source
        xlanb.set_memory_line_bytes(0)
        c = a + 2  # @line-small
        assert any(r.loc is not None and r.loc.line == _line_of("@line-small")
                   for r in xlanb.memory_by_line())
    finally:
        xlanb.set_memory_line_bytes(256 << 10)
        xlanb.config.background_compile = background
    del a, b, c


def test_graph_memory_matches_xla_analysis(mode):
    a = torch.randn(128, 256, device="xla")
    b = torch.randn(256, 64, device="xla")
    xlanb.sync()
    f = xlanb.compile(lambda p, q: p @ q)  # a whole graph in every mode
    out = f(a, b)
    assert out.shape == (128, 64)
    g = xlanb.graphs()[-1]
    ma = g.executable.memory_analysis()
    m = g.memory
    assert (m.argument_bytes, m.output_bytes, m.alias_bytes, m.temp_bytes) == (
        ma.argument_size_in_bytes, ma.output_size_in_bytes, ma.alias_size_in_bytes,
        ma.temp_size_in_bytes)
    assert m.argument_bytes == (128 * 256 + 256 * 64) * 4
    assert m.output_bytes == 128 * 64 * 4
    assert m.peak_bytes == m.argument_bytes + m.output_bytes + m.temp_bytes - m.alias_bytes
    assert "peak mem" in str(xlanb.graphs())


def test_lazy_sync_graph_memory():
    xlanb.set_mode("lazy")
    a = torch.randn(64, 32, device="xla")
    xlanb.sync()
    c = (a @ a.t()).sum(0)
    xlanb.sync()
    g = xlanb.graphs()[-1]
    assert g.memory.argument_bytes == 64 * 32 * 4 and g.memory.output_bytes == 64 * 4
    del a, c


@pytest.mark.parametrize("how", ["context", "setting"])
def test_limit_raises_before_running_and_loses_nothing(mode, how):
    a = torch.randn(512, 512, device="xla")   # @lim-a
    b = torch.randn(512, 512, device="xla")
    xlanb.sync()
    a_cpu, b_cpu = a.cpu(), b.cpu()
    expected = (a_cpu @ b_cpu + 1).sum()
    live = xlanb.memory_reserved()
    limit = xlanb.memory_limit(live + 512 * 1024)  # room for less than one more 1 MiB result
    try:
        with pytest.raises(xlanb.DeviceMemoryError) as err:
            c = a @ b + 1          # @lim-c
            s = c.sum()
            xlanb.sync()
    finally:
        if how == "context":
            limit.__exit__(None, None, None)
        else:
            xlanb.memory_limit(None)
    e = err.value
    assert isinstance(e, torch.OutOfMemoryError)
    msg = str(e)
    assert f"limit {xlanb.format_bytes(live + 512 * 1024)}" in msg
    assert "projected peak" in msg and e.projected > e.limit
    assert f"test_memory.py:{_line_of('@lim-a')}" in msg  # a live tensor, by its line
    assert len(e.contributors) <= 5 and e.contributors[0].bytes >= e.contributors[-1].bytes
    assert xlanb.config.memory_limit is None
    if mode != "eager":
        # nothing ran: the work is still pending and gives the right answer now
        assert xlanb.pending_count() > 0
        assert torch.allclose(s.cpu(), expected, rtol=1e-4)
    else:
        # eager stopped before the op: earlier values are intact, the line runs again
        c = a @ b + 1
        assert torch.allclose(c.sum().cpu(), expected, rtol=1e-4)
    assert torch.equal(a.cpu(), a_cpu) and torch.equal(b.cpu(), b_cpu)


def test_limit_names_the_graphs_largest_temporaries():
    xlanb.set_mode("lazy")
    x = torch.randn(256, 256, device="xla")
    xlanb.sync()
    with xlanb.memory_limit(xlanb.memory_reserved() + 64 * 1024):
        y = torch.softmax(x @ x, dim=-1) @ x   # @tmp-y
        with pytest.raises(xlanb.DeviceMemoryError) as err:
            xlanb.sync()
    kinds = {c.kind for c in err.value.contributors}
    assert "live tensors" in kinds
    assert xlanb.pending_count() > 0
    assert torch.allclose(y.cpu(), torch.softmax(x.cpu() @ x.cpu(), -1) @ x.cpu(), atol=1e-4)


def test_limit_setting_forms():
    with xlanb.memory_limit("16GiB") as lim:
        assert xlanb.config.memory_limit == 16 << 30 == lim.bytes
        with xlanb.memory_limit("512 MiB"):
            assert xlanb.config.memory_limit == 512 << 20
        assert xlanb.config.memory_limit == 16 << 30
    assert xlanb.config.memory_limit is None
    with pytest.raises(ValueError):
        xlanb.memory_limit("lots")
    with pytest.raises(TypeError):
        xlanb.memory_limit(1.5)
    assert xlanb.config.memory_limit is None
    out = subprocess.run([sys.executable, "-c", "import xlanb; print(xlanb.config.memory_limit)"],
                         env=dict(os.environ, XLANB_MEMORY_LIMIT="2G"), capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == str(2 << 30), out.stderr


def test_a_real_xla_out_of_memory_is_the_same_error(mode):
    keep = torch.full((1000,), 3.0, device="xla")
    xlanb.sync()
    huge = None
    with pytest.raises(xlanb.DeviceMemoryError) as err:
        huge = torch.zeros(1 << 38, device="xla")  # 1 TiB: XLA:CPU cannot allocate it
        xlanb.sync()
    assert "ran out of device memory" in str(err.value)
    assert "RESOURCE_EXHAUSTED" in str(err.value.__cause__) or "RESOURCE_EXHAUSTED" in str(err.value)
    if mode != "eager":  # still pending: freeing it is the user's call
        assert huge is not None and xlanb.pending_count() > 0
    del huge
    assert keep.sum().item() == 3000.0


def test_timeline_samples_every_sync_and_reset_peak(mode):
    n0 = len(xlanb.memory_timeline())
    keep = []
    for i in range(3):
        keep.append(torch.ones(64, 1024, device="xla"))
        xlanb.sync()
    tl = xlanb.memory_timeline()
    assert len(tl) == n0 + 3
    b = tl.bytes()[-3:]
    assert b[1] - b[0] == b[2] - b[1] == 64 * 1024 * 4
    del keep
    xlanb.reset_peak_memory_stats()
    assert xlanb.max_memory_allocated() == max(xlanb.memory_reserved(), xlanb.memory_allocated())


def test_stats_and_summary():
    x = torch.ones(1000, device="xla")
    xlanb.sync()
    s = xlanb.memory_stats()
    assert s["allocated_bytes.current"] == xlanb.memory_allocated()
    assert s["device_bytes.current"] >= s["allocated_bytes.current"]
    assert s["limit_bytes"] is None
    text = xlanb.memory_summary()
    assert "live tensors (memory_allocated)" in text and "largest by line" in text
    assert "reports no allocator figures" in text  # XLA:CPU
    del x


def test_eager_views_copies_are_counted_apart():
    xlanb.set_mode("eager")
    base = xlanb.memory_stats()
    a = torch.ones(512, 512, device="xla")
    v = a[:256]  # eager runs the view: XLA keeps its own copy
    assert v.sum().item() == 256 * 512
    s = xlanb.memory_stats()
    assert s["allocated_bytes.current"] - base["allocated_bytes.current"] == 512 * 512 * 4
    assert s["view_copy_bytes.current"] - base["view_copy_bytes.current"] == 256 * 512 * 4
    del a, v


def test_magic_pdb_and_dashboard():
    IPython = pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    from xlanb.extensions.pdb import XlaPdb
    from xlanb.extensions.widgets import MetricsDashboard

    ip = InteractiveShell.instance()

    def shown(c) -> str:
        return c.stdout + "".join(str(o.data.get("text/plain", "")) for o in c.outputs)

    ip.run_line_magic("load_ext", "xlanb")
    try:
        ip.run_cell("import torch, xlanb\nmm_a = torch.ones(512, 512, device='xla')\n"
                    "mm_b = (mm_a @ mm_a).relu()\nxlanb.sync()")
        with capture_output() as c:
            ip.run_line_magic("xla_memory", "")
        assert "live tensors (memory_allocated)" in shown(c)
        with capture_output() as c:
            ip.run_line_magic("xla_memory", "--by-line")
        assert "In[" in shown(c) and "1.0 MiB" in shown(c)
        with capture_output() as c:
            ip.run_line_magic("xla_memory", "--graph -1")
        assert "peak" in shown(c) and "arguments" in shown(c)
        with capture_output() as c:
            ip.run_cell("%%xla_explain\nmm_c = mm_b * 2\nxlanb.sync()")
        assert "device memory" in shown(c) and "memory     peak" in shown(c)
        board = MetricsDashboard(auto=False)
        assert "device memory" in board.cards.value
        assert "Memory by line" in board.charts.value
        assert "Device memory after each sync" in board.charts.value
        board.close()
    finally:
        ip.run_line_magic("unload_ext", "xlanb")
        for k in ("mm_a", "mm_b", "mm_c"):
            ip.user_ns.pop(k, None)
    out = io.StringIO()
    dbg = XlaPdb(stdin=io.StringIO(), stdout=out)
    keep = torch.ones(300, 300, device="xla")  # @pdb-keep
    xlanb.sync()
    dbg.onecmd("xmem --by-line")
    assert f"test_memory.py:{_line_of('@pdb-keep')}" in out.getvalue()
    dbg.onecmd("xmem")
    assert "live tensors (memory_allocated)" in out.getvalue()
    dbg.onecmd("xmem --bogus")
    assert "usage: xmem" in out.getvalue()
    del keep


def test_timeline_plot_renders():
    pytest.importorskip("matplotlib")
    from xlanb.extensions.display import figure_png, memory_timeline_figure
    for _ in range(2):
        xlanb.sync()
    png = figure_png(memory_timeline_figure(xlanb.memory_timeline()))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_pending_memory_forecasts_without_running():
    xlanb.set_mode("lazy")
    a = torch.randn(256, 256, device="xla")
    xlanb.sync()
    b = (a @ a).relu()
    f = xlanb.pending_memory()
    assert f.graph.memory.output_bytes == 256 * 256 * 4
    assert f.projected == f.live + f.graph.memory.extra_bytes
    assert f.fits is None and f.fits_in("1GiB") and not f.fits_in(f.live)
    assert xlanb.pending_count() > 0  # nothing ran
    hits = xlanb.metrics.counter_value("CachedCompile") or 0
    xlanb.sync()  # the forecast's compile is the sync's
    assert (xlanb.metrics.counter_value("CachedCompile") or 0) == hits + 1
    assert torch.allclose(b.cpu(), (a.cpu() @ a.cpu()).relu(), atol=1e-3)
    assert xlanb.pending_memory() is None


def test_the_error_pickles():
    import pickle
    e = xlanb.DeviceMemoryError("over", device=0, limit=10, projected=20, live=5,
                                contributors=[])
    back = pickle.loads(pickle.dumps(e))
    assert isinstance(back, torch.OutOfMemoryError) and str(back) == "over"
    assert (back.limit, back.projected, back.live) == (10, 20, 5)
