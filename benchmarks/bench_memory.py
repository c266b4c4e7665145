"""What the memory accounting costs (issue 25), measured in one process:

- the per-sync sample (device bytes from JAX's live arrays, into the peak and the
  timeline), against the number of live buffers;
- the walk behind ``memory_allocated`` / ``memory_by_line`` / ``memory_stats`` with a
  BERT and its AdamW state live, and the number of objects the garbage collector holds;
- an eager op with and without ``xlanb.memory_limit`` set (the limit checks every op).

    python benchmarks/bench_memory.py

The per-op hot path without a limit is measured side by side against the commit before
the memory work with ``benchmarks/bench_checkouts.py``.
"""
from __future__ import annotations

import gc
import os
import statistics
import sys
import time

os.environ.setdefault("XLANB_STORE_DIR", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import xlanb  # noqa: E402
from bench_modes import _cpu_model  # noqa: E402
from xlanb.values import memory  # noqa: E402  (the sample alone, as a sync calls it)


def best(fn, repeats: int = 7, number: int = 1) -> float:
    """The median of ``repeats`` timings of ``number`` calls, in seconds per call."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return statistics.median(times)


def sample_cost() -> list[tuple[int, float]]:
    out = []
    keep = []
    for n in (10, 100, 1000, 5000):
        while len(keep) < n:
            keep.append(torch.ones(4, device="xla") + len(keep))
        xlanb.sync()
        out.append((n, best(lambda: memory.sample("bench"), number=20)))
    return out


def walk_cost() -> dict:
    import transformers
    transformers.logging.set_verbosity_error()
    cfg = transformers.BertConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=4,
                                  num_attention_heads=4, intermediate_size=1024,
                                  attn_implementation="eager")
    model = transformers.BertForMaskedLM(cfg).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 8000, (8, 128)).to("xla")
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        xlanb.sync()
    n_objects = len(gc.get_objects())
    return {"objects": n_objects,
            "memory_allocated_ms": best(xlanb.memory_allocated) * 1e3,
            "memory_by_line_ms": best(xlanb.memory_by_line) * 1e3,
            "memory_reserved_ms": best(xlanb.memory_reserved) * 1e3,
            "buffers": xlanb.memory_stats()["allocated_buffers.current"]}


def eager_limit_cost() -> dict:
    xlanb.set_mode("eager")
    x = torch.ones(64, device="xla")
    for _ in range(20):
        x = x + 1.0  # compile and warm
    xlanb.sync()

    def ops():
        y = x
        for _ in range(100):
            y = y + 1.0
        return y
    free = best(ops, repeats=9) / 100
    with xlanb.memory_limit("64GiB"):
        limited = best(ops, repeats=9) / 100
    xlanb.set_mode("lazy")
    return {"eager_op_us": free * 1e6, "eager_op_with_limit_us": limited * 1e6,
            "live_buffers": len(__import__("jax").live_arrays())}


def main() -> None:
    print(f"CPU: {_cpu_model()}, {os.cpu_count()} cores; torch {torch.__version__}")
    print("\nper-sync sample (live buffers -> µs per sample)")
    for n, s in sample_cost():
        print(f"  {n:>6} live buffers: {s * 1e6:8.1f} µs")
    gc.collect()
    w = walk_cost()
    print(f"\nthe walk, BERT (4 layers, hidden 256) with AdamW state live: {w['buffers']} "
          f"buffers, {w['objects']} gc objects")
    for k in ("memory_allocated_ms", "memory_by_line_ms", "memory_reserved_ms"):
        print(f"  {k[:-3]:<20} {w[k]:8.2f} ms")
    e = eager_limit_cost()
    print(f"\neager op (add, 64 floats) with {e['live_buffers']} live buffers:")
    print(f"  no limit:    {e['eager_op_us']:7.1f} µs/op")
    print(f"  with limit:  {e['eager_op_with_limit_us']:7.1f} µs/op")


if __name__ == "__main__":
    main()
