"""Argument templates: an op's argument structure with slots where its tensors and lifted
floats go, so one ``OpSignature`` can rebuild the call for any inputs: JAX arrays when lowering,
meta tensors for shapes, names when printing.
"""
from __future__ import annotations

import numpy as np
import torch

from .nodes import OpSignature

class _In:
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


class _Sc:
    __slots__ = ("j",)

    def __init__(self, j):
        self.j = j


FLOAT = "<float>"  # stands for a lifted float in a signature


def readable_sig(x, lift):
    """The signature with tensors spelled out: stable across processes (for hashes)."""
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), tuple(x.stride()), x.dtype, x.storage_offset())
    if type(x) is float and lift:
        return FLOAT
    if type(x) in (list, tuple):
        return tuple(readable_sig(e, lift) for e in x)
    return x


def template_of(x, counters, lift):
    if isinstance(x, torch.Tensor):
        counters[0] += 1
        return _In(counters[0] - 1)
    tx = type(x)
    if tx is float and lift:
        counters[1] += 1
        return _Sc(counters[1] - 1)
    if tx is list or tx is tuple:
        return tx(template_of(e, counters, lift) for e in x)
    return x


def fill(x, ins, scs):
    tx = type(x)
    if tx is _In:
        return ins[x.i]
    if tx is _Sc:
        return scs[x.j]
    if tx is list or tx is tuple:
        return tx(fill(e, ins, scs) for e in x)
    return x


def fill_call(template, ins, scs):
    targs, tkwargs = template
    return [fill(a, ins, scs) for a in targs], {k: fill(v, ins, scs) for k, v in tkwargs.items()}


def format_call(info: OpSignature, input_names: list, scalars) -> str:
    """``info``'s arguments as text, tensors named by ``input_names``."""
    template = info.template
    if template is None:
        return ", ".join(input_names)
    args, kwargs = fill_call(template, [_Name(n) for n in input_names], list(scalars))
    parts = [_fmt_arg(a) for a in args] + [f"{k}={_fmt_arg(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


class _Name(str):
    pass


def _fmt_arg(a) -> str:
    if isinstance(a, _Name):
        return str(a)
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_fmt_arg(e) for e in a) + "]"
    if isinstance(a, (float, np.floating)):  # a lifted float may be a numpy float32
        return f"{float(a):g}"
    if isinstance(a, np.ndarray):
        return "<rng key>"
    return repr(a) if not isinstance(a, torch.dtype) else str(a).replace("torch.", "")
