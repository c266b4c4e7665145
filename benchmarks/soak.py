"""A long session in one process, with the executable store on: does it survive, does
its memory stay flat, do its answers stay right? (issue 26)

    python benchmarks/soak.py [--signatures N] [--revisit N] [--steps N] [--switch-every K]
                              [--max-executables N] [--store-max-bytes B] [--short] [--json]

The session runs in a child process, so that a native crash is reported (its exit
status and the last sample before it) instead of taking the report with it:
1. signatures: N distinct single-op signatures in eager mode (unary, binary, reduction
   and matmul ops over 9 dtypes, complex included, and many shapes), each compared with
   CPU torch; then the first ``--revisit`` of them again, whose executables were dropped
   from the loaded set by then and come back from the store;
2. training: a small MLP for ``--steps`` SGD steps, the mode switched every K steps
   (lazy, eager, opbyop in turn), against the same model trained on CPU torch.
It prints the RSS and the process's memory mappings over time, the store's size, and
the executables compiled, written, loaded and evicted. ``--short`` is the few-minute
version CI runs (tests/test_soak.py); a measurement, never a timed test.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COUNTERS = ("OpCompile", "UncachedCompile", "PersistentCacheWrite", "PersistentCacheHit",
            "PersistentCacheMiss", "OpExecutableEvicted", "PersistentCacheEvicted")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _maps() -> int:
    # not xlanb.runtime.maps.count: the soak also measures checkouts from before it
    with open("/proc/self/maps", "rb") as f:
        return f.read().count(b"\n")


def _store_bytes(cache_dir: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(cache_dir):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


# ---------------------------------------------------------------------------------------
# The child: the session itself

def _signature_cases(n: int):
    """``n`` distinct (op, dtype, shape) cases, cycling through ops and dtypes so that
    every dtype meets every op family early."""
    import torch
    floats = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    complexes = (torch.complex64, torch.complex128)
    ints = (torch.int32, torch.int64)
    unary_f = ("sin", "exp", "tanh", "sqrt_abs", "nan_to_num", "sigmoid")
    unary_c = ("exp", "abs", "neg", "mul_conj")
    unary_i = ("neg", "abs", "square")
    binary = ("add", "mul", "sub", "maximum")
    reduce = ("sum", "mean_float", "amax", "std_float", "cumsum")
    families = [(d, op) for d in floats for op in unary_f + binary + reduce + ("mm",)]
    families += [(d, op) for d in complexes for op in unary_c + ("add", "mul", "sum", "std_c", "mm")]
    families += [(d, op) for d in ints for op in unary_i + binary + ("sum", "amax", "cumsum")]
    families += [(torch.bool, op) for op in ("logical_not", "logical_and", "any")]
    cases = []
    i = 0
    while len(cases) < n:
        d, op = families[i % len(families)]
        k = i // len(families)
        cases.append((op, d, (k % 23 + 1, k // 23 + 1)))
        i += 1
    return cases


def _apply(op: str, x, y):
    import torch
    if op == "sqrt_abs":
        return x.abs().sqrt()
    if op == "nan_to_num":
        return torch.nan_to_num(x / (x - x.mean()), posinf=7.0)
    if op == "mul_conj":
        return x * x.conj()
    if op == "square":
        return x * x
    if op in ("add", "mul", "sub", "maximum", "logical_and"):
        return getattr(torch, op)(x, y)
    if op == "mean_float":
        return x.mean(dim=0)
    if op in ("std_float", "std_c"):
        return x.std(dim=-1)
    if op in ("sum", "amax", "cumsum"):
        return getattr(torch, op)(x, dim=0)
    if op == "any":
        return x.any(dim=-1)
    if op == "mm":
        return x @ y.transpose(0, 1)
    return getattr(torch, op)(x)


def _close(a, b, dtype) -> bool:
    import torch
    low = dtype in (torch.float16, torch.bfloat16)
    try:
        torch.testing.assert_close(a, b, rtol=2e-2 if low else 1e-4, atol=2e-2 if low else 1e-5,
                                   equal_nan=True)
        return True
    except AssertionError:
        return False


def _phase_signatures(n: int, emit, revisit: int = 0) -> int:
    """``n`` new signatures, then the first ``revisit`` again: by then their executables
    were dropped from the loaded set, so they come back from the store."""
    import torch
    import xlanb
    xlanb.set_mode("eager")
    gen = torch.Generator().manual_seed(0)
    wrong = 0
    cases = _signature_cases(n)
    phase = "signatures"
    for i, (op, dtype, shape) in enumerate(cases + cases[:revisit]):
        if i == n:
            phase = "revisit"
            emit({"phase": phase, "done": 0})
        if dtype.is_floating_point or dtype.is_complex:
            x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
            y = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
            if dtype.is_complex:
                x = x + 1j * torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
        elif dtype == torch.bool:
            x = torch.randint(0, 2, shape, generator=gen).bool()
            y = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            x = torch.randint(-50, 50, shape, generator=gen, dtype=dtype)
            y = torch.randint(-50, 50, shape, generator=gen, dtype=dtype)
        want = _apply(op, x, y)
        got = _apply(op, x.to("xla"), y.to("xla")).cpu()
        if got.dtype != want.dtype or not _close(got, want, dtype):
            wrong += 1
            emit({"wrong": [op, str(dtype), list(shape)]})
        if i % 250 == 249:
            emit({"phase": phase, "done": i + 1 if i < n else i + 1 - n})
    return wrong


def _phase_training(steps: int, switch_every: int, emit) -> float:
    import torch
    import xlanb
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                              torch.nn.Linear(64, 8))
    dev = copy.deepcopy(cpu).to("xla")
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.01, momentum=0.9)
    opt_d = torch.optim.SGD(dev.parameters(), lr=0.01, momentum=0.9)
    data = torch.Generator().manual_seed(1)
    modes = ("lazy", "eager", "opbyop")
    for step in range(steps):
        xlanb.set_mode(modes[(step // switch_every) % len(modes)])
        x = torch.randn(16, 32, generator=data)
        t = torch.randn(16, 8, generator=data)
        for model, opt, dv in ((cpu, opt_c, "cpu"), (dev, opt_d, "xla")):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x.to(dv)), t.to(dv))
            loss.backward()
            opt.step()
        xlanb.sync()
        if step % 100 == 99:
            emit({"phase": "training", "done": step + 1})
    return max((a - b.cpu()).abs().max().item() for a, b in zip(cpu.parameters(), dev.parameters()))


def child(a) -> None:
    import xlanb  # XLANB_STORE_DIR and XLANB_MAX_EXECUTABLES come from the parent
    from xlanb.base.session import session
    t0 = time.perf_counter()

    def emit(rec: dict) -> None:
        rec.update(t=round(time.perf_counter() - t0, 2), rss_mib=round(_rss_mib(), 1),
                   maps=_maps(), loaded=len(getattr(session, "resident", ())),
                   store_bytes=_store_bytes(a.cache_dir),
                   counters={k: xlanb.metrics.counter_value(k) or 0 for k in COUNTERS})
        print("SOAK " + json.dumps(rec), flush=True)

    emit({"phase": "start"})
    wrong = _phase_signatures(a.signatures, emit, a.revisit)
    drift = _phase_training(a.steps, a.switch_every, emit)
    emit({"phase": "end", "wrong": wrong, "max_param_diff": drift})


# ---------------------------------------------------------------------------------------
# The parent: run it, report it

def run(a) -> dict:
    cache_dir = a.cache_dir or tempfile.mkdtemp(prefix="xlanb-soak-")
    env = dict(os.environ, XLANB_STORE_DIR=cache_dir, PYTHONFAULTHANDLER="1")
    if a.max_executables:
        env["XLANB_MAX_EXECUTABLES"] = str(a.max_executables)
    if a.store_max_bytes:
        env["XLANB_STORE_MAX_BYTES"] = a.store_max_bytes
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--cache-dir", cache_dir,
           "--signatures", str(a.signatures), "--revisit", str(a.revisit), "--steps", str(a.steps),
           "--switch-every", str(a.switch_every)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    samples = [json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("SOAK ")]
    end = samples[-1] if samples and samples[-1].get("phase") == "end" else None
    return {"exit_status": proc.returncode, "survived": proc.returncode == 0 and end is not None,
            "seconds": round(time.perf_counter() - t0, 1),
            "wrong": end["wrong"] if end else None,
            "max_param_diff": end["max_param_diff"] if end else None,
            "samples": samples, "stderr_tail": proc.stderr[-3000:] if proc.returncode else ""}


def report(r: dict) -> str:
    lines = [f"exit status {r['exit_status']}, survived: {r['survived']}, {r['seconds']} s; "
             f"results that differ from CPU torch: {r['wrong']}; training, largest parameter "
             f"difference from CPU: {r['max_param_diff']}",
             "", "| t (s) | phase | done | RSS (MiB) | mappings | loaded | store (MiB) | "
             + " | ".join(COUNTERS) + " |", "|" + "---|" * (7 + len(COUNTERS))]
    for s in r["samples"]:
        if "wrong" in s and "phase" not in s:
            continue
        c = s["counters"]
        lines.append(f"| {s['t']} | {s.get('phase', '')} | {s.get('done', '')} | {s['rss_mib']} | "
                     f"{s['maps']} | {s['loaded']} | {s['store_bytes'] / 2**20:.1f} | "
                     + " | ".join(str(c[k]) for k in COUNTERS) + " |")
    if r["stderr_tail"]:
        lines += ["", "stderr (tail):", r["stderr_tail"]]
    return "\n".join(lines)


def main(argv=None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--signatures", type=int, default=6000)
    ap.add_argument("--revisit", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--switch-every", type=int, default=5)
    ap.add_argument("--max-executables", type=int, default=0,
                    help="XLANB_MAX_EXECUTABLES for the session (0: xlanb's default)")
    ap.add_argument("--store-max-bytes", default="", help="XLANB_STORE_MAX_BYTES (e.g. 20M)")
    ap.add_argument("--short", action="store_true",
                    help="the CI version: 400 signatures (100 revisited), 60 steps, 64 executables loaded, "
                         "a 2M store, so both evictions run")
    ap.add_argument("--cache-dir", default="")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a)
        return None
    if a.short:
        a.signatures, a.revisit, a.steps, a.switch_every = 400, 100, 60, 3
        a.max_executables = a.max_executables or 64
        a.store_max_bytes = a.store_max_bytes or "2M"
    r = run(a)
    print(json.dumps(r) if a.json else report(r))
    return r


if __name__ == "__main__":
    res = main()
    sys.exit(0 if res is None or res["survived"] else 1)
