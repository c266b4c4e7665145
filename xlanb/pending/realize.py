"""Computing pending work: ``sync`` (all of it), ``materialize`` (some nodes), ``peek_node``
(one value, op by op, changing nothing) and ``node_array`` (a value an op needs now).

In lazy mode the pending work runs as one graph through the graph cache; in opbyop mode,
node by node through the single-op cache. Nodes are only swapped for device data after
the whole run succeeded, so a failed compile or a KeyboardInterrupt loses nothing.
"""
from __future__ import annotations

from jax import block_until_ready

from ..base import metrics
from ..base.frames import format_loc, user_frame
from ..base.config import config
from ..base.session import mode_state, session
from ..values.checks import (FAILED_NOTE, bounds_info, check_looked, check_not_failed,
                             failed_nodes, pending_devices, pending_index_checks,
                             settle_index_checks, take_index_checks, without_failed)
from ..values.fills import settled_if_empty
from ..values.memory import sample
from ..execute.nans import check_run, raise_deferred
from ..execute.opbyop import run_plan_op_by_op
from ..executables.prefix import missing_ops, prefix_value
from ..execute.host import fits_host, run_on_host
from ..ir.nodes import Node, plan_graph
from ..runtime.jit import later_held
from ..values.peeks import peek_values
from .live import (clear_peeks, compact, live_storages,
                   pending_roots)


def materialize(roots: list[Node], cause: str) -> None:
    """Compute ``roots`` (pending nodes) and swap them for device data, in the calling
    thread's mode."""
    state = mode_state()
    roots = state.policy.roots_to_run(state, roots)
    roots = list({id(r): r for r in roots if r.data is None}.values())
    if not roots and not pending_index_checks:
        return
    if session.recorder is not None:
        session.recorder.host_read(cause)  # inside xlanb.compile: this call cannot be replayed
    src = user_frame()
    by_device: dict[int, list[Node]] = {}
    for r in roots:
        by_device.setdefault(r.info.device, []).append(r)
    if pending_index_checks:
        for device in pending_devices():
            by_device.setdefault(device, [])
    results = []
    for device, nodes in by_device.items():
        checks = take_index_checks(device) if pending_index_checks else ()
        if not nodes and not checks:
            continue
        try:
            plan, arrays = run_checked(nodes, checks, device, state.mode, cause, src)
        except Exception:  # (an interrupt is not the run's fault: it keeps what it swept)
            state.policy.run_failed(state, nodes)
            raise
        if observers:
            for fn in tuple(observers):
                fn("graph", plan, (state.mode, cause, src))
        results.append((plan.roots, arrays))
    for nodes, arrays in results:
        for node, arr in zip(nodes, arrays):
            node.materialize(arr)
    state.policy.synced(state)
    clear_peeks()


def run_checked(nodes: list, checks, device: int, mode: str, cause: str, src):
    """Compute the pending ``nodes`` on ``device`` as one run, in the calling thread's
    mode, with the index ``checks`` ((IndexCheck, index node) pairs) as one more output;
    raise torch's error for a bad index, or a NaN (``XLANB_DEBUG_NANS``), before anything
    is swapped in. Returns the plan that ran and its roots' arrays (the checks' last):
    what a sync swaps in, and what ``xlanb.compile`` replays."""
    if checks:
        nodes = nodes + [_bounds_node(checks, device)]
    plan = plan_graph(nodes)
    if failed_nodes:
        check_not_failed(plan.op_nodes)
    arrays = mode_state().policy.run_sync_plan(plan, device, cause, src, placed(plan.roots))
    if checks:
        where = f" at {format_loc(src)}" if src is not None else ""
        settle_index_checks([c for c, _ in checks], arrays[-1],
                            f"found by the index check compiled into the {mode} sync "
                            f"({cause}){where}; nothing was swapped in: " + FAILED_NOTE
                            + ". XLANB_CHECK_DEVICE_INDICES=0 turns this check off")
    if config.debug_nans:  # one fused check; on a NaN, raises before anything is swapped
        check_run(plan, arrays, mode, cause, src)
    return plan, arrays


def _bounds_node(checks, device: int) -> Node:
    """The node whose value is ``[min, max]`` of each checked index (values/checks.py);
    ``checks``: (IndexCheck, index node) pairs."""
    metas = tuple(n.info.out for _, n in checks)
    info = bounds_info(metas, tuple((c.ignore, c.measure) for c, _ in checks), device)
    first = checks[0][0]
    return Node(info, tuple(n for _, n in checks), (), None, first.src, first.scope)


def placed(roots) -> tuple | None:
    """SPMD: per root, where the value it replaces in its storage lay (None when
    nothing is sharded): what a sync passes to ``run_plan_as_graph``."""
    return _placed(roots) if session.spmd else None


def _placed(roots) -> tuple:
    """SPMD: per root, where the value it replaces in its storage lay (or None)."""
    by_node = {id(s.node): s.placed for s in live_storages()}
    return tuple(by_node.get(id(r)) for r in roots)


def sync(cause: str = "user sync") -> None:
    """Run all pending work as one graph (per device). Alias: ``mark_step``.

    All of it: the process's live pending tensors, whichever thread recorded them (they
    share one graph cache), in the calling thread's mode."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    if session.recorder is not None:
        return  # inside xlanb.compile the function's end is the sync
    if config.debug_nans:
        raise_deferred()  # a NaN an eager backward op made (found on autograd's thread)
    roots = without_failed(pending_roots())  # a failed result stays pending: reads raise
    if roots or pending_index_checks:
        materialize(roots, cause)
    else:
        clear_peeks()
        state = mode_state()
        state.policy.synced(state)
    compact()
    sample(cause)  # device bytes after each sync: the peak and xlanb.memory_timeline()
    if observers:  # a profiler: a user sync ends a step
        for fn in tuple(observers):
            fn("step", cause, None)


# Profilers (``xlanb.profile``) while they record: called as fn("graph", plan, (mode,
# cause, src)) after a sync's graph or op-by-op run, and fn("step", cause, None) after
# each sync.
observers: list = []


def peek_node(node: Node):
    """``node``'s value, computed op by op without changing any pending graph."""
    if node.data is not None:
        return node.data
    if failed_nodes:  # before a value an earlier look computed from it
        check_not_failed(plan_graph([node]).op_nodes)
    got = peek_values.get(id(node))
    if got is not None:
        return got
    plan = plan_graph([node], known=peek_values)
    with later_held():  # the optimized compiles a look queues wait until it has its value
        try:  # a first look: the prefix as one quick graph (executables/prefix.py)
            arr = prefix_value(plan, peek_values)
        except Exception:  # noqa: BLE001 - op by op names the op that fails
            metrics.counter("PeekCompileFallback")
            arr = None
        if arr is None:
            (arr,) = run_plan_op_by_op(plan, keep=peek_values)
        block_until_ready(arr)
    if pending_index_checks:  # a look never shows what XLA made of a bad index
        check_looked(peek_values)
    return arr


def host_look(node: Node):
    """``node``'s value as a CPU tensor computed by CPU torch without changing any pending
    graph, when its pending work is small enough for a host segment
    (``execute/host.py``) and some of its ops have no executable: an eager index check
    (the ids an embedding reads, while a run is open) compiled those ops alone, 8 ms
    each, at every new prompt length. None otherwise (a look computes it)."""
    if node.data is not None or failed_nodes:
        return None
    plan = plan_graph([node], known=peek_values)
    if not plan.steps or not missing_ops(plan) or not fits_host(plan):
        return None
    arrays = [n.data if n.data is not None else peek_values[id(n)] for n in plan.leaves]
    outs = run_on_host(plan, arrays, plan.steps[-1][0].device, to_device=False)
    return None if outs is None else outs[0]


def node_array(node: Node, cause: str = "value needed"):
    """The node's device array, computing pending work if there is any."""
    data = node.data
    if data is not None:
        return data
    if settled_if_empty(node):
        return node.data
    materialize([node], cause=cause)
    return node.data
