"""Adaptive and fractional max pooling, nearest-exact/bicubic/antialiased upsampling,
3-d grid sampling, embedding bags and renorm, rrelu, and _trilinear (nn.Bilinear).

Every window here has a static shape (the largest window, masked), so these ops lower
to gathers and reductions with no data-dependent shapes.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xlanb.lowering._util import aten, is_float, take, upcast
from xlanb.lowering.aten_pool import _grid_sampler_backward, _source_coord, window_max
from xlanb.lowering.registry import register

# ---- max over gathered windows -------------------------------------------------------

def _pool_by_starts(x, starts, sizes, kmax):
    """Max pool the trailing len(starts) dims: window i of dim j covers
    [starts[j][i], starts[j][i] + sizes[j][i]), at most kmax[j] long. ``starts``/``sizes``
    are arrays shaped (out_j,) or lead + (out_j,) (per-plane, as fractional pooling has).
    Returns values and flat indices into the pooled plane."""
    n = len(starts)
    lead = x.ndim - n
    in_sizes = x.shape[lead:]
    # Gather each dim's windows: dim j of size I -> (out_j, k_j)
    pos = []
    ok = []
    for j in range(n):
        t = jnp.arange(kmax[j])
        p = starts[j][..., :, None] + t  # (..., out_j, k_j)
        ok.append(t < sizes[j][..., :, None])
        pos.append(jnp.clip(p, 0, in_sizes[j] - 1))
    # Build full index arrays of shape lead + outs + ks (broadcast per dim)
    outs = tuple(s.shape[-1] for s in starts)
    lead_shape = x.shape[:lead]
    target = lead_shape + outs + tuple(kmax)
    flat = jnp.zeros(target, jnp.int64)
    valid = jnp.ones(target, bool)
    for j in range(n):
        # pos[j]: (maybe lead) + (out_j, k_j) -> put out_j at lead+j and k_j at lead+n+j
        pj = pos[j]
        oj = ok[j]
        plead = pj.ndim - 2
        shape = list(pj.shape[:plead]) + [1] * (lead - plead) + [1] * n + [1] * n
        shape[lead + j] = outs[j]
        shape[lead + n + j] = kmax[j]
        pj = pj.reshape(shape)
        oj = oj.reshape(shape)
        flat = flat * in_sizes[j] + pj
        valid = valid & oj
    flat = jnp.broadcast_to(flat, target)
    valid = jnp.broadcast_to(valid, target)
    plane = x.reshape(lead_shape + (-1,))
    k_total = math.prod(kmax)
    idx = flat.reshape(lead_shape + (-1,))
    win = jnp.take_along_axis(plane, idx, axis=-1).reshape(lead_shape + outs + (k_total,))
    best, which = window_max(win, jnp.broadcast_to(
        valid.reshape(lead_shape + outs + (k_total,)), win.shape), win.ndim - 1)
    index = jnp.take_along_axis(flat.reshape(lead_shape + outs + (k_total,)), which[..., None],
                                axis=-1)[..., 0]
    return best, index


def _scatter_to_plane(g, x, indices, n):
    """Backward of a max pool that picked ``indices`` (flat in the pooled plane)."""
    lead = x.shape[:x.ndim - n]
    plane = math.prod(x.shape[x.ndim - n:])
    g2 = upcast(g).reshape((-1, math.prod(g.shape[len(lead):])))
    idx = indices.reshape(g2.shape)
    rows = jnp.arange(g2.shape[0])[:, None]
    out = jnp.zeros((g2.shape[0], plane), g2.dtype).at[rows, idx].add(g2)
    return out.reshape(x.shape)


# ---- adaptive max pooling ----------------------------------------------------------

def _adaptive_bounds(size, out):
    i = np.arange(out)
    start = (i * size) // out
    end = -((-(i + 1) * size) // out)
    return start, end - start, int(np.max(end - start)) if out else 1


def _adaptive_max_pool(x, output_size):
    n = len(output_size)
    starts, sizes, kmax = [], [], []
    for i, o in zip(x.shape[-n:], output_size):
        s, z, k = _adaptive_bounds(i, o)
        starts.append(jnp.asarray(s))
        sizes.append(jnp.asarray(z))
        kmax.append(k)
    return _pool_by_starts(x, starts, sizes, kmax)


register(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)(_adaptive_max_pool)


@register(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(g, x, indices):
    return _scatter_to_plane(g, x, indices, 2)


@register(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(g, x, indices):
    return _scatter_to_plane(g, x, indices, 3)


# ---- fractional max pooling ----------------------------------------------------------

def _fractional_starts(sample, size, out, k):
    """torch's generate_intervals, in the input's float type."""
    if out == 1:
        return jnp.full(sample.shape + (1,), size - k, jnp.int64)
    alpha = jnp.asarray(size - k, sample.dtype) / jnp.asarray(out - 1, sample.dtype)
    i = jnp.arange(out - 1, dtype=sample.dtype)
    seq = (jnp.trunc((i + sample[..., None]) * alpha)
           - jnp.trunc(sample[..., None] * alpha)).astype(jnp.int64)
    last = jnp.full(sample.shape + (1,), size - k, jnp.int64)
    return jnp.concatenate([seq, last], axis=-1)


def _fractional_max_pool(x, kernel_size, output_size, samples, n):
    lead = x.ndim - n
    # samples: (N, C, n) -> per plane; torch's order: 2-d (W, H), 3-d (T, H, W)
    samples = samples.astype(x.dtype)
    order = [1, 0] if n == 2 else [0, 1, 2]
    if lead == n - 1 + 1 and x.ndim == n + 1:  # unbatched (C, ...)
        samples = samples.reshape(samples.shape[-2:])
    starts, sizes = [], []
    for j in range(n):
        s = samples[..., order[j]]
        st = _fractional_starts(s, x.shape[lead + j], output_size[j], kernel_size[j])
        starts.append(st)
        sizes.append(jnp.full(st.shape, kernel_size[j]))
    return _pool_by_starts(x, starts, sizes, list(kernel_size))


register(aten.fractional_max_pool2d.default)(
    lambda x, kernel_size, output_size, samples: _fractional_max_pool(x, kernel_size, output_size,
                                                                      samples, 2))
register(aten.fractional_max_pool3d.default)(
    lambda x, kernel_size, output_size, samples: _fractional_max_pool(x, kernel_size, output_size,
                                                                      samples, 3))
register(aten.fractional_max_pool2d_backward.default)(
    lambda g, x, kernel_size, output_size, indices: _scatter_to_plane(g, x, indices, 2))
register(aten.fractional_max_pool3d_backward.default)(
    lambda g, x, kernel_size, output_size, indices: _scatter_to_plane(g, x, indices, 3))


# ---- upsampling: nearest-exact, bicubic, antialiased ----------------------------------

def _sizes_scales(x, n, output_size, scales):
    if output_size:
        return tuple(output_size), tuple((list(scales) + [None] * n)[:n])
    return tuple(int(math.floor(i * s)) for i, s in zip(x.shape[-n:], scales)), tuple(scales)


def _nearest_exact_index(size, out, scale):
    ratio = np.float32(1.0 / scale) if scale else np.float32(size) / np.float32(out)
    src = np.floor((np.arange(out, dtype=np.float32) + np.float32(0.5)) * ratio).astype(np.int64)
    return np.minimum(src, size - 1)


def _nearest_exact(x, n, output_size, scales):
    for j, (i, o, s) in enumerate(zip(x.shape[-n:], output_size, scales)):
        x = take(x, _nearest_exact_index(i, o, s), axis=x.ndim - n + j)
    return x


def _apply_mats(x, mats):
    n = len(mats)
    dt = x.dtype
    x = upcast(x)
    for j, m in enumerate(mats):
        axis = x.ndim - n + j
        y = jnp.tensordot(x, jnp.asarray(m, x.dtype), axes=[[axis], [1]],
                          precision=lax.Precision.HIGHEST)
        x = jnp.moveaxis(y, -1, axis)
    return x.astype(dt)


def _source_scale(size, out, align_corners, scale):
    """Input pixels per output pixel, torch's area_pixel_compute_scale (out > 0)."""
    if align_corners:
        return (size - 1) / (out - 1) if out > 1 else 0.0
    return (1.0 / scale) if scale else size / out


def _cubic_matrix(size, out, align_corners, scale, a=-0.75):
    """torch's bicubic weights (out, in), clamped taps at the borders."""
    m = np.zeros((out, size), np.float64)
    if out == 0 or size == 0:
        return m
    # torch computes the scale in the op's accumulate type
    ratio = float(np.float32(_source_scale(size, out, align_corners, scale)))
    for i in range(out):
        src = ratio * i if align_corners else ratio * (i + 0.5) - 0.5
        src = float(np.float32(src))
        f = math.floor(src)
        t = src - f
        ws = [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
              ((a + 2) * t - (a + 3)) * t * t + 1,
              ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
              ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]
        for k, w in enumerate(ws):
            m[i, min(max(f - 1 + k, 0), size - 1)] += w
    return m


def _aa_matrix(size, out, align_corners, scale, cubic):
    """torch's antialiased (separable, support scaled by the downsampling factor) weights."""
    m = np.zeros((out, size), np.float64)
    if out == 0 or size == 0:
        return m
    sc = _source_scale(size, out, align_corners, scale)
    support = (2.0 if cubic else 1.0) * (sc if sc >= 1.0 else 1.0)
    invscale = 1.0 / sc if sc >= 1.0 else 1.0

    def filt(v):
        v = abs(v)
        if not cubic:
            return 1.0 - v if v < 1.0 else 0.0
        a = -0.5
        if v < 1.0:
            return ((a + 2) * v - (a + 3)) * v * v + 1
        if v < 2.0:
            return (((v - 5) * v + 8) * v - 4) * a
        return 0.0

    for i in range(out):
        center = sc * (i + 0.5)  # align_corners only changes the scale (float inputs)
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), size) - xmin
        ws = [filt((j + xmin - center + 0.5) * invscale) for j in range(xmax)]
        total = sum(ws)
        for j, w in enumerate(ws):
            m[i, xmin + j] = w / total if total else 0.0
    return m


def _bicubic(x, output_size, align_corners, scales):
    n = 2
    mats = [_cubic_matrix(i, o, align_corners, s) for i, o, s in
            zip(x.shape[-n:], output_size, scales)]
    return _apply_mats(x, mats)


def _aa(x, output_size, align_corners, scales, cubic):
    mats = [_aa_matrix(i, o, align_corners, s, cubic) for i, o, s in
            zip(x.shape[-2:], output_size, scales)]
    return _apply_mats(x, mats)


for _n in (1, 2, 3):
    register(getattr(aten, f"_upsample_nearest_exact{_n}d").default, static_floats=True)(
        lambda x, output_size, *scales, _n=_n:
        _nearest_exact(x, _n, *_sizes_scales(x, _n, output_size, scales)))
    register(getattr(aten, f"_upsample_nearest_exact{_n}d").vec, static_floats=True)(
        lambda x, output_size, scale_factors, _n=_n:
        _nearest_exact(x, _n, *_sizes_scales(x, _n, output_size, scale_factors or ())))
    register(getattr(aten, f"_upsample_nearest_exact{_n}d_backward").default, static_floats=True)(
        lambda g, output_size, input_size, *scales, _n=_n:
        jax.vjp(lambda v: _nearest_exact(v, _n, tuple(output_size),
                                         tuple((list(scales) + [None] * _n)[:_n])),
                jnp.zeros(tuple(input_size), upcast(g).dtype))[1](upcast(g))[0])

register(aten.upsample_bicubic2d.default, static_floats=True)(
    lambda x, output_size, align_corners, *scales:
    _bicubic(x, *_sizes_scales(x, 2, output_size, scales)[:1], align_corners,
             _sizes_scales(x, 2, output_size, scales)[1]))
register(aten.upsample_bicubic2d.vec, static_floats=True)(
    lambda x, output_size, align_corners, scale_factors:
    _bicubic(x, _sizes_scales(x, 2, output_size, scale_factors or ())[0], align_corners,
             _sizes_scales(x, 2, output_size, scale_factors or ())[1]))


def _linear_backward(fwd, g, input_size):
    zeros = jnp.zeros(tuple(input_size), upcast(g).dtype)
    return jax.vjp(fwd, zeros)[1](upcast(g))[0]


register(aten.upsample_bicubic2d_backward.default, static_floats=True)(
    lambda g, output_size, input_size, align_corners, *scales:
    _linear_backward(lambda v: _bicubic(v, tuple(output_size), align_corners,
                                        tuple((list(scales) + [None] * 2)[:2])), g, input_size))

for _name, _cubic in (("bilinear2d", False), ("bicubic2d", True)):
    register(getattr(aten, f"_upsample_{_name}_aa").default, static_floats=True)(
        lambda x, output_size, align_corners, *scales, _c=_cubic:
        _aa(x, tuple(output_size), align_corners, tuple((list(scales) + [None] * 2)[:2]), _c))
    register(getattr(aten, f"_upsample_{_name}_aa").vec, static_floats=True)(
        lambda x, output_size, align_corners, scale_factors, _c=_cubic:
        _aa(x, *_sizes_scales(x, 2, output_size, scale_factors or ())[:1], align_corners,
            _sizes_scales(x, 2, output_size, scale_factors or ())[1], _c))
    register(getattr(aten, f"_upsample_{_name}_aa_backward").default, static_floats=True)(
        lambda g, output_size, input_size, align_corners, *scales, _c=_cubic:
        _linear_backward(lambda v: _aa(v, tuple(output_size), align_corners,
                                       tuple((list(scales) + [None] * 2)[:2]), _c), g, input_size))


# ---- grid_sampler_3d -------------------------------------------------------------------

def _grid_sample_3d(x, grid, interpolation_mode, padding_mode, align_corners):
    if interpolation_mode not in (0, 1):
        raise NotImplementedError("grid_sampler_3d supports bilinear and nearest")
    n, c, d, h, w = x.shape
    ix = _source_coord(grid[..., 0], w, padding_mode, align_corners)
    iy = _source_coord(grid[..., 1], h, padding_mode, align_corners)
    iz = _source_coord(grid[..., 2], d, padding_mode, align_corners)
    flat = x.reshape(n, c, d * h * w)

    def tap(zz, yy, xx):
        inside = (xx >= 0) & (xx < w) & (yy >= 0) & (yy < h) & (zz >= 0) & (zz < d)
        idx = ((jnp.clip(zz, 0, d - 1) * h + jnp.clip(yy, 0, h - 1)) * w
               + jnp.clip(xx, 0, w - 1)).astype(jnp.int32)
        idx = jnp.broadcast_to(idx.reshape(n, 1, -1), (n, c, idx[0].size))
        v = jnp.take_along_axis(flat, idx, axis=2).reshape((n, c) + zz.shape[1:])
        return jnp.where(inside[:, None], v, 0)

    if interpolation_mode == 1:
        return tap(jnp.round(iz), jnp.round(iy), jnp.round(ix))
    x0, y0, z0 = jnp.floor(ix), jnp.floor(iy), jnp.floor(iz)
    wx, wy, wz = (ix - x0)[:, None], (iy - y0)[:, None], (iz - z0)[:, None]
    out = 0
    for dz in (0, 1):
        for dy in (0, 1):
            for dx in (0, 1):
                wgt = (wx if dx else 1 - wx) * (wy if dy else 1 - wy) * (wz if dz else 1 - wz)
                out = out + tap(z0 + dz, y0 + dy, x0 + dx) * wgt
    return out


register(aten.grid_sampler_3d.default, may_refuse=True)(_grid_sample_3d)


register(aten.grid_sampler_3d_backward.default, may_refuse=True)(
    _grid_sampler_backward(_grid_sample_3d))


# ---- embedding bags and renorm -------------------------------------------------------

def _bags(indices, offsets, include_last_offset):
    nb = offsets.shape[0] - (1 if include_last_offset else 0)
    pos = jnp.arange(indices.shape[0])
    bag = jnp.searchsorted(offsets[:nb] if include_last_offset else offsets, pos,
                           side="right") - 1
    if include_last_offset:
        bag = jnp.where(pos >= offsets[-1], nb, bag)  # past the last bag: dropped
    return nb, jnp.clip(bag, 0, nb)


def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    nb, bag = _bags(indices, offsets, include_last_offset)
    keep = (indices != padding_idx) if padding_idx is not None and padding_idx >= 0 else \
        jnp.ones(indices.shape, bool)
    keep = keep & (bag < nb) & (bag >= 0)
    rows = weight[indices]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    seg = jnp.where(keep, bag, nb)
    count = jax.ops.segment_sum(keep.astype(jnp.int64), seg, nb + 1)[:nb]
    dim = weight.shape[1]
    if mode == 2:  # max
        low = -jnp.inf if is_float(rows) else jnp.iinfo(rows.dtype).min
        vals = jnp.where(keep[:, None], rows, low)
        out = jax.ops.segment_max(vals, seg, nb + 1)[:nb]
        out = jnp.where(count[:, None] > 0, out, 0)
        # which index gave each max (first in the bag)
        hit = (vals == out[bag.clip(0, nb - 1)]) & keep[:, None]
        cand = jnp.where(hit, jnp.arange(indices.shape[0])[:, None], indices.shape[0])
        first = jax.ops.segment_min(cand, seg, nb + 1)[:nb]
        max_idx = jnp.where(count[:, None] > 0,
                            indices[jnp.clip(first, 0, max(indices.shape[0] - 1, 0))], -1) \
            if indices.shape[0] else jnp.full((nb, dim), -1, indices.dtype)
    else:
        out = jax.ops.segment_sum(jnp.where(keep[:, None], rows, 0), seg, nb + 1)[:nb]
        if mode == 1:
            out = jnp.where(count[:, None] > 0, out / jnp.maximum(count, 1)[:, None], 0)
        max_idx = jnp.zeros((0,), indices.dtype)
    offset2bag = bag.astype(indices.dtype)
    bag_size = count.astype(indices.dtype)
    if include_last_offset:  # torch keeps one bag_size entry per offset
        bag_size = jnp.concatenate([bag_size, jnp.zeros((1,), bag_size.dtype)])
    return out.astype(weight.dtype), offset2bag, bag_size, max_idx


register(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)(_embedding_bag)


@register(aten._embedding_bag_dense_backward.default)
def _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                  num_weights, scale_grad_by_freq, mode, per_sample_weights,
                                  padding_idx=-1):
    dim = grad.shape[1]
    keep = (indices != padding_idx) if padding_idx is not None and padding_idx >= 0 else \
        jnp.ones(indices.shape, bool)
    nb = grad.shape[0]
    keep = keep & (offset2bag < nb)
    out = jnp.zeros((num_weights, dim), grad.dtype)
    if mode == 2:
        mi = maximum_indices
        valid = mi >= 0
        cols = jnp.broadcast_to(jnp.arange(dim), mi.shape)
        return out.at[jnp.where(valid, mi, 0), cols].add(jnp.where(valid, grad, 0))
    g = grad[jnp.clip(offset2bag, 0, nb - 1)]
    if mode == 1:
        g = g / jnp.maximum(bag_size[jnp.clip(offset2bag, 0, nb - 1)], 1)[:, None].astype(g.dtype)
    if per_sample_weights is not None:
        g = g * per_sample_weights[:, None].astype(g.dtype)
    if scale_grad_by_freq:
        freq = jnp.zeros((num_weights,), g.dtype).at[indices].add(1)
        g = g / freq[indices][:, None]
    return out.at[indices].add(jnp.where(keep[:, None], g, 0))


@register(aten._embedding_bag_per_sample_weights_backward.default)
def _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode,
                                               padding_idx=-1):
    nb = grad.shape[0]
    g = grad[jnp.clip(offset2bag, 0, nb - 1)]
    out = jnp.sum(g * weight[indices], axis=-1)
    keep = (indices != padding_idx) if padding_idx is not None and padding_idx >= 0 else \
        jnp.ones(indices.shape, bool)
    return jnp.where(keep & (offset2bag < nb), out, 0).astype(grad.dtype)


@register(aten.embedding_renorm.default)
def embedding_renorm(weight, indices, max_norm, norm_type):
    idx = indices.reshape(-1)
    rows = upcast(weight[idx])
    norm = jnp.sum(jnp.abs(rows) ** norm_type, axis=-1) ** (1.0 / norm_type)
    scale = jnp.where(norm > max_norm, max_norm / (norm + 1e-7), 1.0)
    return weight.at[idx].set((rows * scale[:, None]).astype(weight.dtype))


# ---- rrelu -----------------------------------------------------------------------------

@register(aten.rrelu_with_noise_functional.default, random=True)
def rrelu_with_noise_functional(x, noise, lower=0.125, upper=1.0 / 3.0, training=False,
                                generator=None, *, rng):
    if not training:
        slope = (lower + upper) / 2
        return jnp.where(x >= 0, x, x * slope).astype(x.dtype), noise
    r = jax.random.uniform(rng, x.shape, upcast(x).dtype, lower, upper).astype(x.dtype)
    new_noise = jnp.where(x >= 0, jnp.ones_like(x), r)
    return x * new_noise, new_noise.astype(noise.dtype)


# ---- _trilinear (nn.functional.bilinear) --------------------------------------------

@register(aten._trilinear.default)
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    def expand(t, dims):
        for d in sorted(dims):
            t = jnp.expand_dims(t, d)
        return t
    a, b, c = expand(i1, expand1), expand(i2, expand2), expand(i3, expand3)
    out = a * b
    out = jnp.sum(out * c, axis=tuple(sumdim)) if sumdim else out * c
    return out
