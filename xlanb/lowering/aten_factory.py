"""Tensor creation, fills, copies and dtype casts.

Device, layout, pin_memory and memory_format kwargs mean nothing to a JAX array
and are ignored. ``empty*`` ops return zeros: cheap, and deterministic.
"""
from __future__ import annotations

import math

import jax.numpy as jnp

from xlanb.lowering._util import aten, default_float, jdtype
from xlanb.lowering.registry import register


def _fill_dtype(value):
    """torch's dtype for a fill value when none is given."""
    if isinstance(value, bool):
        return jnp.bool_
    if isinstance(value, int):
        return jnp.int64
    if hasattr(value, "dtype") and not getattr(value, "weak_type", False):
        return value.dtype
    return default_float()


# ---- *_like / new_* -----------------------------------------------------------

def _like(fill):
    def lowering(x, *, dtype=None, **_):
        return jnp.full(x.shape, fill, jdtype(dtype, x.dtype))
    return lowering


register(aten.zeros_like.default, aten.empty_like.default)(_like(0))
register(aten.ones_like.default)(_like(1))


@register(aten.full_like.default)
def full_like(x, fill_value, *, dtype=None, **_):
    return jnp.full(x.shape, fill_value, jdtype(dtype, x.dtype))


def _new(fill):
    def lowering(x, size, *stride, dtype=None, **_):
        return jnp.full(tuple(size), fill, jdtype(dtype, x.dtype))
    return lowering


register(aten.new_zeros.default, aten.new_empty.default, aten.new_empty_strided.default)(_new(0))
register(aten.new_ones.default)(_new(1))


@register(aten.new_full.default)
def new_full(x, size, fill_value, *, dtype=None, **_):
    return jnp.full(tuple(size), fill_value, jdtype(dtype, x.dtype))


@register(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    return jnp.full(x.shape, value, x.dtype)


@register(aten.zero.default)
def zero(x):
    return jnp.zeros_like(x)


# ---- factories ------------------------------------------------------------------

def _factory(fill):
    def lowering(size, *stride, dtype=None, **_):
        return jnp.full(tuple(size), fill, jdtype(dtype, default_float()))
    return lowering


# _efficientzerotensor (autograd's "known zero" gradient) is an ordinary zero tensor here.
register(aten.zeros.default, aten.empty.memory_format, aten.empty_strided.default,
         aten._efficientzerotensor.default)(_factory(0))
register(aten.ones.default)(_factory(1))


@register(aten.full.default)
def full(size, fill_value, *, dtype=None, **_):
    return jnp.full(tuple(size), fill_value, jdtype(dtype, _fill_dtype(fill_value)))


@register(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, **_):
    return jnp.asarray(s, jdtype(dtype, default_float()))


@register(aten.arange.start_step, aten.arange.start, static_floats=True)
def arange(start, end, step=1, *, dtype=None, **_):
    ints = all(isinstance(v, int) for v in (start, end, step))
    dt = jdtype(dtype, jnp.int64 if ints else default_float())
    n = max(0, math.ceil((end - start) / step))  # torch sizes arange in double
    if ints and jnp.issubdtype(dt, jnp.integer):
        return jnp.arange(start, start + n * step, step, dtype=dt)
    # torch computes start + i * step in double, then casts.
    return (start + jnp.arange(n, dtype=jnp.float64) * step).astype(dt)


@register(aten.arange.default, static_floats=True)
def arange_end(end, *, dtype=None, **_):
    return arange(0, end, 1, dtype=dtype)


def _linspace64(start, end, steps):
    # torch's two-sided formula: exact at both ends; computed in double, then cast.
    i = jnp.arange(steps, dtype=jnp.float64)
    if steps == 1:
        return jnp.full((1,), start, jnp.float64)
    step = (end - start) / max(steps - 1, 1)
    return jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))


@register(aten.linspace.default, static_floats=True)
def linspace(start, end, steps, *, dtype=None, **_):
    return _linspace64(start, end, steps).astype(jdtype(dtype, default_float()))


@register(aten.logspace.default, static_floats=True)
def logspace(start, end, steps, base=10.0, *, dtype=None, **_):
    return (base ** _linspace64(start, end, steps)).astype(jdtype(dtype, default_float()))


@register(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, **_):
    return jnp.eye(n, m, dtype=jdtype(dtype, default_float()))


# ---- copies and casts ------------------------------------------------------------

@register(aten.clone.default)
def clone(x, *, memory_format=None):
    return x


@register(aten._to_copy.default)
def _to_copy(x, *, dtype=None, **_):
    return x if dtype is None else x.astype(jdtype(dtype))


@register(aten.copy.default)
def copy(x, src, non_blocking=False):
    # copy_(dst, src) into a fresh tensor of dst's shape and dtype.
    return jnp.broadcast_to(src.astype(x.dtype), x.shape)
