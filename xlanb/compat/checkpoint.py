"""``torch_xla.utils.checkpoint``: gradient checkpointing with torch_xla's rules, on
torch's own reentrant ``torch.utils.checkpoint`` (torch_xla's is a copy of it).

``checkpoint(fn, *args)`` recomputes ``fn``'s activations in the backward pass;
``preserve_rng_state`` (default True) replays the same dropout masks. As in torch_xla,
``use_reentrant=False`` and any other keyword are a ``ValueError``.

As torch_xla's, the backward puts the saved inputs and the incoming gradients behind
one optimization barrier before recomputing (``xlanb.optimization_barrier_``): without
it XLA merges the recomputation with the forward's identical ops and keeps the forward's
activations alive until the backward, which is what checkpointing was to avoid.
"""
from __future__ import annotations

import torch
import torch.utils.checkpoint as _torch_checkpoint

import xlanb

from .missing import module_getattr

NAME = "torch_xla.utils.checkpoint"

__all__ = ["checkpoint", "CheckpointFunction"]

__getattr__ = module_getattr(NAME, {})


class CheckpointFunction(_torch_checkpoint.CheckpointFunction):
    """torch's reentrant checkpoint, with torch_xla's barrier before the recomputation."""

    @staticmethod
    def backward(ctx, *grads):
        # the recomputation reads the saved inputs; tied to the incoming gradients it
        # can neither run before the backward reaches it nor merge with the forward
        xlanb.optimization_barrier_([t for t in (*ctx.saved_tensors, *grads)
                                     if isinstance(t, torch.Tensor)])
        return _torch_checkpoint.CheckpointFunction.backward(ctx, *grads)


def checkpoint(function, *args, use_reentrant: bool = True, **kwargs):
    """``function(*args)``, its activations recomputed in the backward pass instead of
    kept (torch's reentrant checkpoint)."""
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if not use_reentrant:
        raise ValueError("XLA currently does not support use_reentrant==False "
                         "(torch_xla's rule, kept by xlanb.compat; torch.utils.checkpoint's "
                         "non-reentrant form runs on the xla device)")
    # what torch's checkpoint(use_reentrant=True) runs, on this CheckpointFunction
    return CheckpointFunction.apply(function, preserve, *args)
