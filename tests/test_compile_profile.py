"""Where the compile time goes (issue 48): each graph's compile profile by phase (the
compiler's own spans and logs), by line and by scope, and its front ends.

The phase measurements run in a fresh process (tests/scripts/compile_profile_script.py):
JAX's profiler cannot start in a process where another test loaded libtpu's plugin for a
target. One process compiles four small graphs for the CPU and one for a TPU v5e
(about 10-20 s in all on a loaded 2-core machine)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest
import torch

import xlanb
from xlanb.graph import compile_time
from xlanb.runtime import libtpu
from xlanb.runtime.compile_profile import RawCompile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "compile_profile_script.py")


@pytest.fixture(scope="module")
def measured():
    args = [sys.executable, SCRIPT] + (["--tpu"] if libtpu.installed() else [])
    # the optimized compile: a quick one (XLA:CPU's legacy emitters) times no fusion alone
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE), XLANB_STORE_DIR="",
               XLANB_QUICK_COMPILES="0")
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.split("JSON", 1)[1])


def _named(p: dict) -> float:
    return sum(part[2] for part in p["parts"])


def test_parts_are_measured_and_add_up(measured):
    p = measured["slow"]
    phases = p["phases"]
    # every phase the issue names was measured, from XLA's own spans
    for phase in ("lowering", "hlo passes", "backend", "loading"):
        assert phase in phases and phases[phase] > 0, phases
    hows = {part[1]: part[3] for part in p["parts"]}
    assert "Codegen span" in hows.values() and not p["notes"], p["text"]
    # the named parts cover the graph's compile time within 10%; the rest is said
    assert abs(_named(p) - p["compile_time"]) <= 0.1 * p["compile_time"], p["text"]
    assert abs(_named(p) + p["unattributed"] - p["total"]) < 1e-6
    assert "unattributed" in p["text"] and "measured by" in p["text"]


def test_a_loop_unrolled_at_one_line_is_named_first(measured):
    p = measured["slow"]
    key, _, share, ops = p["lines"][0]
    assert key.endswith(f"compile_profile_script.py:{measured['loop_line']}"), p["text"]
    assert share > 0.5 and ops > 100, p["text"]
    # the graph table's column names that line
    row = p["table"].splitlines()[1]
    assert f"compile_profile_script.py:{measured['loop_line']} " in row, p["table"]
    assert "slowest to compile" in p["table"].splitlines()[0]
    # fusions carried measured weights: the spread is not only the even one
    assert "measured emitter time" in p["method"], p["method"]


def test_a_two_line_function_compiles_at_its_two_lines(measured):
    p = measured["two"]
    first, second = measured["two_lines"]
    at = {row[0].rsplit(":", 1)[-1]: row[2] for row in p["lines"]}
    assert str(first) in at and str(second) in at, p["text"]
    assert at[str(first)] + at[str(second)] > 0.9, p["text"]


def test_a_repeated_stack_is_one_row(measured):
    scopes = [row[0] for row in measured["stack"]["scopes"]]
    assert "4 × Stack.layers" in scopes, scopes
    assert not any(s.startswith("Stack.layers.") for s in scopes), scopes


def test_off_is_timed_only_and_still_adds_up(measured):
    p = measured["off"]
    assert any("XLANB_COMPILE_PROFILE=0" in n for n in p["notes"]), p["notes"]
    assert [part[1] for part in p["parts"]][:2] == ["xlanb's trace and lowering",
                                                   "the compile, not split"]
    assert p["unattributed"] == 0.0
    assert abs(_named(p) - p["total"]) < 1e-6


def test_a_tpu_target_compile_has_its_parts_or_says_why(measured):
    if not libtpu.installed():
        pytest.skip("libtpu is not installed")
    p = measured["tpu"]
    assert p["error"] is None
    names = [part[1] for part in p["parts"]]
    if "TPU HLO passes" not in names:  # libtpu's log was not found: the profile says so
        assert p["notes"] and "timed only" in " ".join(p["notes"]) or "libtpu" in " ".join(p["notes"])
        return
    assert "TPU backend passes" in names, p["text"]
    assert any("evenly over the instructions" in n for n in p["notes"]), p["notes"]
    assert p["unattributed"] <= 0.1 * p["total"] or any("not in its log" in n for n in p["notes"])
    assert "<table class='xlanb-compile-time'>" in p["html"]


def test_a_repeated_tpu_target_compile_counts_its_own_stages_only(measured):
    if not libtpu.installed():
        pytest.skip("libtpu is not installed")
    for p in [measured["tpu"]] + measured["tpu_again"]:
        assert p["error"] is None
        names = [part[1] for part in p["parts"]]
        if "TPU HLO passes" not in names:
            continue  # no libtpu log here: the test above checks what the profile says
        # each part is this compile's (none negative, none another compile's), and they
        # add up: at most the stamps' microsecond rounding is left over
        assert all(part[2] >= -1e-3 for part in p["parts"]), p["text"]
        assert -1e-3 <= p["unattributed"] <= 0.1 * p["total"], p["text"]
        assert abs(_named(p) + p["unattributed"] - p["total"]) < 1e-6
        assert _named(p) <= 1.1 * p["total"], p["text"]


# --------------------------------------------------------------------------- in process

def test_parsing_libtpus_stage_lines():
    log = ("I1127 09:39:32.222587   20681 deepsea_compiler_hlo_passes.cc:6790] XLA::TPU running "
           "hlo passes for 344 instructions, module: jit_a\n"
           "I1127 09:39:32.484270   20681 x.cc:1] HLO_PASSES stage duration: 261.66268725ms\n"
           "I1127 09:39:33.635665   21080 x.cc:2] BACKEND_PASSES stage duration: 1m2.5s\n"
           "I1127 09:39:33.699884   21080 x.cc:3] CODE_GENERATION stage duration: 350us\n")
    stages, began = compile_time.tpu_stages(log, "jit_a")
    assert stages["HLO_PASSES"][0] == pytest.approx(0.26166268725)
    assert stages["BACKEND_PASSES"][0] == pytest.approx(62.5)
    assert stages["CODE_GENERATION"][0] == pytest.approx(350e-6)
    assert began == pytest.approx(stages["HLO_PASSES"][1] - 0.26166268725)
    # another module's compile is not this one's
    assert compile_time.tpu_stages(log.replace("jit_a", "jit_b"), "jit_a") == ({}, None)


def test_libtpus_stage_lines_are_taken_from_the_compiles_own_window():
    def compile_log(t0: float, ms: float) -> str:
        # one compile's stage lines from t0 on (glog's local time), each stage ms long
        def at(s):
            return time.strftime("I%m%d %H:%M:%S", time.localtime(int(s))) + f".{int(s % 1 * 1e6):06d}"
        return "".join(
            f"{at(t0 + (i + 1) * ms / 1e3)}   1 x.cc:1] {stage} stage duration: {ms}ms\n"
            for i, stage in enumerate(("HLO_PASSES", "BACKEND_PASSES", "CODE_GENERATION")))

    t0 = 1795000000.0
    # the file as a second compile's window read it: the first compile's lines (they
    # reached the file late), its own, and (read later) a third compile's
    log = compile_log(t0, 10) + compile_log(t0 + 1, 20) + compile_log(t0 + 2, 40)
    raw = RawCompile("tpu", "jit_a", 0.0, 0.1, started=t0 + 1, ended=t0 + 1.07)
    stages, began = compile_time.tpu_stages(log, "jit_a", raw)
    assert {k: round(v[0], 6) for k, v in stages.items()} == {
        "HLO_PASSES": 0.02, "BACKEND_PASSES": 0.02, "CODE_GENERATION": 0.02}
    assert began == pytest.approx(t0 + 1, abs=1e-5)
    parts, unattributed, _ = compile_time.tpu_parts(raw, log)
    assert all(p.seconds >= -1e-5 for p in parts) and unattributed >= -1e-5, parts
    # a compile whose window holds no stage line of its own (JAX's cache answered):
    # nothing of the others' is taken
    lone = RawCompile("tpu", "jit_a", 0.0, 0.1, started=t0 + 1.5, ended=t0 + 1.6)
    assert compile_time.tpu_stages(log, "jit_a", lone) == ({}, None)


@pytest.fixture
def graph():
    a = torch.randn(4, 4).to("xla")
    b = (a * 2 + 1).relu()
    xlanb.sync()
    assert b is not None
    return xlanb.graphs()[-1]


def test_every_graph_has_a_profile(graph):
    p = graph.compile_profile
    assert p.total_s > 0 and p.by_line()
    assert abs(p.attributed_s + p.unattributed_s - p.total_s) < 1e-6
    assert str(p).startswith(f"compile of graph {graph.hash[:12]}")


def test_xla_compile_time_magic(graph):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    shell = InteractiveShell.instance()
    fmt = shell.display_formatter
    saved = list(fmt.active_types)
    fmt.active_types = list(fmt.format_types)  # as a notebook: every mime type
    shell.run_line_magic("load_ext", "xlanb")
    try:
        with capture_output() as c:
            shell.run_line_magic("xla_compile_time", "")
        (bundle,) = [o.data for o in c.outputs]
        assert bundle["text/plain"].startswith(f"compile of graph {graph.hash[:12]}")
        assert "xlanb-compile-profile" in bundle["text/html"]
        with pytest.raises(UsageError, match="there is no graph #99"):
            shell.run_line_magic("xla_compile_time", "99")
        with capture_output() as c:
            shell.run_line_magic("xla_compile_time", "--last 1")
        (bundle,) = [o.data for o in c.outputs]
        assert bundle["text/plain"].startswith("1 graph (")
        with pytest.raises(UsageError, match="--last must be a positive integer"):
            shell.run_line_magic("xla_compile_time", "--last 0")
    finally:
        shell.run_line_magic("unload_ext", "xlanb")
        fmt.active_types = saved


def test_pdb_xcompile(graph):
    from xlanb.extensions import pdb as xpdb
    d = xpdb.XlaPdb(stdout=io.StringIO(), readrc=False)
    d.reset()
    d.onecmd("xcompile")
    text = d.stdout.getvalue()
    assert "compile of graph" in text and "by line" in text, text
    d.onecmd("xcompile 99")
    assert "there is no graph #99" in d.stdout.getvalue()


def test_eager_runs_are_summed_by_line():
    """Eager mode compiles runs of new ops as graphs: their compiles sum by line."""
    before = len(xlanb.graphs())
    with xlanb.mode("eager"):
        a = torch.randn(5, 7).to("xla")
        b = (a.exp() * 3 + a).tanh()            # a run of new ops at this line
        c = torch.softmax(b, dim=-1).sum(dim=0)  # and at this one
        c.cpu()
    new = list(xlanb.graphs())[before:]
    assert new, "eager mode compiled no run"
    s = xlanb.compile_summary(new)
    assert s.total_s == pytest.approx(sum(g.compile_profile.total_s for g in new))
    here = {f"test_compile_profile.py:{n}" for n in _lines_of("b = (a.exp()", "c = torch.softmax")}
    top = [r.key for r in s.by_line() if not r.key.startswith("(")]
    assert top and set(top) <= here, (top, here)
    assert s.headline().startswith(f"{len(new)} graph") and "% at test_compile_profile.py:" in s.headline()
    assert xlanb.compile_summary([]).total_s == 0 and str(xlanb.compile_summary([])) == "no compiles"


def _lines_of(*starts) -> list[int]:
    with open(__file__) as f:
        text = f.read().splitlines()
    return [next(i for i, t in enumerate(text, 1) if t.strip().startswith(s)) for s in starts]


# --------------------------------------------------------------------------- advice
# Each kind of advice on a small model that shows it, and a control where it must not
# appear. The measurements that make the advice right are in docs/compile-time.md.

class _Stack(torch.nn.Module):
    def __init__(self, n: int, width: int, looped: bool = False):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(n))
        self.looped = looped

    def forward(self, x):
        if self.looped:
            return xlanb.scan_layers(self.layers, x)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _train_step(model, width: int):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, width).to("xla")
    model(x).sum().backward()
    opt.step()
    xlanb.sync()
    return xlanb.graphs()[-1].compile_profile


def _kinds(p) -> dict:
    return {a.kind: a for a in p.advice}


def test_backward_and_optimizer_ops_have_scopes():
    torch.manual_seed(0)
    p = _train_step(_Stack(4, 11).to("xla"), 11)
    rows = {r.key: r for r in p.by_scope(None)}
    # autograd's ops go to the scope of the forward line they differentiate, the
    # optimizer's to its step; only XLA's own instructions stay without a scope
    assert rows["4 × _Stack.layers (backward)"].ops > 0, list(rows)
    # the optimizer's, by the module whose parameters they update: the stack's as one row
    assert rows["4 × optimizer.step (_Stack.layers)"].ops > 0, list(rows)
    unscoped = rows.get(compile_time.NO_SCOPE)
    xla_own = sum(r.ops for r in p.by_line(None) if r.key.startswith("(no line"))
    assert (unscoped.ops if unscoped else 0) == xla_own, str(p)
    step_line = _lines_of("opt.step()")[0]
    assert sum(r.ops for k, r in rows.items() if compile_time.OPTIMIZER in k) == next(
        r.ops for r in p.by_line(None) if r.key.endswith(f"test_compile_profile.py:{step_line}"))


def test_a_loops_per_layer_results_count_as_the_loop():
    torch.manual_seed(0)
    p = _train_step(_Stack(6, 10, looped=True).to("xla"), 10)
    rows = {r.key: r for r in p.by_line(None)}
    # each layer's results taken out of the loop's stacked ones (weights, gradients)
    # are the loop's instructions, not xlanb's other ops
    loops = rows[compile_time.LOOPS]
    own = rows.get(compile_time.OWN)
    assert loops.ops >= 6 and (own.ops if own else 0) < loops.ops / 4, str(p)
    assert not any("unstack" in r.key for r in p.by_scope(None)), str(p)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Linear(12, 16)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        x = self.emb(x)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def test_optimizer_ops_are_split_by_the_module_of_their_parameter():
    torch.manual_seed(0)
    model = _Net().to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 12).to("xla")).sum().backward()
    opt.step()
    step_line = sys._getframe().f_lineno - 1
    xlanb.sync()
    p = xlanb.graphs()[-1].compile_profile
    rows = {r.key: r for r in p.by_scope(None)}
    # AdamW's ops for each parameter (its moments, step count, decay and update) count
    # for the module that parameter belongs to; a layer stack's as one row
    stack = rows["3 × optimizer.step (_Net.layers)"]
    emb, head = rows["optimizer.step (_Net.emb)"], rows["optimizer.step (_Net.head)"]
    assert compile_time.OPTIMIZER not in rows, list(rows)  # none left unsplit
    # every module's parameters (a weight and a bias) get the same update: about 3
    # layers' worth of instructions against 1 (XLA's passes leave a few more or less)
    assert emb.ops > 0 and abs(head.ops - emb.ops) <= 0.1 * emb.ops, list(rows.items())
    assert 2.7 * emb.ops <= stack.ops <= 3.3 * emb.ops, list(rows.items())
    # (at most: some may keep an earlier step's line, the strict xfail below)
    assert stack.ops + emb.ops + head.ops >= next(
        (r.ops for r in p.by_line(None)
         if r.key.endswith(f"test_compile_profile.py:{step_line}")), 0)


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="known bug: some of an optimizer step's instructions keep the line "
                   "of an earlier step whose ops had the same signatures (2 of 312 alone, 12 or "
                   "all after other tests' steps), likely from a lowering JAX cached")
def test_every_optimizer_instruction_keeps_its_own_steps_line():
    # (its own steps at lines of its own, not a helper's shared with the test above: the
    # stale line is likely the first one those signatures were traced at in the process)
    torch.manual_seed(0)
    first = torch.nn.Linear(7, 3).to("xla")
    opt = torch.optim.AdamW(first.parameters(), lr=0.1)
    first(torch.randn(2, 7).to("xla")).sum().backward()
    opt.step()
    xlanb.sync()
    model = _Net().to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 12).to("xla")).sum().backward()
    opt.step()
    step_line = sys._getframe().f_lineno - 1
    xlanb.sync()
    p = xlanb.graphs()[-1].compile_profile
    rows = {r.key: r for r in p.by_scope(None)}
    optimizer_ops = sum(r.ops for k, r in rows.items() if k.startswith("3 × optimizer.step")
                        or k.startswith("optimizer.step"))
    # (after the other tests here, no instruction at all had this step's line)
    assert optimizer_ops == next(
        (r.ops for r in p.by_line(None)
         if r.key.endswith(f"test_compile_profile.py:{step_line}")), 0)


def test_an_unrolled_stack_is_advised_a_loop(monkeypatch):
    torch.manual_seed(0)
    # 8 small layers: a loop compiles slower than the unrolled stack (about 80
    # instructions), so no advice at the default size
    small = _train_step(_Stack(8, 12).to("xla"), 12)
    assert "unrolled stack" not in _kinds(small), str(small)
    # the same finding over the size threshold: advised, in the text and the HTML
    monkeypatch.setattr(compile_time, "STACK_OPS", 10)
    p = _train_step(_Stack(8, 13).to("xla"), 13)
    a = _kinds(p)["unrolled stack"]
    assert a.where == "_Stack.layers" and a.share >= compile_time.STACK_SHARE, a
    assert "XLANB_SCAN_LAYERS=1" in a.text and a.text in str(p)
    assert "xlanb-compile-advice" in p._repr_html_()
    # control: the same stack compiled as one loop
    looped = _train_step(_Stack(8, 14, looped=True).to("xla"), 14)
    assert any("one loop" in r.key for r in looped.by_scope(None)), str(looped)
    assert "unrolled stack" not in _kinds(looped), str(looped)


def _unrolled(x):
    for i in range(80): x = torch.relu(x * 1.01 + i)  # one line on purpose
    return x.sum()


def _scanned(x):
    def body(c, k):
        return torch.relu(c * 1.01 + k), None
    c, _ = xlanb.scan(body, x, torch.arange(80, dtype=torch.float32).to("xla").view(80, 1))
    return c.sum()


def test_a_loop_at_one_line_is_advised_scan():
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    with torch.no_grad():
        y = _unrolled(torch.randn(6, 9).to("xla"))
        xlanb.sync()
    p = xlanb.graphs()[-1].compile_profile
    line = _lines_of("for i in range(80)")[0]
    a = _kinds(p)["loop at one line"]
    assert a.where.endswith(f"test_compile_profile.py:{line}") and "xlanb.scan" in a.text, a
    # %xla_compile_time shows it
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "xlanb")
    try:
        with capture_output() as c:
            shell.run_line_magic("xla_compile_time", "")
        assert f"advice: {a.text}" in c.outputs[0].data["text/plain"]
        with capture_output() as c:
            shell.run_line_magic("xla_compile_time", "--last 1")
        assert f"advice: {a.text}" in c.outputs[0].data["text/plain"]
    finally:
        shell.run_line_magic("unload_ext", "xlanb")
    # control: the same loop as xlanb.scan
    with torch.no_grad():
        z = _scanned(torch.randn(6, 9).to("xla"))
        xlanb.sync()
    q = xlanb.graphs()[-1].compile_profile
    assert "loop at one line" not in _kinds(q), str(q)
    assert y.shape == z.shape


def test_a_large_constant_is_advised_an_argument():
    x = torch.randn(700).to("xla")
    idx = torch.triu_indices(600, 600, device="xla")  # made in the graph: a constant
    y = (x[idx[0]] * x[idx[1]]).sum()
    xlanb.sync()
    p = xlanb.graphs()[-1].compile_profile
    a = _kinds(p)["large constant"]
    assert "s64[2,180300]" in a.text and "argument" in a.text, a
    # control: the same indices made on the CPU and passed in
    idx = torch.triu_indices(600, 600).to("xla")
    z = (x[idx[0]] * x[idx[1]]).sum() + 1
    xlanb.sync()
    q = xlanb.graphs()[-1].compile_profile
    assert "large constant" not in _kinds(q), str(q)
    assert y.shape == z.shape
