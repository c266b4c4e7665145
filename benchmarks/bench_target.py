"""TPU targets, measured: how long libtpu takes to compile the BERT training step of
benchmarks/scenarios.py (hidden 256, batch 8 x 128, AdamW) for one TPU v5e chip at 2, 8
and 24 layers, and what ``with xlanb.target(...)`` adds to the CPU's own steps (its
compiles run on the compile threads; the goal is under 5% on the steady step).

    python benchmarks/bench_target.py [--layers 2,8,24] [--steps 12] [--target v5e:1x1]
    python benchmarks/bench_target.py --scan [--layers 2,8,24]   # compiles only

``--scan`` compiles each depth twice, unrolled (``XLANB_SCAN_LAYERS=0``) and with the
repeated layers as loops (``=1``), one after the other, and skips the CPU steps.

Each measurement runs in a fresh process (a first step includes its compiles), with the
executable store off. Prints a JSON object and a table with the CPU model.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_modes import _cpu_model  # noqa: E402


def compile_seconds(layers: int, target: str) -> dict:
    """In this process: the step recorded, then compiled for ``target`` only."""
    sys.path.insert(0, HERE)
    from scenarios import Backend, make_bert
    b = Backend("xlanb")
    x = b.x
    model, opt, ids, labels = make_bert(b, layers)
    x.sync()
    loss = model(input_ids=ids, labels=labels).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    ops = x.pending_count()
    t0, c0 = time.perf_counter(), time.process_time()
    r = x.compile_for(target)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    # CPU seconds too: on a shared machine they move less with the load than wall time
    return {"layers": layers, "ops": ops, "tpu_compile_s": r.compile_seconds,
            "compile_for_s": wall, "compile_for_cpu_s": cpu, "peak_bytes": r.memory.peak_bytes if r.memory else None,
            "fits": r.fits, "estimate": r.summary_line()}


def cpu_steps(layers: int, steps: int, target: str | None) -> dict:
    """In this process: ``steps`` CPU training steps, with or without a target set."""
    sys.path.insert(0, HERE)
    from scenarios import Backend, make_bert, train_step
    b = Backend("xlanb")
    x = b.x
    if target:
        x.set_target(target)
    model, opt, ids, labels = make_bert(b, layers)
    x.sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        train_step(b, model, opt, ids, labels).item()
        times.append(time.perf_counter() - t0)
    reports = [g.target for g in x.graphs()] if target else []  # waits for the TPU compiles
    return {"first_step_s": times[0], "steady_step_s": statistics.median(times[2:]),
            "steady_steps": times[2:],
            "tpu_reports": [r.summary_line() for r in reports if r is not None]}


def _child(kind: str, env_extra: dict | None = None, **kw) -> dict:
    env = dict(os.environ, XLANB_STORE_DIR="", **(env_extra or {}))
    code = (f"import json, sys; sys.path.insert(0, {HERE!r}); import bench_target as b; "
            f"print('RESULT' + json.dumps(b.{kind}(**{kw!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.split("RESULT", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="2,8,24")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--target", default="v5e:1x1")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the CPU steps")
    ap.add_argument("--scan", action="store_true",
                    help="TPU compiles unrolled and with loops, side by side; no CPU steps")
    args = ap.parse_args()
    if args.scan:
        return scan_table(args)
    out = {"cpu": _cpu_model(), "cores": os.cpu_count(), "target": args.target,
           "compile": [], "steps": {}}
    for n in (int(v) for v in args.layers.split(",")):
        out["compile"].append(_child("compile_seconds", layers=n, target=args.target))
        print(json.dumps(out["compile"][-1]), file=sys.stderr)
    off, on = [], []
    for _ in range(args.rounds):  # interleaved: the machine's drift falls on both
        off.append(_child("cpu_steps", layers=2, steps=args.steps, target=None))
        on.append(_child("cpu_steps", layers=2, steps=args.steps, target=args.target))
    med = lambda runs, k: statistics.median(r[k] for r in runs)  # noqa: E731
    out["steps"] = {
        "without_target": {"first_step_s": med(off, "first_step_s"),
                           "steady_step_s": med(off, "steady_step_s")},
        "with_target": {"first_step_s": med(on, "first_step_s"),
                        "steady_step_s": med(on, "steady_step_s"),
                        "tpu_reports": on[-1]["tpu_reports"]},
    }
    print(json.dumps(out, indent=1))
    print(f"\nCPU: {out['cpu']}, {out['cores']} cores; target {args.target}")
    print("| layers | ops | TPU compile (s) | peak per chip |")
    print("|---|---|---|---|")
    for c in out["compile"]:
        peak = f"{c['peak_bytes'] / 2**20:.0f} MiB" if c["peak_bytes"] else "?"
        print(f"| {c['layers']} | {c['ops']} | {c['tpu_compile_s']:.1f} | {peak} |")
    s = out["steps"]
    a, b = s["without_target"], s["with_target"]
    print("| 2-layer step | no target | with target | change |")
    print("|---|---|---|---|")
    for k in ("first_step_s", "steady_step_s"):
        print(f"| {k} | {a[k]:.3f} | {b[k]:.3f} | {100 * (b[k] / a[k] - 1):+.1f}% |")


def scan_table(args) -> None:
    rows = []
    for n in (int(v) for v in args.layers.split(",")):
        row = {"layers": n}
        for key, flag in (("unrolled", "0"), ("loops", "1")):
            row[key] = _child("compile_seconds", {"XLANB_SCAN_LAYERS": flag}, layers=n,
                              target=args.target)
            print(json.dumps({key: row[key]}), file=sys.stderr)
        rows.append(row)
    print(json.dumps({"cpu": _cpu_model(), "cores": os.cpu_count(), "target": args.target,
                      "rows": rows}, indent=1))
    print(f"\nCPU: {_cpu_model()}, {os.cpu_count()} cores; target {args.target}")
    print("| layers | ops | TPU compile, unrolled: wall / CPU (s) | with loops: wall / CPU (s) "
          "| peak per chip, unrolled / loops |")
    print("|---|---|---|---|---|")
    mib = lambda c: f"{c['peak_bytes'] / 2**20:.0f}" if c["peak_bytes"] else "?"  # noqa: E731
    for r in rows:
        u, lp = r["unrolled"], r["loops"]
        print(f"| {r['layers']} | {u['ops']} | {u['tpu_compile_s']:.1f} / {u['compile_for_cpu_s']:.1f} "
              f"| {lp['tpu_compile_s']:.1f} / {lp['compile_for_cpu_s']:.1f} "
              f"| {mib(u)} / {mib(lp)} MiB |")


if __name__ == "__main__":
    main()
