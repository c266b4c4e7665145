"""Small helpers shared by the lowering modules."""
from __future__ import annotations

import jax.numpy as jnp
import torch

from xlanb.base.dtypes import to_jax_dtype

aten = torch.ops.aten

_LOW_FLOATS = (jnp.bfloat16, jnp.float16)


def jdtype(dtype: torch.dtype | None, default=None):
    """JAX dtype for an optional torch dtype kwarg (``None`` -> ``default``)."""
    return default if dtype is None else to_jax_dtype(dtype)


def default_float():
    return to_jax_dtype(torch.get_default_dtype())


def is_float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def upcast(x):
    """Half/bfloat16 -> float32: torch computes reductions and norms in float32
    ("opmath") for these; the caller casts the result back."""
    return x.astype(jnp.float32) if x.dtype in _LOW_FLOATS else x


def in_opmath(fn, x):
    """``fn(x)`` with half types computed in float32 and rounded once to ``x``'s dtype,
    as CPU torch's elementwise kernels compute them."""
    return fn(upcast(x)).astype(x.dtype)


def to_float(x):
    """Integer/bool inputs of float-valued ops (mean, exp, ...) -> default float."""
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(default_float())


def take(x, indices, axis=None):
    """``jnp.take`` of indices known to be in range: checked before or inside the graph
    (values/checks.py: embedding, index_select), or computed in range. Its "clip" mode is
    one gather; the default "fill" adds about 20 ops (negatives wrapped, a mask, a select)
    to each graph that holds it: a tiny Llama prefill's embedding was a fifth of its
    compile."""
    return jnp.take(x, indices, axis=axis, mode="clip")


def wrap(dim: int, ndim: int) -> int:
    """Torch dim wrapping; 0-d tensors accept dim 0 and -1."""
    return dim % ndim if ndim else 0


def dims(dim, ndim: int):
    """A torch ``int[]? dim`` as a tuple of axes; None or [] means all axes."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(ndim))
    return tuple(sorted({wrap(d, ndim) for d in dim})) if ndim else ()


def ntuple(v, n: int):
    """Expand an int or a 1-element list to n entries (pooling/conv params)."""
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    return v * n if len(v) == 1 else v
