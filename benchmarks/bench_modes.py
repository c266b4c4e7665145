"""Per-mode speed, measured side by side in one run.

    python benchmarks/bench_modes.py [--steps N] [--json out.json]

Prints, for each mode: eager per-op host overhead (µs/op, a cached small op, with the
result's device buffer ready), lazy tracing cost (µs/op, recording only), and a small
BERT-like training step (first step with its compiles, then steady state).
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import torch

import xlanb
from xlanb import metrics


def eager_op_us(n: int = 5000) -> float:
    with xlanb.mode("eager"):
        x = torch.randn(16, 16, device="xla")
        y = torch.randn(16, 16, device="xla")
        for _ in range(200):
            z = x + y
        t0 = time.perf_counter()
        for _ in range(n):
            z = x + y
        z = xlanb.peek(z)  # wait for the last result: async dispatch is not free time
        return (time.perf_counter() - t0) / n * 1e6


def lazy_trace_us(n: int = 5000) -> float:
    with xlanb.mode("lazy"):
        x = torch.randn(16, 16, device="xla")
        y = torch.randn(16, 16, device="xla")
        xlanb.sync()
        z = x
        t0 = time.perf_counter()
        for _ in range(n):
            z = z * y + x
        dt = time.perf_counter() - t0
        del z
        xlanb.sync()
        return dt / (2 * n) * 1e6


def bert_step(mode: str, steps: int) -> dict:
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                     intermediate_size=1024, vocab_size=1000, max_position_embeddings=128,
                     attn_implementation="eager")
    xlanb.set_mode(mode)
    model = BertForSequenceClassification(cfg).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (8, 128)).to("xla")
    labels = torch.randint(0, 2, (8,)).to("xla")
    xlanb.sync()
    metrics.clear()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        xlanb.sync()
        loss.item()
        times.append(time.perf_counter() - t0)
    steady = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else float("nan")
    compile_s = sum((metrics.metric_data(n) or (0, 0.0, ()))[1] for n in ("CompileTime", "OpCompileTime"))
    compiles = (metrics.counter_value("UncachedCompile") or 0) + (metrics.counter_value("OpCompile") or 0)
    xlanb.set_mode("lazy")
    return {"first_step_s": times[0], "steady_step_s": steady, "compiles": compiles,
            "compile_s": compile_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    res = {"eager_op_us": eager_op_us(), "lazy_trace_us": lazy_trace_us(), "bert": {}}
    for mode in xlanb.MODES:
        res["bert"][mode] = bert_step(mode, args.steps)
    print(f"machine: {platform.machine()} {platform.processor() or ''}, torch {torch.__version__}, "
          f"jax {jax.__version__}, device {jax.devices()[0].platform}")
    print(f"eager per-op overhead (cached add, 16x16): {res['eager_op_us']:.1f} us/op")
    print(f"lazy tracing cost (mul+add, 16x16):        {res['lazy_trace_us']:.1f} us/op")
    print("BERT step (2 layers, hidden 256, seq 128, batch 8, AdamW):")
    print(f"  {'mode':8s} {'first step':>11s} {'steady':>9s} {'compiles':>9s} {'compile s':>10s}")
    for mode, r in res["bert"].items():
        print(f"  {mode:8s} {r['first_step_s']:10.2f}s {r['steady_step_s']:8.3f}s "
              f"{r['compiles']:9d} {r['compile_s']:10.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
