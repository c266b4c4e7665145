"""``xlanb.reset()`` forgets every cache and record (each registered beside its owner,
base/caches.py), as a new process would, and loses no tensor's value."""
from __future__ import annotations

import torch

import xlanb
from xlanb.dispatch import dispatcher as dispatch
from xlanb.pending import live
from xlanb.base import caches
from xlanb.execute import graphs
from xlanb.ops.infos import infos


def test_reset_forgets_compiles_and_keeps_values(count):
    a = torch.arange(12.0).reshape(3, 4)
    x = a.to("xla")
    y = (x * 2).sin()          # pending
    xlanb.sync()
    z = y + 1                  # pending again: reset must sync it, not drop it
    assert xlanb.graphs() and infos and dispatch.plans
    filled = {what for what, n in caches.registered() if n}
    assert {"op signature -> OpSignature", "(device, structural key) -> CompiledGraph",
            "(shape, stride, dtype, device) -> SigKey",
            "weakrefs of pending storages, in write order"} <= filled
    xlanb.reset()
    assert list(xlanb.graphs()) == []
    assert [(what, n) for what, n in caches.registered() if n] == []
    assert xlanb.metrics.counter_value("UncachedCompile") is None  # metrics cleared too
    torch.testing.assert_close(z.cpu(), (a * 2).sin() + 1)
    # the same program compiles again, as in a new process (from the store on disk, if on)
    w = (x * 2).sin()
    xlanb.sync()
    assert count("UncachedCompile") == 1
    torch.testing.assert_close(w.cpu(), (a * 2).sin())


def test_reset_returns_to_the_starting_mode():
    start = xlanb.get_mode()
    other = "opbyop" if start != "opbyop" else "lazy"
    xlanb.set_mode(other)
    t = torch.ones(3, device="xla") * 4
    xlanb.reset()
    assert xlanb.get_mode() == start
    assert t.cpu().tolist() == [4.0, 4.0, 4.0]


def test_reset_empties_the_containers_modules_hold():
    """Modules hold their caches as globals (the hot path reads module globals); a reset
    empties them in place, so those references stay the registered ones."""
    before = (dispatch._infos, live._live, graphs.graph_cache)
    xlanb.reset()
    assert (dispatch._infos, live._live, graphs.graph_cache) == before
    registered = [c.container for c in caches._caches]
    assert all(any(x is c for c in registered) for x in before)


def test_compiled_caches_are_marked():
    """What a lowering setting (the mat-mul precision) must forget: compiled code, and
    nothing a tensor's value depends on."""
    marked = {c.what for c in caches._caches if c.compiled}
    assert "op signature -> OpSignature" in marked and "(device, structural key) -> CompiledGraph" in marked
    assert "weakrefs of pending storages, in write order" not in marked


def test_clear_graph_cache_forgets_the_graphs_group_only():
    """``clear_graph_cache`` empties what is registered in the "graphs" group (compiled
    graphs, their log, the loaded set, recompile statistics) through the registry, and
    leaves other caches (op signatures) as they were."""
    x = torch.arange(6.0).to("xla")
    (x * 3).cos().cpu()
    xlanb.sync()
    group = [c for c in caches._caches if c.group == "graphs"]
    assert {"(device, structural key) -> CompiledGraph", "every CompiledGraph, in compile order",
            "id -> CompiledGraph whose executable is loaded"} <= {c.what for c in group}
    assert graphs.graph_cache and graphs.graph_log and infos
    n_infos = len(infos)
    graphs.clear_graph_cache()
    assert all(len(c.container) == 0 for c in group)
    assert len(infos) == n_infos
    assert list(xlanb.graphs()) == []
