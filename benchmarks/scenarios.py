"""The benchmark scenarios, written once for both backends.

Run by ``bench_modes.py`` in this process (backend "xlanb") and, with ``--torch-xla
PYTHON``, by that interpreter (backend "torch_xla", torch_xla with PJRT_DEVICE=CPU), so
the two are measured side by side in one run. Prints one JSON object.

    python benchmarks/scenarios.py xlanb|torch_xla [--steps N]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch


class Backend:
    """What differs between xlanb and torch_xla: device, sync, mode switching, counters."""

    def __init__(self, name: str):
        self.name = name
        if name == "cpu":  # native CPU torch: the floor the others are compared with
            self.device = torch.device("cpu")
        elif name == "xlanb":
            import xlanb
            self.x = xlanb
            self.device = xlanb.device()
        else:
            os.environ.setdefault("PJRT_DEVICE", "CPU")
            import torch_xla
            import torch_xla.core.xla_model as xm
            import torch_xla.debug.metrics as met
            self.x, self.xm, self.met = torch_xla, xm, met
            self.device = torch_xla.device()

    def set_mode(self, mode: str) -> None:
        if self.name == "cpu":
            return
        if self.name == "xlanb":
            self.x.set_mode(mode)
        else:
            import torch_xla
            torch_xla.experimental.eager_mode(mode == "eager")

    def sync(self) -> None:
        if self.name == "cpu":
            return
        if self.name == "xlanb":
            self.x.sync()
        else:
            self.xm.mark_step()

    def wait(self, t) -> None:
        """Block until ``t`` is computed."""
        if self.name == "cpu":
            return
        if self.name == "xlanb":
            self.x.peek(t)
        else:
            self.xm.wait_device_ops()

    def compiles(self) -> tuple[int, float]:
        """(graph or op compiles, compile seconds) since the last clear."""
        if self.name == "cpu":
            return 0, 0.0
        if self.name == "xlanb":
            m = self.x.metrics
            n = (m.counter_value("UncachedCompile") or 0) + (m.counter_value("OpCompile") or 0)
            secs = sum((m.metric_data(k) or (0, 0.0, ()))[1] for k in ("CompileTime", "OpCompileTime"))
            return n, secs
        data = self.met.metric_data("CompileTime")
        return (data[0], data[1] / 1e9) if data else (0, 0.0)

    def clear(self) -> None:
        if self.name == "cpu":
            return
        if self.name == "xlanb":
            self.x.metrics.clear()
        else:
            self.met.clear_all()


def eager_op_us(b: Backend, n: int = 5000) -> float:
    b.set_mode("eager")
    x = torch.randn(16, 16, device=b.device)
    y = torch.randn(16, 16, device=b.device)
    for _ in range(200):
        z = x + y
    b.wait(z)
    t0 = time.perf_counter()
    for _ in range(n):
        z = x + y
    b.wait(z)  # async dispatch: the time counts only once the last result exists
    dt = time.perf_counter() - t0
    b.set_mode("lazy")
    return dt / n * 1e6


def lazy_trace_us(b: Backend, n: int = 5000) -> float:
    b.set_mode("lazy")
    x = torch.randn(16, 16, device=b.device)
    y = torch.randn(16, 16, device=b.device)
    b.sync()
    z = x
    t0 = time.perf_counter()
    for _ in range(n):
        z = z * y + x
    dt = time.perf_counter() - t0
    del z
    b.sync()
    return dt / (2 * n) * 1e6


def bert_step(b: Backend, mode: str, steps: int) -> dict:
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                     intermediate_size=1024, vocab_size=1000, max_position_embeddings=128,
                     attn_implementation="eager")
    b.set_mode(mode)
    model = BertForSequenceClassification(cfg).to(b.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (8, 128)).to(b.device)
    labels = torch.randint(0, 2, (8,)).to(b.device)
    b.sync()
    b.clear()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        b.sync()
        loss.item()
        times.append(time.perf_counter() - t0)
    later = sorted(times[1:])
    n, secs = b.compiles()
    b.set_mode("lazy")
    return {"first_step_s": times[0], "steady_step_s": later[len(later) // 2] if later else None,
            "compiles": n, "compile_s": secs}


def run(backend: str, steps: int, modes) -> dict:
    b = Backend(backend)
    res = {"backend": backend, "torch": torch.__version__, "bert": {}}
    if backend == "cpu":
        res["bert"]["cpu"] = bert_step(b, "cpu", steps)
        return res
    res["eager_op_us"] = eager_op_us(b)
    res["lazy_trace_us"] = lazy_trace_us(b)
    for mode in modes:
        res["bert"][mode] = bert_step(b, mode, steps)
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("backend", choices=["xlanb", "torch_xla", "cpu"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--modes", default="lazy,eager")
    a = ap.parse_args()
    sys.stdout.write(json.dumps(run(a.backend, a.steps, a.modes.split(","))) + "\n")
