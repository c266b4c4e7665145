"""A graph compiled for a TPU target, and what the TPU compiler says about it.

The last stage of a graph (``stages.GraphLowering`` -> ``lower_for(target)`` ->
compile): libtpu compiles the same graph the next sync would run for a TPU topology,
ahead of time, with no TPU and nothing run. A ``TargetReport`` holds the answers: per
chip memory against HBM, whether it fits, XLA's cost estimate with a roofline line, what
the TPU's tiled layouts pad, the collectives by line, the compile time and the optimized
TPU module. The compiler's out-of-memory refusal is an answer too (``fits=False``).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import html
import os
import queue
import re
import threading
import time
from typing import NamedTuple

import jax
import torch

from ..base import metrics
from ..base.frames import SourceLoc, source_text
from ..base.session import session
from ..base.formats import (BYTE_UNITS, format_bytes, format_duration, format_fits, format_hash,
                            format_pct, format_table, format_table_html)
from ..graph import compile_time
from ..graph.collectives import CollectiveList, parse_collectives
from ..graph.hlo_text import counted_loops, entry_buffers, with_entry
from ..graph.layouts import array_layouts, entry_layouts
from ..graph.summary import aval_text
from ..ir.nodes import TensorMeta, result_bytes
from ..runtime.compile_profile import raw_profile, tpu_log_since
from ..runtime import shutdown
from ..runtime.jit import background
from ..runtime.targets import Target, TargetError, target as resolve_target
from .compile import Build
from ..values.memory import Contributor, DeviceMemoryError, GraphMemory, graph_memory
from .stages import GraphLowering


class TargetCost(NamedTuple):
    """XLA's cost estimate of one chip's program, against the chip's published peaks."""
    flops: float
    bytes_accessed: float
    seconds: float          # XLA's own estimate (``optimal_seconds``); 0 if it gives none
    compute_seconds: float  # flops at the chip's peak bf16 FLOP/s
    memory_seconds: float   # bytes accessed at the chip's HBM bandwidth

    @property
    def roofline_seconds(self) -> float:
        """The roofline's lower bound on a step: the slower of compute and memory."""
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def bound(self) -> str:
        if not self.flops and not self.bytes_accessed:
            return "no work"  # an empty graph is under neither roof
        return "compute-bound" if self.compute_seconds >= self.memory_seconds else "memory-bound"

    def roofline(self, t: Target) -> str:
        """One line: which roof the step is under on ``t``'s chip."""
        if not self.flops and not self.bytes_accessed:
            return f"no work on {t.chip}: no FLOP, no byte accessed"
        intensity = self.flops / self.bytes_accessed if self.bytes_accessed else float("inf")
        ridge = t.peak_flops / t.hbm_bytes_per_s
        return (f"{self.bound} on {t.chip}: {self.flops / 1e9:.3g} GFLOP and "
                f"{format_bytes(int(self.bytes_accessed))} accessed per chip, "
                f"{intensity:.3g} FLOP/byte against the chip's ridge of {ridge:.0f} "
                f"(compute {format_duration(self.compute_seconds)} at {t.peak_flops / 1e12:.0f} TFLOP/s, "
                f"memory {format_duration(self.memory_seconds)} at {t.hbm_bytes_per_s / 1e9:.0f} GB/s)")


class PaddingRow(NamedTuple):
    """One buffer and what the TPU's tiled layout makes of it."""
    kind: str            # argument, output, temp, scalars
    name: str            # ``input %3 (aten::_to_copy)``, ``output %57 aten::addmm``, ...
    scope: str
    source: str          # the user's ``file:line``
    type: str            # ``bf16[1000,1000]``
    layout: str          # ``{1,0:T(8,128)(2,1)}``
    logical_bytes: int
    padded_bytes: int

    @property
    def padding_bytes(self) -> int:
        return self.padded_bytes - self.logical_bytes


class PaddingList(list):
    """``TargetReport.padding``: arguments, outputs and the largest temporaries with
    their logical and padded bytes, most padding first."""

    HEADER = ("kind", "buffer", "type", "TPU layout", "logical", "padded", "+pad", "source")
    RIGHT = (4, 5, 6)  # the byte columns, aligned right
    _COLUMNS = HEADER

    def rows(self, source=source_text) -> list[tuple]:
        """Table cells, a row per buffer; ``source`` names its ``file:line`` (a front end
        names a notebook cell its own way)."""
        # no layout: a buffer of a graph the compiler refused (its padding is unknown)
        return [(r.kind, r.name + (f" [{r.scope}]" if r.scope else ""), r.type, r.layout or "-",
                 format_bytes(r.logical_bytes),
                 format_bytes(r.padded_bytes) if r.layout else "-",
                 format_pct(r.padding_bytes, r.logical_bytes) if r.layout else "-",
                 source(r.source))
                for r in self]

    def total(self, kind: str) -> tuple[int, int]:
        rows = [r for r in self if r.kind == kind]
        return sum(r.logical_bytes for r in rows), sum(r.padded_bytes for r in rows)

    def __str__(self) -> str:
        if not self:
            return "no buffers"
        return format_table(self.HEADER, self.rows(), right=self.RIGHT)

    __repr__ = __str__


class ReportSection(NamedTuple):
    """One part of a ``TargetReport`` (``TargetReport.sections()``), in words, for any
    front end to lay out: its ``lines``, or a table (``header``, ``rows``; ``right``: the
    columns aligned right) under a ``title`` and its ``summary``. The report's own text
    and HTML are made from these, and so is every front end's view of it: no one reads
    another's text back."""
    kind: str            # compiler, memory, sharding, cost, layouts, notes, padding, collectives
    lines: tuple = ()
    title: str = ""
    summary: str = ""
    header: tuple = ()
    rows: tuple = ()
    right: tuple = ()


def sections_text(sections, indent: str = "  ") -> list[str]:
    """``sections`` as the report prints them: lines under ``indent``, each table under
    its title, one level deeper."""
    out = []
    for sec in sections:
        out += [indent + line for line in sec.lines]
        if sec.title:
            out.append(f"{indent}{sec.title}:" + (f" {sec.summary}" if sec.summary else ""))
        if sec.rows:
            out.append(format_table(sec.header, list(sec.rows), right=sec.right,
                                    indent=indent * 2))
    return out


class TargetReport:
    """What the TPU compiler says about one graph compiled for ``target``.

    ``memory`` (a ``GraphMemory`` per chip), ``fits`` (the peak within the chip's HBM;
    False when the compiler refused for lack of memory), ``cost`` (``TargetCost``, with
    ``roofline``), ``padding`` (``PaddingList``), ``collectives`` (``CollectiveList``),
    ``compile_seconds``, ``hlo()`` (the optimized TPU module), ``error`` (the
    compiler's message when it refused), ``notes`` (where a TPU differs from the CPU in
    a way that matters for this graph)."""

    def __init__(self, target: Target, graph_hash: str, *, memory=None, fits=None, cost=None,
                 padding=None, collectives=None, compile_seconds=0.0, error=None,
                 available_bytes=None, notes=(), executable=None, compile_raw=None,
                 recorded=None, loops=None, whole_argument_bytes=None, mesh_chips=1):
        self.target = target
        self.graph_hash = graph_hash or ""
        self.memory: GraphMemory | None = memory
        self.fits: bool | None = fits
        self.cost: TargetCost | None = cost
        self.padding = padding if padding is not None else PaddingList()
        self.collectives = collectives if collectives is not None else CollectiveList()
        self.compile_seconds = compile_seconds
        self.error: str | None = error
        self.available_bytes = available_bytes  # the HBM the compiler said it had, if it did
        self.notes: tuple = tuple(notes)
        self._exe = executable
        self._compile_raw = compile_raw  # runtime/compile_profile.py's measurements
        self._recorded = recorded or {}  # (aten op, scope) -> the line it was recorded at
        self._loops = loops or {}  # layer stacks compiled as loops: name -> layers
        self._compile_profile = None
        # the graph's arguments at their full sizes (every leaf's global shape), and the
        # chips its mesh spans (1: one device): a sharded argument (FSDP's parameters and
        # optimizer state) holds only its shard on each chip, which memory_analysis counts
        self.whole_argument_bytes: int | None = whole_argument_bytes
        self.mesh_chips = mesh_chips

    def chip_argument_bytes(self) -> int:
        """The graph's arguments (not its lifted scalars) as one chip holds them, at
        their logical sizes: its shards of the sharded ones, the replicated ones whole
        (the TPU layouts' padding is the padding table's)."""
        return self.padding.total("argument")[0]

    def sharding_line(self) -> str:
        """On a mesh: the arguments one chip holds against the whole graph's ("" on one
        chip, or where the compiler refused)."""
        whole = self.whole_argument_bytes
        if self._exe is None or not whole or self.mesh_chips <= 1:
            return ""
        chip = self.chip_argument_bytes()
        return (f"arguments per chip: {format_bytes(chip)} of the whole graph's "
                f"{format_bytes(whole)} ({100 * chip / whole:.0f}%: sharded over "
                f"{self.mesh_chips} chips, each holds its shards and every replicated value)")

    @property
    def compile_profile(self) -> compile_time.CompileProfile:
        """Where the TPU compile's time went: by phase (libtpu's logged stages), by
        line and scope (evenly over the TPU module's instructions: libtpu times no
        fusion); see ``graph/compile_time.py``."""
        if self._compile_profile is None:
            raw = self._compile_raw
            what = f"graph {format_hash(self.graph_hash)} for {self.target.name}"
            if raw is None:  # refused, or not compiled: the time is all there is
                return compile_time.CompileProfile(
                    what, "tpu", self.compile_seconds,
                    [compile_time.CompilePart("other", "the compile, not split",
                                              self.compile_seconds, "xlanb's timer")],
                    0.0, [], [], "", [self.error or "not compiled"])
            self._compile_profile = compile_time.build(
                raw, self.hlo(), what, None, tpu_log_since(raw), self._recorded, self._loops)
        return self._compile_profile

    def hlo(self) -> str:
        """The optimized TPU module ("" if the compiler refused)."""
        return self._exe.as_text() if self._exe is not None else ""

    @property
    def roofline(self) -> str:
        return self.cost.roofline(self.target) if self.cost else ""

    def verdict(self) -> str:
        """Peak per chip against HBM, fits, estimated time, compile time: the summary line
        without the target ("not compiled: ..." when the compiler gave no memory)."""
        if self.memory is None:
            return f"not compiled: {self.error}"
        verdict = format_fits(self.fits)
        est = ""
        if self.cost and self.cost.seconds:
            est = f", est. {format_duration(self.cost.seconds)}/step"
        elif self.cost:  # XLA gave no estimate (custom calls): the roofline's bound
            est = f", at least {format_duration(self.cost.roofline_seconds)}/step (roofline)"
        return (f"peak {format_bytes(self.memory.peak_bytes)} of "
                f"{format_bytes(self.target.hbm_bytes)} HBM per chip, {verdict}{est}, "
                f"TPU compile {format_duration(self.compile_seconds)}")

    def summary_line(self) -> str:
        """One line: the target, then the ``verdict``."""
        return f"{self.target.name} ({self.target.num_devices} x {self.target.chip}): {self.verdict()}"

    def headline(self) -> str:
        """The report's first line: the graph, the target and the verdict."""
        return f"graph {format_hash(self.graph_hash)} for {self.summary_line()}"

    def sections(self, source=source_text, max_rows: int = 12) -> list[ReportSection]:
        """The report after its headline, part by part (``ReportSection``): the compiler's
        refusal, memory per chip, sharding, cost, the TPU layouts' totals, notes, the
        padding table (``max_rows`` buffers, most padding first; ``source`` names each
        one's line) and the collectives."""
        out = []
        if self.error:
            out.append(ReportSection("compiler", (f"compiler: {self.error}",)))
        if self.memory is not None:
            out.append(ReportSection("memory", (f"memory per chip: {self.memory}",)))
            if self.sharding_line():
                out.append(ReportSection("sharding", (self.sharding_line(),)))
        if self.cost is not None:
            out.append(ReportSection("cost", (f"cost: {self.roofline}",)))
        laid_out = self._exe is not None  # a refused graph's buffers have no TPU layout
        layouts = []
        for kind in ("argument", "output"):
            logical, padded = self.padding.total(kind)
            if padded and laid_out:
                layouts.append(f"{kind}s: {format_bytes(logical)} logical, {format_bytes(padded)} "
                               f"in TPU layouts ({format_pct(padded - logical, logical)})")
        if layouts:
            out.append(ReportSection("layouts", tuple(layouts)))
        if self.notes:
            out.append(ReportSection("notes", tuple(f"note: {note}" for note in self.notes)))
        if self.padding:
            out.append(ReportSection(
                "padding", title="padding (most first)" if laid_out
                else "buffers (from the lowering; largest first)",
                header=PaddingList.HEADER, rows=tuple(self.padding.rows(source)[:max_rows]),
                right=PaddingList.RIGHT))
        if self.collectives:
            c = self.collectives
            out.append(ReportSection("collectives", title="collectives", summary=c.headline(),
                                     header=c.HEADER, rows=tuple(c.rows(source)),
                                     right=c.RIGHT))
        return out

    def __str__(self) -> str:
        return "\n".join([self.headline()] + sections_text(self.sections()))

    __repr__ = __str__

    def memory_bar_html(self) -> str:
        """Memory per chip against the chip's HBM, as one HTML bar ("" with no memory
        figures): what the report's HTML and the notebook views show."""
        if self.memory is None:
            return ""
        return _hbm_bar_html(self.memory, self.target, self.fits)

    def _repr_html_(self) -> str:
        e = html.escape
        parts = [f"<div class='xlanb-target'><b>{e(self.headline())}</b></div>"]
        if self.memory is not None:
            parts.append(self.memory_bar_html())
        for sec in self.sections(max_rows=len(self.padding)):
            parts += [f"<div>{e(line)}</div>" for line in sec.lines]
            if sec.title:
                parts.append(f"<div>{e(sec.title)}" + (f": {e(sec.summary)}" if sec.summary else "")
                             + "</div>")
            if sec.rows:
                parts.append(format_table_html(sec.header, list(sec.rows), right=sec.right,
                                               cls=f"xlanb-{sec.kind}"))
        return "\n".join(parts)


def _hbm_bar_html(memory, target: Target, fits) -> str:
    """Memory per chip against the chip's HBM, as one bar: arguments, outputs and
    temporaries, and a line where HBM ends (red when the graph does not fit)."""
    e = html.escape
    scale = max(memory.peak_bytes, target.hbm_bytes, 1)
    seg = [("arguments", memory.argument_bytes, "#69c"),
           ("outputs", memory.output_bytes - memory.alias_bytes, "#9c6"),
           ("temporaries", memory.temp_bytes, "#e94")]
    bars = "".join(f"<div title='{e(n)} {e(format_bytes(b))}' style='display:inline-block;"
                   f"height:14px;width:{100 * max(b, 0) / scale:.2f}%;background:{c}'></div>"
                   for n, b, c in seg)
    colour = "#c33" if fits is False else "#3a7"
    return (f"<div style='position:relative;width:480px;border:1px solid #888;background:#fff'>"
            f"{bars}<div style='position:absolute;top:0;left:{100 * target.hbm_bytes / scale:.2f}%;"
            f"height:14px;border-left:2px solid {colour}' title='HBM'></div></div>")


# ---------------------------------------------------------------------------------------
# The TPU compiler's out-of-memory refusal, as an answer

_OOM = re.compile(r"\(\s*([\d.]+)\s*([KMGT]?)i?B?\s*\)\s*exceeds\s+available\s+HBM\s*"
                  r"\(\s*([\d.]+)\s*([KMGT]?)i?B?\s*\)", re.I)


def parse_hbm_oom(message: str) -> tuple[int, int] | None:
    """``(needed, available)`` bytes from the TPU compiler's ``CompileTimeHbmOom``."""
    m = _OOM.search(message)
    if m is None:
        return None
    return (int(float(m.group(1)) * BYTE_UNITS[m.group(2).upper()]),
            int(float(m.group(3)) * BYTE_UNITS[m.group(4).upper()]))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.split("\n", 1)[0] if text else type(e).__name__


# ---------------------------------------------------------------------------------------
# Compiling for a target

def _where(place) -> tuple[str, str]:
    src, scope = place
    return (src.where if isinstance(src, SourceLoc) else ""), scope or ""


_ON_CHIP = re.compile(r"S\([1-9]\d*\)")


def _lowered_buffers(lowering: GraphLowering) -> PaddingList:
    """The arguments and outputs of a graph the TPU compiler refused, from its lowering:
    their types and lines, logical sizes (whole arrays, no TPU layout), largest first."""
    steps, root_pos, places = lowering.recipe
    n_in = lowering.n_inputs
    rows: list[PaddingRow] = []
    for i, meta in enumerate(lowering.leaf_metas):
        src, scope, op = lowering.leaf_origins[i]
        n = result_bytes(meta)
        rows.append(PaddingRow("argument", f"input %{i} ({op})", scope, src, aval_text(meta),
                               "", n, n))
    for p in root_pos:
        if p >= n_in:
            info = steps[p - n_in][0]
            meta = info.out
            src, scope = _where(places[p - n_in])
            name = f"output %{p} {info.name}"
        else:
            meta = lowering.leaf_metas[p]
            src, scope, _op = lowering.leaf_origins[p]
            name = f"output %{p} (input passed through)"
        if isinstance(meta, TensorMeta):
            n = result_bytes(meta)
            rows.append(PaddingRow("output", name, scope, src, aval_text(meta), "", n, n))
    rows.sort(key=lambda r: -r.logical_bytes)
    return PaddingList(rows)


def temp_rows(text: str, n_temps: int = 8) -> list[PaddingRow]:
    """The largest temporaries in HBM of an optimized TPU module, as padding rows."""
    rows: list[PaddingRow] = []
    temps = 0
    for b in entry_buffers(text):
        # HBM only: a prefetch into the core's own memory (``S(1)``, with its source
        # and a sync flag) is no temporary
        arrays = array_layouts(b.typed)
        # a tuple (a loop's carried values: its counter first) is a buffer per element:
        # the largest ones, where the first alone showed only the loop's s32[] counter
        picks = sorted(range(len(arrays)), key=lambda k: -arrays[k].padded_bytes)
        for k in picks:
            a = arrays[k]
            if _ON_CHIP.search(a.layout) or temps >= n_temps \
                    or (len(arrays) > 1 and a.type.endswith("[]")):  # a loop's counters
                continue
            temps += 1
            rows.append(PaddingRow("temp", f"{b.op or b.opcode} ({b.name})"
                                   + (f" [{k}]" if len(arrays) > 1 else ""),
                                   b.scope.replace("/", "."), b.source, a.type, a.layout,
                                   a.logical_bytes, a.padded_bytes))
    return rows


def _padding(lowering: GraphLowering, text: str, n_temps: int = 8) -> PaddingList:
    params, results = entry_layouts(text)
    steps, root_pos, places = lowering.recipe
    n_in = lowering.n_inputs
    rows: list[PaddingRow] = []
    for i, arrays in enumerate(params[:n_in]):
        src, scope, op = lowering.leaf_origins[i]
        for a in arrays:
            rows.append(PaddingRow("argument", f"input %{i} ({op})", scope, src, a.type,
                                   a.layout, a.logical_bytes, a.padded_bytes))
    scalars = [a for arrays in params[n_in:] for a in arrays]
    if scalars:
        rows.append(PaddingRow("scalars", f"{len(scalars)} lifted Python scalars", "", "",
                               scalars[0].type, scalars[0].layout,
                               sum(a.logical_bytes for a in scalars),
                               sum(a.padded_bytes for a in scalars)))
    for p, a in zip(root_pos, results):
        if p >= n_in:
            info = steps[p - n_in][0]
            src, scope = _where(places[p - n_in])
            name = f"output %{p} {info.name}"
        else:
            src, scope, op = lowering.leaf_origins[p]
            name = f"output %{p} (input passed through)"
        rows.append(PaddingRow("output", name, scope, src, a.type, a.layout, a.logical_bytes,
                               a.padded_bytes))
    rows += temp_rows(text, n_temps)
    rows.sort(key=lambda r: (-r.padding_bytes, -r.padded_bytes))
    return PaddingList(rows)


def _notes(lowering: GraphLowering) -> list[str]:
    """Where this graph's values fare differently on a TPU than on the CPU."""
    dtypes = {m.dtype for m in lowering.leaf_metas}
    for info, _ in lowering.recipe[0]:
        out = info.out if isinstance(info.out, tuple) and not hasattr(info.out, "shape") else (info.out,)
        dtypes.update(m.dtype for m in out if m is not None and hasattr(m, "dtype"))
    notes = []
    if torch.float64 in dtypes or torch.complex128 in dtypes:
        notes.append("float64 values: TPUs have no 64-bit float units; XLA's TPU compiler "
                     "emulates float64 with pairs of float32 (about 48 bits of mantissa, "
                     "float32's exponent range, a dozen instructions per multiply), so values "
                     "differ from the CPU's and run slowly; .float() avoids it")
    wide = sum(k == "f" for k in lowering.scalar_kinds)
    if wide and torch.float64 not in dtypes and torch.complex128 not in dtypes:
        notes.append(f"{wide} Python number(s) reach the TPU as float64 scalars (read by ops "
                     "on integers only, where CPU torch converts the number itself): XLA's TPU "
                     "compiler emulates float64 for them, and may give no time estimate")
    if torch.int64 in dtypes:
        notes.append("int64 values: TPUs compute 64-bit integers as pairs of 32-bit ones "
                     "(slower; torch_xla users often keep indices int32)")
    loops = lowering.repeats_for("tpu")
    if loops is not None:
        notes.append("repeated layers compiled once each, as loops: "
                     + ", ".join(f"{len(run.layers)} × {run.what}" for run in loops.runs)
                     + " (each layer's weights stacked inside the graph: a little more memory, "
                     "a compile that grows less with depth; XLANB_SCAN_LAYERS=0 unrolls them)")
    return notes


def _recorded_lines(lowering: GraphLowering) -> dict:
    """(aten op, scope) -> the line its op was recorded at, from the lowering's recipe."""
    steps, _, places = lowering.recipe
    out: dict = {}
    for (info, _), place in zip(steps, places):
        src, scope = _where(place)
        if src:
            out.setdefault((info.name, scope.replace(".", "/")), src)
    return out


def compile_for_target(lowering: GraphLowering, target, lowered=None,
                       lower_s: float = 0.0) -> TargetReport:
    """Lower (unless ``lowered`` is given) and compile ``lowering`` for ``target`` (a
    name or a ``Target``); runs nothing. The compiler's refusal is in the report
    (``error``; ``fits=False`` for lack of HBM); a mesh that does not fit the topology
    raises ``TargetError``."""
    t = resolve_target(target)
    build = Build(None, lambda: lowering.lower_for(t), lowered=lowered, lower_s=lower_s,
                  metric="TargetCompileTime")  # not stored, no room taken here
    lowered = build.lower()
    t0 = time.perf_counter()  # compile_seconds: the compile alone, as before
    try:
        exe = build.compile()
    except TargetError:
        raise
    except Exception as e:  # the compiler refused: an answer, not an exception
        metrics.counter("TargetCompileRefused")
        secs = time.perf_counter() - t0
        message = _first_line(e)
        oom = parse_hbm_oom(str(e))
        # no executable, so the buffers come from the lowering (logical sizes); what it
        # needed comes from the message (the compiler's figure holds them all)
        padding = _lowered_buffers(lowering)
        args, outs = padding.total("argument")[0], padding.total("output")[0]
        memory = GraphMemory(args, outs, 0, max(0, oom[0] - args - outs), oom[0], 0) \
            if oom is not None else None
        return TargetReport(t, lowering.hash, memory=memory, **_whole(lowering),
                            fits=False if oom is not None else None, padding=padding,
                            compile_seconds=secs, error=message,
                            available_bytes=oom[1] if oom else None, notes=_notes(lowering))
    secs = time.perf_counter() - t0
    if "tpu" not in {d.platform for s in _shardings_of(exe) for d in s.device_set}:
        raise TargetError(f"xlanb: graph {format_hash(lowering.hash)} was placed on "
                          f"{_shardings_of(exe)[:1]}, not on {t.name}'s chips")
    metrics.counter("TargetCompile")
    text = exe.as_text()
    memory = graph_memory(exe)
    cost = None
    try:
        ca = dict(exe.cost_analysis() or {})
    except Exception:
        ca = {}
    if ca:
        flops = float(ca.get("flops", 0.0))
        # XLA's cost analysis counts a loop's body once: the further iterations of each
        # loop (repeated layers lowered as one, XLANB_SCAN_LAYERS), with bytes and time
        # scaled as the FLOPs are
        scale = 1 + loop_flops(lowered) / flops if flops else 1.0
        flops *= scale
        nbytes = float(ca.get("bytes accessed", 0.0)) * scale
        # XLA gives a negative estimate where it has none (a custom call it cannot cost)
        cost = TargetCost(flops, nbytes,
                          max(0.0, float(ca.get("optimal_seconds", 0.0))) * scale,
                          flops / t.peak_flops, nbytes / t.hbm_bytes_per_s)
    axes = dict(lowering.mesh.mesh.shape) if lowering.mesh is not None else None
    return TargetReport(
        t, lowering.hash, memory=memory,
        fits=None if memory is None else memory.peak_bytes <= t.hbm_bytes,
        cost=cost, padding=_padding(lowering, text),
        collectives=CollectiveList(parse_collectives(text, axes), lowering.hash or ""),
        compile_seconds=secs, notes=_notes(lowering), executable=exe,
        compile_raw=raw_profile(exe), recorded=_recorded_lines(lowering),
        loops=compile_time.loop_layers(lowering.repeats_for("tpu")), **_whole(lowering))


def _whole(lowering: GraphLowering) -> dict:
    """``TargetReport``'s whole-graph argument bytes (the leaves at their global shapes,
    before any sharding) and the chips its mesh spans."""
    return {"whole_argument_bytes": sum(result_bytes(m) for m in lowering.leaf_metas),
            "mesh_chips": lowering.mesh.mesh.size if lowering.mesh is not None else 1}


def loop_flops(lowered) -> float:
    """The FLOPs of every counted loop's iterations after its first, in ``lowered``
    (before the TPU compiler's passes, where each ``lax.scan`` is still one while with
    its trip count): what XLA's cost analysis, which costs a body once, leaves out.
    Each body is costed on its own by XLA's generic cost analysis (FLOPs do not depend
    on the backend); 0 where the module has no such loop or cannot be read."""
    try:
        text = lowered.compiler_ir("hlo").as_hlo_module().to_string()
        loops = counted_loops(text)
        if not loops:
            return 0.0
        from ..runtime.jax_compat import hlo_module_cost_analysis
        client = jax.devices("cpu")[0].client
        return sum((n - 1) * float(hlo_module_cost_analysis(
            client, with_entry(text, body)).get("flops", 0.0)) for body, n in loops)
    except Exception:  # JAX's internals moved: XLA's own figure, as it was
        return 0.0


def _shardings_of(exe) -> list:
    try:
        return jax.tree.leaves((exe.input_shardings, exe.output_shardings),
                               is_leaf=lambda x: hasattr(x, "device_set"))
    except Exception:  # an executable that does not say: trust the lowering
        return []


def _compile_quietly(lowering, target, lowered=None, lower_s=0.0):
    try:
        return compile_for_target(lowering, target, lowered, lower_s)
    except Exception as e:  # a graph that cannot go to the target (a mesh that does not fit)
        return TargetReport(resolve_target(target), lowering.hash, error=_first_line(e))


# A target compile takes from seconds to minutes (a 2-layer BERT step: 64-90 s on a
# loaded 2-core VM). It is lowered on xlanb's compile threads (Python, holding the GIL:
# at a low priority it would hold the GIL while starved of CPU, and stall the user's
# thread), then compiled on a thread of its own at the lowest CPU priority, so that it
# neither holds a compile thread that long nor takes a core from the CPU's steps.
#
# At exit (runtime/shutdown.py), the compiles not yet started are cancelled (their reports
# say so) and the one in progress gets the exit's grace: libtpu cannot stop a compile,
# and a compile that ends while the interpreter is finalizing crashes the process
# (SIGSEGV in jax's WeakrefLRUCache, or "terminate called ... FATAL: exception not
# rethrown"), so past the grace the process ends without finalizing (os._exit). A
# target's report is not stored: nothing is lost but the report nobody will read.
_queue: queue.SimpleQueue = queue.SimpleQueue()
_worker: list = []
_worker_lock = threading.Lock()
_state = threading.Condition()  # guards _closing and _compiling
_closing = [False]              # the interpreter is exiting: no new target compiles
_compiling: list = []           # what the worker compiles now ("graph ... for v5e:1x1")


def _not_compiled(lowering: GraphLowering, target) -> TargetReport:
    return TargetReport(resolve_target(target), lowering.hash,
                        error="not compiled: the program exited first")


def _work() -> None:
    try:  # on Linux, this thread only (and the threads libtpu starts from it)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass
    while True:
        future, args = _queue.get()
        with _state:
            if _closing[0]:
                future.set_result(_not_compiled(*args[:2]))
                continue
            _compiling.append(f"graph {format_hash(args[0].hash)} for {resolve_target(args[1]).name}")
        try:
            future.set_result(_compile_quietly(*args))
        except BaseException as e:  # noqa: BLE001 - the Future carries it to whoever waits
            future.set_exception(e)
        finally:
            with _state:
                _compiling.clear()
                _state.notify_all()


def compiles_pending() -> bool:
    """Whether a target compile runs or waits for the compile thread."""
    return bool(_compiling) or not _queue.empty()


def _stop() -> None:
    """At exit: no new target compiles; the queued ones are cancelled (their reports say
    the program exited first)."""
    with _state:
        _closing[0] = True
    while True:
        try:
            future, args = _queue.get_nowait()
        except queue.Empty:
            break
        future.set_result(_not_compiled(*args[:2]))


# the exit minds the TPU compile in progress (runtime/shutdown.py)
shutdown.add_work("TPU compile", compiles_pending, _stop)


def _lower_then_queue(future, lowering: GraphLowering, target) -> None:
    if _closing[0]:  # exiting: nobody will read it
        future.set_result(_not_compiled(lowering, target))
        return
    try:
        t0 = time.perf_counter()
        lowered = lowering.lower_for(resolve_target(target))
        lower_s = time.perf_counter() - t0
    except Exception as e:  # a graph that cannot go to the target (a mesh that does not fit)
        future.set_result(TargetReport(resolve_target(target), lowering.hash,
                                       error=_first_line(e)))
        return
    with _worker_lock:
        if not _worker:
            # a daemon: the interpreter never joins it (busy at exit: runtime/shutdown.py)
            _worker.append(threading.Thread(target=_work, name="xlanb-target-compile",
                                            daemon=True))
            _worker[0].start()
    _queue.put((future, (lowering, target, lowered, lower_s)))


def compile_in_background(lowering: GraphLowering, target) -> concurrent.futures.Future:
    """A Future of ``lowering``'s ``TargetReport`` (see above): the CPU run never waits
    for it."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()
    background(_lower_then_queue, future, lowering, target, later=True)
    return future


# ---------------------------------------------------------------------------------------
# The session's target: every new graph compiles for it too

def set_target(name) -> Target | None:
    """Compile every new graph for ``name`` too (a topology name such as ``"v5e:2x2"``
    or a ``Target``), on the compile threads; None turns it off. Returns the previous
    target."""
    prev = session.target
    session.target = None if name is None or name == "off" else resolve_target(name)
    return prev


def get_target() -> Target | None:
    """The target set by ``set_target`` / ``xlanb.target`` / ``XLANB_TARGET``, or None."""
    return session.target


@contextlib.contextmanager
def target(name):
    """``with xlanb.target("v5e:2x2"):`` every graph compiled in the block is also
    compiled for that TPU topology (``xlanb.graphs()[i].target`` holds the report)."""
    prev = set_target(name)
    try:
        yield session.target
    finally:
        session.target = prev


def start_target_compile(rec) -> None:
    """Give ``rec`` (a CompiledGraph) its report for the session's target, compiled in
    the background, unless it has one for that target already: a graph compiled before
    the target was set (or for another) gets one when it next runs."""
    t = session.target
    if t is not None and rec._target_for != t:
        rec._target, rec._target_for = compile_in_background(rec.lowering, t), t


def check_target_fit(rec, what: str) -> None:
    """With ``xlanb.memory_limit("target")``: before ``rec`` (a CompiledGraph) runs here,
    raise ``DeviceMemoryError`` if the TPU compiler says it does not fit one chip of the
    session's target, naming the largest buffers by line. Waits for that compile."""
    t = session.target
    if t is None:
        return
    start_target_compile(rec)
    r = rec._target.result()
    if r.fits is not False:
        return
    need = r.memory.peak_bytes if r.memory is not None else None
    biggest = sorted((p for p in r.padding if p.kind in ("argument", "output", "temp")),
                     key=lambda p: -p.padded_bytes)[:5]
    contributors = [Contributor(f"{p.kind} on {t.chip}",
                                f"{p.name} {p.type}" + (f" at {source_text(p.source)}"
                                                       if p.source else "")
                                + (f" [{p.scope}]" if p.scope else ""), p.padded_bytes)
                    for p in biggest]
    lines = [f"xlanb: {what} would not fit one {t.chip} chip of {t.name} "
             f"({format_bytes(t.hbm_bytes)} HBM): "
             + (f"it needs {format_bytes(need)} per chip" if need else "")
             + (f" (the TPU compiler: {r.error})" if r.error else "")]
    lines += [f"  {format_bytes(c.bytes):>10}  {c.kind}: {c.what}" for c in contributors]
    lines.append("  Nothing ran: every pending tensor is still pending. Shard it over more "
                 "chips, shrink the batch, or xlanb.memory_limit(None).")
    raise DeviceMemoryError("\n".join(lines), device=rec.device, limit=t.hbm_bytes,
                            projected=need, live=0, contributors=contributors)
