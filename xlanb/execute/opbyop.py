"""Running a graph node by node through the single-op executables (opbyop syncs, peeks)."""
from __future__ import annotations

import time

import jax

from ..base import metrics
from ..base.config import config
from ..base.frames import format_loc
from ..base.session import session
from ..ir.nodes import GETITEM, GraphPlan
from ..executables.background import compile_op_ahead
from ..executables.compile import add_op_note
from ..values.memory import check_op, device_oom, is_device_oom
from ..executables.single_op import op_executable, run_op_on_arrays


def run_plan_op_by_op(plan: GraphPlan, keep=None, quick: bool = False) -> list:
    """Run ``plan`` node by node through the single-op cache.

    ``keep``, if given (a PeekCache), receives every intermediate value and supplies
    values computed earlier, so repeated peeks recompute nothing. Missing executables
    compile quickly for a peek, and with ``quick`` (an eager run of few signatures).
    """
    if config.background_compile and not session.spmd:
        # Every missing executable starts compiling now, on the compile threads, while
        # the main thread lowers the next: the first peek at a layer's output or the
        # first op-by-op sync waits for the slowest compile, not for all of them in turn.
        # A peek waits for quickly compiled ones (the optimized ones follow).
        quick = quick or (keep is not None and config.quick_peeks)
        for (info, _), node in zip(plan.steps, plan.op_nodes):
            if info.exe is None and info.name != GETITEM:
                try:
                    compile_op_ahead(info, quick)  # lowers here: a lowering error is raised now
                except Exception as e:
                    add_op_note(e, "lowering failed in", info, node.src, node.scope)
                    raise
    vals = [n.data if n.data is not None else keep[id(n)] for n in plan.leaves]
    k = 0
    run_time = 0.0
    with jax.enable_x64(True):
        for (info, ins), node in zip(plan.steps, plan.op_nodes):
            n = len(info.scalar_specs)
            args = [vals[i] for i in ins]
            if info.name == GETITEM:  # pick one output of a multi-output node: nothing to run
                out = info.fn(args, ())
            elif session.spmd:  # chosen by the inputs' shardings (executables/single_op.py)
                t0 = time.perf_counter()
                try:
                    out = run_op_on_arrays(info, args, plan.scalars[k:k + n], node.src)
                except Exception as e:
                    add_op_note(e, "running failed for", info, node.src, node.scope)
                    raise
                run_time += time.perf_counter() - t0
            else:
                try:
                    exe = op_executable(info)  # compile time is OpCompileTime, not ExecuteTime
                except Exception as e:
                    add_op_note(e, "compiling failed for", info, node.src, node.scope)
                    raise
                if config.memory_limit is not None:  # before it runs, with every value so far
                    check_op(info, node.src)
                t0 = time.perf_counter()
                try:
                    out = exe(*args, *plan.scalars[k:k + n])
                except Exception as e:
                    if is_device_oom(e):
                        raise device_oom(e, info.device, f"{info.name} at "
                                         f"{format_loc(node.src) or '?'}") from e
                    raise
                run_time += time.perf_counter() - t0
            k += n
            vals.append(out)
            if keep is not None:
                keep.put(node, out)
    metrics.record("ExecuteTime", run_time)
    return [vals[p] for p in plan.root_pos]


def time_op_by_op(plan: GraphPlan, repeats: int = 3) -> list:
    """Seconds each op of ``plan`` takes run alone through the single-op cache (the best
    of ``repeats``, each run to completion), from its leaves; 0 for GETITEM steps.
    Compiles what is missing first, so no compile is timed. For a profile whose trace
    has no per-instruction events: an estimate, not a measure of the fused graph."""
    vals = [n.data for n in plan.leaves]
    times = []
    k = 0
    with jax.enable_x64(True):
        for (info, ins), node in zip(plan.steps, plan.op_nodes):
            n = len(info.scalar_specs)
            args = [vals[i] for i in ins]
            scalars = plan.scalars[k:k + n]
            k += n
            if info.name == GETITEM:
                vals.append(info.fn(args, ()))
                times.append(0.0)
                continue
            if session.spmd:  # sharded inputs: the executable of their shardings
                exe = lambda *a, _info=info: run_op_on_arrays(_info, list(a[:len(args)]), a[len(args):])  # noqa: E731
            else:
                exe = op_executable(info)
            out = jax.block_until_ready(exe(*args, *scalars))  # warm
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(exe(*args, *scalars))
                best = min(best, time.perf_counter() - t0)
            vals.append(out)
            times.append(best)
    return times
