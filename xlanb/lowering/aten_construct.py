"""Tensors built from others or from ranges: block diagonals, diagonal embeddings,
``linspace``/``logspace`` with tensor ends, triangle indices."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from xlanb.lowering._util import aten, default_float, jdtype, wrap
from xlanb.lowering.registry import register


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


@register(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, **_):
    return jnp.asarray(np.stack(np.triu_indices(row, offset, col)), jdtype(dtype, jnp.int64))


@register(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, **_):
    return jnp.asarray(np.stack(np.tril_indices(row, offset, col)), jdtype(dtype, jnp.int64))
