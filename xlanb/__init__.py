"""xlanb: debug PyTorch programs on XLA devices from notebooks, IPython and pdb.

Tensors live on the torch device ``xla``; JAX compiles and runs them. Three execution
modes (lazy, eager, opbyop) can be switched at any time, and looking at a tensor never
changes what the next sync compiles.

This module is the public API: front ends (extensions/, kernel/) use only what it
exports. The layers below it are listed, lowest first, in docs/DESIGN.md.
"""
from __future__ import annotations

import time

import torch

# First: on a torch that cannot work, one line that says which torch works, before any
# lowering asks torch for an op it lacks.
from .base import torch_compat as _torch_compat
_torch_compat.check()
_torch_compat.patch()

from . import lowering as _lowering  # noqa: F401  (fills the lowering registry)
from .dispatch.backend import register as _register
from .base import metrics
from .base import rng as _rng
from .base.config import MODES, check_mode, config
from .base.formats import (format_bytes, format_cell_loc, format_duration, format_fits, format_hash,
                           format_location, format_pct, format_table, format_table_html)
from .base.frames import (SourceLoc, debugger_active, file_label, is_internal_frame, is_xlanb_module,
                          register_internal, set_location_labeler)
from .base.scopes import install_scope_hooks as _install_scope_hooks
from .base.session import session as _session, starting_mode as _starting_mode
from .capture.function import CompiledFunction, compile
from .debugging.compare import CompareReport, CompareRow, compare_cpu
from .debugging.debug_nans import debug_nans, where_made
from .debugging.profile import Profile, ProfileTable, profile
from .executables.background import compiles_in_flight as _compiles_in_flight
from .execute.nans import NonFiniteError
from .executables.resident import ExecutableLimitError
from .values.memory import (DeviceMemoryError, GraphBuffer, GraphMemory, MemoryByLine,
                             MemoryForecast,
                             MemoryLimit,
                             MemoryRow, MemorySample, MemoryTimeline, max_memory_allocated,
                             memory_allocated, memory_by_line, memory_limit, memory_stats,
                             memory_reserved, max_memory_reserved,
                             memory_summary, memory_timeline, reset_peak_memory_stats,
                             set_memory_line_bytes)
from .execute.graphs import (Column, CompiledGraph, GraphList, RecompileError, RecompileWarning,
                             compile_summary, graph_columns, graphs)
from .graph.compile_time import CompilePart, CompileProfile, CompileRow, CompileSummary
from .executables.target import (PaddingList, PaddingRow, ReportSection, TargetCost, TargetReport,
                                 get_target, set_target, target)
from .graph.explain import SummaryDiff, diff_summaries, explain
from .graph.render import render_dot, render_svg, render_text
from .graph.summary import GraphSummary, OpRecord
from .inspect import repr as _repr  # noqa: F401  (installs how tensors print)
from .inspect.pending import (collectives, compile_for, hlo, pending_count, pending_ir,
                             pending_memory, pending_summary)
from .modes.switch import get_mode, mode, set_mode, switch_mode
from .dispatch.reads import peek_host as _peek_host
from .pending.realize import sync
from .runtime.devices import device_count, jax_device as _jax_device
from .runtime.targets import CHIPS, Target, TargetError
from .ir.tensor import XlaTensor
from . import spmd
from . import distributed
from .loops.scan import scan, scan_layers
from .loops.barrier import optimization_barrier_

_register()
_install_scope_hooks()
if config.debug_nans:  # XLANB_DEBUG_NANS=1
    debug_nans(True)
if config.target:  # XLANB_TARGET=v5e:2x2
    try:
        set_target(config.target)
    except (ValueError, ImportError) as _e:
        raise type(_e)(f"XLANB_TARGET={config.target!r}: {_e}") from None

__all__ = ["device", "device_count", "set_mode", "switch_mode", "get_mode", "mode", "MODES", "check_mode",
           "sync", "mark_step", "peek", "reset", "optimize_hot_graphs", "pending_ir", "pending_count",
           "pending_summary", "render_svg", "render_text", "render_dot", "hlo", "graphs",
           "GraphList", "GraphSummary", "OpRecord", "SourceLoc", "explain", "diff_summaries",
           "SummaryDiff",
           "RecompileWarning", "RecompileError", "metrics", "config", "XlaTensor", "CompiledGraph",
           "manual_seed", "set_trace", "compile", "CompiledFunction", "debugger_active",
           "format_table", "format_table_html", "format_bytes", "format_duration", "format_cell_loc",
           "format_hash", "format_pct", "format_fits", "format_location",
           "set_location_labeler", "file_label", "register_internal", "is_internal_frame",
           "is_xlanb_module", "debug_nans", "NonFiniteError",
           "ExecutableLimitError", "where_made",
           "compare_cpu", "CompareReport", "CompareRow", "profile", "Profile", "ProfileTable",
           "spmd", "distributed", "collectives", "scan", "scan_layers", "optimization_barrier_",
           "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats",
           "memory_reserved", "max_memory_reserved",
           "memory_stats", "memory_summary", "memory_by_line", "memory_limit",
           "memory_timeline", "set_memory_line_bytes", "pending_memory", "MemoryForecast",
           "DeviceMemoryError", "GraphMemory", "GraphBuffer",
           "MemoryByLine", "MemoryRow", "MemoryLimit", "MemorySample", "MemoryTimeline",
           "compile_for", "target", "set_target", "get_target", "Target", "TargetError",
           "TargetReport", "TargetCost", "PaddingList", "PaddingRow", "ReportSection", "CHIPS",
           "graph_columns", "Column", "compile_summary", "CompileProfile", "CompilePart",
           "CompileRow", "CompileSummary",
           "load_ipython_extension", "unload_ipython_extension"]

__version__ = "0.1.0"


def device(index: int = 0) -> torch.device:
    """``torch.device("xla", index)``; raises if JAX has no such device."""
    _jax_device(index)
    return torch.device("xla", index)


def mark_step() -> None:
    """torch_xla's name for ``sync()``."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    sync(cause="user sync (mark_step)")


def peek(t: torch.Tensor, shards: bool = False):
    """``t``'s value as a CPU tensor, computed op by op through the single-op cache (of
    a sharded tensor, the global value).

    The pending graph is left exactly as it was: the next ``sync()`` compiles the same
    graph and hits the same cache entry as it would have without the peek.
    ``shards=True`` gives instead the list of ``xlanb.spmd.Shard(device, index, value)``
    this process holds (one, on its device, for an unsharded tensor).
    """
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    if not isinstance(t, XlaTensor):
        raise TypeError(f"xlanb.peek expects a tensor on the xla device, got {type(t).__name__}"
                        + (f" on {t.device}" if isinstance(t, torch.Tensor) else ""))
    if shards:
        return spmd.peek_shards(t)
    return _peek_host(t)


def optimize_hot_graphs(min_runs: int | None = None) -> int:
    """Start, on the compile threads, the optimized compile of every quick eager run
    (or segment of one) that has run ``min_runs`` times or more (``config.idle_tier_up``:
    4); how many started. Each takes the quick one's place when ready. Quick code runs
    2-3x slower, and by their own rule these wait to have run as long as their compile
    took (a ``generate`` call's decode steps: a dozen calls). The IPython extension calls
    this when a cell ends, so the compiles use the user's think time; a script may call
    it between phases. Lazy graphs keep their own schedule."""
    from .execute.graphs import tier_up_hot
    n = config.idle_tier_up if min_runs is None else min_runs
    return tier_up_hot(n) if n else 0


def reset() -> None:
    """Start the session afresh, as a new process would (without leaving it): pending
    work is synced first, so every tensor keeps its value; then the compiled graphs and
    their log, recompile statistics, peeks, op signatures and their executables (the
    executable store on disk is kept), and the metrics are dropped, and the mode returns
    to the starting one (``XLANB_MODE``). The random seed is torch's to set, and stays."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    sync(cause="reset")
    while _compiles_in_flight():  # their results land in infos that are about to go
        time.sleep(0.001)
    _session.clear(_starting_mode())
    metrics.clear()


def load_ipython_extension(ipython) -> None:
    """``%load_ext xlanb``: the magics, rich display and status line."""
    # The front end is imported only here (a named exception in tests/test_layers.py):
    # the core never imports IPython.
    from .extensions.ipython import load_ipython_extension as load
    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .extensions.ipython import unload_ipython_extension as unload
    unload(ipython)


def set_trace() -> None:
    """A pdb with xla commands (xla, xpeek, xpending, xhlo, xsync, xmode, xgraphs, xnans,
    xmem), stopped in the caller's frame. ``PYTHONBREAKPOINT=xlanb.set_trace`` makes ``breakpoint()`` use it."""
    import sys
    from .extensions.pdb import XlaPdb
    XlaPdb().set_trace(sys._getframe(1))


def manual_seed(seed: int) -> None:
    """Seed the device's random ops (``torch.manual_seed`` does this too)."""
    _rng.manual_seed(seed)


def __getattr__(name: str):
    # ``xlanb.widgets`` imports ipywidgets only when asked for: the core never does.
    if name == "widgets":
        import importlib
        return importlib.import_module("xlanb.widgets")
    # ``xlanb.compat``, the torch_xla compatibility layer, sits above this API: loaded
    # when first used (``%xla_compat``, ``python -m xlanb.run``).
    if name == "compat":
        import importlib
        return importlib.import_module("xlanb.compat")
    raise AttributeError(f"module 'xlanb' has no attribute {name!r}")
