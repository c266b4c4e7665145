"""How an xla tensor prints: values by peek (never cutting the graph), sync, or meta only."""
from __future__ import annotations

import torch

from ..base.config import config
from ..ir.nodes import plan_graph
from ..dispatch.reads import in_dtype_of, peek_host, to_host
from ..pending.realize import peek_node
from ..modes.record import value_node
from ..runtime.mesh import global_index
from ..runtime.transfer import array_to_host
from ..ir.tensor import set_handler


def _pending_ops(node) -> int:
    return 0 if node.data is not None else len(plan_graph([node]).steps)


def scalar_value(t):
    """A 0-dim tensor's Python value for formatting: peeked unless inspect is "sync"."""
    if config.inspect == "sync":
        return t.item()
    return peek_host(t).item()


def tensor_repr(t) -> str:
    how = config.inspect
    suffix = [f"device='{t.device}'"]
    if t.grad_fn is not None:
        suffix.append(f"grad_fn=<{type(t.grad_fn).__name__}>")
    elif t.requires_grad:
        suffix.append("requires_grad=True")
    with torch._C._DisableTorchDispatch():
        node = value_node(t)
    # Not inside that guard: what the look runs may lower a decomposition, whose torch
    # ops reach xlanb through __torch_dispatch__ (rad2deg's ``self * c`` failed as
    # aten::mul.out on the xla backend when a look was its first lowering)
    if how == "meta":
        return (f"tensor(<{_pending_ops(node)} pending ops>, size={tuple(t.shape)}, "
                f"dtype={t.dtype}, {', '.join(suffix)})")
    if how == "sync":
        host = to_host(t, cause="repr (config.inspect='sync')")
    else:
        arr = peek_node(node)
        if not getattr(arr, "is_fully_addressable", True) and not arr.is_fully_replicated:
            return _local_repr(t, arr, suffix)
        host = in_dtype_of(t, array_to_host(arr))
    body = repr(host)
    return body[:-1] + ", " + ", ".join(suffix) + ")"


def _local_repr(t, arr, suffix) -> str:
    """A tensor sharded over several processes prints the shards this process holds:
    reading the rest would be a collective that every process must join, and a print
    is often made by one process alone."""
    import jax
    lines = [f"tensor(<sharded over {jax.process_count()} processes; shape={tuple(t.shape)}, "
             f"dtype={t.dtype}; process {jax.process_index()} holds:>"]
    for sh in sorted(arr.addressable_shards, key=lambda s: global_index(s.device)):
        idx = ", ".join(f"{s.start or 0}:{s.stop if s.stop is not None else ''}" for s in sh.index)
        lines.append(f"  xla:{global_index(sh.device)} [{idx}] "
                     + repr(array_to_host(sh.data)).replace("\n", "\n  "))
    return "\n".join(lines) + "\n, " + ", ".join(suffix) + ")"


set_handler("repr", tensor_repr)
set_handler("scalar_value", scalar_value)
