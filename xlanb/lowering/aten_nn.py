"""Softmax, normalization layers, losses, embedding and dropout backward.

Statistics are computed in float32 for half/bfloat16 inputs, as torch does.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xlanb.lowering._util import aten, take, upcast, wrap
from xlanb.lowering.registry import register

# ---- softmax ------------------------------------------------------------------


@register(aten._softmax.default)
def _softmax(x, dim, half_to_float=False):
    return jax.nn.softmax(upcast(x), axis=wrap(dim, x.ndim))


@register(aten._log_softmax.default)
def _log_softmax(x, dim, half_to_float=False):
    return jax.nn.log_softmax(upcast(x), axis=wrap(dim, x.ndim))


@register(aten._safe_softmax.default)
def _safe_softmax(x, dim, dtype=None):
    # Rows that are entirely -inf (fully masked attention) give 0, not NaN. With softmax's
    # two reductions only: such a row's max (-inf) is taken as 0, so its exps and their
    # sum are 0, and the sum is divided as 1. An all() over the row and a select after
    # softmax made a third pass (21 optimized instructions per attention layer).
    x = upcast(x)
    dim = wrap(dim, x.ndim)
    m = jnp.max(x, axis=dim, keepdims=True)
    e = jnp.exp(x - jnp.where(m == -jnp.inf, 0.0, m))
    s = jnp.sum(e, axis=dim, keepdims=True)
    return e / jnp.where(s == 0, 1.0, s)


@register(aten._softmax_backward_data.default)
def _softmax_backward_data(g, y, dim, input_dtype):
    g, y = upcast(g), upcast(y)
    return y * (g - jnp.sum(g * y, axis=dim, keepdims=True))


@register(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(g, y, dim, input_dtype):
    g, y = upcast(g), upcast(y)
    return g - jnp.exp(y) * jnp.sum(g, axis=dim, keepdims=True)


# ---- normalization ------------------------------------------------------------

def _normalize_backward(dxhat, xhat, rstd, axes):
    """d/dx of xhat = (x - mean(x)) * rstd(x) over `axes`, given d/dxhat."""
    m1 = jnp.mean(dxhat, axis=axes, keepdims=True)
    m2 = jnp.mean(dxhat * xhat, axis=axes, keepdims=True)
    return rstd * (dxhat - m1 - xhat * m2)


def _affine(xhat, weight, bias, shape):
    if weight is not None:
        xhat = xhat * weight.reshape(shape)
    if bias is not None:
        xhat = xhat + bias.reshape(shape)
    return xhat


def _param_grads(g, xhat, axes, output_mask):
    """Weight and bias grads, as far as output_mask asks for them."""
    gw = jnp.sum(g * xhat, axis=axes) if output_mask[1] else None
    gb = jnp.sum(g, axis=axes) if output_mask[2] else None
    return gw, gb


@register(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = upcast(x)
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = _affine((xf - mean) * rstd, weight, bias, normalized_shape)
    return out, mean, rstd  # mean/rstd keep size-1 normalized dims, like torch


@register(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(g, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    k = x.ndim - len(normalized_shape)
    axes, batch_axes = tuple(range(k, x.ndim)), tuple(range(k))
    g, xf = upcast(g), upcast(x)
    xhat = (xf - mean) * rstd
    dx = None
    if output_mask[0]:
        dxhat = g * weight if weight is not None else g
        dx = _normalize_backward(dxhat, xhat, rstd, axes)
    gw, gb = _param_grads(g, xhat, batch_axes, output_mask)
    return dx, gw, gb


@register(aten._fused_rms_norm.default)
def _fused_rms_norm(x, normalized_shape, weight, eps=None):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = upcast(x)
    if eps is None:
        eps = jnp.finfo(xf.dtype).eps
    rstd = lax.rsqrt(jnp.mean(xf * xf, axis=axes, keepdims=True) + eps)
    out = xf * rstd
    return (out * weight if weight is not None else out), rstd


@register(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    xg = upcast(x).reshape(N, group, -1)
    mean = jnp.mean(xg, axis=-1, keepdims=True)
    rstd = lax.rsqrt(jnp.mean(jnp.square(xg - mean), axis=-1, keepdims=True) + eps)
    xhat = ((xg - mean) * rstd).reshape(x.shape)
    out = _affine(xhat, weight, bias, (1, C) + (1,) * (x.ndim - 2))
    return out, mean[..., 0], rstd[..., 0]


@register(aten.native_group_norm_backward.default)
def native_group_norm_backward(g, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    shape_c = (1, C) + (1,) * (x.ndim - 2)
    g = upcast(g)
    xg = upcast(x).reshape(N, group, -1)
    rstd_g = rstd[..., None]
    xhat_g = (xg - mean[..., None]) * rstd_g
    dx = None
    if output_mask[0]:
        dxhat = g * weight.reshape(shape_c) if weight is not None else g
        dx = _normalize_backward(dxhat.reshape(N, group, -1), xhat_g, rstd_g, (-1,))
        dx = dx.reshape(x.shape)
    gw, gb = _param_grads(g, xhat_g.reshape(x.shape), (0,) + tuple(range(2, x.ndim)),
                          output_mask)
    return dx, gw, gb


def _bn_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _bn_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


def _bn_batch_stats(x, eps):
    axes = _bn_axes(x)
    mean = jnp.mean(x, axis=axes)
    var = jnp.mean(jnp.square(x - mean.reshape(_bn_shape(x))), axis=axes)  # biased
    return mean, var, lax.rsqrt(var + eps)


def _bn_apply(x, mean, invstd, weight, bias):
    s = _bn_shape(x)
    return _affine((x - mean.reshape(s)) * invstd.reshape(s), weight, bias, s)


def _bn(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Returns out, save_mean, save_invstd, new_running_mean, new_running_var."""
    xf = upcast(x)
    if training:
        mean, var, invstd = _bn_batch_stats(xf, eps)
        new_rm = new_rv = None
        if running_mean is not None:
            n = x.size // x.shape[1]
            new_rm = (1 - momentum) * running_mean + momentum * mean
            new_rv = (1 - momentum) * running_var + momentum * var * (n / max(n - 1, 1))
        return _bn_apply(xf, mean, invstd, weight, bias), mean, invstd, new_rm, new_rv
    invstd = lax.rsqrt(upcast(running_var) + eps)
    out = _bn_apply(xf, upcast(running_mean), invstd, weight, bias)
    return out, running_mean, invstd, running_mean, running_var


@register(aten._native_batch_norm_legit_functional.default)
def _native_batch_norm_legit_functional(x, weight, bias, running_mean, running_var, training,
                                        momentum, eps):
    return _bn(x, weight, bias, running_mean, running_var, training, momentum, eps)


@register(aten._native_batch_norm_legit_no_training.default)
def _native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum,
                                         eps):
    return _bn(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@register(aten._native_batch_norm_legit.no_stats)
def _native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    return _bn(x, weight, bias, None, None, True, momentum, eps)[:3]


@register(aten.native_batch_norm.default, may_refuse=True)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training and running_mean is not None:
        # This op updates the running stats in place without saying so in its schema,
        # which a functional lowering cannot do.
        raise NotImplementedError(
            "aten.native_batch_norm in training mode updates running_mean/running_var in "
            "place although its schema does not say so: run it as "
            "_native_batch_norm_legit_functional and write the new stats back")
    return _bn(x, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@register(aten._batch_norm_with_update_functional.default)
def _batch_norm_with_update_functional(x, weight, bias, running_mean, running_var, momentum,
                                       eps):
    out, m, s, rm, rv = _bn(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, m, s, jnp.zeros((0,), jnp.uint8), rm, rv


@register(aten._batch_norm_no_update.default)
def _batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    training = running_mean is None  # no running stats: normalize with batch stats
    out, m, s, _, _ = _bn(x, weight, bias, running_mean, running_var, training, momentum, eps)
    return out, m, s, jnp.zeros((0,), jnp.uint8)


@register(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(g, x, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    g, xf = upcast(g), upcast(x)
    s, axes = _bn_shape(x), _bn_axes(x)
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        mean, invstd = running_mean, lax.rsqrt(upcast(running_var) + eps)
    mean, invstd = upcast(mean).reshape(s), upcast(invstd).reshape(s)
    xhat = (xf - mean) * invstd
    dx = None
    if output_mask[0]:
        dxhat = g * weight.reshape(s) if weight is not None else g
        dx = _normalize_backward(dxhat, xhat, invstd, axes) if train else dxhat * invstd
    gw, gb = _param_grads(g, xhat, axes, output_mask)
    return dx, gw, gb


@register(aten.batch_norm_backward.default)
def batch_norm_backward(g, x, weight, running_mean, running_var, save_mean, save_var, update,
                        eps, output_mask, reserve):
    # save_var holds the saved inverse std, as in native_batch_norm_backward.
    return native_batch_norm_backward(g, x, weight, running_mean, running_var, save_mean,
                                      save_var, update, eps, output_mask)


@register(aten._weight_norm_interface_backward.default)
def _weight_norm_interface_backward(grad_w, v, g, norms, dim):
    """w = g * v / |v| (the norm over every dim but ``dim``), as CPU torch's kernel
    differentiates it: grad_g = <grad_w, v> / |v|, grad_v = g / |v| * (grad_w - v *
    <grad_w, v> / |v|^2) (wav2vec2's and HuBERT's positional convolution)."""
    axes = tuple(i for i in range(v.ndim) if i != wrap(dim, v.ndim))
    gw, v32, g32, n = (upcast(t) for t in (grad_w, v, g, norms))
    dot = jnp.sum(gw * v32, axis=axes, keepdims=True).reshape(n.shape)
    grad_v = (g32 / n) * gw - (g32 * dot / (n * n * n)) * v32
    return grad_v, dot / n


# ---- losses -------------------------------------------------------------------

def _nll_parts(x, target, weight, ignore_index):
    """Class axis, validity mask, safe target and per-element weights."""
    cdim = 0 if x.ndim == 1 else 1
    valid = target != ignore_index
    t = jnp.where(valid, target, 0)
    w = jnp.ones(t.shape, upcast(x).dtype) if weight is None else upcast(weight)[t]
    return cdim, valid, t, jnp.where(valid, w, 0)


@register(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    cdim, valid, t, w = _nll_parts(x, target, weight, ignore_index)
    picked = jnp.squeeze(jnp.take_along_axis(upcast(x), jnp.expand_dims(t, cdim), axis=cdim), cdim)
    losses = jnp.where(valid, -picked * w, 0)
    total = jnp.sum(w)
    if reduction == 0:  # torch reports a total weight only for a single (1-d) sample
        return losses, total if x.ndim == 1 else jnp.zeros((), total.dtype)
    loss = jnp.sum(losses)
    return (loss / total if reduction == 1 else loss), total  # all ignored: 0/0 = nan, as torch


@register(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(g, x, target, weight, reduction, ignore_index, total_weight):
    cdim, valid, t, w = _nll_parts(x, target, weight, ignore_index)
    g = upcast(g)
    scale = -w * g
    if reduction == 1:
        scale = scale / total_weight
    scale = jnp.where(valid, scale, 0)  # also keeps ignored rows free of 0/0
    classes = lax.broadcasted_iota(t.dtype, x.shape, cdim)
    return jnp.where(classes == jnp.expand_dims(t, cdim), jnp.expand_dims(scale, cdim), 0)


def _reduce(loss, reduction):
    return loss if reduction == 0 else jnp.mean(loss) if reduction == 1 else jnp.sum(loss)


@register(aten.mse_loss.default)
def mse_loss(x, target, reduction=1):
    return _reduce(jnp.square(upcast(x) - upcast(target)), reduction)


@register(aten.mse_loss_backward.default)
def mse_loss_backward(g, x, target, reduction):
    grad = 2 * (upcast(x) - upcast(target)) * upcast(g)
    return grad / x.size if reduction == 1 else grad


@register(aten.binary_cross_entropy.default)
def binary_cross_entropy(x, target, weight=None, reduction=1):
    x, target = upcast(x), upcast(target)
    # torch clamps the logs at -100 so that 0 and 1 inputs stay finite.
    log_x, log_1mx = jnp.maximum(jnp.log(x), -100), jnp.maximum(jnp.log1p(-x), -100)
    loss = -(target * log_x + (1 - target) * log_1mx)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@register(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(g, x, target, weight=None, reduction=1):
    x, target = upcast(x), upcast(target)
    grad = upcast(g) * (x - target) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        grad = grad * weight
    return grad / x.size if reduction == 1 else grad


# ---- embedding and dropout ------------------------------------------------------

@register(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return take(weight, indices, axis=0)


@register(aten.embedding_dense_backward.default)
def embedding_dense_backward(g, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = indices.reshape(-1)
    g = upcast(g).reshape(idx.shape[0], -1)
    if padding_idx >= 0:
        g = jnp.where((idx == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[idx].add(1)
        g = g / counts[idx][:, None]
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[idx].add(g)


@register(aten.native_dropout_backward.default)
def native_dropout_backward(g, mask, scale):
    return g * mask * scale


# ---- pairwise distances ---------------------------------------------------------

def _pnorm(d, p):
    """p-norm over the last axis; zero distances get zero gradients, like torch."""
    a = d * jnp.sign(d)  # |d| whose gradient at 0 is 0 (sign), not 1
    if p == 0:
        return jnp.sum(d != 0, axis=-1).astype(d.dtype)
    if p == math.inf:
        return jnp.max(a, axis=-1)
    if p == 1:
        return jnp.sum(a, axis=-1)
    s = jnp.sum(d * d if p == 2 else a ** p, axis=-1)
    nonzero = s > 0
    return jnp.where(nonzero, jnp.where(nonzero, s, 1) ** (1 / p), 0)


def _cdist(x1, x2, p):
    return _pnorm(upcast(x1)[..., :, None, :] - upcast(x2)[..., None, :, :], p)


def _pdist(x, p):
    i, j = np.triu_indices(x.shape[0], 1)
    x = upcast(x)
    return _pnorm(x[i] - x[j], p)


@register(aten._cdist_forward.default, static_floats=True)
def _cdist_forward(x1, x2, p, compute_mode=None):
    return _cdist(x1, x2, p)


@register(aten._cdist_backward.default, static_floats=True)
def _cdist_backward(g, x1, x2, p, cdist):
    out, vjp = jax.vjp(lambda a: _cdist(a, x2, p), x1)
    return vjp(g.astype(out.dtype))[0]


@register(aten._pdist_forward.default, static_floats=True)
def _pdist_forward(x, p=2.0):
    return _pdist(x, p)


@register(aten._pdist_backward.default, static_floats=True)
def _pdist_backward(g, x, p, pdist):
    out, vjp = jax.vjp(lambda a: _pdist(a, p), x)
    return vjp(g.astype(out.dtype))[0]
