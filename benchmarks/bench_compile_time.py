"""Where the BERT training step's compile time goes (issue 48, docs/compile-time.md):
the step of benchmarks/scenarios.py (hidden 256, 4 heads, batch 8 x 128, AdamW),
compiled for the CPU (a lazy sync) and then for a TPU target, each profile printed.

    python benchmarks/bench_compile_time.py --layers 2 [--target v5e:1x1] [--no-cpu]

XLANB_SCAN_LAYERS applies as set in the environment. Each compile's wall seconds and
its process CPU seconds (``*_cpu_s``, every thread's) are printed: on a loaded machine the
wall seconds of the same TPU compile moved 2.3x between runs; CPU seconds count the work
done, not the wait for a core. One process per run: the CPU's
phase spans need JAX's profiler, which cannot start once libtpu is loaded, so the CPU
compile comes first. The executable store is off, and the CPU compile is the optimized
one (``XLANB_QUICK_COMPILES=0`` unless set).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["XLANB_STORE_DIR"] = ""
# the optimized compile, with XLA:CPU's per-fusion spans (a quick one splits evenly)
os.environ.setdefault("XLANB_QUICK_COMPILES", "0")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--target", default="v5e:1x1")
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--no-target", action="store_true")
    args = ap.parse_args()
    from bench_modes import _cpu_model
    from scenarios import Backend, make_bert

    import xlanb
    b = Backend("xlanb")
    model, opt, ids, labels = make_bert(b, args.layers)
    xlanb.sync()
    loss = model(input_ids=ids, labels=labels).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    res = {"cpu": _cpu_model(), "layers": args.layers,
           "scan_layers": os.environ.get("XLANB_SCAN_LAYERS", "auto"),
           "load": os.getloadavg()[0]}
    if not args.no_target:
        lowering_ops = xlanb.pending_count()
        res["ops"] = lowering_ops
    if not args.no_cpu:
        # the step's graph as the CPU compiles it: a sync (every new graph is compiled
        # here first; the TPU's compile below reads the same pending work again)
        t0, c0 = time.perf_counter(), time.process_time()
        xlanb.sync()
        res["cpu_sync_s"] = time.perf_counter() - t0
        # the process's CPU seconds (every thread's): the work done, not the wait for a
        # core on a shared machine
        res["cpu_sync_cpu_s"] = time.process_time() - c0
        g = max(xlanb.graphs(), key=lambda g: g.n_nodes)
        p = g.compile_profile
        print(p)
        res["cpu_profile"] = {"total_s": p.total_s, "phases": p.phases(),
                              "top_scopes": [tuple(r) for r in p.by_scope(6)]}
        what = [g]
    else:
        what = []
    if not args.no_target:
        c0 = time.process_time()
        r = xlanb.compile_for(args.target, *what)
        res["target_cpu_s"] = time.process_time() - c0
        p = r.compile_profile
        print(p)
        res["tpu_profile"] = {"total_s": p.total_s, "phases": p.phases(),
                              "top_scopes": [tuple(r) for r in p.by_scope(6)],
                              "notes": list(p.notes)}
    print("JSON " + json.dumps(res))


if __name__ == "__main__":
    main()
