"""Compiling single-op executables on background threads (eager mode, op-by-op runs).

Lowering happens on the calling thread, so an op without a working lowering fails at its
own line; XLA compiles on one of the compile threads, without the GIL, so compiles overlap
each other and the Python that follows."""
from __future__ import annotations

import concurrent.futures
import time

from ..base import metrics
from ..base.session import session
from ..ir import OpInfo
from ..runtime.jit import background
from .compile import compile_op, load_stored, lower_op, op_store_key
from .resident import admit

_in_flight = session.in_flight  # Futures of background compiles not yet seen done


def compile_op_ahead(info: OpInfo):
    """Start compiling ``info``'s single-op executable; returns its Future. Lowering
    happens here, so an op without a working lowering fails at its own line; XLA's
    compile runs on a background thread. An executable in the store is loaded now."""
    if info.compiling is None:
        key = op_store_key(info)
        exe = load_stored(key, info.device, "OpCompileTime")
        if exe is not None:
            future = concurrent.futures.Future()
            future.set_result(exe)
        else:
            t0 = time.perf_counter()
            lowered = lower_op(info)
            future = background(_compile_off_thread, lowered, info.device, key,
                                time.perf_counter() - t0)
            # Eager mode asks compiles_in_flight only while ops wait, so finished ones
            # also leave here: a finished Future holds its executable (with its code
            # mappings) after the info has dropped it.
            _drop_finished()
            _in_flight.append(future)
        info.compiling = future
        admit(info)
        metrics.counter("OpCompile")
    return info.compiling


def _compile_off_thread(lowered, device: int, key: str | None, lower_s: float):
    t0 = time.perf_counter()
    try:
        return compile_op(lowered, device, key, lower_s)
    finally:
        metrics.record("OpBackgroundCompileTime", time.perf_counter() - t0)


def _drop_finished() -> None:
    """Forget the finished Futures at the front (the oldest finish first)."""
    while _in_flight and _in_flight[0].done():
        del _in_flight[0]


def compiles_in_flight() -> bool:
    """Whether a background single-op compile is still running."""
    _drop_finished()
    return bool(_in_flight)
