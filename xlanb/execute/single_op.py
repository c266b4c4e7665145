"""Single-op executables: eager mode, op-by-op runs and peeks share one per signature."""
from __future__ import annotations

import time

from ..base import metrics
from ..ir import OpInfo
from .checks import DivisorChecked, integer_division
from .compile import compile_op, load_stored, lower_op, op_store_key


def op_executable(info: OpInfo):
    """``info``'s single-op executable: cached, loaded from the executable store,
    compiled now, or collected from the background compile ``compile_op_ahead`` started."""
    exe = info.exe
    if exe is not None:
        metrics.counter("OpCacheHit")
        return exe
    pending = info.compiling
    exe = None
    if pending is not None:
        t0 = time.perf_counter()
        try:
            exe = pending.result()  # an interrupt here keeps the compile for next time
        except Exception:  # compiled again below, so the error is raised on this thread
            info.compiling = None
        finally:
            metrics.record("OpCompileWaitTime", time.perf_counter() - t0)
    if exe is None:
        key = op_store_key(info)
        exe = load_stored(key, info.device, "OpCompileTime")
        if exe is None:
            t0 = time.perf_counter()
            lowered = lower_op(info)
            exe = compile_op(lowered, info.device, key, time.perf_counter() - t0)
        if pending is None:
            metrics.counter("OpCompile")
    if integer_division(info):
        exe = DivisorChecked(exe, info)
    info.exe = exe
    info.compiling = None
    return exe


def direct_call(exe):
    """The C++ call inside a ``jax.stages.Compiled`` that has run once: calling it skips
    ``Compiled.__call__``'s Python frame on eager's per-op path (the executable itself
    when a JAX version has no such attribute)."""
    return getattr(exe, "_call", None) or exe
