"""Matrix factorizations and solvers (torch.linalg).

``info`` outputs are zeros: XLA's factorizations report failure as NaNs rather
than LAPACK codes. Pivots are 1-based int32, like torch's (LAPACK's) ones.
"""
from __future__ import annotations

import functools

import jax
import jax.scipy.linalg  # noqa: F401  (expm)
import jax.numpy as jnp
from jax import lax

from xlanb.base.torch_compat import aten_op
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


@register(aten_op("cholesky.default"))  # not in torch 2.14 (base/torch_compat.py)
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


# ---- checks, inverses and products built on the factorizations above ------------

# aten._linalg_check_errors returns nothing; the core skips it (dispatch._no_result).


def _pinv_tols(a, atol, rtol, m, n):
    eps = jnp.finfo(a.real.dtype).eps
    batch = a.shape[:-2]
    atol_ = jnp.zeros(batch, a.real.dtype) if atol is None else jnp.asarray(atol, a.real.dtype)
    if rtol is None:
        default = eps * max(m, n)
        rtol_ = default if atol is None else jnp.where(atol_ > 0, 0.0, default)
    else:
        rtol_ = jnp.asarray(rtol, a.real.dtype)
    return jnp.asarray(atol_)[..., None], jnp.asarray(rtol_)[..., None]


@register(aten.linalg_pinv)
def linalg_pinv(a, *args, atol=None, rtol=None, hermitian=False):
    if args:  # (rcond[, hermitian]) overloads: rcond is rtol, atol is 0
        rtol = args[0]
        atol = 0.0
        if len(args) > 1:
            hermitian = args[1]
    m, n = a.shape[-2:]
    atol_, rtol_ = _pinv_tols(a, atol, rtol, m, n)
    if hermitian:
        s, u = jnp.linalg.eigh(a, UPLO="L", symmetrize_input=False)  # torch reads the lower half
        tol = jnp.maximum(atol_, rtol_ * jnp.max(jnp.abs(s), axis=-1, keepdims=True, initial=0))
        s_inv = jnp.where(jnp.abs(s) > tol, 1 / s, 0).astype(a.dtype)
        return jnp.matmul(u * s_inv[..., None, :], _mT(u).conj(), precision=lax.Precision.HIGHEST)
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    tol = jnp.maximum(atol_, rtol_ * jnp.max(s, axis=-1, keepdims=True, initial=0))
    s_inv = jnp.where(s > tol, 1 / s, 0).astype(a.dtype)
    return jnp.matmul(_mT(vh).conj() * s_inv[..., None, :], _mT(u).conj(),
                      precision=lax.Precision.HIGHEST)


@register(aten.linalg_cross.default)
def linalg_cross(a, b, *, dim=-1):
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a, b = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
    return jnp.cross(a, b, axis=dim)


def _perm(pivots, m):
    return lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


@register(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    if not left:  # X A = B  <=>  A^H X^H = B^H
        x = linalg_lu_solve(lu, pivots, _mT(b).conj(), left=True, adjoint=not adjoint)
        return _mT(x).conj()
    lu, b = _broadcast_batch(lu, b)
    m = lu.shape[-1]
    perm = jnp.broadcast_to(_perm(pivots, m), lu.shape[:-2] + (m,))
    tri = functools.partial(lax.linalg.triangular_solve, left_side=True)
    if not adjoint:  # A = P L U, P^T A = L U: x = U^-1 L^-1 (P^T b) = U^-1 L^-1 b[perm]
        pb = jnp.take_along_axis(b, perm[..., :, None], axis=-2)
        y = tri(lu, pb, lower=True, unit_diagonal=True)
        return tri(lu, y, lower=False)
    # A^H = U^H L^H P^T: y = L^-H U^-H b, x = P y
    y = tri(lu, b, lower=False, transpose_a=True, conjugate_a=True)
    y = tri(lu, y, lower=True, unit_diagonal=True, transpose_a=True, conjugate_a=True)
    inv = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(y, inv[..., :, None], axis=-2)


@register(aten.lu_unpack.default)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2:]
    k = min(m, n)
    empty = jnp.zeros((0,), lu.dtype)
    if unpack_data:
        lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
        upper = jnp.triu(lu[..., :k, :])
    else:
        lower = upper = empty
    if unpack_pivots:
        perm = _perm(pivots, m)
        p = _mT(jax.nn.one_hot(perm, m, dtype=lu.dtype))
        p = jnp.broadcast_to(p, lu.shape[:-2] + (m, m))
    else:
        p = empty
    return p, lower, upper


@register(aten.linalg_householder_product.default)
def linalg_householder_product(a, tau):
    return lax.linalg.householder_product(a, tau)


@register(aten.geqrf.default)
def geqrf(a):
    h, tau = jnp.linalg.qr(a, mode="raw")  # numpy's raw mode: h is transposed
    return _mT(h), tau


@register(aten.ormqr.default)
def ormqr(a, tau, c, left=True, transpose=False):
    return lax.linalg.ormqr(a, tau, c, left=left, transpose=transpose)


@register(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    return jax.scipy.linalg.expm(a)


@register(aten.cholesky_inverse.default)
def cholesky_inverse(factor, upper=False):
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return cholesky_solve(eye, factor, upper)


@register(aten.linalg_eig.default, may_refuse=True)
def linalg_eig(a):
    # XLA implements the non-symmetric eigendecomposition (LAPACK geev) on the CPU only;
    # elsewhere the op runs on CPU torch.
    if jax.default_backend() != "cpu":
        raise NotImplementedError("linalg_eig: XLA has geev on the CPU backend only")
    w, v = jnp.linalg.eig(a)
    return w, v
