"""Compiling single-op executables on background threads (eager mode, op-by-op runs).

Lowering happens on the calling thread, so an op without a working lowering fails at its
own line; XLA compiles on one of the compile threads, without the GIL, so compiles overlap
each other and the Python that follows."""
from __future__ import annotations

import concurrent.futures
import time

from ..base import metrics
from ..base.caches import cache
from ..ir.nodes import OpSignature
from ..runtime.jit import background
from ..values.checks import checked
from .compile import Build
from .resident import admit

_in_flight = cache([], "Futures of background single-op compiles not yet seen done")


def compile_op_ahead(info: OpSignature, quick: bool = False):
    """Start compiling ``info``'s single-op executable; returns its Future. Lowering
    happens here, so an op without a working lowering fails at its own line; XLA's
    compile runs on a background thread. An executable in the store is loaded now.

    ``quick`` (someone waits for the value): the Future's executable is compiled with
    LLVM's optimizations off, and the optimized one compiles after every compile that
    someone waits for; it takes the quick one's place at a fixed use
    (``single_op.op_executable``)."""
    if info.compiling is None:
        start_prepared(info, prepare_op(info), quick)
    return info.compiling


def prepare_op(info: OpSignature) -> tuple:
    """What ``start_prepared`` needs, made on this thread: ``info``'s build and its
    stored executable, or else the build lowered."""
    build = Build.op(info)
    exe = build.stored()
    if exe is None:
        build.lower()
    return build, exe


def start_prepared(info: OpSignature, prepared: tuple, quick: bool = False) -> None:
    """Start the compile of a ``prepare_op`` result (nothing if ``info`` got an
    executable or a compile meanwhile)."""
    if info.compiling is not None or info.exe is not None:
        return
    build, exe = prepared
    quicker = build.at("op_quick") if quick else None
    if quicker is not None and quicker.options is None:
        quicker = None  # no quicker tier on this platform
    better = None
    if exe is not None:
        future = concurrent.futures.Future()
        future.set_result(exe)
    else:
        if quicker is None:
            future = background(_compile_off_thread, build)
        else:  # the quick one is not stored: its optimized one replaces it, and is
            future = background(_compile_off_thread, quicker, keep=False)
            metrics.counter("OpQuickCompile")
            better = background(_compile_off_thread, build, later=True,
                                metric="OpTierUpCompileTime")
        # Eager mode asks compiles_in_flight only while ops wait, so finished ones
        # also leave here: a finished Future holds its executable (with its code
        # mappings) after the info has dropped it.
        _drop_finished()
        _in_flight.append(future)
    info.compiling = future
    info.tiering = better
    admit(info)
    metrics.counter("OpCompile")


# Single ops a first look ran as part of its prefix graph (executables/prefix.py): lowered,
# and their compiles started, while the main thread next waits for a graph compile or run.
_lower_soon = cache([], "OpInfos a look left to lower at the next graph compile")


def lower_soon(infos) -> None:
    # Ops that got an executable meanwhile (an op-by-op sync compiles what it runs) leave:
    # in opbyop mode no graph ever drains the list.
    _lower_soon[:] = [i for i in _lower_soon if i.exe is None and i.compiling is None]
    _lower_soon.extend(infos)


def lowerings_waiting() -> bool:
    return bool(_lower_soon)


def drain_lowerings(stop) -> None:
    """Lower the queued single ops and start their compiles, until ``stop()`` is true;
    an op whose lowering fails is left for its own run to report. (Not queued ``later``:
    a look may wait for one of them while ``later`` tasks are held.)"""
    while _lower_soon and not stop():
        info = _lower_soon.pop(0)
        if info.compiling is None and info.exe is None:
            try:
                compile_op_ahead(info)
            except Exception:  # noqa: BLE001 - raised again, at its line, when it runs
                pass


def _compile_off_thread(build: Build, **how):
    t0 = time.perf_counter()
    try:
        return build.compile(**how)
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
