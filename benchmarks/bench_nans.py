"""The cost of ``xlanb.debug_nans`` on the BERT training step (benchmarks/scenarios.py).

    python benchmarks/bench_nans.py [--steps N] [--modes lazy,opbyop,eager]

For each mode: the steady step time (median of steps 2..N) with debug_nans off, then on
(no NaN: one fused finiteness check per sync, plus the dispatch mode that notes where
backward ops come from; eager checks every op). Prints one JSON object. A measurement,
never a test assertion.

Measured (2-core CPU, shared machine, so +-3 ms noise; 2-layer BERT, hidden 256, batch 8
x 128, AdamW): lazy 88 -> 97 ms per step (+8 ms, +10%; the fused sync check alone
+2.5 ms, the rest is the dispatch mode that notes where backward ops come from); opbyop
137 -> 145 ms (+6%); eager 128 -> 261 ms (x2: every op's result is checked as it is made).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scenarios import Backend, make_bert, train_step  # noqa: E402


def steady(b, model, opt, ids, labels, steps: int) -> float:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        train_step(b, model, opt, ids, labels).item()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--modes", default="lazy,opbyop")
    args = ap.parse_args(argv)
    b = Backend("xlanb")
    x = b.x
    res = {}
    for mode in args.modes.split(","):
        b.set_mode(mode)
        model, opt, ids, labels = make_bert(b, layers=2)
        b.sync()
        steady(b, model, opt, ids, labels, 2)  # warm every cache first
        with x.debug_nans():
            steady(b, model, opt, ids, labels, 2)
        rows = {}
        for _ in range(2):  # interleaved, to share the machine's drift
            rows.setdefault("off", []).append(steady(b, model, opt, ids, labels, args.steps))
            with x.debug_nans():
                rows.setdefault("on", []).append(steady(b, model, opt, ids, labels, args.steps))
            x.config.debug_nans = True  # the sync check alone, without the dispatch mode
            try:
                rows.setdefault("check", []).append(steady(b, model, opt, ids, labels, args.steps))
            finally:
                x.config.debug_nans = False
        off, on, check = min(rows["off"]), min(rows["on"]), min(rows["check"])
        res[mode] = {"off_step_s": round(off, 4), "on_step_s": round(on, 4),
                     "overhead_s": round(on - off, 4), "overhead_pct": round(100 * (on - off) / off, 1),
                     "sync_check_only_s": round(check - off, 4)}
        b.set_mode("lazy")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
