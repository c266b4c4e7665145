"""torch_xla's debugging environment variables, answered by xlanb (read when
``xlanb.compat.install()`` runs: ``python -m xlanb.run`` and ``%xla_compat on``).

- ``PT_XLA_DEBUG_LEVEL=1`` (or ``PT_XLA_DEBUG=1``, which is every level): for each new
  graph, torch_xla's ``Compilation Analysis:`` and ``Post Compilation Analysis:`` blocks
  on stderr, with xlanb's cause (and, for a recompile, what changed) and the user's
  frames only; at each step, the ``pt-xla-profiler:`` lines when graphs compile or values
  are read more often than steps run, or ops fall back to the CPU.
  ``PT_XLA_DEBUG_LEVEL=2``: also ``Execution Analysis:`` for every graph run.
  ``PT_XLA_DEBUG_FILE`` appends them to a file instead; ``PT_XLA_DEBUG_MAX_FRAME``
  (8) bounds the frames. Eager mode prints none, as in torch_xla.
- ``XLA_SAVE_TENSORS_FILE`` (+ ``XLA_SAVE_TENSORS_FMT=text|hlo|stablehlo|dot``): every
  synced graph appended to ``<file>.<ordinal>`` between ``## BEGIN_GRAPH`` and
  ``## END_GRAPH``: xlanb's IR text (with scopes and lines), its HLO module (with
  metadata), its StableHLO, or DOT.
- ``XLA_METRICS_FILE``: the metrics report (torch_xla's format and names) appended at
  exit; ``STDOUT``/``STDERR`` print it.
- ``XLA_FLAGS=--xla_dump_to=DIR``: XLA itself dumps each module it compiles, named
  ``jit_xlanb_graph_<hash>`` for graphs; the executable store is turned off so that
  every graph compiles (and is dumped) in this process.
- ``XLA_SAVE_HLO_FILE``: when the program ends on a graph's compile or run error (XLA's
  error, device memory), the HLO of the pending work, which xlanb keeps intact on such
  errors, is written there; ``XLA_DUMP_HLO_GRAPH=1`` prints it after the traceback.
- ``XLA_USE_EAGER_DEBUG_MODE=1``: xlanb's eager mode.
- ``XLA_IR_DEBUG``, ``XLA_HLO_DEBUG``, ``XLA_SYNC_WAIT``: accepted; xlanb always
  records each op's line and scope into its HLO metadata, and every sync waits.
"""
from __future__ import annotations

import atexit
import os
import sys

import xlanb
from xlanb.base.frames import SourceLoc, is_internal_file
from xlanb.execute.graphs import graph_log
from xlanb.execute.graphs import graph_cache
from xlanb.graph.render import render_dot, render_text
from xlanb.graph.summary import summarize
from xlanb.pending import realize

from . import metrics as _met
from . import runtime as _xr

FORMATS = ("text", "hlo", "stablehlo", "dot")
_RULE = "=" * 80
_DASH = "-" * 80
_TRUE = ("1", "true", "yes", "on")

# beyond xlanb's own answer (base/frames.py: xlanb, torch, the REPL machinery), the
# standard library (with site-packages, where JAX lives) is not the program's either
_STDLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep


class _State:
    level = 0
    debug_file: str | None = None
    max_frames = 8
    save_file: str | None = None
    save_fmt = "text"
    metrics_file: str | None = None
    hlo_file: str | None = None
    dump_hlo = False
    excepthook = None     # the hook ours replaced
    installed = False
    seen = 0              # graphs in xlanb.graphs() already reported
    said: dict = {}       # pt-xla-profiler message kind -> last text printed


_s = _State()


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not valid: it takes a whole number") from None


def debug_level() -> int:
    """torch_xla's rule: ``PT_XLA_DEBUG_LEVEL`` if set, else every level with
    ``PT_XLA_DEBUG=1``, else 0."""
    level = _int_env("PT_XLA_DEBUG_LEVEL", -1)
    if level == -1:
        level = 100 if os.environ.get("PT_XLA_DEBUG", "").strip().lower() in _TRUE else 0
    return max(level, 0)


def install() -> None:
    """Read the variables and start what they ask for (once; ``uninstall`` undoes it)."""
    if _s.installed:
        return
    env = os.environ
    fmt = env.get("XLA_SAVE_TENSORS_FMT", "text").strip().lower() or "text"
    if fmt not in FORMATS:
        raise ValueError(f"XLA_SAVE_TENSORS_FMT={fmt!r} is not valid: it takes "
                         + ", ".join(FORMATS))
    _s.level = debug_level()
    _s.max_frames = _int_env("PT_XLA_DEBUG_MAX_FRAME", 8)
    _s.debug_file = env.get("PT_XLA_DEBUG_FILE") or None
    _s.save_file = env.get("XLA_SAVE_TENSORS_FILE") or None
    _s.save_fmt = fmt
    _s.metrics_file = env.get("XLA_METRICS_FILE") or None
    _s.seen = len(graph_log)
    _s.said = {}
    if env.get("XLA_USE_EAGER_DEBUG_MODE", "").strip().lower() in _TRUE:
        xlanb.set_mode("eager")
    if "--xla_dump_to" in env.get("XLA_FLAGS", ""):
        # an executable loaded from the store is not compiled, so XLA would dump nothing
        _xr.pause_store()
    if _s.level or _s.save_file:
        realize.observers.append(_on_sync)
    if _s.metrics_file:
        atexit.register(_write_metrics)
    _s.hlo_file = env.get("XLA_SAVE_HLO_FILE") or None
    _s.dump_hlo = env.get("XLA_DUMP_HLO_GRAPH", "").strip().lower() in _TRUE
    if _s.hlo_file or _s.dump_hlo:
        _s.excepthook, sys.excepthook = sys.excepthook, _on_uncaught
    _s.installed = True


def uninstall() -> None:
    while _on_sync in realize.observers:
        realize.observers.remove(_on_sync)
    atexit.unregister(_write_metrics)
    if sys.excepthook is _on_uncaught:
        sys.excepthook = _s.excepthook or sys.__excepthook__
    _xr.resume_store()
    _s.installed = False


def ordinal_path(path: str) -> str:
    """torch_xla's per-process file name: ``tensors.txt`` -> ``tensors.txt.0``."""
    return f"{path}.{_xr.global_ordinal()}"


# ------------------------------------------------------------------------- the frames

def _user_frames() -> list[SourceLoc]:
    """The caller's frames outside xlanb, torch, JAX and the standard library, innermost
    first: the lines of the program that made this sync."""
    out = []
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not (is_internal_file(name) or name.startswith((_STDLIB, "<frozen"))):
            out.append(SourceLoc(name, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return out


def _frame_lines(prefix: str, frames: list[SourceLoc], fallback) -> list[str]:
    if not frames and fallback is not None:
        frames = [fallback]
    lines = []
    for i, loc in enumerate(frames):
        if i >= _s.max_frames:
            lines.append(f"{prefix}  ..........")
            break
        lines.append(f"{prefix}  {loc.function} ({loc.where})")
    return lines


def _emit(text: str) -> None:
    if _s.debug_file:
        with open(_s.debug_file, "a") as f:
            f.write(text)
    else:
        sys.stderr.write(text)
        sys.stderr.flush()


# ------------------------------------------------------------------------- the blocks

def _analysis(prefix: str, head: str, rec, cause: str, frames) -> str:
    lines = [f"{prefix}{_RULE}", f"{prefix}{head}", f"{prefix}  {cause}"]
    if head == "Compilation Cause" and rec.explanation:
        lines.append(f"{prefix}  recompiled: {rec.explanation}")
    lines += [f"{prefix}Graph Info: ",
              f"{prefix}  Graph Hash: {rec.hash_full}",
              f"{prefix}  Number of Graph Inputs: {rec.n_inputs}",
              f"{prefix}  Number of Graph Outputs: {rec.n_outputs}",
              f"{prefix}Python Frame Triggered Execution: "]
    lines += _frame_lines(prefix, frames, rec.src)
    lines += [f"{prefix}{_DASH}", f"{prefix}{_RULE}"]
    return "\n" + "\n".join(lines) + "\n"


def _post_compilation(rec) -> str:
    prefix = "Post Compilation Analysis: "
    m = rec.memory
    gb = (lambda n: f"{n / 1024 ** 3:.6f} GB") if m is not None else (lambda n: "Unknown GB")
    m = m or type("M", (), dict(argument_bytes=0, output_bytes=0, alias_bytes=0,
                                temp_bytes=0, code_bytes=0))
    lines = [f"{prefix}{_RULE}",
             f"{prefix}Graph input size: {gb(m.argument_bytes)}",
             f"{prefix}Graph output size: {gb(m.output_bytes)}",
             f"{prefix}Aliased Input size: {gb(m.alias_bytes)}",
             f"{prefix}Intermediate tensor size: {gb(m.temp_bytes)}",
             f"{prefix}Compiled program size: {gb(m.code_bytes)}",
             f"{prefix}{_DASH}", f"{prefix}{_RULE}"]
    return "\n" + "\n".join(lines) + "\n"


def _graph_of(plan) -> tuple[list, object]:
    """The graphs compiled since the last report, and the record that ``plan`` ran."""
    log = graph_log
    new = list(log[_s.seen:])
    _s.seen = len(log)
    # the cache's keys are (device, the plan's structural key, ...): a scan, only while
    # these variables are set
    rec = next((r for k, r in graph_cache.items() if k[1] == plan.key), None)
    return new, rec


def _saved_block(plan, rec, mode: str, cause: str, frames) -> str:
    fmt = _s.save_fmt
    if fmt in ("hlo", "stablehlo") and rec is not None:
        graph = rec.hlo(dialect="hlo" if fmt == "hlo" else "stablehlo")
    elif fmt == "dot":
        graph = render_dot(summarize(plan))
    else:  # text, and an op-by-op run's HLO (it has no module of its own)
        graph = render_text(summarize(plan))
    head = ["[ScheduleSyncTensorsGraph]", "TensorsGraphInfo:"]
    head += [f"  {loc.function} ({loc.where})" for loc in frames]
    head += ["", f"Cause: {cause} ({mode})"]
    ghash = rec.hash_full if rec is not None else "(op by op)"
    return ("\n".join(head) + "\n\n## BEGIN_GRAPH\n" + graph.rstrip("\n")
            + f"\nGraph Hash: {ghash}\n\n## END_GRAPH\n\n")


def _on_sync(kind: str, what, info) -> None:
    """A realize observer: after each sync's graph runs, and after each sync."""
    if kind == "step":
        if _s.level:
            _profiler_lines()
        return
    plan = what
    mode, cause, src = info
    new, rec = _graph_of(plan)
    frames = _user_frames()
    if _s.level and mode == "lazy" and rec is not None:
        text = ""
        if rec in new:
            text += _analysis("Compilation Analysis: ", "Compilation Cause", rec, cause, frames)
            text += _post_compilation(rec)
        if _s.level >= 2:
            text += _analysis("Execution Analysis: ", "Execution Cause", rec, cause, frames)
        if text:
            _emit(text)
    if _s.save_file:
        with open(ordinal_path(_s.save_file), "a") as f:
            f.write(_saved_block(plan, rec, mode, cause, frames or ([src] if src else [])))


def _profiler_lines() -> None:
    """torch_xla's automatic metrics analysis: graphs compiled or values read more often
    than steps ran, and the ops that fell back to the CPU; each said when it changes."""
    steps = xlanb.metrics.counter_value("MarkStep") or 0
    if not steps:
        return
    lines = {}
    for metric in ("CompileTime", "TransferFromDeviceTime"):
        d = xlanb.metrics.metric_data(metric)
        n = d.count if d is not None else 0
        if n > steps:
            lines[metric] = f"pt-xla-profiler: {metric} too frequent: {n} counts during " \
                            f"{steps} steps"
    fallbacks = _met.executed_fallback_ops()
    if fallbacks:
        lines["fallback"] = ("pt-xla-profiler: Op(s) not lowered: " + ", ".join(fallbacks)
                             + ",  they ran on the CPU (xlanb.metrics: aten::<op> counters)")
    for k, text in lines.items():
        if _s.said.get(k) != text:
            _s.said[k] = text
            _emit(text + "\n")


def _write_metrics() -> None:
    """At exit: the metrics report, appended to XLA_METRICS_FILE (or printed)."""
    path = _s.metrics_file
    if not path:
        return
    try:
        report = _met.metrics_report()
    except Exception as e:  # noqa: BLE001 - exiting: say why and go on
        print(f"xlanb: XLA_METRICS_FILE: no report ({type(e).__name__}: {e})", file=sys.stderr)
        return
    if path == "STDOUT":
        print(report)
    elif path == "STDERR":
        print(report, file=sys.stderr)
    else:
        if _xr.world_size() > 1:  # one file per process, as torch_xla's distributed runs
            path = ordinal_path(path)
        with open(path, "a") as f:
            f.write(report)


def graph_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a graph's compile or run failing:
    XLA's runtime error, a device memory error, or xlanb's note on a failed compile."""
    import jax
    from xlanb.values.memory import DeviceMemoryError
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (jax.errors.JaxRuntimeError, DeviceMemoryError)):
            return True
        if any("while compiling a graph" in n for n in getattr(exc, "__notes__", ())):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _on_uncaught(exc_type, exc, tb) -> None:
    """``sys.excepthook``: the usual traceback, then, for a graph's error, the HLO of the
    pending work (still pending: xlanb loses nothing on a failed sync)."""
    (_s.excepthook or sys.__excepthook__)(exc_type, exc, tb)
    if not graph_error(exc):
        return
    try:
        text = xlanb.hlo(dialect="hlo")
    except Exception as e:  # noqa: BLE001 - the program is ending: say why, go on
        print(f"xlanb: XLA_SAVE_HLO_FILE: no HLO ({type(e).__name__}: {e})", file=sys.stderr)
        return
    if _s.hlo_file:
        with open(ordinal_path(_s.hlo_file), "a") as f:
            f.write(text)
        print(f"xlanb: the failing graph's HLO is in {ordinal_path(_s.hlo_file)}",
              file=sys.stderr)
    if _s.dump_hlo:
        print(text, file=sys.stderr)
