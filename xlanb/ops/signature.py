"""Op signatures: the cache key of one op call.

A signature is the op, each tensor as an interned ``SigKey`` (shape, strides, dtype,
device), static arguments as they are (bools, floats and complex numbers with their
type), and a marker for each lifted float.
"""
from __future__ import annotations

import torch

from ..ir.nodes import TensorMeta
from ..ir.templates import FLOAT
from ..ir.tensor import XlaTensor
from .leaves import from_host


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
        return FLOAT
    if tx is list or tx is tuple:
        return tuple([sig_of(e, tensors, scalars, lift) for e in x])
    if tx is bool or tx is float or tx is complex:
        # True == 1 == 1.0 == 1+0j, but each gives another result dtype (mul of a bool
        # tensor by True is bool, by 1 int64, by 1.0 float32): keep the type
        return (tx, x)
    return x


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


def from_host_arg(x: torch.Tensor) -> XlaTensor:
    """A CPU tensor passed to an xla op (e.g. a 0-dim scalar tensor): move it over."""
    if x.device.type != "cpu":
        raise RuntimeError(f"xlanb: cannot use a tensor on {x.device} in an xla op")
    return from_host(x, 0)
