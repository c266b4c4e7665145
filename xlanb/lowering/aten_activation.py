"""Activation functions and the backward ops autograd emits for them.

Half/bfloat16 inputs are computed in float32 (as torch does); the caller casts
results back to torch's dtype.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from xlanb.lowering._util import aten, upcast
from xlanb.lowering.registry import register


def _vjp(f, x, g):
    """Gradient of an elementwise f at x, for backward ops without a neat formula."""
    x, g = upcast(x), upcast(g)
    return jax.vjp(f, x)[1](g.astype(x.dtype))[0]


@register(aten.relu.default)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))  # keeps NaN, like torch


@register(aten.threshold.default)
def threshold(x, threshold, value):
    return jnp.where(x > threshold, x, value)


@register(aten.threshold_backward.default)
def threshold_backward(g, x, threshold):
    return jnp.where(x > threshold, g, jnp.zeros((), g.dtype))


@register(aten.gelu.default)
def gelu(x, *, approximate="none"):
    return jax.nn.gelu(upcast(x), approximate=approximate == "tanh")


@register(aten.gelu_backward.default)
def gelu_backward(g, x, *, approximate="none"):
    g, x = upcast(g), upcast(x)
    if approximate == "tanh":
        k_beta, k_kappa = math.sqrt(2 / math.pi), 0.044715
        t = jnp.tanh(k_beta * (x + k_kappa * x ** 3))
        dt = (1 - t * t) * k_beta * (1 + 3 * k_kappa * x * x)
        return g * (0.5 * (1 + t) + 0.5 * x * dt)
    cdf = 0.5 * (1 + jax.lax.erf(x * (1 / math.sqrt(2))))
    pdf = jnp.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
    return g * (cdf + x * pdf)


@register(aten.silu.default)
def silu(x):
    return jax.nn.silu(upcast(x))


@register(aten.silu_backward.default)
def silu_backward(g, x):
    g, x = upcast(g), upcast(x)
    s = jax.nn.sigmoid(x)
    return g * s * (1 + x * (1 - s))


# tanh/sigmoid backward receive the forward *output*.
register(aten.tanh_backward.default)(lambda g, y: upcast(g) * (1 - upcast(y) ** 2))
register(aten.sigmoid_backward.default)(
    lambda g, y: upcast(g) * upcast(y) * (1 - upcast(y)))


@register(aten.elu.default)
def elu(x, alpha=1, scale=1, input_scale=1):
    x = upcast(x)
    return jnp.where(x > 0, x * scale, jnp.expm1(x * input_scale) * (alpha * scale))


@register(aten.elu_backward.default)
def elu_backward(g, alpha, scale, input_scale, is_result, self_or_result):
    g, v = upcast(g), upcast(self_or_result)
    if is_result:  # v is the output: d/dx = input_scale * (y + alpha*scale) where y <= 0
        neg = g * input_scale * (v + alpha * scale)
    else:
        neg = g * input_scale * alpha * scale * jnp.exp(v * input_scale)
    return jnp.where(v > 0, g * scale, neg)


@register(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@register(aten.leaky_relu_backward.default)
def leaky_relu_backward(g, x, negative_slope, self_is_result):
    return jnp.where(x > 0, g, g * negative_slope)


@register(aten.hardtanh.default)
def hardtanh(x, min_val=-1, max_val=1):
    return jnp.minimum(jnp.maximum(x, min_val), max_val)


@register(aten.hardtanh_backward.default)
def hardtanh_backward(g, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros((), g.dtype), g)


@register(aten.softplus.default)
def softplus(x, beta=1, threshold=20):
    x = upcast(x)
    xb = x * beta
    # Linear above the threshold, like torch (also avoids exp overflow).
    return jnp.where(xb > threshold, x, jnp.log1p(jnp.exp(jnp.minimum(xb, threshold))) / beta)


@register(aten.softplus_backward.default)
def softplus_backward(g, x, beta, threshold):
    g, x = upcast(g), upcast(x)
    xb = x * beta
    return jnp.where(xb > threshold, g, g * jax.nn.sigmoid(jnp.minimum(xb, threshold)))


def _mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


register(aten.mish.default)(lambda x: _mish(upcast(x)))
register(aten.mish_backward.default)(lambda g, x: _vjp(_mish, x, g))


@register(aten.hardsigmoid.default)
def hardsigmoid(x):
    return jnp.clip(upcast(x) + 3, 0, 6) / 6


@register(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(g, x):
    return jnp.where((x > -3) & (x < 3), upcast(g) / 6, 0)


@register(aten.hardswish.default)
def hardswish(x):
    x = upcast(x)
    return x * jnp.clip(x + 3, 0, 6) / 6


@register(aten.hardswish_backward.default)
def hardswish_backward(g, x):
    g, x = upcast(g), upcast(x)
    return jnp.where(x < -3, 0, jnp.where(x <= 3, g * (x / 3 + 0.5), g))


@register(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(x):
    x = upcast(x)
    return jax.nn.log_sigmoid(x), jnp.zeros_like(x)  # buffer is unused by our backward


@register(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(g, x, buffer):
    return upcast(g) * jax.nn.sigmoid(-upcast(x))


def _glu(x, dim):
    a, b = jnp.split(x, 2, axis=dim)
    return a * jax.nn.sigmoid(b)


register(aten.glu.default)(lambda x, dim=-1: _glu(upcast(x), dim))
register(aten.glu_backward.default)(
    lambda g, x, dim: jax.vjp(lambda v: _glu(v, dim), upcast(x))[1](upcast(g))[0])
