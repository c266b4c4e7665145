"""Matrix factorizations and solvers (torch.linalg).

``info`` outputs are zeros: XLA's factorizations report failure as NaNs rather
than LAPACK codes. Pivots are 1-based int32, like torch's (LAPACK's) ones.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from xlanb.lowering._util import aten
from xlanb.lowering.registry import register


def _info(a):
    return jnp.zeros(a.shape[:-2], jnp.int32)


def _lu(a):
    lu, piv, _ = lax.linalg.lu(a)
    return lu, (piv + 1).astype(jnp.int32)


def _mT(a):
    return jnp.swapaxes(a, -1, -2)


def _broadcast_batch(a, b):
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _pivot_sign(pivots):
    """(-1)^(number of row swaps) from 1-based LAPACK pivots."""
    n = pivots.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(1, n + 1, dtype=pivots.dtype), axis=-1)
    return 1 - 2 * (swaps % 2)


@register(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    lower = jnp.linalg.cholesky(a)
    return (_mT(lower).conj() if upper else lower), _info(a)


@register(aten.cholesky.default)
def cholesky(a, upper=False):
    return linalg_cholesky_ex(a, upper=upper)[0]


@register(aten.linalg_inv_ex.default)
def linalg_inv_ex(a, *, check_errors=False):
    return jnp.linalg.inv(a), _info(a)


@register(aten.linalg_lu_factor_ex.default, may_refuse=True)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    if not pivot:
        raise NotImplementedError("LU without pivoting")
    lu, piv = _lu(a)
    return lu, piv, _info(a)


@register(aten.linalg_lu.default, may_refuse=True)
def linalg_lu(a, *, pivot=True):
    if not pivot:
        raise NotImplementedError("LU without pivoting")
    lu, _, perm = lax.linalg.lu(a)  # a[perm] = L @ U
    m, n = a.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=a.dtype)
    upper = jnp.triu(lu[..., :k, :])
    p = _mT(jax.nn.one_hot(perm, m, dtype=a.dtype))  # A = P @ L @ U, as torch
    return p, lower, upper


# torch's det/slogdet return the LU of A^T (LAPACK sees the row-major A transposed);
# det(A^T) = det(A), and torch's backward formulas expect exactly that LU.
@register(aten._linalg_det.default)
def _linalg_det(a):
    lu, piv = _lu(_mT(a))
    det = jnp.prod(jnp.diagonal(lu, axis1=-2, axis2=-1), axis=-1) * _pivot_sign(piv)
    return det, lu, piv


@register(aten._linalg_slogdet.default)
def _linalg_slogdet(a):
    lu, piv = _lu(_mT(a))
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    sign = jnp.prod(jnp.sign(diag), axis=-1) * _pivot_sign(piv)
    return sign, jnp.sum(jnp.log(jnp.abs(diag)), axis=-1), lu, piv


@register(aten._linalg_solve_ex.default)
def _linalg_solve_ex(a, b, *, left=True, check_errors=False):
    lu, piv = _lu(a)
    # torch reads B as a (batch of) vector(s) when it is 1-d or A's shape minus a dim.
    vector = b.ndim == 1 or b.shape == a.shape[:-1]
    if vector:
        b = b[..., None]
    if left:
        x = jnp.linalg.solve(*_broadcast_batch(a, b))
    else:  # X A = B  <=>  A^T X^T = B^T
        x = _mT(jnp.linalg.solve(*_broadcast_batch(_mT(a), _mT(b))))
    return (x[..., 0] if vector else x), lu, piv, _info(a)


@register(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    a, b = _broadcast_batch(a, b)
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=not upper,
                                       unit_diagonal=unitriangular)


@register(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    a_, b_ = _broadcast_batch(a, b)
    x = lax.linalg.triangular_solve(a_, b_, left_side=True, lower=not upper,
                                    transpose_a=transpose, unit_diagonal=unitriangular)
    return x, a_


@register(aten.cholesky_solve.default)
def cholesky_solve(b, factor, upper=False):
    # A = L L^H: solve L Y = B, then L^H X = Y.
    lower = _mT(factor).conj() if upper else factor
    lower, b = _broadcast_batch(lower, b)
    y = lax.linalg.triangular_solve(lower, b, left_side=True, lower=True)
    return lax.linalg.triangular_solve(lower, y, left_side=True, lower=True, transpose_a=True,
                                       conjugate_a=True)


@register(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), a.dtype), jnp.linalg.qr(a, mode="r")
    return jnp.linalg.qr(a, mode=mode)


@register(aten._linalg_eigh.default, aten.linalg_eigh.default)
def _linalg_eigh(a, UPLO="L", compute_v=True):  # noqa: N803  (torch's argument name)
    w, v = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return w, (v if compute_v else jnp.zeros((0,), a.dtype))


@register(aten._linalg_svd.default)
def _linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        empty = jnp.zeros((0,), a.dtype)
        return empty, jnp.linalg.svd(a, compute_uv=False), empty
    return jnp.linalg.svd(a, full_matrices=full_matrices)
