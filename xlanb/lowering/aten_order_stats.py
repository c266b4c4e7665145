"""Medians (with and without NaNs) and modes, along a dimension or over the whole
tensor."""
from __future__ import annotations

import jax.numpy as jnp

from xlanb.lowering._util import aten, is_float, wrap
from xlanb.lowering.registry import register


def _nan_last_order(x, axis):
    """A stable argsort along ``axis`` with NaNs last (torch's sort order)."""
    return jnp.argsort(x, axis=axis, stable=True)


def _median_along(x, axis, ignore_nan):
    n = x.shape[axis]
    if n == 0:
        raise NotImplementedError("median of an empty dim")
    order = _nan_last_order(x, axis)
    srt = jnp.take_along_axis(x, order, axis)
    if is_float(x):
        nans = jnp.sum(jnp.isnan(x), axis=axis, keepdims=True)
    else:
        nans = jnp.zeros(x.shape[:axis] + (1,) + x.shape[axis + 1:], jnp.int64)
    if ignore_nan:
        k = jnp.maximum((n - nans - 1) // 2, 0)
    else:
        k = jnp.where(nans > 0, n - nans, (n - 1) // 2)  # the first NaN in sorted order
    val = jnp.take_along_axis(srt, k, axis)
    idx = jnp.take_along_axis(order, k, axis)
    if not ignore_nan and is_float(x):
        # torch returns the first NaN's position in the input
        first_nan = jnp.argmax(jnp.isnan(x), axis=axis, keepdims=True)
        idx = jnp.where(nans > 0, first_nan, idx)
    return val, idx


@register(aten.median.default)
def median(x):
    if x.size == 0:
        return jnp.asarray(jnp.nan, x.dtype) if is_float(x) else jnp.zeros((), x.dtype)
    return _median_along(x.reshape(-1), 0, False)[0].reshape(())


@register(aten.nanmedian.default)
def nanmedian(x):
    if x.size == 0:
        return jnp.asarray(jnp.nan, x.dtype) if is_float(x) else jnp.zeros((), x.dtype)
    return _median_along(x.reshape(-1), 0, True)[0].reshape(())


def _median_dim(ignore_nan):
    def fn(x, dim, keepdim=False):
        if x.ndim == 0:
            return x, jnp.zeros((), jnp.int64)
        d = wrap(dim, x.ndim)
        val, idx = _median_along(x, d, ignore_nan)
        if not keepdim:
            val, idx = jnp.squeeze(val, d), jnp.squeeze(idx, d)
        return val, idx
    return fn


register(aten.median.dim, may_refuse=True)(_median_dim(False))
register(aten.nanmedian.dim, may_refuse=True)(_median_dim(True))


@register(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = wrap(dim, x.ndim)
    xm = jnp.moveaxis(x, d, -1)
    # counts[..., i] = how often xm[..., i] occurs; the mode is the smallest value with
    # the largest count; its index is its last occurrence (as CPU torch answers).
    eq = xm[..., :, None] == xm[..., None, :]
    if is_float(xm):
        eq = eq | (jnp.isnan(xm)[..., :, None] & jnp.isnan(xm)[..., None, :])
    counts = jnp.sum(eq, axis=-1)
    best = jnp.max(counts, axis=-1, keepdims=True)
    cand = counts == best
    srt_key = jnp.where(cand, xm, jnp.inf if is_float(xm) else jnp.iinfo(xm.dtype).max) \
        if xm.dtype != jnp.bool_ else jnp.where(cand, xm, True)
    value = jnp.min(srt_key, axis=-1, keepdims=True) if xm.dtype != jnp.bool_ else \
        jnp.all(srt_key, axis=-1, keepdims=True)
    if is_float(xm):  # a NaN mode (only NaNs are candidates)
        all_nan = jnp.all(jnp.isnan(jnp.where(cand, xm, jnp.nan)), axis=-1, keepdims=True)
        value = jnp.where(all_nan, jnp.nan, value)
        is_val = (xm == value) | (jnp.isnan(xm) & jnp.isnan(value))
    else:
        is_val = xm == value
    n = xm.shape[-1]
    idx = (n - 1) - jnp.argmax(jnp.flip(is_val, -1), axis=-1, keepdims=True)
    value, idx = value[..., 0], idx[..., 0].astype(jnp.int64)
    if keepdim:
        value, idx = jnp.expand_dims(value, d), jnp.expand_dims(idx, d)
    return value, idx
