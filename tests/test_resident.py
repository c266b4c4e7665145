"""Issue 26: a long session must not run the process out of memory mappings.

Every XLA:CPU executable keeps its code in memory mappings of its own, and Linux caps a
process at vm.max_map_count of them; past it XLA crashed the process (SIGSEGV, first
seen inside serialize_executable on a compile thread after ~4,000 PyTorch tests). These
tests pin the fix: the loaded single-op executables are bounded and really freed, hot
ones stay loaded, dropped ones come back from the store, and near the limit xlanb raises
ExecutableLimitError with nothing lost instead of compiling.
"""
from __future__ import annotations

import pytest
import torch

import xlanb
from xlanb import metrics
from xlanb.executables import background, resident
from xlanb.runtime import maps


@pytest.fixture
def small_cap(monkeypatch):
    # single-op executables are the subject: eager runs off, each new op compiles alone
    monkeypatch.setattr(xlanb.config, "eager_runs", 0)
    old = xlanb.config.max_executables
    xlanb.config.max_executables = 24
    yield 24
    xlanb.config.max_executables = old


def _distinct_ops(start: int, stop: int, dtype=torch.float32):
    """One new signature per size (sin, then a multiply), checked against CPU torch."""
    for n in range(start, stop):
        x = torch.arange(n, dtype=dtype) / 7
        got = (x.to("xla").sin() * 3).cpu()
        torch.testing.assert_close(got, x.sin() * 3)


def test_loaded_executables_stay_under_the_cap_and_are_freed(small_cap):
    xlanb.set_mode("eager")
    _distinct_ops(1, 8)  # warm up the transfer paths before counting mappings
    before = maps.count()
    _distinct_ops(8, 160)  # ~300 new single-op executables
    assert len(resident.resident) <= small_cap
    assert metrics.counter_value("OpExecutableEvicted") > 200
    # Dropped executables release their code mappings (~3 each). Without the bound, or
    # with a reference left behind (finished compile Futures held them), this grew by
    # about 900.
    assert maps.count() - before < 400


def test_dropped_executables_come_back_from_the_store(small_cap):
    xlanb.set_mode("eager")
    _distinct_ops(300, 340)
    assert metrics.counter_value("OpExecutableEvicted")
    metrics.clear()
    _distinct_ops(300, 310)  # evicted long ago: loaded again, not compiled
    assert metrics.counter_value("PersistentCacheHit") >= 10
    assert not metrics.counter_value("UncachedCompile")


def test_hot_executables_survive_a_churn_of_new_ones(small_cap):
    xlanb.set_mode("eager")
    w = torch.randn(7, 13).to("xla")
    x = torch.randn(7).to("xla")
    before = set(resident.resident)
    hot = (x @ w).tanh()
    hot.cpu()
    hot_infos = [info for uid, info in resident.resident.items() if uid not in before]
    assert len(hot_infos) >= 2  # the matmul and the tanh
    for n in range(400, 470):
        (x @ w).tanh()  # the hot ops run between every new one
        _distinct_ops(n, n + 1)
    still = [info for info in hot_infos if info.exe is not None]
    assert len(still) == len(hot_infos), [i.name for i in hot_infos if i.exe is None]


def test_near_the_mapping_limit_compiling_raises_and_loses_nothing(monkeypatch, mode):
    xlanb.set_mode(mode)
    a = torch.arange(6.0).to("xla") * 2
    pending = a + 1  # lazy/opbyop: pending work that must survive the refusal
    n = 11 + xlanb.MODES.index(mode)  # a signature no other mode compiled
    # 95% of the limit, and still 95% after xlanb drops what it can (dropping frees real
    # mappings, which would otherwise decide whether this refuses)
    monkeypatch.setattr(resident.maps, "limit", lambda: 100_000)
    monkeypatch.setattr(resident.maps, "count", lambda: 95_000)
    resident.recheck()
    try:
        with pytest.raises(xlanb.ExecutableLimitError, match="vm.max_map_count"):
            (torch.arange(float(n)).to("xla").cos() * 5).cpu()  # new signatures: refused
        assert isinstance(xlanb.ExecutableLimitError("x"), MemoryError)
    finally:
        monkeypatch.undo()
        resident.recheck()
    assert pending.cpu().tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    assert (torch.arange(float(n)).to("xla").cos() * 5).cpu().allclose(torch.arange(float(n)).cos() * 5)


def test_reset_drops_every_loaded_executable():
    xlanb.set_mode("eager")
    _distinct_ops(500, 505)
    assert resident.resident
    xlanb.reset()
    assert not resident.resident and not background._in_flight


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_sums_match_cpu(mode, dtype):
    # found by benchmarks/soak.py: complex inputs of sum/prod were cast to int64 (zeros)
    x = torch.randn(3, 4, dtype=dtype)
    d = x.to("xla")
    torch.testing.assert_close(d.sum().cpu(), x.sum())
    torch.testing.assert_close(d.sum(0).cpu(), x.sum(0))
    torch.testing.assert_close(d.prod(1).cpu(), x.prod(1))


@pytest.fixture
def few_graphs(monkeypatch):
    monkeypatch.setattr(xlanb.config, "max_graphs", 3)
    return 3


def _distinct_graphs(start: int, stop: int):
    """One new lazy graph per size, each synced and checked against CPU torch."""
    for n in range(start, stop):
        x = torch.arange(n, dtype=torch.float32) / 5
        y = (x.to("xla").cos() + 2) * x.to("xla")
        xlanb.sync()
        torch.testing.assert_close(y.cpu(), (x.cos() + 2) * x)


@pytest.mark.parametrize("store", [True, False])
def test_graph_executables_are_bounded_and_come_back_when_needed(few_graphs, store, monkeypatch):
    """Lazy syncs of many distinct graphs (PyTorch's tests with a sync after each op)
    keep the last few used loaded; a dropped graph stays listed, runs again from the
    store (or compiles again with the store off) and still shows its HLO."""
    if not store:
        monkeypatch.setattr(xlanb.config, "store_dir", None)
    xlanb.set_mode("lazy")
    first = len(xlanb.graphs())
    base = 600 if store else 700  # signatures no other test compiles
    _distinct_graphs(base, base + 10)
    assert len(resident.resident_graphs) <= few_graphs
    assert metrics.counter_value("GraphExecutableEvicted") >= 7
    recs = xlanb.graphs()[first:]
    assert len(recs) == 10 and recs[0]._exe is None  # listed, executable dropped
    metrics.clear()
    _distinct_graphs(base, base + 1)  # the first graph again: reloaded, not a new graph
    assert metrics.counter_value("GraphReload") == 1
    assert not metrics.counter_value("UncachedCompile")
    assert metrics.counter_value("CachedCompile") == 1
    if store:
        assert metrics.counter_value("PersistentCacheHit") >= 1
    else:
        assert metrics.metric_data("CompileTime").count == 1  # compiled again
    dropped = next(r for r in recs if r._exe is None)
    assert "cosine" in dropped.hlo(optimized=True)  # inspection loads it back too
    assert dropped.memory is not None
    assert len(xlanb.graphs()) == first + 10


def test_dropped_graph_executables_are_freed(few_graphs, monkeypatch):
    """A dropped graph's executable leaves the process with its code mappings. Records
    that kept the graph's JAX function kept it loaded in JAX's own caches (keyed by the
    function, its jaxpr and its module): ~4 mappings per graph, for up to 2,048 graphs."""
    monkeypatch.setattr(xlanb.config, "store_dir", None)
    xlanb.set_mode("lazy")
    _distinct_graphs(800, 806)  # warm up
    before = maps.count()
    _distinct_graphs(806, 866)  # 60 new graphs, 3 kept loaded
    assert len(resident.resident_graphs) <= few_graphs
    assert maps.count() - before < 100
