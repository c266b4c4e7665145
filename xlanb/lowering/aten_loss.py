"""Margin losses, CTC, shrink activations and the embedding-bag backward entry point.

Forwards follow torch's definitions. Backwards are ``jax.vjp`` of the same forward, so
the two always agree, except CTC's, which follows torch's own alpha-beta formula.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xlanb.lowering._util import aten, upcast
from xlanb.lowering.registry import register


def _reduce(loss, reduction):
    if reduction == 1:  # mean
        return jnp.mean(loss)
    if reduction == 2:  # sum
        return jnp.sum(loss)
    return loss


# ---- shrink ------------------------------------------------------------------------

@register(aten.softshrink.default)
def softshrink(x, lambd=0.5):
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, 0)).astype(x.dtype)


@register(aten.softshrink_backward.default)
def softshrink_backward(g, x, lambd):
    return jnp.where((x > lambd) | (x < -lambd), g, 0).astype(g.dtype)


@register(aten.hardshrink.default)
def hardshrink(x, lambd=0.5):
    return jnp.where((x > lambd) | (x < -lambd), x, 0).astype(x.dtype)


@register(aten.hardshrink_backward.default)
def hardshrink_backward(g, x, lambd):
    return jnp.where((x > lambd) | (x < -lambd), g, 0).astype(g.dtype)


# ---- multi-class margin losses ----------------------------------------------------------

def _multi_margin(x, target, p, margin, weight, reduction):
    x2 = upcast(x).reshape((-1, x.shape[-1])) if x.ndim else upcast(x).reshape(1, 1)
    t = target.reshape(-1)
    c = x2.shape[-1]
    picked = jnp.take_along_axis(x2, t[:, None], axis=1)
    z = jnp.maximum(margin - picked + x2, 0)
    z = z ** p if not (isinstance(p, int) and p == 1) else z
    if weight is not None:
        z = z * weight[t][:, None]
    z = jnp.where(jnp.arange(c)[None, :] == t[:, None], 0, z)
    loss = jnp.sum(z, axis=1) / c
    if x.ndim <= 1:
        loss = loss.reshape(())
    return _reduce(loss, reduction)


@register(aten.multi_margin_loss.default)
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=1):
    return _multi_margin(x, target, p, margin, weight, reduction).astype(x.dtype)


@register(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(g, x, target, p, margin, weight=None, reduction=1):
    out, vjp = jax.vjp(lambda v: _multi_margin(v, target, p, margin, weight, reduction),
                       upcast(x))
    return vjp(upcast(g).astype(out.dtype))[0].astype(x.dtype)


def _multilabel_is_target(target):
    t = target.reshape((-1, target.shape[-1])) if target.ndim else target.reshape(1, 1)
    valid = jnp.cumprod(t != -1, axis=1).astype(bool)  # targets stop at the first -1
    c = t.shape[-1]
    hits = (t[:, :, None] == jnp.arange(c)[None, None, :]) & valid[:, :, None]
    return jnp.any(hits, axis=1), t, valid


def _multilabel(x, target, reduction):
    x2 = upcast(x).reshape((-1, x.shape[-1])) if x.ndim else upcast(x).reshape(1, 1)
    is_t, t, valid = _multilabel_is_target(target)
    c = x2.shape[-1]
    xt = jnp.take_along_axis(x2, jnp.where(valid, t, 0), axis=1)  # (N, C) target scores
    z = jnp.maximum(1 - (xt[:, :, None] - x2[:, None, :]), 0)  # (N, targets, classes)
    z = jnp.where(valid[:, :, None] & ~is_t[:, None, :], z, 0)
    loss = jnp.sum(z, axis=(1, 2)) / c
    if x.ndim <= 1:
        loss = loss.reshape(())
    return _reduce(loss, reduction), is_t


@register(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(x, target, reduction):
    loss, is_t = _multilabel(x, target, reduction)
    return loss.astype(x.dtype), is_t.reshape(target.shape).astype(x.dtype)


@register(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(g, x, target, reduction, is_target):
    out, vjp = jax.vjp(lambda v: _multilabel(v, target, reduction)[0], upcast(x))
    return vjp(upcast(g).astype(out.dtype))[0].astype(x.dtype)


# ---- embedding bag ------------------------------------------------------------------

@register(aten._embedding_bag_backward.default)
def _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                            num_weights, scale_grad_by_freq, mode, sparse,
                            per_sample_weights, padding_idx=-1):
    from xlanb.lowering.aten_sampling import _embedding_bag_dense_backward
    return _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                         num_weights, scale_grad_by_freq, mode,
                                         per_sample_weights, padding_idx)


# ---- CTC ----------------------------------------------------------------------------

_NEG = -jnp.inf


def _ctc_extended(targets, target_lengths, n, s):
    """Targets with blanks interleaved, (N, 2S+1); positions past 2L+1 repeat blanks."""
    lengths = np.asarray(target_lengths, np.int64)
    if targets.ndim == 2:
        lab = targets[:, :s] if targets.shape[1] >= s else \
            jnp.pad(targets, ((0, 0), (0, s - targets.shape[1])))
    else:  # 1-d: the targets of all batches, concatenated
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        idx = np.minimum(starts[:, None] + np.arange(max(s, 1))[None, :s],
                         max(targets.shape[0] - 1, 0))
        lab = targets[jnp.asarray(idx)] if targets.shape[0] else jnp.zeros((n, s), targets.dtype)
    lab = jnp.where(jnp.arange(s)[None, :] < jnp.asarray(lengths)[:, None], lab, 0)
    return lab, lengths


def _ctc_forward(lp, targets, input_lengths, target_lengths, blank):
    """log_alpha (N, T, 2S+1) and the negative log likelihood (N,), torch's recursion."""
    t_max, n, c = lp.shape
    s = int(max(target_lengths)) if len(target_lengths) else 0
    lab, lengths = _ctc_extended(targets, target_lengths, n, s)
    width = 2 * s + 1
    ext = jnp.full((n, width), blank, lab.dtype).at[:, 1::2].set(lab)
    # transitions from s-2 are allowed onto a label that differs from the one before
    skip = jnp.zeros((n, width), bool).at[:, 2:].set((ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2]))
    lpx = jnp.take_along_axis(lp, jnp.broadcast_to(ext[None], (t_max, n, width)).astype(jnp.int32),
                              axis=2)  # (T, N, width)
    s_idx = jnp.arange(width)[None, :]
    valid = s_idx <= 2 * jnp.asarray(lengths)[:, None]
    first = jnp.where((s_idx == 0) | ((s_idx == 1) & (jnp.asarray(lengths)[:, None] > 0)),
                      lpx[0], _NEG)
    first = jnp.where(valid, first, _NEG)
    in_len = jnp.asarray(np.asarray(input_lengths, np.int64))

    def step(prev, inp):
        t, lpt = inp
        la1 = prev
        la2 = jnp.concatenate([jnp.full((n, 1), _NEG, prev.dtype), prev[:, :-1]], axis=1)
        la3 = jnp.concatenate([jnp.full((n, 2), _NEG, prev.dtype), prev[:, :-2]], axis=1)
        la3 = jnp.where(skip, la3, _NEG)
        m = jnp.maximum(jnp.maximum(la1, la2), la3)
        m = jnp.where(jnp.isneginf(m), 0, m)
        new = jnp.log(jnp.exp(la1 - m) + jnp.exp(la2 - m) + jnp.exp(la3 - m)) + m + lpt
        new = jnp.where(valid, new, _NEG)
        new = jnp.where((t < in_len)[:, None], new, prev)  # past the input: frozen
        return new, new

    _, rest = lax.scan(step, first, (jnp.arange(1, t_max), lpx[1:]))
    log_alpha = jnp.concatenate([first[None], rest], axis=0)  # (T, N, width)
    last = log_alpha[jnp.clip(in_len - 1, 0, t_max - 1), jnp.arange(n)]  # (N, width)
    end = 2 * jnp.asarray(lengths)
    l1 = jnp.take_along_axis(last, end[:, None], axis=1)[:, 0]
    l2 = jnp.where(end > 0, jnp.take_along_axis(last, jnp.maximum(end - 1, 0)[:, None], axis=1)[:, 0],
                   _NEG)
    m = jnp.maximum(l1, l2)
    m = jnp.where(jnp.isneginf(m), 0, m)
    nll = -(jnp.log(jnp.exp(l1 - m) + jnp.exp(l2 - m)) + m)
    return jnp.swapaxes(log_alpha, 0, 1), nll, ext, skip, lpx, valid


@register(aten._ctc_loss.default)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    lp = upcast(log_probs)
    # zero_infinity is applied by the caller (torch's ctc_loss) and by the backward
    log_alpha, nll, *_ = _ctc_forward(lp, targets, input_lengths, target_lengths, blank)
    return nll.astype(log_probs.dtype), log_alpha.astype(log_probs.dtype)


@register(aten._ctc_loss_backward.default)
def _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood,
                       log_alpha, blank, zero_infinity=False):
    """torch's gradient: exp(lp) - exp(log(alpha*beta summed per class) + nll - lp), for
    t < input_length (zero after), scaled by the incoming gradient."""
    lp = upcast(log_probs)
    t_max, n, c = lp.shape
    la, nll, ext, skip, lpx, valid = _ctc_forward(lp, targets, input_lengths, target_lengths, blank)
    la = jnp.swapaxes(la, 0, 1)  # (T, N, width)
    width = ext.shape[1]
    lengths = np.asarray(target_lengths, np.int64)
    in_len = jnp.asarray(np.asarray(input_lengths, np.int64))
    end = 2 * jnp.asarray(lengths)
    s_idx = jnp.arange(width)[None, :]
    # beta, run backwards from each sequence's last input step
    skip_up = jnp.zeros((n, width), bool).at[:, :-2].set(skip[:, 2:])

    def step(nxt, inp):
        t, lpt = inp
        init = jnp.where((s_idx == end[:, None]) | ((s_idx == end[:, None] - 1) & (end[:, None] > 0)),
                         lpt, _NEG)
        lb1 = nxt
        lb2 = jnp.concatenate([nxt[:, 1:], jnp.full((n, 1), _NEG, nxt.dtype)], axis=1)
        lb3 = jnp.concatenate([nxt[:, 2:], jnp.full((n, 2), _NEG, nxt.dtype)], axis=1)
        lb3 = jnp.where(skip_up, lb3, _NEG)
        m = jnp.maximum(jnp.maximum(lb1, lb2), lb3)
        m = jnp.where(jnp.isneginf(m), 0, m)
        rec = jnp.log(jnp.exp(lb1 - m) + jnp.exp(lb2 - m) + jnp.exp(lb3 - m)) + m + lpt
        cur = jnp.where((t == in_len - 1)[:, None], init,
                        jnp.where((t < in_len - 1)[:, None], rec, _NEG))
        cur = jnp.where(valid, cur, _NEG)
        return cur, cur

    _, lb = lax.scan(step, jnp.full((n, width), _NEG, lp.dtype),
                     (jnp.arange(t_max), lpx), reverse=True)
    ab = la + lb  # (T, N, width)
    m = jnp.max(ab, axis=2, keepdims=True)
    m = jnp.where(jnp.isneginf(m), 0, m)
    onehot = jax.nn.one_hot(ext, c, dtype=lp.dtype)  # (N, width, C)
    summed = jnp.einsum("tns,nsc->tnc", jnp.exp(ab - m), onehot,
                        precision=jax.lax.Precision.HIGHEST)
    lcab = jnp.log(summed) + m
    nll_ = neg_log_likelihood.astype(lp.dtype)
    g = jnp.exp(lp) - jnp.exp(lcab + nll_[None, :, None] - lp)
    g = jnp.where((jnp.arange(t_max)[:, None] < in_len[None, :])[:, :, None], g, 0)
    g = g * upcast(grad).astype(lp.dtype)[None, :, None]
    if zero_infinity:
        g = jnp.where(jnp.isposinf(nll_)[None, :, None], 0, g)
    return g.astype(log_probs.dtype)


# ---- chunked linear + cross-entropy (torch_nn custom ops behind F.linear_cross_entropy) --

def _linear_ce(x, w, target, b, weight, reduction, ignore_index, label_smoothing):
    """cross_entropy(x @ w.T + b, target), torch's semantics (class weights, ignore_index,
    label smoothing normalized like torch's)."""
    x = upcast(x).reshape((-1, x.shape[-1]))
    target = target.reshape(-1)
    logits = jnp.matmul(x, upcast(w).T, precision=lax.Precision.HIGHEST)
    if b is not None:
        logits = logits + upcast(b)
    logp = jax.nn.log_softmax(logits, axis=-1)
    c = logits.shape[-1]
    keep = target != ignore_index
    t = jnp.where(keep, target, 0)
    wt = jnp.ones((c,), logp.dtype) if weight is None else upcast(weight)
    w_t = jnp.where(keep, wt[t], 0)
    nll = -jnp.take_along_axis(logp, t[:, None], axis=1)[:, 0] * w_t
    if reduction == "none":
        loss = nll
    else:
        loss = jnp.sum(nll) / (jnp.sum(w_t) if reduction == "mean" else 1)
    if label_smoothing:
        smooth = jnp.where(keep, -jnp.sum(logp * wt, axis=-1), 0)
        if reduction == "mean":
            smooth = jnp.sum(smooth) / (jnp.sum(w_t) if weight is not None else jnp.sum(keep))
        elif reduction == "sum":
            smooth = jnp.sum(smooth)
        loss = (1 - label_smoothing) * loss + smooth * (label_smoothing / c)
    return loss


def _register_linear_ce():
    try:
        import torch.nn.modules.linear_cross_entropy  # noqa: F401  (defines the ops)
        ops = torch.ops.torch_nn
        chunked = ops._linear_cross_entropy_batch_chunked.default
        no_reduction = ops._linear_cross_entropy_batch_chunked_no_reduction.default
    except (ImportError, AttributeError, RuntimeError):
        return

    @register(chunked, static_floats=True)  # label_smoothing == 0 is decided when tracing
    def linear_ce_chunked(x, w, target, b, weight, reduction, ignore_index, label_smoothing,
                          batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph,
                          compute_input_grad, compute_linear_weight_grad,
                          compute_linear_bias_grad):
        # The op returns the loss and, precomputed, the gradients its backward scales.
        def f(x_, w_, b_):
            return _linear_ce(x_, w_, target, b_, weight, reduction, ignore_index,
                              label_smoothing)
        loss, (gx, gw, gb) = jax.value_and_grad(f, argnums=(0, 1, 2))(
            upcast(x), upcast(w), upcast(b) if b is not None else jnp.zeros(w.shape[:-1], jnp.float32))
        dt = x.dtype
        gx = gx.astype(dt) if compute_input_grad else jnp.zeros((0, 0), dt)
        gw = gw.astype(dt) if compute_linear_weight_grad else jnp.zeros((0, 0), dt)
        gb = gb.astype(dt) if compute_linear_bias_grad else jnp.zeros((0,), dt)
        return loss.astype(dt), gx, gw, gb

    @register(no_reduction)
    def linear_ce_no_reduction(x, w, target, b, weight, ignore_index, batch_chunk_size,
                               acc_policy, acc_dtype):
        out = _linear_ce(x, w, target, b, weight, "none", ignore_index, 0.0)
        return out.reshape(x.shape[:1] if x.ndim > 1 else ()).astype(x.dtype)


_register_linear_ce()
