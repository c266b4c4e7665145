"""Eager mode on new shapes: what a new op signature costs, side by side, in one run.

    python benchmarks/bench_eager_shapes.py [--shapes K] [--torch-xla /venv/bin/python]
                                            [--json FILE]

Each backend runs in a fresh process (empty compile caches, xlanb's store pointed at an
empty directory) the op sequence of issue 47: ``exp``, ``mul``, ``add``, ``sum(dim=1)``,
``softmax``, then a slice, with two ``.cpu()`` reads, over K shapes none of them has seen.
Then the same K shapes again, three more times:

``new``     first sight of each shape (every op signature is new)
``2nd``     second sight (xlanb: the run's graph is cached; its ops are queued for their
            own optimized executables)
``3rd``     third sight (xlanb: those executables are lowered and compile in the background)
``steady``  the fourth sight and after: the median of nine passes
``at end``  the same shapes once more, every op issued first and every output read at the
            end (reads at other places than before: the same ops at shapes seen, in
            other company; xlanb counts the run compiles this pass caused)

Backends: xlanb eager, xlanb eager with runs off (``XLANB_EAGER_RUNS=0``: each new op
compiles alone, as before), torch_xla's eager mode (only with ``--torch-xla``, a Python
with torch_xla installed; keep it out of CI, it is a download of several GB), JAX's own
op-by-op dispatch, and CPU torch. Every backend's values are checked against CPU torch.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
from bench_modes import _cpu_model  # noqa: E402
PASSES = ("new", "2nd", "3rd", "steady", "at end")
STEADY_PASSES = 9


def shapes(k: int) -> list[tuple[int, int]]:
    """K distinct 2-D shapes, none of them used to warm up."""
    return [(3 + i, 6 + 5 * i) for i in range(k)]


def _passes(seq, xd, xs, want, issue, read, count=None) -> dict:
    """Time ``seq`` over every device input, once per pass; the largest difference from
    ``want(x)`` (the reference outputs for one host input) over every output. The last
    pass runs ``issue`` (the ops, no read) over every input, then ``read`` on each
    output; ``count()``: a compile count, taken around that pass."""
    res = {"per_shape_ms": {}, "max_err": 0.0}
    for name in PASSES:
        times = []
        # one pass of K cached shapes lasts milliseconds: steady is the median of several
        for _ in range(STEADY_PASSES if name == "steady" else 1):
            before = count() if count else 0
            t0 = time.perf_counter()
            if name == "at end":
                issued = [issue(x) for x in xd]
                outs = [tuple(read(t) for t in pair) for pair in issued]
                if count:
                    res["at_end_compiles"] = count() - before
            else:
                outs = [seq(x) for x in xd]
            times.append((time.perf_counter() - t0) / len(xd) * 1e3)
            for x, got_pair in zip(xs, outs):
                for got, w in zip(got_pair, want(x)):
                    res["max_err"] = max(res["max_err"], float(abs(got - w).max()))
        res["per_shape_ms"][name] = sorted(times)[len(times) // 2]
    return res


def _torch_worker(backend: str, k: int) -> dict:
    import torch
    if backend == "torch_xla":
        import torch_xla
        torch_xla.experimental.eager_mode(True)
        dev = torch_xla.device()
    elif backend == "cpu":
        dev = torch.device("cpu")
    else:
        import xlanb
        xlanb.set_mode("eager")
        dev = xlanb.device()

    def issue(x):
        a = x.exp()
        b = a * 2.0
        c = b + x
        s = c.sum(dim=1)
        p = torch.softmax(c, dim=-1)
        q = p[:, 1:]
        return s, q

    def seq(x):
        s, q = issue(x)
        return s.cpu(), q.cpu()

    def want(x):
        c = x.exp() * 2.0 + x
        return c.sum(dim=1), torch.softmax(c, dim=-1)[:, 1:]

    for got, w in zip(seq(torch.randn(2, 3).to(dev)), want(torch.randn(2, 3))):
        # imports and first-call paths, on a shape not measured; torch's dtypes and shapes
        assert got.dtype == w.dtype and got.shape == w.shape, (got.dtype, got.shape)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(*s, generator=gen) for s in shapes(k)]
    xd = [x.to(dev) for x in xs]
    seq(xd[0].new_zeros(1, 2))  # the transfers above have finished
    count = None
    if backend == "xlanb":
        import xlanb

        def count():
            return xlanb.metrics.counter_value("EagerRunCompile") or 0
    elif backend == "torch_xla":
        import torch_xla.debug.metrics as met

        def count():
            return met.counter_value("UncachedCompile") or 0
    res = _passes(seq, xd, xs, want, issue, lambda t: t.cpu(), count)
    if backend == "xlanb":
        res["counters"] = {n: xlanb.metrics.counter_value(n) or 0 for n in (
            "EagerRunCompile", "EagerRunCacheHit", "QuickCompile", "GraphTierUp", "OpCompile")}
    return res


def _jax_worker(k: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    def issue(x):
        a = jnp.exp(x)
        b = a * 2.0
        c = b + x
        s = c.sum(axis=1)
        p = jax.nn.softmax(c, axis=-1)
        q = p[:, 1:]
        return s, q

    def seq(x):
        s, q = issue(x)
        return np.asarray(s), np.asarray(q)

    def want(x):
        c = np.exp(x) * 2.0 + x
        e = np.exp(c - c.max(-1, keepdims=True))
        return c.sum(1), (e / e.sum(-1, keepdims=True))[:, 1:]

    seq(jnp.ones((2, 3), jnp.float32))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes(k)]
    xd = [jax.device_put(x) for x in xs]
    jax.block_until_ready(xd)
    return _passes(seq, xd, xs, want, issue, np.asarray)


def run(python: str, backend: str, k: int, env_extra: dict | None = None) -> dict:
    env = dict(os.environ, PJRT_DEVICE="CPU", XLANB_STORE_DIR=tempfile.mkdtemp(prefix="xlanb-shapes-"),
               **(env_extra or {}))
    out = subprocess.run([python, HERE, "--worker", backend, "--shapes", str(k)],
                         capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{backend} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", type=int, default=40)
    ap.add_argument("--torch-xla", default=None, help="a Python with torch_xla 2.x installed")
    ap.add_argument("--worker", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.worker:
        res = _jax_worker(args.shapes) if args.worker == "jax" else _torch_worker(args.worker, args.shapes)
        print(json.dumps(res))
        return
    rows = [("xlanb eager", sys.executable, "xlanb", None),
            ("xlanb eager, runs off", sys.executable, "xlanb", {"XLANB_EAGER_RUNS": "0"})]
    if args.torch_xla:
        rows.append(("torch_xla 2.x eager", args.torch_xla, "torch_xla", None))
    rows += [("JAX op by op", sys.executable, "jax", None), ("CPU torch", sys.executable, "cpu", None)]
    results = {}
    for label, python, backend, env in rows:
        results[label] = run(python, backend, args.shapes, env)
    print(f"CPU: {_cpu_model()}, {os.cpu_count()} cores; {args.shapes} shapes, 6 ops and 2 reads each; "
          f"ms per shape (one pass each, steady the median of {STEADY_PASSES}; "
          "each backend in a fresh process)")
    print("| backend | " + " | ".join(PASSES) + " | max error vs CPU torch |")
    print("|---|" + "---|" * (len(PASSES) + 1))
    for label, r in results.items():
        cells = " | ".join(f"{r['per_shape_ms'][p]:.2f}" for p in PASSES)
        print(f"| {label} | {cells} | {r['max_err']:.1e} |")
    ref = results.get("torch_xla 2.x eager")
    if ref:
        for label in ("xlanb eager", "xlanb eager, runs off"):
            r = results[label]["per_shape_ms"]
            print(f"{label} ÷ torch_xla: " + ", ".join(
                f"{p} {r[p] / ref['per_shape_ms'][p]:.2f}×" for p in PASSES))
    for label, r in results.items():
        if "at_end_compiles" in r:
            print(f"{label}: compiles in the 'at end' pass: {r['at_end_compiles']}")
    if "counters" in results["xlanb eager"]:
        print("xlanb eager counters:", results["xlanb eager"]["counters"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": _cpu_model(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
