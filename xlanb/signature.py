"""Op signatures and argument templates.

A signature is the cache key of one op call: the op, each tensor as an interned
``SigKey`` (shape, strides, dtype, device), static arguments as they are (bools, floats
and complex numbers with their type), and a marker for each lifted float. A template is the same argument structure with ``_In(i)``/``_Sc(j)`` slots
where the tensors and lifted floats go, so one ``OpInfo`` can rebuild the call for any
inputs: JAX arrays when lowering, meta tensors for shapes, names when printing.
"""
from __future__ import annotations

import numpy as np
import torch

from .ir import OpInfo, TensorMeta, contiguous_strides  # noqa: F401 (re-exported)
from .tensor import XlaTensor

class _In:
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


class _Sc:
    __slots__ = ("j",)

    def __init__(self, j):
        self.j = j


_FLOAT = "<float>"  # stands for a lifted float in a signature


def sig_of(x, tensors, scalars, lift):
    """Signature element of one argument; collects tensors and lifted floats on the way."""
    tx = type(x)
    if tx is XlaTensor:
        tensors.append(x)
        return x._key
    if isinstance(x, torch.Tensor):
        if not isinstance(x, XlaTensor):
            x = from_host_arg(x)
        tensors.append(x)
        return x._key
    if tx is float and lift:
        scalars.append(x)
        return _FLOAT
    if tx is list or tx is tuple:
        return tuple([sig_of(e, tensors, scalars, lift) for e in x])
    if tx is bool or tx is float or tx is complex:
        # True == 1 == 1.0 == 1+0j, but each gives another result dtype (mul of a bool
        # tensor by True is bool, by 1 int64, by 1.0 float32): keep the type
        return (tx, x)
    return x


def readable_sig(x, lift):
    """The signature with tensors spelled out: stable across processes (for hashes)."""
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), tuple(x.stride()), x.dtype, x.storage_offset())
    if type(x) is float and lift:
        return _FLOAT
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


def meta_tensor(t: XlaTensor) -> torch.Tensor:
    m = t._meta
    if not m.offset:
        return torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta")
    # A view's offset matters to the meta kernels of views of it (storage_offset, as_strided).
    extent = 0 if 0 in m.shape else 1 + sum((n - 1) * st for n, st in zip(m.shape, m.stride))
    base = torch.empty(m.offset + extent, dtype=m.dtype, device="meta")
    return base.as_strided(m.shape, m.stride, m.offset)


def _meta_of(x) -> TensorMeta:
    return TensorMeta(tuple(x.shape), tuple(x.stride()), x.dtype, x.storage_offset())


def metas_of(out):
    if isinstance(out, torch.Tensor):
        return _meta_of(out)
    if isinstance(out, (tuple, list)):
        return tuple(metas_of(o) for o in out)
    return out


def format_call(info: OpInfo, input_names: list, scalars) -> str:
    """``info``'s arguments as text, tensors named by ``input_names``."""
    extra = info.extra
    template = extra.template if extra is not None else None
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
    if isinstance(a, float):
        return f"{a:g}"
    if isinstance(a, np.ndarray):
        return "<rng key>"
    return repr(a) if not isinstance(a, torch.dtype) else str(a).replace("torch.", "")


def from_host_arg(x: torch.Tensor) -> XlaTensor:
    """A CPU tensor passed to an xla op (e.g. a 0-dim scalar tensor): move it over."""
    from .transfer import to_device
    if x.device.type not in ("cpu", "meta") or x.device.type == "meta":
        raise RuntimeError(f"xlanb: cannot use a tensor on {x.device} in an xla op")
    return to_device(x, 0)
