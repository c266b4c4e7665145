"""What the front ends say agrees with what happens (issue 38): eager mode's
waiting ops, one time format, one location format, one set of column names, metric
descriptions, mesh axis names."""
from __future__ import annotations

import pytest
import torch

import xlanb
from xlanb.extensions import display as xd


def test_eager_pending_ops_are_said_to_be_an_open_run():
    prev = xlanb.get_mode()
    xlanb.set_mode("eager")
    try:
        head = xd.PendingGraph("...", 27).text().splitlines()[0]
        assert "27 ops in an open run" in head, head
        x = torch.ones(53, device="xla")
        y = (x * 3).exp()  # new ops: the run is open
        n = xlanb.pending_count()
        assert n >= 2
        assert xlanb.switch_mode("lazy") == n  # what the switch synced, as the front ends say
        assert xlanb.switch_mode("lazy") == 0 and xlanb.set_mode("lazy") is None
        torch.testing.assert_close(y.cpu(), torch.full((53,), 3.0).exp())
    finally:
        xlanb.set_mode(prev)


def test_eager_pending_ops_are_said_to_wait_for_background_compiles(monkeypatch):
    monkeypatch.setattr(xlanb.config, "eager_runs", 0)
    prev = xlanb.get_mode()
    xlanb.set_mode("eager")
    try:
        head = xd.PendingGraph("...", 27).text().splitlines()[0]
        assert "27 ops waiting for executables still compiling in the background" in head, head
        line = xd.SyncSummary(xd.Activity(), 27, "eager").lines()[0]
        assert "27 ops that waited for background compiles ran" in line, line
        assert "one by one" not in line
    finally:
        xlanb.set_mode(prev)
    # lazy and opbyop keep their words: pending ops there are a recorded graph
    assert "run one by one" in xd.SyncSummary(xd.Activity(), 3, "opbyop").lines()[0]


def test_one_duration_format_everywhere():
    """``218 ms`` in the magics' summaries, the graph table, the TPU report: one format."""
    for secs, text in ((0.218, "218 ms"), (2.134, "2.13 s"), (0.00031, "310 µs"),
                       (250.0, "250 s"), (0.0, "0 s"), (3.12e-9, "3.12 ns")):
        assert xlanb.format_duration(secs) == text
    compile_col = next(c for c in xlanb.graph_columns([]) if c.header == "compile")
    run_col = next(c for c in xlanb.graph_columns([]) if c.header == "run")

    class G:
        compile_time, run_time = 0.218, 0.0021
    assert compile_col.get(G()) == "218 ms" and run_col.get(G()) == "2.1 ms"


def test_one_location_format_for_cells():
    """A cell's line reads ``In[7]:4 forward`` in every message (the core's labeler, set
    by the extension) and every table, graph and widget (the front end's resolver)."""
    from IPython.core.interactiveshell import InteractiveShell
    from support import loaded_shell
    loc = xlanb.SourceLoc("/tmp/ipykernel_1/123.py", 4, "forward")
    r = xd.SourceResolver()
    shell = InteractiveShell.instance()
    loaded = loaded_shell(shell, "terminal")
    next(loaded)  # %load_ext xlanb: its labeler names the shell's cells
    try:
        shell.compile._filename_map["/tmp/ipykernel_1/123.py"] = 7
        assert loc.short == r.label(loc) == xlanb.format_cell_loc(7, 4, "forward") == "In[7]:4 forward"
        assert r.label_text("/tmp/ipykernel_1/123.py:4") == "In[7]:4"
    finally:
        shell.compile._filename_map.pop("/tmp/ipykernel_1/123.py", None)
        next(loaded, None)  # unloaded: files are named by their path again
    assert r.label(loc) == "123.py:4 forward"


def _recorded_names() -> set[str]:
    """Every counter and metric name xlanb's sources record."""
    import pathlib
    import re
    root = pathlib.Path(xlanb.__file__).parent
    pat = re.compile(r"""(?:metrics\.(?:counter|record|timer)\(\s*|metric=|lower_metric=|"""
                     r"""\.lower\()"([A-Z]\w+)\"""")
    return {m for p in root.rglob("*.py") for m in pat.findall(p.read_text())}


def test_every_metric_has_a_description():
    names = _recorded_names()
    assert {"OpQuickCompile", "OpTierUp", "UncachedCompile", "LowerTime"} <= names
    missing = sorted(n for n in names if not xlanb.metrics.describe(n))
    assert not missing, f"metrics without a description: {missing}"
    for n in names:  # %xla_metrics --all shows each with its description
        if n.endswith("Time"):
            xlanb.metrics.record(n, 0.001)
        else:
            xlanb.metrics.counter(n, 0)
    rows = xd.MetricsTable(show_all=True).rows
    assert rows and all(r[-1] for r in rows), [r[0] for r in rows if not r[-1]]


def test_replica_groups_use_the_mesh_axis_names():
    """XLA adds an axis of size 1 to a (data=2, model=4) mesh; the groups still read in
    the user's names, not ``mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_0'}``."""
    from xlanb.graph.collectives import _named_axes
    axes = {"data": 2, "model": 4}
    assert _named_axes("mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_0'}", axes) == \
        "mesh['data'=2,'model'=4] {'data'}"
    assert _named_axes("mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}", axes) == \
        "mesh['data'=2,'model'=4] {'data','model'}"
    # another mesh than the graph's: XLA's own words stay
    assert _named_axes("mesh['axis_0'=8] {'axis_0'}", axes) == "mesh['axis_0'=8] {'axis_0'}"


def test_small_formats_have_one_home():
    """The TPU report, the display and the graph table share these (issue 44): one
    verdict, one percent, one shown hash, one location."""
    assert [xlanb.format_pct(e, b) for e, b in ((0, 8), (1, 8), (100, 8), (3, 0))] == \
        ["0%", "+12.5%", "x14", "-"]
    assert [xlanb.format_fits(f) for f in (True, False, None)] == ["fits", "DOES NOT FIT", "?"]
    assert [xlanb.format_fits(f, column=True) for f in (True, False, None)] == ["yes", "NO", "?"]
    h = "0123456789abcdef0123"
    assert xlanb.format_hash(h) == h[:12]
    assert xlanb.format_location("m.py", 3, "f") == "m.py:3 f"
    assert xlanb.format_location("m.py", 3) == "m.py:3"
    assert xlanb.format_cell_loc(5, 3) == "In[5]:3"
    loc = xlanb.SourceLoc("/tmp/model.py", 42, "forward")
    assert loc.where == "/tmp/model.py:42" and loc.short == "model.py:42 forward"
    html = xlanb.format_table_html(["op", "bytes"], [["<add>", "12"]], right=[1])
    assert "&lt;add&gt;" in html and "<td style='text-align:right'>12</td>" in html
    from xlanb.base.formats import parse_bytes
    assert parse_bytes("1.5K") == 1536 and parse_bytes("2GiB") == 2 << 30
    with pytest.raises(ValueError):
        parse_bytes("0")
