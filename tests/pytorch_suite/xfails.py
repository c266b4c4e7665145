"""The known failures of PyTorch's device-generic tests on ``xla``: each entry names its
cause and what it waits for. Nothing else is disabled (see xla_device.py).

Keys are ``Class::test`` patterns (``fnmatch``: ``*`` for a dtype family); values are
``(cause, waits_for, modes)`` with ``modes`` None for every mode, or a tuple of
``eager`` / ``lazy-sync`` / ``opbyop``. A listed test that passes is reported as an
unexpected success, so the list cannot go stale silently. Measured in eager mode.
"""
from __future__ import annotations

import fnmatch

# Causes, each written once.
SPARSE = "xla tensors are dense: XLA has no sparse layout (torch_xla has none either)"
QUANTIZED = "quantized tensors on xla: XLA has no quantized types torch's kernels accept"
CONJ_BITS = ("torch's lazy conj/neg bits: xla computes the conjugate, so .imag of it is not "
             "flagged is_neg()")
CLAMPED_INDEX = ("XLA clamps out-of-range indices: xlanb raises torch's IndexError at the op "
                 "for index values the host has or can read without a sync (host lists and "
                 "tensors, computed ones in eager mode or after a sync); a pending index "
                 "tensor is checked in the graph of the next sync, so the error comes there, "
                 "not at the op; CUDA skips the same test")
WAITS = "issue 23 (PyTorch suite) follow-up"
XFAILS: dict[str, tuple[str, str, tuple | None]] = {
    # what XLA or xla tensors lack
    "TestTypePromotionXLA::test_sparse_*": (SPARSE, "none: by design", None),
    "TestOldViewOpsXLA::test_flatten_xla": (QUANTIZED, "none: no quantized types", None),
    "TestOldViewOpsXLA::test_ravel_xla": (QUANTIZED, "none: no quantized types", None),
    "TestShapeOpsXLA::test_flip_xla_float32": (QUANTIZED, "none: no quantized types", None),
    "TestViewOpsXLA::test_conj_imag_view_xla_*": (CONJ_BITS, WAITS, None),
    # raising where CPU torch raises
    "NumpyTestsXLA::test_trivial_fancy_out_of_bounds_xla": (CLAMPED_INDEX, "none: raised at the sync",
                                                            ("opbyop",)),
}


def xfail_cause(cls_name: str, test_name: str, mode: str) -> str | None:
    """The cause of ``cls_name::test_name``'s listed failure in ``mode``, else None."""
    full = f"{cls_name}::{test_name}"
    for pattern, (cause, _waits, modes) in XFAILS.items():
        if (modes is None or mode in modes) and fnmatch.fnmatchcase(full, pattern):
            return cause
    return None
