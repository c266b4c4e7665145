"""Running IR: whole graphs through the graph cache, or node by node through the
single-op executable cache, plus the record of every compiled graph and why it compiled.
"""
from __future__ import annotations

import concurrent.futures
import functools
import sys
import time
import warnings
from dataclasses import dataclass, field

import jax
import numpy as np

from . import exe_store, metrics
from .config import config
from .devices import jax_device
from .dtypes import to_jax_dtype
from .explain import explain
from .summary import summarize
from .ir import GETITEM, GraphPlan, Node, OpInfo, info_digest, leaf_meta, format_src, stable_hash
from .runtime import background, compile_jitted, compile_lowered, lower_jitted

_F64 = np.dtype(np.float64)
_U32 = np.dtype(np.uint32)


def _sharding(device: int):
    return jax.sharding.SingleDeviceSharding(jax_device(device))


def _tensor_spec(meta, device: int):
    return jax.ShapeDtypeStruct(meta.shape, to_jax_dtype(meta.dtype), sharding=_sharding(device))


def _scalar_spec(kind: str, device: int):
    if kind == "f":
        return jax.ShapeDtypeStruct((), _F64, weak_type=True, sharding=_sharding(device))
    return jax.ShapeDtypeStruct((2,), _U32, sharding=_sharding(device))  # PRNG key data


# ---------------------------------------------------------------------------------------
# Single-op executables (eager mode, op-by-op mode and peeks share them)

def _single_op_options(device: int):
    # XLA:CPU's fusion emitters cost ~25% of a single-op compile and buy nothing for one
    # op (measured on the BERT eager first step: XLA compile 5.45 -> 4.02 s, same steady
    # step). Whole graphs keep them.
    if jax_device(device).platform == "cpu":
        return {"xla_cpu_use_fusion_emitters": False}
    return None


def _lower_op(info: OpInfo):
    n = info.n_in
    fn = info.fn
    specs = [_tensor_spec(m, info.device) for m in info.extra.in_metas]
    specs += [_scalar_spec(k, info.device) for k in info.scalar_specs]
    return lower_jitted(lambda *flat: fn(flat[:n], flat[n:]), specs, lower_metric="OpLowerTime")


def op_executable(info: OpInfo):
    """``info``'s single-op executable: cached, loaded from the executable store,
    compiled now, or collected from the background compile ``compile_op_ahead`` started."""
    exe = info.exe
    if exe is not None:
        metrics.counter("OpCacheHit")
        return exe
    pending = info.compiling
    exe = None
    if pending is not None:
        t0 = time.perf_counter()
        try:
            exe = pending.result()  # an interrupt here keeps the compile for next time
        except Exception:  # compiled again below, so the error is raised on this thread
            info.compiling = None
        finally:
            metrics.record("OpCompileWaitTime", time.perf_counter() - t0)
    if exe is None:
        key = _op_store_key(info)
        exe = _load(key, info.device, "OpCompileTime")
        if exe is None:
            t0 = time.perf_counter()
            lowered = _lower_op(info)
            exe = _compile_op(lowered, info.device, key, time.perf_counter() - t0)
        if pending is None:
            metrics.counter("OpCompile")
    info.exe = exe
    info.compiling = None
    return exe


def direct_call(exe):
    """The C++ call inside a ``jax.stages.Compiled`` that has run once: calling it skips
    ``Compiled.__call__``'s Python frame on eager's per-op path (the executable itself
    when a JAX version has no such attribute)."""
    return getattr(exe, "_call", None) or exe


_in_flight: list = []  # Futures of background single-op compiles not yet seen done


def compile_op_ahead(info: OpInfo):
    """Start compiling ``info``'s single-op executable; returns its Future. Lowering
    happens here, so an op without a working lowering fails at its own line; XLA's
    compile runs on a background thread. An executable in the store is loaded now."""
    if info.compiling is None:
        key = _op_store_key(info)
        exe = _load(key, info.device, "OpCompileTime")
        if exe is not None:
            future = concurrent.futures.Future()
            future.set_result(exe)
        else:
            t0 = time.perf_counter()
            lowered = _lower_op(info)
            future = background(_compile_off_thread, lowered, info.device, key,
                                time.perf_counter() - t0)
            _in_flight.append(future)
        info.compiling = future
        metrics.counter("OpCompile")
    return info.compiling


def _store_key(description: bytes, device: int, options) -> str | None:
    """The executable store's key (None: the store is off)."""
    return exe_store.key(description, device, options) if exe_store.directory() else None


def _op_store_key(info: OpInfo) -> str | None:
    return _store_key(info_digest(info), info.device, _single_op_options(info.device))


def _load(key: str | None, device: int, metric: str):
    """The executable stored under ``key`` (no lowering), its load time counted as
    compile time in ``metric``; None on a miss or with the store off."""
    if key is None:
        return None
    t0 = time.perf_counter()
    exe = exe_store.load(key, device)
    if exe is not None:
        metrics.record(metric, time.perf_counter() - t0)
    return exe


def _compile_op(lowered, device: int, key: str | None, lower_s: float):
    exe = compile_lowered(lowered, metric="OpCompileTime", lower_s=lower_s,
                          compiler_options=_single_op_options(device))
    if key is not None:
        exe_store.store(key, exe)
    return exe


def _compile_off_thread(lowered, device: int, key: str | None, lower_s: float):
    t0 = time.perf_counter()
    try:
        return _compile_op(lowered, device, key, lower_s)
    finally:
        metrics.record("OpBackgroundCompileTime", time.perf_counter() - t0)


def compiles_in_flight() -> bool:
    """Whether a background single-op compile is still running."""
    for fut in _in_flight:  # usually stops at the first: the oldest finish first
        if not fut.done():
            return True
    _in_flight.clear()
    return False


# Fills: nodes whose value does not depend on their inputs' values. Zeros, ones and
# fill_/zero_ (what torch.zeros(..., device="xla") records: empty, then zero_) are made
# device data before their first in-place write (see dispatch); empties only when read
# (an empty is usually overwritten whole, and its node costs nothing in a graph).
_FILL_VALUES = {"aten::zeros": 0, "aten::zeros_like": 0, "aten::new_zeros": 0, "aten::zero_": 0,
                "aten::ones": 1, "aten::ones_like": 1, "aten::new_ones": 1}
_EMPTIES = ("aten::empty", "aten::empty_like", "aten::new_empty", "aten::empty_strided",
            "aten::new_empty_strided")


def fill_value(node: Node):
    """The value a pending fill node fills with, or None if ``node`` is not a fill."""
    name = node.info.name
    value = _FILL_VALUES.get(name)
    if value is None and name == "aten::fill_" and len(node.inputs) == 1:
        # the value is the lifted scalar, or (not lifted: bool, int) in the signature
        value = node.scalars[0] if node.scalars else node.info.sig[1][1]
        if not isinstance(value, (bool, int, float)):
            return None
    return value


def settle_fill(node: Node, value=0) -> None:
    """Make the pending fill ``node`` device data: ``value`` everywhere."""
    meta = node.info.out
    dtype = to_jax_dtype(meta.dtype)
    device = jax_device(node.info.device)
    with jax.enable_x64(True):
        if device.platform == "cpu":  # a host buffer is the device's: nothing to compile
            arr = jax.device_put(np.full(meta.shape, value, dtype), device)
        else:  # made on the device: no transfer (JAX compiles one fill per shape)
            arr = jax.numpy.full(meta.shape, value, dtype, device=device)
    node.materialize(arr)


def settled_if_empty(node: Node) -> bool:
    """Settle ``node`` if it is a pending empty (nothing to compile); whether it was."""
    if node.info.name in _EMPTIES and not node.info.multi:
        settle_fill(node)
        return True
    return False


def node_array(node: Node, cause: str = "value needed"):
    """The node's device array, computing pending work if there is any."""
    data = node.data
    if data is not None:
        return data
    if settled_if_empty(node):
        return node.data
    from .sync import materialize
    materialize([node], cause=cause)
    return node.data


# ---------------------------------------------------------------------------------------
# Whole graphs

@dataclass
class CompiledGraph:
    """One compiled graph, as ``xlanb.graphs()`` lists it."""
    hash: str
    device: int
    n_nodes: int
    n_inputs: int
    n_outputs: int
    cause: str
    src: str
    compile_time: float
    executable: object = field(repr=False)
    hits: int = 0
    run_time: float = 0.0
    explanation: str = ""  # why it compiled: how it differs from the last graph from here
    summary: object = field(default=None, repr=False)  # summary.GraphSummary
    lowered: object = field(default=None, repr=False)  # jax.stages.Lowered, once known
    # lowers the graph again (an executable loaded from the store was never lowered here)
    relower: object = field(default=None, repr=False)

    def lowered_module(self):
        """The ``jax.stages.Lowered`` this graph compiles from (lowered now if needed)."""
        if self.lowered is None:
            self.lowered = self.relower()
        return self.lowered

    def ir_text(self, depth: int | None = None) -> str:
        """The graph's IR as it was recorded, one line per node."""
        from .inspection import render_text
        return render_text(self.summary, depth)

    def dot(self, scope_depth: int | None = None, highlight: str | None = None) -> str:
        """The graph as Graphviz DOT (see ``inspection.render_dot``)."""
        from .inspection import render_dot
        return render_dot(self.summary, scope_depth, highlight)

    def hlo(self, dialect: str = "stablehlo", optimized: bool = False) -> str:
        """The module this graph compiled from, or XLA's optimized HLO."""
        if optimized:
            return self.executable.as_text()
        if dialect not in ("stablehlo", "hlo"):
            raise ValueError(f"dialect must be 'stablehlo' or 'hlo', got {dialect!r}")
        return self.lowered_module().as_text(dialect=dialect)

    @property
    def ops(self) -> tuple:
        """Op names in topological order."""
        return tuple(o.name for o in self.summary.ops) if self.summary else ()

    def cost_analysis(self) -> dict:
        """XLA's cost estimate (flops, bytes accessed...), where the backend provides it."""
        try:
            return dict(self.executable.cost_analysis() or {})
        except Exception:  # not every backend implements it
            return {}

    def memory_analysis(self):
        """XLA's memory use of the executable, where the backend provides it."""
        try:
            return self.executable.memory_analysis()
        except Exception:
            return None


class GraphList(list):
    """``xlanb.graphs()``: compiled graphs, oldest first, printable as a table."""

    _COLUMNS = ("#", "hash", "nodes", "in", "out", "compile", "hits", "run", "cause", "source")

    def rows(self) -> list[tuple]:
        return [(str(i), g.hash[:12], str(g.n_nodes), str(g.n_inputs), str(g.n_outputs),
                 f"{g.compile_time:.2f}s", str(g.hits), f"{g.run_time:.3f}s", g.cause, g.src)
                for i, g in enumerate(self)]

    def __str__(self) -> str:
        if not self:
            return "no compiled graphs"
        rows = [self._COLUMNS] + self.rows()
        widths = [max(len(r[c]) for r in rows) for c in range(len(self._COLUMNS))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        for i, g in enumerate(self):
            if g.explanation:
                lines.append(f"  #{i} recompiled: {g.explanation}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html
        head = "".join(f"<th>{c}</th>" for c in self._COLUMNS + ("why",))
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r)
                       + f"<td>{html.escape(g.explanation)}</td></tr>"
                       for r, g in zip(self.rows(), self))
        return f"<table class='xlanb-graphs'><tr>{head}</tr>{body}</table>"


_graph_cache: dict = {}
graph_log: list[CompiledGraph] = []  # in compile order


def _graph_fn(plan: GraphPlan):
    steps = plan.steps
    root_pos = plan.root_pos

    def run(leaves, scalars):
        vals = list(leaves)
        k = 0
        for info, ins in steps:
            n = len(info.scalar_specs)
            vals.append(info.fn([vals[i] for i in ins], scalars[k:k + n]))
            k += n
        return [vals[p] for p in root_pos]
    return run


def graph_specs(plan: GraphPlan, device: int):
    """The abstract arguments of ``plan``'s graph function: leaf arrays, lifted scalars."""
    return ([_tensor_spec(leaf_meta(n), device) for n in plan.leaves],
            [_scalar_spec(k, device) for info, _ in plan.steps for k in info.scalar_specs])


def lower_graph(plan: GraphPlan, device: int):
    """``plan`` lowered by JAX (a ``jax.stages.Lowered``), without compiling it."""
    return _lower_graph_fn(_graph_fn(plan), graph_specs(plan, device))


def _lower_graph_fn(fn, specs):
    from .runtime import jax_context
    with jax_context():
        return jax.jit(fn).lower(*specs)


def compiled_graph(plan: GraphPlan, device: int, cause: str, src) -> tuple[CompiledGraph, bool]:
    """The cached executable of ``plan``'s structure: from memory, else from the
    executable store, else compiled now. Returns it and whether it is new to this process."""
    key = (device, plan.key)
    rec = _graph_cache.get(key)
    if rec is None:
        specs = graph_specs(plan, device)
        fn = _graph_fn(plan)
        graph_hash = stable_hash(plan, device)
        store_key = _store_key(graph_hash.encode(), device, None)
        t0 = time.perf_counter()
        lowered = None
        exe = _load(store_key, device, "CompileTime")
        if exe is None:
            lowered, exe = compile_jitted(fn, specs, metric="CompileTime", lower_metric="LowerTime")
            if store_key is not None:
                exe_store.store(store_key, exe)
        metrics.counter("UncachedCompile")
        where = format_src(src)
        summary = summarize(plan)
        prev = next((g for g in reversed(graph_log) if g.src == where and g.device == device), None)
        rec = CompiledGraph(graph_hash[:16], device, len(plan.steps), len(plan.leaves),
                            len(plan.roots), cause, where, time.perf_counter() - t0, exe,
                            explanation=explain(prev.summary, summary) if prev else "",
                            summary=summary, lowered=lowered,
                            relower=functools.partial(_lower_graph_fn, fn, specs))
        _graph_cache[key] = rec
        graph_log.append(rec)
        return rec, True
    return rec, False


class RecompileWarning(UserWarning):
    """Graphs from one source line keep compiling (the graph is dynamic)."""


_syncs_at: dict[str, int] = {}     # source line -> lazy syncs from there
_compiles_at: dict[str, int] = {}  # source line -> new graphs from there


def _report_compile(rec: CompiledGraph, src) -> None:
    """XLANB_DEBUG printing, and the too-frequent warning that names the cause."""
    n = _compiles_at[rec.src] = _compiles_at.get(rec.src, 0) + 1
    if config.debug and rec.explanation:
        print(f"xlanb: new graph {rec.hash[:12]} ({rec.cause} at {rec.src}): {rec.explanation}",
              file=sys.stderr)
    syncs = _syncs_at.get(rec.src, 0)
    if rec.explanation and n >= config.frequent_compiles and 2 * n >= syncs:
        msg = (f"xlanb: compiles too frequent: {n} graphs in {syncs} syncs at "
               f"{rec.src or '?'} ({rec.cause}); latest: {rec.explanation}")
        if src is not None:  # point the warning at the user's line, not at xlanb
            warnings.warn_explicit(msg, RecompileWarning, src[0].co_filename, src[1])
        else:
            warnings.warn(msg, RecompileWarning, stacklevel=3)


def run_graph(plan: GraphPlan, device: int, cause: str, src) -> list:
    """Compile (or find) the graph of ``plan`` and run it; returns the roots' arrays."""
    where = format_src(src)
    _syncs_at[where] = _syncs_at.get(where, 0) + 1
    rec, fresh = compiled_graph(plan, device, cause, src)
    if fresh:
        _report_compile(rec, src)
    else:
        metrics.counter("CachedCompile")
        rec.hits += 1
    t0 = time.perf_counter()
    with jax.enable_x64(True):
        outs = rec.executable([n.data for n in plan.leaves], plan.scalars)
        jax.block_until_ready(outs)
    dt = time.perf_counter() - t0
    rec.run_time += dt
    metrics.record("ExecuteTime", dt)
    return outs


def run_op_by_op(plan: GraphPlan, keep: dict | None = None) -> list:
    """Run ``plan`` node by node through the single-op cache.

    ``keep``, if given, receives every intermediate value (keyed by node id) and supplies
    values computed earlier, so repeated peeks recompute nothing.
    """
    if config.background_compile:
        # Every missing executable starts compiling now, on the compile threads, while
        # the main thread lowers the next: the first peek at a layer's output or the
        # first op-by-op sync waits for the slowest compile, not for all of them in turn.
        for info, _ in plan.steps:
            if info.exe is None and info.name != GETITEM:
                compile_op_ahead(info)
    vals = [n.data if n.data is not None else keep[id(n)] for n in plan.leaves]
    k = 0
    run_time = 0.0
    with jax.enable_x64(True):
        for (info, ins), node in zip(plan.steps, plan.op_nodes):
            n = len(info.scalar_specs)
            args = [vals[i] for i in ins]
            if info.name == GETITEM:  # pick one output of a multi-output node: nothing to run
                out = info.fn(args, ())
            else:
                exe = op_executable(info)  # compile time is OpCompileTime, not ExecuteTime
                t0 = time.perf_counter()
                out = exe(*args, *plan.scalars[k:k + n])
                run_time += time.perf_counter() - t0
            k += n
            vals.append(out)
            if keep is not None:
                keep[id(node)] = out
    metrics.record("ExecuteTime", run_time)
    return [vals[p] for p in plan.root_pos]


def graphs() -> GraphList:
    """Every compiled graph with its cause, source line, times, hits and explanation."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    return GraphList(graph_log)


def clear_graph_cache() -> None:
    _graph_cache.clear()
    graph_log.clear()
    _syncs_at.clear()
    _compiles_at.clear()
