"""``torch_xla.backends``: the precision of float32 matrix products and convolutions.

``set_mat_mul_precision`` sets ``xlanb.config.mat_mul_precision``, which the dot and
convolution lowerings read (XLA's ``precision_config`` in the HLO: ``operand_precision``
in HLO text, ``precision = [...]`` in StableHLO). Work already pending is synced first and
the compiled graphs and single-op executables are forgotten, so everything compiled from
then on has the new precision (the executable store keys on it too). Without a call,
torch's own ``torch.set_float32_matmul_precision`` decides, and ``get_mat_mul_precision``
says what it gives (torch's ``"medium"`` is XLA's ``"default"``)."""
from __future__ import annotations

import time

import torch

import xlanb
from xlanb.base.caches import clear_compiled
from xlanb.base.config import MAT_MUL_PRECISIONS as PRECISIONS
from xlanb.executables.background import compiles_in_flight

from .missing import module_getattr

NAME = "torch_xla.backends"

# torch.get_float32_matmul_precision() -> XLA's name for what xlanb's dots then use
_FROM_TORCH = {"highest": "highest", "high": "high", "medium": "default"}

__all__ = ["set_mat_mul_precision", "get_mat_mul_precision"]

__getattr__ = module_getattr(NAME)


def set_mat_mul_precision(precision: str) -> None:
    """``"default"`` (one bf16 pass on a TPU), ``"high"`` (three) or ``"highest"`` (six,
    about float32): the precision of float32 dots and convolutions compiled from now on."""
    if precision not in PRECISIONS:
        raise ValueError(f"Invalid precision: {precision!r}. Must be one of "
                         f"{', '.join(PRECISIONS)}.")
    if precision == xlanb.config.mat_mul_precision:
        return
    # Recorded ops lower when their graph compiles: sync them under the precision they
    # were recorded with, then forget what was compiled (its keys do not hold the precision)
    xlanb.sync(cause=f"torch_xla.backends.set_mat_mul_precision({precision!r})")
    xlanb.config.mat_mul_precision = precision
    _forget_compiled()


def get_mat_mul_precision() -> str:
    """The precision float32 dots and convolutions compile with now."""
    p = xlanb.config.mat_mul_precision
    return p if p is not None else _FROM_TORCH.get(torch.get_float32_matmul_precision(), "highest")


def _forget_compiled() -> None:
    """Drop the graph cache and every op signature (with its single-op executable): the
    next ops and graphs lower again. ``xlanb.graphs()`` keeps its history."""
    while compiles_in_flight():  # their results land in infos about to be dropped
        time.sleep(0.001)
    clear_compiled()
