"""``torch_xla.utils.checkpoint``: gradient checkpointing with torch_xla's rules, on
torch's own reentrant ``torch.utils.checkpoint`` (torch_xla's is a copy of it).

``checkpoint(fn, *args)`` recomputes ``fn``'s activations in the backward pass;
``preserve_rng_state`` (default True) replays the same dropout masks. As in torch_xla,
``use_reentrant=False`` and any other keyword are a ``ValueError``.
"""
from __future__ import annotations

import torch.utils.checkpoint as _torch_checkpoint

from .missing import module_getattr

NAME = "torch_xla.utils.checkpoint"

__all__ = ["checkpoint"]

__getattr__ = module_getattr(NAME, {
    "CheckpointFunction": "torch.utils.checkpoint.CheckpointFunction (what checkpoint runs)",
})


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
    return _torch_checkpoint.checkpoint(function, *args, use_reentrant=True,
                                        preserve_rng_state=preserve)
