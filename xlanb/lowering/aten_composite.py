"""CompositeImplicitAutograd ops that reach the device below autograd.

Called from user code, these ops are decomposed by torch before they reach xlanb. Called
from inside one of torch's decompositions (which xlanb traces below autograd), they
arrive as themselves: ``aten.to`` inside ``smooth_l1_loss``'s decomposition,
``aten.flatten`` inside ``isin``'s. Each is a line of JAX.
"""
from __future__ import annotations

import jax.numpy as jnp

from xlanb.base.dtypes import to_jax_dtype
from xlanb.lowering._util import aten, wrap
from xlanb.lowering.registry import register


def _cast(x, dtype):
    return x if dtype is None else x.astype(to_jax_dtype(dtype))


@register(aten.to.dtype)
def to_dtype(x, dtype, non_blocking=False, copy=False, memory_format=None):
    return _cast(x, dtype)


@register(aten.to.device)
def to_device(x, device, dtype, non_blocking=False, copy=False, memory_format=None):
    return _cast(x, dtype)


@register(aten.to.other)
def to_other(x, other, non_blocking=False, copy=False, memory_format=None):
    return x.astype(other.dtype)


@register(aten.to.dtype_layout)
def to_dtype_layout(x, *, dtype=None, layout=None, device=None, pin_memory=None,
                    non_blocking=False, copy=False, memory_format=None):
    return _cast(x, dtype)


@register(aten.contiguous.default)
def contiguous(x, *, memory_format=None):
    return x


@register(aten.flatten.using_ints)
def flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        return x.reshape(1)
    s, e = wrap(start_dim, x.ndim), wrap(end_dim, x.ndim)
    return x.reshape(x.shape[:s] + (-1,) + x.shape[e + 1:])


@register(aten.movedim.int, aten.movedim.intlist)
def movedim(x, source, destination):
    return jnp.moveaxis(x, source, destination)


register(aten.atleast_1d.default)(jnp.atleast_1d)
register(aten.atleast_2d.default)(jnp.atleast_2d)
register(aten.atleast_3d.default)(jnp.atleast_3d)
register(aten.real.default)(lambda x: jnp.real(x) if jnp.iscomplexobj(x) else x)
register(aten.imag.default)(jnp.imag)
