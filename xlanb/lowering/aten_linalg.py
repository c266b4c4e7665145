"""Matrix products and convolutions (forward and backward)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import torch

from xlanb.base.config import config
from xlanb.lowering._util import aten, ntuple
from xlanb.lowering.registry import register


# float32 products follow torch's own knobs, read at trace time: "highest" means
# full float32, "high" allows TF32 / 3-pass bf16, "medium" a single bf16 pass.
_PRECISION = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH,
              "medium": lax.Precision.DEFAULT}


# torch_xla's names (xlanb.config.mat_mul_precision, set by torch_xla.backends.
# set_mat_mul_precision): dots and convolutions alike, over torch's knobs
_XLA_PRECISION = {"default": lax.Precision.DEFAULT, "high": lax.Precision.HIGH,
                  "highest": lax.Precision.HIGHEST}


def _precision():
    if config.mat_mul_precision is not None:
        return _XLA_PRECISION[config.mat_mul_precision]
    return _PRECISION[torch.get_float32_matmul_precision()]


def _conv_precision():
    if config.mat_mul_precision is not None:
        return _XLA_PRECISION[config.mat_mul_precision]
    # torch lets cuDNN use TF32 for convolutions unless told otherwise.
    return lax.Precision.HIGH if torch.backends.cudnn.allow_tf32 else lax.Precision.HIGHEST


def _matmul(a, b):
    return jnp.matmul(a, b, precision=_precision())


def _scaled(x, s):
    if isinstance(s, (int, float)) and s == 1:
        return x
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        # integer tensors take alpha/beta converted to their dtype (0.6 -> 0), like torch
        return x * jnp.asarray(s).astype(x.dtype)
    return x * s


def _beta_input(x, beta):
    # beta == 0 ignores the input entirely (even NaN/inf), like torch. beta may be a
    # lifted (traced) float, so the test happens in the graph unless it is a literal.
    if isinstance(beta, (int, float)):
        return None if beta == 0 else _scaled(x, beta)
    return jnp.where(beta == 0, jnp.zeros((), x.dtype), _scaled(x, beta))


register(aten.mm.default, aten.bmm.default, aten.matmul.default, aten.mv.default,
         aten.dot.default, aten.vdot.default)(_matmul)
register(aten.outer.default, aten.ger.default)(lambda a, b: jnp.outer(a, b))


@register(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)
def addmm(x, a, b, *, beta=1, alpha=1):
    out = _scaled(_matmul(a, b), alpha)
    x = _beta_input(x, beta)
    return out if x is None else out + x


@register(aten.addbmm.default)
def addbmm(x, a, b, *, beta=1, alpha=1):
    out = _scaled(jnp.einsum("bij,bjk->ik", a, b, precision=_precision()), alpha)
    x = _beta_input(x, beta)
    return out if x is None else out + x


@register(aten.addr.default)
def addr(x, a, b, *, beta=1, alpha=1):
    out = _scaled(jnp.outer(a, b), alpha)
    x = _beta_input(x, beta)
    return out if x is None else out + x


# ---- grouped products (mixtures of experts) --------------------------------

def _group_sizes(offs, n):
    """torch's offsets (each group's end, cumulative) as JAX's group sizes; the rows
    after the last end belong to no group."""
    ends = jnp.minimum(offs.astype(jnp.int32), n)
    return jnp.diff(ends, prepend=jnp.zeros((1,), jnp.int32))


def _ragged(lhs, rhs, sizes, dims, lhs_ragged, rhs_group, out_type):
    nums = lax.RaggedDotDimensionNumbers(dims, lhs_ragged, rhs_group)
    return lax.ragged_dot_general(lhs, rhs, sizes, nums, precision=_precision(),
                                  preferred_element_type=out_type)


@register(aten._grouped_mm.default, may_refuse=True)
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm: the groups of one matrix, split at ``offs``, each times its
    own matrix of the other (transformers' ``grouped_mm`` experts: tokens sorted by
    expert). One product of static shape (JAX's ragged dot): the offsets stay on the
    device, where CPU torch's kernel reads them on the host. Rows (or columns) after
    the last offset are zeros (torch leaves them unwritten)."""
    if bias is not None:
        raise NotImplementedError("_grouped_mm with a bias")  # CPU torch has none either
    low = a.dtype in (jnp.bfloat16, jnp.float16)
    acc = jnp.float32 if low else None
    ab = ((a.ndim - 1,), (b.ndim - 2,))
    if offs is None:  # 3-d x 3-d: one product per group
        out = lax.dot_general(a, b, (ab, ((0,), (0,))), precision=_precision(),
                              preferred_element_type=acc)
    elif a.ndim == 2 and b.ndim == 3:  # rows of a in groups: (m, k) x (g, k, n) -> (m, n)
        out = _ragged(a, b, _group_sizes(offs, a.shape[0]), (((1,), (1,)), ((), ())),
                      [0], [0], acc)
    elif a.ndim == 2 and b.ndim == 2:  # k in groups: (m, k) x (k, n) -> (g, m, n)
        out = _ragged(a, b, _group_sizes(offs, a.shape[1]), (((1,), (0,)), ((), ())),
                      [1], [], acc)
    elif a.ndim == 3 and b.ndim == 2:  # columns of b in groups: (g, m, k) x (k, n) -> (m, n)
        out = _ragged(b.T, jnp.swapaxes(a, 1, 2), _group_sizes(offs, b.shape[1]),
                      (((1,), (1,)), ((), ())), [0], [0], acc).T
    else:
        raise NotImplementedError(f"_grouped_mm of {a.ndim}-d and {b.ndim}-d matrices")
    return out


# ---- convolution ----------------------------------------------------------

def _conv(x, w, stride, padding, dilation, groups):
    """Plain (non-transposed) N-d convolution in torch's NC... / OI... layouts."""
    n = w.ndim - 2
    return lax.conv_general_dilated(
        x, w,
        window_strides=ntuple(stride, n),
        padding=[(p, p) for p in ntuple(padding, n)],
        rhs_dilation=ntuple(dilation, n),
        feature_group_count=groups,
        precision=_conv_precision(),
    )


def _conv_transpose(x, w, stride, padding, dilation, output_padding, groups):
    """Transposed convolution as a plain convolution over the stride-dilated input with
    the flipped, in/out-swapped kernel (torch's weight layout is (C_in, C_out/groups, *k));
    output_padding extends the high side."""
    n = w.ndim - 2
    stride, padding, dilation = ntuple(stride, n), ntuple(padding, n), ntuple(dilation, n)
    output_padding = ntuple(output_padding, n)
    dtype = jnp.result_type(x, w)
    cin, cout_g = w.shape[:2]
    k = w.shape[2:]
    wt = w.reshape((groups, cin // groups, cout_g) + k)
    wt = jnp.swapaxes(wt, 1, 2).reshape((groups * cout_g, cin // groups) + k)
    wt = jnp.flip(wt, axis=tuple(range(2, 2 + n))).astype(dtype)
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op)
            for kk, p, d, op in zip(k, padding, dilation, output_padding)]
    return lax.conv_general_dilated(
        x.astype(dtype), wt, window_strides=(1,) * n, padding=pads, lhs_dilation=stride,
        rhs_dilation=dilation, feature_group_count=groups, precision=_conv_precision())


def _conv_any(x, w, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return _conv_transpose(x, w, stride, padding, dilation, output_padding, groups)
    return _conv(x, w, stride, padding, dilation, groups)


@register(aten.convolution.default)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv_any(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * (out.ndim - 2))
    return out


@register(aten.convolution_backward.default)
def convolution_backward(grad_out, x, w, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    def f(x_, w_):
        return _conv_any(x_, w_, stride, padding, dilation, transposed, output_padding, groups)

    # XLA drops whichever half of the VJP is not used.
    _, vjp = jax.vjp(f, x, w)
    gx, gw = vjp(grad_out.astype(jnp.result_type(x, w)))
    gb = None
    if output_mask[2]:
        gb = jnp.sum(grad_out, axis=(0,) + tuple(range(2, grad_out.ndim)))
    return (gx if output_mask[0] else None, gw if output_mask[1] else None, gb)
