"""``torch_xla.distributed.fsdp``: what programs using FSDPv2 import from it
(``checkpoint_module``, the ``wrap`` policies), and FSDP v1's name, which refuses to be
built.

Why FSDP v1 (``XlaFullyShardedDataParallel``) is left out: it runs one process per
device, each holding its shard and calling ``xm.all_gather`` / ``xm.reduce_scatter``
itself. xlanb runs one SPMD program (in one process, or several under ``python -m
xlanb.launch``) whose collectives XLA's partitioner inserts, so per-replica collectives
do not exist here (``missing.COLLECTIVES``). FSDPv2 (``SpmdFullyShardedDataParallel``)
is the same algorithm in SPMD, with torch_xla's documentation of it, Hugging Face's
Trainer on TPUs (``fsdp_config: xla_fsdp_v2``) and torchprime behind it. The name stays
importable because Hugging Face imports it next to FSDPv2's helpers in one ``try``.
"""
from __future__ import annotations

import types

import torch

from .checkpoint import checkpoint
from .missing import FSDP_V1, module_getattr, not_provided

NAME = "torch_xla.distributed.fsdp"

__all__ = ["XlaFullyShardedDataParallel", "checkpoint_module"]

V1 = FSDP_V1


class XlaFullyShardedDataParallel(torch.nn.Module):
    """FSDP v1: not provided (see the module docstring); building one raises the
    ``CompatNotImplementedError`` that says how to move to FSDPv2."""

    def __init__(self, module=None, *args, **kwargs):
        raise not_provided(NAME, "XlaFullyShardedDataParallel",
                           {"XlaFullyShardedDataParallel": V1})


__getattr__ = module_getattr(NAME, {
    "consolidate_sharded_model_checkpoints": "FSDPv2's state_dict() is the whole model "
                                             "already: nothing to consolidate",
    "consolidate_sharded_state_dicts": "FSDPv2's state_dict() is the whole model already",
})


def checkpoint_module(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with its ``forward`` under gradient checkpointing (``torch_xla.utils.
    checkpoint.checkpoint``), when an input needs a gradient (reentrant checkpointing has
    nothing to differentiate otherwise). Returns ``module``, changed in place."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{NAME}.checkpoint_module takes an nn.Module, not "
                        f"{type(module).__name__}")
    original = module.forward

    def forward(self, *args, **kwargs):
        values = (*args, *kwargs.values())
        if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in values):
            return original(*args, **kwargs)
        names, n = tuple(kwargs), len(args)
        # checkpoint takes positional arguments only: keywords ride along by position
        return checkpoint(lambda *a: original(*a[:n], **dict(zip(names, a[n:]))), *values)

    module._xla_checkpointed_forward_original = original
    module.forward = types.MethodType(forward, module)  # a method: FSDPv2 checks it
    return module
