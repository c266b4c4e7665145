"""Looking at graphs without running them: IR as text or DOT (pending or compiled), and
the HLO a sync would compile. Nothing here changes the pending graph."""
from __future__ import annotations

import torch

from ..base.frames import user_frame
from ..execute.graphs import find_graph
from ..executables.stages import (GraphLowering, kept_shardings, leaf_mesh, leaf_shardings,
                              lower_graph, mesh_leaves)
from ..executables.target import TargetReport, compile_for_target
from ..runtime.targets import target as resolve_target
from ..values.memory import forecast
from ..pending.realize import placed
from ..graph.render import render_dot, render_text
from ..graph.repeats import find_repeats
from ..graph.summary import GraphSummary, summarize
from ..ir.nodes import GraphPlan, Node, plan_graph
from ..pending.live import pending_roots
from ..modes.record import value_node


def roots_of(tensors) -> list[Node]:
    """The pending nodes of ``tensors``, or of every live tensor when none are given."""
    if not tensors:
        return pending_roots()
    roots = []
    with torch._C._DisableTorchDispatch():
        for t in tensors:
            if not hasattr(t, "_storage"):
                raise TypeError(f"expected tensors on the xla device, got {type(t).__name__}"
                                + (f" on {t.device}" if isinstance(t, torch.Tensor) else ""))
            roots.append(value_node(t))
    return roots


def _plan(tensors) -> GraphPlan:
    return plan_graph(roots_of(tensors))


# ---------------------------------------------------------------------------------------
# The public functions

def pending_ir(*tensors, fmt: str = "text", depth: int | None = None,
               scope_depth: int | None = None, highlight: str | None = None,
               fold: bool = False) -> str:
    """The pending IR of ``tensors`` (all live pending tensors when none are given).

    ``depth`` keeps only the ops at most that many hops before the outputs. ``fold``
    (text) shows each run of identical layers once: the first layer's ops, then one
    line for the rest (graph/repeats.py finds them as a loop would). For DOT,
    ``scope_depth`` collapses module scopes deeper than that many levels and
    ``highlight`` marks the ops whose name or ``file:line`` match a regex."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    if fmt not in ("text", "dot"):
        raise ValueError(f"fmt must be 'text' or 'dot', got {fmt!r}")
    for name, v in (("depth", depth), ("scope_depth", scope_depth)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    g = pending_summary(*tensors, fold=fold and fmt == "text")
    if fmt == "text":
        return render_text(g, depth)
    return render_dot(g, scope_depth=scope_depth, highlight=highlight, depth=depth)


def pending_summary(*tensors, fold: bool = False) -> GraphSummary:
    """The pending graph of ``tensors`` as plain data (for front ends that draw it);
    with ``fold``, its runs of identical layers folded for the text view."""
    plan = _plan(tensors)
    g = summarize(plan)
    return g._replace(folds=_folds(plan)) if fold else g


def _folds(plan: GraphPlan) -> tuple:
    """Per run of repeated layers: everything but the layer that runs first, folded."""
    r = find_repeats(plan.steps, len(plan.leaves), plan.root_pos,
                     [(n.src, n.scope) for n in plan.op_nodes])
    if r is None:
        return ()
    out = []
    for run in r.runs:
        k = run.first
        skipped = frozenset(op for i, ops in enumerate(run.segments) if i != k for op in ops)
        others = [layer for i, layer in enumerate(run.layers) if i != k]
        n = len(others)
        kind = run.what[len(run.name):]  # "", " backward" or " update"
        out.append((min(skipped), f"# {run.name} {min(others)}–{max(others)}{kind}: {n} more "
                    f"layer{'s' if n > 1 else ''}, the same {len(run.segments[k])} ops as "
                    f"layer {run.layers[k]}, folded ({len(skipped)} ops)", skipped))
    return tuple(out)


def pending_count(*tensors) -> int:
    """How many ops are pending for ``tensors`` (all live tensors when none are given)."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    return len(_plan(tensors).steps)


def hlo(*tensors, dialect: str = "stablehlo", optimized: bool = False) -> str:
    """The module the next sync of ``tensors`` would compile, without running it.

    ``optimized=True`` compiles it (through the graph cache, so the sync that follows
    reuses the executable) and returns XLA's optimized HLO.
    """
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    if dialect not in ("stablehlo", "hlo"):
        raise ValueError(f"dialect must be 'stablehlo' or 'hlo', got {dialect!r}")
    plan = _plan(tensors)
    if not plan.steps:
        return ""
    device = plan.roots[0].info.device
    if optimized:  # the graph the next sync runs (on a mesh: the same shardings)
        rec, _, _ = find_graph(plan, device, "xlanb.hlo(optimized=True)", user_frame(),
                               placed(plan.roots))
        return rec.executable.as_text()
    arrays, mesh = mesh_leaves(plan)  # sharded leaves: the module the partitioner sees
    keep = kept_shardings(placed(plan.roots), mesh) if mesh is not None else None
    return lower_graph(plan, device, arrays, mesh, keep).as_text(
        dialect=dialect, debug_info=dialect == "hlo")


def collectives(*tensors):
    """The collectives XLA's partitioner put in a graph: each one's kind, result type,
    bytes per device, replica groups, and the aten op, module scope and source line it
    came from (a ``CollectiveList``).

    Of the graph the next sync of ``tensors`` (all live tensors when none are given)
    would compile: compiled now, through the graph cache, so that sync reuses it. With no
    pending work, or given a ``CompiledGraph`` (from ``xlanb.graphs()``), of that graph:
    the latest one compiled."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    from ..execute.graphs import CompiledGraph, graph_log
    from ..graph.collectives import CollectiveList, parse_collectives
    if len(tensors) == 1 and isinstance(tensors[0], CompiledGraph):
        g = tensors[0]
        return g.collectives or CollectiveList(parse_collectives(g.executable.as_text()), g.hash)
    plan = _plan(tensors)
    if not plan.steps:
        if not graph_log:
            return CollectiveList()
        g = graph_log[-1]
        return g.collectives or CollectiveList(parse_collectives(g.executable.as_text()), g.hash)
    device = plan.roots[0].info.device
    rec, _, _ = find_graph(plan, device, "xlanb.collectives()", user_frame(), placed(plan.roots))
    return rec.collectives or CollectiveList(parse_collectives(rec.executable.as_text()), rec.hash)


def pending_memory(*tensors):
    """Will the next sync fit? The graph it would run, compiled now (through the graph
    cache, so the sync reuses it) but not run, as a ``MemoryForecast``: the device bytes
    live now plus what the graph adds (its outputs and temporaries, less what it writes
    into donated buffers), against ``xlanb.memory_limit``. None with nothing pending."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    plan = _plan(tensors)
    if not plan.steps:
        return None
    device = plan.roots[0].info.device
    rec, _, _ = find_graph(plan, device, "xlanb.pending_memory()", user_frame(),
                           placed(plan.roots))
    return forecast(rec, device)


def compile_for(target, *tensors) -> TargetReport:
    """Compile, for a TPU ``target``, the graph the next sync of ``tensors`` would run
    (all pending work when none are given), and return what the TPU compiler says: a
    ``TargetReport`` (memory per chip against HBM, fits, cost, padding, collectives,
    compile time, the optimized TPU module).

    ``target`` is a topology name as JAX spells it (``"v5e:2x2"``, ``"v5p:2x2x1"``,
    ``"v4:2x2x1"``, ``"v6e:1x1"``) or an ``xlanb.Target``; it needs libtpu (``pip install
    "xlanb[tpu]"``), not a TPU. Nothing runs, nothing moves: the pending graph, every
    value and the compile counters stay as they were. A graph on a mesh goes onto the
    topology's devices in order; one on a single device, onto its first chip. Given a
    ``CompiledGraph`` (from ``xlanb.graphs()``), or with nothing pending, compiles that
    graph (the latest one) instead."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    from ..execute.graphs import CompiledGraph, graph_log
    t = resolve_target(target)  # an unknown name or no libtpu: before any work
    if len(tensors) == 1 and isinstance(tensors[0], CompiledGraph):
        return compile_for_target(tensors[0].lowering, t)
    plan = _plan(tensors)
    if not plan.steps:
        if tensors or not graph_log:
            raise ValueError("xlanb.compile_for: nothing pending to compile"
                             + (" for these tensors" if tensors else " and no graph compiled yet"))
        return compile_for_target(graph_log[-1].lowering, t)
    device = plan.roots[0].info.device
    mesh = leaf_mesh(plan)
    shardings = leaf_shardings(plan, mesh) if mesh is not None else None
    lowering = GraphLowering.of(plan, device, shardings, mesh,
                                kept_shardings(placed(plan.roots), mesh))
    return compile_for_target(lowering, t)
