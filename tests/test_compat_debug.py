"""torch_xla's debugging surface on xlanb (issue 34): a torch_xla 2.9 debugging script
runs unchanged under ``python -m xlanb.run`` and leaves what torch_xla leaves.

One child process runs the script with every debugging variable set (shared by the
tests below through a module-scoped fixture): the profiler module (start_server,
start_trace/stop_trace, Trace, StepTrace, trace_detached), PT_XLA_DEBUG_LEVEL=2,
XLA_SAVE_TENSORS_FILE, XLA_METRICS_FILE, XLA_IR_DEBUG/XLA_HLO_DEBUG, XLA_FLAGS with
--xla_dump_to (and 4 host devices for the sharding calls), the mat-mul precision,
memory info, sharding specs and device counts. The rest runs in this process.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import re
import socket
import subprocess
import sys

import pytest
import torch

import xlanb
import xlanb.compat as compat
from xlanb.compat import debug_env
from support import child_env  # noqa: E402

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)

SCRIPT = r'''
import sys

import numpy as np
import torch
import torch_xla
import torch_xla.backends
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.debug.profiler as xp
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

logdir, detached_dir = sys.argv[1], sys.argv[2]
torch_xla.backends.set_mat_mul_precision("highest")
print("precision", torch_xla.backends.get_mat_mul_precision(),
      torch_xla._XLAC._xla_get_mat_mul_precision())

server = xp.start_server(9012)
device = torch_xla.device()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 8)
y = x.sum(1, keepdim=True)
xd, yd = x.to(device), y.to(device)


def train_step(step):
    with xp.StepTrace("train_step", step_num=step):
        with xp.Trace("forward"):
            loss = torch.nn.functional.mse_loss(model(xd), yd)
        with xp.Trace("backward"):
            loss.backward()
        opt.step()
        opt.zero_grad()
    return loss


xp.start_trace(logdir)
for step in range(3):
    loss = train_step(step)
    print(f"step {step} loss {loss.item():.6f}")
xp.stop_trace()

# the older way: a server, and a client asking it for 400 ms of profile
capture = xp.trace_detached("localhost:9012", detached_dir, duration_ms=400)
step = 3
while capture.is_alive():
    loss = train_step(step)
    step += 1
capture.join()

info = xm.get_memory_info(device)
print("memory", sorted(info), info["bytes_used"] > 0,
      info["bytes_limit"] >= info["bytes_used"] > 0,
      info["peak_bytes_used"] >= info["bytes_used"])
print("xlac memory", torch_xla._XLAC._xla_memory_info(str(device)).keys() == info.keys())

xr.use_spmd()
print("devices", xr.global_runtime_device_count(), xr.addressable_runtime_device_count(),
      xm.xla_real_devices([device]))
mesh = xs.Mesh(np.arange(4), (4, 1), ("data", "model"))
t = torch.randn(8, 4).to(device)
xs.mark_sharding(t, mesh, ("data", None))
r = torch.randn(8, 4).to(device)
xs.mark_sharding(r, mesh, (None, None))
print("spec", torch_xla._XLAC._get_xla_sharding_spec(t))
print("spec replicated", torch_xla._XLAC._get_xla_sharding_spec(r))
print("spec none", repr(torch_xla._XLAC._get_xla_sharding_spec(torch.zeros(2, device=device))))
xs.set_global_mesh(mesh)
print("more", xs.get_global_mesh() is mesh, xr.global_device_count(), xr.local_process_count(),
      xr.local_ordinal(), xm.get_local_ordinal(), torch_xla._XLAC._xla_get_default_device(),
      xm.get_xla_supported_devices("TPU"), torch_xla._XLAC._get_num_cached_compilation_graph() > 0)
print(met.short_metrics_report())
'''


def _env(tmp, **extra) -> dict:
    # torch_xla's own debugging variables are this test's subject: none inherited
    env = child_env(extra)
    return {k: v for k, v in env.items()
            if not k.startswith(("PT_XLA", "XLA_")) or k in extra}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The script under python -m xlanb.run with torch_xla's debugging variables."""
    tmp = tmp_path_factory.mktemp("debug")
    (tmp / "debug_script.py").write_text(SCRIPT)
    env = _env(tmp, PT_XLA_DEBUG_LEVEL="2", XLA_IR_DEBUG="1", XLA_HLO_DEBUG="1",
               XLA_SAVE_TENSORS_FILE=str(tmp / "tensors.txt"), XLA_SAVE_TENSORS_FMT="text",
               XLA_METRICS_FILE=str(tmp / "metrics.txt"),
               XLA_FLAGS=f"--xla_force_host_platform_device_count=4 "
                         f"--xla_dump_to={tmp / 'dump'}")
    shadow = ["--shadow"] if compat.real_torch_xla() else []
    main = subprocess.Popen([sys.executable, "-m", "xlanb.run", *shadow, "debug_script.py",
                             str(tmp / "prof"), str(tmp / "prof_detached")],
                            cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # meanwhile (most of either is starting Python, torch and JAX): a script that is not there
    missing = subprocess.Popen([sys.executable, "-m", "xlanb.run", "nosuch.py"], cwd=tmp,
                               env=_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    out, err = main.communicate(timeout=240)
    assert main.returncode == 0, err[-4000:]
    _MISSING.append((missing.communicate(timeout=240), missing.returncode, tmp))
    return tmp, out, err


_MISSING: list = []  # the missing-script run the fixture started: ((out, err), rc, folder)


def _cpu_losses(steps: int) -> list[float]:
    """The script's first steps on CPU torch: what torch_xla prints too."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 8)
    y = x.sum(1, keepdim=True)
    out = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


# What torch_xla 2.9 itself prints for the script's three steps: run under PJRT_DEVICE=CPU
# (torch 2.9.0, torch_xla 2.9.0, in a virtual environment of their own, 2026-11-26, with
# the script's own arguments; its later get_memory_info call fails there, with
# "UNIMPLEMENTED: GetAllocatorStats is not supported").
TORCH_XLA_2_9_LOSSES = (8.903650, 7.335521, 5.979743)


def test_the_script_prints_the_losses_of_torch_xla_and_cpu_torch(run):
    _, out, _ = run
    got = [float(m) for m in re.findall(r"^step \d+ loss ([\d.]+)$", out, re.M)]
    assert len(got) == 3, out
    assert got == pytest.approx(TORCH_XLA_2_9_LOSSES, abs=2e-6)  # printed to 6 places
    assert got == pytest.approx(_cpu_losses(3), rel=1e-5, abs=1e-6)
    assert "precision highest highest" in out


def test_pt_xla_debug_prints_torch_xlas_blocks_with_the_users_lines(run):
    _, _, err = run
    for head in ("Compilation Analysis: Compilation Cause",
                 "Compilation Analysis:   Number of Graph Inputs: ",
                 "Post Compilation Analysis: Graph input size: ",
                 "Post Compilation Analysis: Intermediate tensor size: ",
                 "Execution Analysis: Execution Cause"):
        assert head in err, err[-3000:]
    # xlanb's cause (the StepTrace exit) and the program's own frames, never the library's
    assert "Compilation Analysis:   user sync (xp.StepTrace 'train_step' exit)" in err
    frames = re.findall(r"^(?:Compilation|Execution) Analysis:   \S+ \((.+):(\d+)\)$", err, re.M)
    assert frames and all(os.path.basename(f) == "debug_script.py" for f, _ in frames), frames
    assert {"train_step", "<module>"} <= set(re.findall(
        r"^Compilation Analysis:   (\S+) \(", err, re.M))
    # one compile, then runs of the same graph (level 2 prints every run)
    assert err.count("Compilation Analysis: Compilation Cause") == 1
    assert err.count("Execution Analysis: Execution Cause") >= 4


def test_saved_graphs_file(run):
    tmp, _, _ = run
    assert not (tmp / "tensors.txt").exists()
    text = (tmp / "tensors.txt.0").read_text()  # torch_xla's ordinal suffix
    begins, ends = text.count("## BEGIN_GRAPH\n"), text.count("## END_GRAPH\n")
    assert begins == ends >= 4  # one per StepTrace sync
    first = text.split("## BEGIN_GRAPH\n")[1].split("## END_GRAPH")[0]
    assert "aten::addmm" in first and "aten::mse_loss_backward" in first
    assert "debug_script.py" in first and "Graph Hash: " in first


def test_metrics_file_and_xla_dump(run):
    tmp, _, _ = run
    report = (tmp / "metrics.txt").read_text()
    assert "Metric: CompileTime" in report and "Counter: MarkStep" in report
    dumped = os.listdir(tmp / "dump")
    assert any("jit_xlanb_graph_" in f for f in dumped), dumped[:10]


def _trace(directory) -> list[dict]:
    host = socket.gethostname()
    found = glob.glob(os.path.join(directory, "plugins", "profile", "*", f"{host}.trace.json.gz"))
    assert len(found) == 1, found
    with gzip.open(found[0], "rt") as f:
        data = json.load(f)
    assert isinstance(data["traceEvents"], list)
    for e in data["traceEvents"]:  # Chrome/Perfetto trace events: each has a phase, an
        # integer process and thread (JAX's included), and complete events are timed
        assert e.get("ph") and "name" in e, e
        assert type(e["pid"]) is int and type(e["tid"]) is int, e
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
    return data["traceEvents"]


def test_trace_has_the_annotations_as_events(run):
    tmp, _, _ = run
    events = _trace(tmp / "prof")
    steps = [e for e in events if e.get("name") == "train_step"]
    assert [e["args"]["step_num"] for e in steps] == [0, 1, 2]
    assert all(e["cat"] == "step annotation" for e in steps)
    names = [e.get("name") for e in events]
    assert names.count("forward") == 3 and names.count("backward") == 3
    assert "aten::addmm" in names and "ExecuteTime" in names  # xlanb.profile's own events
    # each forward lies inside its step
    for f in (e for e in events if e.get("name") == "forward"):
        assert any(s["ts"] <= f["ts"] and f["ts"] + f["dur"] <= s["ts"] + s["dur"] + 1
                   for s in steps)
    # the processes are named: xlanb's, and JAX's (apart) when its profiler ran
    procs = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert "xlanb" in procs.values()
    jax_pids = {p for p, n in procs.items() if n.startswith("JAX")}
    assert all(e["pid"] in procs for e in events)
    if any(n.endswith(".xplane.pb") for n in os.listdir(os.path.dirname(glob.glob(
            str(tmp / "prof" / "plugins" / "profile" / "*" / "*"))[0]))):
        assert jax_pids and any(e["ph"] == "X" for e in events if e["pid"] in jax_pids)
    detached = [e.get("name") for e in _trace(tmp / "prof_detached")]
    assert "train_step" in detached and "ExecuteTime" in detached


def test_memory_sharding_and_device_calls(run):
    _, out, _ = run
    assert "memory ['bytes_limit', 'bytes_used', 'kb_free', 'kb_total', 'peak_bytes_used'] " \
           "True True True" in out
    assert "xlac memory True" in out
    assert "devices 4 4 ['CPU:0']" in out
    assert "spec {devices=[4,1]0,1,2,3}" in out
    assert "spec replicated {replicated}" in out
    assert "spec none ''" in out
    assert "more True 4 1 0 0 xla:0 None True" in out


# --------------------------------------------------------------------------- this process

def test_mat_mul_precision_changes_what_is_compiled(tx):
    import torch_xla.backends as backends
    a = torch.randn(16, 16, device="xla")
    b = torch.randn(16, 16, device="xla")
    img = torch.randn(1, 2, 6, 6, device="xla")
    k = torch.randn(3, 2, 3, 3, device="xla")
    xlanb.sync()
    try:
        graphs = {}
        for p in ("default", "highest"):
            if p == "highest":  # torch_xla's C++ entry point sets the same
                tx._XLAC._xla_set_mat_mul_precision(p)
            else:
                backends.set_mat_mul_precision(p)
            assert backends.get_mat_mul_precision() == p == tx._XLAC._xla_get_mat_mul_precision()
            y = (a @ b).sum() + torch.nn.functional.conv2d(img, k).sum()
            hlo = xlanb.hlo(y, dialect="hlo")
            dots = re.findall(r"\b(?:dot|convolution)\([^\n]*", hlo)
            assert len(dots) == 2, hlo
            if p == "highest":  # XLA's precision_config, on both ops
                assert all("operand_precision={highest,highest}" in d for d in dots)
            else:
                assert not any("operand_precision" in d for d in dots)
            xlanb.sync()
            graphs[p] = xlanb.graphs()[-1]
        # two executables for one structure: the precision is in what was compiled
        assert graphs["default"] is not graphs["highest"]
        assert graphs["default"].hlo(dialect="hlo") != graphs["highest"].hlo(dialect="hlo")
        # and XLA kept it in the compiled executable's optimized module
        assert "operand_precision={highest,highest}" in graphs["highest"].hlo(optimized=True)
        assert "operand_precision" not in graphs["default"].hlo(optimized=True)
        with pytest.raises(ValueError, match="default, high, highest"):
            backends.set_mat_mul_precision("medium")
        with pytest.raises(ValueError, match="default, high, highest"):
            tx._XLAC._xla_set_mat_mul_precision("medium")
    finally:
        backends.set_mat_mul_precision("highest")
        xlanb.config.mat_mul_precision = None  # torch's knob decides again


def test_saved_graphs_as_hlo_and_debug_file(tx, tmp_path, monkeypatch):
    compat.uninstall()
    monkeypatch.setenv("XLA_SAVE_TENSORS_FILE", str(tmp_path / "g.hlo"))
    monkeypatch.setenv("XLA_SAVE_TENSORS_FMT", "hlo")
    monkeypatch.setenv("PT_XLA_DEBUG", "1")
    monkeypatch.setenv("PT_XLA_DEBUG_FILE", str(tmp_path / "debug.txt"))
    assert compat.install()
    x = torch.randn(5, 5, device="xla")
    y = (x * 3).tanh()
    xlanb.sync()
    saved = (tmp_path / "g.hlo.0").read_text()
    graph = saved.split("## BEGIN_GRAPH\n")[1].split("## END_GRAPH")[0]
    assert "HloModule" in graph and "tanh" in graph and "test_compat_debug.py" in graph
    debug = (tmp_path / "debug.txt").read_text()  # PT_XLA_DEBUG=1: every level
    assert "Compilation Analysis: Compilation Cause" in debug
    assert "Execution Analysis: Execution Cause" in debug
    assert f"({os.path.abspath(__file__)}:" in debug
    del y
    # the other formats: Graphviz DOT and StableHLO, one block per synced graph
    for fmt, mark in (("dot", "digraph"), ("stablehlo", "stablehlo.tanh")):
        compat.uninstall()
        monkeypatch.setenv("XLA_SAVE_TENSORS_FILE", str(tmp_path / f"g.{fmt}"))
        monkeypatch.setenv("XLA_SAVE_TENSORS_FMT", fmt)
        assert compat.install()
        y = (x * 3).tanh()
        xlanb.sync()
        saved = (tmp_path / f"g.{fmt}.0").read_text()
        assert saved.count("## BEGIN_GRAPH\n") == saved.count("## END_GRAPH\n") == 1
        assert mark in saved.split("## BEGIN_GRAPH\n")[1], saved[:2000]
        del y
    compat.uninstall()
    monkeypatch.setenv("XLA_SAVE_TENSORS_FMT", "png")
    with pytest.raises(ValueError, match="XLA_SAVE_TENSORS_FMT='png'.*text, hlo"):
        compat.install()
    assert not compat.installed()


def test_save_hlo_file_on_a_graph_error(tx, tmp_path, monkeypatch, capsys):
    compat.uninstall()
    monkeypatch.setenv("XLA_SAVE_HLO_FILE", str(tmp_path / "failed.hlo"))
    assert compat.install()
    import sys as _sys
    assert _sys.excepthook is debug_env._on_uncaught
    x = torch.randn(4, device="xla")
    y = x.sin() * 2  # pending, as a failed sync leaves it
    _sys.excepthook(ValueError, ValueError("not a graph's"), None)
    assert not (tmp_path / "failed.hlo.0").exists()
    err = RuntimeError("INTERNAL: compile failed")
    err.add_note("xlanb: while compiling a graph of 2 ops (user sync) synced at x.py:1")
    _sys.excepthook(RuntimeError, err, None)
    hlo = (tmp_path / "failed.hlo.0").read_text()
    assert "HloModule" in hlo and "sine" in hlo
    assert "the failing graph's HLO is in" in capsys.readouterr().err
    compat.uninstall()
    assert _sys.excepthook is not debug_env._on_uncaught
    del y


def test_profiler_calls_outside_a_trace_and_a_foreign_server(tx):
    import torch_xla.debug.profiler as xp
    with xp.Trace("nothing recorded"):  # no trace running: nothing to do
        pass
    with pytest.raises(RuntimeError, match="No profile started"):
        xp.stop_trace()
    with pytest.raises(RuntimeError, match="own process only.*start_trace"):
        xp.trace("10.0.0.2:8466", "/tmp/never")

    @xp.trace_me("decorated")
    def f(v):
        return v + 1
    assert f(1) == 2


def test_debugging_names_from_the_search(tx):
    """Names scripts and libraries use besides the issue's list (the torch_xla guide's table)."""
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    x = torch.randn(3, 3, device="xla")
    y = x.relu()
    assert "digraph" in tx._XLAC._get_xla_tensors_dot([y])
    info = tx._XLAC._get_xla_tensor_debug_info(y)
    assert info.startswith("XLATensor {") and "aten::relu" in info
    assert xm.get_stablehlo([y]) == xlanb.hlo(y)
    assert xm.get_xla_supported_devices(devkind="CPU") == xm.get_xla_supported_devices()
    assert xr.using_pjrt() and xr.global_runtime_device_attributes()[0]["name"].endswith(":0")
    xlanb.sync()
    assert tx._XLAC._xla_counter_value("MarkStep") == xlanb.metrics.counter_value("MarkStep")
    assert "Metric:" in tx._XLAC._xla_metrics_report()


def test_collective_errors_name_the_multi_process_way(tx):
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.xla_multiprocessing as xmp
    with pytest.raises(NotImplementedError) as e:
        xm.all_reduce
    assert "one process on one device" not in str(e.value)
    assert "xlanb.launch" in str(e.value) and "mark_sharding" in str(e.value)
    with pytest.raises(NotImplementedError, match="xlanb.launch --nproc"):
        xmp.spawn(print, nprocs=8)


def test_run_a_missing_script_is_one_line(run):
    (_, err), rc, folder = _MISSING[0]
    assert rc == 2  # as `python nosuch.py`, without runpy's traceback
    assert err.strip().splitlines() == [
        f"xlanb.run: can't open file {str(folder / 'nosuch.py')!r}: no such file"]


def test_the_guide_table_lists_each_debugging_name():
    section = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "docs", "guides", "torch-xla.md")).read()
    for name in ("start_trace", "stop_trace", "xp.Trace", "xp.StepTrace", "start_server",
                 "trace_detached", "trace_me", "PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG=1",
                 "PT_XLA_DEBUG_FILE", "XLA_SAVE_TENSORS_FILE", "XLA_SAVE_TENSORS_FMT",
                 "XLA_METRICS_FILE", "XLA_IR_DEBUG", "XLA_HLO_DEBUG", "--xla_dump_to",
                 "set_mat_mul_precision", "get_mat_mul_precision", "get_memory_info",
                 "_xla_memory_info", "_get_xla_sharding_spec", "use_spmd",
                 "global_runtime_device_count", "addressable_runtime_device_count",
                 "xla_real_devices", "XLA_USE_EAGER_DEBUG_MODE", "_get_xla_tensors_dot",
                 # issue 34's second audit
                 "initialize_cache", "set_device_type", "graph_saver", "_xla_get_default_device",
                 "_clear_pending_irs", "_get_num_cached_compilation_graph", "get_global_mesh",
                 "set_global_mesh", 'backend="openxla"', "openxla_eval", "XLA_DYNAMO_DEBUG",
                 "TF_CPP_VMODULE", "TF_CPP_MIN_LOG_LEVEL", "local_process_count",
                 "get_local_ordinal", "global_device_count", "get_xla_supported_devices",
                 "dynamo_bridge"):
        assert name in section, name
