"""Eager mode's runs: ops with no executable of their own are recorded until a value is
needed, and that run compiles as one graph, quickly (issue 47). Eager semantics stay:
values, errors with their op and line, NaNs found by op, pdb's looks, random numbers,
in-place updates on views, reads in the middle of a run."""
from __future__ import annotations

import io
import pdb
import sys

import pytest
import torch
import torch.nn.functional as F

import xlanb
from xlanb import config
from xlanb.runtime import store


@pytest.fixture
def eager():
    xlanb.set_mode("eager")
    assert config.eager_runs and config.background_compile


def _fresh(*shape):
    """A CPU tensor and its device copy, with a shape no other test uses (so every op on
    it is a new signature in this process)."""
    _fresh.n = getattr(_fresh, "n", 0) + 1
    cpu = torch.randn(*shape, 977 + _fresh.n)  # sizes no other test file uses
    dev = cpu.to("xla")
    xlanb.sync()
    return cpu, dev


def _seq(x):
    a = x.exp()
    b = a * 2.0
    c = b + x
    return c.sum(dim=1), torch.softmax(c, dim=-1)[:, 1:]


def test_a_run_of_new_ops_compiles_once_and_comes_back_from_the_cache(eager, count, same):
    cpu, x = _fresh(3)
    s, q = _seq(x)
    assert count("EagerRunCompile") == 0 and xlanb.pending_count() >= 6  # recorded, not run
    want = _seq(cpu)
    same(s, want[0])
    same(q, want[1])
    assert count("EagerRunCompile") == 1 and xlanb.pending_count() == 0
    assert count("QuickCompile") == 1 and count("UncachedCompile") == 0
    g = xlanb.graphs()[-1]
    assert g.quick and {"aten::exp", "aten::mul", "aten::add", "aten::sum",
                        "aten::_softmax"} <= set(g.ops)
    s, q = _seq(x)  # the same run: its graph, from the cache
    same(s, want[0])
    assert count("EagerRunCompile") == 1 and count("EagerRunCacheHit") == 1


def test_runs_off_compile_each_op_alone(eager, count, same, monkeypatch):
    monkeypatch.setattr(config, "eager_runs", 0)
    cpu, x = _fresh(2)
    s, _ = _seq(x)
    same(s, _seq(cpu)[0])
    assert count("EagerRunCompile") == 0 and count("OpCompile") >= 5


def test_quick_compiles_off_compile_runs_optimized(eager, count, same, monkeypatch):
    monkeypatch.setattr(config, "quick_compiles", False)
    cpu, x = _fresh(2)
    same(_seq(x)[0], _seq(cpu)[0])
    assert count("EagerRunCompile") == 1 and count("QuickCompile") == 0
    assert not xlanb.graphs()[-1].quick


def test_a_read_in_the_middle_ends_the_run(eager, count, same):
    cpu, x = _fresh(2)
    a = x.exp()
    b = a * 2.0
    mid = b[0, 0].item()  # a value is needed: the run so far compiles and runs
    assert count("EagerRunCompile") == 1
    assert mid == pytest.approx((cpu.exp() * 2.0)[0, 0].item(), rel=1e-6)
    c = b + x
    same(c.sum(), (cpu.exp() * 2.0 + cpu).sum())
    assert count("EagerRunCompile") == 2


def test_a_run_ends_at_the_size_limit(eager, count, same, monkeypatch):
    monkeypatch.setattr(config, "eager_runs", 3)
    cpu, x = _fresh(2)
    y, want = x, cpu
    for _ in range(7):
        y, want = (y * 1.5).tanh(), (want * 1.5).tanh()
    runs = count("EagerRunCompile") + count("EagerRunCacheHit")
    assert runs >= 4, runs  # 14 ops, at most 3 a run (alike runs come from the cache)
    same(y, want)


def test_a_mode_switch_ends_the_run(eager, count, same):
    cpu, x = _fresh(2)
    y = x.exp() + 1
    xlanb.set_mode("lazy")
    assert count("EagerRunCompile") == 1 and xlanb.pending_count() == 0
    same(y, cpu.exp() + 1)


def test_an_index_error_inside_a_run_names_its_own_line(eager):
    x = torch.arange(5.0, device="xla")
    xlanb.sync()
    idx = (x[:2] * 0 + 7).long()  # computed in the run
    with pytest.raises(IndexError) as err:  # eager: the index is read, and checked, at the op
        line = sys._getframe().f_lineno + 1
        x[idx]
    text = str(err.value) + "\n".join(getattr(err.value, "__notes__", ()))
    assert f"test_eager_runs.py:{line}" in text, text
    assert idx.cpu().tolist() == [7, 7]  # everything stays readable
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_debug_nans_names_the_op_inside_a_run_of_new_ops(eager):
    cpu, x = _fresh(2)
    with xlanb.debug_nans():
        a = x.abs() + 1
        with pytest.raises(xlanb.NonFiniteError) as err:
            line = sys._getframe().f_lineno + 1
            b = (-a).log()
            (b * 2).cpu()
    text = str(err.value)
    assert "aten::log" in text and f"test_eager_runs.py:{line}" in text, text


def test_pdb_stepping_through_new_ops_shows_each_value(eager):
    cpu, x = _fresh(2)
    out = io.StringIO()
    debugger = pdb.Pdb(stdin=io.StringIO("n\nn\np a.tolist()\nn\np b.tolist()\nc\n"), stdout=out)
    debugger.use_rawinput = False

    def stepped():
        debugger.set_trace()
        a = x.exp()
        b = a * 3.0
        return b

    b = stepped()
    text = out.getvalue()
    for want in ((cpu.exp()).tolist(), (cpu.exp() * 3.0).tolist()):
        got = [eval(line.removeprefix("(Pdb) ")) for line in text.splitlines()
               if line.removeprefix("(Pdb) ").startswith("[[")]
        assert any(torch.allclose(torch.tensor(g), torch.tensor(want), rtol=1e-5) for g in got), text
    torch.testing.assert_close(b.cpu(), cpu.exp() * 3.0)


def test_dropout_under_a_seed_is_the_same_as_op_by_op(eager, monkeypatch):
    cpu, x = _fresh(4)

    def step():
        torch.manual_seed(7)
        h = F.dropout(x * 2.0, p=0.5, training=True)
        return (h + torch.rand_like(h)).cpu()

    in_runs = step()
    monkeypatch.setattr(config, "eager_runs", 0)
    one_by_one = step()
    torch.testing.assert_close(in_runs, one_by_one, rtol=0, atol=0)


def test_a_runs_multiply_add_rounds_as_op_by_op_and_cpu_torch(eager, count, monkeypatch):
    """A run keeps each op's own rounding: XLA's default compile contracts ``x * y`` and
    the add after it into one FMA (1 ulp off for some elements of this size), the quick
    tier does not."""
    cpu, x = _fresh(64)
    cpu_y, y = _fresh(64)
    cpu_y, y = cpu_y[:, :cpu.shape[1]].contiguous(), y[:, :x.shape[1]]
    want = cpu * cpu_y + cpu
    in_run = (x * y + x).cpu()
    assert count("QuickCompile") >= 1
    torch.testing.assert_close(in_run, want, rtol=0, atol=0)
    monkeypatch.setattr(config, "eager_runs", 0)
    torch.testing.assert_close((x * y + x).cpu(), in_run, rtol=0, atol=0)


def test_a_value_read_twice_in_one_run_has_one_rounding(eager):
    """XLA duplicates an elementwise producer into each fusion that reads it; with the
    legacy emitters at -O0, the quick tier contracted ``uniform_``'s
    ``u * (high - low) + low`` into an FMA in the gather's fusion and not in the one
    that wrote ``t`` out: ``take_along_dim(t, i)`` was not ``t[i]`` (PyTorch's
    test_take_along_dim). The quick tier keeps the fusion emitters (compile.quick_options)."""
    _fresh.n = getattr(_fresh, "n", 0) + 1
    t = torch.empty(3, 2 * (977 + _fresh.n), device="xla").uniform_(-9, 9)[:, ::2]
    i = torch.argsort(t.reshape(-1))
    got = torch.take_along_dim(t, i, dim=None)
    flat = t.cpu().reshape(-1)
    torch.testing.assert_close(got.cpu(), flat[i.cpu()], rtol=0, atol=0)


def test_a_small_run_compiles_unfused_and_a_large_one_fused(eager, count, same):
    """The quick tier compiles a module of at most ``UNFUSED_MAX_OPS`` StableHLO ops
    without XLA's fusion (quicker to compile, compile.compile_options), a larger one
    with the fusion emitters; both give CPU torch's values."""
    from xlanb.executables.compile import UNFUSED_MAX_OPS
    cpu, x = _fresh(3)
    same(_seq(x)[1], _seq(cpu)[1])
    small = xlanb.graphs()[-1]
    assert small.quick and " fusion(" not in small.hlo(optimized=True)
    y, cy = x, cpu
    for _ in range(UNFUSED_MAX_OPS // 4):  # new shapes: every signature is new
        y, cy = torch.tanh(y[:, 1:] * 1.5 + y[:, 1:].exp()), torch.tanh(cy[:, 1:] * 1.5 + cy[:, 1:].exp())
    same(y, cy)
    big = xlanb.graphs()[-1]
    assert big.quick and len(big.ops) > UNFUSED_MAX_OPS // 4
    assert " fusion(" in big.hlo(optimized=True)


def test_a_module_that_hands_out_most_of_its_values_compiles_unfused():
    """The emitters' cost goes with the number of fusions, one per value handed out:
    ``unbind`` of many rows compiles unfused at the quick tier whatever its size, a
    large module with few results keeps the emitters (compile.unfused)."""
    import jax
    import jax.numpy as jnp
    from xlanb.executables import compile as C

    def chain(x):
        for _ in range(40):
            x = jnp.tanh(x * 1.5 + jnp.exp(x))
        return x

    spec = jax.ShapeDtypeStruct((300, 8), jnp.float32)
    rows = jax.jit(lambda x: [x[i] for i in range(x.shape[0])]).lower(spec)
    big = jax.jit(chain).lower(spec)
    assert C.lowered_ops(rows) > C.UNFUSED_MAX_OPS and C.lowered_ops(big) > C.UNFUSED_MAX_OPS
    quick = C.tier_options("quick", 0)
    assert C.compile_options("quick", quick, rows)["xla_disable_hlo_passes"] == "fusion"
    assert C.compile_options("quick", quick, big) is quick
    assert C.compile_options("full", None, rows) is None  # tier-ups stay XLA's defaults
    # a standalone scatter unfused at -O0 gave wrong values (x.t().copy_(y)): a small
    # module with one keeps the emitters
    small = jax.jit(lambda b, i, v: b.at[i].set(v)).lower(
        spec, jax.ShapeDtypeStruct((3,), jnp.int32), jax.ShapeDtypeStruct((3, 8), jnp.float32))
    assert C.lowered_ops(small) <= C.UNFUSED_MAX_OPS
    assert C.compile_options("quick", quick, small) is quick
    # so does a transpose: unfused at -O0, x.T.reshape(-1) came back in x's order
    flat_t = jax.jit(lambda x: x.T.reshape(-1)).lower(spec)
    assert C.compile_options("quick", quick, flat_t) is quick


@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_a_transpose_reshaped_in_a_quick_graph_keeps_its_order(mode, same):
    """XLA:CPU's legacy emitters at -O0 without fusion returned ``x.t().reshape(-1)`` in
    x's own order (compile._UNFUSED_OK)."""
    xlanb.set_mode(mode)
    cpu, x = _fresh(5)
    same(x.t().reshape(-1) * 2, cpu.t().reshape(-1) * 2)
    same(torch.cat([x.t(), x.t()]).reshape(-1), torch.cat([cpu.t(), cpu.t()]).reshape(-1))


def test_a_loop_over_rows_runs_op_by_op_and_compiles_each_signature_once(eager, count, same):
    """``torch.stack([op(r) for r in x])`` (PyTorch's test_batch_vs_slicing): the rows lie
    at different offsets of one storage, but the op's signature is the same for each, and
    a run of many ops with few new signatures goes op by op instead of compiling all of
    them as one graph (policy.few_signatures): three single-op compiles, not one graph
    of 80 ops."""
    cpu, x = _fresh(40)
    compiles, graphs, by_op = count("OpCompile"), count("EagerRunCompile"), count("EagerRunOpByOp")
    got = torch.stack([torch.tanh(r) for r in x])
    same(got, torch.stack([torch.tanh(r) for r in cpu]))
    assert count("EagerRunOpByOp") == by_op + 1 and count("EagerRunCompile") == graphs
    assert count("OpCompile") - compiles == 3  # unbind, tanh of a row, stack
    x2 = x * 1  # the loop again, on another storage: nothing new to compile
    compiles = count("OpCompile")
    same(torch.stack([torch.tanh(r) for r in x2]), torch.stack([torch.tanh(r) for r in cpu]))
    assert count("OpCompile") - compiles <= 1  # (mul)


def test_views_at_other_offsets_share_a_signature_and_land_at_their_own_offsets(eager, same):
    """A view's result lies at an offset its input decides: a view's signature leaves
    the offsets out and its result's offset moves with its input's, scaled by the
    element sizes (dispatcher._view_meta); in-place ops keep them (ir/tensor.SigKey)."""
    cpu = torch.arange(24.).reshape(4, 6)
    x = cpu.to("xla")
    sigs = set()
    for i in range(4):
        row, crow = x[i], cpu[i]
        assert row.storage_offset() == crow.storage_offset() == 6 * i
        v, cv = row[2:], crow[2:]
        u, cu = row.unsqueeze(0), crow.unsqueeze(0)
        assert v.storage_offset() == cv.storage_offset() and u.storage_offset() == cu.storage_offset()
        sigs.add(id(v._view[-1][0]))
        v.mul_(2.0)
        cv.mul_(2.0)
        same(torch.exp(row), torch.exp(crow))
        same(u, cu)
    assert len(sigs) == 1  # row[2:] of each row: one OpSignature
    same(x, cpu)
    z = torch.randn(3, 4, dtype=torch.complex64)
    zx = z.to("xla")
    for i in range(3):  # a view that changes the element size scales the offset
        r, cr = torch.view_as_real(zx[i]), torch.view_as_real(z[i])
        assert r.storage_offset() == cr.storage_offset() == 8 * i
        same(r, cr)


def test_in_place_updates_on_views_inside_a_run(eager, same):
    cpu = torch.zeros(4, 47)
    x = cpu.to("xla")
    xlanb.sync()
    for t in (cpu, x):
        v = t[1:3]
        v.add_(1.5)
        v.mul_(2.0)
        t[:, 0].fill_(5.0)
        col = t[:, 2]
        col.sub_(v.sum())
    same(x, cpu)
    same(v, cpu[1:3])


def test_an_op_in_a_third_new_run_gets_its_own_executable(eager, count):
    """The tier-up of ops: an op that comes back in new company is lowered while the run
    compiles and compiled in the background; then it runs alone, at once."""
    cpu, x = _fresh(3)
    (x.exp() * 2.0).cpu()          # exp, first new run
    (x.exp() + 3.0).cpu()          # exp again, in a second new run
    (x.exp() - 4.0).cpu()          # a third new run: its own executable
    from xlanb.executables.background import _in_flight
    for f in list(_in_flight):
        f.result(timeout=120)
    hits = count("OpCacheHit")
    runs = count("EagerRunCompile") + count("EagerRunCacheHit")
    y = x.exp()                    # alone: runs now, no run opened
    assert xlanb.pending_count() == 0
    assert count("OpCacheHit") == hits + 1
    assert count("EagerRunCompile") + count("EagerRunCacheHit") == runs
    torch.testing.assert_close(y.cpu(), cpu.exp())


def test_a_quick_run_that_runs_again_tiers_up_to_its_optimized_executable(eager, count):
    cpu, x = _fresh(3)
    want = _seq(cpu)[0]
    torch.testing.assert_close(_seq(x)[0].cpu(), want)
    g = xlanb.graphs()[-1]
    assert g.quick
    g.compile_time = 0.0  # it has run as long as its quick compile took
    torch.testing.assert_close(_seq(x)[0].cpu(), want)
    assert g._tiering is not None
    g._tiering.result(timeout=120)
    assert not g.quick and count("GraphTierUp") == 1
    torch.testing.assert_close(_seq(x)[0].cpu(), want)  # the optimized one, same values
    assert store.load(g._store_key(), g.device) is not None  # a new process finds it


def test_a_big_quick_run_tiers_up_at_its_third_run_as_a_lazy_graph_does(eager, count):
    """A run whose quick compile took long (a training step) starts its optimized
    compile after its second run and swaps it in at its third, waiting for it: at that
    run whatever the compile's speed (swapped in when ready, BERT's came after eight
    steps or more, on two cores). Values stay CPU torch's."""
    cpu, x = _fresh(4)
    want = _seq(cpu)[0]
    torch.testing.assert_close(_seq(x)[0].cpu(), want)
    g = xlanb.graphs()[-1]
    assert g.quick and g._tiering is None
    from xlanb.execute import graphs
    g.compile_time = graphs.QUICK_BIG_S  # as long as a big graph's quick compile...
    g.first_run_s = graphs.QUICK_BIG_RUN_S  # ...and first run
    torch.testing.assert_close(_seq(x)[0].cpu(), want)
    assert g._tiering is not None
    g._tiering.result(timeout=120)  # even when it is ready, the swap waits for run 3
    assert g.quick and count("GraphTierUp") == 0
    torch.testing.assert_close(_seq(x)[0].cpu(), want)
    assert not g.quick and count("GraphTierUp") == 1


def test_a_cnn_backward_run_at_the_quick_tier_matches_cpu(eager):
    """The backward of conv -> batch norm -> max pool, one eager run compiled at the quick
    tier: conv1's weight gradient was off by 0.08 (of 0.45) while max pool found its taps
    by comparing them with their maximum computed apart, which XLA:CPU's quick tier
    computed with other rounding (aten_pool.window_max)."""
    import copy
    from test_models import _cnn_batch, cnn_train
    model_c = cnn_train()
    x, y = _cnn_batch()
    # a batch of 6, which no other test gives this CNN: test_models trains it on 2, and
    # after it, in one process, every op of the run had its executable already
    x, y = torch.cat([x, x.flip(0), x * 0.5]), torch.cat([y, y.flip(0), y])
    model_x = copy.deepcopy(model_c).to("xla")
    F.cross_entropy(model_c(x), y).backward()
    xlanb.metrics.clear()
    F.cross_entropy(model_x(x.to("xla")), y.to("xla")).backward()
    grads = [p.grad.cpu() for p in model_x.parameters()]  # one read: the run ends here
    assert (xlanb.metrics.counter_value("QuickCompile") or 0) >= 1
    for (name, pc), g in zip(model_c.named_parameters(), grads):
        torch.testing.assert_close(g, pc.grad, atol=1e-4, rtol=1e-4, msg=f"grad {name}")


def test_a_run_that_fails_to_compile_does_not_fail_the_reads_after_it(eager, same,
                                                                    monkeypatch):
    """An op that cannot lower (here a sigmoid whose lowering raises when traced: it
    records, and fails at its run's lowering) fails its run's read; its tensor stays
    pending and raises again when read, but later reads of other tensors do not sweep it
    into their runs (56 of PyTorch's unary float32 tests failed that way, after one
    complex32 conversion test whose tensors pytest kept alive, when complex32 could
    not lower)."""
    from xlanb.ops import infos
    real = infos._lowered_fn

    def lowered_fn(plan, template, out):
        if plan.name != "aten::sigmoid":
            return real(plan, template, out)

        def fails(ins, scs):
            raise RuntimeError("this lowering fails when traced")
        return fails
    monkeypatch.setattr(infos, "_lowered_fn", lowered_fn)
    cpu, x = _fresh(3)
    bad = (x * 2).sigmoid()
    with pytest.raises(RuntimeError, match="fails when traced"):
        bad.cpu()
    y = torch.tanh(x + 1)  # a new run, which the failed one must not join
    same(y, torch.tanh(cpu + 1))
    same(x.exp().sum(dim=1), cpu.exp().sum(dim=1))
    with pytest.raises(RuntimeError, match="fails when traced"):  # still pending, failing
        bad.cpu()


def test_a_quick_run_loaded_from_the_store_tiers_up_on_its_quick_compiles_schedule(
        eager, count, monkeypatch, tmp_path):
    """Issue 57: a quick executable loaded from the store (a new process; here, a
    cleared graph cache) knew only its load time, so a big run (a training step) tiered
    up as a small one does, swapped in whenever it was ready. The store keeps the quick
    compile's time beside it (store.load(with_info=True)); loaded, the run follows the
    big schedule: its optimized compile after its second run, swapped in at its third."""
    import time
    from xlanb.execute import graphs
    monkeypatch.setattr(config, "store_dir", str(tmp_path))
    cpu, x = _fresh(4)
    want = _seq(cpu)[0]
    torch.testing.assert_close(_seq(x)[0].cpu(), want)
    g = xlanb.graphs()[-1]
    assert g.quick
    _, info = store.load(g.build().at("quick").key, g.device, with_info=True)
    quick_s = info["quick_compile_s"]
    assert 0 < quick_s <= g.compile_time
    graphs.clear_graph_cache()
    torch.testing.assert_close(_seq(x)[0].cpu(), want)  # its first run here: loaded
    h = xlanb.graphs()[-1]
    assert h is not g and h.quick and h.quick_compile_s == quick_s
    monkeypatch.setattr(graphs, "QUICK_BIG_S", quick_s)  # its quick compile was big...
    monkeypatch.setattr(graphs, "QUICK_BIG_RUN_S", 0.0)  # (and its first run)
    assert not graphs._big_compile(h.compile_time)       # ...its load is not
    torch.testing.assert_close(_seq(x)[0].cpu(), want)   # run 2: the optimized compile starts
    assert h._tiering is not None
    h._tiering.result(timeout=120)
    time.sleep(0.05)  # a swap when ready (a small run's) would have happened
    assert h.quick and count("GraphTierUp") == 0
    torch.testing.assert_close(_seq(x)[0].cpu(), want)   # run 3: the optimized one
    assert not h.quick and count("GraphTierUp") == 1


def test_hot_quick_runs_tier_up_when_the_process_is_idle(eager, count, monkeypatch):
    """``xlanb.optimize_hot_graphs()`` (the IPython extension calls it when a cell ends)
    starts the optimized compile of each quick run that ran ``min_runs`` times, though by
    its own rule it would wait to have run as long as its compile took; one that ran less
    stays quick. The optimized executable swaps in when ready, with CPU torch's values."""
    from xlanb.execute import graphs
    monkeypatch.setattr(graphs, "graph_cache", {})  # only this test's graphs
    cpu, x = _fresh(5)
    want = _seq(cpu)[0]
    for _ in range(4):
        torch.testing.assert_close(_seq(x)[0].cpu(), want)
    hot = xlanb.graphs()[-1]
    cold_cpu, cold = _fresh(6)
    torch.testing.assert_close(_seq(cold)[0].cpu(), _seq(cold_cpu)[0])
    once = xlanb.graphs()[-1]
    assert hot.quick and once.quick and hot is not once and hot.hits == 3
    assert hot._tiering is None  # its own rule has not started it (4 runs of ~1 ms)
    assert xlanb.optimize_hot_graphs(min_runs=5) == 0  # it ran 4 times
    assert xlanb.optimize_hot_graphs(min_runs=4) == 1
    hot._tiering.result(timeout=120)
    assert not hot.quick and count("GraphTierUp") == 1
    assert once.quick and once._tiering is None
    torch.testing.assert_close(_seq(x)[0].cpu(), want)  # the optimized one, same values
    assert xlanb.optimize_hot_graphs(min_runs=1) == 1  # only the quick one is left
    once._tiering.result(timeout=120)  # (its swap must not land in another test)
    assert xlanb.optimize_hot_graphs(min_runs=0) == 0  # 0: never


def test_idle_time_leaves_lazy_graphs_to_their_own_schedule(count, monkeypatch):
    """A lazy graph replayed again and again keeps its fixed third-run tier-up (its values
    never depend on a compile's speed): idle time starts nothing for it."""
    from xlanb.execute import graphs
    monkeypatch.setattr(graphs, "graph_cache", {})
    cpu, x = _fresh(7)
    with xlanb.mode("lazy"), monkeypatch.context() as m:
        m.setattr(graphs, "tier_up", lambda *a, **k: None)  # no tier-up by its own rule
        for _ in range(5):
            torch.testing.assert_close(_seq(x)[0].cpu(), _seq(cpu)[0])
    g = max(graphs.graph_cache.values(), key=lambda g: g.hits)
    assert g.quick and g.hits == 4 and not g.eager_run
    assert xlanb.optimize_hot_graphs(min_runs=1) == 0 and g._tiering is None
