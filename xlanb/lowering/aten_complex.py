"""Complex numbers: construction from parts, polar form, angle, conjugation, and
views between complex and real pairs."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from xlanb.lowering._util import aten, to_float
from xlanb.lowering.registry import register


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
