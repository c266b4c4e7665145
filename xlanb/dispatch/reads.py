"""Reading a tensor's value on the host, with the cause that made it necessary.

From a debugger's prompt a read peeks (the pending graph stays as it was); elsewhere it
computes the pending work the value depends on (a sync, in lazy mode)."""
from __future__ import annotations

import torch

from ..base.frames import debugger_active
from ..pending.realize import node_array, peek_node
from ..modes.record import value_node
from ..runtime.transfer import array_to_host
from ..ir.tensor import set_handler


def to_host(t, *, cause: str) -> torch.Tensor:
    """``t``'s value as a CPU tensor; computes pending work if it must (``cause`` says why)."""
    node = value_node(t)
    if node.data is None and debugger_active():
        host = array_to_host(peek_node(node))  # looking from a breakpoint never cuts the graph
    else:
        host = array_to_host(node_array(node, cause=cause))
    if host.dtype != t.dtype:  # e.g. 0-size or exotic arrays
        host = host.to(t.dtype)
    return host


def peek_host(t) -> torch.Tensor:
    """``t``'s value as a CPU tensor, computed op by op: nothing pending changes."""
    with torch._C._DisableTorchDispatch():
        node = value_node(t)
    # the look may lower a decomposition, whose torch ops need __torch_dispatch__
    host = array_to_host(peek_node(node))
    return host if host.dtype == t.dtype else host.to(t.dtype)  # complex32 crosses as complex64


set_handler("to_host", to_host)
