"""The BERT training step of benchmarks/scenarios.py (2 layers, hidden 256, batch 8 x 128,
AdamW, lazy mode) on 8 simulated CPU devices: one device, data-parallel over 8, and a
2x4 mesh (batch on 'data'; attention and FFN weights on 'model', Megatron-style), with
xlanb.spmd and, side by side, torch_xla's SPMD on the same 8 CPU devices.

    python benchmarks/bench_spmd.py [--steps N] [--torch-xla /path/to/venv/bin/python]
    python benchmarks/bench_spmd.py --dist [--runs N]   # the multi-process check's cost

Each (backend, layout) runs in a fresh process with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (all layouts, so every run sees the
same 8 devices). Simulated devices share the host's cores: the numbers say what the
partitioned program costs on this machine, not what a pod would gain.

``--dist``: 2 processes x 2 devices (``python -m xlanb.launch``) run small sharded work
in lazy mode (a graph per sync) and eager mode (an op per run), with the agreement
check of ``xlanb.distributed`` on and off (``config.dist_check``, the same switch as
``XLANB_DIST_CHECK``), alternating blocks so both see the same machine; the difference
per run is what the check costs (one exchange through the key-value store).
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
LAYOUTS = ("one_device", "data_parallel_8", "mesh_2x4")


def _shard_bert(model, ids, labels, xs, mesh, layout):
    """Where the layout puts each tensor (xs: xlanb.spmd or torch_xla's spmd module)."""
    if layout == "one_device":
        return
    xs.mark_sharding(ids, mesh, ("data", None))
    xs.mark_sharding(labels, mesh, ("data",))
    if layout != "mesh_2x4":
        return
    for name, p in model.named_parameters():
        if name.endswith(("query.weight", "key.weight", "value.weight", "intermediate.dense.weight")):
            xs.mark_sharding(p, mesh, ("model", None))
        elif name.endswith(("query.bias", "key.bias", "value.bias", "intermediate.dense.bias")):
            xs.mark_sharding(p, mesh, ("model",))  # as its weight's rows: no gather to update it
        elif name.endswith("output.dense.weight") and "attention.output" not in name or \
                name.endswith("attention.output.dense.weight"):
            xs.mark_sharding(p, mesh, (None, "model"))


def worker(backend: str, layout: str, steps: int) -> dict:
    import numpy as np
    import torch
    sys.path.insert(0, HERE)
    if backend == "xlanb":
        import xlanb
        import xlanb.spmd as xs
        device, sync = "xla", xlanb.sync
        mesh_of = lambda shape, names: xs.Mesh(range(8), shape, names)  # noqa: E731
        xlanb.set_mode("lazy")
    else:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr
        if layout != "one_device":
            xr.use_spmd()
        device, sync = torch_xla.device(), xm.mark_step
        mesh_of = lambda shape, names: xs.Mesh(np.arange(8), shape, names)  # noqa: E731
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                     intermediate_size=1024, vocab_size=1000, max_position_embeddings=128,
                     attn_implementation="eager")
    model = BertForSequenceClassification(cfg).to(device)
    ids = torch.randint(0, 1000, (8, 128)).to(device)
    labels = torch.randint(0, 2, (8,)).to(device)
    mesh = None
    if layout == "data_parallel_8":
        mesh = mesh_of((8,), ("data",))
    elif layout == "mesh_2x4":
        mesh = mesh_of((2, 4), ("data", "model"))
    _shard_bert(model, ids, labels, xs, mesh, layout)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sync()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    res = {"first_step_s": round(times[0], 3),
           "steady_step_s": round(statistics.median(times[2:] or times[1:]), 4),
           "losses": [round(v, 5) for v in losses]}
    if backend == "xlanb":
        import xlanb
        res["graphs"] = len(xlanb.graphs())
        res["collectives_per_step"] = dict(xlanb.graphs()[-1].collectives.counts())
        res["collective_bytes_per_step"] = xlanb.graphs()[-1].collectives.total_bytes
    return res


def dist_worker(runs: int) -> dict:
    """One of the 2 processes of ``--dist``: seconds per multi-process run, check on/off."""
    import torch
    import xlanb
    import xlanb.spmd as xs
    from xlanb.base.config import config
    xlanb.distributed.initialize()
    mesh = xs.Mesh(range(xlanb.distributed.global_device_count()), (4,), ("data",))
    x = torch.randn(64, 64).to("xla")
    xs.mark_sharding(x, mesh, ("data", None))

    def lazy_run():
        y = (x * 1.5 + 1.0).sum(0)  # one small graph with an all-reduce
        xlanb.sync()
        return y

    def eager_run():
        return x * 1.5  # one op over every process's devices, no collective

    out = {}
    for mode, fn in (("lazy", lazy_run), ("eager", eager_run)):
        xlanb.set_mode(mode)
        for _ in range(20):  # compiled, warm
            fn()
        per = {True: [], False: []}
        block = max(1, runs // 10)
        for i in range(20):
            on = i % 2 == 0
            config.dist_check = on
            t0 = time.perf_counter()
            for _ in range(block):
                fn()
            per[on].append((time.perf_counter() - t0) / block)
        config.dist_check = True
        on, off = statistics.median(per[True]), statistics.median(per[False])
        out[mode] = {"check_on_us": round(on * 1e6, 1), "check_off_us": round(off * 1e6, 1),
                     "cost_per_run_us": round((on - off) * 1e6, 1)}
    return out


def dist(runs: int) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("XLA_FLAGS", None)
    env.pop("XLANB_MODE", None)
    proc = subprocess.run([sys.executable, "-m", "xlanb.launch", "--nproc", "2", "--devices-per-proc",
                           "2", __file__, "--runs", str(runs), "--dist-worker"],
                          capture_output=True, text=True, env=env, timeout=1800)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("BENCH-DIST ")), None)
    res = json.loads(line.split(" ", 1)[1]) if line else {"error": proc.stderr.strip().splitlines()[-5:]}
    try:
        res["cpu"] = next(x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo")
                          if x.startswith("model name"))
    except (OSError, StopIteration):
        pass
    res["cores"] = os.cpu_count()
    print(json.dumps(res))
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--dist", action="store_true", help="the multi-process check's cost per run")
    ap.add_argument("--runs", type=int, default=400, help="--dist: runs per mode and setting")
    ap.add_argument("--dist-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-xla", default=None, help="a Python with torch_xla installed")
    ap.add_argument("--worker", nargs=2, metavar=("BACKEND", "LAYOUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.dist_worker:
        res = dist_worker(a.runs)
        import xlanb
        if xlanb.distributed.is_main():
            print("BENCH-DIST " + json.dumps(res), flush=True)
        return {}
    if a.dist:
        return dist(a.runs)
    if a.worker:
        print("BENCH " + json.dumps(worker(*a.worker, a.steps)))
        return {}
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PJRT_DEVICE="CPU", CPU_NUM_DEVICES="8")
    env.pop("XLANB_MODE", None)
    pythons = {"xlanb": sys.executable}
    if a.torch_xla:
        pythons["torch_xla"] = a.torch_xla
    results: dict = {}
    for backend, py in pythons.items():
        for layout in LAYOUTS:
            proc = subprocess.run([py, __file__, "--steps", str(a.steps), "--worker", backend, layout],
                                  capture_output=True, text=True, env=env, timeout=1800)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("BENCH ")), None)
            results.setdefault(backend, {})[layout] = (
                json.loads(line[6:]) if line else {"error": proc.stderr.strip().splitlines()[-1:]})
            print(backend, layout, results[backend][layout], file=sys.stderr)
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
