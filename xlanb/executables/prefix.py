"""A first look at a pending value: its prefix as one quickly compiled graph.

A look (a peek) runs the value's prefix op by op through the single-op cache and
compiles the executables it lacks. In a fresh process it lacks most of them (42 for the
first layer of a 4-layer BERT), and JAX lowers each on the main thread (about 9 ms an op
on a 2-core VM), so the lowerings alone took longer than torch_xla's compile of the
whole prefix. When many are missing, the prefix is lowered once and compiled once, with
LLVM's optimizations off. The single ops it lacked are lowered, and compiled in the
background, at the next graph compile (while the main thread waits for it) or graph run
(``drain_lowerings``), so later looks run op by op as before. The pending graph is not
touched, and the prefix executable is not kept.
"""
from __future__ import annotations

import time

import jax

from ..base import metrics
from ..base.config import config
from ..base.session import session
from ..ir.nodes import GETITEM, GraphPlan
from .background import lower_soon
from .compile import Build
from .stages import lower_graph

# Fewer missing executables than this: op by op is as quick (each costs a lowering and a
# small compile; a prefix graph costs one lowering and one compile of every op in it).
MIN_MISSING = 8


def missing_ops(plan: GraphPlan) -> list:
    """The distinct op infos of ``plan`` with no executable and no compile started."""
    seen = set()
    out = []
    for info, _ in plan.steps:
        if info.exe is None and info.compiling is None and info.name != GETITEM \
                and id(info) not in seen:
            seen.add(id(info))
            out.append(info)
    return out


def prefix_value(plan: GraphPlan, keep):
    """The root of ``plan`` (one value) computed by one quickly compiled graph; None when
    op by op is the better way. The single ops it lacked are queued to be lowered at the
    next graph compile or run (``lower_soon``), so that later looks run op by op."""
    if not (config.quick_peeks and config.background_compile) or session.spmd \
            or config.memory_limit is not None or len(plan.roots) != 1:
        return None
    missing = missing_ops(plan)
    if len(missing) < MIN_MISSING:
        return None
    device = plan.steps[-1][0].device
    # Every op's value comes out, as op by op keeps them: a look at an earlier layer next
    # recomputes nothing (seeds/003's duplicate execution).
    n_leaves = len(plan.leaves)
    whole = plan._replace(roots=plan.op_nodes,
                          root_pos=tuple(range(n_leaves, n_leaves + len(plan.steps))))
    # Lowering single ops while it compiles was measured: the GIL they hold slowed the
    # compile by more than they saved (0.43 s against 0.38 s for seeds/003's first look).
    # Not stored: the prefix executable is not kept.
    exe = Build(device, lambda: lower_graph(whole, device), tier="quick",
                metric="PeekCompileTime").compile()
    metrics.counter("PeekCompile")
    lower_soon(missing)
    leaves = [n.data if n.data is not None else keep[id(n)] for n in plan.leaves]
    t0 = time.perf_counter()
    with jax.enable_x64(True):  # lifted floats are float64, as when it was lowered
        outs = exe(leaves, list(plan.scalars))
    metrics.record("ExecuteTime", time.perf_counter() - t0)
    for node, value in zip(plan.op_nodes, outs):
        keep.put(node, value)
    return outs[plan.root_pos[0] - n_leaves]
