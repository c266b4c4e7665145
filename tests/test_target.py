"""Compiling for a TPU target with the real TPU compiler (libtpu, no TPU): xlanb's
``compile_for`` report held against JAX's own ahead-of-time compile of the same math for
the same topology, the compiler's out-of-memory as an answer, a sharded graph's
collectives by line, background compiles under ``xlanb.target``, and that nothing runs.

Each TPU compile takes seconds on a 2-core machine, so the graphs are small and few.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest
import torch

import xlanb
from xlanb.base import metrics
from xlanb.executables.target import parse_hbm_oom
from xlanb.graph.layouts import entry_layouts
from xlanb.runtime import libtpu, targets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:xlanb. compiles too frequent")]

# what must not move while compile_for works: the CPU's compiles and runs
_CPU_COUNTERS = ("UncachedCompile", "CachedCompile", "OpCompile", "OpCacheHit")
_CPU_METRICS = ("CompileTime", "ExecuteTime", "OpCompileTime", "LowerTime")


def _cpu_state() -> tuple:
    return (tuple(metrics.counter_value(n) for n in _CPU_COUNTERS),
            tuple((metrics.metric_data(n) or (0,))[0] for n in _CPU_METRICS),
            len(xlanb.graphs()), xlanb.pending_count(), xlanb.pending_ir())


def _jax_reference(fn, specs, topology: str):
    """JAX's own ahead-of-time compile of ``fn`` for one chip of ``topology``."""
    dev = xlanb.Target(topology).devices[0]
    s = jax.sharding.SingleDeviceSharding(dev)
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=s) for shape, dtype in specs]
    with jax.enable_x64(True):
        return jax.jit(fn).lower(*args).compile()


def test_report_matches_jax_aot_compile_and_runs_nothing():
    # three arguments whose TPU tiles pad differently: a 1000-wide bf16 matrix (1000 -> 1024),
    # a small 3-D f32 array (tiles of 4 x 128) and int8 (tiles of 8 x 128 in 4-row groups)
    a = torch.randn(1000, 1000).bfloat16().to("xla")
    b = torch.randn(1000, 1000).bfloat16().to("xla")
    c = torch.randn(3, 5, 7).to("xla")
    d = torch.randint(-5, 5, (17, 33), dtype=torch.int8).to("xla")
    xlanb.sync()
    y = (a @ b).relu().sum() + c.sum() + d.float().sum()
    before = _cpu_state()
    r = xlanb.compile_for("v5e:1x1", y)
    assert _cpu_state() == before  # nothing compiled or ran here, the pending graph intact

    ref = _jax_reference(
        lambda a, b, c, d: (jnp.maximum(a @ b, 0).sum() + c.sum() + d.astype(jnp.float32).sum()),
        [((1000, 1000), jnp.bfloat16), ((1000, 1000), jnp.bfloat16), ((3, 5, 7), jnp.float32),
         ((17, 33), jnp.int8)], "v5e:1x1")
    ma = ref.memory_analysis()
    assert r.error is None and r.fits is True
    assert r.target.name == "v5e:1x1" and r.target.chip == "TPU v5 lite"
    assert r.target.num_devices == 1 and r.target.hbm_bytes == 16 << 30
    assert r.memory.argument_bytes == ma.argument_size_in_bytes
    flops = ref.cost_analysis()["flops"]
    assert abs(r.cost.flops - flops) <= 0.05 * flops
    assert r.cost.compute_seconds == pytest.approx(r.cost.flops / 197e12)
    assert r.cost.bound in r.roofline

    # the padding rows agree with the layouts in the compiled modules (xlanb's and JAX's)
    args = [p for p in r.padding if p.kind == "argument"]
    assert sum(p.padded_bytes for p in args) == r.memory.argument_bytes
    params, _ = entry_layouts(ref.as_text())
    ref_layouts = sorted((a.type, a.layout) for arrays in params for a in arrays)
    assert sorted((p.type, p.layout) for p in args) == ref_layouts
    wide = [p for p in args if p.type == "bf16[1000,1000]"]
    assert len(wide) == 2 and all(p.padded_bytes == 1000 * 1024 * 2 for p in wide)
    assert all(p.logical_bytes == 1000 * 1000 * 2 for p in wide)
    assert all(p.source.endswith("test_target.py:" + str(_line_of("a = torch.randn(1000")))
               or p.source.endswith("test_target.py:" + str(_line_of("b = torch.randn(1000")))
               for p in wide)
    small = next(p for p in args if p.type == "f32[3,5,7]")
    assert small.layout in r.hlo() and small.padded_bytes > small.logical_bytes
    assert "entry_computation_layout" in r.hlo() and "T(8,128)" in r.hlo()
    assert r.compile_seconds > 0 and "fits" in r.summary_line()

    # and the sync that follows is the CPU's, with torch's value
    want = ((a.cpu().float() @ b.cpu().float()).bfloat16().relu().sum().float()
            + c.cpu().sum() + d.cpu().float().sum())
    assert float(y) == pytest.approx(float(want), rel=2e-2)


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def _huge_step_reports(*targets_: str) -> list:
    """Reports of a step of three 9.3 GiB arrays, made pending and dropped unrun (if it
    ever ran here it would take 28 GiB of this machine's memory)."""
    z = torch.zeros(50000, 50000, device="xla")  # pending: nothing is allocated here
    w = torch.ones(50000, 50000, device="xla")
    y = z.exp() @ w.T
    try:
        before = _cpu_state()
        out = [xlanb.compile_for(t, y, z, w) for t in targets_]
        assert _cpu_state() == before
        return out
    finally:
        del y, z, w  # dropped, so no later sync runs them


def test_out_of_memory_is_an_answer_not_an_exception():
    r, big = _huge_step_reports("v5e:1x1", "v5p:1x1x1")
    assert xlanb.pending_count() == 0
    assert r.fits is False and "CompileTimeHbmOom" in r.error, r.error
    need, available = parse_hbm_oom(r.error)
    assert r.memory.peak_bytes >= need > available and available <= r.target.hbm_bytes
    assert "DOES NOT FIT" in r.summary_line()
    # issue 46 item 13: the buffers come from the lowering (no executable), by line
    outs = [row for row in r.padding if row.kind == "output"]
    assert len(outs) == 3 and all(row.type == "f32[50000,50000]" for row in outs), r.padding
    assert all(row.source.startswith(os.path.join("tests", "test_target.py")) or
               "test_target.py" in row.source for row in outs), outs
    assert r.memory.output_bytes == 3 * 50000 * 50000 * 4 and r.memory.argument_bytes == 0
    assert r.memory.temp_bytes == max(0, r.memory.peak_bytes - r.memory.output_bytes)
    assert "buffers (from the lowering; largest first)" in str(r), str(r)
    # the same step compiles for a chip with more HBM
    assert big.error is None and big.fits is True and big.memory.peak_bytes >= 3 * 10e9
    assert big.target.hbm_bytes == 95 << 30


def test_memory_limit_target_refuses_before_the_cpu_run():
    before = metrics.counter_value("UncachedCompile") or 0

    def refused():
        x = torch.zeros(48000, 48000, device="xla")
        y = x + 1
        pending = xlanb.pending_count()
        try:
            with pytest.raises(xlanb.DeviceMemoryError) as e:
                xlanb.sync()
            assert xlanb.pending_count() == pending  # nothing ran
            return str(e.value)
        finally:
            del x, y  # dropped unrun

    with xlanb.target("v5e:1x1"), xlanb.memory_limit("target"):
        message = refused()
    assert "v5e:1x1" in message and "HBM" in message and "test_target.py" in message
    # the largest buffers, by line, though the compiler refused (issue 46 item 13)
    assert re.search(r"8\.6 GiB  output on TPU v5 lite: output %\d+ aten::add f32\[48000,48000\] "
                     r"at .*test_target\.py:\d+", message), message
    assert xlanb.get_target() is None and xlanb.pending_count() == 0
    with pytest.raises(ValueError, match="needs a target"):
        xlanb.memory_limit("target")
    # the refused graph compiled for the CPU (for its own memory check) and never ran
    assert (metrics.counter_value("UncachedCompile") or 0) == before + 1


def test_target_compiles_every_graph_in_the_background():
    m = torch.nn.Linear(256, 128).to("xla")
    x = torch.randn(16, 256, device="xla")
    xlanb.sync()
    with xlanb.target("v5e:1x1") as t:
        assert t == xlanb.get_target() and t.name == "v5e:1x1"
        loss = m(x).pow(2).mean()
        loss.backward()
        xlanb.sync()
    assert xlanb.get_target() is None
    g = xlanb.graphs()[-1]
    r = g.target  # waits for the TPU compile
    assert isinstance(r, xlanb.TargetReport) and r.graph_hash == g.hash_full
    assert r.fits is True and r.memory.argument_bytes > 0
    assert [c.header for c in xlanb.graphs().columns()][-5:] == [
        "target", "TPU peak", "fits", "TPU est.", "TPU compile"]
    assert "v5e:1x1" in str(xlanb.graphs())
    # the CPU step's value is the CPU's
    assert m.weight.grad is not None and torch.isfinite(m.weight.grad.cpu()).all()
    # a graph compiled with no target set has none
    (x * 3).sum().item()
    assert xlanb.graphs()[-1].target is None


def test_a_graph_compiled_before_the_target_was_set_gets_its_report_when_it_runs():
    """Issue 46, item 11: the second run was a cache hit and had no report."""
    m = torch.nn.Linear(64, 32).to("xla")
    x = torch.randn(8, 64, device="xla")
    xlanb.sync()

    def step():
        with torch.no_grad():
            y = m(x).relu().sum()
        xlanb.sync()
        return y

    step()
    g = xlanb.graphs()[-1]
    assert g.target is None
    with xlanb.target("v5e:1x1"):
        step()
        assert xlanb.graphs()[-1] is g  # the same graph, from the cache
    r = g.target
    assert r is not None and r.target.name == "v5e:1x1" and r.fits is True
    assert "v5e:1x1" in str(xlanb.graphs())
    # another target: the graph's report follows it
    with xlanb.target("v6e:1x1"):
        step()
    assert g.target.target.name == "v6e:1x1"
    # and a replay of xlanb.compile
    f = xlanb.compile(lambda: m(x).relu().sum() * 3)
    for _ in range(3):
        with torch.no_grad():
            f()
    assert f.replays >= 1
    rec = xlanb.graphs()[-1]
    assert rec.target is None
    with xlanb.target("v5e:1x1"), torch.no_grad():
        f()
    assert f.replays >= 2
    assert rec.target is not None and rec.target.target.name == "v5e:1x1"


def test_under_a_target_a_replay_tiers_up_and_keeps_its_one_target_compile():
    """Issue 57: with a TPU target set, a replayed graph's CPU executable tiers up at
    its third run as anywhere (graphs.run_cached); its TPU compile (XLA's full
    optimizations already: no quick tier) is the one made when it first compiled."""
    wc, xc = torch.randn(64, 48), torch.randn(8, 64)
    w, x = wc.to("xla"), xc.to("xla")
    xlanb.sync()
    f = xlanb.compile(lambda: (x @ w).tanh().sum() * 2.0, name="tpu_tier")
    up0 = metrics.counter_value("GraphTierUp") or 0
    seen = []
    with xlanb.target("v5e:1x1"), torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(f().cpu(), (xc @ wc).tanh().sum() * 2.0)
            rec = [g for g in xlanb.graphs() if g.cause == "xlanb.compile(tpu_tier)"][-1]
            seen.append((rec.quick, rec._target))
    assert [q for q, _ in seen] == [True, True, False, False]
    assert (metrics.counter_value("GraphTierUp") or 0) == up0 + 1
    assert len({id(t) for _, t in seen}) == 1  # one TPU compile, kept through the tier-up
    assert rec.target.fits is True and rec.target.target.name == "v5e:1x1"


def test_dtypes_a_tpu_treats_differently_are_noted():
    x = torch.arange(8, dtype=torch.float64).to("xla")
    r = xlanb.compile_for("v5e:1x1", (x * 2).sum())
    assert any("float64" in n for n in r.notes)
    i = torch.arange(8).to("xla")
    r = xlanb.compile_for("v5e:1x1", i * 3)
    assert any("int64" in n for n in r.notes) and not any("float64" in n for n in r.notes)
    # ...an op on integers whose result is float32 computes, and takes its number, in
    # float32 (the result's dtype was missed: a lone result's meta is a NamedTuple)
    r = xlanb.compile_for("v5e:1x1", i * 0.5)
    assert not any("float64" in n for n in r.notes), r.notes
    # a Python number read by an op on integers only stays float64 (issue 46 item 12)
    r = xlanb.compile_for("v5e:1x1", i * 3 + (i > 2.5))
    assert any("1 Python number(s) reach the TPU as float64" in n for n in r.notes), r.notes
    xlanb.sync()


def test_an_optimizer_step_has_a_time_estimate():
    """Issue 46 item 12: an SGD step's Python numbers (lr, momentum) reached the TPU as
    float64 scalars: XLA emulated float64 (X64SplitLow) and gave no time estimate, only
    "at least ... (roofline)". They pass as float32 now, as torch_xla passes them."""
    torch.manual_seed(0)
    m = torch.nn.Linear(64, 32).to("xla")
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    xlanb.sync()
    m(torch.randn(8, 64).to("xla")).pow(2).mean().backward()
    opt.step()
    r = xlanb.compile_for("v5e:1x1", *m.parameters())
    assert r.error is None and "est." in r.summary_line(), r.summary_line()
    assert "X64" not in r.hlo() and not any("float64" in n for n in r.notes), r.notes
    scalars = [row for row in r.padding if row.kind == "scalars"]
    assert scalars and all("f32" in row.type for row in scalars), scalars
    xlanb.sync()


def test_bad_targets_are_clear_errors(monkeypatch):
    x = torch.ones(4, device="xla") + 1
    pending = xlanb.pending_count()
    with pytest.raises(ValueError, match="known generations: v4, v5e, v5p, v6e"):
        xlanb.compile_for("v9:2x2", x)
    with pytest.raises(xlanb.TargetError, match="cannot make the TPU topology v5e:3x3"):
        xlanb.compile_for("v5e:3x3", x)
    with pytest.raises(ValueError, match="a TPU topology such as 'v5e:2x2'"):
        xlanb.set_target("tpu")
    monkeypatch.setattr(libtpu, "installed", lambda: False)
    targets.target.cache_clear()
    targets._topology.cache_clear()
    try:
        with pytest.raises(ImportError, match=r'pip install "xlanb\[tpu\]"'):
            xlanb.compile_for("v6e:1x1", x)
    finally:
        targets.target.cache_clear()
        targets._topology.cache_clear()
    assert xlanb.pending_count() == pending and x.cpu().tolist() == [2.0] * 4


@pytest.mark.parametrize("name,says", [
    ("v5e:0x0", "outside what v5e has"), ("v5e:1x0", "outside what v5e has"),
    ("v5p:0x1x1", "outside what v5p has"), ("v5e:32x1", "each 1 to 16"),
    ("v5e:8x32", "each 1 to 16"), ("v5e:1000x1000", "at most 256 chips"),
    ("v5e:2x2x2", "have 2 dimensions"), ("v6e:2x2x2", "have 2 dimensions"),
    ("v5p:2x2", "have 3 dimensions"), ("v4:32x32x32", "at most 4096 chips"),
    ("v5e:2xx2", "not a v5e topology"), ("v5e:-1x1", "not a v5e topology")])
def test_topology_names_outside_a_generation_are_refused_before_libtpu(name, says):
    """libtpu 0.0.52 kills the process on some of these (SIGFPE on a dimension of 0,
    an abort on a v5e dimension over 16), and accepts a 3-D v5e: xlanb checks the name
    against the generation's limits first, with a TargetError that names them."""
    with pytest.raises(xlanb.TargetError, match=says):
        xlanb.Target(name)
    with pytest.raises(xlanb.TargetError, match=says):
        xlanb.set_target(name)
    assert xlanb.get_target() is None


def test_a_topology_name_in_capitals_is_the_same_target():
    assert xlanb.Target("V5E:1X1") == xlanb.Target(" v5e : 1x1 ")
    assert xlanb.Target("V5E:1X1").name == "v5e:1x1"


_SHARDED = textwrap.dedent('''
    import json, sys, warnings
    import jax, jax.numpy as jnp, torch, xlanb
    import xlanb.spmd as xs
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = xs.Mesh(list(range(4)), (4,), ("data",))
    x = torch.randn(64, 512).to("xla")
    w = torch.randn(512, 256).to("xla")
    xs.mark_sharding(x, mesh, ("data", None))
    xlanb.sync()
    y = (x @ w).sum()  # LINE_OF_Y
    r = xlanb.compile_for("v5e:2x2", y)
    out = {"collectives": [[c.kind, c.source, c.op] for c in r.collectives],
           "args": r.memory.argument_bytes, "flops": r.cost.flops, "fits": r.fits,
           "chips": r.target.num_devices, "pending": xlanb.pending_count(),
           "compiles": xlanb.metrics.counter_value("UncachedCompile")}
    # JAX's own compile of the same math on the same topology, sharded the same way
    t = xlanb.Target("v5e:2x2")
    tmesh = jax.sharding.Mesh(list(t.devices), ("data",))
    ref = jax.jit(lambda x, w: (x @ w).sum()).lower(
        jax.ShapeDtypeStruct((64, 512), jnp.float32, sharding=NamedSharding(tmesh, P("data"))),
        jax.ShapeDtypeStruct((512, 256), jnp.float32, sharding=NamedSharding(tmesh, P()))).compile()
    out["ref_args"] = ref.memory_analysis().argument_size_in_bytes
    out["ref_flops"] = ref.cost_analysis()["flops"]
    try:
        xlanb.compile_for("v5e:4x4", y)
    except xlanb.TargetError as e:
        out["mismatch"] = str(e)
    out["value_ok"] = abs(float(y) - float((x.cpu() @ w.cpu()).sum())) < 1e-2 * max(1, abs(float(y)))
    print("RESULT" + json.dumps(out))
''')


def test_sharded_graph_on_a_topology_names_the_collectives_line(tmp_path):
    script = tmp_path / "sharded_target.py"
    script.write_text(_SHARDED)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    line = next(i for i, s in enumerate(_SHARDED.splitlines(), 1) if "LINE_OF_Y" in s)
    assert out["chips"] == 4 and out["fits"] is True
    assert out["pending"] > 0 and out["compiles"] is None  # nothing ran for the report
    assert out["args"] == out["ref_args"]
    assert abs(out["flops"] - out["ref_flops"]) <= 0.05 * out["ref_flops"]
    assert any(kind == "all-reduce" and src.endswith(f"sharded_target.py:{line}")
               for kind, src, _ in out["collectives"]), out["collectives"]
    assert "has 16" in out["mismatch"] and "'v5e:2x2'" in out["mismatch"]
    assert out["value_ok"]
    # libtpu's start-up warnings never reached the user
    assert "TPU_WORKER_HOSTNAMES" not in proc.stderr and "InitGoogle" not in proc.stderr


def test_processes_compile_for_targets_side_by_side():
    """libtpu's lock file would let only one process load it; without a TPU, xlanb lifts
    it (runtime/libtpu.py), so two processes compile for targets at once."""
    code = ("import torch, xlanb; x = torch.ones(128, 128, device='xla'); "
            "r = xlanb.compile_for('v5e:1x1', x @ x); print('FITS', r.fits)")
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("ALLOW_MULTIPLE_LIBTPU_LOAD", None)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "FITS True" in out, err[-2000:]
        assert "TPU_WORKER_HOSTNAMES" not in err and "TPU_ACCELERATOR_TYPE" not in err


_EXIT_MID_COMPILE = textwrap.dedent('''
    import time, torch, xlanb
    class SlowTeardown:  # finalization outlasts the TPU compile, as it can under load
        def __del__(self):
            time.sleep(6)
    keep = SlowTeardown()
    xlanb.set_target("v5e:1x1")
    m = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)]).to("xla")
    m(torch.randn(32, 256, device="xla")).pow(2).mean().backward()
    xlanb.sync()
    print("STEPPED", flush=True)
''')


def test_a_script_that_ends_during_a_background_target_compile_exits_cleanly(tmp_path):
    """Issue 46, item 7: a TPU compile that ended while the interpreter finalized crashed
    the process (SIGSEGV in jax's WeakrefLRUCache, or libtpu's "FATAL: exception not
    rethrown", exit 134). At exit the compile in progress is waited for, with a bound."""
    script = tmp_path / "ends_mid_compile.py"
    script.write_text(_EXIT_MID_COMPILE)
    env = dict(os.environ, PYTHONPATH=ROOT)
    for _ in range(3):
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 0 and "STEPPED" in proc.stdout, \
            (proc.returncode, proc.stderr[-3000:])


def test_bad_xlanb_target_names_the_variable():
    env = dict(os.environ, PYTHONPATH=ROOT, XLANB_TARGET="v7x:2x2")
    proc = subprocess.run([sys.executable, "-c", "import xlanb"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode != 0
    assert re.search(r"XLANB_TARGET='v7x:2x2': .*unknown TPU generation", proc.stderr)


def test_device_profile_after_a_target_falls_back_instead_of_crashing():
    """With libtpu's plugin loaded for a target and no TPU, JAX's profiler crashes the
    process (SIGSEGV in PluginTracer::Start): xlanb.profile estimates device times by
    replay instead, and says so."""
    xlanb.compile_for("v5e:1x1", torch.ones(4, device="xla") * 2)
    with pytest.warns(RuntimeWarning, match="JAX's profiler crashes"):
        with xlanb.profile(device=True) as p:
            (torch.ones(4, device="xla") + 1).sum().item()
    assert p.device is False and p.replay_on_exit is True


def test_xp_start_trace_after_a_target_says_it_has_no_device_trace(tmp_path):
    """Issue 46: torch_xla's ``xp.start_trace`` skipped the device trace silently where
    ``xlanb.profile`` warns."""
    import xlanb.compat.profiler as xp
    xlanb.compile_for("v5e:1x1", torch.ones(4, device="xla") * 3)
    with pytest.warns(RuntimeWarning, match="holds xlanb's host events only, no device trace"):
        xp.start_trace(str(tmp_path))
    try:
        (torch.ones(4, device="xla") + 2).sum().item()
    finally:
        xp.stop_trace()


def test_a_fresh_process_keeps_the_tpu_plugin_out_of_jax():
    """libtpu installed, no TPU: JAX's own device search never loads libtpu (its profiler
    would crash), the CPU is the device, and the device profiler works."""
    code = ("import torch, xlanb, jax; "
            "x = torch.ones(8, device='xla'); "
            "p = xlanb.profile(device=True)\n"
            "with p: (x * 2).sum().item()\n"
            "print('PLATFORM', jax.devices()[0].platform, jax.config.jax_platforms, p.device)")
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("JAX_PLATFORMS", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "PLATFORM cpu cpu True" in proc.stdout


def test_an_instruction_with_xlanb_s_frame_has_no_user_line():
    """The TPU partitioner's collectives may carry the frame that lowered the whole
    graph (xlanb's own): the source column is then blank, never an xlanb file."""
    from xlanb.executables import stages
    from xlanb.graph.hlo_text import origin
    meta = ('%ar = f32[] all-reduce(f32[] %x), metadata={op_type="aten::mm" '
            'op_name="jit(run)/Net/aten::mm" source_file="FILE" source_line=426}')
    assert origin(meta.replace("FILE", stages.__file__), {})[2] == ""
    assert origin(meta.replace("FILE", "/home/me/train.py"), {}) == (
        "aten::mm", "jit(run)/Net/aten::mm", "/home/me/train.py:426")


def test_looped_layers_cost_every_iteration():
    """XLA's cost analysis counts a loop's body once: 8 identical layers compiled as
    loops for a TPU (XLANB_SCAN_LAYERS=auto) reported about 70% of the unrolled step's
    FLOPs. Each loop's further iterations are added (executables/target.py, loop_flops)."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(128, 128)

        def forward(self, x):
            return x + torch.tanh(self.lin(x))

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block() for _ in range(8)]).to("xla")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 128, device="xla")
    xlanb.sync()
    model(x).pow(2).mean().backward()
    opt.step()
    was = xlanb.config.scan_layers
    try:
        xlanb.config.scan_layers = "auto"
        looped = xlanb.compile_for("v5e:1x1")
        xlanb.config.scan_layers = False
        unrolled = xlanb.compile_for("v5e:1x1")
    finally:
        xlanb.config.scan_layers = was
    xlanb.sync()
    assert any("as loops" in n for n in looped.notes), looped.notes
    assert not any("as loops" in n for n in unrolled.notes)
    # 3 x 2 x 64 x 128 x 128 FLOP a layer (forward, two backward matmuls)
    assert abs(unrolled.cost.flops - 8 * 6 * 64 * 128 * 128) <= 0.05 * unrolled.cost.flops
    assert abs(looped.cost.flops - unrolled.cost.flops) <= 0.03 * unrolled.cost.flops, \
        (looped.cost.flops, unrolled.cost.flops)
    # bytes scale with the FLOPs: never below the loop's own count of one iteration
    assert looped.cost.bytes_accessed >= 0.9 * unrolled.cost.bytes_accessed


def test_a_mesh_that_does_not_match_the_topology_counts_in_words():
    """Issue 46 (low): "a mesh of 1 devices"."""
    import jax

    from xlanb.runtime import targets
    two = jax.sharding.Mesh(list(xlanb.Target("v5e:2x1").devices), ("d",))
    with pytest.raises(xlanb.TargetError) as e:
        targets._mesh_on(xlanb.Target("v5e:1x1"), two)
    msg = str(e.value)
    assert "holds 2 devices" in msg and "a topology with 2 chips" in msg, msg
    assert msg.endswith("or a mesh of 1 device"), msg


# The entry of a TPU module with a loop (the shape of a 1024-wide looped layer's, trimmed)
_LOOP_HLO = """HloModule m

ENTRY %main (p: f32[256,1024]) -> f32[256,1024] {
  %p = f32[256,1024]{1,0:T(8,128)} parameter(0)
  %tuple.1 = (s32[]{:T(128)}, f32[256,1024]{1,0:T(8,128)}, f32[7,1024,1024]{2,1,0:T(8,128)}) tuple(%c, %p, %w)
  %while.10 = (s32[]{:T(128)}, f32[256,1024]{1,0:T(8,128)S(1)}, f32[7,1024,1024]{2,1,0:T(8,128)}) while(%tuple.1), condition=%cond, body=%body
  ROOT %r = f32[256,1024]{1,0:T(8,128)} add(%p, %p)
}
"""


def test_a_loops_temporaries_are_its_carried_values():
    """Issue 46: the padding table showed a loop (a tuple-shaped ``while``) as its first
    element only, the s32[] counter; its carried values are buffers of their own (the
    ones in HBM: not a value prefetched into the core, ``S(1)``)."""
    from xlanb.executables.target import temp_rows
    rows = [r for r in temp_rows(_LOOP_HLO) if r.name.startswith("while")]
    assert [(r.name, r.type) for r in rows] == [("while (while.10) [2]", "f32[7,1024,1024]")], rows
    assert rows[0].logical_bytes == 7 * 1024 * 1024 * 4


def test_an_empty_graph_does_no_work():
    from xlanb.executables.target import TargetCost
    r = TargetCost(0.0, 0.0, 0.0, 0.0, 0.0)
    t = xlanb.Target("v5e:1x1")
    assert r.bound == "no work" and r.roofline(t) == "no work on TPU v5 lite: no FLOP, no byte accessed"
    assert TargetCost(1e9, 1e3, 0.0, 1e9 / t.peak_flops, 1e3 / t.hbm_bytes_per_s).bound == "compute-bound"
