"""Views and shape ops: reshape, transpose, slicing, split/cat, pads, flips.

View ops return fresh arrays here; the tensor layer keeps the aliasing. Their
``*_copy`` twins (what functionalization emits) share the lowering.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from xlanb.base.dtypes import UnsupportedDtypeError, to_jax_dtype
from xlanb.lowering._util import aten, take, wrap
from xlanb.lowering.registry import register


def _identity(x, *args, **kwargs):
    return x


register(aten.alias.default, aten.alias_copy.default, aten.detach.default,
         aten.detach_copy.default, aten.lift_fresh.default, aten.lift_fresh_copy.default)(
    _identity)


@register(aten.view.default, aten.view_copy.default, aten._unsafe_view.default,
          aten.reshape.default, aten._reshape_alias.default)
def view(x, size, *stride):
    return jnp.reshape(x, tuple(size))


@register(aten.view.dtype, aten.view_copy.dtype, may_refuse=True)
def view_dtype(x, dtype):
    if dtype == torch.complex32:  # the device holds it as complex64: no bits to view
        raise UnsupportedDtypeError("xlanb: a view as complex32 reinterprets bits the "
                                    "device does not hold (complex32 lives as complex64)")
    return _bitcast(x, to_jax_dtype(dtype))


_COMPONENT = {np.dtype(np.complex64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.float64)}


def _bitcast(x, new):
    """``x``'s bytes read as ``new``, as torch's ``Tensor.view(dtype)``: the last dim
    scales by the size ratio. XLA bitcasts neither bool nor complex, so a bool is its
    byte (0 or 1) and a complex number its two real halves."""
    old, new = np.dtype(x.dtype), np.dtype(new)
    if old == new:
        return x
    if x.ndim == 0:  # a 0-d tensor views as a type of its own size (torch refuses others)
        return _bitcast(x.reshape(1), new).reshape(())
    if old == np.bool_:
        return _bitcast(x.astype(jnp.uint8), new)
    if new == np.bool_:
        return _bitcast(x, np.dtype(np.uint8)) != 0
    if old in _COMPONENT:  # (..., n) complex -> (..., 2n) of its component type
        pairs = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)
        return _bitcast(pairs.reshape(x.shape[:-1] + (2 * x.shape[-1],)), new)
    if new in _COMPONENT:  # (..., 2m) of the component type -> (..., m) complex
        y = _bitcast(x, _COMPONENT[new])
        y = y.reshape(y.shape[:-1] + (y.shape[-1] // 2, 2))
        return lax.complex(y[..., 0], y[..., 1])
    old_size, new_size = old.itemsize, new.itemsize
    if new_size > old_size:  # fold the last dim: (..., n) -> (..., n/r, r) -> (..., n/r)
        x = x.reshape(x.shape[:-1] + (x.shape[-1] * old_size // new_size, new_size // old_size))
    y = lax.bitcast_convert_type(x, new)
    if new_size < old_size:  # (..., n, r) -> (..., n*r); no -1: n may be 0
        y = y.reshape(y.shape[:-2] + (y.shape[-2] * y.shape[-1],))
    return y


@register(aten.t.default, aten.t_copy.default)
def t(x):
    return x if x.ndim < 2 else x.T


@register(aten.transpose.int, aten.transpose_copy.int)
def transpose(x, dim0, dim1):
    return x if x.ndim < 2 else jnp.swapaxes(x, wrap(dim0, x.ndim), wrap(dim1, x.ndim))


@register(aten.permute.default, aten.permute_copy.default)
def permute(x, dims):
    return jnp.transpose(x, [wrap(d, x.ndim) for d in dims])


@register(aten.expand.default, aten.expand_copy.default)
def expand(x, size, *, implicit=False):
    shape = (1,) * (len(size) - x.ndim) + x.shape
    target = tuple(s if t == -1 else t for s, t in zip(shape, size))
    return jnp.broadcast_to(x.reshape(shape), target)


@register(torch.ops.prims.broadcast_in_dim.default)
def broadcast_in_dim(x, shape, broadcast_dimensions):
    # a view torch's _refs make (_refs.nn.functional.prelu); a prim, so no decomposition
    return lax.broadcast_in_dim(x, tuple(shape), tuple(broadcast_dimensions))


@register(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@register(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.default,
          aten.squeeze_copy.dim, aten.squeeze_copy.dims)
def squeeze(x, dim=None):
    if x.ndim == 0:
        return x
    axes = range(x.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
    # Dims whose size is not 1 are left alone, unlike numpy.
    return jnp.squeeze(x, tuple(a for a in {wrap(d, x.ndim) for d in axes} if x.shape[a] == 1))


def _slicer(ndim, dim, index):
    return (slice(None),) * wrap(dim, ndim) + (index,)


@register(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(x, dim=0, start=None, end=None, step=1):
    # Python slices clamp and wrap exactly like torch's slice (step > 0).
    return x[_slicer(x.ndim, dim, slice(start, end, step))]


@register(aten.narrow_copy.default)
def narrow_copy(x, dim, start, length):
    start = start % x.shape[wrap(dim, x.ndim)] if start < 0 else start
    return slice_(x, dim, start, start + length)


@register(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    return x.at[_slicer(x.ndim, dim, slice(start, end, step))].set(src.astype(x.dtype))


@register(aten.slice_backward.default)
def slice_backward(g, input_sizes, dim, start, end, step):
    return slice_scatter(jnp.zeros(tuple(input_sizes), g.dtype), g, dim, start, end, step)


@register(aten.select.int, aten.select_copy.int)
def select(x, dim, index):
    return x[_slicer(x.ndim, dim, index)]


@register(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    return x.at[_slicer(x.ndim, dim, index)].set(src.astype(x.dtype))


@register(aten.select_backward.default)
def select_backward(g, input_sizes, dim, index):
    return select_scatter(jnp.zeros(tuple(input_sizes), g.dtype), g, dim, index)


@register(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, wrap(dim1, x.ndim), wrap(dim2, x.ndim))


@register(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = wrap(dim1, x.ndim), wrap(dim2, x.ndim)
    xt = jnp.moveaxis(x, (d1, d2), (-2, -1))
    i = np.arange(src.shape[-1])
    xt = xt.at[..., i + max(-offset, 0), i + max(offset, 0)].set(src.astype(x.dtype))
    return jnp.moveaxis(xt, (-2, -1), (d1, d2))


@register(aten.diagonal_backward.default)
def diagonal_backward(g, input_sizes, offset, dim1, dim2):
    return diagonal_scatter(jnp.zeros(tuple(input_sizes), g.dtype), g, offset, dim1, dim2)


def _strided_index(size, stride, storage_offset):
    idx = np.full(tuple(size), storage_offset or 0, np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        idx += (np.arange(n) * s).reshape((-1,) + (1,) * (len(size) - d - 1))
    return idx


# as_strided indexes the input as if it were its own contiguous storage.
@register(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(x, size, stride, storage_offset=None):
    return take(x.reshape(-1), _strided_index(size, stride, storage_offset))


@register(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    idx = _strided_index(size, stride, storage_offset)
    return x.reshape(-1).at[idx].set(src.astype(x.dtype)).reshape(x.shape)


@register(aten.split.Tensor, aten.split_copy.Tensor, aten.unsafe_split.Tensor)
def split(x, split_size, dim=0):
    n = x.shape[wrap(dim, x.ndim)]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] or [0]
    return split_with_sizes(x, sizes, dim)


@register(aten.split_with_sizes.default, aten.split_with_sizes_copy.default,
          aten.unsafe_split_with_sizes.default)
def split_with_sizes(x, split_sizes, dim=0):
    dim = wrap(dim, x.ndim)
    starts = np.cumsum([0] + list(split_sizes))
    return [lax.slice_in_dim(x, int(a), int(b), axis=dim) for a, b in zip(starts, starts[1:])]


@register(aten.unbind.int, aten.unbind_copy.int)
def unbind(x, dim=0):
    dim = wrap(dim, x.ndim)
    return [lax.index_in_dim(x, i, dim, keepdims=False) for i in range(x.shape[dim])]


@register(aten.unfold.default, aten.unfold_copy.default)
def unfold(x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape(1)
    d = wrap(dimension, x.ndim)
    n = (x.shape[d] - size) // step + 1
    windows = np.arange(n)[:, None] * step + np.arange(size)[None, :]
    return jnp.moveaxis(take(x, windows, axis=d), d + 1, -1)


@register(aten.cat.default, aten.concat.default)
def cat(tensors, dim=0):
    # torch still accepts legacy empty 1-d tensors next to any shape.
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors)
    return jnp.concatenate(kept, axis=wrap(dim, kept[0].ndim))


@register(aten.stack.default)
def stack(tensors, dim=0):
    return jnp.stack(tensors, axis=dim % (tensors[0].ndim + 1))


@register(aten.flip.default)
def flip(x, dims):
    return jnp.flip(x, axis=tuple(wrap(d, x.ndim) for d in dims)) if x.ndim else x


@register(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:  # roll the flattened tensor
        return jnp.roll(x.reshape(-1), shifts).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(dims))


@register(aten.repeat.default)
def repeat(x, repeats):
    return jnp.tile(x, tuple(repeats))  # extra repeats add leading dims, like torch


@register(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@register(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


# ---- padding --------------------------------------------------------------

def _pad_pairs(ndim, pad):
    """torch's flat pad list (last dim first) as per-dim (low, high) pairs."""
    pairs = [(0, 0)] * ndim
    for i in range(len(pad) // 2):
        pairs[ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return pairs


@register(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    # lax.pad takes negative padding, which crops like torch does.
    cfg = [(lo, hi, 0) for lo, hi in _pad_pairs(x.ndim, pad)]
    return lax.pad(x, jnp.asarray(value, x.dtype), cfg)


def _replicate_pad(x, padding):
    # out[o] = in[clamp(o - low, 0, n - 1)] per padded dim: negative pads crop, like torch
    for d, (lo, hi) in enumerate(_pad_pairs(x.ndim, padding)):
        if lo or hi:
            n = x.shape[d]
            idx = np.clip(np.arange(n + lo + hi) - lo, 0, n - 1)
            x = take(x, idx, axis=d)
    return x


def _reflect_pad(x, padding):
    pairs = _pad_pairs(x.ndim, padding)
    crop = tuple(slice(max(-lo, 0), x.shape[d] - max(-hi, 0)) for d, (lo, hi) in enumerate(pairs))
    return jnp.pad(x[crop], [(max(lo, 0), max(hi, 0)) for lo, hi in pairs], mode="reflect")


def _mode_pad(mode):
    return _reflect_pad if mode == "reflect" else _replicate_pad


def _mode_pad_backward(mode):
    def backward(g, x, padding):
        f = lambda v: _mode_pad(mode)(v, padding)  # noqa: E731
        return jax.vjp(f, x)[1](g.astype(x.dtype))[0]
    return backward


for _n in (1, 2, 3):
    for _kind, _mode in (("reflection", "reflect"), ("replication", "edge")):
        register(getattr(aten, f"{_kind}_pad{_n}d").default)(_mode_pad(_mode))
        register(getattr(aten, f"{_kind}_pad{_n}d_backward").default)(_mode_pad_backward(_mode))


@register(aten.numpy_T.default)
def numpy_T(x):  # noqa: N802  (torch's name)
    return jnp.transpose(x)
