"""FFTs: torch's three primitive transforms (everything in torch.fft maps onto them)."""
from __future__ import annotations

import math

import jax.numpy as jnp

from xlanb.lowering._util import aten
from xlanb.lowering.registry import register


def _scale(x, sizes, normalization):
    """torch's normalization codes: 0 none, 1 by 1/sqrt(n), 2 by 1/n."""
    n = math.prod(sizes)
    if normalization == 1:
        return x / math.sqrt(n)
    if normalization == 2:
        return x / n
    return x


@register(aten._fft_r2c.default)
def _fft_r2c(x, dim, normalization, onesided):
    # jnp's forward transforms are unscaled ("backward" norm).
    out = jnp.fft.rfftn(x, axes=dim) if onesided else jnp.fft.fftn(x, axes=dim)
    return _scale(out, [x.shape[d] for d in dim], normalization)


@register(aten._fft_c2c.default)
def _fft_c2c(x, dim, normalization, forward):
    # norm="forward" leaves jnp's inverse transform unscaled.
    out = jnp.fft.fftn(x, axes=dim) if forward else jnp.fft.ifftn(x, axes=dim, norm="forward")
    return _scale(out, [x.shape[d] for d in dim], normalization)


@register(aten._fft_c2r.default)
def _fft_c2r(x, dim, normalization, last_dim_size):
    sizes = [x.shape[d] for d in dim[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(x, s=sizes, axes=dim, norm="forward")
    return _scale(out, sizes, normalization)
