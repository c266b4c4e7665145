"""Op coverage measured against PyTorch's own OpInfo database (``op_db``).

``python -m tools.coverage`` runs every OpInfo's sample inputs on the ``xla`` device, in
eager mode and in lazy mode (with a sync after the op), compares each result with CPU
torch (``torch.testing.assert_close``), and writes ``docs/op-coverage.md``: per op and
dtype, pass / fail / CPU fallback / skipped with the reason, and totals per mode.

``tests/test_opinfo.py`` uses the same machinery (``check_op``, ``check_grad``) and the
same tables: ``TOLERANCES`` (looser tolerances, each with its reason), ``NONDETERMINISTIC``
(ops whose values are random or uninitialized: shape and dtype are compared, not values)
and ``EXPECTED_FAILURES`` (the one list of known failures, each with its reason; a test
that starts passing fails, so the list only shrinks).

A sample that runs any op on CPU torch (counted as ``aten::<op>`` in ``xlanb.metrics``)
is a "fallback", never a "pass".

Importing this module does not import torch's test database; ``op_db()`` does (it needs
the ``expecttest`` package, which torch's test utilities import).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import os
import sys
import time
import warnings
from typing import Iterable

import torch

import xlanb
# A tool, not a front end: it reaches into the session to forget work between samples.
from xlanb.pending import live
from xlanb.execute.graphs import clear_graph_cache

# ---------------------------------------------------------------------------------------
# What is checked

MODES_CHECKED = ("eager", "lazy")
DTYPES_CHECKED = (torch.float32, torch.int64, torch.bool)
#: Checked only for entries that support none of DTYPES_CHECKED (complex-only ops).
EXTRA_DTYPES = (torch.complex64,)
DTYPE_NAMES = {torch.float32: "float32", torch.int64: "int64", torch.bool: "bool",
               torch.complex64: "complex64"}

#: Samples per (op, dtype, mode): the first ones op_db gives (the CI slice and the full
#: run use the same number, so an expected failure fails in both).
MAX_SAMPLES = 6
#: Samples per op for the gradient comparison.
GRAD_SAMPLES = 3

#: Default tolerances: torch.testing.assert_close's defaults per dtype.
#: Looser tolerances, per op, each with its reason: op key -> (atol, rtol, reason).
TOLERANCES: dict[str, tuple[float, float, str]] = {
    "_upsample_bilinear2d_aa": (1e-4, 1e-5, "filter weights are computed in float64, then "
                                            "cast; torch computes them in float32"),
    "nn.functional.conv_transpose3d": (1e-3, 1e-5, "outputs reach ~1e3; XLA sums the 108 "
                                                   "products per output in another order"),
    "nn.functional.scaled_dot_product_attention": (
        1e-4, 1e-5, "softmax over scores near 50 in float32: XLA and torch fuse exp/sum "
                    "differently"),
    "erfinv": (1e-5, 1e-4, "the gradient exp(erfinv(x)^2) amplifies last-bit differences "
                           "near |x| = 1 (float32)"),
    "fft.hfft2": (1e-4, 1e-5, "pocketfft (torch) and XLA's FFT round differently"),
    "matrix_exp": (1e-2, 1e-4, "JAX's Padé order and scaling differ from torch's; entries "
                               "reach 1e5, errors stay near float32 eps times the norm"),
}

#: Looser tolerances for gradients only: op key -> (atol, rtol, reason).
GRAD_TOLERANCES: dict[str, tuple[float, float, str]] = {
    "logcumsumexp": (1e-2, 1e-2, "torch's float32 backward (a logcumsumexp of signed log "
                                 "gradients) is itself ~2e-3 from float64; ours is as close"),
    "nn.functional.layer_norm": (1e-4, 1e-4, "one-element rows: torch's mean leaves float "
                                             "noise that rstd = 1/sqrt(eps) amplifies"),
    "asin": (1e-5, 1e-5, "1/sqrt(1-x^2) near |x| = 1; lazy mode fuses it"),
    "atanh": (1e-5, 1e-5, "1/(1-x^2) near |x| = 1; lazy mode fuses it"),
    "ldexp": (1e-5, 1e-5, "x * 2^e * log(2) in one fused expression (lazy)"),
    "linalg.householder_product": (1e-4, 1e-5, "gradients reach ~20; float32 rounding of "
                                                "the reflector products"),
    "grid_sampler_3d": (2e-4, 1e-5, "input gradients sum up to 8 weighted taps, values "
                                     "reach ~100"),
}

#: Ops whose values are random or uninitialized memory: only shape and dtype are compared.
NONDETERMINISTIC: dict[str, str] = {
    "bernoulli": "random",
    "normal": "random",
    "normal.number_mean": "random",
    "normal.in_place": "random",
    "uniform": "random",
    "cauchy": "random",
    "exponential": "random",
    "geometric": "random",
    "log_normal": "random",
    "multinomial": "random",
    "rand_like": "random",
    "randn_like": "random",
    "randint_like": "random",
    "randint": "random",
    "randn": "random",
    "nn.functional.dropout": "random",
    "nn.functional.dropout2d": "random",
    "nn.functional.dropout3d": "random",
    "nn.functional.alpha_dropout": "random",
    "nn.functional.feature_alpha_dropout.with_train": "random",
    "nn.functional.rrelu": "random",
    "nn.functional.fractional_max_pool2d": "random pooling regions",
    "nn.functional.fractional_max_pool3d": "random pooling regions",
    "svd_lowrank": "random projection",
    "pca_lowrank": "random projection",
    "empty": "uninitialized memory",
    "empty_like": "uninitialized memory",
    "empty_strided": "uninitialized memory",
    "empty_permuted": "uninitialized memory",
    "new_empty": "uninitialized memory",
    "new_empty_strided": "uninitialized memory",
}

def _eig_signs(sample, out):
    """Eigenvectors are defined up to sign: make each column's largest entry positive."""
    w, v = out
    if v.numel() == 0:
        return w, v
    idx = v.abs().argmax(dim=-2, keepdim=True)
    sign = torch.sign(torch.gather(v, -2, idx))
    return w, v * torch.where(sign == 0, 1, sign)


def _arg(sample, pos, name, default):
    if len(sample.args) > pos:
        return sample.args[pos]
    return sample.kwargs.get(name, default)


def _gathered(dim_pos, values=True):
    """Ties make indices ambiguous: compare what the indices point at instead (for ops
    returning (values, indices), or indices alone when ``values`` is False)."""
    def canon(sample, out):
        if values and not isinstance(out, (tuple, list)):
            return out  # the overload without dim returns values only
        x = sample.input
        dim = _arg(sample, dim_pos, "dim", -1)
        keepdim = _arg(sample, dim_pos + 1, "keepdim", False) if values else True
        vals, idx = out if values else (None, out)
        if x.ndim == 0 or idx.numel() == 0:
            return out
        if not keepdim and idx.ndim < x.ndim:
            idx = idx.unsqueeze(dim)
        picked = torch.gather(x.expand(idx.shape) if idx.shape != x.shape and idx.ndim != x.ndim
                              else x, dim, idx)
        if not keepdim and picked.ndim > vals.ndim:
            picked = picked.squeeze(dim)
        return (vals, picked) if values else picked
    return canon


#: Outputs that are right in more than one way: op key -> (function mapping (CPU sample,
#: CPU-side output) to what is compared, reason).
CANONICAL: dict[str, tuple] = {
    "linalg.eigh": (_eig_signs, "eigenvector signs are arbitrary"),
    "mode": (_gathered(0), "which index of a repeated value CPU torch returns is "
                           "unspecified (its sort is unstable)"),
    "sort": (_gathered(0), "indices of equal elements: torch's default sort is not stable"),
    "argsort": (_gathered(0, values=False), "as sort"),
    "topk": (_gathered(1), "indices of equal elements are unspecified"),
    "kthvalue": (_gathered(1), "indices of equal elements are unspecified"),
    "median": (_gathered(0), "indices of equal elements are unspecified"),
    "nanmedian": (_gathered(0), "indices of equal elements are unspecified"),
}


def _batch_norm_eval(sample, out):
    """In eval mode CPU torch returns empty save_mean/save_invstd while its meta kernel
    (which xlanb follows) gives them shape (C,): only the normalized output is compared."""
    training = sample.args[4] if len(sample.args) > 4 else sample.kwargs.get("training")
    return out if training else out[:1]


CANONICAL.update({
    "native_batch_norm": (_batch_norm_eval, "eval mode: CPU's save_mean/save_invstd are "
                                            "empty, torch's meta kernel says (C,)"),
    "_native_batch_norm_legit": (_batch_norm_eval, "as native_batch_norm"),
})


def _dropout_p(sample, pos):
    p = sample.args[pos] if len(sample.args) > pos else None
    return sample.kwargs.get("dropout_p", p) or 0


#: Samples whose values are random although the op is not (dropout inside attention):
#: op key -> (predicate on the CPU sample, reason). Only shape and dtype are compared.
RANDOM_SAMPLES: dict[str, tuple] = {
    "nn.functional.scaled_dot_product_attention": (
        lambda s: _dropout_p(s, 4) > 0, "dropout_p > 0"),
    "nn.functional.multi_head_attention_forward": (
        lambda s: s.kwargs.get("training", True) and _dropout_p(s, 9) > 0,
        "dropout in training mode"),
}

# Reasons, shared by the entries of EXPECTED_FAILURES. "(core)" marks what the core
# (dispatch/opinfo/backend), not a lowering, has to change; the lowering is ready.
_DATA_DEPENDENT = ("the result's shape depends on the input's values; XLA compiles static "
                   "shapes, so the op runs on CPU torch (a counted fallback, by design)")
_DATA_DEPENDENT_BACKWARD = ("the backward uses an op whose result shape depends on values "
                            "(unique / boolean-mask indexing), which runs on CPU torch")
_LSTSQ = ("linalg_lstsq has no meta kernel, and its residuals' shape depends on the "
          "matrix rank (data)")
_SPARSE = "sparse layouts are not supported on the xla device: a clear error, by design"
_STORAGE = ("as_strided reaches outside its input view, into the base's storage; the "
            "device copy of a view has no such storage")
_LDL = "LDL with Bunch-Kaufman pivoting (LAPACK sytrf) has no XLA counterpart"
_CTC_TENSOR = ("lengths given as tensors go through _ctc_loss.Tensor, which has no meta "
               "kernel and a result shape set by the lengths' values (core: move the "
               "lengths to the host and call _ctc_loss, lowered, as CUDA does)")

#: The one list of expected failures: (op key, "float32" | "int64" | "bool" | "complex64" |
#: "grad")
#: -> reason, for both modes (lazy matches eager); (op key, dtype, mode) for one mode.
#: A listed case that passes fails its test: remove it from here.
EXPECTED_FAILURES: dict[tuple, str] = {
    ('combinations', 'float32'): _DATA_DEPENDENT,
    ('combinations', 'int64'): _DATA_DEPENDENT,
    ('combinations', 'bool'): _DATA_DEPENDENT,
    ('sparse.sampled_addmm', 'float32'): _SPARSE,
    ('sparse.mm.reduce', 'float32'): _SPARSE,
    ('masked_select', 'float32'): _DATA_DEPENDENT,
    ('masked_select', 'int64'): _DATA_DEPENDENT,
    ('masked_select', 'bool'): _DATA_DEPENDENT,
    ('as_strided.partial_views', 'float32'): _STORAGE,
    ('as_strided.partial_views', 'int64'): _STORAGE,
    ('as_strided.partial_views', 'bool'): _STORAGE,
    ('unique', 'float32'): _DATA_DEPENDENT,
    ('unique', 'int64'): _DATA_DEPENDENT,
    ('unique', 'bool'): _DATA_DEPENDENT,
    ('unique_consecutive', 'float32'): _DATA_DEPENDENT,
    ('unique_consecutive', 'int64'): _DATA_DEPENDENT,
    ('unique_consecutive', 'bool'): _DATA_DEPENDENT,
    ('bincount', 'int64'): _DATA_DEPENDENT,
    ('to_sparse', 'float32'): _SPARSE,
    ('to_sparse', 'int64'): _SPARSE,
    ('to_sparse', 'bool'): _SPARSE,
    ('nonzero', 'float32'): _DATA_DEPENDENT,
    ('nonzero', 'int64'): _DATA_DEPENDENT,
    ('nonzero', 'bool'): _DATA_DEPENDENT,
    ('argwhere', 'float32'): _DATA_DEPENDENT,
    ('argwhere', 'int64'): _DATA_DEPENDENT,
    ('argwhere', 'bool'): _DATA_DEPENDENT,
    ('nn.functional.ctc_loss', 'float32'): _CTC_TENSOR,
    ('repeat_interleave', 'float32'): _DATA_DEPENDENT,
    ('repeat_interleave', 'int64'): _DATA_DEPENDENT,
    ('repeat_interleave', 'bool'): _DATA_DEPENDENT,
    ('linalg.ldl_factor', 'float32'): _LDL,
    ('linalg.ldl_factor_ex', 'float32'): _LDL,
    ('linalg.ldl_solve', 'float32'): _LDL,
    ('linalg.lstsq', 'float32'): _LSTSQ,
    ('linalg.lstsq.grad_oriented', 'float32'): _LSTSQ,
    ('combinations', 'grad'): _DATA_DEPENDENT,
    ('sparse.sampled_addmm', 'grad'): _SPARSE,
    ('sparse.mm.reduce', 'grad'): _SPARSE,
    ('masked_select', 'grad'): _DATA_DEPENDENT,
    ('as_strided.partial_views', 'grad'): _STORAGE,
    ('index_fill', 'grad'): _DATA_DEPENDENT_BACKWARD,
    ('index_put', 'grad'): _DATA_DEPENDENT_BACKWARD,
    ('to_sparse', 'grad'): _SPARSE,
    ('nn.functional.ctc_loss', 'grad'): _CTC_TENSOR,
    ('linalg.lstsq', 'grad'): _LSTSQ,
    ('linalg.lstsq.grad_oriented', 'grad'): _LSTSQ,
}

def op_key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@functools.cache
def op_db() -> dict:
    """op key -> OpInfo, for every entry of torch's op_db."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db as db
    return {op_key(op): op for op in db}


def supported_dtypes(op) -> list[torch.dtype]:
    """The dtypes checked for ``op``: float32, int64 and bool where torch supports them;
    complex64 for ops that support none of these."""
    sup = op.supported_dtypes("cpu")
    main = [d for d in DTYPES_CHECKED if d in sup]
    return main or [d for d in EXTRA_DTYPES if d in sup]


def expected_failure(key: str, dtype, mode: str) -> str | None:
    """The reason ``key`` is expected to fail (dtype: a torch dtype, or "grad")."""
    name = DTYPE_NAMES.get(dtype, dtype)
    return EXPECTED_FAILURES.get((key, name, mode)) or EXPECTED_FAILURES.get((key, name))


# ---------------------------------------------------------------------------------------
# Running one op


@dataclasses.dataclass
class Result:
    status: str                 # pass | fail | fallback | skip
    reason: str = ""
    samples: int = 0            # samples run and compared
    skipped_samples: int = 0    # samples CPU torch itself rejects
    fallbacks: tuple = ()       # aten::<op> counters bumped
    seconds: float = 0.0


def _drain() -> None:
    """Run or forget whatever is pending, so one failure cannot poison the next op."""
    try:
        xlanb.sync()
        return
    except Exception:
        pass
    gc.collect()
    try:
        xlanb.sync()
    except Exception:
        live._live.clear()


def _map(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(e, fn) for e in x) if not hasattr(x, "_fields") else type(x)(*(_map(e, fn) for e in x))
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return x


def _to_xla(x):
    def one(t: torch.Tensor):
        if t.device.type != "cpu":
            return t
        r = t.detach().to("xla")
        return r.requires_grad_(t.requires_grad) if t.requires_grad else r
    return _map(x, one)


def _xla_device_args(x):
    if (isinstance(x, torch.device) and x.type == "cpu") or (isinstance(x, str) and x == "cpu"):
        return torch.device("xla", 0)
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return type(x)(_xla_device_args(e) for e in x)
    return x


#: Ops whose sample arguments (not the input) must stay CPU tensors, as torch requires.
ARGS_ON_CPU: dict[str, str] = {
    "tensor_split": "torch requires tensor_indices_or_sections on the CPU",
}


def _xla_sample(sample, key=""):
    inp = _to_xla(sample.input)
    on_cpu = key in ARGS_ON_CPU
    args = tuple(_xla_device_args(a if on_cpu else _to_xla(a)) for a in sample.args)
    kwargs = {k: (("xla" if v in ("cpu", torch.device("cpu")) else v) if k == "device"
                  else _xla_device_args(_to_xla(v)))
              for k, v in sample.kwargs.items()}
    return inp, args, kwargs


def _to_cpu(x):
    def one(t):
        return t.detach().cpu() if t.device.type == "xla" else t.detach()
    return _map(x, one)


def _forget_graphs() -> None:
    """Drop the compiled lazy graphs: every sample compiles its own (new shapes), none is
    reused, and keeping thousands of them costs gigabytes over op_db."""
    clear_graph_cache()


def _fallback_counters() -> dict[str, int]:
    return {n: xlanb.metrics.counter_value(n) or 0
            for n in xlanb.metrics.counter_names() if n.startswith("aten::")}


def _new_fallbacks(before: dict) -> list[str]:
    after = _fallback_counters()
    return sorted(n for n, v in after.items() if v > before.get(n, 0))


def _compare(got, want, key: str, values: bool, sample=None, device: bool = True,
             tolerances=None) -> None:
    """assert_close with the op's tolerance; on xla results, also the device."""
    canon = CANONICAL.get(key)
    if canon is not None and sample is not None:
        for t in _leaves(got):
            if t.device.type != "xla":
                raise AssertionError(f"result is on {t.device}, not on the xla device")
        got = canon[0](sample, _to_cpu(got))
        want = canon[0](sample, want)
        device = False
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"expected a tensor, got {type(got).__name__}")
        if device and got.device.type != "xla" and want.device.type == "cpu":
            raise AssertionError(f"result is on {got.device}, not on the xla device")
        g = got.detach().cpu()
        if g.dtype != want.dtype or g.shape != want.shape:
            raise AssertionError(f"result {g.dtype}{list(g.shape)}, torch gives "
                                 f"{want.dtype}{list(want.shape)}")
        if not values:
            return
        tol = (tolerances or {}).get(key) or TOLERANCES.get(key)
        kw = dict(atol=tol[0], rtol=tol[1]) if tol else {}
        torch.testing.assert_close(g, want.detach(), equal_nan=True, check_device=False, **kw)
        return
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            raise AssertionError(f"expected a sequence of {len(want)}, got {type(got).__name__}")
        for g, w in zip(got, want):
            _compare(g, w, key, values, device=device, tolerances=tolerances)
        return
    if isinstance(want, float) and isinstance(got, float) and values:
        torch.testing.assert_close(got, want, equal_nan=True)
        return
    if values and got != want and not (got is None and want is None):
        raise AssertionError(f"got {got!r}, torch gives {want!r}")


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    text = msg[0] if msg else ""
    if isinstance(e, AssertionError) and len(msg) > 1:
        text = " ".join(m.strip() for m in msg[:3])
    return f"{type(e).__name__}: {text}"[:300]


def samples_of(op, dtype, *, requires_grad=False, max_samples=None):
    torch.manual_seed(0)
    out = []
    with warnings.catch_warnings(), _no_test_fn_lookup():
        warnings.simplefilter("ignore")
        for s in op.sample_inputs("cpu", dtype, requires_grad=requires_grad):
            out.append(s)
            if max_samples is not None and len(out) >= max_samples:
                break
    return out


@contextlib.contextmanager
def _no_test_fn_lookup():
    """torch's ``sample_inputs`` looks for the running ``unittest.TestCase`` (its
    per-sample skips) with ``inspect.stack()``, which reads the source of every frame on
    each call: most of test_opinfo's time under pytest's deep stacks. These samples are
    drawn outside any TestCase, where the lookup finds nothing."""
    from torch.testing._internal.opinfo import core
    real = core.extract_test_fn
    core.extract_test_fn = lambda: None
    try:
        yield
    finally:
        core.extract_test_fn = real


class _SkipSample(Exception):
    """CPU torch gives nothing to compare this sample with."""


def _run_samples(samples, mode: str, t0: float, reference, check, *, all_skipped: str,
                 no_samples: str) -> Result:
    """The loop check_op and check_grad share. ``reference(sample)`` computes CPU torch's
    answer: a sample where it raises (CPU torch rejects it, or _SkipSample) is skipped.
    ``check(sample, answer)`` runs the sample on xla in ``mode`` and compares; the first
    failure is reported, and an op that ran on CPU instead makes the result a fallback."""
    n = skipped = 0
    fallbacks: set = set()
    failure = None
    for sample in samples:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                answer = reference(sample)
        except Exception:
            skipped += 1
            continue
        before = _fallback_counters()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check(sample, answer)
        except Exception as e:
            failure = failure or f"{_first_line(e)} [sample {n + skipped}: {_describe(sample)}]"
            _drain()
        n += 1
        fallbacks.update(_new_fallbacks(before))
    dt = time.perf_counter() - t0
    if mode != "eager":
        _forget_graphs()
    if failure:
        return Result("fail", failure, n, skipped, tuple(sorted(fallbacks)), dt)
    if fallbacks:
        return Result("fallback", "runs on CPU: " + ", ".join(sorted(fallbacks)), n, skipped,
                      tuple(sorted(fallbacks)), dt)
    if n == 0:
        return Result("skip", all_skipped if skipped else no_samples, 0, skipped, (), dt)
    return Result("pass", "", n, skipped, (), dt)


def check_op(op, dtype: torch.dtype, mode: str, *, max_samples: int | None = MAX_SAMPLES) -> Result:
    """Run ``op``'s samples of ``dtype`` on xla in ``mode``; compare with CPU torch."""
    key = op_key(op)
    t0 = time.perf_counter()
    values = key not in NONDETERMINISTIC
    try:
        samples = samples_of(op, dtype, max_samples=max_samples)
    except Exception as e:
        return Result("skip", f"sample inputs fail on CPU: {_first_line(e)}")
    fn = op.op

    def reference(sample):
        torch.manual_seed(0)
        return fn(sample.input, *sample.args, **sample.kwargs)

    def check(sample, want):
        inp, args, kwargs = _xla_sample(sample, key)
        with xlanb.mode(mode):
            torch.manual_seed(0)
            got = fn(inp, *args, **kwargs)
            if mode != "eager":
                xlanb.sync()
        rs = RANDOM_SAMPLES.get(key)
        _compare(got, want, key, values and not (rs and rs[0](sample)), sample)

    return _run_samples(samples, mode, t0, reference, check,
                        all_skipped="CPU torch rejects every sample", no_samples="no samples")


def _describe(sample) -> str:
    def d(x):
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
        if isinstance(x, (list, tuple)):
            return "[" + ", ".join(d(e) for e in x) + "]"
        return repr(x)
    parts = [d(sample.input)] + [d(a) for a in sample.args] + [f"{k}={d(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)[:160]


class _Sample:
    """A SampleInput-like holder for the device copy of a sample."""

    def __init__(self, input, args, kwargs):  # noqa: A002
        self.input, self.args, self.kwargs = input, args, kwargs


def _canonical(key, sample, out):
    canon = CANONICAL.get(key)
    return canon[0](sample, out) if canon is not None else out


def check_grad(op, mode: str, *, max_samples: int = GRAD_SAMPLES) -> Result:
    """Gradients through ``op`` on xla match CPU torch's (float32, first samples)."""
    key = op_key(op)
    t0 = time.perf_counter()
    try:
        samples = samples_of(op, torch.float32, requires_grad=True, max_samples=max_samples)
    except Exception as e:
        return Result("skip", f"sample inputs fail on CPU: {_first_line(e)}")

    def reference(sample):
        leaves = [t for t in _leaves((sample.input, sample.args, sample.kwargs))
                  if t.requires_grad and t.is_floating_point()]
        if not leaves:
            raise _SkipSample
        out = sample.output_process_fn_grad(op.op(sample.input, *sample.args, **sample.kwargs))
        out = _canonical(key, sample, out)
        outs = [o for o in _leaves(out) if o.requires_grad]
        if not outs:
            raise _SkipSample
        torch.manual_seed(1)
        cots = [torch.randn_like(o) for o in outs]
        return cots, torch.autograd.grad(outs, leaves, cots, allow_unused=True)

    def check(sample, answer):
        cots, want = answer
        inp, args, kwargs = _xla_sample(sample, key)
        xleaves = [t for t in _leaves((inp, args, kwargs))
                   if t.requires_grad and t.is_floating_point()]
        with xlanb.mode(mode):
            out = sample.output_process_fn_grad(op.op(inp, *args, **kwargs))
            out = _canonical(key, _Sample(inp, args, kwargs), out)
            xouts = [o for o in _leaves(out) if o.requires_grad]
            got = torch.autograd.grad(xouts, xleaves, [c.to("xla") for c in cots],
                                      allow_unused=True)
            if mode != "eager":
                xlanb.sync()
        rs = RANDOM_SAMPLES.get(key)
        values = not (rs and rs[0](sample))
        for g, w in zip(got, want):
            if w is None:
                continue
            if g is None:
                raise AssertionError("gradient missing on xla")
            _compare(g, w, key, values, tolerances=GRAD_TOLERANCES)

    none = "no differentiable samples"
    return _run_samples(samples, mode, t0, reference, check, all_skipped=none, no_samples=none)


def _leaves(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for e in x:
            yield from _leaves(e)
    elif isinstance(x, dict):
        for e in x.values():
            yield from _leaves(e)


# ---------------------------------------------------------------------------------------
# The report


def run(keys: Iterable[str] | None = None, modes=MODES_CHECKED, dtypes=DTYPES_CHECKED + EXTRA_DTYPES,
        max_samples: int | None = MAX_SAMPLES, progress=None) -> dict:
    """{(op key, dtype name, mode): Result} for the chosen ops (default: all of op_db)."""
    db = op_db()
    keys = list(db) if keys is None else list(keys)
    results = {}
    xlanb.config.warn_fallbacks = False
    for i, key in enumerate(keys):
        op = db[key]
        sup = supported_dtypes(op)
        for dtype in dtypes:
            if dtype in EXTRA_DTYPES and dtype not in sup:
                continue  # only complex-only ops get a complex64 row
            for mode in modes:
                if dtype not in sup:
                    r = Result("skip", "dtype not supported by torch on CPU")
                else:
                    try:
                        r = check_op(op, dtype, mode, max_samples=max_samples)
                    except Exception as e:  # the harness itself must never stop the report
                        r = Result("fail", f"harness: {_first_line(e)}")
                        _drain()
                results[(key, DTYPE_NAMES[dtype], mode)] = r
                if progress:
                    progress(i, len(keys), key, DTYPE_NAMES[dtype], mode, r)
    return results


def grad_keys(keys=None) -> list[str]:
    """The op keys whose gradients are compared: differentiable, float32, not random."""
    db = op_db()
    keys = list(db) if keys is None else list(keys)
    return [k for k in keys if db[k].supports_autograd and k not in NONDETERMINISTIC
            and torch.float32 in supported_dtypes(db[k])]


_WORKER_TAG = "@@xlanb-coverage "


def _grad_worker(modes) -> int:
    """Child process: read op keys from stdin, print one tagged JSON line per result."""
    import json
    xlanb.config.warn_fallbacks = False
    db = op_db()
    for line in sys.stdin:
        key = line.strip()
        if not key:
            continue
        print(_WORKER_TAG + json.dumps({"start": key}), flush=True)
        for mode in modes:
            try:
                r = check_grad(db[key], mode)
            except Exception as e:
                r = Result("fail", f"harness: {_first_line(e)}")
                _drain()
            print(_WORKER_TAG + json.dumps({"key": key, "mode": mode, **dataclasses.asdict(r)}),
                  flush=True)
    return 0


def run_grads(keys=None, modes=MODES_CHECKED, progress=None) -> dict:
    """{(op key, "grad", mode): Result}, each op's backward compared with CPU torch.

    Runs in child processes: an error inside one of torch's C++ backward kernels can
    abort the process (see EXPECTED_FAILURES), and the report must survive it. A child
    that dies marks the op it was running as "fail" and a new child takes the rest."""
    import json
    import subprocess
    todo = grad_keys(keys)
    total = len(todo)
    results: dict = {}
    while todo:
        chunk = todo[:_GRAD_CHUNK]  # a fresh process per chunk bounds its memory too
        proc = subprocess.Popen(
            [sys.executable, "-m", "tools.coverage", "--grad-worker", "--modes", ",".join(modes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        proc.stdin.write("\n".join(chunk) + "\n")
        proc.stdin.close()
        current = None
        for line in proc.stdout:
            if not line.startswith(_WORKER_TAG):
                continue
            msg = json.loads(line[len(_WORKER_TAG):])
            if "start" in msg:
                current = msg["start"]
                continue
            key, mode = msg.pop("key"), msg.pop("mode")
            msg["fallbacks"] = tuple(msg["fallbacks"])
            r = results[(key, "grad", mode)] = Result(**msg)
            if progress:
                progress(total - len(todo) + chunk.index(key), total, key, "grad", mode, r)
        rc = proc.wait()
        done = {k for k, _, _ in results}
        if current is not None and rc != 0:
            for mode in modes:
                if (current, "grad", mode) not in results:
                    r = results[(current, "grad", mode)] = Result(
                        "fail", f"the process died (exit status {rc}) in the backward")
                    if progress:
                        progress(total - len(todo) + chunk.index(current), total, current,
                                 "grad", mode, r)
            done.add(current)
        rest = [k for k in todo if k not in done]
        if len(rest) == len(todo):  # no progress at all: do not loop forever
            for k in chunk:
                for mode in modes:
                    results[(k, "grad", mode)] = Result("fail", f"worker failed (exit {rc})")
            rest = todo[len(chunk):]
        todo = rest
    return results


_GRAD_CHUNK = 80


STATUSES = ("pass", "fallback", "fail", "skip")


def totals(results: dict) -> dict:
    """{(dtype name, mode): {status: count}} over the results."""
    out: dict = {}
    for (key, dt, mode), r in results.items():
        c = out.setdefault((dt, mode), dict.fromkeys(STATUSES, 0))
        c[r.status] += 1
    return out


def _cell(r: Result | None) -> str:
    if r is None:
        return ""
    return {"pass": "pass", "fallback": "**CPU**", "fail": "**FAIL**", "skip": "skip"}[r.status]


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


_NO_DTYPE = "dtype not supported by torch on CPU"


def headline(results: dict, mode: str = "eager") -> dict:
    """The target's numbers: per op_db entry, its float32 samples in ``mode`` (an entry
    with no float32 dtype is judged by its int64, else bool, samples). Entries that CPU
    torch cannot run at all (CUDA-only ops) are counted apart: there is nothing to
    compare with."""
    keys = list(dict.fromkeys(k[0] for k in results))
    out = {"entries": len(keys), "pass": 0, "not_float32": 0, "not_runnable": [],
           "failing": []}
    for key in keys:
        primary = None
        for dt in ("float32", "int64", "bool", "complex64"):
            r = results.get((key, dt, mode))
            if r is not None and not (r.status == "skip" and r.reason == _NO_DTYPE):
                primary = (dt, r)
                break
        if primary is None or primary[1].status == "skip":
            out["not_runnable"].append(key)
            continue
        if primary[0] != "float32":
            out["not_float32"] += 1
        if primary[1].status == "pass":
            out["pass"] += 1
        else:
            out["failing"].append(key)
    return out


def render(results: dict, *, seconds: float | None = None, max_samples=MAX_SAMPLES) -> str:
    """docs/op-coverage.md: the headline, totals per mode and dtype, the expected
    failures with their reasons, everything else that does not pass, and every op."""
    modes = [m for m in MODES_CHECKED if any(k[2] == m for k in results)]
    cols = [d for d in ("float32", "int64", "bool", "complex64", "grad")
            if any(k[1] == d for k in results)]
    keys = list(dict.fromkeys(k[0] for k in results))
    tot = totals(results)
    lines = [
        "# Op coverage against PyTorch's OpInfo database", "",
        f"Generated by `python -m tools.coverage` (torch {torch.__version__}, "
        f"{len(keys)} op_db entries, the first {max_samples} sample inputs per op and dtype, "
        f"{GRAD_SAMPLES} for gradients" + (f"; {seconds / 60:.0f} min" if seconds else "") + ").",
        "",
        "Each sample runs on the `xla` device and is compared with CPU torch by "
        "`torch.testing.assert_close` (torch's default tolerances unless the op has its own, "
        "with the reason, in `TOLERANCES`). **eager** runs the op at once; **lazy** records "
        "it and syncs after it. **grad** compares the gradients of the op's float32 "
        "samples (a random cotangent, `torch.autograd.grad`) with CPU torch's.",
        "",
        "- **pass**: every sample matches, and nothing ran on CPU torch;",
        "- **CPU**: the values match, but an op ran on CPU torch (an `aten::<op>` counter);",
        "- **FAIL**: an error or a mismatch;",
        "- **skip**: torch has no such dtype for the op, or CPU torch rejects every sample.",
        "",
        "Random ops and uninitialized memory are compared by shape and dtype only. The tables "
        "(tolerances, random ops, `EXPECTED_FAILURES`) live in `tools/coverage.py`; "
        "`tests/test_opinfo.py` checks the same cases (a CI slice; "
        "`XLANB_OPINFO=full python -m pytest tests/test_opinfo.py` for every op).",
    ]
    for mode in modes:
        h = headline(results, mode)
        runnable = h["entries"] - len(h["not_runnable"])
        lines += ["", f"**{mode}: {h['pass']} of {h['entries']} op_db entries pass "
                      f"({100 * h['pass'] / max(h['entries'], 1):.1f}%); "
                      f"{h['pass']} of the {runnable} that CPU torch can run "
                      f"({100 * h['pass'] / max(runnable, 1):.1f}%).** Float32 samples; the "
                      f"{h['not_float32']} entries with no float32 dtype are judged by their "
                      "int64 (else bool, else complex64) samples. Not checked: "
                      + (", ".join(f"`{k}`" for k in h["not_runnable"]) or "none")
                      + " (CUDA-only or float8-only ops: CPU torch has nothing to compare "
                        "with, or xlanb has no float8 dtype)."]
    if "eager" in modes and "lazy" in modes:
        diff = [f"`{k}` ({d})" for (k, d, m), r in results.items() if m == "lazy"
                and (k, d, "eager") in results and results[(k, d, "eager")].status != r.status]
        lines += ["", "Lazy matches eager on every entry and dtype." if not diff else
                  "Lazy and eager differ on: " + ", ".join(diff) + "."]
    lines += ["", "## Totals", "",
              "| samples | mode | pass | CPU fallback | fail | skip |",
              "|---|---|---|---|---|---|"]
    for dt in cols:
        for m in modes:
            c = tot.get((dt, m))
            if c:
                lines.append(f"| {dt} | {m} | {c['pass']} | {c['fallback']} | {c['fail']} | "
                             f"{c['skip']} |")
    # Entries that do not pass: the expected ones (grouped by reason), then any other
    expected, other = {}, []
    for (key, dt, m), r in results.items():
        if r.status not in ("fail", "fallback"):
            continue
        why = expected_failure(key, dt, m)
        if why:
            expected.setdefault(why, []).append((key, dt, m, r))
        else:
            other.append((key, dt, m, r))
    lines += ["", "## Expected failures", "",
              "`EXPECTED_FAILURES` in `tools/coverage.py`, grouped by reason. A listed case "
              "that starts to pass fails its test, so the list only shrinks.", ""]
    for why, cases in expected.items():
        lines.append(f"- {_md_escape(why)}")
        by_key: dict = {}
        for key, dt, m, r in cases:
            by_key.setdefault(key, []).append(f"{dt} {m}")
        lines.append("  " + "; ".join(f"`{k}` ({', '.join(v)})" for k, v in by_key.items()))
    lines += ["", "## Other entries that do not pass", ""]
    if other:
        lines += ["| op | samples | mode | status | reason |", "|---|---|---|---|---|"]
        lines += [f"| `{k}` | {dt} | {m} | {r.status} | {_md_escape(r.reason)} |"
                  for k, dt, m, r in other]
    else:
        lines.append("None.")
    skipped = [(k, r) for (k, dt, m), r in results.items()
               if r.status == "skip" and r.reason != _NO_DTYPE and m == modes[0]]
    if skipped:
        lines += ["", "## Skipped", ""]
        seen = set()
        for k, r in skipped:
            if k not in seen:
                seen.add(k)
                lines.append(f"- `{k}`: {_md_escape(r.reason)}")
    lines += ["", "## Every op", "",
              "| op | " + " | ".join(f"{dt} {m}" for dt in cols for m in modes) + " |",
              "|---|" + "---|" * (len(cols) * len(modes))]
    for key in keys:
        lines.append(f"| `{key}` | " + " | ".join(_cell(results.get((key, dt, m)))
                                                  for dt in cols for m in modes) + " |")
    return "\n".join(lines) + "\n"


def _kept_sections(text: str, path: str) -> str:
    """``text`` with the section another tool writes into the same file kept: the model
    zoo's (``python -m tools.model_zoo``), before "## Every op"."""
    from tools.model_zoo import BEGIN, END
    try:
        with open(path) as f:
            old = f.read()
    except OSError:
        return text
    if BEGIN not in old or END not in old:
        return text
    section = BEGIN + old.split(BEGIN, 1)[1].split(END, 1)[0] + END
    head, sep, tail = text.partition("## Every op")
    return head + section + "\n\n" + sep + tail


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.coverage",
                                description="Op coverage against torch's OpInfo database.")
    p.add_argument("--ops", help="comma-separated op keys (default: all of op_db)")
    p.add_argument("--modes", default=",".join(MODES_CHECKED))
    p.add_argument("--dtypes", default=",".join(DTYPE_NAMES.values()),
                   help="complex64 is run only for ops with none of the others")
    p.add_argument("--max-samples", type=int, default=MAX_SAMPLES)
    p.add_argument("--out", default=os.path.join("docs", "op-coverage.md"),
                   help="markdown report path ('' to skip writing)")
    p.add_argument("--json", default="", help="also write the raw results here")
    p.add_argument("--no-grad", action="store_true", help="skip the gradient comparison")
    p.add_argument("--grad-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="store_true", help="print every result")
    a = p.parse_args(argv)
    if a.grad_worker:
        return _grad_worker(a.modes.split(","))
    by_name = {v: k for k, v in DTYPE_NAMES.items()}
    dtypes = [by_name[d] for d in a.dtypes.split(",")]
    modes = a.modes.split(",")
    keys = a.ops.split(",") if a.ops else None

    def progress(i, n, key, dt, mode, r):
        if a.verbose or r.status in ("fail", "fallback"):
            print(f"[{i + 1}/{n}] {key} {dt} {mode}: {r.status} {r.reason}", flush=True)

    t0 = time.perf_counter()
    results = run(keys, modes, dtypes, a.max_samples, progress)
    if not a.no_grad:
        results.update(run_grads(keys, modes, progress))
    seconds = time.perf_counter() - t0
    print()
    print("samples  mode    pass  fallback  fail  skip")
    for (dt, m), c in totals(results).items():
        print(f"{dt:8} {m:6} {c['pass']:5} {c['fallback']:9} {c['fail']:5} {c['skip']:5}")
    for m in modes:
        h = headline(results, m)
        if h["entries"]:
            print(f"{m}: {h['pass']}/{h['entries']} entries pass "
                  f"({100 * h['pass'] / h['entries']:.1f}%)")
    print(f"{seconds:.0f} s")
    if a.json:
        import json
        with open(a.json, "w") as f:
            json.dump([[k, d, m, dataclasses.asdict(r)] for (k, d, m), r in results.items()], f)
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        text = _kept_sections(render(results, seconds=seconds, max_samples=a.max_samples), a.out)
        with open(a.out, "w") as f:
            f.write(text)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
