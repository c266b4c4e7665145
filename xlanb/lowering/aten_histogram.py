"""Histograms: ``histc``, ``histogram`` by bin count or edges, ``histogramdd``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xlanb.lowering._util import aten
from xlanb.lowering.aten_construct import _linspace_t
from xlanb.lowering.registry import register


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
    # torch's histc (CPU and CUDA kernels alike) maps x to its bin by division alone,
    # (x - min) * bins / (max - min) truncated, with no search against linspace edges
    # (that is histogram's algorithm). Integer input (CUDA, and so every MoE's
    # ``histc(expert_ids.int(), ...)`` off CPU) does that division in integers:
    # edges truncated to the integer dtype would move values into the next bin.
    # The range is the data's when min == max (not only when both are 0).
    xf = x.reshape(-1)
    integer = jnp.issubdtype(xf.dtype, jnp.integer)
    lo = jnp.asarray(min, jnp.float64)
    hi = jnp.asarray(max, jnp.float64)
    if integer:  # CUDA takes the limits in the input's dtype first
        lo, hi = jnp.trunc(lo), jnp.trunc(hi)
    auto = lo == hi
    if xf.size:
        lo = jnp.where(auto, jnp.min(xf).astype(jnp.float64), lo)
        hi = jnp.where(auto, jnp.max(xf).astype(jnp.float64), hi)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    lo_t, hi_t = lo.astype(x.dtype), hi.astype(x.dtype)
    if integer:
        wide = xf.astype(jnp.int64)
        pos = (wide - lo_t) * bins // (hi_t - lo_t).astype(jnp.int64)
    else:
        # The width goes in whole behind a barrier: divided by a broadcast scalar, XLA
        # multiplies by its reciprocal (1 ulp off in a third of the elements, see
        # docs/DESIGN.md), and an ulp at an edge moves a count to the next bin.
        width = jax.lax.optimization_barrier(jnp.broadcast_to(hi_t - lo_t, xf.shape))
        pos = jnp.trunc((xf - lo_t) * bins / width)
    pos = jnp.minimum(pos.astype(jnp.int64), bins - 1)  # x == max: the last bin
    inside = (xf >= lo_t) & (xf <= hi_t)
    return _hist(jnp.where(inside, pos, -1), bins, None, x.dtype)


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
