"""The cost of the device-side index bounds check on the BERT training step.

    python benchmarks/bench_index_checks.py [--steps N] [--rounds R] [--paired]

xlanb checks index values the host has before an op runs, and an index computed on the
device (pending in a lazy graph) inside the graph of the next sync: one fused
``[min, max]`` output per checked index, read back after the run
(``xlanb/values/checks.py``). ``XLANB_CHECK_DEVICE_INDICES=0`` turns the device part
off. Each configuration runs in a fresh process (no executable store, so the first step
compiles): the first step's graph compile time and the median steady lazy step, for

- ``host ids``: the benchmark's usual step (benchmarks/scenarios.py): ids and labels
  copied from the host once. Their values are known; BERT's position and token-type ids
  are views of module buffers, checked in the graph.
- ``device ids``: the same step with ids and labels computed on the device each step
  (``ids * 1``), so every embedding and the loss's labels are checked in the graph.

``--paired``: the steady step only, the check on and off alternated step by step in one
process (``config.check_device_indices`` switched between steps: both graphs compile
first), which shares the machine's drift between the two.

Prints one JSON object. A measurement, never a test assertion.
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


def child(steps: int, device_ids: bool) -> dict:
    sys.path.insert(0, HERE)
    from scenarios import Backend, make_bert, train_step
    b = Backend("xlanb")
    x = b.x
    x.set_mode("lazy")
    model, opt, ids, labels = make_bert(b, layers=2)
    b.sync()
    x.metrics.clear()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        i, l = (ids * 1, labels * 1) if device_ids else (ids, labels)
        train_step(b, model, opt, i, l).item()
        times.append(time.perf_counter() - t0)
    data = x.metrics.metric_data("CompileTime")
    checked = [g for g in x.graphs() if "xlanb::index_bounds" in g.ops]
    return {"first_step_s": times[0], "steady_step_s": statistics.median(times[2:]),
            "compile_s": data[1] if data else None,
            "graphs": len(x.graphs()), "graphs_with_check": len(checked)}


def paired(steps: int, device_ids: bool) -> dict:
    """The steady lazy step with the device check on and off, alternated step by step in
    one process (both graphs compiled first): the difference of the medians, with the
    machine's drift shared."""
    sys.path.insert(0, HERE)
    from scenarios import Backend, make_bert, train_step
    b = Backend("xlanb")
    x = b.x
    x.set_mode("lazy")
    model, opt, ids, labels = make_bert(b, layers=2)
    b.sync()
    times: dict = {True: [], False: []}
    for i in range(2 * steps + 4):
        on = i % 2 == 0
        x.config.check_device_indices = on
        t0 = time.perf_counter()
        i_, l_ = (ids * 1, labels * 1) if device_ids else (ids, labels)
        train_step(b, model, opt, i_, l_).item()
        if i >= 4:  # both graphs compiled and run once
            times[on].append(time.perf_counter() - t0)
    x.config.check_device_indices = True
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return {"steady_on_s": round(on, 4), "steady_off_s": round(off, 4),
            "difference_ms": round(1e3 * (on - off), 2)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", choices=("host", "device"))
    ap.add_argument("--paired", action="store_true",
                    help="only the steady step, on and off alternated in one process")
    args = ap.parse_args(argv)
    if args.paired:
        out = {f"{ids} ids": paired(args.steps, ids == "device") for ids in ("host", "device")}
        print(json.dumps(out, indent=1))
        return out
    if args.child:
        print(json.dumps(child(args.steps, args.child == "device")))
        return {}
    res: dict = {}
    for _ in range(args.rounds):  # interleaved, to share the machine's drift
        for ids in ("host", "device"):
            for check in ("1", "0"):
                env = dict(os.environ, XLANB_CHECK_DEVICE_INDICES=check, XLANB_STORE_DIR="",
                           XLANB_BACKGROUND_COMPILE="0")
                out = subprocess.run([sys.executable, __file__, "--child", ids,
                                      "--steps", str(args.steps)], env=env, check=True,
                                     capture_output=True, text=True).stdout
                row = json.loads(out.strip().splitlines()[-1])
                res.setdefault(f"{ids} ids, check {'on' if check == '1' else 'off'}", []).append(row)
    summary = {k: {f: round(statistics.median(r[f] for r in rows), 4) if f.endswith("_s")
                   else rows[0][f] for f in rows[0]} for k, rows in res.items()}
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
