"""Whole graphs: compiled once per structure, kept in the graph cache and the graph log
(``xlanb.graphs()``), each with why it compiled and, for a recompile, what changed."""
from __future__ import annotations

import concurrent.futures
import functools
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import jax

from ..base import metrics
from ..base.caches import cache, clear_group
from ..base.config import config
from ..base.frames import SourceLoc, format_loc, warn_at
from ..base.session import session
from ..base.formats import (HASH_ID, format_bytes, format_duration, format_fits, format_hash,
                            format_table, format_table_html)
from ..graph import compile_time
from ..graph.collectives import CollectiveList, parse_collectives
from ..graph.explain import explain
from ..graph.render import render_dot, render_text
from ..graph.segments import (CUT_AT, CUT_RUN_AT, bind, components, cut, growth_text, growths,
                              segment_shapes, sighting, skeleton, varying_steps)
from ..graph.summary import summarize
from ..ir.nodes import GraphPlan
from ..runtime.compile_profile import raw_profile
from ..runtime.devices import jax_device
from ..runtime.jit import background, later_is_held
from ..runtime.mesh import sharding_text
from ..executables.background import drain_lowerings, lower_soon, lowerings_waiting
from ..executables.prefix import missing_ops
from ..executables.compile import Build
from ..values.memory import (GraphMemory, check_graph, device_bytes, device_oom, graph_buffers, graph_memory,
                     is_device_oom)
from ..executables.resident import admit_graph
from ..executables.stages import GraphLowering, kept_shardings, mesh_leaves, sharding_of
from ..executables.target import check_target_fit, start_target_compile
from .host import exact_only, fits_host, run_on_host, steps_fit_host

@dataclass
class CompiledGraph:
    """One graph compiled for xlanb's devices, as ``xlanb.graphs()`` lists it: the
    executable (dropped and loaded again as ``executables/resident.py`` decides), the lowering
    it came from (``stages.GraphLowering``), and the figures of its row."""
    hash: str
    device: int
    n_nodes: int
    n_inputs: int
    n_outputs: int
    cause: str
    src: SourceLoc | None  # the user's line whose sync compiled it
    compile_time: float
    # the executable while it is loaded (executables/resident.py may drop it; ``executable``
    # gets it back)
    _exe: object = field(repr=False)
    lowering: GraphLowering = field(default=None, repr=False)
    hits: int = 0
    run_time: float = 0.0
    # the summary of the last graph compiled from the same line, if any: ``explanation``
    # diffs against it when first asked (difflib over two graphs' ops is quadratic: an
    # eager PyTorch test spent most of its time diffing graphs nobody looked at)
    _explain_from: object = field(default=None, repr=False)
    _explanation: str | None = field(default=None, repr=False)
    # a segment of a graph whose shapes change: what grows, by line, and its fix
    # (graph/segments.growth_text), said after the explanation
    growth: str = ""
    # the graph its explanation compares it with (None: the first of its line, or of its
    # ops): the last one compiled from its line, or, for a graph whose shapes changed, its
    # ops' last graph, and for a segment, the same segment's last compile
    previous: object = field(default=None, repr=False)
    segment: bool = False  # a segment of a graph whose shapes change (graph/segments.py)
    summary: object = field(default=None, repr=False)  # summary.GraphSummary
    lowered: object = field(default=None, repr=False)  # jax.stages.Lowered, once known
    # a graph on a mesh: its outputs' shardings (the partitioner's choice) and the
    # collectives in its optimized module
    out_shardings: tuple | None = field(default=None, repr=False)
    collectives: CollectiveList = field(default_factory=CollectiveList, repr=False)
    _memory: object = field(default=False, repr=False)  # False: not asked yet
    # compiled for xlanb.target() too: a Future of its TargetReport (executables/target.py),
    # and the Target it is for
    _target: object = field(default=None, repr=False)
    _target_for: object = field(default=None, repr=False)
    # compiled with the quick tier (a lazy graph, an eager run), until its optimized
    # compile replaces it (``tier_up``)
    quick: bool = False
    _tiering: object = field(default=None, repr=False)
    # which of the process's graph runs (``_graph_runs``) was its last, and whether its
    # second run came only after ``LOOP_GAP`` others: not a loop's body, so it tiers up
    # as a small eager run does (``_tier_up_now``)
    last_run: int = field(default=-1, repr=False)
    first_run_s: float | None = field(default=None, repr=False)  # how long its first run took
    occasional: bool = field(default=False, repr=False)
    # a quick executable loaded from the store: how long its quick compile took in the
    # process that made it (its own ``compile_time`` is the load), so that it tiers up on
    # the schedule of its size (``quick_compile_s``)
    _quick_s: float | None = field(default=None, repr=False)
    eager_run: bool = field(default=False, repr=False)  # an eager run's graph
    # what runtime/compile_profile.py measured while it compiled (None: loaded from the
    # store), and the profile built from it when first asked for
    _compile_raw: object = field(default=None, repr=False)
    _compile_profile: object = field(default=None, repr=False)

    @property
    def quick_compile_s(self) -> float:
        """How long its quick compile took: what its tier-up rule weighs (``run_cached``)."""
        return self.compile_time if self._quick_s is None else self._quick_s

    @property
    def explanation(self) -> str:
        """Why it compiled: how it differs from the last graph compiled from its line
        ("" for the first)."""
        if self._explanation is None:
            prev = self._explain_from
            self._explanation = explain(prev, self.summary) if prev is not None else ""
            # (a first graph from its line says none; a segment, compared with its own
            # last compile or with nothing, always does)
            if self.growth and (prev is not None or self.segment):
                self._explanation = "; ".join(t for t in (self._explanation, self.growth) if t)
            self._explain_from = None
        return self._explanation

    @property
    def compile_profile(self) -> compile_time.CompileProfile:
        """Where its compile time went: by phase (XLA's own spans), by line and by
        scope (``graph/compile_time.py``). For a graph that tiered up: its quick compile."""
        if self._compile_profile is None:
            self._compile_profile = compile_time.build(
                self._compile_raw, self.executable.as_text(), f"graph {format_hash(self.hash)}",
                self.compile_time, recorded=compile_time.recorded_lines(self.summary),
                loops=compile_time.loop_layers(self.lowering.repeats if self.lowering else None),
                platform=jax_device(self.device).platform, summary=self.summary)
        return self._compile_profile

    @property
    def module(self) -> str:
        """Its HLO module's name, as XLA's profiler trace names it (``hlo_module``)."""
        return self.lowering.module

    @property
    def repeats(self) -> list[str]:
        """Its repeated layers, one line per loop (``24 × bert.encoder.layer compiled
        once (scan, layers 0–23)``) and per layer left unrolled, with the reason
        (``graph/repeats.py``); empty when it has none (or ``XLANB_SCAN_LAYERS=0``)."""
        r = self.lowering.repeats if self.lowering is not None else None
        return r.lines() if r is not None else []

    @property
    def in_shardings(self) -> tuple | None:
        """On a mesh: its leaves' shardings."""
        return self.lowering.shardings

    @property
    def target(self):
        """Its ``TargetReport`` for the target set when it last compiled or ran (waits
        for that compile, which runs in the background), or None."""
        return None if self._target is None else self._target.result()

    def build(self, metric: str = "CompileTime") -> Build:
        """How its optimized executable is made (``compile.Build``): from the module its
        quick one compiled from, while it is kept (a tier-up lowered the graph again, on a
        compile thread whose Python held the GIL against the steps: 0.3-0.5 s of BERT's)."""
        return graph_build(self.lowering, self.device, metric, self.lowered)

    def reload(self):
        """A dropped executable: from the executable store (at its tier: a quick one
        stays quick until its tier-up), else compiled again, optimized."""
        build = self.build()
        exe = (build.at("quick") if self.quick else build).stored()
        if exe is None:
            exe = self.compile_optimized("CompileTime")
            self.quick = False
        return exe

    def compile_optimized(self, metric: str):
        """Its lowering compiled with XLA's full optimizations (timed into ``metric``),
        and stored, unless it is on a mesh."""
        return self.build(metric).compile()

    def _store_key(self) -> str | None:
        return self.build().key

    @property
    def hash_full(self) -> str:
        return self.lowering.hash

    @property
    def executable(self):
        """The compiled executable (loaded again, and counted as ``GraphReload``, if it
        was dropped to keep the process's loaded graphs bounded)."""
        exe = self._exe
        if exe is None:
            exe = self._exe = self.reload()
            metrics.counter("GraphReload")
        admit_graph(self)
        return exe

    @executable.setter
    def executable(self, exe) -> None:
        self._exe = exe

    def drop_executable(self) -> None:
        """Let go of the executable and the lowered module (both come back on use)."""
        self._exe = None
        self.lowered = None

    @property
    def memory(self) -> GraphMemory | None:
        """XLA's memory analysis of this executable (``argument_bytes``, ``output_bytes``,
        ``alias_bytes``, ``temp_bytes``, ``peak_bytes``; see ``GraphMemory``), or None
        where the backend gives none."""
        if self._memory is False:
            self._memory = graph_memory(self.executable)
        return self._memory

    def lowered_module(self):
        """The ``jax.stages.Lowered`` this graph compiles from (lowered now if needed)."""
        if self.lowered is None:
            self.lowered = self.lowering.lower()
        return self.lowered

    def ir_text(self, depth: int | None = None) -> str:
        """The graph's IR as it was recorded, one line per node."""
        return render_text(self.summary, depth)

    def dot(self, scope_depth: int | None = None, highlight: str | None = None) -> str:
        """The graph as Graphviz DOT (see ``graph.render.render_dot``)."""
        return render_dot(self.summary, scope_depth, highlight)

    def hlo(self, dialect: str = "stablehlo", optimized: bool = False) -> str:
        """The module this graph compiled from, or XLA's optimized HLO."""
        if optimized:
            return self.executable.as_text()
        if dialect not in ("stablehlo", "hlo"):
            raise ValueError(f"dialect must be 'stablehlo' or 'hlo', got {dialect!r}")
        # the hlo dialect prints each instruction's metadata: op_name (scope path and
        # aten op), source_file and source_line (the user's line)
        return self.lowered_module().as_text(dialect=dialect, debug_info=dialect == "hlo")

    @property
    def ops(self) -> tuple:
        """Op names in topological order."""
        return tuple(o.name for o in self.summary.ops) if self.summary else ()

    def cost_analysis(self) -> dict:
        """XLA's cost estimate (flops, bytes accessed...), where the backend provides it."""
        try:
            return dict(self.executable.cost_analysis() or {})
        except Exception:  # not every backend implements it
            return {}

    def largest_buffers(self, n: int = 10) -> list:
        """The ``n`` largest buffers the executable allocates while it runs (results of
        its optimized entry computation that are not its outputs), each a
        ``GraphBuffer`` with its aten op, scope and the user's line; XLA may reuse one
        buffer for several of them, so they can add up to more than ``memory.temp_bytes``."""
        return graph_buffers(self.executable, self.summary, n)

    def memory_analysis(self):
        """XLA's memory use of the executable, where the backend provides it."""
        try:
            return self.executable.memory_analysis()
        except Exception:
            return None


class Column(NamedTuple):
    """One column of the graph table: the text, HTML and pdb tables all read these."""
    header: str
    right: bool                           # numbers align right
    get: Callable[[CompiledGraph], str]   # the cell of one graph


def _target_cell(g: CompiledGraph, pick) -> str:
    """A cell from the graph's target report, without waiting for it."""
    f = g._target
    if f is None:
        return ""
    if not f.done():
        return "compiling"
    r = f.result()
    return pick(r) if r.memory is not None or r.error is None else "error"


def _estimate(r) -> str:
    if r.cost is None:
        return "?"
    secs = r.cost.seconds or r.cost.roofline_seconds  # XLA's, else the roofline's bound
    return format_duration(secs) + ("" if r.cost.seconds else "+")


def _fits(r) -> str:
    return format_fits(r.fits, column=True)


GRAPH_COLUMNS = (
    Column("hash", False, lambda g: format_hash(g.hash)),
    Column("ops", True, lambda g: str(g.n_nodes)),
    Column("in", True, lambda g: str(g.n_inputs)),
    Column("out", True, lambda g: str(g.n_outputs)),
    Column("compile", True, lambda g: format_duration(g.compile_time)),
    Column("hits", True, lambda g: str(g.hits)),
    Column("run", True, lambda g: format_duration(g.run_time)),
    Column("peak mem", True, lambda g: format_bytes(g.memory.peak_bytes) if g.memory else "?"),
    Column("cause", False, lambda g: g.cause),
    Column("source", False, lambda g: format_loc(g.src)),
    Column("slowest to compile", False, lambda g: _slowest_cell(g)),
)


def _slowest_cell(g: CompiledGraph) -> str:
    """The line whose ops took most of its compile (``model.py:42 61%``); "" where that
    would mean loading a dropped executable again just to read its module."""
    if g._compile_profile is None and (g._exe is None or g._compile_raw is None):
        return ""
    return g.compile_profile.short()
# shown once a graph was compiled for a target (xlanb.target): per chip
TARGET_COLUMNS = (
    Column("target", False, lambda g: _target_cell(g, lambda r: r.target.name)),
    Column("TPU peak", True, lambda g: _target_cell(
        g, lambda r: format_bytes(r.memory.peak_bytes) if r.memory else "?")),
    Column("fits", False, lambda g: _target_cell(g, _fits)),
    Column("TPU est.", True, lambda g: _target_cell(g, _estimate)),
    Column("TPU compile", True, lambda g: _target_cell(
        g, lambda r: format_duration(r.compile_seconds))),
)


def _loops_cell(g: CompiledGraph) -> str:
    """``24×bert.encoder.layer fwd+bwd+upd``: its repeated layers, each compiled once."""
    r = g.lowering.repeats if g.lowering is not None else None
    if r is None:
        return ""
    kinds: dict = {}
    for run in r.runs:
        kinds.setdefault((len(run.layers), run.name), []).append(
            {"forward": "fwd", "backward": "bwd"}.get(run.kind, "upd"))
    return ", ".join(f"{n}×{name} {'+'.join(k)}" for (n, name), k in kinds.items())


# shown once a graph has repeated layers compiled as one loop (graph/repeats.py)
LOOP_COLUMNS = (Column("layers (scan)", False, _loops_cell),)


def graph_columns(graphs) -> tuple:
    """The columns of a table of ``graphs``: the target's too where any has one, and
    the repeated layers' where any has some."""
    loops = any(g.lowering is not None and g.lowering.repeats is not None for g in graphs)
    return (GRAPH_COLUMNS + (LOOP_COLUMNS if loops else ())
            + (TARGET_COLUMNS if any(g._target is not None for g in graphs) else ()))


class GraphList(list):
    """``xlanb.graphs()``: compiled graphs, oldest first, printable as a table."""

    def columns(self) -> tuple:
        return graph_columns(self)

    def rows(self) -> list[tuple]:
        cols = self.columns()
        return [(str(i),) + tuple(c.get(g) for c in cols) for i, g in enumerate(self)]

    def __str__(self) -> str:
        if not self:
            return "no compiled graphs"
        cols = self.columns()
        lines = format_table(("#",) + tuple(c.header for c in cols), self.rows(),
                             right=[0] + [i + 1 for i, c in enumerate(cols) if c.right]).split("\n")
        for i, g in enumerate(self):
            if g.explanation:
                lines.append(f"  #{i} recompiled: {g.explanation}")
            for line in g.repeats:
                lines.append(f"  #{i} layers: {line}")
            if g.collectives:
                counts = ", ".join(f"{n} {k}" for k, n in g.collectives.counts().items())
                lines.append(f"  #{i} on a mesh: {counts}; {g.collectives.total_bytes} bytes "
                             "per device per run (xlanb.collectives)")
            f = g._target
            if f is not None and f.done() and f.result().error:
                lines.append(f"  #{i} on {f.result().target.name}: {f.result().error}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        header = ("#",) + tuple(c.header for c in self.columns()) + ("why",)
        rows = [tuple(r) + (g.explanation,) for r, g in zip(self.rows(), self)]
        return format_table_html(header, rows, cls="xlanb-graphs")


# The "graphs" group: what clear_graph_cache forgets (with the loaded set, resident.py's)
graph_cache: dict = cache({}, "(device, structural key) -> CompiledGraph", compiled=True,
                          group="graphs")
graph_log = cache([], "every CompiledGraph, in compile order", group="graphs")


def cached_graph(plan: GraphPlan, device: int) -> CompiledGraph | None:
    """The graph of ``plan``'s structure on one device if this process has it (an eager
    run's quick one, or the optimized one), without compiling anything."""
    return graph_cache.get((device, plan.key)) or graph_cache.get((device, plan.key, "quick"))


def compiled_graph(plan: GraphPlan, device: int, cause: str, src,
                   arrays=None, mesh=None, keep=None, quick: bool = False,
                   prev=None, growth: str = "", reshaped: bool = False,
                   shaped_prev=None) -> tuple[CompiledGraph, bool]:
    """The cached executable of ``plan``'s structure: from memory, else from the
    executable store, else compiled now. Returns it and whether it is new to this process.
    On a mesh (``mesh``, with the leaves' ``arrays``), the key holds the leaves'
    shardings too, and the executable is not stored. With a target set
    (``xlanb.target``), a new graph is compiled for it too, on the compile threads.
    A graph on one device (a lazy graph, or ``quick``: an eager run) is the optimized
    executable if there is one, in memory or in the store (``tier_up`` makes one), else
    the quick one: from the store, where it has a key of its own (its options), or
    compiled now and stored there (but for a big lazy graph's, whose optimized one is
    stored soon), so that a new process runs the same program without lowering anything.
    ``prev``: the graph its explanation compares it with (None: the last one compiled
    from ``src``; False: none); ``growth``: what grows, said after it; ``reshaped``: the
    same ops were compiled before at other shapes (what strict recompiles refuse, with
    a line's ``frequent_compiles``-th new graph); ``shaped_prev``: those ops' last graph,
    which strict recompiles explain it against when its line compiled nothing before."""
    shardings = tuple(sharding_of(a) for a in arrays) if mesh is not None else None
    key = (device, plan.key) if shardings is None else (device, plan.key, shardings, keep)
    tiered = shardings is None and config.quick_compiles
    rec = cached_graph(plan, device) if tiered else graph_cache.get(key)
    if rec is not None:
        return rec, False
    lowering = GraphLowering.of(plan, device, shardings, mesh, keep)
    t0 = time.perf_counter()
    build = graph_build(lowering, device, "EagerRunCompileTime" if quick else "CompileTime")
    if tiered and build.at("quick").options is not None:
        # the optimized executable if one is stored, else the quick one, stored under a
        # key of its own (its options)
        if not build.in_store():  # (a look that counts no miss)
            build = build.at("quick")
    eager_run, quick = quick, build.tier == "quick"
    exe = build.stored()
    summary = summarize(plan)
    from_line = None if prev else next(
        (g for g in reversed(graph_log) if g.src == src and g.device == device), None)
    if prev is None:
        prev = from_line
    ref = prev or from_line or shaped_prev
    if exe is None and config.strict_recompiles and ref and (
            reshaped or _compiles_at.get(src, 0) >= config.frequent_compiles):
        raise _recompile_error(ref, summary, growth, src, cause, len(plan.steps))
    if exe is None:
        try:
            exe = _compile_graph(build, keep=not quick)
        except Exception as e:
            e.add_note(f"xlanb: while compiling a graph of {len(plan.steps)} ops ({cause}) "
                       f"synced at {format_loc(src) or '?'}; every tensor keeps its "
                       "pending work (xlanb.pending_ir() shows it)")
            raise
        if quick and (eager_run or not _big_compile(time.perf_counter() - t0)):
            # stored, so that a new process runs it without lowering; but not a big lazy
            # graph's: its optimized compile starts after this run (run_plan_as_graph) and
            # is stored (at exit, xlanb waits for it), and pickling the quick one was
            # 0.12 s of BERT's first step. With its compile time: loaded in a new process,
            # it tiers up on its size's schedule (``run_cached``), not its load's
            build.store(exe, {"quick_compile_s": time.perf_counter() - t0})
    quick_s = build.info.get("quick_compile_s") if quick else None
    lowered = build.lowering.lowered
    if quick:
        key = (device, plan.key, "quick")
        metrics.counter("QuickCompile")
    if build.metric == "CompileTime":
        metrics.counter("UncachedCompile")
    rec = CompiledGraph(format_hash(lowering.hash, HASH_ID), device, len(plan.steps), len(plan.leaves),
                        len(plan.roots), cause, src, time.perf_counter() - t0, exe,
                        lowering=lowering,
                        _explain_from=prev.summary if prev else None, growth=growth,
                        previous=prev or None, segment=prev is False,
                        summary=summary, lowered=lowered, quick=quick,
                        _quick_s=quick_s if isinstance(quick_s, (int, float)) else None,
                        eager_run=eager_run,
                        _compile_raw=raw_profile(exe) if lowered is not None else None)
    admit_graph(rec)
    if shardings is not None:
        _note_partitioning(rec, plan, exe, mesh)
    start_target_compile(rec)  # with a target set; the CPU run never waits for it
    graph_cache[key] = rec
    graph_log.append(rec)
    return rec, True


def _note_partitioning(rec: CompiledGraph, plan: GraphPlan, exe, mesh) -> None:
    """A graph on a mesh: the partitioner's output shardings, and its collectives."""
    try:
        rec.out_shardings = tuple(exe.output_shardings)
    except Exception:  # an executable that does not say (loaded, another JAX)
        rec.out_shardings = None
    if rec.out_shardings:  # the partitioner's choice for each output
        known = dict(rec.summary.shardings)
        extra = tuple((p, "propagated " + sharding_text(sh))
                      for p, sh in zip(plan.root_pos, rec.out_shardings)
                      if p not in known and len(sh.device_set) > 1)
        rec.summary = rec.summary._replace(shardings=rec.summary.shardings + extra)
    rec.collectives = CollectiveList(
        parse_collectives(exe.as_text(), dict(mesh.mesh.shape)), rec.hash)


def graph_build(lowering: GraphLowering, device: int, metric: str, lowered=None) -> Build:
    """How a graph's optimized executable is made: stored under its lowering's hash,
    unless it is on a mesh (a sharding's devices are this process's own). ``lowered``:
    its ``jax.stages.Lowered``, where one is at hand (every tier compiles the same one)."""
    # (a partial, not a lambda: the build calls into the lowering's own layer, not back
    # up into this module)
    lower = functools.partial(lowering.lower, lower_metric="LowerTime")
    return Build(device, lower, metric=metric, lowered=lowered,
                 description=lowering.hash.encode() if lowering.shardings is None else None)


def _compile_graph(build: Build, keep: bool = True):
    """Compile a graph (stored if ``keep``); single ops a look or an eager run left
    unlowered (``background.lower_soon``) are lowered meanwhile, on this thread, which
    would otherwise only wait."""
    build.lower()
    if not lowerings_waiting():
        return build.compile(keep=keep)
    future = background(functools.partial(build.compile, keep=keep))
    drain_lowerings(future.done)
    return future.result()


QUICK_BIG_S = 0.5  # a quick compile this long: a big graph (see run_plan_as_graph)...
QUICK_BIG_RUN_S = 0.1  # ...once its first run took this long too (``_big``)
# A graph whose second run comes more than this many graph runs after its first is not a
# loop's body (a training step and the reads around it: 1-3 runs apart) but one that
# comes back now and then: a generate call's prefill at a prompt length seen before
# (some 150 runs apart: a segmented decode step runs a dozen segments per token)
LOOP_GAP = 8
_graph_runs = [0]  # graph runs in this process (``run_compiled``): the clock of LOOP_GAP


def _big_compile(compile_s: float) -> bool:
    """Whether a quick compile that took ``compile_s`` may have made a big graph (its
    first run decides: ``_big``); until then its quick executable is not stored."""
    return compile_s >= QUICK_BIG_S


def _big(rec: CompiledGraph) -> bool:
    """Whether ``rec`` is a big graph (a training step): its quick compile took
    ``QUICK_BIG_S`` and its first run ``QUICK_BIG_RUN_S`` (BERT's step 0.35-0.55 s at
    -O0). Its tier-up follows the lazy schedule, and a lazy one's starts after its first
    run. Not by the compile alone: the tiny Llama's 256-266-op forward compiles in
    0.42-0.57 s on two cores and runs in 3 ms, so a first ``generate`` call either made
    it big or not, and a big one's optimized compile, beside the next compiles, pushed
    them past the mark too (four tier-ups, the call 2.3 or 4.0 s from run to run)."""
    if not _big_compile(rec.quick_compile_s):
        return False
    return rec.first_run_s is None or rec.first_run_s >= QUICK_BIG_RUN_S


def tier_up(rec: CompiledGraph, swap_when_done: bool = True) -> None:
    """A quick graph that runs again: its optimized executable compiles on the compile
    threads, after every compile someone waits for, and is stored. ``swap_when_done``
    (an eager run): it takes the quick one's place as soon as it is ready; otherwise at
    the graph's next run (``finish_tier_up``)."""
    if not rec.quick or rec._tiering is not None:
        return
    rec._tiering = background(rec.compile_optimized, "GraphTierUpCompileTime", later=True)
    if swap_when_done:
        rec._tiering.add_done_callback(lambda future: _swap(rec, future))


def tier_up_hot(min_runs: int) -> int:
    """Start the optimized compile of every quick eager run (or segment of one) that has
    run ``min_runs`` times or more, the longest-running first; how many started. Their
    optimized executables swap in when ready (``_tier_up_now``), but by their own rule
    they start only once they have run as long as their quick compile took: a
    ``generate`` call's decode segments about 250 runs, a dozen calls, each 2-3x slower
    than optimized meanwhile. Called where the process is idle (a notebook cell has
    ended), the compiles use the user's think time. Not lazy graphs: what a lazy cell
    compiles and tiers up is what its user inspects (the status line counted a tier-up
    that finished in the next cell), and a loop's body keeps its fixed run."""
    hot = {id(g): g for g in list(graph_cache.values())
           if g.quick and g.eager_run and g._tiering is None and g.hits + 1 >= min_runs
           and not _big(g)}
    for g in sorted(hot.values(), key=lambda g: -g.run_time):
        tier_up(g, swap_when_done=True)
    return len(hot)


def _swap(rec: CompiledGraph, future) -> None:
    if future.cancelled() or future.exception() is not None:
        return  # the quick one stays
    if not rec.quick:
        return
    if rec._exe is not None:  # dropped meanwhile: the next run loads it from the store
        rec._exe = future.result()
    rec.quick = False
    metrics.counter("GraphTierUp")


def finish_tier_up(rec: CompiledGraph) -> None:
    """A lazy graph's (or a big eager run's) third run: its optimized executable
    (started at its second run) takes the quick one's place, waited for if it is still
    compiling. At a fixed run, so that a training loop's values never depend on how
    quick the compile was (the tiers round differently: XLA's defaults contract a
    multiply-add into an FMA). Not while a look holds back the compile threads' later
    work (``later_held``): it would wait on itself; the quick one runs once more."""
    future = rec._tiering
    if future is None or not rec.quick or (not future.done() and later_is_held()):
        return
    concurrent.futures.wait([future])
    _swap(rec, future)  # (a failed optimized compile leaves the quick one)


class RecompileWarning(UserWarning):
    """Graphs from one source line keep compiling (the graph is dynamic)."""


class RecompileError(RuntimeError):
    """A recompile after warm-up, with ``XLANB_STRICT_RECOMPILES`` on
    (``xlanb.config.strict_recompiles``): the ops of a graph compiled before, at other
    shapes, or a line's ``frequent_compiles``-th new graph. Nothing was compiled or run;
    every tensor keeps its pending work."""


def _recompile_error(prev: CompiledGraph, summary, growth: str, src, cause: str,
                     n: int) -> RecompileError:
    why = "; ".join(t for t in (explain(prev.summary, summary), growth) if t)
    return RecompileError(
        f"xlanb: a recompile after warm-up at {format_loc(src) or '?'} ({cause}: a graph "
        f"of {n} ops; strict recompiles are on): {why}. Nothing ran; every tensor keeps "
        "its pending work. xlanb.config.strict_recompiles = False (XLANB_STRICT_RECOMPILES=0) "
        "allows it")


_syncs_at = cache({}, "source location -> lazy syncs from there", group="graphs")
_compiles_at = cache({}, "source location -> new graphs from there", group="graphs")
_warned_at = cache(set(), "source locations warned about recompiling (once each)", group="graphs")


def _report_compile(rec: CompiledGraph, src) -> None:
    """XLANB_DEBUG printing, and the too-frequent warning that names the cause."""
    n = _compiles_at[rec.src] = _compiles_at.get(rec.src, 0) + 1
    if config.debug and rec.explanation:
        print(f"xlanb: new graph {format_hash(rec.hash)} ({rec.cause} at {format_loc(rec.src)}): "
              f"{rec.explanation}",
              file=sys.stderr)
    syncs = _syncs_at.get(rec.src, 0)
    if n >= config.frequent_compiles and 2 * n >= syncs and rec.src not in _warned_at \
            and rec.explanation:
        # Once per call site: each message differs (counts, shapes), so Python's own
        # once-per-text filter would let every later recompile through.
        _warned_at.add(rec.src)
        msg = (f"xlanb: compiles too frequent: {n} graphs in {syncs} syncs at "
               f"{format_loc(rec.src) or '?'} ({rec.cause}); latest: {rec.explanation}. "
               "Said once for this line; xlanb.graphs() lists every graph and why it "
               "compiled.")
        if src is not None:  # point the warning at the user's line, not at xlanb
            warn_at(src, msg, RecompileWarning)
        else:
            warnings.warn(msg, RecompileWarning, stacklevel=3)


def find_graph(plan: GraphPlan, device: int, cause: str, src, placed=None, quick=False,
               growth: str = "", reshaped: bool = False, shaped_prev=None):
    """``(CompiledGraph, fresh, leaf arrays)`` for ``plan``, as a sync would run it:
    on a mesh if it touches sharded tensors (``placed``: see ``stages.kept_shardings``)."""
    arrays, mesh = mesh_leaves(plan)
    rec, fresh = compiled_graph(plan, device, cause, src, arrays, mesh,
                                kept_shardings(placed, mesh), quick, growth=growth,
                                reshaped=reshaped, shaped_prev=shaped_prev)
    return rec, fresh, arrays


def run_plan_as_graph(plan: GraphPlan, device: int, cause: str, src, placed=None,
              run: bool = False) -> list:
    """Compile (or find) the graph of ``plan`` and run it; returns the roots' arrays.
    ``placed`` (SPMD): per root, the sharding of the value it replaces (see ``stages.kept_shardings``).
    ``run``: an eager run of ops (mode_policy.Eager), compiled quickly first and counted
    as ``EagerRunCompile`` / ``EagerRunCacheHit`` rather than as lazy graphs.
    A graph whose shapes change (graph/segments.py) runs as segments cached apart."""
    if not run:
        _syncs_at[src] = _syncs_at.get(src, 0) + 1
    growth, reshaped, prev = "", False, None
    if not session.spmd and cached_graph(plan, device) is None:
        parts = _parts(plan, device, run)
        if parts is not None:
            return _run_segments(plan, parts, device, cause, src, run)
        seen = sighting(plan, device)
        reshaped = seen is not None and len(seen.infos) > 1
        if run and reshaped and exact_only(plan) and fits_host(plan):
            # a small eager run of integers whose shapes changed (generate's attention
            # mask and stopping check at a new prompt length, 70 ms of compiles): CPU
            # torch's values are the device's exactly. Not a lazy graph (its compiles are
            # what a user inspects), nor floats (a device's rounding is what eager shows)
            outs = run_on_host(plan, [n.data for n in plan.leaves], device)
            if outs is not None:
                return outs
        if reshaped:  # its shapes changed: name what grows
            growth = growth_text(growths(plan, seen))
            # (explained against the last graph from its line, as any graph is; strict
            # recompiles, from another line, against its ops' last graph)
            prev = _skeleton_last.get((device, skeleton(plan)))
        if run and config.tier_up:
            _in_new_company(plan, seen.varying if reshaped else None)
    rec, fresh, arrays = find_graph(plan, device, cause, src, placed, quick=run, growth=growth,
                                    reshaped=reshaped, shaped_prev=prev)
    if fresh and not session.spmd:
        _skeleton_last[(device, skeleton(plan))] = rec
    return _run_found(rec, fresh, arrays, plan, cause, src, run)


def _parts(plan: GraphPlan, device: int, run: bool) -> list | None:
    """The segments to run ``plan`` (a graph that missed the cache) as, or None to run
    it whole: where its shapes changed since its ops' last sighting (graph/segments.py),
    or, for an eager run, the independent pieces it swept up when one of them ran as a
    run of its own before (the same ops at the same shapes, read at other places, then
    compile nothing). A graph of a key that ran as segments before runs as the same
    segments (``_segmented``), planned once; its sighting is noted all the same (what
    the next new shapes are compared with)."""
    varying = varying_steps(plan, device, CUT_RUN_AT if run else CUT_AT, run)  # (notes it)
    if not config.segments:
        return None
    shapes = _segmented.get((device, plan.key, run))
    if shapes is not None:
        metrics.counter("SegmentPlanHit")
        return bind(shapes, plan)
    if varying:
        pieces = cut(plan, varying, lambda steps: steps_fit_host(plan, steps))
        if len(pieces) > 1:
            shapes = segment_shapes(plan, pieces, varying)
    if shapes is None and run:
        groups = components(plan)
        if len(groups) > 1:
            found = segment_shapes(plan, groups, frozenset())
            if any(cached_graph(s, device) is not None for s in found):
                metrics.counter("EagerRunInPieces")
                shapes = found
    if shapes is None:
        return None
    _segmented[(device, plan.key, run)] = shapes
    return bind(shapes, plan)


def _run_segments(plan: GraphPlan, segments: list, device: int, cause: str, src,
                  run: bool) -> list:
    """``plan`` run as its ``segments`` in order, each found or compiled as a graph of
    its own (counted ``SegmentCompile`` / ``SegmentCacheHit``); the roots' arrays."""
    vals = [n.data for n in plan.leaves] + [None] * len(plan.steps)
    metrics.counter("SegmentedGraph")
    shape_key = None  # (device, skeleton): only a compile needs it
    growth = None
    # The device's live bytes, walked once: each segment adds its outputs (held in
    # ``vals`` until the end) and frees nothing. A walk per segment was 20% of running
    # a cached segment (a tiny Llama's decode step runs 12).
    live = device_bytes().get(device, 0)
    for i, seg in enumerate(segments):
        new_change = seg.changed and cached_graph(seg.plan, device) is None
        if new_change and fits_host(seg.plan):
            outs = run_on_host(seg.plan, [vals[p] for p in seg.inputs], device)
            if outs is not None:
                for p, a in zip(seg.outputs, outs):
                    vals[p] = a
                    live += a.nbytes
                continue
        prev = False  # (not the last graph from its line: another segment's)
        if new_change:
            # its explanation compares it with the same segment's last compile, and says
            # what grows (computed once per graph, and only for a compile)
            if shape_key is None:
                shape_key = (device, skeleton(plan))
            prev = _segment_prev.get((shape_key, i), False)
            if growth is None:
                growth = growth_text(growths(plan, sighting(plan, device)))
        rec, fresh = compiled_graph(seg.plan, device, cause, src, quick=run, prev=prev,
                                    growth=(growth or "") if seg.changed else "",
                                    reshaped=seg.changed)
        if fresh and seg.changed:  # (so new_change: shape_key is set)
            _segment_prev[(shape_key, i)] = rec
        metrics.counter("SegmentCompile" if fresh else "SegmentCacheHit")
        outs = _run_found(rec, fresh, [vals[p] for p in seg.inputs], seg.plan, cause, src, run,
                          live)
        for p, a in zip(seg.outputs, outs):
            vals[p] = a
            live += a.nbytes
    return [vals[p] for p in plan.root_pos]


def _in_new_company(plan: GraphPlan, changed=None) -> None:
    """An eager run about to compile (or load from the store), with ops no run of the
    same ops ever held: an op in its ``tier_up``-th (3rd) such run comes back in new
    company, so it gets its own optimized executable, lowered while this run compiles
    (the main thread only waits there; ``lower_soon``) and compiled on the compile
    threads. Ops of a run that repeats never need one: the run's graph is cached. Of a
    run whose shapes changed, only the ops at the ``changed`` steps count (the rest
    come back in the same company, at the same shapes): counted, generate's stable ops
    tiered up after three tokens, and each op that then ran alone moved the start of
    the next call's runs, whose skeletons were new again. Not at the
    2nd: a training loop's first two steps are different runs (step 1 creates the
    optimizer's state), and from step 3 on the second one's graph is cached; at 2,
    every op of the BERT step tiered up and step 3 waited for 168 single-op compiles
    (3 s)."""
    again = []
    if changed is not None:
        plan = plan._replace(steps=[plan.steps[k] for k in sorted(changed)])
    for info in missing_ops(plan):
        info.seen = max(info.seen, 0) + 1
        if info.seen >= config.tier_up:
            again.append(info)
            info.opens_run = False  # it runs alone from now on, not as a run's first op
    if again:
        lower_soon(again)


_segment_prev = cache({}, "(device, skeleton, segment index) -> its last CompiledGraph",
                      group="graphs")
# A segmented graph's next token (a decode step's at a length seen before, a generate
# call repeated) would plan the same cut again: 1 ms of a tiny Llama's 7 ms token.
_segmented = cache({}, "(device, graph key, eager run) -> its SegmentShapes", group="graphs")
_skeleton_last = cache({}, "(device, skeleton) -> the last CompiledGraph of those ops",
                       group="graphs")


def _run_found(rec: CompiledGraph, fresh: bool, arrays, plan: GraphPlan, cause: str, src,
               run: bool, live: int | None = None) -> list:
    """Run a graph ``find_graph`` (or a segment's ``compiled_graph``) gave, counted as a
    lazy graph's or an eager run's: a new one here, one that came back through
    ``run_cached`` (and its tier-up rule). ``live``: as ``run_compiled`` takes it."""
    what = _SyncedGraph(len(plan.steps), cause, src)
    if run:
        metrics.counter("EagerRunCompile" if fresh else "EagerRunCacheHit")
    elif not fresh:
        metrics.counter("CachedCompile")
    if not fresh:
        return run_cached(rec, arrays, plan.scalars, what, src, eager_run=run, live=live)
    if not run:
        _report_compile(rec, src)
    outs = run_compiled(rec, arrays, plan.scalars, what, src, live)
    if not run and rec.quick and _big_compile(rec.quick_compile_s):
        if _big(rec):
            # a training step: it will be back, and its quick code runs 3-5x slower; its
            # optimized compile starts now, after this run (on two cores, compiling
            # beside the run slowed a BERT step's quick run 1.5-2x), to be swapped in at
            # its third
            tier_up(rec, swap_when_done=False)
        elif rec._exe is not None:
            # not big after all: its quick one is stored now (the store writes nothing
            # it loaded itself: written again, it lost its code; runtime/store.py)
            rec.build().at("quick").store(rec._exe, {"quick_compile_s": rec.quick_compile_s})
    return outs


def run_cached(rec: CompiledGraph, arrays, scalars, what, src, eager_run: bool = False,
               live: int | None = None) -> list:
    """Run a graph that came back: the one way every path that holds a graph's
    executable runs it again (a lazy graph's cache hit, a segment's, an eager run's
    with ``eager_run``, an ``xlanb.compile`` replay and so ``torch.compile``'s and the
    ``openxla`` backend's, on one device or a mesh, loaded from the store or not). It
    counts the run (``hits``) and tiers a quick executable up by one rule
    (``_tier_up_now``), so no path replays a quick executable forever; returns the
    outputs (``run_compiled``)."""
    rec.hits += 1
    if rec.hits == 1 and _graph_runs[0] - rec.last_run > LOOP_GAP:
        rec.occasional = True
    swap_when_done = _tier_up_now(rec, eager_run) if rec.quick else None
    outs = run_compiled(rec, arrays, scalars, what, src, live)
    if swap_when_done is not None:
        # after the run that asked for it: on two cores, a compile beside the quick run
        # slowed the BERT step's run 1.5-2x
        tier_up(rec, swap_when_done=swap_when_done)
    return outs


def _tier_up_now(rec: CompiledGraph, eager_run: bool):
    """The tier-up rule of a quick graph that came back (its ``hits`` counted): None
    (nothing to start), False (its optimized compile starts after this run, to be
    swapped in at a later one) or True (it starts, and swaps in when ready).

    A graph (lazy, replayed, or a big eager run: its quick compile took ``QUICK_BIG_S``,
    a training step, whose quick code runs 3-5x slower) tiers up at a fixed run: its
    optimized compile starts at its second run (a big lazy graph's: after its first,
    ``_run_found``), and from its third the optimized executable runs, waited for there
    (``finish_tier_up``). At a fixed run, a loop's values do not depend on how quick the
    compile was (the tiers round differently). Swapped in whenever it was ready, the BERT
    step's came after 8 steps or more, the compile threads sharing two cores with the
    steps. A graph that runs once or twice (a notebook cell, a test) never pays for it.
    A small eager run's pays once it has run for as long as its quick compile took (one
    that runs in microseconds never tiers up), and takes the quick one's place when
    ready: nobody waits for it. So does a small segment's (a lazy graph whose shapes
    change, graph/segments.py): waited for at a fixed run, each new segment of a
    ``generate`` call stalled its third token for its optimized compile (1.9 s in a
    2.4 s call of the tiny Llama, loaded). And so does a small lazy graph that is not a
    loop's body (``occasional``: its second run came ``LOOP_GAP`` graph runs after its
    first): a ``generate`` call's prefill at a prompt length seen before started its
    optimized compile in the next call and was waited for in the one after (the tiny
    Llama's third and fourth calls 0.42 and 0.40 s against 0.20 s)."""
    if (eager_run or rec.segment or rec.occasional) and not _big(rec):
        return True if rec.run_time >= rec.quick_compile_s else None
    if rec._tiering is None:
        return False
    if rec.hits >= 2:
        finish_tier_up(rec)
    return None


class _SyncedGraph:
    """A synced graph as errors name it; the text is made only for an error (an eager
    run's read makes one of these per run)."""
    __slots__ = ("n", "cause", "src")

    def __init__(self, n: int, cause: str, src):
        self.n, self.cause, self.src = n, cause, src

    def __str__(self) -> str:
        return f"the graph of {self.n} ops ({self.cause}) synced at {format_loc(self.src) or '?'}"


def run_compiled(rec: CompiledGraph, arrays, scalars, what, src, live: int | None = None
                 ) -> list:
    """The one step that runs a compiled graph, whatever made it (a sync, an eager run,
    an ``xlanb.compile`` replay); returns its outputs, ready. In order: its report for a
    target set since it compiled; its projected peak and ``xlanb.memory_limit``'s check
    (with ``"target"``, the TPU compiler's word); the processes' agreement that they all
    run it; the run, with a device out-of-memory error converted to one that names the
    graph; its time (``ExecuteTime``) and collectives counted. Nothing is written into
    any tensor here: the caller checks the outputs (index ranges, NaNs) first. ``what``
    names the run in errors (its ``str``); ``src``: the user's line; ``live``: the
    device's live bytes where the caller knows them (a segmented graph's segments: each
    adds only its outputs), else walked."""
    start_target_compile(rec)  # a target set since it compiled
    check_graph(rec, rec.device, what, rec.memory, live)
    if config.memory_limit_target:
        check_target_fit(rec, what)
    if session.agree is not None:  # several processes: all about to run the same one
        session.agree(rec, src, scalars=scalars)
    t0 = time.perf_counter()
    with jax.enable_x64(True):  # lifted Python floats are float64, as when it was lowered
        try:
            outs = rec.executable(arrays, scalars)
            if lowerings_waiting():  # while the device runs it (executables/prefix.py)
                drain_lowerings(lambda: all(o.is_ready() for o in outs))
            jax.block_until_ready(outs)
        except Exception as e:
            if is_device_oom(e):
                raise device_oom(e, rec.device, f"the graph {format_hash(rec.hash)} ({what})",
                                 rec) from e
            raise
    dt = time.perf_counter() - t0
    rec.run_time += dt
    if rec.first_run_s is None:
        rec.first_run_s = dt
    _graph_runs[0] += 1
    rec.last_run = _graph_runs[0]
    metrics.record("ExecuteTime", dt)
    if rec.collectives:  # torch_xla has no name for these: xlanb's own
        metrics.counter("CollectiveOps", len(rec.collectives))
        metrics.counter("CollectiveBytes", rec.collectives.total_bytes)
    return outs


def compile_summary(gs=None) -> compile_time.CompileSummary:
    """The compile profiles of ``gs`` (compiled graphs; default: every graph) summed by
    phase, line and scope: what a cell, an eager run or a script spent compiling, and
    where. Graphs loaded from the store count their loading; a dropped graph's profile
    is read only if it was built before (reading its module would load it again)."""
    gs = list(graph_log if gs is None else gs)
    kept = [g for g in gs if g._compile_profile is not None or g._exe is not None]
    return compile_time.CompileSummary([g.compile_profile for g in kept],
                                       sum(g.n_nodes for g in kept))


def graphs() -> GraphList:
    """Every compiled graph with its cause, source line, times, hits and explanation."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    return GraphList(graph_log)


def clear_graph_cache() -> None:
    """Forget every compiled graph, its log and the recompile statistics (the caches
    registered in the "graphs" group), nothing else."""
    clear_group("graphs")
