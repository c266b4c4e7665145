"""``xlanb.optimization_barrier_(tensors)``: torch_xla's ``xm.optimization_barrier_``.

In a lazy graph, the tensors' values go through one ``jax.lax.optimization_barrier``
together: XLA can neither move work across it nor merge what follows it with work done
before it. Gradient checkpointing needs this (``torch_xla.utils.checkpoint``): without
it the backward's recomputation of a layer is the same expression as the forward's, XLA
merges the two (common subexpression elimination), and the forward's activations stay
live until the backward, so checkpointing saves nothing. The values are unchanged;
outside a lazy recording (eager, op-by-op) nothing is reordered and nothing happens.
"""
from __future__ import annotations

import jax

from ..base.session import mode_state
from ..ir.nodes import OpSignature
from ..ops.infos import infos
from ..modes.record import output_node, apply_op, write
from ..ir.templates import _In
from ..ir.tensor import XlaTensor

__all__ = ["optimization_barrier_"]

BARRIER_OP = "xlanb::optimization_barrier"


def _barrier_info(metas: tuple, device: int) -> OpSignature:
    """The barrier over values of ``metas``: one op, one output per input."""
    sig = (BARRIER_OP, metas, device)
    info = infos.get(sig)
    if info is None:
        info = OpSignature(BARRIER_OP, (BARRIER_OP, tuple((m.shape, m.dtype) for m in metas)),
                      lambda args, scalars: tuple(jax.lax.optimization_barrier(tuple(args))),
                      metas, n_in=len(metas), device=device, in_metas=metas,
                      template=(tuple(_In(i) for i in range(len(metas))), {}))
        infos[sig] = info
    return info


def optimization_barrier_(tensors) -> None:
    """Put ``tensors`` (xla tensors; anything else is skipped) behind one optimization
    barrier, in place: later work that reads them cannot be merged with, or moved
    before, the work that made them. A lazy recording only; views are skipped (their
    base holds the value)."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    state = mode_state()
    if not state.recording or state.mode != "lazy":
        return
    by_device: dict = {}
    seen = set()
    for t in tensors:
        if isinstance(t, XlaTensor) and not t._view and id(t._storage) not in seen:
            seen.add(id(t._storage))  # a storage twice would be two outputs written once
            by_device.setdefault(t._storage.device, []).append(t)
    for device, ts in by_device.items():
        info = _barrier_info(tuple(t._storage.meta for t in ts), device)
        node = apply_op(info, tuple(t._storage.node for t in ts), ())
        for i, t in enumerate(ts):
            write(t, output_node(node, info, i))
