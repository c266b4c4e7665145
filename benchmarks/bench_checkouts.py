"""Per-op overheads of several xlanb checkouts, side by side in one run: before and after
a change, on the same machine at the same time.

    git worktree add /tmp/before <commit>
    python benchmarks/bench_checkouts.py /tmp/before . [--rounds 3]

Each round runs ``benchmarks/scenarios.py xlanb --only ops`` of every checkout in turn,
each in a fresh process (so load drifts across all of them alike), and the table gives
the median over rounds of each checkout's per-op figures (each itself a median of 5).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_modes import _cpu_model  # noqa: E402

KEYS = ("eager_op_us", "eager_chain_us", "eager_scalar_us", "lazy_trace_us")


def measure(checkout: str) -> dict:
    script = os.path.join(checkout, "benchmarks", "scenarios.py")
    # no store: the same work in every round (older checkouts read its first name)
    # and the checkout's own xlanb, not the installed one
    env = dict(os.environ, XLANB_STORE_DIR="", XLANB_CACHE_DIR="",
               PYTHONPATH=os.path.abspath(checkout))
    out = subprocess.run([sys.executable, script, "xlanb", "--only", "ops"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkouts", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    runs: dict = {c: [] for c in a.checkouts}
    for _ in range(a.rounds):
        for c in a.checkouts:
            runs[c].append(measure(c))
    print(f"{_cpu_model()}, {os.cpu_count()} cores; median of {a.rounds} interleaved rounds (µs/op)\n")
    print("| checkout | commit | " + " | ".join(KEYS) + " |")
    print("|---|---|" + "---|" * len(KEYS))
    for c, rs in runs.items():
        commit = subprocess.run(["git", "-C", c, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        cells = []
        for k in KEYS:
            vals = [r[k] for r in rs if k in r]
            cells.append(f"{statistics.median(vals):.1f}" if vals else "–")
        print(f"| {c} | {commit} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
