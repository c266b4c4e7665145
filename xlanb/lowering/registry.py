"""The one lowering registry: aten op -> JAX function.

A lowering receives the op's arguments exactly as torch dispatch passes them
(positional args, then kwargs), with every tensor replaced by a JAX array that
already carries torch's dtype (int64 stays int64: tracing runs with x64 on).

Rules every lowering follows:
- Register only the functional form (``aten.add.Tensor``). In-place (``add_``)
  and ``out=`` variants, and the aliasing of view ops, are derived by the tensor
  layer from the functional lowering.
- A Python float argument may arrive as a float *or* as a weakly typed 0-d JAX
  array (xlanb lifts floats such as learning rates into graph inputs so that
  changing them never recompiles). Do not branch on them in Python unless the
  lowering is registered with ``static_floats=True``.
- Return arrays with torch's result shape; the caller casts to torch's result
  dtype (computed from torch's meta kernels), so promotion details are forgiven
  but shapes are not.
- ``random=True`` lowerings get a keyword ``rng``: a JAX PRNG key, fresh per call.
- A lowering that raises NotImplementedError for some static inputs (a bool index
  mask, say) is registered with ``may_refuse=True``: the core then traces it once per
  signature before recording it, so a refusal becomes a CPU fallback instead of a
  failed sync. ``may_refuse="dtypes"``: it refuses by the call's dtypes and static
  arguments alone, so one trace answers for every shape of the same ranks (``add``'s
  floating alpha for integral tensors: an eval_shape of 1.5-4 ms at each new shape).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Lowering", "register", "lookup", "LOWERINGS"]


@dataclass(frozen=True)
class Lowering:
    fn: Callable
    static_floats: bool = False  # floats decide shapes or Python control flow
    random: bool = False  # fn takes rng=<PRNG key>
    # may raise NotImplementedError for some static inputs; "dtypes": decided by the
    # dtypes and static arguments alone, not the shapes
    may_refuse: bool | str = False


# Keyed by OpOverload, or by OpOverloadPacket to cover every overload.
LOWERINGS: dict[object, Lowering] = {}


def register(*ops, static_floats: bool = False, random: bool = False,
             may_refuse: bool | str = False):
    """Decorator: ``@register(aten.add.Tensor, aten.add.Scalar)``. An op only some torch
    versions have is named through ``torch_compat.aten_op("cholesky.default")``; where it
    is None (this torch lacks it; ``torch_compat.missing()`` names it) that op is skipped."""

    def deco(fn):
        low = Lowering(fn, static_floats=static_floats, random=random, may_refuse=may_refuse)
        for op in ops:
            if op is None:
                continue
            LOWERINGS[op] = low
        return fn

    return deco


def lookup(op: torch._ops.OpOverload) -> Lowering | None:
    low = LOWERINGS.get(op)
    if low is None:
        low = LOWERINGS.get(op.overloadpacket)
    return low
