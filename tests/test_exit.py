"""A program that ends while a tier-up compiles in the background ends at once (issue 57).

XLA cannot stop a compile, and the interpreter must not finalize while one runs: xlanb
waited for it (4 s after a one-step BERT script, up to 600 s). runtime/shutdown.py ends
the process without finalizing instead, with the program's own exit status, its atexit
handlers run and its files flushed, and the executable store holding nothing
half-written. Each case runs a child whose tier-up compile takes 10 s or more (four
XLA compiles of a 1,500-iteration loop, before the real one) and ends right after it
started."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from support import child_env

pytestmark = pytest.mark.slow

CHILD = r'''
import atexit, json, os, sys, time
import jax, jax.numpy as jnp
import torch, xlanb
from xlanb.execute import graphs


def loop(x):
    for i in range(1500):
        x = jnp.sin(x * 1.001 + i) + jnp.cos(x)
    return x


LONG = jax.jit(loop).lower(jax.ShapeDtypeStruct((64,), jnp.float32))
real = graphs.CompiledGraph.compile_optimized


def long_tier_up(self, metric):
    for i in range(4):  # XLA compiling for seconds (other options each time: no cache)
        LONG.compile({"xla_dump_hlo_pass_re": f"none{i}"})
    return real(self, metric)


graphs.CompiledGraph.compile_optimized = long_tier_up
x = torch.ones(1011, device="xla")
xlanb.sync()


def step():
    y = (x * 1.5 + 2.0).tanh().sum()
    xlanb.sync()
    return y


step()
step()  # its second run starts its optimized compile (the tier-up), in the background
g = xlanb.graphs()[-1]
log = open(sys.argv[2], "w")
log.write("all of it")  # never closed: finalization would have flushed it
atexit.register(print, "ATEXIT", flush=True)
print(json.dumps({"optimized": g.build().key, "quick": g.build().at("quick").key,
                  "tiering": g._tiering is not None and not g._tiering.done(),
                  "last": time.time()}), flush=True)
end = sys.argv[1]
if end == "exit3":
    sys.exit(3)
if end == "message":
    sys.exit("xlanb test: a message")
if end == "error":
    raise ValueError("xlanb test: an error")
'''

# how each program ends: its exit status, and what its stderr holds
ENDS = {"end": (0, None), "exit3": (3, None), "message": (1, "xlanb test: a message"),
        "error": (1, "ValueError: xlanb test: an error")}


@pytest.mark.parametrize("end", list(ENDS))
def test_a_program_ends_at_once_during_a_long_tier_up_with_its_own_status(end, tmp_path):
    store_dir, log = tmp_path / "store", tmp_path / "log.txt"
    env = child_env({"XLANB_STORE_DIR": str(store_dir),
                     "XLANB_STORE_KEY": str(tmp_path / "key" / "store-key")})
    proc = subprocess.Popen([sys.executable, "-c", CHILD, end, str(log)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    ended = time.time()
    status, says = ENDS[end]
    assert proc.returncode == status, (proc.returncode, err[-3000:])
    assert "terminate called" not in err and "Fatal Python error" not in err, err[-3000:]
    assert says is None or err.count(says) == 1, err[-3000:]  # said once (by Python)
    lines = out.splitlines()
    info = json.loads(lines[0])
    assert info["tiering"], "the tier-up was not compiling at the end"
    # ended well before the tier-up could have (four compiles of seconds each; the
    # bound is generous for a loaded machine: bench_modes.py measures the exit)
    assert ended - info["last"] < 5.0, ended - info["last"]
    assert "ATEXIT" in lines[1:], out  # the program's atexit handlers ran
    assert log.read_text() == "all of it"  # and its open file was flushed
    # the store: the quick executable, whole; nothing of the cut-off tier-up, no
    # temporary file of a write in progress
    files = [os.path.join(d, f) for d, _, fs in os.walk(store_dir) for f in fs]
    names = {os.path.basename(f) for f in files}
    assert info["quick"] in names and info["optimized"] not in names, files
    assert not [f for f in names if f.startswith(".tmp-")], files


# The status logic alone, without XLA: background work that stays pending for 8 s after
# the program's last line. Where the status is known the process ends at once with it;
# where it is not (a SystemExit that sys.exit did not raise) it waits, as before, and
# ends with the interpreter's own status. A multiprocessing child's own status stands
# (its threading._shutdown is called by Python, and a forked one has no compile threads).
FAKE = r'''
import multiprocessing, os, sys, time
from xlanb.runtime import shutdown
LAST = [time.monotonic() + 1e9]
shutdown.add_work("fake compile", lambda: time.monotonic() < LAST[0] + 8, lambda: None)


def failing_child():
    raise ValueError("xlanb test: the child failed")


if __name__ == "__main__":
    end = sys.argv[1]
    if end == "fork":
        p = multiprocessing.get_context("fork").Process(target=failing_child)
        p.start()
        p.join()
        print("child", p.exitcode, flush=True)
    LAST[0] = time.monotonic()
    print("last", time.time(), flush=True)
    if end == "exit":
        sys.exit()
    if end == "raise2":
        raise SystemExit(2)
    if end == "interrupt":
        raise KeyboardInterrupt
    if end == "exit3":
        sys.exit(3)
'''

# end: (how it runs, its status, whether it ends at once)
FAKE_ENDS = {"exit": ("script", 0, True), "raise2": ("script", 2, False),
             "interrupt": ("script", -2, True), "fork": ("script", 0, True),
             "exit3": ("module", 3, True), "end": ("module", 0, False)}


@pytest.mark.parametrize("end", list(FAKE_ENDS))
def test_the_exit_status_is_the_programs(end, tmp_path):
    how, status, at_once = FAKE_ENDS[end]
    (tmp_path / "fake_prog.py").write_text(FAKE)
    cmd = [sys.executable, str(tmp_path / "fake_prog.py"), end] if how == "script" else \
        [sys.executable, "-m", "fake_prog", end]
    env = child_env()
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    ended = time.time()
    assert proc.returncode == status, (proc.returncode, proc.stderr[-3000:])
    last = float(proc.stdout.split("last ")[1].split()[0])
    assert (ended - last < 5.0) == at_once, (ended - last, proc.stderr[-3000:])
    if end == "fork":
        assert "child 1" in proc.stdout, proc.stdout  # the failing child's status stands
