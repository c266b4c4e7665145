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
    return in_dtype_of(t, host)


def in_dtype_of(t, host: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t``'s value in ``t``'s dtype: complex32 crosses as complex64, and
    0-size or exotic arrays may come back in another dtype too."""
    return host if host.dtype == t.dtype else host.to(t.dtype)


def peek_host(t) -> torch.Tensor:
    """``t``'s value as a CPU tensor, computed op by op: nothing pending changes."""
    with torch._C._DisableTorchDispatch():
        node = value_node(t)
    # the look may lower a decomposition, whose torch ops need __torch_dispatch__
    return in_dtype_of(t, array_to_host(peek_node(node)))


set_handler("to_host", to_host)
