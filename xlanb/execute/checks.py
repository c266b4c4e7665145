"""Errors CPU torch raises where XLA returns a value: integer division by zero.

XLA's integer division by zero gives a value (-1, or the dividend), where CPU torch
raises ``RuntimeError: ZeroDivisionError``. When an op runs on its own (eager mode,
op-by-op syncs, peeks), its divisor is checked first, so those modes raise as CPU torch
does. A lazy graph fuses the division with everything around it and cannot stop in the
middle: there the result is XLA's (docs/DESIGN.md, "Semantics").
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from ..ir import OpInfo
from ..templates import _In

_INTEGER_DIVISION = frozenset(("aten::div", "aten::floor_divide", "aten::remainder",
                               "aten::fmod"))
_any_zero = jax.jit(lambda d: jnp.any(d == 0))


def integer_division(info: OpInfo) -> bool:
    """Whether ``info`` divides integers (true division of ints gives floats: no error)."""
    if info.name not in _INTEGER_DIVISION or info.multi or info.template is None:
        return False
    dtype = info.out.dtype
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def checked(exe, info: OpInfo):
    """``info``'s single-op executable as it runs: with the divisor check where the op
    divides integers (``DivisorChecked``), else as it is."""
    return DivisorChecked(exe, info) if integer_division(info) else exe


class DivisorChecked:
    """A single-op executable that raises as CPU torch does when its divisor has a zero."""

    _call = None  # no C++ shortcut past the check (single_op.direct_call)

    def __init__(self, exe, info: OpInfo):
        self.exe = exe
        divisor = info.template[0][1] if len(info.template[0]) > 1 else None
        self._input = divisor.i if isinstance(divisor, _In) else None
        self._static_zero = self._input is None and divisor == 0

    def __call__(self, *args):
        if self._static_zero or (self._input is not None and bool(_any_zero(args[self._input]))):
            raise RuntimeError("ZeroDivisionError")
        return self.exe(*args)

    def __getattr__(self, name):  # as_text(), cost_analysis(), ...: the executable's
        return getattr(self.exe, name)
