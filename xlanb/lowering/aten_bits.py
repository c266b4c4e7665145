"""Ops on how numbers are represented: ``frexp`` (mantissa and exponent), ``nextafter``,
``hash_tensor`` (bit patterns xor-reduced); and membership, ``isin``."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from xlanb.lowering._util import aten, is_float, wrap
from xlanb.lowering.registry import register


@register(aten.frexp.Tensor)
def frexp(x):
    m, e = jnp.frexp(x)
    return m, e.astype(jnp.int32)


@register(aten.nextafter.default)
def nextafter(a, b):
    return jnp.nextafter(a, b)


@register(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    elements, test = jnp.asarray(elements), jnp.asarray(test_elements).reshape(-1)
    dt = jnp.result_type(elements, test)
    hit = jnp.any(elements.astype(dt)[..., None] == test.astype(dt), axis=-1)
    return ~hit if invert else hit


@register(aten.hash_tensor.default, may_refuse=True)
def hash_tensor(x, dim=(), *, keepdim=False, mode=0):
    """torch's xor_sum: each element widened to 64 bits (double for floats), its bit
    pattern xor-reduced; the result is uint64 (which the device needs in its dtype table)."""
    if mode != 0:
        raise NotImplementedError(f"hash_tensor mode {mode}")
    if is_float(x):
        bits = lax.bitcast_convert_type(x.astype(jnp.float64), jnp.uint64)
    elif x.dtype == jnp.bool_:
        bits = x.astype(jnp.uint64)
    else:
        bits = lax.bitcast_convert_type(x.astype(jnp.int64), jnp.uint64)
    if isinstance(dim, int):
        dim = (dim,)
    if x.ndim == 0:
        axes = ()  # dim 0 / -1 of a scalar name the scalar itself
    else:
        axes = tuple(range(x.ndim)) if not dim else tuple(sorted({wrap(d, x.ndim) for d in dim}))
    out = lax.reduce(bits, np.uint64(0), lax.bitwise_xor, axes)
    return jnp.expand_dims(out, axes) if keepdim else out
