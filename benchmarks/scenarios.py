"""The benchmark scenarios, written once for both backends.

Run by ``bench_modes.py`` in this process (backend "xlanb") and, with ``--torch-xla
PYTHON``, by that interpreter (backend "torch_xla", torch_xla with PJRT_DEVICE=CPU), so
the two are measured side by side in one run. Prints one JSON object.

    python benchmarks/scenarios.py xlanb|torch_xla|cpu [--steps N] [--modes lazy,eager]
                                   [--only ops,bert,inspect,inspect_ref,first_step]
                                   [--cache-dir DIR]

``inspect`` and ``first_step`` measure what happens in a process's first minutes, so
``bench_modes.py`` runs each of them alone in a fresh process (see there).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import statistics
import time

import torch


class Backend:
    """What differs between xlanb and torch_xla: device, sync, mode switching, counters."""

    def __init__(self, name: str, cache_dir: str | None = None):
        self.name = name
        if name == "cpu":  # native CPU torch: the floor the others are compared with
            self.device = torch.device("cpu")
        elif name == "xlanb":
            # measure the checkout this file lives in, not whichever xlanb is installed
            sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            import xlanb
            self.x = xlanb
            self.device = xlanb.device()
        else:
            os.environ.setdefault("PJRT_DEVICE", "CPU")
            import torch_xla
            import torch_xla.core.xla_model as xm
            import torch_xla.debug.metrics as met
            if cache_dir:
                # torch_xla's persistent cache must be set up before anything runs (xlanb
                # reads XLANB_STORE_DIR, which bench_modes.py sets, instead).
                import torch_xla.runtime as xr
                xr.initialize_cache(cache_dir, readonly=False)
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
        # torch_xla's eager mode times its compiles as EagerOpCompileTime, not CompileTime
        n, ns = 0, 0
        for name in ("CompileTime", "EagerOpCompileTime"):
            data = self.met.metric_data(name)
            if data:
                n, ns = n + data[0], ns + data[1]
        return n, ns / 1e9

    def execute_total(self) -> float:
        """xlanb: seconds spent running graph executables so far (0 for the others)."""
        if self.name != "xlanb":
            return 0.0
        return (self.x.metrics.metric_data("ExecuteTime") or (0, 0.0, ()))[1]

    def profile(self, step_s: float) -> dict | None:
        """xlanb only: where a step's time went, from the metrics since the last clear:
        JAX tracing and lowering, XLA compiling (or loading from the persistent cache),
        running executables, and the rest (Python: dispatch and recording). Eager mode
        compiles on background threads: that part of the compile time is reported, and so is
        the time the main thread waited for it."""
        if self.name != "xlanb":
            return None
        m = self.x.metrics

        def total(*names):
            return sum((m.metric_data(k) or (0, 0.0, ()))[1] for k in names)
        lower = total("LowerTime", "OpLowerTime")
        compile_ = total("CompileTime", "OpCompileTime") - lower
        background = total("OpBackgroundCompileTime")  # part of compile_, off the main thread
        wait = total("OpCompileWaitTime")  # the main thread waiting for those
        run = total("ExecuteTime")
        return {"lower_s": lower, "xla_compile_s": compile_, "background_compile_s": background,
                "compile_wait_s": wait, "execute_s": run,
                "python_s": step_s - lower - (compile_ - background) - wait - run}

    def counter(self, name: str) -> int:
        """A counter of the backend's metrics (both use torch_xla's names where they agree)."""
        if self.name == "cpu":
            return 0
        return (self.x.metrics if self.name == "xlanb" else self.met).counter_value(name) or 0

    def metric_count(self, name: str) -> int:
        """How many samples a metric has, e.g. torch_xla's compiles are samples of CompileTime."""
        if self.name == "cpu":
            return 0
        data = (self.x.metrics if self.name == "xlanb" else self.met).metric_data(name)
        return data[0] if data else 0

    def clear(self) -> None:
        if self.name == "cpu":
            return
        if self.name == "xlanb":
            self.x.metrics.clear()
        else:
            self.met.clear_all()


ROUNDS = 5  # per-op figures are the median of this many rounds: a shared 2-core VM is noisy


def _median_us(fn, n: int = 2000, finish=lambda r: None) -> float:
    """µs per call of ``fn``, the median of ``ROUNDS`` rounds of ``n`` calls; ``finish``
    waits for the last result (async dispatch: a round ends when its results exist)."""
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(n):
            r = fn()
        finish(r)
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(rounds)


def eager_op_us(b: Backend) -> float:
    """Independent cached adds: ``x + y`` again and again (nothing waits on the last)."""
    b.set_mode("eager")
    x = torch.randn(16, 16, device=b.device)
    y = torch.randn(16, 16, device=b.device)
    for _ in range(200):
        z = x + y
    b.wait(z)
    us = _median_us(lambda: x + y, finish=b.wait)
    b.set_mode("lazy")
    return us


def eager_chain_us(b: Backend, scalar: bool) -> float:
    """A dependent chain: each op reads the last one's result (``z = z + y``), or with a
    Python scalar argument (``z = z.add(y, alpha=0.5)``), float32 16x16."""
    b.set_mode("eager")
    x = torch.randn(16, 16, device=b.device)
    y = torch.randn(16, 16, device=b.device) * 1e-3
    state = [x]
    op = (lambda z: z.add(y, alpha=0.5)) if scalar else (lambda z: z + y)

    def one():
        state[0] = op(state[0])
        return state[0]
    for _ in range(200):
        one()
    b.wait(state[0])
    us = _median_us(one, finish=b.wait)
    b.set_mode("lazy")
    return us


class _Bare(torch.Tensor):
    """The least a Python tensor subclass can do per op: answer with a new wrapper."""

    @staticmethod
    def __new__(cls, like):
        return torch.Tensor._make_wrapper_subclass(cls, like.shape, dtype=like.dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _Bare(args[0])


def per_op_floors() -> dict:
    """What any per-op path built like xlanb's pays before its own Python: calling a
    cached JAX executable on two 16x16 arrays, and torch dispatching an op to a Python
    tensor subclass that returns a new wrapper (µs, medians of rounds)."""
    import jax
    import jax.numpy as jnp
    add = jax.jit(lambda a, b: a + b)
    a = jnp.ones((16, 16), jnp.float32)
    add(a, a).block_until_ready()
    x = _Bare(torch.ones(16, 16))
    return {"jax_call_us": _median_us(lambda: add(a, a), finish=lambda r: r.block_until_ready()),
            "torch_subclass_us": _median_us(lambda: x + x)}


def lazy_trace_us(b: Backend, n: int = 2000) -> float:
    b.set_mode("lazy")
    x = torch.randn(16, 16, device=b.device)
    y = torch.randn(16, 16, device=b.device)
    b.sync()
    rounds = []
    for _ in range(ROUNDS):
        z = x
        t0 = time.perf_counter()
        for _ in range(n):
            z = z * y + x
        rounds.append((time.perf_counter() - t0) / (2 * n) * 1e6)
        del z
        b.sync()
    return statistics.median(rounds)


def make_bert(b: Backend, layers: int):
    """A randomly initialised BERT classifier (no downloads), AdamW and one batch, on the
    device; hidden 256, 4 heads, intermediate 1024, sequence 128, batch 8."""
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=layers, hidden_size=256, num_attention_heads=4,
                     intermediate_size=1024, vocab_size=1000, max_position_embeddings=128,
                     attn_implementation="eager")
    model = BertForSequenceClassification(cfg).to(b.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (8, 128)).to(b.device)
    labels = torch.randint(0, 2, (8,)).to(b.device)
    return model, opt, ids, labels


def train_step(b: Backend, model, opt, ids, labels) -> torch.Tensor:
    """Forward, backward, AdamW step, sync: one training step as a user writes it."""
    loss = model(input_ids=ids, labels=labels).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    b.sync()
    return loss


def bert_step(b: Backend, mode: str, steps: int, layers: int = 2) -> dict:
    """Mode "compile" (xlanb only) is ``xlanb.compile`` over the same step, with AdamW's
    state on the device (capturable=True), so that no Python number changes between
    steps; it traces until two steps agree, then replays the executable."""
    b.set_mode("lazy" if mode == "compile" else mode)
    model, opt, ids, labels = make_bert(b, layers=layers)
    step = functools.partial(train_step, b, model, opt)
    if mode == "compile":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True)

        def compiled(ids, labels):
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss
        step = b.x.compile(compiled, name="bert_train_step")
    b.sync()
    b.clear()
    times = []
    first_profile = None
    executes = []  # xlanb: seconds running executables in each step
    losses = []
    for _ in range(steps):
        e0 = b.execute_total()
        t0 = time.perf_counter()
        loss = step(ids, labels)
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
        executes.append(b.execute_total() - e0)
        if first_profile is None:
            first_profile = b.profile(times[0])
    # Steady: once the compiled function replays (call 3 on: calls 1 and 2 agree), with
    # one step of margin; the other modes are steady from step 2.
    steady = slice(3, None) if mode == "compile" else slice(1, None)
    later = sorted(times[steady])
    later_exec = sorted(executes[steady])
    n, secs = b.compiles()
    b.set_mode("lazy")
    res = {"first_step_s": times[0], "steady_step_s": later[len(later) // 2] if later else None,
           "compiles": n, "compile_s": secs, "first_step_profile": first_profile,
           "losses": losses,
           "steady_execute_s": later_exec[len(later_exec) // 2] if b.name == "xlanb" and later_exec else None}
    if mode == "compile":
        res["status"] = step.status()
        # issue 57: its replays tier up (a quick executable, then the optimized one)
        res["quick_compiles"] = b.counter("QuickCompile")
        res["tier_ups"] = b.counter("GraphTierUp")
        res["step_s"] = times
    return res


def inspect_at_breakpoints(b: Backend, steps: int = 3, look: bool = True) -> dict:
    """seeds/003: a user stops in pdb inside the forward pass and prints a layer's output.

    4-layer BERT, lazy mode, ``steps`` training steps; in step k the breakpoint sits after
    encoder layer k (it moves, as it does while someone hunts a bug). "Looking" is
    ``repr(t)``, what pdb's ``p t`` runs: xlanb peeks (op by op, the pending graph is left
    as it was); torch_xla can only run the pending graph up to ``t`` (``t.cpu()``), which
    cuts the step's graph. Meant for a fresh process: the numbers include first compiles.
    ``look=False`` runs the same steps without looking, as a reference.
    """
    b.set_mode("lazy")
    model, opt, ids, labels = make_bert(b, layers=4)
    b.sync()
    b.clear()
    graphs_before = len(b.x.graphs()) if b.name == "xlanb" else 0
    looks, step_times = [], []

    def breakpoint_here(module, args, out):
        t = out[0] if isinstance(out, tuple) else out
        t0 = time.perf_counter()
        repr(t)  # pdb's `p t`: from the breakpoint to the value on screen
        looks.append(time.perf_counter() - t0)

    layers = model.bert.encoder.layer
    for k in range(steps):
        hook = layers[k % len(layers)].register_forward_hook(breakpoint_here) if look else None
        t0 = time.perf_counter()
        loss = train_step(b, model, opt, ids, labels)
        loss.item()
        step_times.append(time.perf_counter() - t0)
        if hook is not None:
            hook.remove()
    res = {"look_s": looks, "look_median_s": sorted(looks)[len(looks) // 2] if looks else None,
           "step_s": step_times}
    if b.name == "xlanb":
        # graph compiles, single-op compiles (what peeks use) and their cache hits
        res.update({k: b.counter(k) for k in ("UncachedCompile", "CachedCompile", "OpCompile", "OpCacheHit",
                                             "PeekCompile")})
        res["graph_compiles"] = res["UncachedCompile"]
        # xlanb says why each graph after the first was compiled: keep that for the report
        res["recompile_why"] = [g.explanation[:300] for g in b.x.graphs()[graphs_before:] if g.explanation]
    else:
        res["graph_compiles"] = b.metric_count("CompileTime")
    return res


def first_step(b: Backend, mode: str) -> dict:
    """The BERT step's first step in this process; run in a fresh process with an empty
    or a filled persistent compilation cache to compare cold and warm starts (one mode
    per process: a second mode in the same process would no longer start cold)."""
    r = bert_step(b, mode, steps=1)
    # torch_xla counts PersistentCacheDeserializeFailure when it cannot load an entry
    names = ("PersistentCacheHit", "PersistentCacheMiss", "PersistentCacheDeserializeFailure")
    return {"first_step_s": r["first_step_s"], "compiles": r["compiles"], "compile_s": r["compile_s"],
            "profile": r["first_step_profile"], **{k: b.counter(k) for k in names}}


SCENARIOS = ("ops", "bert", "inspect", "inspect_ref", "first_step", "depth")


def run(backend: str, steps: int, modes, only=SCENARIOS, cache_dir: str | None = None,
        layers: int = 2) -> dict:
    b = Backend(backend, cache_dir=cache_dir)
    res = {"backend": backend, "torch": torch.__version__}
    if backend == "cpu":
        if "bert" in only:
            res["bert"] = {"cpu": bert_step(b, "cpu", steps)}
        return res
    if "ops" in only:
        res["eager_op_us"] = eager_op_us(b)
        res["eager_chain_us"] = eager_chain_us(b, scalar=False)
        res["eager_scalar_us"] = eager_chain_us(b, scalar=True)
        res["lazy_trace_us"] = lazy_trace_us(b)
        if backend == "xlanb":
            res["per_op_floors"] = per_op_floors()
    if "bert" in only:
        res["bert"] = {mode: bert_step(b, mode, steps) for mode in modes}
    if "inspect" in only:
        res["inspect"] = inspect_at_breakpoints(b)
    if "inspect_ref" in only:  # the same 3 steps without looking: the compiles a look adds
        res["inspect_ref"] = inspect_at_breakpoints(b, look=False)
    if "first_step" in only:
        res["first_step"] = {mode: first_step(b, mode) for mode in modes}
    if "depth" in only:  # one (layers, mode) per process: --layers N --modes M
        res["depth"] = {mode: bert_step(b, mode, steps, layers=layers) for mode in modes}
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("backend", choices=["xlanb", "torch_xla", "cpu"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2, help="BERT depth of the depth scenario")
    ap.add_argument("--modes", default="lazy,eager")
    ap.add_argument("--only", default="ops,bert", help=f"comma list of {', '.join(SCENARIOS)}")
    ap.add_argument("--cache-dir", help="torch_xla: persistent compilation cache directory")
    a = ap.parse_args()
    only = a.only.split(",")
    if unknown := set(only) - set(SCENARIOS):
        ap.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    sys.stdout.write(json.dumps(run(a.backend, a.steps, a.modes.split(","), only, a.cache_dir,
                                    a.layers)) + "\n")
