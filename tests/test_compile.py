"""xlanb.compile: trace until stable, then replay the executable without running Python.

Every scenario trains the same model on CPU torch and compares parameters, so a replay
that read a stale input or wrote a result to the wrong tensor fails here.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import xlanb
from xlanb import metrics


def _models(seed=0):
    torch.manual_seed(seed)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    dev = copy.deepcopy(cpu).to("xla")
    return cpu, dev


def _batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g))
            for _ in range(n)]


def _train(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def _assert_same_params(dev, cpu):
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["lazy", "eager"])
def test_replays_a_training_step_and_matches_cpu(mode):
    xlanb.set_mode(mode)
    cpu, dev = _models()
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_d = torch.optim.AdamW(dev.parameters(), lr=1e-2, capturable=True)
    step = xlanb.compile(lambda x, y: _train(dev, opt_d, x, y), name="train")
    replays0 = metrics.counter_value("CompiledReplay") or 0
    for x, y in _batches(7):
        got = step(x.to("xla"), y.to("xla"))
        want = _train(cpu, opt_c, x, y)
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-4, atol=1e-5)
    _assert_same_params(dev, cpu)
    # Call 1 also creates AdamW's state, yet cuts the graph of call 2 (its fresh zeros are
    # device data before their first write): they agree, and calls 3..7 replay.
    assert step.replays == 5 and step.traced_calls == 2
    assert (metrics.counter_value("CompiledReplay") or 0) - replays0 == 5
    assert "replaying graph" in step.status()
    g = [g for g in xlanb.graphs() if g.cause == "xlanb.compile(train)"]
    assert g and g[-1].hits >= 4
    assert xlanb.get_mode() == mode


def test_python_number_that_changes_keeps_lazy_tracing_and_says_where():
    cpu, dev = _models()
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    # Not capturable: Adam's bias corrections are Python floats that change every step.
    opt_d = torch.optim.AdamW(dev.parameters(), lr=1e-2)
    step = xlanb.compile(lambda x, y: _train(dev, opt_d, x, y), name="host_adam")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in _batches(6):
            step(x.to("xla"), y.to("xla"))
            _train(cpu, opt_c, x, y)
    _assert_same_params(dev, cpu)
    assert step.replays == 0
    status = step.status()
    assert "lazy tracing: a Python number changes between calls" in status
    assert "test_compile.py" in status  # the user's line that read it
    assert any("stays on lazy tracing" in str(w.message) for w in caught)


def test_host_read_inside_the_function_falls_back_to_lazy_with_the_reason():
    cpu, dev = _models()
    seen = []

    def fn(x):
        y = dev(x)
        seen.append(y.sum().item())  # a host read: cannot be replayed
        return y * 2

    step = xlanb.compile(fn, name="reads")
    with pytest.warns(UserWarning, match="reads a device value on the host"):
        out = step(torch.ones(2, 8).to("xla"))
    torch.testing.assert_close(out.cpu(), cpu(torch.ones(2, 8)).detach() * 2, rtol=1e-5, atol=1e-6)
    for _ in range(3):
        step(torch.ones(2, 8).to("xla"))
    assert len(seen) == 4 and step.replays == 0
    assert "value needed by .item()" in step.status()


def test_new_argument_shapes_trace_separately_and_old_replays_go_on():
    cpu, dev = _models()
    step = xlanb.compile(lambda x: dev(x).relu(), name="fwd")
    a, b = torch.randn(4, 8), torch.randn(5, 8)
    for _ in range(3):
        step(a.to("xla"))
    assert step.replays == 1  # traces 1 and 2 agree (no state setup), call 3 replays
    for _ in range(3):
        out = step(b.to("xla"))
    torch.testing.assert_close(out.cpu(), cpu(b).relu().detach(), rtol=1e-5, atol=1e-6)
    out = step(a.to("xla"))
    assert step.replays == 3
    torch.testing.assert_close(out.cpu(), cpu(a).relu().detach(), rtol=1e-5, atol=1e-6)
    assert step.status().count("replaying") == 2


def test_replay_reads_current_values_of_state_changed_outside():
    cpu, dev = _models()
    step = xlanb.compile(lambda x: dev(x), name="fwd")
    x = torch.randn(2, 8)
    for _ in range(3):
        step(x.to("xla"))
    with torch.no_grad():
        dev[0].weight.mul_(-1)  # pending lazy work on a state tensor, outside the function
        cpu[0].weight.mul_(-1)
    out = step(x.to("xla"))
    assert step.replays == 2
    torch.testing.assert_close(out.cpu(), cpu(x).detach(), rtol=1e-5, atol=1e-6)


def test_random_ops_get_fresh_keys_on_every_replay():
    step = xlanb.compile(lambda x: F.dropout(x, 0.5, training=True))
    x = torch.ones(64, 64).to("xla")
    outs = [step(x).cpu() for _ in range(5)]
    assert step.replays == 3
    for a, b in zip(outs, outs[1:]):
        assert not torch.equal(a, b)
    for o in outs:
        kept = (o != 0).float().mean().item()
        assert 0.4 < kept < 0.6 and set(o.unique().tolist()) <= {0.0, 2.0}


def test_decorator_forms():
    @xlanb.compile
    def f(x):
        return x * 3

    @xlanb.compile(name="g_named")
    def g(x):
        return x + 1

    x = torch.arange(4.0).to("xla")
    for _ in range(3):
        torch.testing.assert_close(f(x).cpu(), torch.arange(4.0) * 3)
        torch.testing.assert_close(g(x).cpu(), torch.arange(4.0) + 1)
    assert f.__name__ == "f" and f.replays == 1 and g.replays == 1
    assert "xlanb.compile(g_named)" in g.status()


def test_a_replay_runs_through_the_run_step_memory_limit_and_time():
    """A replay runs its graph through the same step as a sync (graphs.run_compiled): the
    memory limit is checked before it runs, and refusing writes nothing; its time is
    counted. (Its index checks: tests/test_index_bounds.py.)"""
    xlanb.set_mode("lazy")
    w = torch.ones(256, 256, device="xla")
    x = torch.ones(256, device="xla")
    xlanb.sync()

    def step(v):
        w.add_(1.0)  # a state tensor the replay writes
        return (w @ v).sum()
    f = xlanb.compile(step, name="mv")
    for _ in range(3):
        f(x)
    assert f.replays == 1
    rec = xlanb.graphs()[-1]
    runs, ran = metrics.metric_data("ExecuteTime")[0], rec.run_time
    with xlanb.memory_limit(xlanb.memory_reserved() + 1024):  # no room for its output
        with pytest.raises(xlanb.DeviceMemoryError, match=r"xlanb.compile\(mv\)'s graph "
                           r"replayed at test_compile.py:\d+"):
            f(x)
    assert f.replays == 1 and w.cpu()[0, 0].item() == 4.0  # nothing ran, nothing written
    assert f(x).item() == 256 * 256 * 5.0 and f.replays == 2
    assert metrics.metric_data("ExecuteTime")[0] == runs + 1 and rec.run_time > ran


@pytest.mark.parametrize("big", [False, True], ids=["small", "big"])
def test_a_replay_reaches_the_optimized_executable_at_its_third_run(big, monkeypatch):
    """Issue 57: replays ran the quick executable forever (the BERT step 2-3x slower
    than its optimized one). A replay goes through the graphs' one rule for a run that
    came back (graphs.run_cached), as a lazy graph's cache hit does: the optimized
    compile starts at the second run (a big graph's, a training step's: after its first)
    and runs from the third, whatever the compile's speed. Values stay CPU torch's."""
    from xlanb.execute import graphs
    if big:
        monkeypatch.setattr(graphs, "QUICK_BIG_S", 0.0)  # every quick compile counts as big
        monkeypatch.setattr(graphs, "QUICK_BIG_RUN_S", 0.0)  # (and every first run)
    xlanb.set_mode("lazy")
    n = 1031 if big else 1033  # a shape of its own: nothing in the store yet
    w_cpu = torch.linspace(-1, 1, n)
    w = w_cpu.to("xla")
    xlanb.sync()

    def step(v, w=w):
        w.mul_(0.5).add_(v)
        return (w * 2.0).tanh().sum()
    f = xlanb.compile(step, name=f"tier_{n}")
    v_cpu = torch.full((n,), 0.25)
    v = v_cpu.to("xla")
    up0 = metrics.counter_value("GraphTierUp") or 0
    seen = []
    for i in range(5):
        got = f(v)
        want = step(v_cpu, w_cpu)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
        rec = [g for g in xlanb.graphs() if g.cause == f"xlanb.compile(tier_{n})"][-1]
        seen.append((rec.quick, rec._tiering is not None))
    torch.testing.assert_close(w.cpu(), w_cpu)
    assert f.replays == 3 and f.traced_calls == 2
    # calls 1-2 traced (quick; the optimized compile started after call 1 for a big
    # graph, after call 2 for a small one), the first replay (run 3) the optimized one
    assert seen == [(True, big), (True, True), (False, True), (False, True), (False, True)]
    assert (metrics.counter_value("GraphTierUp") or 0) == up0 + 1
