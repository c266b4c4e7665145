"""The cost of ``xlanb.profile`` on the BERT training step (benchmarks/scenarios.py).

    python benchmarks/bench_profile.py [--steps N] [--modes lazy,eager,opbyop]

For each mode: the steady step time (median of steps 2..N) with no profile open, then
inside ``xlanb.profile()`` (interleaved, best of 2 each), and the profile's own phase
table for the profiled steps. Prints one JSON object. A measurement, never a test
assertion. Off costs nothing measurable by design: no dispatch mode, one empty-list test
per metrics sample and per sync.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_nans import steady  # noqa: E402
from scenarios import Backend, make_bert  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--modes", default="lazy,eager,opbyop")
    args = ap.parse_args(argv)
    b = Backend("xlanb")
    x = b.x
    res = {}
    for mode in args.modes.split(","):
        b.set_mode(mode)
        model, opt, ids, labels = make_bert(b, layers=2)
        b.sync()
        steady(b, model, opt, ids, labels, 3)  # warm every cache first
        rows: dict = {}
        last = None
        for _ in range(2):  # interleaved, to share the machine's drift
            for name, ctx in (("off", contextlib.nullcontext), ("on", x.profile)):
                with ctx() as p:
                    rows.setdefault(name, []).append(steady(b, model, opt, ids, labels,
                                                            args.steps))
                if p is not None:
                    last = p
        off, on = min(rows["off"]), min(rows["on"])
        t = last.phases().totals
        res[mode] = {"off_step_s": round(off, 4), "on_step_s": round(on, 4),
                     "overhead_pct": round(100 * (on - off) / off, 1),
                     "phases_s": {k: round(v, 4) for k, v in t.items()}}
        b.set_mode("lazy")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
