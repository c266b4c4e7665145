"""Sync: gather the live tensors with pending IR and compute them.

In lazy mode the pending work runs as one graph through the graph cache; in opbyop mode,
node by node through the single-op cache. Nodes are only swapped for device data after
the whole run succeeded, so a failed compile or a KeyboardInterrupt loses nothing.
"""
from __future__ import annotations

import weakref

from .capture import _recorder
from .executor import run_graph, run_op_by_op
from .ir import Node, plan_graph, user_frame
from .modes import state as mode_state

# Storages whose node may be pending, appended on every write. Read in last-write order,
# which is the program order of their pending nodes: graph structure (and so the cache
# key) depends on neither set iteration order nor when a tensor was created, so a first
# step that creates optimizer state cuts the same graph as the steps after it. Weak: a
# tensor nobody holds is never computed. A list of weakrefs, because tracking happens on
# every recorded op; duplicates and dead entries are dropped when it is read or compacted.
_live: list = []
_compact_at = [4096]
# Values computed by peeks, kept until the next sync (node id -> array), with the nodes.
peek_values: dict = {}
_peeked_nodes: list = []


def track(storage) -> None:
    _live.append(weakref.ref(storage))
    if len(_live) > _compact_at[0]:
        _compact()


def _live_storages() -> list:
    """Live storages with pending nodes, each once, in last-write order."""
    seen = set()
    out = []
    for ref in reversed(_live):
        s = ref()
        if s is not None and s.node.data is None and id(s) not in seen:
            seen.add(id(s))
            out.append(s)
    out.reverse()
    return out


def _compact() -> None:
    _live[:] = [weakref.ref(s) for s in _live_storages()]
    _compact_at[0] = max(4096, 2 * len(_live))


# Eager mode: views whose cached value waits on a background compile (dispatch.py). A
# view's value is not its storage's node, so running the storages alone would leave it.
_waiting_views: list = []


def track_view(t) -> None:
    _waiting_views.append(weakref.ref(t))


def _end_waiting() -> None:
    """Eager: nothing waits on a background compile any more."""
    mode_state.deferred = False
    _waiting_views.clear()


def pending_roots() -> list[Node]:
    """The pending nodes of every live tensor, each once."""
    seen = set()
    roots = []
    for s in _live_storages():
        node = s.node
        if id(node) not in seen:
            seen.add(id(node))
            roots.append(node)
    for ref in _waiting_views:
        t = ref()
        if t is not None and t._ver == t._storage.version:
            node = t._node
            if node.data is None and id(node) not in seen:
                seen.add(id(node))
                roots.append(node)
    return roots


def clear_peeks() -> None:
    peek_values.clear()
    _peeked_nodes.clear()


def materialize(roots: list[Node], cause: str) -> None:
    """Compute ``roots`` (pending nodes) and swap them for device data."""
    if mode_state.deferred and mode_state.mode == "eager":
        # eager: a value read runs every op that waited on a background compile
        roots = list(roots) + pending_roots()
    roots = list({id(r): r for r in roots if r.data is None}.values())
    if not roots:
        return
    if _recorder[0] is not None:
        _recorder[0].host_read(cause)  # inside xlanb.compile: this call cannot be replayed
    src = user_frame()
    by_device: dict[int, list[Node]] = {}
    for r in roots:
        by_device.setdefault(r.info.device, []).append(r)
    results = []
    for device, nodes in by_device.items():
        plan = plan_graph(nodes)
        if mode_state.mode == "lazy":
            arrays = run_graph(plan, device, cause, src)
        else:
            arrays = run_op_by_op(plan)
        results.append((plan.roots, arrays))
    for nodes, arrays in results:
        for node, arr in zip(nodes, arrays):
            node.materialize(arr)
    if mode_state.deferred and mode_state.mode == "eager":
        _end_waiting()
    clear_peeks()


def sync(cause: str = "user sync") -> None:
    """Run all pending work as one graph (per device). Alias: ``mark_step``."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    if _recorder[0] is not None:
        return  # inside xlanb.compile the function's end is the sync
    roots = pending_roots()
    if roots:
        materialize(roots, cause)
    else:
        clear_peeks()
        if mode_state.deferred:  # the ops that waited on compiles were never needed
            _end_waiting()
    _compact()


def peek_node(node: Node):
    """``node``'s value, computed op by op without changing any pending graph."""
    if node.data is not None:
        return node.data
    got = peek_values.get(id(node))
    if got is not None:
        return got
    plan = plan_graph([node], known=peek_values)
    (arr,) = run_op_by_op(plan, keep=peek_values)
    # Keep the peeked nodes alive so their ids stay valid keys until the next sync.
    _peeked_nodes.extend(plan.op_nodes)
    return arr
