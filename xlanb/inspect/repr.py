"""How an xla tensor prints: values by peek (never cutting the graph), sync, or meta only."""
from __future__ import annotations

import torch

from ..base.config import config
from ..ir import plan_graph
from ..reads import peek_host, to_host
from ..record import value_node
from ..tensor import set_handler


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
        if how == "meta":
            return (f"tensor(<{_pending_ops(node)} pending ops>, size={tuple(t.shape)}, "
                    f"dtype={t.dtype}, {', '.join(suffix)})")
        if how == "sync":
            host = to_host(t, cause="repr (config.inspect='sync')")
        else:
            host = peek_host(t)
    body = repr(host)
    return body[:-1] + ", " + ", ".join(suffix) + ")"


set_handler("repr", tensor_repr)
set_handler("scalar_value", scalar_value)
