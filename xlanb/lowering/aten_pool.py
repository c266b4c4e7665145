"""Pooling, upsampling, im2col/col2im and their backward ops.

All of these act on the trailing ``n`` spatial dims, so batched and unbatched
inputs are handled alike. Backward ops of linear forwards use ``jax.vjp``.
"""
from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xlanb.lowering._util import aten, ntuple, take, upcast
from xlanb.lowering.registry import register


def _out_size(size, k, s, p, d, ceil_mode):
    eff = d * (k - 1) + 1
    out = (size + 2 * p - eff + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:  # last window must start inside
        out -= 1
    return out


def _params(x, n, kernel, stride, padding, dilation, ceil_mode):
    kernel = ntuple(kernel, n)
    stride = ntuple(stride, n) if stride else kernel  # stride=[] means kernel_size
    padding, dilation = ntuple(padding, n), ntuple(dilation, n)
    outs = tuple(_out_size(i, k, s, p, d, ceil_mode) for i, k, s, p, d in
                 zip(x.shape[-n:], kernel, stride, padding, dilation))
    return kernel, stride, padding, dilation, outs


def _patches(x, kernel, stride, padding, dilation, outs, pad_value):
    """Windows as a new axis before the spatial dims: shape lead + (K,) + outs,
    with K = prod(kernel) in row-major kernel order."""
    n = len(kernel)
    lead = x.ndim - n
    hi = [max(0, (o - 1) * s + d * (k - 1) + 1 - p - i) for o, s, d, k, p, i in
          zip(outs, stride, dilation, kernel, padding, x.shape[lead:])]
    xp = jnp.pad(x, [(0, 0)] * lead + list(zip(padding, hi)), constant_values=pad_value)
    taps = []
    for offs in itertools.product(*(range(k) for k in kernel)):
        start = [0] * lead + [o * d for o, d in zip(offs, dilation)]
        limit = list(x.shape[:lead]) + [st + (o - 1) * s + 1 for st, o, s in
                                         zip(start[lead:], outs, stride)]
        taps.append(lax.slice(xp, start, limit, [1] * lead + list(stride)))
    return jnp.stack(taps, axis=lead)


# ---- max pooling ------------------------------------------------------------------

def window_max(win, valid, axis: int):
    """torch's max over a window axis: ``(value, position)``, the first maximum in
    window order, except that a NaN wins (the last NaN); positions where ``valid`` is
    False (padding) only when nothing else is there. ``win`` and ``valid`` have the same
    shape.

    One variadic reduce carries the value with its position. Comparing each candidate
    with a separately computed maximum (``win == max(win)``) depends on XLA computing
    ``win`` bit for bit alike in both places, and it need not: XLA:CPU with the legacy
    emitters at -O0 recomputed a batch norm's mean inside two fusions with different
    sums, no candidate equalled the maximum, and max pool's gradient went to the wrong
    taps."""
    floating = jnp.issubdtype(win.dtype, jnp.floating)
    low = -jnp.inf if floating else (jnp.iinfo(win.dtype).min if win.dtype != jnp.bool_
                                     else False)
    pos = lax.broadcasted_iota(jnp.int32, win.shape, axis)

    def pick(a, b):  # the winner of two (value, valid, position); a total order
        av, aok, ai = a
        bv, bok, bi = b
        if floating:
            anan, bnan = jnp.isnan(av), jnp.isnan(bv)
            by_value = jnp.where(anan | bnan,
                                 jnp.where(anan & bnan, bi > ai, bnan),
                                 (bv > av) | ((bv == av) & (bi < ai)))
        else:
            by_value = (bv > av) | ((bv == av) & (bi < ai))
        b_wins = jnp.where(aok == bok, jnp.where(aok, by_value, bi < ai), bok)
        return (jnp.where(b_wins, bv, av), jnp.where(b_wins, bok, aok),
                jnp.where(b_wins, bi, ai))

    init = (np.array(low, win.dtype), np.array(False), np.array(np.iinfo(np.int32).max, np.int32))
    best, _ok, which = lax.reduce((win, valid, pos), init, pick, (axis,))
    return best, which


def _max_pool_with_indices(x, n, kernel, stride, padding, dilation, ceil_mode):
    kernel, stride, padding, dilation, outs = _params(x, n, kernel, stride, padding, dilation,
                                                      ceil_mode)
    lead = x.ndim - n
    low = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    taps = _patches(x, kernel, stride, padding, dilation, outs, low)
    valid = _patches(jnp.ones(x.shape[lead:], bool), kernel, stride, padding, dilation, outs,
                     False)
    best, tap = window_max(taps, jnp.broadcast_to(valid, taps.shape), lead)
    # Flat index into the input's spatial plane of the chosen tap.
    index = jnp.zeros(tap.shape, jnp.int64)
    for j in range(n):
        k_after = math.prod(kernel[j + 1:])
        offset = (tap // k_after) % kernel[j]
        coord = lax.broadcasted_iota(jnp.int64, tap.shape, lead + j) * stride[j] \
            - padding[j] + offset * dilation[j]
        index = index * x.shape[lead + j] + coord
    return best, index


def _max_pool_backward(g, x, indices, n):
    lead = x.shape[:x.ndim - n]
    plane = math.prod(x.shape[x.ndim - n:])
    g = upcast(g).reshape(-1, math.prod(g.shape[len(lead):]))
    idx = indices.reshape(g.shape)
    rows = jnp.arange(g.shape[0])[:, None]
    return jnp.zeros((g.shape[0], plane), g.dtype).at[rows, idx].add(g).reshape(x.shape)


for _n in (1, 2, 3):
    register(getattr(aten, f"max_pool{_n}d_with_indices").default)(
        lambda x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False, _n=_n:
        _max_pool_with_indices(x, _n, kernel_size, stride, padding, dilation, ceil_mode))
for _n in (2, 3):
    register(getattr(aten, f"max_pool{_n}d_with_indices_backward").default)(
        lambda g, x, kernel_size, stride, padding, dilation, ceil_mode, indices, _n=_n:
        _max_pool_backward(g, x, indices, _n))


# ---- average pooling -----------------------------------------------------------------

def _window_sum(x, kernel, stride, lo, hi, outs):
    lead = x.ndim - len(kernel)
    # A concrete (numpy) zero lets JAX see a differentiable window sum.
    out = lax.reduce_window(x, np.zeros((), x.dtype), lax.add, (1,) * lead + kernel,
                            (1,) * lead + stride, [(0, 0)] * lead + list(zip(lo, hi)))
    return out[(Ellipsis,) + tuple(slice(0, o) for o in outs)]


def _avg_pool(x, n, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel, stride, padding, _, outs = _params(x, n, kernel, stride, padding, 1, ceil_mode)
    sizes = x.shape[-n:]
    hi = [max(0, (o - 1) * s + k - p - i) for o, s, k, p, i in
          zip(outs, stride, kernel, padding, sizes)]
    total = _window_sum(upcast(x), kernel, stride, padding, hi, outs)
    if divisor_override:
        return total / divisor_override
    # The divisor counts window cells inside the input, plus the zero padding
    # when count_include_pad (but never the extra ceil_mode overhang).
    ones = np.ones(sizes, np.float32)
    if count_include_pad:
        ones = np.pad(ones, [(p, p) for p in padding], constant_values=1)
        lo, hi = (0,) * n, [max(0, h - p) for h, p in zip(hi, padding)]
    else:
        lo = padding
    count = _window_sum(jnp.asarray(ones), kernel, stride, lo, hi, outs)
    return total / count


def _avg_pool_backward(g, x, n, *args):
    _, vjp = jax.vjp(lambda v: _avg_pool(v, n, *args), upcast(x))
    return vjp(upcast(g))[0]


for _n in (1, 2, 3):
    register(getattr(aten, f"avg_pool{_n}d").default)(
        lambda x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
        divisor_override=None, _n=_n:
        _avg_pool(x, _n, kernel_size, stride, padding, ceil_mode, count_include_pad,
                  divisor_override))
for _n in (2, 3):
    register(getattr(aten, f"avg_pool{_n}d_backward").default)(
        lambda g, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
        divisor_override, _n=_n:
        _avg_pool_backward(g, x, _n, kernel_size, stride, padding, ceil_mode,
                           count_include_pad, divisor_override))


# ---- separable resampling: adaptive average pooling, linear upsampling ---------------

def _apply_per_dim(x, mats):
    """Contract each trailing spatial dim with its (out, in) matrix."""
    n = len(mats)
    x = upcast(x) if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    for j, m in enumerate(mats):
        axis = x.ndim - n + j
        y = jnp.tensordot(x, jnp.asarray(m, x.dtype), axes=[[axis], [1]],
                          precision=lax.Precision.HIGHEST)
        x = jnp.moveaxis(y, -1, axis)
    return x


def _adaptive_matrix(size, out):
    m = np.zeros((out, size), np.float64)
    for i in range(out):
        start, end = (i * size) // out, -((-(i + 1) * size) // out)
        m[i, start:end] = 1.0 / (end - start)
    return m


def _adaptive_avg_pool(x, output_size):
    n = len(output_size)
    return _apply_per_dim(x, [_adaptive_matrix(i, o) for i, o in
                              zip(x.shape[-n:], output_size)])


register(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default,
         aten.adaptive_avg_pool1d.default)(_adaptive_avg_pool)


@register(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(g, x):
    return _apply_per_dim(g, [_adaptive_matrix(i, o).T for i, o in
                              zip(x.shape[-2:], g.shape[-2:])])


@register(aten._adaptive_avg_pool3d_backward.default)
def _adaptive_avg_pool3d_backward(g, x):
    return _apply_per_dim(g, [_adaptive_matrix(i, o).T for i, o in
                              zip(x.shape[-3:], g.shape[-3:])])


def _linear_matrix(size, out, align_corners, scale):
    """Interpolation weights (out, in) of torch's linear upsampling."""
    dst = np.arange(out, dtype=np.float64)
    if align_corners:
        src = dst * ((size - 1) / (out - 1) if out > 1 else 0.0)
    else:
        ratio = 1.0 / scale if scale else size / out
        src = np.maximum((dst + 0.5) * ratio - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), size - 1)
    i1 = np.minimum(i0 + 1, size - 1)
    w1 = src - i0
    m = np.zeros((out, size), np.float64)
    np.add.at(m, (np.arange(out), i0), 1.0 - w1)
    np.add.at(m, (np.arange(out), i1), w1)
    return m


def _nearest_index(size, out, scale):
    # torch computes the source index in float32.
    ratio = np.float32(1.0 / scale) if scale else np.float32(size) / np.float32(out)
    src = np.floor(np.arange(out, dtype=np.float32) * ratio).astype(np.int64)
    return np.minimum(src, size - 1)


def _out_sizes(x, n, output_size, scale_factors):
    if output_size:
        return tuple(output_size), (None,) * n
    scales = tuple(scale_factors)
    return tuple(int(math.floor(i * s)) for i, s in zip(x.shape[-n:], scales)), scales


def _upsample_linear(x, n, output_size, align_corners, scales):
    mats = [_linear_matrix(i, o, align_corners, s) for i, o, s in
            zip(x.shape[-n:], output_size, scales)]
    return _apply_per_dim(x, mats)


def _upsample_linear_vec(x, n, output_size, align_corners, scale_factors):
    sizes, scales = _out_sizes(x, n, output_size, scale_factors)
    return _upsample_linear(x, n, sizes, align_corners, scales)


def _upsample_linear_backward(g, n, input_size, align_corners, scales):
    mats = [_linear_matrix(i, o, align_corners, s).T for i, o, s in
            zip(input_size[-n:], g.shape[-n:], scales)]
    return _apply_per_dim(g, mats)


def _upsample_nearest(x, n, output_size, scales):
    for j, (i, o, s) in enumerate(zip(x.shape[-n:], output_size, scales)):
        x = take(x, _nearest_index(i, o, s), axis=x.ndim - n + j)
    return x


def _upsample_nearest_backward(g, n, output_size, input_size, scales):
    zeros = jnp.zeros(tuple(input_size), upcast(g).dtype)
    _, vjp = jax.vjp(lambda v: _upsample_nearest(v, n, output_size, scales), zeros)
    return vjp(upcast(g))[0]


for _n, _lin in ((1, "linear1d"), (2, "bilinear2d"), (3, "trilinear3d")):
    register(getattr(aten, f"upsample_nearest{_n}d").vec, static_floats=True)(
        lambda x, output_size, scale_factors, _n=_n:
        _upsample_nearest(x, _n, *_out_sizes(x, _n, output_size, scale_factors)))
    register(getattr(aten, f"upsample_nearest{_n}d").default, static_floats=True)(
        lambda x, output_size, *scales, _n=_n:
        _upsample_nearest(x, _n, output_size, (scales + (None,) * _n)[:_n]))
    register(getattr(aten, f"upsample_nearest{_n}d_backward").default, static_floats=True)(
        lambda g, output_size, input_size, *scales, _n=_n:
        _upsample_nearest_backward(g, _n, output_size, input_size,
                                   (scales + (None,) * _n)[:_n]))
    register(getattr(aten, f"upsample_{_lin}").vec, static_floats=True)(
        lambda x, output_size, align_corners, scale_factors, _n=_n:
        _upsample_linear_vec(x, _n, output_size, align_corners, scale_factors))
    register(getattr(aten, f"upsample_{_lin}").default, static_floats=True)(
        lambda x, output_size, align_corners, *scales, _n=_n:
        _upsample_linear(x, _n, output_size, align_corners, (scales + (None,) * _n)[:_n]))
    register(getattr(aten, f"upsample_{_lin}_backward").default, static_floats=True)(
        lambda g, output_size, input_size, align_corners, *scales, _n=_n:
        _upsample_linear_backward(g, _n, input_size, align_corners,
                                  (scales + (None,) * _n)[:_n]))


# ---- im2col / col2im (nn.Unfold / nn.Fold) -----------------------------------------

@register(aten.im2col.default)
def im2col(x, kernel_size, dilation, padding, stride):
    kernel, stride, padding, dilation, outs = _params(x, 2, kernel_size, stride, padding,
                                                      dilation, False)
    taps = _patches(x, kernel, stride, padding, dilation, outs, 0)  # (..., C, K, oh, ow)
    lead = taps.shape[:-4]
    return taps.reshape(lead + (taps.shape[-4] * taps.shape[-3], outs[0] * outs[1]))


@register(aten.col2im.default)
def col2im(cols, output_size, kernel_size, dilation, padding, stride):
    # col2im is the transpose of im2col (overlapping taps add up).
    k = math.prod(ntuple(kernel_size, 2))
    shape = cols.shape[:-2] + (cols.shape[-2] // k,) + tuple(output_size)
    fwd = lambda v: im2col(v, kernel_size, dilation, padding, stride)  # noqa: E731
    return jax.linear_transpose(fwd, jax.ShapeDtypeStruct(shape, cols.dtype))(cols)[0]


# ---- grid_sample ---------------------------------------------------------------------

def _reflect(c, twice_low, twice_high):
    """Fold coordinates into [low, high] by mirroring, like torch's reflect_coordinates."""
    if twice_low == twice_high:
        return jnp.zeros_like(c)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    c = jnp.abs(c - low)
    extra, flips = jnp.fmod(c, span), jnp.floor(c / span)
    return jnp.where(flips % 2 == 0, extra + low, span - extra + low)


def _source_coord(g, size, padding_mode, align_corners):
    """Grid values in [-1, 1] as source coordinates along one axis of ``size`` pixels."""
    c = (g + 1) / 2 * (size - 1) if align_corners else ((g + 1) * size - 1) / 2
    if padding_mode == 2:  # reflection
        c = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
    if padding_mode in (1, 2):  # border, and reflection's final clip
        c = jnp.clip(c, 0, size - 1)
    return c


def _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners):
    if interpolation_mode == 2:
        raise NotImplementedError("bicubic grid_sample")
    n, c, h, w = x.shape
    ix = _source_coord(grid[..., 0], w, padding_mode, align_corners)
    iy = _source_coord(grid[..., 1], h, padding_mode, align_corners)
    flat = x.reshape(n, c, h * w)

    def tap(yy, xx):  # values at integer positions; zero outside the input
        inside = (xx >= 0) & (xx < w) & (yy >= 0) & (yy < h)
        idx = (jnp.clip(yy, 0, h - 1) * w + jnp.clip(xx, 0, w - 1)).astype(jnp.int32)
        idx = jnp.broadcast_to(idx.reshape(n, 1, -1), (n, c, idx[0].size))
        v = jnp.take_along_axis(flat, idx, axis=2).reshape((n, c) + yy.shape[1:])
        return jnp.where(inside[:, None], v, 0)

    if interpolation_mode == 1:  # nearest, ties to even like torch's nearbyint
        return tap(jnp.round(iy), jnp.round(ix))
    x0, y0 = jnp.floor(ix), jnp.floor(iy)
    wx, wy = (ix - x0)[:, None], (iy - y0)[:, None]
    return (tap(y0, x0) * (1 - wx) * (1 - wy) + tap(y0, x0 + 1) * wx * (1 - wy)
            + tap(y0 + 1, x0) * (1 - wx) * wy + tap(y0 + 1, x0 + 1) * wx * wy)


register(aten.grid_sampler_2d.default, may_refuse=True)(_grid_sample)


def _grid_sampler_backward(forward):
    """A grid sampler's backward: the vjp of ``forward`` (2-d here, 3-d in aten_sampling)."""
    def backward(g, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
        out, vjp = jax.vjp(lambda a, b: forward(a, b, interpolation_mode, padding_mode,
                                                align_corners), x, grid)
        gx, ggrid = vjp(g.astype(out.dtype))
        return (gx if output_mask[0] else None), ggrid
    return backward


register(aten.grid_sampler_2d_backward.default, may_refuse=True)(
    _grid_sampler_backward(_grid_sample))
