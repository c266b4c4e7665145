"""Comparisons that answer a bool, complex helpers, histograms, medians, segment and
index reductions, and other ops whose outputs have static shapes even though their
values depend on the data (so they lower, instead of running on CPU torch)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xlanb.lowering._util import aten, default_float, is_float, jdtype, to_float, wrap
from xlanb.lowering.aten_indexing import _reduce_identity
from xlanb.lowering.registry import register


# ---- whole-tensor comparisons ---------------------------------------------------------

# equal/allclose answer a Python bool, which the core cannot yet produce from a device
# value (the meta kernel has no value to give): they run on CPU torch until it can.
def equal(a, b):
    if a.shape != b.shape:
        return jnp.asarray(False)
    return jnp.all(a == b)


def allclose(a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
    dt = jnp.result_type(a, b)
    a, b = a.astype(dt), b.astype(dt)
    return jnp.all(jnp.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan))


# ---- complex numbers ------------------------------------------------------------------

@register(aten.complex.default)
def complex_(real, imag):
    return lax.complex(*jnp.broadcast_arrays(real, imag))


@register(aten.polar.default)
def polar(abs_, angle):
    abs_, angle = jnp.broadcast_arrays(abs_, angle)
    return lax.complex(abs_ * jnp.cos(angle), abs_ * jnp.sin(angle))


@register(aten.angle.default)
def angle(x):
    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    x = to_float(x)
    # torch: pi for negatives, 0 otherwise, NaN stays NaN
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0).astype(x.dtype))


@register(aten._conj.default, aten.conj_physical.default, aten._conj_physical.default)
def conj(x):
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@register(aten.view_as_complex.default)
def view_as_complex(x):
    return lax.complex(x[..., 0], x[..., 1])


@register(aten.view_as_real.default)
def view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


# ---- pointwise ----------------------------------------------------------------------

@register(aten.frexp.Tensor)
def frexp(x):
    m, e = jnp.frexp(x)
    return m, e.astype(jnp.int32)


@register(aten.nextafter.default)
def nextafter(a, b):
    return jnp.nextafter(a, b)


@register(aten.special_xlog1py)
def xlog1py(x, y):
    x, y = jnp.asarray(x), jnp.asarray(y)
    dt = jnp.result_type(x, y)
    if not jnp.issubdtype(dt, jnp.inexact):
        dt = default_float()
    x, y = x.astype(dt), y.astype(dt)
    out = x * jnp.log1p(y)
    return jnp.where(jnp.isnan(y), jnp.nan, jnp.where(x == 0, 0.0, out))


@register(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    elements, test = jnp.asarray(elements), jnp.asarray(test_elements).reshape(-1)
    dt = jnp.result_type(elements, test)
    hit = jnp.any(elements.astype(dt)[..., None] == test.astype(dt), axis=-1)
    return ~hit if invert else hit


@register(aten.numpy_T.default)
def numpy_T(x):  # noqa: N802  (torch's name)
    return jnp.transpose(x)


# ---- construction ---------------------------------------------------------------------

@register(aten.block_diag.default)
def block_diag(tensors):
    mats = [t.reshape(1, -1) if t.ndim == 1 else t.reshape(1, 1) if t.ndim == 0 else t
            for t in tensors]
    dt = jnp.result_type(*mats)
    rows = sum(m.shape[0] for m in mats)
    cols = sum(m.shape[1] for m in mats)
    out = jnp.zeros((rows, cols), dt)
    r = c = 0
    for m in mats:
        out = lax.dynamic_update_slice(out, m.astype(dt), (r, c)) if m.size else out
        r, c = r + m.shape[0], c + m.shape[1]
    return out


@register(aten.diag_embed.default)
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    nd = x.ndim + 1
    d1, d2 = wrap(dim1, nd), wrap(dim2, nd)
    n = x.shape[-1] + abs(offset)
    i = np.arange(x.shape[-1])
    out = jnp.zeros(x.shape[:-1] + (n, n), x.dtype)
    out = out.at[..., i + max(-offset, 0), i + max(offset, 0)].set(x)
    # out's last two dims go to (d1, d2), the batch dims keep their order around them
    if d1 > d2:
        out = jnp.swapaxes(out, -1, -2)
        d1, d2 = d2, d1
    return jnp.moveaxis(out, (-2, -1), (d1, d2))


def _linspace_t(start, end, steps):
    start = jnp.asarray(start, jnp.float64)
    end = jnp.asarray(end, jnp.float64)
    i = jnp.arange(steps, dtype=jnp.float64)
    if steps == 1:
        return jnp.reshape(start, (1,))
    step = (end - start) / (steps - 1)
    return jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))


def _space_dtype(dtype, start, end):
    if dtype is not None:
        return jdtype(dtype)
    return default_float()


@register(aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor)
def linspace_t(start, end, steps, *, dtype=None, **_):
    dt = _space_dtype(dtype, start, end)
    out = _linspace_t(start, end, steps)
    if jnp.issubdtype(dt, jnp.integer):
        # torch computes integer linspaces in integer steps of the float step
        return out.astype(dt)
    return out.astype(dt)


@register(aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor)
def logspace_t(start, end, steps, base=10.0, *, dtype=None, **_):
    dt = _space_dtype(dtype, start, end)
    return (jnp.asarray(base, jnp.float64) ** _linspace_t(start, end, steps)).astype(dt)


# ---- medians and modes -------------------------------------------------------------

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


# ---- index reductions -------------------------------------------------------------------

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


# ---- histograms -------------------------------------------------------------------------

def _bin_index(x, lo, hi, nbins, edges):
    """torch's bin search: linear interpolation, then one step to either side against
    the edges; x == hi falls in the last bin; outside [lo, hi] is -1."""
    pos = jnp.floor((x - lo) * nbins / (hi - lo)).astype(jnp.int64)
    pos = jnp.clip(pos, 0, nbins - 1)
    pos = jnp.where(edges[pos] > x, pos - 1, pos)
    pos = jnp.where(edges[jnp.clip(pos + 1, 0, nbins)] <= x, pos + 1, pos)
    pos = jnp.clip(pos, 0, nbins - 1)
    inside = (x >= lo) & (x <= hi)
    return jnp.where(inside, pos, -1)


def _edges_from_range(x, rng, nbins, pad):
    if rng is not None:
        lo = jnp.asarray(rng[0], jnp.float64)
        hi = jnp.asarray(rng[1], jnp.float64)
    elif x.size:
        lo, hi = jnp.min(x).astype(jnp.float64), jnp.max(x).astype(jnp.float64)
    else:
        lo = hi = jnp.zeros((), jnp.float64)
    same = lo == hi
    lo, hi = jnp.where(same, lo - pad, lo), jnp.where(same, hi + pad, hi)
    return lo, hi


def _hist(idx, nbins, weight, dtype):
    w = jnp.ones(idx.shape, dtype) if weight is None else weight.reshape(-1).astype(dtype)
    w = jnp.where(idx >= 0, w, 0)
    return jnp.zeros((nbins,), dtype).at[jnp.where(idx >= 0, idx, 0)].add(w)


@register(aten.histc.default)
def histc(x, bins=100, min=0, max=0):  # noqa: A002  (torch's argument names)
    xf = x.reshape(-1)
    lo = jnp.asarray(min, jnp.float64)
    hi = jnp.asarray(max, jnp.float64)
    auto = (lo == 0) & (hi == 0)
    if xf.size:
        lo = jnp.where(auto, jnp.min(xf).astype(jnp.float64), lo)
        hi = jnp.where(auto, jnp.max(xf).astype(jnp.float64), hi)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    lo_t, hi_t = lo.astype(x.dtype), hi.astype(x.dtype)
    edges = _linspace_t(lo_t, hi_t, bins + 1).astype(x.dtype)
    idx = _bin_index(xf, lo_t, hi_t, bins, edges)
    return _hist(idx, bins, None, x.dtype)


def _density(hist, edges_list):
    total = jnp.sum(hist)
    out = hist / total
    for d, e in enumerate(edges_list):
        widths = jnp.diff(e)
        out = out / widths.reshape((1,) * d + (-1,) + (1,) * (hist.ndim - d - 1))
    return out


@register(aten.histogram.bin_ct)
def histogram(x, bins=100, *, range=None, weight=None, density=False):  # noqa: A002
    xf = x.reshape(-1)
    lo, hi = _edges_from_range(xf, range, bins, 0.5)
    edges = _linspace_t(lo.astype(x.dtype), hi.astype(x.dtype), bins + 1).astype(x.dtype)
    idx = _bin_index(xf, edges[0], edges[-1], bins, edges)
    hist = _hist(idx, bins, weight, x.dtype)
    return (_density(hist, [edges]) if density else hist), edges


def _search_bins(x, edges):
    nb = edges.shape[0] - 1
    pos = jnp.searchsorted(edges, x, side="right") - 1
    pos = jnp.where(x == edges[-1], nb - 1, pos)
    inside = (x >= edges[0]) & (x <= edges[-1])
    return jnp.where(inside, pos, -1)


@register(aten.histogram.bins_tensor)
def histogram_bins(x, bins, *, weight=None, density=False):
    xf = x.reshape(-1)
    idx = _search_bins(xf, bins)
    hist = _hist(idx, bins.shape[0] - 1, weight, x.dtype)
    return (_density(hist, [bins]) if density else hist), bins


def _dd_edges(x, bins, rng):
    d = x.shape[-1]
    pts = x.reshape(-1, d)
    edges = []
    for k in range(d):
        r = None if rng is None else (rng[2 * k], rng[2 * k + 1])
        lo, hi = _edges_from_range(pts[:, k], r, bins[k], 0.5)
        edges.append(_linspace_t(lo.astype(x.dtype), hi.astype(x.dtype), bins[k] + 1).astype(x.dtype))
    return edges


def _dd_hist(x, edges, weight, density, linear):
    d = x.shape[-1]
    pts = x.reshape(-1, d)
    nbins = [e.shape[0] - 1 for e in edges]
    flat = jnp.zeros(pts.shape[0], jnp.int64)
    valid = jnp.ones(pts.shape[0], bool)
    for k, e in enumerate(edges):
        idx = _bin_index(pts[:, k], e[0], e[-1], nbins[k], e) if linear else _search_bins(pts[:, k], e)
        valid &= idx >= 0
        flat = flat * nbins[k] + jnp.maximum(idx, 0)
    size = int(np.prod(nbins))
    w = jnp.ones(flat.shape, x.dtype) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros((size,), x.dtype).at[flat].add(jnp.where(valid, w, 0)).reshape(tuple(nbins))
    return _density(hist, edges) if density else hist


@register(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):  # noqa: A002
    return _dd_edges(x, bins, range)


@register(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):  # noqa: A002
    return _dd_hist(x, _dd_edges(x, bins, range), weight, density, True)


@register(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    return _dd_hist(x, list(bins), weight, density, False)


@register(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, **_):
    return jnp.asarray(np.stack(np.triu_indices(row, offset, col)), jdtype(dtype, jnp.int64))


@register(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, **_):
    return jnp.asarray(np.stack(np.tril_indices(row, offset, col)), jdtype(dtype, jnp.int64))


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
