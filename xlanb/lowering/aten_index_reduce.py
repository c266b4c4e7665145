"""Reductions into positions an index names (``index_reduce``, ``take``/``put``,
``segment_reduce`` and its backward), and ``nonzero_static``: data-dependent values in
static shapes, so they lower instead of running on CPU torch."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from xlanb.lowering._util import aten, wrap
from xlanb.lowering.aten_indexing import _reduce_identity
from xlanb.lowering.registry import register


@register(aten.index_reduce.default)
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    if x.ndim == 0:
        x1 = x.reshape(1)
        return index_reduce(x1, 0, index.reshape(-1), source.reshape(-1), reduce,
                            include_self=include_self).reshape(())
    d = wrap(dim, x.ndim)
    xm = jnp.moveaxis(x, d, 0)
    src = jnp.moveaxis(source.reshape(source.shape if source.ndim else (1,)), d, 0).astype(x.dtype)
    index = index.reshape(-1)
    if not include_self:
        xm = xm.at[index].set(jnp.asarray(_reduce_identity(reduce, x.dtype), x.dtype))
    ref = xm.at[index]
    if reduce == "prod":
        out = ref.multiply(src)
    elif reduce == "amax":
        out = ref.max(src)
    elif reduce == "amin":
        out = ref.min(src)
    else:  # mean
        out = ref.add(src)
        count = jnp.zeros(xm.shape[:1], jnp.int64).at[index].add(1)
        count = count + (1 if include_self else 0)
        count = jnp.maximum(count, 1).reshape((-1,) + (1,) * (xm.ndim - 1))
        out = out / count if jnp.issubdtype(x.dtype, jnp.inexact) else out // count
    return jnp.moveaxis(out.astype(x.dtype), 0, d)


def _flat_index(index, n):
    index = index.reshape(-1)
    return jnp.where(index < 0, index + n, index)


@register(aten.take.default)
def take(x, index):
    flat = x.reshape(-1)
    return flat[_flat_index(index, flat.size)].reshape(index.shape)


@register(aten.put.default)
def put(x, index, source, accumulate=False):
    flat = x.reshape(-1)
    ref = flat.at[_flat_index(index, flat.size)]
    src = source.reshape(-1).astype(x.dtype)
    if accumulate and x.dtype == jnp.bool_:
        return ref.max(src).reshape(x.shape)  # bool accumulation is a logical or
    return (ref.add(src) if accumulate else ref.set(src)).reshape(x.shape)


@register(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    if x.ndim == 0:
        x = x.reshape(1)
        idx = jnp.nonzero(x, size=size, fill_value=fill_value)
        return jnp.zeros((size, 0), jnp.int64)
    idx = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(idx, axis=-1).astype(jnp.int64)


def _segment_ids(data, lengths, offsets, axis, refusal):
    """segment_reduce's 1-d lengths (or offsets): the lengths, the wrapped axis and each
    row's segment along it, nseg for rows past the last segment. Batched ones are refused."""
    if lengths is None and offsets is not None:
        lengths = jnp.diff(offsets, axis=-1)
    if lengths is None or lengths.ndim != 1:
        raise NotImplementedError(refusal)
    axis = wrap(axis, data.ndim)
    seg = jnp.searchsorted(jnp.cumsum(lengths), jnp.arange(data.shape[axis]), side="right")
    return lengths, axis, seg


@register(aten.segment_reduce.default, may_refuse=True)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                   unsafe=False, initial=None):
    lengths, axis, seg = _segment_ids(data, lengths, offsets, axis,
                                      "segment_reduce with batched lengths/offsets or indices")
    x = jnp.moveaxis(data, axis, 0)
    nseg = lengths.shape[0]
    if reduce in ("sum", "mean"):
        out = jax.ops.segment_sum(x, seg, nseg + 1)[:nseg]
    elif reduce == "prod":
        out = jax.ops.segment_prod(x, seg, nseg + 1)[:nseg]
    elif reduce == "max":
        out = jax.ops.segment_max(x, seg, nseg + 1)[:nseg]
    else:
        out = jax.ops.segment_min(x, seg, nseg + 1)[:nseg]
    shape = (nseg,) + (1,) * (x.ndim - 1)
    ln = lengths.reshape(shape)
    if initial is not None:
        init = jnp.asarray(initial, x.dtype)
        if reduce == "sum":
            out = out + init
        elif reduce == "prod":
            out = out * init
        elif reduce == "max":
            out = jnp.maximum(out, init)
        elif reduce == "min":
            out = jnp.minimum(out, init)
        elif reduce == "mean":
            out = jnp.where(ln > 0, (out + init) / jnp.maximum(ln, 1), init)
    elif reduce == "mean":
        out = jnp.where(ln > 0, out / jnp.maximum(ln, 1), jnp.nan)
    elif reduce == "max":
        out = jnp.where(ln > 0, out, -jnp.inf)
    elif reduce == "min":
        out = jnp.where(ln > 0, out, jnp.inf)
    return jnp.moveaxis(out.astype(data.dtype), 0, axis)


@register(aten._segment_reduce_backward.default, may_refuse=True)
def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0,
                            initial=None):
    lengths, axis, seg = _segment_ids(data, lengths, offsets, axis,
                                      "segment_reduce backward with batched lengths/offsets")
    x = jnp.moveaxis(data, axis, 0)
    g = jnp.moveaxis(grad, axis, 0)
    out = jnp.moveaxis(output, axis, 0)
    nseg = lengths.shape[0]
    inside = seg < nseg
    segc = jnp.clip(seg, 0, max(nseg - 1, 0))
    gs, os_ = g[segc], out[segc]
    if reduce == "sum":
        gx = gs
    elif reduce == "mean":
        gx = gs / jnp.maximum(lengths, 1)[segc].reshape((-1,) + (1,) * (x.ndim - 1))
    elif reduce in ("max", "min"):
        # torch shares the gradient equally between the elements equal to the result
        hit = (x == os_) & inside.reshape((-1,) + (1,) * (x.ndim - 1))
        count = jax.ops.segment_sum(hit.astype(x.dtype), jnp.where(inside, seg, nseg), nseg + 1)
        gx = jnp.where(hit, gs / jnp.maximum(count[segc], 1), 0)
    else:  # prod: d/dx_i = prod / x_i (no zeros in the segment), torch's general case
        gx = gs * os_ / x
    gx = jnp.where(inside.reshape((-1,) + (1,) * (x.ndim - 1)), gx, 0)
    return jnp.moveaxis(gx.astype(data.dtype), 0, axis)
