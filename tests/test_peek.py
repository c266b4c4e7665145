"""Looking at a pending tensor never cuts the graph.

``xlanb.peek`` computes a value op by op through the single-op cache and leaves the pending
graph exactly as it was: the next sync compiles (or finds) the same graph it would have
without the peek. repr/str/print/format peek by default; ``xlanb.config.inspect`` switches
that to "sync" or "meta". ``.cpu()``/``.item()``/``.tolist()`` materialize, except while a
debugger is stopped in the process, where they peek too.

Compile behaviour is asserted through metrics counters. The graph cache lives for the whole
process, so every lazy test here uses shapes no other test uses: its first sync is a real
compile.
"""
from __future__ import annotations

import bdb
import contextlib
import sys
import textwrap

import pytest
import torch

import xlanb
from conftest import counter, last_json_line, run_python


def _ops_pending() -> int:
    return xlanb.pending_count()


@contextlib.contextmanager
def _debugger():
    """A real (quiet) bdb debugger tracing this thread, as pdb installs one."""
    class Quiet(bdb.Bdb):
        def user_call(self, frame, args):
            pass

        def user_line(self, frame):
            pass

        def user_return(self, frame, value):
            pass

        def user_exception(self, frame, info):
            pass

    dbg = Quiet()
    dbg.reset()
    old = sys.gettrace()
    sys.settrace(dbg.trace_dispatch)
    try:
        yield dbg
    finally:
        sys.settrace(old)


def _chain(dims, seed=0):
    """Linear layers dims[0] -> dims[1] -> ... on the xla device, materialized."""
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(a, b) for a, b in zip(dims, dims[1:])]
    xla = [torch.nn.Linear(a, b).to("xla") for a, b in zip(dims, dims[1:])]
    for c, x in zip(layers, xla):
        x.load_state_dict(c.state_dict())
    xlanb.sync()
    return layers, xla


# ---------------------------------------------------------------------------------------
# peek


def test_peek_matches_cpu_in_every_mode(mode):
    a = torch.randn(5, 7)
    b = torch.randn(7, 3)
    x, y = a.to("xla"), b.to("xla")
    z = torch.tanh(x @ y) * 2 + 1
    want = torch.tanh(a @ b) * 2 + 1
    got = xlanb.peek(z)
    assert got.device.type == "cpu" and not isinstance(got, xlanb.XlaTensor)
    assert got.dtype == torch.float32 and got.shape == (5, 3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if mode != "eager":
        assert counter("UncachedCompile") == 0
        assert _ops_pending() > 0, "peek must not materialize the pending work"
    xlanb.sync()
    torch.testing.assert_close(z.cpu(), got)  # the peeked value is the synced value


def test_peek_keeps_int64_and_float64():
    i = torch.arange(5, dtype=torch.int64).to("xla") * (2**40)
    d = torch.linspace(0, 1, 5, dtype=torch.float64).to("xla") / 3
    pi, pd = xlanb.peek(i), xlanb.peek(d)
    assert pi.dtype == torch.int64 and pd.dtype == torch.float64
    torch.testing.assert_close(pi, torch.arange(5, dtype=torch.int64) * (2**40))
    torch.testing.assert_close(pd, torch.linspace(0, 1, 5, dtype=torch.float64) / 3)


def test_peek_rejects_non_xla_tensors():
    with pytest.raises(TypeError, match="xla"):
        xlanb.peek(torch.ones(3))
    with pytest.raises(TypeError):
        xlanb.peek([1, 2, 3])


def test_peek_does_not_change_what_sync_compiles():
    """A peek leaves the pending IR untouched; the next sync compiles exactly the graph it
    would have compiled without the peek, and hits the same cache entry."""
    def step(peek: bool):
        x = torch.ones(3, 11).to("xla")
        h = torch.relu(x * 3 - 1)
        out = (h @ torch.ones(11, 4).to("xla")).sum(0)
        if peek:
            before = xlanb.pending_ir()
            torch.testing.assert_close(xlanb.peek(h), torch.full((3, 11), 2.0))
            assert xlanb.pending_ir() == before
        xlanb.sync()
        return out

    # With a peek first: the graph of the whole step compiles once...
    step(peek=True)
    assert counter("UncachedCompile") == 1 and counter("CachedCompile") == 0
    assert counter("OpCompile") >= 1  # the peek ran op by op
    first = xlanb.graphs()[-1]
    n_graphs = len(xlanb.graphs())
    # ...and the same step without a peek is a cache hit on that same graph.
    out = step(peek=False)
    assert counter("UncachedCompile") == 1 and counter("CachedCompile") == 1
    assert len(xlanb.graphs()) == n_graphs and xlanb.graphs()[-1] is first
    assert first.hits == 1
    # A peek of a different tensor in the same step still hits the same entry.
    step(peek=True)
    assert counter("UncachedCompile") == 1 and counter("CachedCompile") == 2
    assert first.hits == 2
    torch.testing.assert_close(out.cpu(), torch.full((4,), 66.0))


def test_peek_then_sync_same_hash_as_without_peek():
    """Two fresh structures: one compiled without a peek, one with. Both graphs come from
    the same program text, so their stable hashes are equal."""
    def program(n, peek):
        x = torch.arange(float(n)).to("xla")
        y = torch.sin(x) * x
        z = y.cumsum(0) + 2
        if peek:
            xlanb.peek(y)
            xlanb.peek(z)
        xlanb.sync()
        return xlanb.graphs()[-1]

    g_plain = program(13, peek=False)
    assert counter("UncachedCompile") == 1
    # Same structure with peeks: no new compile, same entry.
    assert program(13, peek=True) is g_plain
    assert counter("UncachedCompile") == 1 and counter("CachedCompile") == 1
    # A shape never seen with a peek, then without: same hash either way.
    g_peeked = program(17, peek=True)
    assert counter("UncachedCompile") == 2
    assert program(17, peek=False) is g_peeked
    assert counter("CachedCompile") == 2
    assert g_peeked.n_nodes == g_plain.n_nodes


def test_seed003_peek_mid_step_compiles_the_step_once():
    """seeds/003: four Linear layers, inspect outputs mid-step, sync; three steps with the
    inspected tensors moving. One whole-graph compile, peeks equal the synced values, and
    only single-op compiles for signatures not seen before (none after the first step)."""
    cpu, (l1, l2, l3, l4) = _chain([10, 30, 20, 10, 1])
    xlanb.metrics.clear()
    peek_plan = [("o1", "o2", "o4"), ("o2", "o3"), ("o3", "o1")]
    op_compiles_per_step = []
    for step, names in enumerate(peek_plan):
        torch.manual_seed(100 + step)
        inp_cpu = torch.randn(2, 10)
        inp = inp_cpu.to("xla")
        before = counter("OpCompile")
        outs = {}
        peeked = {}
        outs["o1"] = l1(inp)
        outs["o2"] = l2(outs["o1"])
        for n in names:  # a breakpoint here: look at what exists so far
            if n in outs:
                peeked[n] = xlanb.peek(outs[n])
        outs["o3"] = l3(outs["o2"])
        outs["o4"] = l4(outs["o3"])
        for n in names:  # and at the end of the step
            if n not in peeked:
                peeked[n] = xlanb.peek(outs[n])
        op_compiles_per_step.append(counter("OpCompile") - before)
        assert counter("UncachedCompile") == (0 if step == 0 else 1)
        xlanb.sync()
        assert counter("UncachedCompile") == 1, f"step {step} recompiled the step graph"
        # every peeked value equals the value after sync, and CPU torch's
        want = {"o1": cpu[0](inp_cpu)}
        want["o2"] = cpu[1](want["o1"])
        want["o3"] = cpu[2](want["o2"])
        want["o4"] = cpu[3](want["o3"])
        for n, v in peeked.items():
            torch.testing.assert_close(v, outs[n].cpu(), atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(v, want[n].detach(), atol=1e-5, rtol=1e-5)
    assert counter("UncachedCompile") == 1
    assert counter("CachedCompile") == 2
    assert op_compiles_per_step[0] > 0
    assert op_compiles_per_step[1:] == [0, 0], op_compiles_per_step


@pytest.mark.parametrize("first_look", ["op by op", "prefix graph"])
def test_peek_keeps_intermediates_until_sync(first_look, monkeypatch):
    """seeds/003's duplicate execution: peeking output3 after output4 recomputes nothing,
    whether the first look ran op by op or as one prefix graph (executables/prefix.py)."""
    from xlanb.executables import prefix
    monkeypatch.setattr(prefix, "MIN_MISSING", 10 ** 6 if first_look == "op by op" else 1)
    dims = [9, 31, 21, 9, 1] if first_look == "op by op" else [8, 33, 23, 7, 1]
    _, (l1, l2, l3, l4) = _chain(dims)  # shapes no other test uses: nothing compiled yet
    inp = torch.randn(2, dims[0]).to("xla")
    o3 = l3(l2(l1(inp)))
    o4 = l4(o3)
    xlanb.metrics.clear()
    v4 = xlanb.peek(o4)

    def work():
        return counter("OpCompile"), counter("OpCacheHit"), counter("PeekCompile")
    done = work()
    if first_look == "op by op":
        assert done[0] + done[1] == 8 and done[2] == 0  # t + addmm per layer, each run once
    else:
        assert done == (0, 0, 1)  # one graph: every op's value, the single ops left for later
    v3 = xlanb.peek(o3)
    assert work() == done
    # peeking again, or an input, costs nothing either
    xlanb.peek(o4)
    assert work() == done
    # new work on top of a peeked value only runs the new ops
    o5 = o4 * 2
    v5 = xlanb.peek(o5)
    assert sum(work()[:2]) == sum(done[:2]) + 1 and work()[2] == done[2]
    torch.testing.assert_close(v5, v4 * 2)
    xlanb.sync()
    torch.testing.assert_close(o3.cpu(), v3, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(o4.cpu(), v4, atol=1e-6, rtol=1e-5)
    assert counter("UncachedCompile") == 1


def test_peek_values_are_forgotten_at_sync():
    """After a sync the kept intermediates are gone: new pending work over the same shapes
    recomputes (through the single-op cache, without compiling)."""
    x = torch.ones(6, 5).to("xla")
    y = (x + 1) * 3
    xlanb.peek(y)
    xlanb.sync()
    xlanb.metrics.clear()
    y2 = (x + 1) * 3
    torch.testing.assert_close(xlanb.peek(y2), torch.full((6, 5), 6.0))
    assert counter("OpCompile") == 0 and counter("OpCacheHit") == 2
    # a materialized tensor: its data, no op at all
    xlanb.metrics.clear()
    torch.testing.assert_close(xlanb.peek(y), torch.full((6, 5), 6.0))
    assert counter("OpCompile") == 0 and counter("OpCacheHit") == 0


def test_peek_views_inplace_multi_output_and_random():
    torch.manual_seed(3)
    a = torch.randn(4, 6)
    x = a.to("xla")
    row = x[1]
    x.mul_(2)
    vals, idx = torch.max(x, dim=1)
    r = torch.rand(3, 3, device="xla")
    torch.testing.assert_close(xlanb.peek(row), a[1] * 2)
    torch.testing.assert_close(xlanb.peek(x), a * 2)
    torch.testing.assert_close(xlanb.peek(vals), (a * 2).max(1).values)
    assert torch.equal(xlanb.peek(idx), (a * 2).max(1).indices)
    pr = xlanb.peek(r)
    assert counter("UncachedCompile") == 0
    xlanb.sync()
    # random values: the peek and the sync drew the same numbers
    torch.testing.assert_close(r.cpu(), pr, atol=0, rtol=0)
    torch.testing.assert_close(row.cpu(), a[1] * 2)


def test_peek_in_a_training_step_leaves_the_step_graph_alone():
    """Peek the loss and a gradient between backward() and the optimizer step: the step
    graph is the one the same step compiles without the peeks."""
    def step(peek: bool):
        torch.manual_seed(0)
        m = torch.nn.Linear(8, 5).to("xla")
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        x = torch.randn(6, 8).to("xla")
        xlanb.sync()
        before = counter("UncachedCompile"), counter("CachedCompile")
        loss = m(x).pow(2).mean()
        loss.backward()
        seen = None
        if peek:
            seen = (xlanb.peek(loss), xlanb.peek(m.weight.grad), repr(loss))
        opt.step()
        opt.zero_grad()
        xlanb.sync()
        after = counter("UncachedCompile"), counter("CachedCompile")
        return (after[0] - before[0], after[1] - before[1]), loss, seen, m

    compiled, loss, (p_loss, p_grad, text), _ = step(peek=True)
    assert compiled == (1, 0)
    torch.testing.assert_close(loss.cpu(), p_loss, atol=1e-6, rtol=1e-5)
    assert p_grad.shape == (5, 8) and "grad_fn=<MeanBackward0>" in text
    assert step(peek=False)[0] == (0, 1)  # same graph, a cache hit
    assert step(peek=True)[0] == (0, 1)


# ---------------------------------------------------------------------------------------
# repr / str / print / format


@pytest.fixture
def inspect_setting():
    old = xlanb.config.inspect
    yield
    xlanb.config.inspect = old


def _pending_tensor():
    a = torch.arange(12.0).reshape(3, 4)
    return a.to("xla") * 2 + 1, a * 2 + 1


def test_display_peeks_by_default(capsys):
    assert xlanb.config.inspect == "peek"
    t, want = _pending_tensor()
    n_pending = _ops_pending()
    ir = xlanb.pending_ir()
    texts = [repr(t), str(t), f"{t}", format(t), "{}".format(t)]
    print(t)
    texts.append(capsys.readouterr().out)
    for s in texts:
        assert "23." in s and "device='xla:0'" in s, s
    assert counter("UncachedCompile") == 0 and counter("CachedCompile") == 0
    assert _ops_pending() == n_pending and xlanb.pending_ir() == ir
    xlanb.sync()
    torch.testing.assert_close(t.cpu(), want)


def test_format_spec_of_pending_scalar_peeks():
    """f"{loss:.4f}" is display too: it must not cut the graph."""
    t, _ = _pending_tensor()
    s = t.sum()
    assert f"{s:.2f}" == "144.00"
    assert counter("UncachedCompile") == 0
    assert _ops_pending() > 0


def test_repr_of_grad_tensor_peeks():
    w = torch.nn.Parameter(torch.ones(3).to("xla"))
    y = (w * 4).sum()
    s = repr(y)
    assert "12." in s and "grad_fn=<" in s
    assert counter("UncachedCompile") == 0


def test_inspect_sync_makes_repr_sync(inspect_setting):
    t, _ = _pending_tensor()
    t = t - 0.5  # a structure no other test syncs
    xlanb.config.inspect = "sync"
    s = repr(t)
    assert "22.5" in s
    assert counter("UncachedCompile") == 1
    assert _ops_pending() == 0
    g = xlanb.graphs()[-1]
    assert "repr" in g.cause and g.src.file.endswith("test_peek.py")


def test_inspect_meta_shows_no_values_and_computes_nothing(inspect_setting):
    t, _ = _pending_tensor()
    n = xlanb.pending_count(t)
    xlanb.config.inspect = "meta"
    s = repr(t)
    assert "(3, 4)" in s and "float32" in s
    assert f"{n} pending ops" in s, s
    assert "23." not in s
    assert counter("OpCompile") == 0 and counter("OpCacheHit") == 0
    assert counter("UncachedCompile") == 0
    assert str(t) == s


def test_inspect_rejects_bad_values(inspect_setting):
    with pytest.raises(ValueError, match="peek.*sync.*meta"):
        xlanb.config.inspect = "values"
    assert xlanb.config.inspect == "peek"
    for v in ("peek", "sync", "meta"):
        xlanb.config.inspect = v
        assert xlanb.config.inspect == v


# One child interpreter serves both tests that need a fresh process (a slow start).
_CHILD = textwrap.dedent("""
    import io, json, pdb, torch, xlanb
    c = lambda n: xlanb.metrics.counter_value(n) or 0
    # XLANB_INSPECT=meta from the environment
    env_inspect = xlanb.config.inspect
    t = torch.ones(2, 3, device="xla") * 5
    meta_repr = repr(t)
    meta_compiles = c("OpCompile") + c("UncachedCompile")
    xlanb.config.inspect = "peek"
    # a real pdb session: `p` and .item() at the prompt
    x = torch.arange(10.0).to("xla")
    y = (x * 2 + 1).sum()
    cmds = io.StringIO("p y.item()\\np y\\np c('UncachedCompile')\\nc\\n")
    out = io.StringIO()
    pdb.Pdb(stdin=cmds, stdout=out, nosigint=True, readrc=False).set_trace()
    during = c("UncachedCompile")
    xlanb.sync()
    print(json.dumps({"inspect": env_inspect, "repr": meta_repr, "compiles": meta_compiles,
                      "pdb": out.getvalue(), "during": during,
                      "after": c("UncachedCompile"), "value": y.item()}))
""")


@pytest.fixture(scope="module")
def child_result():
    return last_json_line(run_python(_CHILD, env={"XLANB_INSPECT": "meta"}))


def test_inspect_from_environment(child_result):
    assert child_result["inspect"] == "meta"
    assert "pending ops" in child_result["repr"] and "5." not in child_result["repr"]
    assert child_result["compiles"] == 0


def test_real_pdb_session_peeks(child_result):
    """`p` and `.item()` at a pdb prompt in a real script: no whole-graph compile until the
    script's own sync, which compiles the graph once."""
    got = child_result
    assert "100.0" in got["pdb"], got["pdb"]
    assert "tensor(100., device='xla:0')" in got["pdb"], got["pdb"]
    assert got["during"] == 0
    assert got["after"] == 1
    assert got["value"] == 100.0


# ---------------------------------------------------------------------------------------
# .cpu() / .item() / .tolist(): materialize, except under a debugger


def test_item_cpu_tolist_materialize_with_cause():
    x = torch.arange(7.0).to("xla")
    s = (x * 3).sum()
    line = sys._getframe().f_lineno + 1
    assert s.item() == 63.0
    assert counter("UncachedCompile") == 1 and _ops_pending() == 0
    g = xlanb.graphs()[-1]
    assert g.cause == "value needed by .item()"
    assert g.src.short.startswith(f"test_peek.py:{line} "), g.src

    y = torch.cos(x) - 7
    assert y.tolist() == pytest.approx((torch.cos(torch.arange(7.0)) - 7).tolist())
    assert counter("UncachedCompile") == 2
    assert ".tolist()" in xlanb.graphs()[-1].cause

    z = torch.sin(x) / 9
    torch.testing.assert_close(z.cpu(), torch.sin(torch.arange(7.0)) / 9)
    assert counter("UncachedCompile") == 3
    assert ".cpu()" in xlanb.graphs()[-1].cause


def test_bool_materializes_with_value_needed_cause():
    x = torch.arange(5.0).to("xla") + 0.25
    if (x > 0).all():
        pass
    assert counter("UncachedCompile") == 1
    assert xlanb.graphs()[-1].cause.startswith("value needed")


class _Prompt(bdb.Bdb):
    """Runs code the way pdb runs a command typed at its prompt: inside interaction()."""

    def interaction(self, fn):
        return fn()


def _at_prompt(fn):
    return _Prompt().interaction(fn)


def test_debugger_active_means_stopped_at_a_prompt():
    assert not xlanb.debugger_active()
    assert _at_prompt(xlanb.debugger_active)
    # Tracing alone (a breakpoint set further down) is not a stop: the program's own
    # .item() calls keep their meaning until the debugger actually stops.
    with _debugger():
        assert not xlanb.debugger_active()
    assert not xlanb.debugger_active()


def test_values_peek_while_a_debugger_is_active():
    a = torch.randn(4, 5)
    x = a.to("xla")
    y = torch.exp(x) - x.mean()
    s = y.sum()
    ir = xlanb.pending_ir()
    item, lst, host, host2, text = _at_prompt(
        lambda: (s.item(), y.tolist(), y.cpu(), y.to("cpu"), repr(y)))
    want = torch.exp(a) - a.mean()
    assert counter("UncachedCompile") == 0 and counter("CachedCompile") == 0
    assert xlanb.pending_ir() == ir
    assert item == pytest.approx(want.sum().item(), rel=1e-5)
    torch.testing.assert_close(torch.tensor(lst), want)
    torch.testing.assert_close(host, want)
    torch.testing.assert_close(host2, want)
    assert "device='xla:0'" in text
    # after the debugger is gone, .item() syncs again, once
    assert s.item() == pytest.approx(item, rel=1e-6)
    assert counter("UncachedCompile") == 1
    torch.testing.assert_close(y.cpu(), host, atol=1e-6, rtol=1e-5)


def test_a_first_look_missing_many_executables_compiles_its_prefix_once():
    """A first look that lacks many single-op executables (a fresh process looking into a
    model) runs its prefix as one quickly compiled graph: the pending graph is untouched
    and no graph compile is counted. The single ops it lacked are lowered and compiled
    while the next sync's graph compiles, so the next look runs op by op."""
    from xlanb.executables import prefix
    torch.manual_seed(3)
    dims = [7, 29, 19, 11, 5, 3]  # shapes no other test uses
    cpu, xla = _chain(dims, seed=3)
    a = torch.randn(4, 7)

    def forward(layers, x):
        for layer in layers:
            x = torch.tanh(layer(x))
        return x
    inp = a.to("xla")
    out = forward(xla, inp)
    before = xlanb.pending_ir(out)
    missing = len(prefix.missing_ops(xlanb_plan(out)))
    assert missing >= prefix.MIN_MISSING
    xlanb.metrics.clear()
    want = forward(cpu, a).detach()
    torch.testing.assert_close(xlanb.peek(out), want)
    assert counter("PeekCompile") == 1 and counter("OpCompile") == 0
    assert counter("UncachedCompile") == 0 and xlanb.pending_ir(out) == before
    torch.testing.assert_close(out.cpu(), want)  # the sync: one graph, as without the look
    assert counter("UncachedCompile") == 1
    # lowered and started while it compiled and ran; the rest wait for the next graph (a
    # quick compile can end before all are lowered)
    from xlanb.executables import background
    assert counter("OpCompile") + len(background._lower_soon) == missing
    again = forward(xla, inp)
    torch.testing.assert_close(xlanb.peek(again), want)
    assert counter("PeekCompile") == 1 and counter("OpCompile") == missing  # op by op, cached


def test_a_failed_prefix_compile_falls_back_to_op_by_op(monkeypatch):
    from xlanb.executables import compile as op_compile, prefix

    real = op_compile.compile_lowered

    def refuse(lowered, **kwargs):  # the one compile call: refuse the prefix's only
        if kwargs.get("metric") == "PeekCompileTime":
            raise RuntimeError("prefix compile refused")
        return real(lowered, **kwargs)
    monkeypatch.setattr(op_compile, "compile_lowered", refuse)
    monkeypatch.setattr(prefix, "MIN_MISSING", 1)
    cpu, xla = _chain([5, 37, 13, 2], seed=4)
    a = torch.randn(3, 5)
    out = xla[2](xla[1](xla[0](a.to("xla"))))
    xlanb.metrics.clear()
    torch.testing.assert_close(xlanb.peek(out), cpu[2](cpu[1](cpu[0](a))).detach())
    assert counter("PeekCompile") == 0 and counter("OpCompile") > 0
    assert counter("PeekCompileFallback") == 1


def xlanb_plan(t):
    """The plan a look at ``t`` runs (what peek_node builds)."""
    from xlanb.ir.nodes import plan_graph
    from xlanb.values.peeks import peek_values
    from xlanb.modes.record import value_node
    return plan_graph([value_node(t)], known=peek_values)


def test_ops_a_look_left_are_forgotten_once_compiled_in_opbyop_mode(monkeypatch):
    """In opbyop mode no graph compile drains the ops a first look left: the op-by-op
    sync compiles them itself, and the next look's queue keeps only what still lacks an
    executable."""
    from xlanb.executables import background
    from xlanb.executables import prefix
    monkeypatch.setattr(prefix, "MIN_MISSING", 1)
    with xlanb.mode("opbyop"):
        _, xla = _chain([6, 41, 17, 3], seed=5)
        out = xla[2](xla[1](xla[0](torch.randn(2, 6).to("xla"))))
        xlanb.peek(out)
        first = list(background._lower_soon)
        assert first and all(i.exe is None for i in first)
        out.cpu()  # the op-by-op sync compiles them
        _, xla2 = _chain([6, 43, 3], seed=6)
        out2 = xla2[1](xla2[0](torch.randn(2, 6).to("xla")))
        xlanb.peek(out2)
        assert not any(i in background._lower_soon for i in first)
        assert background._lower_soon


def test_a_look_that_lowers_a_decomposition_first_gives_its_value():
    """A look may be the first to lower an op, and a decomposition's torch ops reach
    xlanb through ``__torch_dispatch__``: repr and ``xlanb.peek`` must not look with it
    turned off (``torch.rad2deg``'s ``self * c`` failed as aten::mul.out on the xla
    backend; PyTorch's test_reference_numerics formats its small inputs)."""
    code = textwrap.dedent("""
        import json, torch, xlanb
        out = {}
        for i, mode in enumerate(("eager", "lazy", "opbyop")):
            xlanb.set_mode(mode)
            for look in ("repr", "peek"):
                # a length of its own: every op is new to the process
                x = torch.tensor([0.5, -1.0, 2.0] + [0.0] * i).to("xla")
                a = torch.deg2rad(x) if look == "repr" else torch.rad2deg(x)
                text = repr(a) if look == "repr" else str(xlanb.peek(a))
                out[mode + " " + look] = [text, a.cpu().tolist()[:3]]
        print(json.dumps(out))
    """)
    got = last_json_line(run_python(code, env={"XLANB_STORE_DIR": ""}))
    for key, (text, values) in got.items():
        want = torch.deg2rad(torch.tensor([0.5, -1.0, 2.0])) if "repr" in key else \
            torch.rad2deg(torch.tensor([0.5, -1.0, 2.0]))
        assert str(round(float(want[2]), 4)) in text, (key, text)
        torch.testing.assert_close(torch.tensor(values), want)
