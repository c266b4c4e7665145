"""XLA:CPU's code generation, set before JAX makes its CPU client: no fused multiply-add.

LLVM, as XLA:CPU drives it, contracts a multiply and the add that uses it into one FMA
(one rounding instead of two) wherever the CPU has FMA, and where it does so depends on
the tier and on the fusion:
- the optimized tier contracts across ops: ``x * y + x`` in a graph was 1 ulp off, for
  30% of the elements, from the same ops run one by one and from CPU torch;
- the quick tier (LLVM -O0, XLA's legacy emitters) contracted ``uniform_``'s
  ``u * (high - low) + low`` inside a gather's fusion but not in the fusion that wrote the
  tensor out, so ``torch.take_along_dim(t, i)`` differed from ``t`` by an ulp within one
  executable (PyTorch's own ``test_take_along_dim`` in eager mode);
- a single op compiled alone (optimized) and the same op inside an eager run (quick)
  gave different values, and a lazy graph's values changed when it tiered up.

XLA has no switch for contraction itself. Its one lever is the newest instruction set
its code may use, read once, when the CPU client is made: ``--xla_cpu_max_isa=AVX``, the
newest x86 level without FMA. With it every tier and every fusion rounds each multiply
and each add on its own, as CPU torch's elementwise ops do: all six tier options measured
on the take_along_dim graph gave the same bits. Matmuls and reductions (YNNPACK, Eigen)
are libraries, unaffected. Its cost on the BERT step (lazy, steady, Intel Xeon, 2 cores):
0.21-0.22 s against 0.23-0.24 s; ``XLANB_CPU_FMA=1`` keeps FMA.
"""
from __future__ import annotations

import os
import platform
import warnings

from ..base.config import config
from .jax_compat import backends_started

NO_FMA_FLAG = "--xla_cpu_max_isa=AVX"
_X86 = ("x86_64", "amd64", "x86", "i686")


def prepare() -> None:
    """Before JAX makes its CPU client: no FMA in XLA:CPU's code (x86 only). The user's
    own ``--xla_cpu_max_isa`` wins. Set in ``XLA_FLAGS`` itself, so that child processes
    (``xlanb.launch``, ``xlanb.run``) compile as this one does; the executable store's
    keys hold ``XLA_FLAGS``. Too late (JAX's client already made): said once."""
    if config.cpu_fma or platform.machine().lower() not in _X86:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_max_isa" in flags:
        return
    if backends_started():
        warnings.warn(
            "xlanb: JAX made its CPU client before xlanb was imported, so XLA:CPU may fuse "
            "a multiply and an add into one FMA: a graph's values can then differ by an "
            f"ulp from op by op and between tiers. Import xlanb first, or set "
            f"XLA_FLAGS={NO_FMA_FLAG} (XLANB_CPU_FMA=1 accepts FMA and silences this).",
            RuntimeWarning, stacklevel=2)
        return
    os.environ["XLA_FLAGS"] = (flags + " " + NO_FMA_FLAG).strip()
