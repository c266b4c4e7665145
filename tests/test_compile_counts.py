"""Compile behaviour, asserted through the metrics counters.

Graph and single-op executables are cached for the whole process, so every test here
uses shapes that no other test uses: what it counts is its own compiles only.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

import xlanb
from xlanb import metrics


def c(name: str) -> int:
    return metrics.counter_value(name) or 0


def _adamw_with_state(model, lr):
    """AdamW whose state exists already (as after a first step), so that setup work,
    not the first counted step, creates it."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    for p in model.parameters():
        opt.state[p] = {"step": torch.tensor(0.0),
                        "exp_avg": torch.zeros_like(p),
                        "exp_avg_sq": torch.zeros_like(p)}
    return opt


def _mlp_and_batch(mode, n_in, hidden, n_out, batch):
    """In ``mode``, a seeded Linear-ReLU-Linear classifier on xla and a batch for it (the
    sizes are the caller's own, so that no other test compiled its graphs)."""
    xlanb.set_mode(mode)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out)).to("xla")
    x = torch.randn(batch, n_in).to("xla")
    y = torch.randint(0, n_out, (batch,)).to("xla")
    return model, x, y


def test_lazy_training_steps_compile_once_despite_changing_lr():
    model, x, y = _mlp_and_batch("lazy", 11, 23, 3, batch=9)
    opt = _adamw_with_state(model, lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    xlanb.sync()  # the setup work is not part of the step graph
    metrics.clear()

    losses = []
    for step in range(5):
        for g in opt.param_groups:
            g["lr"] = 1e-3 * (step + 1) * 0.7  # a new Python float every step
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        xlanb.sync()
        losses.append(loss.item())  # after the sync: reading computes nothing new
    assert c("UncachedCompile") == 1, metrics.short_report()
    assert c("CachedCompile") == 4, metrics.short_report()
    assert not [n for n in metrics.counter_names() if n.startswith("aten::")], metrics.short_report()
    assert losses[-1] < losses[0]


def test_first_step_creating_optimizer_state_compiles_the_same_graph():
    # AdamW makes its moments with zeros_like on the first step, and they enter later
    # steps as device data: the first step must cut that same graph, not a second one.
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(13, 17), nn.Tanh(), nn.Linear(17, 5))
    x, y = torch.randn(6, 13), torch.randint(0, 5, (6,))
    xlanb.set_mode("lazy")
    dev = copy.deepcopy(cpu).to("xla")
    xd, yd = x.to("xla"), y.to("xla")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, dev)]
    xlanb.sync()
    metrics.clear()
    for step in range(3):
        for m, opt, xi, yi in ((cpu, opts[0], x, y), (dev, opts[1], xd, yd)):
            opt.zero_grad()
            nn.functional.cross_entropy(m(xi), yi).backward()
            opt.step()
        xlanb.sync()
    assert c("UncachedCompile") == 1, metrics.short_report()
    assert c("CachedCompile") == 2, metrics.short_report()
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-5, atol=1e-6)
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(opts[1].state[q]["exp_avg_sq"].cpu(), opts[0].state[p]["exp_avg_sq"],
                                   rtol=1e-5, atol=1e-9)


def test_fresh_zeros_written_in_place_read_correctly():
    # The fill becomes device data before its first write; every mode reads the writes.
    for mode in ("lazy", "opbyop", "eager"):
        xlanb.set_mode(mode)
        base = torch.arange(12.0).reshape(3, 4)
        buf = torch.zeros(3, 4, device="xla")
        buf[1].add_(base[1].to("xla"))
        ones = torch.ones(2, 4, dtype=torch.int16, device="xla")
        ones.mul_(3)
        keep = torch.zeros_like(buf)  # a fill nobody writes stays an ordinary node
        expect = torch.zeros(3, 4)
        expect[1] += base[1]
        torch.testing.assert_close(buf.cpu(), expect)
        torch.testing.assert_close(ones.cpu(), torch.full((2, 4), 3, dtype=torch.int16))
        torch.testing.assert_close(keep.cpu(), torch.zeros(3, 4))
    xlanb.set_mode("lazy")


def test_lazy_step_graph_matches_cpu_with_changing_lr():
    # The lifted learning rate is really used: the parameters track CPU torch.
    xlanb.set_mode("lazy")
    torch.manual_seed(1)
    cpu = nn.Sequential(nn.Linear(5, 13), nn.Tanh(), nn.Linear(13, 2))
    dev = copy.deepcopy(cpu).to("xla")
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_x = torch.optim.SGD(dev.parameters(), lr=0.1)
    x = torch.randn(6, 5)
    xx = x.to("xla")
    xlanb.sync()
    metrics.clear()
    for step, lr in enumerate([0.1, 0.5, 0.05, 1.0]):
        for o in (opt_c, opt_x):
            o.param_groups[0]["lr"] = lr
            o.zero_grad()
        cpu(x).pow(2).mean().backward()
        dev(xx).pow(2).mean().backward()
        opt_c.step()
        opt_x.step()
        xlanb.sync()
    assert c("UncachedCompile") == 1 and c("CachedCompile") == 3, metrics.short_report()
    for pc, px in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(px.detach().cpu(), pc.detach(), atol=1e-5, rtol=1e-5)


def test_lazy_values_never_recompile():
    xlanb.set_mode("lazy")
    for v in (1.0, -3.0, 42.0):
        a = torch.full((17, 3), v).to("xla")  # device data: only its value differs
        b = (a * 2 + a.sum()).relu()
        xlanb.sync()
        assert torch.allclose(b.cpu(), (torch.full((17, 3), v) * 2 + v * 51).relu())
    assert c("UncachedCompile") == 1 and c("CachedCompile") == 2, metrics.short_report()


def test_lazy_random_in_loop_does_not_recompile():
    xlanb.set_mode("lazy")
    seen = []
    uncached_after = []
    for _ in range(4):
        r = torch.randn(13, 7, device="xla") * 2 + torch.rand(13, 7, device="xla")
        xlanb.sync()
        uncached_after.append(c("UncachedCompile"))
        seen.append(r.cpu())
    assert uncached_after == [1, 1, 1, 1], uncached_after
    assert c("CachedCompile") == 3
    for i in range(1, 4):
        assert not torch.equal(seen[0], seen[i])  # fresh values each step


def test_peek_does_not_change_next_compile():
    xlanb.set_mode("lazy")
    a = torch.ones(19, 2, device="xla")
    xlanb.sync()
    metrics.clear()

    def step():
        h = (a * 3).exp()
        return h, h.sum(0)

    h, s = step()
    xlanb.peek(h)  # op by op, through the single-op cache; graph untouched
    repr(s)
    xlanb.sync()
    h2, s2 = step()
    xlanb.sync()
    assert c("UncachedCompile") == 1 and c("CachedCompile") == 1, metrics.short_report()
    assert torch.allclose(s2.cpu(), torch.full((2,), 19 * torch.exp(torch.tensor(3.0)).item()))


def _mlp_step(model, x, y):
    model.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss


def test_eager_second_identical_forward_backward_compiles_nothing():
    model, x, y = _mlp_and_batch("eager", 14, 29, 6, batch=10)
    metrics.clear()
    l1 = _mlp_step(model, x, y)
    l1.item()  # the step's run of new ops compiles as one graph
    first = c("OpCompile") + c("EagerRunCompile")
    assert first > 0
    hits = c("OpCacheHit") + c("EagerRunCacheHit")
    l2 = _mlp_step(model, x, y)
    l2.item()
    assert c("OpCompile") + c("EagerRunCompile") == first, metrics.short_report()
    # step 2 is step 1's run again: its graph, from the cache
    assert l1.item() == l2.item()
    assert c("OpCacheHit") + c("EagerRunCacheHit") > hits
    assert c("UncachedCompile") == 0 and c("CachedCompile") == 0


def test_opbyop_sync_compiles_each_distinct_signature_once():
    xlanb.set_mode("opbyop")
    torch.manual_seed(0)
    w = torch.randn(21, 21).to("xla")
    b = torch.randn(21).to("xla")
    x0 = torch.randn(3, 21).to("xla")
    xlanb.sync()
    metrics.clear()

    def step():
        h = x0
        for _ in range(4):  # the same three signatures four times: mm, add, tanh
            h = torch.tanh(torch.mm(h, w) + b)
        return h

    h = step()
    assert c("OpCompile") == 0  # recorded, nothing ran yet
    xlanb.sync()
    assert c("OpCompile") == 3, metrics.short_report()
    assert c("OpCacheHit") == 9, metrics.short_report()
    assert c("UncachedCompile") == 0 and c("CachedCompile") == 0

    ref = x0.cpu()
    for _ in range(4):
        ref = torch.tanh(ref @ w.cpu() + b.cpu())
    torch.testing.assert_close(h.cpu(), ref, atol=1e-5, rtol=1e-5)

    h2 = step()
    xlanb.sync()
    assert c("OpCompile") == 3 and c("UncachedCompile") == 0, metrics.short_report()
    assert c("OpCacheHit") == 9 + 12
    assert torch.equal(h2.cpu(), h.cpu())


def test_opbyop_training_step_second_time_compiles_nothing():
    model, x, y = _mlp_and_batch("opbyop", 15, 31, 4, batch=5)
    opt = _adamw_with_state(model, lr=1e-3)
    xlanb.sync()
    metrics.clear()
    for i in range(2):
        opt.zero_grad()
        _mlp_step(model, x, y)
        opt.step()
        xlanb.sync()
        if i == 0:
            first = c("OpCompile")
            assert first > 0
    assert c("OpCompile") == first, metrics.short_report()
    assert c("UncachedCompile") == 0 and c("CachedCompile") == 0


def test_a_lazy_graph_runs_quick_twice_then_its_optimized_executable():
    """A new lazy graph compiles with the quick tier; its optimized compile starts at its
    second run and replaces it at its third, at that run whatever the compile's speed
    (so a loop's values never depend on timing); the values stay CPU torch's. Both tiers
    compile the one lowering: the tier-up does not trace the graph again."""
    xlanb.set_mode("lazy")
    cpu = torch.randn(5, 1013)
    x = cpu.to("xla")
    xlanb.sync()
    quick0, up0 = c("QuickCompile"), c("GraphTierUp")
    lowered0 = _lowerings()
    want = (cpu * 1.5 + 2.0).tanh().sum(dim=1)

    def step():
        out = (x * 1.5 + 2.0).tanh().sum(dim=1)
        xlanb.sync()
        return out

    torch.testing.assert_close(step().cpu(), want)
    g = xlanb.graphs()[-1]
    assert g.quick and c("QuickCompile") == quick0 + 1 and g._tiering is None
    torch.testing.assert_close(step().cpu(), want)
    assert xlanb.graphs()[-1] is g and g.quick and g._tiering is not None
    import time
    while not g._tiering.done():  # even when it is ready, the swap waits for the 3rd run
        time.sleep(0.01)
    assert g.quick and c("GraphTierUp") == up0
    torch.testing.assert_close(step().cpu(), want)
    assert not g.quick and c("GraphTierUp") == up0 + 1
    assert c("QuickCompile") == quick0 + 1  # one graph, compiled quickly once
    assert _lowerings() == lowered0 + 1


def test_a_lazy_graph_that_comes_back_among_others_tiers_up_when_it_has_run_as_long_as_it_compiled():
    """A lazy graph whose second run comes many graph runs after its first (a generate
    call's prefill at a prompt length seen before) is not a loop's body: no optimized
    compile starts at its second run, and its third does not wait for one. Once it has
    run as long as its quick compile took, its optimized compile starts and is swapped in
    when ready, as a small eager run's is. A graph run back to back keeps the fixed run
    (the test above). Values stay CPU torch's at every run."""
    import concurrent.futures
    import time
    from xlanb.execute import graphs
    xlanb.set_mode("lazy")
    cpu = torch.randn(3, 1019)
    x = cpu.to("xla")
    xlanb.sync()
    want = (cpu * 0.5 - 1.0).sin().sum(dim=1)

    def prefill():
        out = (x * 0.5 - 1.0).sin().sum(dim=1)
        xlanb.sync()
        return out

    def others():  # more graph runs than LOOP_GAP, all of one other small graph
        y = x[:1] * 1.0
        for _ in range(graphs.LOOP_GAP + 1):
            y = y + 1.0
            xlanb.sync()
        torch.testing.assert_close(y.cpu(), cpu[:1] + graphs.LOOP_GAP + 1.0)

    torch.testing.assert_close(prefill().cpu(), want)
    g = xlanb.graphs()[-1]
    assert g.quick and not g.occasional
    others()
    torch.testing.assert_close(prefill().cpu(), want)
    assert g.occasional and g.quick and g._tiering is None  # nothing compiles for it yet
    others()
    torch.testing.assert_close(prefill().cpu(), want)
    assert g.quick and g._tiering is None  # its third run waited for nothing
    g.run_time = g.quick_compile_s  # as if it had run as long as it compiled
    torch.testing.assert_close(prefill().cpu(), want)
    assert g._tiering is not None
    concurrent.futures.wait([g._tiering])
    deadline = time.monotonic() + 30  # (the swap is the future's callback: just after)
    while g.quick and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not g.quick  # swapped in when ready, with no run waiting for it
    torch.testing.assert_close(prefill().cpu(), want, rtol=1e-5, atol=1e-5)


def test_a_big_lazy_graph_stores_its_optimized_executable_not_its_quick_one(monkeypatch,
                                                                           tmp_path):
    """A lazy graph whose quick compile took long (a training step) starts its optimized
    compile right after its first run; only that one goes to the store, where a new
    process (here: a cleared graph cache) finds it and runs it without compiling."""
    from xlanb import config
    from xlanb.execute import graphs
    monkeypatch.setattr(graphs, "QUICK_BIG_S", 0.0)  # every graph counts as big
    monkeypatch.setattr(graphs, "QUICK_BIG_RUN_S", 0.0)
    monkeypatch.setattr(config, "store_dir", str(tmp_path))
    xlanb.set_mode("lazy")
    cpu = torch.randn(4, 1021)
    x = cpu.to("xla")
    xlanb.sync()
    writes0 = c("PersistentCacheWrite")
    y = (x * 0.5 - 1.0).exp().sum(dim=0)
    xlanb.sync()
    g = xlanb.graphs()[-1]
    assert g.quick and g._tiering is not None  # its optimized compile started at once
    assert c("PersistentCacheWrite") == writes0  # the quick one was not stored
    g._tiering.result()
    assert c("PersistentCacheWrite") == writes0 + 1
    torch.testing.assert_close(y.cpu(), (cpu * 0.5 - 1.0).exp().sum(dim=0))
    graphs.clear_graph_cache()
    quick0, hits0, lowered0 = c("QuickCompile"), c("PersistentCacheHit"), _lowerings()
    z = (x * 0.5 - 1.0).exp().sum(dim=0)
    xlanb.sync()
    assert c("QuickCompile") == quick0 and _lowerings() == lowered0  # nothing compiled
    assert c("PersistentCacheHit") == hits0 + 1 and not xlanb.graphs()[-1].quick
    torch.testing.assert_close(z.cpu(), (cpu * 0.5 - 1.0).exp().sum(dim=0))


def test_a_long_quick_compile_with_a_short_first_run_is_not_a_big_graph(monkeypatch,
                                                                         tmp_path):
    """A graph whose quick compile took long but whose first run was short (a small
    model's forward on a busy machine) is not a training step: no optimized compile starts
    after its first run; its quick executable is stored then, and it tiers up on the
    small graphs' schedule (optimized from its third run). A compile's time alone made a
    first generate call's forwards big or not from one run of a script to the next."""
    from xlanb import config
    from xlanb.execute import graphs
    from xlanb.runtime import store
    monkeypatch.setattr(graphs, "QUICK_BIG_S", 0.0)  # every quick compile is long...
    monkeypatch.setattr(graphs, "QUICK_BIG_RUN_S", 60.0)  # ...and no run is
    monkeypatch.setattr(config, "store_dir", str(tmp_path))
    xlanb.set_mode("lazy")
    cpu = torch.randn(4, 1025)
    x = cpu.to("xla")
    xlanb.sync()
    want = (cpu * 0.75 + 0.5).cos().sum(dim=0)
    writes0 = c("PersistentCacheWrite")
    seen = []
    for _ in range(3):
        y = (x * 0.75 + 0.5).cos().sum(dim=0)
        xlanb.sync()
        g = xlanb.graphs()[-1]
        seen.append((g.quick, g._tiering is not None))
        torch.testing.assert_close(y.cpu(), want)
    assert c("PersistentCacheWrite") >= writes0 + 1
    assert store.load(g.build().at("quick").key, g.device) is not None  # stored after run 1
    assert seen == [(True, False), (True, True), (False, True)]


def test_a_quick_lazy_graph_loaded_from_the_store_tiers_up_at_its_third_run(monkeypatch,
                                                                           tmp_path):
    """Issue 57: the executables a new process (here: a cleared graph cache) loads from
    the store keep the tier they were stored at, and a quick one tiers up by the rule a
    freshly compiled one follows: quick for two runs, optimized from the third."""
    from xlanb import config
    from xlanb.execute import graphs
    monkeypatch.setattr(config, "store_dir", str(tmp_path))
    # a small graph whatever the load: a quick compile past QUICK_BIG_S (a busy machine)
    # would make it a big one, whose quick executable is not stored
    monkeypatch.setattr(graphs, "QUICK_BIG_S", 60.0)
    xlanb.set_mode("lazy")
    cpu = torch.randn(3, 1009)
    x = cpu.to("xla")
    xlanb.sync()
    want = (cpu * 0.25 + 1.0).sin().sum(dim=1)

    def step():
        out = (x * 0.25 + 1.0).sin().sum(dim=1)
        xlanb.sync()
        return out

    torch.testing.assert_close(step().cpu(), want)
    assert xlanb.graphs()[-1].quick  # compiled quickly, and stored
    graphs.clear_graph_cache()
    hits0, up0 = c("PersistentCacheHit"), c("GraphTierUp")
    seen = []
    for _ in range(4):
        torch.testing.assert_close(step().cpu(), want)
        seen.append(xlanb.graphs()[-1].quick)
    assert c("PersistentCacheHit") == hits0 + 1  # loaded, at the quick tier
    assert seen == [True, True, False, False] and c("GraphTierUp") == up0 + 1
    assert len(xlanb.graphs()) == 1


def _lowerings() -> int:
    data = metrics.metric_data("LowerTime")
    return data.count if data is not None else 0


def test_quick_compiles_off_compile_lazy_graphs_optimized(monkeypatch):
    from xlanb import config
    monkeypatch.setattr(config, "quick_compiles", False)
    xlanb.set_mode("lazy")
    x = torch.randn(3, 1019).to("xla")
    y = (x * 3.0).exp()
    xlanb.sync()
    assert not xlanb.graphs()[-1].quick
    torch.testing.assert_close(y.cpu(), (x.cpu() * 3.0).exp())

