"""Two processes of one SPMD program that stop agreeing (tests/test_divergence.py):
``python -m xlanb.launch --nproc 2 --devices-per-proc 2 divergence_cases.py MODE:CASE,...``.

Each case prints ``CASE <process> <name> <json>``: its value, or the DivergenceError it
raised. The cases run in order in the same two processes (a DivergenceError is raised
before anything runs, so both go on); "stop", "end", "crash" or "busy" comes last:
process 1 stops arriving (asleep, or busy in torch), ends its program or crashes, and
both processes end. Lines the test looks for are
marked ``# LINE:<name>``."""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

import xlanb
import xlanb.spmd as xs

xlanb.distributed.initialize()
cases = sys.argv[1].split(",")
rank = xlanb.distributed.process_index()
mesh = xs.Mesh(range(4), (4,), ("data",))
g = torch.Generator().manual_seed(0)
x_cpu, w_cpu = torch.randn(8, 4, generator=g), torch.randn(4, 3, generator=g)
x = x_cpu.to("xla")
xs.mark_sharding(x, mesh, ("data", None))
w = w_cpu.to("xla")


def fence():
    """A run both processes make at the end of each case: where process 0 meets an
    extra eager op of process 1."""
    return (x * 0).sum().item()


def correct():
    y = (x @ w).sum()
    xlanb.sync()
    return [y.item(), fence()]


def extra_op():
    y = (x @ w).sum()
    if rank == 1:
        y = y * 2  # LINE:extra_op
    xlanb.sync()
    return [y.item(), fence()]


def extra_collective():
    y = (x @ w).sum()
    if rank == 1:
        y = y + (x * 3).sum()  # LINE:extra_collective
    xlanb.sync()
    return [y.item(), fence()]


def scalar():
    """Issue 46, item 5: the same graph, but another Python number in process 1."""
    lr = 0.1 if rank == 0 else 0.2
    y = (x @ w).sum() * lr  # LINE:scalar
    xlanb.sync()
    return [y.item(), fence()]


def key():
    """Dropout over the sharded batch with another seed in process 1: the same graph,
    another random key."""
    torch.manual_seed(rank)
    try:
        y = (torch.nn.functional.dropout(x, 0.5) @ w).sum()  # LINE:key
        xlanb.sync()
        return [y.item(), fence()]
    finally:
        torch.manual_seed(0)


def crash():
    """Process 1 ends with an uncaught error where process 0 runs on (issue 46, 17)."""
    if rank == 1:
        return {}["no such key"]  # LINE:crash
    y = (x @ w).sum() + 2
    xlanb.sync()  # LINE:crash_sync
    return [y.item()]


def busy():
    """Process 1 spins in torch's own functions (on the CPU) and never arrives (issue 46,
    item 8): it is waited for a bounded number of times, and named at its line."""
    if rank == 1:
        z = torch.randn(4, 200)
        while True:
            z = torch.nn.functional.normalize(torch.nn.functional.layer_norm(z, (200,)))  # LINE:busy
    y = (x @ w).sum()
    xlanb.sync()
    return [y.item()]


def replicas():
    torch.manual_seed(100 + rank)  # a parameter initialized from another seed per host
    p = torch.randn(4, 4).to("xla")
    xs.mark_sharding(p, mesh, (None, None))
    return [[str(m.index), list(m.devices), list(m.odd), list(m.odd_processes)]
            for m in xs.replica_mismatches(p)]


def recorder():
    if rank == 0:  # the flight recorder on SIGUSR1 (stderr): the launcher passes it on
        os.kill(os.getppid(), signal.SIGUSR1)
    time.sleep(0.3)
    return [str(r) for r in xlanb.distributed.recent()]


def unchecked():
    """The extra op with the check off (XLANB_DIST_CHECK=0, here changed at run time):
    nothing is checked, and each process has its own answer."""
    xlanb.config.dist_check = False
    try:
        return extra_op()
    finally:
        xlanb.config.dist_check = True


def slow_compile():
    """Process 1 compiles for longer than XLANB_DIST_TIMEOUT: it is waited for."""
    import xlanb.executables.compile as op_compile
    real = op_compile.compile_lowered

    def slow(*args, **kwargs):
        time.sleep(5 if rank == 1 else 0)  # LINE:slow_compile
        return real(*args, **kwargs)

    op_compile.compile_lowered = slow
    try:
        y = (x @ w).sum() * 3
        xlanb.sync()
    finally:
        op_compile.compile_lowered = real
    return [y.item()]


def stop():
    y = (x @ w).sum()
    if rank == 1:
        time.sleep(120)  # LINE:stop
    xlanb.sync()
    return [y.item(), fence()]


def end():
    """Process 1 ends its program (its next case would be process 0's next run)."""
    if rank == 1:
        sys.exit(0)
    y = (x @ w).sum() + 1
    xlanb.sync()  # LINE:end
    return [y.item()]


def sweep():
    """Process 0 sweeps the store's keys of runs two blocks of 64 back: the keys left
    under xlanb/agree/ after it swept the runs so far, and which of those diverged."""
    from xlanb.base.session import session
    agree = session.agree
    diverged = [r.seq for r in agree.recent if r.status == "diverged"]
    start = agree.seq
    # both processes skip to the run that sweeps start's block (rather than make 128 runs)
    agree.seq = ((start >> 6) + 2) * 64
    fence()
    time.sleep(0.2)  # process 0 sweeps after its run: let it
    # the store's folders: xlanb/agree/<block of 64 runs>/<run>/<process>
    folders = sorted({k.split("/")[2] for k, _ in agree.client.key_value_dir_get("xlanb/agree/")})
    return {"diverged": diverged, "from": start, "to": agree.seq, "folders": folders}


def say(case, out):
    sys.stdout.write(f"CASE {rank} {case} {json.dumps(out)}\n")  # one write: one line
    sys.stdout.flush()


for case in cases:  # MODE:NAME
    mode, _, name = case.rpartition(":")
    xlanb.set_mode(mode or "lazy")
    try:
        out = {"value": globals()[name]()}
    except xlanb.distributed.DivergenceError as e:
        out = {"error": str(e), "type": type(e).__name__, "processes": list(e.processes)}
        if name in ("stop", "end", "crash", "busy"):
            say(case, out)
            raise
    say(case, out)
