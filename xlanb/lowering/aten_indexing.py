"""Indexing: advanced indexing, gather/scatter, index_* ops and masked ops.

Boolean index masks select a data-dependent number of elements, which cannot
be traced with static shapes: those lowerings raise NotImplementedError so the
core runs the op another way.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from xlanb.lowering._util import aten, is_float, take, wrap
from xlanb.lowering.registry import register


def _add(ref, v):
    """``ref.add(v)``; for bool, an or (torch accumulates bools that way)."""
    return ref.max(v) if v.dtype == jnp.bool_ else ref.add(v)


def _is_mask(i):
    return i is not None and i.dtype in (jnp.bool_, jnp.uint8)


def _index_tuple(indices):
    # numpy's advanced-indexing rules (where the broadcast dims land) match torch's.
    return tuple(slice(None) if i is None else i for i in indices)


@register(aten.index.Tensor, aten._unsafe_index.Tensor, may_refuse=True)
def index(x, indices):
    if any(_is_mask(i) for i in indices):
        raise NotImplementedError("boolean mask indexing has a data-dependent shape")
    return x[_index_tuple(indices)]


def _masked_put(x, indices, values, accumulate):
    """``x[mask] = values`` as a select, when the values broadcast over the
    selected rows (``x[mask] = 0``, ``x[:, mask] = row``); None otherwise."""
    present = [(p, i) for p, i in enumerate(indices) if i is not None]
    if len(present) != 1:
        return None
    p, mask = present[0]
    if values.ndim > x.ndim - p - mask.ndim:
        return None
    mask = mask.astype(bool).reshape((1,) * p + mask.shape + (1,) * (x.ndim - p - mask.ndim))
    values = values.astype(x.dtype)
    if accumulate:
        if x.dtype == jnp.bool_:
            return x | (mask & values)
        return x + jnp.where(mask, values, jnp.zeros((), x.dtype))
    return jnp.where(mask, values, x)


@register(aten.index_put.default, aten._unsafe_index_put.default, may_refuse=True)
def index_put(x, indices, values, accumulate=False):
    if any(_is_mask(i) for i in indices):
        out = _masked_put(x, indices, values, accumulate)
        if out is None:
            raise NotImplementedError("index_put with this boolean mask")
    else:
        ref = x.at[_index_tuple(indices)]
        out = _add(ref, values.astype(x.dtype)) if accumulate else ref.set(values.astype(x.dtype))
    if values.dtype != x.dtype:
        # torch's CPU kernel requires the dtypes to match (its meta kernel does not), after
        # its shape checks: refusing sends the call to CPU torch, which raises its error
        raise TypeError("index_put with values of another dtype")
    return out


@register(aten.index_select.default)
def index_select(x, dim, index):
    if x.ndim == 0:
        return x
    return take(x, index.reshape(-1), axis=wrap(dim, x.ndim))


@register(aten.gather.default)
def gather(x, dim, index, *, sparse_grad=False):
    if x.ndim == 0:
        return jnp.broadcast_to(x, index.shape)
    if index.size == 0:
        return jnp.zeros(index.shape, x.dtype)
    d = wrap(dim, x.ndim)
    if index.ndim != x.ndim:  # a 0-d/1-d index on a tensor of another rank (empty or 1 elt)
        index = index.reshape(index.shape + (1,) * (x.ndim - index.ndim))
    # torch lets index be smaller than x in the other dims: crop x to it.
    x = x[tuple(slice(None) if i == d else slice(0, n) for i, n in enumerate(index.shape))]
    return jnp.take_along_axis(x, index.astype(jnp.int64), axis=d)


def _scatter_ref(x, dim, index):
    """``x.at[...]`` for the positions torch's scatter along ``dim`` writes to."""
    if x.ndim == 0:
        return x.reshape(1).at[index.reshape(-1)], lambda y: y.reshape(())
    d = wrap(dim, x.ndim)
    pos = tuple(index if i == d else lax.broadcasted_iota(index.dtype, index.shape, i)
                for i in range(index.ndim))
    return x.at[pos], lambda y: y


def _src(src, index, dtype):
    if hasattr(src, "ndim") and src.ndim:
        src = src[tuple(slice(0, n) for n in index.shape)]  # src may be larger than index
    return jnp.broadcast_to(jnp.asarray(src, dtype), index.shape)


_REDUCE = {"sum": "add", "add": "add", "prod": "multiply", "multiply": "multiply",
           "amax": "max", "amin": "min", "mean": "add"}


@register(aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce)
def scatter(x, dim, index, src, *, reduce=None):
    ref, back = _scatter_ref(x, dim, index)
    src = _src(src, index, x.dtype)
    if reduce is None:
        return back(ref.set(src))
    how = _REDUCE[reduce]
    if x.dtype == jnp.bool_ and how in ("add", "multiply"):
        how = "max" if how == "add" else "min"  # or / and
    return back(getattr(ref, how)(src))


@register(aten.scatter_add.default)
def scatter_add(x, dim, index, src):
    return scatter(x, dim, index, src, reduce="add")


def _reduce_identity(reduce, dtype):
    """The value a ``reduce`` reduction starts from (scatter_reduce, index_reduce)."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf if reduce == "amax" else jnp.inf
    if dtype == jnp.bool_:
        return reduce == "amin"
    info = jnp.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


@register(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    if not include_self:  # written positions start from the reduction's identity
        x = scatter(x, dim, index, _reduce_identity(reduce, x.dtype))
    out = scatter(x, dim, index, src, reduce=reduce)
    if reduce != "mean":
        return out
    count = scatter(jnp.zeros(x.shape, x.dtype), dim, index, 1, reduce="add")
    count = jnp.maximum(count + (1 if include_self else 0), 1)
    return out / count if jnp.issubdtype(x.dtype, jnp.inexact) else out // count


def _dim_ref(x, dim, index):
    return x.at[(slice(None),) * wrap(dim, x.ndim) + (index.reshape(-1),)]


def _on_1d(fn):
    """0-d self: run on a 1-element vector (torch treats it as one)."""
    def lowering(x, dim, index, value, **kw):
        if x.ndim:
            return fn(x, dim, index, value, **kw)
        v = value.reshape(1) if hasattr(value, "ndim") and value.ndim == 0 else value
        return fn(x.reshape(1), 0, index, v, **kw).reshape(())
    return lowering


@register(aten.index_add.default)
@_on_1d
def index_add(x, dim, index, source, *, alpha=1):
    src = source if source.ndim == x.ndim else source.reshape(x.shape[:0] + (-1,) + x.shape[1:])
    if x.dtype == jnp.bool_:
        return _dim_ref(x, dim, index).max(src.astype(bool) & jnp.asarray(alpha, bool))
    return _dim_ref(x, dim, index).add((src * alpha).astype(x.dtype))


@register(aten.index_copy.default)
@_on_1d
def index_copy(x, dim, index, source):
    src = source if source.ndim == x.ndim else source.reshape(x.shape[:0] + (-1,) + x.shape[1:])
    return _dim_ref(x, dim, index).set(src.astype(x.dtype))


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
@_on_1d
def index_fill(x, dim, index, value):
    return _dim_ref(x, dim, index).set(jnp.asarray(value, x.dtype))


@register(aten.one_hot.default)
def one_hot(x, num_classes=-1):
    # num_classes=-1 never arrives: dispatch._one_hot reads the class count first
    return (x[..., None] == jnp.arange(num_classes, dtype=x.dtype)).astype(jnp.int64)


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    return jnp.where(mask, jnp.asarray(value, x.dtype), x)


@register(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    # The k-th True position takes source.flatten()[k]: a cumsum finds k. The mask and
    # self broadcast together (torch expands self to the mask's shape too).
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x = jnp.broadcast_to(x, shape)
    mask = jnp.broadcast_to(mask, shape).reshape(-1)
    k = jnp.clip(jnp.cumsum(mask) - 1, 0, max(source.size - 1, 0))
    taken = source.reshape(-1)[k].astype(x.dtype) if source.size else jnp.zeros_like(k, x.dtype)
    return jnp.where(mask, taken, x.reshape(-1)).reshape(shape)


@register(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad, mask, sizes):
    # The source's k-th element went to the k-th True position: gather it back; source
    # elements past the number of Trues get no gradient.
    shape = jnp.broadcast_shapes(grad.shape, mask.shape)
    g = jnp.broadcast_to(grad, shape).reshape(-1)
    m = jnp.broadcast_to(mask, shape).reshape(-1)
    n = 1
    for s in sizes:
        n *= s
    k = jnp.cumsum(m) - 1
    out = jnp.zeros((n + 1,), grad.dtype).at[jnp.where(m & (k < n), k, n)].add(jnp.where(m, g, 0))
    return out[:n].reshape(tuple(sizes))
