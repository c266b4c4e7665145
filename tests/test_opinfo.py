"""PyTorch's own OpInfo database (op_db) on the xla device, compared with CPU torch.

Each case runs one op's sample inputs (``tools/coverage.py``'s ``check_op``) in one mode and one
dtype: eager mode, and lazy mode with a sync after the op; float32, int64 and bool where
torch supports them. A sample that runs anything on CPU torch (an ``aten::<op>``
counter) is a failure here, not a pass. Gradients of differentiable ops are compared
with CPU torch too (``check_grad``).

The tables live in ``tools/coverage.py`` and are shared with the coverage report:
per-op tolerances, random ops, and ``EXPECTED_FAILURES``, the one list of known
failures with their reasons. A listed case that passes fails its test, so that the list
only shrinks.

CI runs a representative slice (``SLICE``). ``XLANB_OPINFO=full python -m pytest
tests/test_opinfo.py`` runs every op in op_db; ``python -m tools.coverage`` writes the
report (docs/op-coverage.md).
"""
from __future__ import annotations

import os

import pytest
import torch

from tools import coverage as cov

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)

FULL = os.environ.get("XLANB_OPINFO", "").strip().lower() == "full"

#: The CI slice: a few ops of every kind (pointwise, reductions, shapes, indexing, nn,
#: linear algebra, FFT, special functions, factories, random ops), plus entries of the
#: expected-failure list, so that both paths of the check run on every CI run.
SLICE = (
    # pointwise
    "abs", "exp", "sigmoid", "erfinv", "special.i1e", "add", "div.floor_rounding", "pow",
    "atan2", "bitwise_and", "eq", "where", "nan_to_num", "lerp",
    # reductions, scans, sorting
    "sum", "mean", "amax", "argmax", "var_mean", "cumsum", "logsumexp", "linalg.matrix_norm",
    "topk", "median", "mode",
    # shapes and views
    "cat", "stack", "reshape", "permute", "transpose", "flip", "roll", "split", "tril",
    "movedim", "view_as_real",
    # indexing
    "index_select", "gather", "scatter_add", "index_put", "index_add", "masked_fill",
    "masked_scatter", "__getitem__",
    # nn
    "nn.functional.linear", "nn.functional.conv2d", "nn.functional.conv_transpose2d",
    "nn.functional.adaptive_max_pool2d", "nn.functional.layer_norm",
    "nn.functional.batch_norm", "nn.functional.group_norm", "softmax",
    "nn.functional.cross_entropy", "nn.functional.gelu", "nn.functional.embedding",
    "nn.functional.embedding_bag", "nn.functional.interpolate.bilinear",
    "nn.functional.pad.reflect", "nn.functional.scaled_dot_product_attention",
    "nn.functional.smooth_l1_loss",
    # linear algebra
    "matmul", "addmm", "einsum", "linalg.qr", "linalg.det", "linalg.eigh",
    # FFT
    "fft.fft", "fft.irfft",
    # factories and random ops
    "arange", "full", "zeros_like", "linspace.tensor_overload", "rand_like", "bernoulli",
    "nn.functional.dropout",
    # misc
    "histc", "searchsorted",
    # core fixes the OpInfo run found: in-place view ops in backwards (matmul above),
    # in-place overload matching (pow_ in norm backwards), ops without results
    # (_linalg_check_errors), shapes from lowerings without meta kernels, Python-bool
    # results, as_strided of views, more factories and dtypes
    "nn.functional.normalize", "linalg.vector_norm", "linalg.solve", "linalg.cholesky",
    "allclose", "cov", "geqrf", "histogram", "stft", "triu_indices", "sgn",
    "hash_tensor",
    # expected failures (data-dependent shapes, a missing core feature)
    "nonzero", "unique", "linalg.inv", "equal", "resize_",
)

#: Samples per case (the same in the slice and the full run, so that an expected
#: failure found by the full run also fails in the slice).
MAX_SAMPLES = cov.MAX_SAMPLES


def _keys():
    db = cov.op_db()
    return list(db) if FULL else [k for k in SLICE if k in db]


def _cases():
    db = cov.op_db()
    for key in _keys():
        for dtype in cov.supported_dtypes(db[key]):
            for mode in cov.MODES_CHECKED:
                yield pytest.param(key, dtype, mode,
                                   id=f"{key}-{cov.DTYPE_NAMES[dtype]}-{mode}")


def _grad_cases():
    db = cov.op_db()
    for key in _keys():
        op = db[key]
        if op.supports_autograd and torch.float32 in cov.supported_dtypes(op) \
                and key not in cov.NONDETERMINISTIC:
            for mode in cov.MODES_CHECKED:
                yield pytest.param(key, mode, id=f"{key}-{mode}")


def _check_expected(result, why, what):
    if why is not None:
        assert result.status != "pass", (
            f"{what} now passes: remove it from tools/coverage.py's EXPECTED_FAILURES")
        pytest.xfail(f"{result.status}; expected: {why[:100]}")
    if result.status == "skip":
        pytest.skip(result.reason)
    assert result.status == "pass", f"{result.status}: {result.reason}"


@pytest.mark.parametrize("key,dtype,mode", list(_cases()))
def test_op(key, dtype, mode):
    result = cov.check_op(cov.op_db()[key], dtype, mode, max_samples=MAX_SAMPLES)
    _check_expected(result, cov.expected_failure(key, dtype, mode),
                    f"{key} ({cov.DTYPE_NAMES[dtype]}, {mode})")


@pytest.mark.parametrize("key,mode", list(_grad_cases()))
def test_grad(key, mode):
    result = cov.check_grad(cov.op_db()[key], mode, max_samples=cov.GRAD_SAMPLES)
    _check_expected(result, cov.expected_failure(key, "grad", mode), f"{key} (grad, {mode})")


def test_tables_name_real_ops():
    """Every op the tables mention exists in op_db (a renamed op must not hide)."""
    db = cov.op_db()
    named = [k[0] for k in cov.EXPECTED_FAILURES] + list(cov.TOLERANCES) \
        + list(cov.NONDETERMINISTIC) + list(cov.CANONICAL) + list(cov.RANDOM_SAMPLES) \
        + list(cov.ARGS_ON_CPU) + list(cov.GRAD_TOLERANCES) \
        + [k for k in SLICE]
    missing = sorted({k for k in named if k not in db})
    assert not missing, f"not in op_db: {missing}"
    for key, why in cov.EXPECTED_FAILURES.items():
        assert isinstance(why, str) and why.strip(), key
        assert key[1] in (*cov.DTYPE_NAMES.values(), "grad"), key
        assert len(key) == 2 or key[2] in cov.MODES_CHECKED, key
    for key, (atol, rtol, why) in cov.TOLERANCES.items():
        assert why.strip(), key


def test_fallback_counts_as_failure():
    """A sample that runs an op on CPU torch is a "fallback", never a "pass"."""
    result = cov.check_op(cov.op_db()["nonzero"], torch.float32, "eager", max_samples=2)
    assert result.status == "fallback", result
    assert "aten::nonzero" in result.fallbacks
