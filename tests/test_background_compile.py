"""Eager mode with background compiles, runs off (``XLANB_EAGER_RUNS=0``): a new op's
executable compiles on a compile thread while Python goes on; the ops waiting on it are
recorded and run in order, through the same single-op executables, when a value is
needed or the compiles are done. (Runs of new ops compiled as one graph, the default:
tests/test_eager_runs.py.)

Compiles are held at a gate (a threading.Event) so that "still compiling" is a fact of
the test, not of timing.
"""
from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

import xlanb
from xlanb.base.session import mode_state
from xlanb.executables import background, compile as op_compile
from xlanb import config
from xlanb.runtime.jit import compiles_pending


def _wait_for(predicate, timeout: float = 120.0) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture(autouse=True)
def runs_off(monkeypatch):
    monkeypatch.setattr(config, "eager_runs", 0)


@pytest.fixture
def eager():
    xlanb.set_mode("eager")
    assert config.background_compile
    yield


@pytest.fixture
def gate(monkeypatch):
    """Background compiles wait until ``gate.set()``."""
    event = threading.Event()
    real = background._compile_off_thread

    def held(*args, **kw):
        assert event.wait(60), "test never opened the gate"
        return real(*args, **kw)
    monkeypatch.setattr(background, "_compile_off_thread", held)
    yield event
    event.set()


def test_new_op_waits_recorded_while_it_compiles_then_runs(eager, gate, count):
    a = torch.arange(35, dtype=torch.float32).reshape(5, 7)
    x = a.to("xla")
    y = (x * 3).tanh()  # new signatures: both compile in the background
    z = y.sum(1)
    assert background.compiles_in_flight()
    assert "aten::tanh" in xlanb.pending_ir(z)  # recorded, not run: Python went on
    assert count("OpCompile") >= 2
    assert xlanb.metrics.metric_data("OpCompileWaitTime") is None  # nobody waited yet
    gate.set()
    torch.testing.assert_close(z.cpu(), (a * 3).tanh().sum(1))  # waits, then runs op by op
    assert count("UncachedCompile") == 0  # no graph: the same single-op executables
    assert xlanb.pending_count() == 0  # a read in eager runs every waiting op, y's too


def test_results_are_bitwise_those_of_eager_without_background_compiles(monkeypatch):
    """The deferred ops run the same executables on the same inputs, so the values are
    exactly strict eager's, random ops included (keys are taken at dispatch)."""
    def train():
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(9, 17), nn.Dropout(0.3), nn.GELU(), nn.Linear(17, 4)).to("xla")
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        x = torch.randn(6, 9).to("xla")
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = model(x).logsumexp(1).mean()
            loss.backward()
            opt.step()
            losses.append(loss)
        return [v.item() for v in losses], [p.detach().cpu() for p in model.parameters()]

    xlanb.set_mode("eager")
    background = train()
    monkeypatch.setattr(config, "background_compile", False)
    strict = train()
    assert background[0] == strict[0]
    for p, q in zip(background[1], strict[1]):
        torch.testing.assert_close(p, q, atol=0, rtol=0)


def test_failed_compile_loses_nothing(eager, monkeypatch):
    """A compile that fails on the background thread is compiled again on the reading
    thread, so the error surfaces there; the waiting ops stay pending and readable."""
    real = op_compile.compile_lowered
    calls = []

    def broken(*args, **kwargs):
        calls.append(threading.current_thread().name)
        raise RuntimeError("XLA compile failed (injected)")
    monkeypatch.setattr(op_compile, "compile_lowered", broken)
    a = torch.linspace(-2, 2, 22).reshape(2, 11)
    x = a.to("xla")
    y = torch.sinh(x)  # one op: a second would find the compile failed and raise there
    with pytest.raises(RuntimeError, match="injected"):
        y.cpu()
    assert any(n.startswith("xlanb-compile") for n in calls)  # tried in the background
    assert threading.current_thread().name in calls  # then here
    assert "aten::sinh" in xlanb.pending_ir(y)  # still pending, nothing lost
    assert x.cpu().equal(a)  # inputs stay readable
    monkeypatch.setattr(op_compile, "compile_lowered", real)
    torch.testing.assert_close(y.cpu(), torch.sinh(a))  # the next read compiles again


def test_leaving_eager_runs_the_waiting_ops_first(eager, gate, count):
    """A lazy graph must not depend on how fast background compiles were."""
    a = torch.arange(12.0).reshape(3, 4)
    y = a.to("xla").exp2() - 1
    assert xlanb.pending_count(y) == 2
    gate.set()
    xlanb.set_mode("lazy")
    assert xlanb.pending_count(y) == 0
    assert count("UncachedCompile") == 0
    z = y * 2  # lazy from here
    assert "aten::mul" in xlanb.pending_ir(z)
    torch.testing.assert_close(z.cpu(), (a.exp2() - 1) * 2)


def test_in_place_writes_and_views_of_waiting_tensors(eager, gate):
    a = torch.arange(24.0).reshape(4, 6)
    x = a.to("xla").clone()
    row = x[1]
    row.mul_(-1.5)  # a view write into a tensor whose producer still compiles
    x.t_()
    s = x.cumsum(0)
    gate.set()
    ref = a.clone()
    ref[1].mul_(-1.5)
    ref.t_()
    torch.testing.assert_close(s.cpu(), ref.cumsum(0))
    torch.testing.assert_close(row.cpu(), ref.t()[1])


def test_background_compile_off_compiles_before_the_op_returns(eager, monkeypatch, count):
    monkeypatch.setattr(config, "background_compile", False)
    x = torch.ones(3, 5, 2).to("xla")
    y = x.atan2(x + 1)
    assert xlanb.pending_count(y) == 0  # ran at once
    assert not background.compiles_in_flight()
    assert xlanb.metrics.metric_data("OpBackgroundCompileTime") is None
    torch.testing.assert_close(y.cpu(), torch.ones(3, 5, 2).atan2(torch.full((3, 5, 2), 2.0)))


def test_sync_with_nothing_left_to_run_returns_eager_to_its_fast_path(eager, gate):
    """Ops that waited on a compile and whose results died are never run; the sync that
    finds nothing pending must still end the waiting state, or every later op would
    take the slow path (it once did: eager per-op cost went from ~20 to ~80 µs)."""
    x = torch.randn(4, 9).to("xla")
    y = x.erfc()  # new signature: waits on its compile
    assert mode_state().deferred
    del y
    gate.set()
    xlanb.sync()
    assert not mode_state().deferred
    while background.compiles_in_flight():  # y's executable, compiled though never used
        time.sleep(0.01)
    z = x.erfc()  # compiled now: runs at once
    assert xlanb.pending_count(z) == 0


def test_status_line_says_eager_ops_wait_on_compiles(eager, gate):
    pytest.importorskip("IPython")
    from xlanb.extensions import display as xd
    x = torch.arange(22, dtype=torch.float32).reshape(2, 11).to("xla")
    y = (x + 0.5).sin()  # new signatures, held at the gate
    assert xd.status_line(None).startswith("xla: eager · 2 pending ops (waiting on compiles)")
    gate.set()
    y.cpu()
    assert xd.status_line(None) == "xla: eager · 0 pending ops"


def test_a_peek_compiles_its_missing_executables_on_the_compile_threads(count, monkeypatch):
    """A first peek at a pending graph (lazy mode) needs one executable per new op
    signature; they compile side by side on the compile threads, and the graph stays
    pending."""
    a = torch.arange(26, dtype=torch.float32).reshape(2, 13)
    x = a.to("xla")
    xlanb.sync()
    y = ((x * 1.5).cos() + x).tanh().sum(0)  # four new signatures, recorded
    before = xlanb.pending_ir(y)
    torch.testing.assert_close(xlanb.peek(y), ((a * 1.5).cos() + a).tanh().sum(0))
    background = (xlanb.metrics.metric_data("OpBackgroundCompileTime") or (0,))[0]
    # each at least once: the quick tier the peek waited for (its optimized one may follow)
    assert background >= count("OpCompile") >= 4
    assert xlanb.pending_ir(y) == before  # a peek: nothing materialized
    assert _wait_for(lambda: _tier_up_compiles() == count("OpQuickCompile"))  # optimized ones
    # and until the last of them has recorded its time too (it counts its tier-up first;
    # a loaded CI machine saw its background time land after the clear below)
    assert _wait_for(lambda: not compiles_pending())
    monkeypatch.setattr(config, "background_compile", False)
    xlanb.metrics.clear()
    z = ((x * 2.5).sin() - x).exp().sum(1)
    torch.testing.assert_close(xlanb.peek(z), ((a * 2.5).sin() - a).exp().sum(1))
    assert count("OpCompile") >= 4 and xlanb.metrics.metric_data("OpBackgroundCompileTime") is None


def _tier_up_compiles() -> int:
    return (xlanb.metrics.metric_data("OpTierUpCompileTime") or (0,))[0]


def test_a_peek_waits_for_quick_executables_only_and_optimized_ones_replace_them(
        count, monkeypatch):
    """A first look compiles its missing executables with LLVM's optimizations off (what
    someone waits for), and the optimized ones after, in the background: the look does
    not wait for them. Each takes its quick one's place at that one's third use, not
    when it is ready: an op's values never depend on how quick a compile was."""
    built = {}  # id(executable) -> "quick" or "optimized"
    tier_ups = threading.Event()
    real = background._compile_off_thread

    def spy(build, **how):
        if how.get("metric") == "OpTierUpCompileTime":
            assert tier_ups.wait(60), "test never let the optimized compiles run"
        exe = real(build, **how)
        built[id(exe)] = "quick" if build.tier == "op_quick" else "optimized"
        return exe
    monkeypatch.setattr(background, "_compile_off_thread", spy)
    a = torch.arange(51, dtype=torch.float32).reshape(3, 17)  # shapes no other test uses
    x = a.to("xla")
    xlanb.sync()
    y = ((x * 1.75).cos() + x).tanh().sum(0)  # new signatures, recorded
    ref = ((a * 1.75).cos() + a).tanh().sum(0)
    before = xlanb.pending_ir(y)
    torch.testing.assert_close(xlanb.peek(y), ref)  # returns with the optimized ones held
    n = count("OpCompile")
    assert n >= 4 and count("OpQuickCompile") == n and count("OpTierUp") == 0
    assert xlanb.pending_ir(y) == before
    tier_ups.set()
    assert _wait_for(lambda: _tier_up_compiles() == n)
    assert count("OpTierUp") == 0  # ready, and still waiting for the third use
    from xlanb.executables import resident

    def tiers():
        return {built[id(i.exe)] for i in resident.resident.values()
                if i.name in ("aten::mul.Tensor", "aten::cos", "aten::add.Tensor", "aten::tanh")
                and i.exe is not None and id(i.exe) in built}
    xlanb.set_mode("eager")
    z = ((x * 1.75).cos() + x).tanh().sum(0)  # the same signatures: their second use
    torch.testing.assert_close(z.cpu(), ref)
    assert tiers() == {"quick"} and count("OpTierUp") == 0
    z = ((x * 1.75).cos() + x).tanh().sum(0)  # the third: the optimized ones
    torch.testing.assert_close(z.cpu(), ref)
    assert tiers() == {"optimized"} and count("OpTierUp") == n
    assert count("OpCompile") == n  # the tier-up is not a new signature
    torch.testing.assert_close(y.cpu(), ref)  # and the lazy graph still agrees


def test_quick_peeks_off_compiles_optimized_executables_only(count, monkeypatch):
    monkeypatch.setattr(config, "quick_peeks", False)
    a = torch.arange(57, dtype=torch.float32).reshape(3, 19)
    x = a.to("xla")
    xlanb.sync()
    y = (x * 2.25).exp()
    torch.testing.assert_close(xlanb.peek(y), (a * 2.25).exp())
    assert count("OpCompile") >= 2 and count("OpQuickCompile") == 0


def test_compile_threads_run_urgent_work_before_later_work():
    """What someone waits for runs first, even when a compile nobody waits for was asked
    for earlier."""
    from xlanb.runtime import jit
    import os
    release = threading.Event()
    order = []
    n = os.cpu_count() or 1
    busy = [jit.background(release.wait, 60) for _ in range(n)]  # every thread occupied
    later = jit.background(order.append, "later", later=True)
    urgent = [jit.background(order.append, f"urgent{i}") for i in range(3)]
    release.set()
    for f in busy + urgent + [later]:
        f.result(60)
    assert order == ["urgent0", "urgent1", "urgent2", "later"]


def test_later_work_waits_while_a_value_is_awaited():
    """While a look waits for its value (``later_held``), compiles nobody waits for stay
    queued, and what someone asks for meanwhile still runs; they run once it ends."""
    from xlanb.runtime import jit
    order = []
    with jit.later_held():
        later = jit.background(order.append, "later", later=True)
        urgent = jit.background(order.append, "urgent")
        urgent.result(60)
        time.sleep(0.2)  # a free thread had time to take the later task, had it been let
        assert order == ["urgent"] and not later.done()
    later.result(60)
    assert order == ["urgent", "later"]


def test_a_peek_holds_its_optimized_compiles_until_it_has_its_value(count, monkeypatch):
    from xlanb.runtime import jit
    during = []
    real = background._compile_off_thread

    def spy(build, **how):
        if how.get("metric") == "OpTierUpCompileTime":
            during.append(jit._held.holders)
        return real(build, **how)
    monkeypatch.setattr(background, "_compile_off_thread", spy)
    a = torch.arange(69, dtype=torch.float32).reshape(3, 23)  # shapes no other test uses
    x = a.to("xla")
    xlanb.sync()
    y = ((x * 0.75).sin() * x).exp().sum(1)
    torch.testing.assert_close(xlanb.peek(y), ((a * 0.75).sin() * a).exp().sum(1))
    n = count("OpQuickCompile")
    assert n >= 4
    assert _wait_for(lambda: _tier_up_compiles() == n)
    assert len(during) == n and not any(during)  # none started while the look waited
