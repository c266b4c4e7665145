"""What the compile profile costs (issue 48): the same lowered graph compiled with and
without XLA's phase spans (``config.compile_profile``), interleaved, for a small graph
(an MLP's forward, ~20 ops) and the 2-layer BERT training step of scenarios.py.

    python benchmarks/bench_compile_profile.py [--rounds 5] [--bert-rounds 3]

Prints medians of wall and CPU seconds per compile, and the profile's build time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("XLANB_STORE_DIR", "")  # nothing from the store


def _compile_times(g, rounds: int) -> dict:
    import xlanb
    from xlanb.runtime.jit import compile_lowered
    out = {True: [], False: []}
    cpu = {True: [], False: []}
    for _ in range(rounds):
        for on in (False, True):
            xlanb.config.compile_profile = on
            lowered = g.lowering.lower()  # a fresh Lowered: JAX caches a compile on it
            t0, c0 = time.perf_counter(), time.process_time()
            compile_lowered(lowered, metric="CompileTime")
            out[on].append(time.perf_counter() - t0)
            cpu[on].append(time.process_time() - c0)
    xlanb.config.compile_profile = True
    med = statistics.median
    return {"off_s": med(out[False]), "on_s": med(out[True]),
            "off_cpu_s": med(cpu[False]), "on_cpu_s": med(cpu[True]),
            "overhead_pct": 100 * (med(out[True]) - med(out[False])) / med(out[False]),
            "overhead_cpu_pct": 100 * (med(cpu[True]) - med(cpu[False])) / med(cpu[False])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--bert-rounds", type=int, default=3)
    args = ap.parse_args()
    import torch
    from bench_modes import _cpu_model

    import xlanb
    res = {"cpu": _cpu_model()}
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to("xla")
    with torch.no_grad():
        out = m(torch.randn(4, 64).to("xla")).sum()  # noqa: F841 - kept: the sync computes it
    xlanb.sync()
    g = xlanb.graphs()[-1]
    res["small"] = _compile_times(g, args.rounds) | {"ops": g.n_nodes}
    if args.bert_rounds:
        from scenarios import Backend, make_bert, train_step
        b = Backend("xlanb")
        model, opt, ids, labels = make_bert(b, 2)
        xlanb.sync()
        train_step(b, model, opt, ids, labels)
        g = max(xlanb.graphs(), key=lambda g: g.n_nodes)
        t0 = time.perf_counter()
        p = g.compile_profile
        res["bert_profile_build_s"] = time.perf_counter() - t0
        res["bert_unattributed_pct"] = 100 * p.unattributed_s / p.total_s
        res["bert"] = _compile_times(g, args.bert_rounds) | {"ops": g.n_nodes}
        print(p)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
