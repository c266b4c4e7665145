"""Reductions, scans, sorting and arg-reductions."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from xlanb.lowering._util import aten, dims, is_float, jdtype, to_float, upcast, wrap
from xlanb.lowering.registry import register


def _acc(x, dtype):
    """Input prepared for an additive reduction: an explicit dtype wins; ints and
    bools accumulate in int64 and half floats in float32, like torch; complex stays
    complex (a sum of complex64 on xla came back 0: it had been cast to int64)."""
    if dtype is not None:
        return x.astype(jdtype(dtype))
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x.astype(jnp.int64)
    return upcast(x)


@register(aten.sum.default, aten.sum.dim_IntList)
def sum_(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.sum(_acc(x, dtype), axis=dims(dim, x.ndim), keepdims=keepdim)


@register(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.nansum(_acc(x, dtype), axis=dims(dim, x.ndim), keepdims=keepdim)


@register(aten.mean.default, aten.mean.dim)
def mean(x, dim=None, keepdim=False, *, dtype=None):
    x = upcast(to_float(x)) if dtype is None else x.astype(jdtype(dtype))
    return jnp.mean(x, axis=dims(dim, x.ndim), keepdims=keepdim)


@register(aten.prod.default, aten.prod.dim_int)
def prod(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.prod(_acc(x, dtype), axis=dims(dim, x.ndim), keepdims=keepdim)


@register(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=dims(dim, x.ndim), keepdims=keepdim)


@register(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=dims(dim, x.ndim), keepdims=keepdim)


register(aten.max.default)(lambda x: jnp.max(x))
register(aten.min.default)(lambda x: jnp.min(x))


def _value_and_index(x, dim, keepdim, arg):
    dim = wrap(dim, x.ndim)
    idx = arg(x, axis=dim, keepdims=True) if x.ndim else jnp.zeros((), jnp.int64)
    val = jnp.take_along_axis(x, idx, axis=dim) if x.ndim else x
    if x.ndim and not keepdim:
        val, idx = jnp.squeeze(val, dim), jnp.squeeze(idx, dim)
    return val, idx


register(aten.max.dim)(lambda x, dim, keepdim=False: _value_and_index(x, dim, keepdim, jnp.argmax))
register(aten.min.dim)(lambda x, dim, keepdim=False: _value_and_index(x, dim, keepdim, jnp.argmin))


def _arg(fn):
    def lowering(x, dim=None, keepdim=False):
        if dim is None:  # index into the flattened tensor
            out = fn(x.reshape(-1))
            return out.reshape((1,) * x.ndim) if keepdim else out
        if x.ndim == 0:
            return jnp.zeros((), jnp.int64)
        return fn(x, axis=wrap(dim, x.ndim), keepdims=keepdim)
    return lowering


register(aten.argmax.default)(_arg(jnp.argmax))
register(aten.argmin.default)(_arg(jnp.argmin))


@register(aten.any.default, aten.any.dim, aten.any.dims)
def any_(x, dim=None, keepdim=False):
    return jnp.any(x != 0, axis=dims(dim, x.ndim), keepdims=keepdim)


@register(aten.all.default, aten.all.dim, aten.all.dims)
def all_(x, dim=None, keepdim=False):
    return jnp.all(x != 0, axis=dims(dim, x.ndim), keepdims=keepdim)


@register(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim=None):
    return jnp.sum(x != 0, axis=dims(dim, x.ndim), dtype=jnp.int64)


# ---- moments ----------------------------------------------------------------

def _var_mean(x, dim, correction, keepdim):
    x = upcast(to_float(x))
    axes = dims(dim, x.ndim)
    n = math.prod(x.shape[a] for a in axes)
    m = jnp.mean(x, axis=axes, keepdims=True)
    c = 1 if correction is None else correction
    # correction may be a traced scalar, so no Python max() here.
    var = jnp.sum(jnp.square(jnp.abs(x - m)), axis=axes, keepdims=keepdim) / jnp.maximum(n - c, 0)
    return var, (m if keepdim else jnp.squeeze(m, axes))


def _unbiased_to_correction(unbiased):
    return 1 if unbiased in (None, True) else 0


@register(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)[0]


@register(aten.var.dim)
def var_dim(x, dim, unbiased=True, keepdim=False):
    return _var_mean(x, dim, _unbiased_to_correction(unbiased), keepdim)[0]


@register(aten.var.default)
def var_default(x, unbiased=True):
    return _var_mean(x, None, _unbiased_to_correction(unbiased), False)[0]


@register(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var_mean(x, dim, correction, keepdim)[0])


@register(aten.std.dim)
def std_dim(x, dim, unbiased=True, keepdim=False):
    return jnp.sqrt(_var_mean(x, dim, _unbiased_to_correction(unbiased), keepdim)[0])


@register(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)


@register(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    v, m = _var_mean(x, dim, correction, keepdim)
    return jnp.sqrt(v), m


@register(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    x = upcast(to_float(x))
    return jax.nn.logsumexp(x, axis=dims(dim, x.ndim), keepdims=keepdim)


@register(aten.linalg_vector_norm.default, static_floats=True)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = upcast(x) if dtype is None else x.astype(jdtype(dtype))
    a = jnp.abs(x)
    axes = dims(dim, x.ndim)
    if ord == math.inf:
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == -math.inf:
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(a != 0, axis=axes, keepdims=keepdim).astype(a.dtype)
    if ord == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


@register(aten._foreach_norm.Scalar, static_floats=True)
def foreach_norm(xs, ord=2, dtype=None):
    return [linalg_vector_norm(x, ord, dtype=dtype) for x in xs]


# ---- scans ------------------------------------------------------------------

@register(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    return jnp.cumsum(_acc(x, dtype), axis=wrap(dim, x.ndim)) if x.ndim else _acc(x, dtype)


@register(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    return jnp.cumprod(_acc(x, dtype), axis=wrap(dim, x.ndim)) if x.ndim else _acc(x, dtype)


@register(aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    x = upcast(to_float(x))
    return lax.cumlogsumexp(x, axis=wrap(dim, x.ndim)) if x.ndim else x


def _cum_extreme(x, dim, better_or_equal):
    """Running max/min with its index, like torch: ties and NaNs take the later
    index, and a NaN sticks once seen."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = wrap(dim, x.ndim)
    idx = lax.broadcasted_iota(jnp.int64, x.shape, dim)

    def combine(a, b):
        (va, ia), (vb, ib) = a, b
        take_b = better_or_equal(vb, va)
        if is_float(x):
            take_b = take_b | jnp.isnan(vb)
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    return lax.associative_scan(combine, (x, idx), axis=dim)


register(aten.cummax.default)(lambda x, dim: _cum_extreme(x, dim, jnp.greater_equal))
register(aten.cummin.default)(lambda x, dim: _cum_extreme(x, dim, jnp.less_equal))


# ---- sorting ------------------------------------------------------------------

@register(aten.sort.default, aten.sort.stable)
def sort(x, dim=-1, descending=False, *, stable=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = wrap(dim, x.ndim)
    # A stable argsort always: torch's unstable order is unspecified anyway.
    idx = jnp.argsort(x, axis=dim, stable=True, descending=descending)
    return jnp.take_along_axis(x, idx, axis=dim), idx


@register(aten.argsort.default, aten.argsort.stable)
def argsort(x, dim=-1, descending=False, *, stable=False):
    return sort(x, dim, descending)[1]


@register(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = wrap(dim, x.ndim)
    xt = jnp.moveaxis(x, dim, -1)
    if largest:
        val, idx = lax.top_k(xt, k)
    else:
        idx = jnp.argsort(xt, axis=-1, stable=True)[..., :k]
        val = jnp.take_along_axis(xt, idx, axis=-1)
    return jnp.moveaxis(val, -1, dim), jnp.moveaxis(idx, -1, dim)


@register(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    dim = wrap(dim, x.ndim)
    val, idx = sort(x, dim)
    val = lax.slice_in_dim(val, k - 1, k, axis=dim)
    idx = lax.slice_in_dim(idx, k - 1, k, axis=dim)
    return (val, idx) if keepdim else (jnp.squeeze(val, dim), jnp.squeeze(idx, dim))


@register(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(seq, x, *, out_int32=False, right=False, side=None, sorter=None):
    side = side or ("right" if right else "left")
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    x = jnp.asarray(x)
    if seq.ndim <= 1:
        out = jnp.searchsorted(seq, x, side=side)
    else:  # one search per row of the leading dims
        rows = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))
        out = rows(seq.reshape(-1, seq.shape[-1]), x.reshape(-1, x.shape[-1])).reshape(x.shape)
    return out.astype(jnp.int32 if out_int32 else jnp.int64)


@register(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(x, boundaries, *, out_int32=False, right=False):
    # right=False puts x == boundary in the lower bucket: a left search.
    side = "right" if right else "left"
    out = jnp.searchsorted(boundaries, jnp.asarray(x), side=side)
    return out.astype(jnp.int32 if out_int32 else jnp.int64)
