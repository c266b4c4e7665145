"""``torch_xla.experimental.scan``: ``scan(fn, init, xs)`` on ``xlanb.scan``.

The program asked for a loop, so it is one on every platform: the iterations are
recorded as ops (autograd differentiates them as written) and a lazy graph lowers them
as one ``lax.scan`` (xlanb/loops/scan.py). ``partition_fn`` and ``is_fn_pure`` choose how
torch_xla's AOTAutograd traces ``fn``; xlanb does not trace ``fn`` apart, so they change
nothing (XLA's own rematerialization decides what is recomputed).
"""
from __future__ import annotations

import xlanb

from .missing import module_getattr

NAME = "torch_xla.experimental.scan"

__all__ = ["scan"]

__getattr__ = module_getattr(NAME, {
    "value_and_grad_partitioned": "xlanb records the loop's ops and autograd differentiates "
                                  "them; nothing is partitioned apart",
})


def scan(fn, init, xs, partition_fn=None, is_fn_pure: bool = False):
    """``(carry, ys)``: ``fn(carry, x) -> (carry, y)`` over the leading dimension of
    ``xs``, the ``y``s stacked (torch_xla's contract, ``jax.lax.scan``'s)."""
    return xlanb.scan(fn, init, xs)
